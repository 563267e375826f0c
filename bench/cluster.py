"""Embedded-cluster benchmark: how fast the emulated nsqd accepts and delivers messages.

Raw sockets and the protocol floor only (``smartnsq.protocol`` encoders and frame decoder),
no smartnsq client code, so the numbers are the server's. Per scenario and round:

1. one subscriber connection per partition (SUB, RDY 0) so the channel exists;
2. *accepted*: one publisher connection per partition sends MPUB batches of 100 messages of
   100 bytes, ``--window`` batches in flight, until ``--messages`` are answered OK;
3. *delivered*: every subscriber sends RDY (``--rdy`` spread evenly over the partitions) and
   FINs every message, all FINs of one read in one write; the phase ends when each subscriber
   has its share and nsqd answered the CLS sent after its last FINs (so every FIN counted).

Scenarios: youzan with 1 partition, youzan with 4 partitions, classic nsqd.

Where the cluster runs:

* default: in this process, on the same event loop as the benchmark's sockets; the CPU
  column is then the whole process (cluster + benchmark client), an upper bound;
* ``--spawn``: ``smartnsq cluster`` in a child process pinned to core 0 (the benchmark pins
  itself to core 1); the CPU column is the child's, read from /proc/<pid>/stat;
  each scenario gets a fresh cluster (in-process too);
* ``--port-file PATH``: a ``smartnsq cluster`` started separately (pin it yourself, e.g.
  ``taskset -c 0 smartnsq cluster --nodes 1 --topic bench1:1:1 --topic bench4:4:1
  --channel bench1:bench --channel bench4:bench --port-file /tmp/nsq.json``); every youzan
  topic in the file is benchmarked (classic: topic "bench").

Usage: python bench/cluster.py [--spawn | --port-file PATH] [--messages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BATCH,
    BODY,
    TIMEOUT,
    Publisher,
    Subscriber,
    cpu_clock,
    pin,
    spawn_cluster,
    split,
)

from smartnsq.protocol import commands

CHANNEL = "bench"


@dataclass
class Scenario:
    label: str
    topic: str
    partitions: list[tuple[int | None, str]]  # (partition id or None for classic, nsqd address)


@dataclass
class Phase:
    messages: int
    seconds: float
    cluster_cpu: float
    bench_cpu: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def cpu_per_100k(self) -> float:
        return self.cluster_cpu * 100_000 / self.messages


# --------------------------------------------------------------------------- one round

PHASES = ("MPUB x100", "PUB", "deliver")


async def run_round(
    scenario: Scenario, args: argparse.Namespace, clock: Callable[[], float]
) -> list[Phase]:
    count = len(scenario.partitions)
    batches = split(args.messages // BATCH, count)
    pubs = split(args.pub_messages, count)
    pub_window = max(1, args.pub_window // count)
    subscribers: list[Subscriber] = []
    publishers: list[Publisher] = []
    try:
        for partition, address in scenario.partitions:
            sub = await Subscriber.open(address)
            await sub.request(commands.sub(scenario.topic, CHANNEL, partition))
            subscribers.append(sub)
            publishers.append(await Publisher.open(address))
        partitions = [partition for partition, _ in scenario.partitions]
        mpub = [commands.mpub(scenario.topic, [BODY] * BATCH, p) for p in partitions]
        pub = [commands.pub(scenario.topic, BODY, p) for p in partitions]

        accepted = await _measure(
            clock,
            sum(batches) * BATCH,
            lambda: [
                conn.start(command, n, args.window)
                for conn, command, n in zip(publishers, mpub, batches, strict=True)
            ],
        )
        published = await _measure(
            clock,
            sum(pubs),
            lambda: [
                conn.start(command, n, pub_window)
                for conn, command, n in zip(publishers, pub, pubs, strict=True)
            ],
        )
        expected = [n * BATCH + m for n, m in zip(batches, pubs, strict=True)]
        rdy = max(1, args.rdy // count)
        delivered = await _measure(
            clock,
            sum(expected),
            lambda: [sub.consume(n, rdy) for sub, n in zip(subscribers, expected, strict=True)],
        )
        for sub, n in zip(subscribers, expected, strict=True):
            if sub.received != n:
                raise RuntimeError(f"expected {n} messages, got {sub.received}")
        return [accepted, published, delivered]
    finally:
        for conn in (*subscribers, *publishers):
            conn.close()


async def _measure(
    clock: Callable[[], float],
    messages: int,
    start: Callable[[], list[asyncio.Future[None]]],
) -> Phase:
    cpu0, bench0, t0 = clock(), time.process_time(), time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*start()), TIMEOUT)
    t1, bench1, cpu1 = time.perf_counter(), time.process_time(), clock()
    return Phase(messages, t1 - t0, cpu1 - cpu0, bench1 - bench0)


# --------------------------------------------------------------------------- clusters


def scenarios_from(info: dict[str, Any]) -> list[Scenario]:
    if info["mode"] == "classic":
        return [Scenario("classic", "bench", [(None, info["nsqd"][0]["tcp"])])]
    found = []
    for name, topic in info["topics"].items():
        parts = [(row["partition"], row["tcp"]) for row in topic["partitions"]]
        count = len(parts)
        found.append(Scenario(f"youzan {count} partition{'s' * (count > 1)}", name, parts))
    return found


async def bench_info(info: dict[str, Any], args: argparse.Namespace) -> list[Row]:
    clock = cpu_clock(info["pid"])
    return [await bench_scenario(s, args, clock) for s in scenarios_from(info)]


@dataclass
class Row:
    label: str
    phases: dict[str, list[Phase]]


async def bench_scenario(
    scenario: Scenario, args: argparse.Namespace, clock: Callable[[], float]
) -> Row:
    row = Row(scenario.label, {name: [] for name in PHASES})
    for _ in range(args.rounds):
        for name, phase in zip(PHASES, await run_round(scenario, args, clock), strict=True):
            row.phases[name].append(phase)
    return row


async def bench_in_process(args: argparse.Namespace) -> list[Row]:
    from smartnsq.cli.cluster import describe
    from smartnsq.testing import Cluster

    # A fresh cluster per scenario: one does not pay for the messages another stored.
    rows = []
    record = args.record_deliveries
    for topic, partitions in (("bench1", 1), ("bench4", 4)):
        async with Cluster(args.nodes, record_deliveries=record) as cluster:
            await cluster.create_topic(topic, partitions, 1, channels=[CHANNEL])
            rows += await bench_info(describe(cluster, os.getpid()), args)
    async with Cluster(1, classic=True, record_deliveries=record) as cluster:
        rows += await bench_info(describe(cluster, os.getpid()), args)
    return rows


def bench_spawned(args: argparse.Namespace) -> list[Row]:
    # A fresh child per scenario: one does not pay for the messages another stored.
    specs = [
        (False, args.nodes, f"{topic}:{n}:1", f"{topic}:{CHANNEL}")
        for topic, n in (("bench1", 1), ("bench4", 4))
    ]
    specs.append((True, 1, "bench", f"bench:{CHANNEL}"))
    rows = []
    for classic, nodes, topic, channel in specs:
        with spawn_cluster(
            classic=classic, nodes=nodes, topics=[topic], channels=[channel], cpu=args.cluster_cpu
        ) as cluster:
            rows += asyncio.run(bench_info(cluster.info, args))
    return rows


# --------------------------------------------------------------------------- report


def report(rows: list[Row], where: str, args: argparse.Namespace) -> None:
    print(f"cluster: {where}")
    print(
        f"{args.messages:,} messages by MPUB ({args.window} batches of {BATCH} in flight per "
        f"connection), {args.pub_messages:,} by PUB ({args.pub_window} in flight), all "
        f"delivered (RDY {args.rdy}); {len(BODY)}-byte bodies; medians of {args.rounds} rounds"
    )
    heads = ("cluster CPU s/100k", "bench CPU s/100k")
    print(f"{'scenario':<22}{'phase':<12}{'msgs/s':>11}{heads[0]:>21}{heads[1]:>19}")
    for row in rows:
        label = row.label
        for name, phases in row.phases.items():
            rate = statistics.median(p.rate for p in phases)
            cpu = statistics.median(p.cpu_per_100k for p in phases)
            bench = statistics.median(p.bench_cpu * 100_000 / p.messages for p in phases)
            print(f"{label:<22}{name:<12}{rate:>11,.0f}{cpu:>21.3f}{bench:>19.3f}")
            label = ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--spawn", action="store_true", help="run the cluster in a pinned child")
    where.add_argument("--port-file", type=Path, help="use a `smartnsq cluster` started apart")
    parser.add_argument("--messages", type=int, default=200_000, help="by MPUB, per round")
    parser.add_argument("--pub-messages", type=int, default=50_000, help="by PUB, per round")
    parser.add_argument("--pub-window", type=int, default=100, help="PUBs in flight in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--window", type=int, default=16, help="MPUB batches in flight per connection"
    )
    parser.add_argument("--rdy", type=int, default=2500, help="total RDY of the subscriber")
    parser.add_argument("--nodes", type=int, default=1, help="youzan nodes (own cluster)")
    parser.add_argument("--cluster-cpu", type=int, default=0, help="core of --spawn's child")
    parser.add_argument("--bench-cpu", type=int, default=1, help="core of this process")
    parser.add_argument(
        "--record-deliveries",
        action="store_true",
        help="keep the cluster's delivery records (as tests do; own cluster only)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if args.messages < BATCH or args.pub_messages < 1:
        parser.error(f"--messages must be >= {BATCH} and --pub-messages >= 1")

    if args.spawn or args.port_file:
        pin(args.bench_cpu)
    if args.port_file:
        info = json.loads(args.port_file.read_text())
        rows = asyncio.run(bench_info(info, args))
        where = f"separate process {info['pid']} ({args.port_file})"
    elif args.spawn:
        rows = bench_spawned(args)
        where = f"child process pinned to core {args.cluster_cpu}, bench on core {args.bench_cpu}"
    else:
        rows = asyncio.run(bench_in_process(args))
        where = "in this process (CPU = cluster + bench client)"
    report(rows, where, args)
    if args.json:
        data = [
            {
                "scenario": row.label,
                "phases": {name: [vars(p) for p in phases] for name, phases in row.phases.items()},
            }
            for row in rows
        ]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"where": where, "rows": data}, indent=2) + "\n")


if __name__ == "__main__":
    main()
