"""smartnsq scale worker: one Consumer per topic, subscribed to every partition of several
topics through one shared lookup manager; phases driven by ``bench/scale.py`` over
stdin/stdout (see there). One JSON object on the last line of stdout.

1. the lookup: every topic looked up (the lookup manager's cache then answers the consumers);
2. subscribe: every consumer started at once, timed from the lookup's answer until each
   partition has its subscription;
3. memory: RSS (and, with ``--tracemalloc``, the traced memory and its top allocation sites)
   after the subscriptions less before, idle, garbage collected;
4. idle: this process's CPU over ``--idle`` seconds with nothing to consume (heartbeats only);
5. traffic (``--messages`` > 0): every consumer paused (``set_max_in_flight(0)``), "paused"
   printed; the orchestrator fills every partition and writes "go"; the budget is given
   back and the time and CPU until every message is finished are measured.

Progress lines go to stdout before the result (the orchestrator reads them as they come).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import sys
import time
import tracemalloc
from typing import Any

from _worker import cpu_seconds, pin, proc_cpu, rss_bytes, run_loop


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def read_line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


def settled_rss() -> int:
    """RSS after a full collection (garbage is not what a connection costs)."""
    gc.collect()
    return rss_bytes() or 0


def top_sites(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, per: int, count: int
) -> list[dict[str, Any]]:
    """The allocation sites that grew most, in bytes per connection."""
    rows = []
    for stat in after.compare_to(before, "lineno")[:count]:
        frame = stat.traceback[0]
        rows.append(
            {
                "site": f"{frame.filename}:{frame.lineno}",
                "bytes_per_connection": stat.size_diff / per,
                "blocks_per_connection": stat.count_diff / per,
            }
        )
    return rows


async def work(args: argparse.Namespace) -> dict[str, Any]:
    import smartnsq
    from smartnsq.transport.lookup import LookupManager

    lookup = LookupManager(args.lookupd)
    result: dict[str, Any] = {"client": "smartnsq", "version": smartnsq.__version__}
    received = 0
    target = math.inf
    done = asyncio.Event()

    async def handler(message: Any) -> None:
        nonlocal received
        received += 1
        if received >= target:
            done.set()

    topics = args.topic
    budget = max(1, math.ceil(args.max_in_flight / len(topics)))
    layouts = await asyncio.gather(*(lookup.lookup(topic, "r") for topic in topics))
    expected = sum(len(layout.partitions) for layout in layouts)
    if args.warmup_topic:
        # What the first subscription imports and builds once (modules, classes) is no
        # connection's: a subscription to a topic of its own, opened and closed first.
        warmup = smartnsq.Consumer(
            args.warmup_topic, args.channel, lookup_manager=lookup, handler=handler
        )
        await warmup.start()
        await warmup.close()
    rss0 = settled_rss()
    if args.tracemalloc:
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
    consumers = [
        smartnsq.Consumer(
            topic,
            args.channel,
            lookup_manager=lookup,
            handler=handler,
            max_in_flight=budget,
            heartbeat_interval=args.heartbeat_interval,
        )
        for topic in topics
    ]
    cluster0 = proc_cpu(args.cluster_pid) if args.cluster_pid else 0.0
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    await asyncio.gather(*(consumer.start() for consumer in consumers))
    # start() returns once the first subscriptions are in place or failed: count them
    while sum(c.stats().connections for c in consumers) < expected:
        if time.perf_counter() - t0 > args.timeout:
            raise SystemExit(f"only {sum(c.stats().connections for c in consumers)} subscribed")
        await asyncio.sleep(0.001)
    result["subscribe_s"] = time.perf_counter() - t0
    result["subscribe_cpu_s"] = cpu_seconds() - cpu0
    if args.cluster_pid:
        result["subscribe_cluster_cpu_s"] = proc_cpu(args.cluster_pid) - cluster0
    result["connections"] = expected
    await asyncio.sleep(args.settle)  # the RDYs sent, the handshakes' garbage gone
    rss1 = settled_rss()
    result["rss_per_connection"] = (rss1 - rss0) / expected
    result["rss_before"] = rss0
    result["rss_after"] = rss1
    if args.tracemalloc:
        gc.collect()
        snap1 = tracemalloc.take_snapshot()
        tracemalloc.stop()
        traced = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
        result["traced_per_connection"] = traced / expected
        result["top_sites"] = top_sites(snap0, snap1, expected, args.top)
    if args.idle > 0:
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        await asyncio.sleep(args.idle)
        seconds = time.perf_counter() - t0
        result["idle_s"] = seconds
        result["idle_cpu"] = (cpu_seconds() - cpu0) / seconds
    if args.messages > 0:
        for consumer in consumers:
            consumer.set_max_in_flight(0)
        await asyncio.sleep(0.1)  # the RDY 0s on their way before anything is published
        say("paused")
        if (await read_line()).strip() != "go":
            raise SystemExit("expected go")
        before = received
        target = before + args.messages
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        for consumer in consumers:
            consumer.set_max_in_flight(budget)
        await asyncio.wait_for(done.wait(), args.timeout)
        result["traffic_s"] = time.perf_counter() - t0
        result["traffic_cpu_s"] = cpu_seconds() - cpu0
        result["messages"] = args.messages - before
    await asyncio.gather(*(consumer.close() for consumer in consumers))
    await lookup.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="smartnsq scale worker")
    parser.add_argument("--lookupd", action="append", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--channel", default="scale")
    parser.add_argument("--warmup-topic", help="subscribed and closed before measuring")
    parser.add_argument("--max-in-flight", type=int, default=2500, help="split over topics")
    parser.add_argument("--heartbeat-interval", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=1.0, help="s before measuring memory")
    parser.add_argument("--idle", type=float, default=0.0, help="s of idle CPU measured")
    parser.add_argument("--messages", type=int, default=0, help="traffic phase: messages")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--top", type=int, default=15, help="allocation sites shown")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--cluster-pid", type=int, help="read this process's CPU too")
    parser.add_argument("--cpu", type=int, help="pin this worker to this core")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    pin(args.cpu)
    result = run_loop(work(args), args.loop)
    say(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
