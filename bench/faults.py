"""What each network fault costs a client, measured: the figures of docs/guides/failures.md.

Each scenario runs against a fresh embedded cluster behind fault proxies
(``smartnsq.testing.faults``), with the public API only and the options given in its row, and
reports how long the client took to find the fault out and to recover, and what was lost or
delivered twice. Times are wall-clock seconds on this machine: indicative, not bounds (the
bounds are the documented ones; the tests assert them).

Usage: python bench/faults.py [--rounds 3] [--json out.json] [--only half-open-publish,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import smartnsq
from smartnsq.flow.retry import Backoff
from smartnsq.testing import Cluster
from smartnsq.testing.faults import ClusterProxies, cluster_proxies

WAIT = 60.0
QUICK = Backoff(initial=0.05, maximum=0.5)
Scenario = Callable[[], Awaitable[dict[str, Any]]]


async def half_open_publish() -> dict[str, Any]:
    """A silent link under a producer (publish_timeout 5, request_timeout 10): when the
    publish raises, whether its outcome is unknown, and whether the held PUB landed on heal."""
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=1) as proxies:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = smartnsq.Producer(
            lookupd=[cluster.lookupd_url], address_map=proxies.address_map, publish_timeout=5
        )
        async with producer:
            await producer.publish("t", b"warm")
            proxies[0].blackhole()
            began = time.monotonic()
            error: smartnsq.PublishError | None = None
            try:
                await producer.publish("t", b"held")
            except smartnsq.PublishError as exc:
                error = exc
            raised_after = time.monotonic() - began
            proxies[0].heal()
            healed = time.monotonic()
            await producer.publish("t", b"after")
            recovered = time.monotonic() - healed
        stored = [r.body for r in cluster.messages("t", 0)]
    return {
        "detected_s": raised_after,
        "recovered_s": recovered,
        "outcome_unknown": bool(error and error.outcome_unknown),
        "held_publish_stored": b"held" in stored,
    }


async def _consumer_link(
    fault: Callable[[ClusterProxies], None], heartbeat: float
) -> dict[str, Any]:
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=2) as proxies:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        seen: Counter[bytes] = Counter()
        consumer = smartnsq.Consumer(
            "t",
            "c",
            lookupd=[cluster.lookupd_url],
            address_map=proxies.address_map,
            handler=lambda m: seen.update([m.body]),
            heartbeat_interval=heartbeat,
            reconnect_backoff=QUICK,
        )
        async with consumer, smartnsq.Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("t", b"before")
            await cluster.wait_for(lambda: seen[b"before"] == 1, WAIT)
            began = time.monotonic()
            fault(proxies)
            await cluster.wait_for(lambda: consumer.stats().connections == 0, WAIT)
            detected = time.monotonic() - began
            proxies[0].clear()
            healed = time.monotonic()
            await producer.publish("t", b"after")
            await cluster.wait_for(lambda: seen[b"after"] >= 1, WAIT)
            recovered = time.monotonic() - healed
            await cluster.wait_for(lambda: cluster.unfinished("t", "c") == 0, WAIT)
        duplicates = sum(seen.values()) - len(seen)
    return {"detected_s": detected, "recovered_s": recovered, "duplicates": duplicates}


async def half_open_consume() -> dict[str, Any]:
    """A silent link under a consumer with heartbeat_interval 5: when the connection is
    given up (two missed heartbeats and a second), and when it consumes again after heal."""
    return await _consumer_link(lambda proxies: proxies[0].blackhole(), 5.0)


async def reset_consume() -> dict[str, Any]:
    """Every connection of the consumer reset: found out at once, then resubscribed."""
    return await _consumer_link(lambda proxies: proxies[0].reset(new_connections=True), 30.0)


async def reset_publish() -> dict[str, Any]:
    """The producer's connection reset while 100 publishes are in flight: how long they
    took, whether any raised, and how many were stored twice (retries of PUBs nsqd had)."""
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=3) as proxies:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = smartnsq.Producer(
            lookupd=[cluster.lookupd_url], address_map=proxies.address_map, retry_backoff=QUICK
        )
        async with producer:
            await producer.publish("t", b"warm")
            proxies[0].set_latency(0.05)  # so that the PUBs are in flight when it resets
            sent_before = proxies[0].stats().upstream_bytes
            began = time.monotonic()
            publishes = [
                asyncio.ensure_future(producer.publish("t", b"%d" % n)) for n in range(100)
            ]
            # half of the PUBs forwarded (each is about 14 bytes), none answered yet
            await proxies[0].wait_for(lambda: proxies[0].stats().upstream_bytes > sent_before + 700)
            proxies[0].reset()
            proxies[0].clear()
            outcomes = await asyncio.gather(*publishes, return_exceptions=True)
            took = time.monotonic() - began
        stored = Counter(r.body for r in cluster.messages("t", 0))
    failed = sum(isinstance(o, BaseException) for o in outcomes)
    return {
        "recovered_s": took,
        "failed": failed,
        "duplicates": sum(stored.values()) - len(stored),
    }


async def refused_direct() -> dict[str, Any]:
    """Direct mode, the nsqd refusing connections for 2 s: a publish begun meanwhile goes
    through once it listens again (publish_timeout 20)."""
    async with Cluster(nodes=1, classic=True) as cluster:
        await cluster.stop_node(0)
        producer = smartnsq.Producer(
            nsqd=cluster.nsqd_addresses, publish_timeout=20, retry_backoff=QUICK
        )
        try:
            began = time.monotonic()
            publish = asyncio.ensure_future(producer.publish("t", b"x"))
            await asyncio.sleep(2.0)  # the fault's length, not a synchronisation
            back = time.monotonic()
            await cluster.start_node(0)
            result = await publish
            after_back = time.monotonic() - back
        finally:
            await producer.close()
    return {"recovered_s": after_back, "tries": result.tries, "total_s": time.monotonic() - began}


async def stops_reading() -> dict[str, Any]:
    """nsqd stops reading (its node blackholed) while 300 publishes of 64 KiB are under way
    (publish_timeout 2): when the last one raised."""
    async with Cluster(nodes=1, classic=True) as cluster:
        producer = smartnsq.Producer(nsqd=cluster.nsqd_addresses, publish_timeout=2)
        async with producer:
            await producer.publish("t", b"warm")
            cluster.blackhole(0)
            began = time.monotonic()
            body = b"x" * (64 << 10)
            outcomes = await asyncio.gather(
                *(producer.publish("t", body) for _ in range(300)), return_exceptions=True
            )
            took = time.monotonic() - began
            cluster.heal(0)
    failed = sum(isinstance(o, smartnsq.PublishError) for o in outcomes)
    return {"detected_s": took, "failed": failed}


async def lookupd_down() -> dict[str, Any]:
    """The only nsqlookupd stops: publishes and consumption go on (the layout is cached), and
    a Consumer started meanwhile waits for it and subscribes once it is back."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        seen: Counter[bytes] = Counter()
        async with smartnsq.Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("t", b"warm")
            await cluster.stop_lookupd(0)
            began = time.monotonic()
            await producer.publish("t", b"during")
            during = time.monotonic() - began
            consumer = smartnsq.Consumer(
                "t", "c", lookupd=[cluster.lookupd_url], handler=lambda m: seen.update([m.body])
            )
            async with consumer:
                await cluster.start_lookupd(0)
                back = time.monotonic()
                await cluster.wait_for(lambda: seen[b"during"] == 1, WAIT)
                subscribed = time.monotonic() - back
    return {"publish_while_down_s": during, "recovered_s": subscribed}


