"""How fast a default Consumer recovers: after a partition leader fails over, and when an
ordered consumer's handler fails now and then. Embedded cluster, public API only (so the
same script measures an older checkout: ``PYTHONPATH=<checkout> python bench/recovery.py``).

* ``failover``: 3 partitions x 3 replicas, ``failover_delay`` seconds between the crash of
  partition 0's leader and its new leader taking writes. A probe published to partition 0
  (the Producer rides out the failover) must be handled: reported are the seconds from the
  probe's acceptance to its handling, and from the crash to its handling.
* ``restart``: the same with 1 replica: partition 0 waits for its node, which comes back
  after ``failover_delay`` seconds and leads again.
* ``ordered-failures``: 40 keys x 30 messages over 4 ordered partitions, published first;
  5 % of first deliveries raise; seconds until all 1,200 are handled (or how many were after
  ``--limit`` seconds), order violations and handler calls beyond the failed ones.

Usage: python bench/recovery.py [--rounds 3] [--failover-delay 3] [--limit 90] [--json out]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster


async def failover_round(delay: float, *, restart: bool, limit: float) -> dict[str, Any]:
    async with Cluster(nodes=3, failover_delay=delay) as cluster:
        await cluster.create_topic("events", 3, 1 if restart else 3, channels=["c"])
        handled: dict[bytes, float] = {}

        def handle(message: Message) -> None:
            handled[message.body] = time.monotonic()

        consumer = Consumer(
            "events", "c", lookupd=[cluster.lookupd_url], handler=handle, max_in_flight=10
        )
        async with consumer, Producer(lookupd=[cluster.lookupd_url]) as producer:
            for partition in range(3):
                await producer.publish("events", b"warm-%d" % partition, partition=partition)
            await cluster.wait_for(lambda: len(handled) == 3)
            leader = cluster.leader("events", 0)
            assert leader is not None
            stopped = time.monotonic()
            await cluster.stop_node(leader)
            if restart:
                await asyncio.sleep(delay)  # the node is down this long
                await cluster.start_node(leader)
            await producer.publish("events", b"probe", partition=0)
            accepted = time.monotonic()
            try:
                await cluster.wait_for(lambda: b"probe" in handled, timeout=limit)
            except TimeoutError:
                return {"accepted_to_handled": None, "stop_to_handled": None}
    return {
        "accepted_to_handled": handled[b"probe"] - accepted,
        "stop_to_handled": handled[b"probe"] - stopped,
    }


async def ordered_round(limit: float, seed: int) -> dict[str, Any]:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("orders", 4, 2, ordered=True, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for seq in range(30):
                for key in range(40):
                    await producer.publish("orders", f"{key}:{seq}", sharding_key=key)
        rng = random.Random(seed)
        doomed = {f"{k}:{s}" for k in range(40) for s in range(30) if rng.random() < 0.05}
        done: dict[int, list[int]] = defaultdict(list)
        calls = failures = 0

        async def handle(message: Message) -> None:
            nonlocal calls, failures
            calls += 1
            text = message.body.decode()
            if text in doomed and message.attempts == 1:
                failures += 1
                raise RuntimeError("transient")
            key, seq = map(int, text.split(":"))
            done[key].append(seq)

        started = time.monotonic()
        consumer = Consumer(
            "orders", "c", lookupd=[cluster.lookupd_url], handler=handle, ordered=True
        )
        async with consumer:
            try:
                await cluster.wait_for(lambda: sum(map(len, done.values())) == 1200, limit)
                seconds: float | None = time.monotonic() - started
            except TimeoutError:
                seconds = None
            handled = sum(map(len, done.values()))
            await consumer.close(timeout=1.0)
    violations = sum(1 for seqs in done.values() if seqs != sorted(seqs))
    return {
        "seconds": seconds,
        "handled": handled,
        "order_violations": violations,
        "extra_calls": calls - handled - failures,  # handler calls for a message done before
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if len(known) == len(values) and known else None


def _show(value: float | None) -> str:
    return "did not finish" if value is None else f"{value:.2f} s"


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, restart in (("failover", False), ("restart", True)):
        runs = [
            await failover_round(args.failover_delay, restart=restart, limit=args.limit)
            for _ in range(args.rounds)
        ]
        results[name] = {
            "runs": runs,
            "accepted_to_handled": _median([r["accepted_to_handled"] for r in runs]),
            "stop_to_handled": _median([r["stop_to_handled"] for r in runs]),
        }
        print(
            f"{name:16} failover_delay {args.failover_delay:g} s: accepted -> handled "
            f"{_show(results[name]['accepted_to_handled'])}, crash -> handled "
            f"{_show(results[name]['stop_to_handled'])} (median of {args.rounds})"
        )
    runs = [await ordered_round(args.limit, seed) for seed in range(args.rounds)]
    results["ordered-failures"] = {"runs": runs, "seconds": _median([r["seconds"] for r in runs])}
    worst = min(runs, key=lambda r: r["handled"])
    print(
        f"{'ordered-failures':16} 1,200 messages, 5 % failing once: "
        f"{_show(results['ordered-failures']['seconds'])} (median of {args.rounds}); "
        f"fewest handled {worst['handled']}, order violations "
        f"{sum(r['order_violations'] for r in runs)}, extra handler calls "
        f"{sum(r['extra_calls'] for r in runs)}"
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failover-delay", type=float, default=3.0)
    parser.add_argument("--limit", type=float, default=90.0, help="give up a round after this")
    parser.add_argument("--json", type=Path)
    arguments = parser.parse_args()
    outcome = asyncio.run(main(arguments))
    if arguments.json is not None:
        arguments.json.write_text(json.dumps(outcome, indent=2))
    sys.exit(0)