async def _shaped(configure: Callable[[ClusterProxies], None]) -> dict[str, Any]:
    async with Cluster(nodes=1) as cluster, cluster_proxies(cluster, seed=4) as proxies:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        configure(proxies)
        seen: list[bytes] = []
        consumer = smartnsq.Consumer(
            "t",
            "c",
            lookupd=[cluster.lookupd_url],
            address_map=proxies.address_map,
            handler=lambda m: seen.append(m.body),
            ordered=False,
        )
        producer = smartnsq.Producer(lookupd=[cluster.lookupd_url], address_map=proxies.address_map)
        async with consumer, producer:
            began = time.monotonic()
            latencies = []
            for n in range(50):
                sent = time.monotonic()
                await producer.publish("t", b"%d" % n)
                latencies.append(time.monotonic() - sent)
            await cluster.wait_for(lambda: len(seen) >= 50, WAIT)
            took = time.monotonic() - began
            errors = consumer.stats().server_errors
    return {
        "publish_p50_ms": 1000 * statistics.median(latencies),
        "total_s": took,
        "errors": errors,
        "lost": 50 - len(set(seen)),
    }


async def latency() -> dict[str, Any]:
    """200 ms of latency each way (jitter 20 ms): 50 sequential publishes and their delivery."""
    return await _shaped(lambda proxies: proxies[0].set_latency(0.2, jitter=0.02))


async def slicing() -> dict[str, Any]:
    """Every stream cut into 1-7 byte pieces, both ways."""
    return await _shaped(lambda proxies: proxies[0].set_slicing(7))


SCENARIOS: dict[str, Scenario] = {
    "half-open-publish": half_open_publish,
    "half-open-consume": half_open_consume,
    "reset-publish": reset_publish,
    "reset-consume": reset_consume,
    "refused-direct": refused_direct,
    "stops-reading": stops_reading,
    "lookupd-down": lookupd_down,
    "latency": latency,
    "slicing": slicing,
}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = runs[0].keys()
    out: dict[str, Any] = {}
    for key in keys:
        values = [run[key] for run in runs]
        if all(isinstance(v, bool) for v in values):
            out[key] = f"{sum(values)}/{len(values)}"
        elif all(isinstance(v, (int, float)) for v in values):
            out[key] = round(statistics.median(values), 3)
        else:
            out[key] = values
    return out


async def main(names: list[str], rounds: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        runs = [await SCENARIOS[name]() for _ in range(rounds)]
        results[name] = {"median": _summary(runs), "runs": runs}
        cells = ", ".join(f"{k} {v}" for k, v in results[name]["median"].items())
        print(f"{name:18} {cells}", flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma list of scenarios: " + ",".join(SCENARIOS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        sys.exit(f"unknown scenario(s): {', '.join(unknown)}")
    figures = asyncio.run(main(chosen, args.rounds))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
