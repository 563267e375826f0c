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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT

BODY = b"x" * 100
BATCH = 100
CHANNEL = "bench"
TIMEOUT = 120.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


# --------------------------------------------------------------------------- CPU clocks


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_clock(pid: int | None) -> Callable[[], float]:
    if pid is None or pid == os.getpid():
        return time.process_time
    return lambda: proc_cpu(pid)


# --------------------------------------------------------------------------- connections


class Connection(asyncio.Protocol):
    """A raw NSQ connection: frames go through the protocol floor's decoder."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.loop = asyncio.get_running_loop()
        self.waiter: asyncio.Future[bytes] | None = None
        self.lost: BaseException | None = None

    @classmethod
    async def open(cls, address: str, **identify: Any) -> Any:
        host, port = address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(cls, host, int(port))
        conn.send(commands.MAGIC_V2)
        body = {"client_id": "bench", "hostname": "bench", "feature_negotiation": True}
        await conn.request(commands.identify(body | identify))
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("connection closed")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    def send(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionError("not connected")
        self.transport.write(data)

    async def request(self, data: bytes) -> bytes:
        """Send a command and wait for its response frame (setup only, not measured)."""
        self.waiter = self.loop.create_future()
        self.send(data)
        return await asyncio.wait_for(self.waiter, TIMEOUT)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        for frame in self.decoder.drain():
            if frame.type == FRAME_TYPE_ERROR:
                raise RuntimeError(f"nsqd answered an error: {frame.data!r}")
            if frame.data == HEARTBEAT:
                self.send(commands.NOP)
            elif self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(frame.data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Publisher(Connection):
    """Pipelined MPUB: keeps ``window`` batches in flight until ``batches`` are answered."""

    def start(self, command: bytes, batches: int, window: int) -> asyncio.Future[None]:
        self.command = command
        self.to_send = batches
        self.pending = 0
        self.done: asyncio.Future[None] = self.loop.create_future()
        self._fill(window)
        return self.done

    def _fill(self, count: int) -> None:
        count = min(count, self.to_send)
        if count > 0:
            self.to_send -= count
            self.pending += count
            self.send(self.command * count)

    def data_received(self, data: bytes) -> None:
        if not hasattr(self, "done"):
            super().data_received(data)
            return
        self.decoder.feed(data)
        answered = 0
        for frame in self.decoder.drain():
            if frame.type == FRAME_TYPE_ERROR:
                self.done.set_exception(RuntimeError(f"MPUB failed: {frame.data!r}"))
                return
            if frame.data == HEARTBEAT:
                self.send(commands.NOP)
                continue
            answered += 1
        self.pending -= answered
        self._fill(answered)
        if self.pending == 0 and self.to_send == 0 and not self.done.done():
            self.done.set_result(None)


class Subscriber(Connection):
    """FINs every message, all FINs of one read in one write; CLS once it has ``expected``."""

    def consume(self, expected: int, rdy: int) -> asyncio.Future[None]:
        self.expected = expected
        self.received = 0
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.send(commands.rdy(rdy))
        return self.done

    def data_received(self, data: bytes) -> None:
        if not hasattr(self, "done"):
            super().data_received(data)
            return
        self.decoder.feed(data)
        fins = []
        for frame in self.decoder.drain():
            if frame.type == FRAME_TYPE_MESSAGE:
                fins.append(commands.fin(frame.data[10:26]))
            elif frame.type == FRAME_TYPE_ERROR:
                self.done.set_exception(RuntimeError(f"nsqd answered an error: {frame.data!r}"))
                return
            elif frame.data == HEARTBEAT:
                fins.append(commands.NOP)
            elif frame.data == CLOSE_WAIT and not self.done.done():
                self.done.set_result(None)
        if fins:
            before = self.received
            self.received += len(fins)
            if before < self.expected <= self.received:
                fins.append(commands.CLS)
            self.send(b"".join(fins))


# --------------------------------------------------------------------------- one round

PHASES = ("MPUB x100", "PUB", "deliver")


def _spread(total: int, count: int) -> list[int]:
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


async def run_round(
    scenario: Scenario, args: argparse.Namespace, clock: Callable[[], float]
) -> list[Phase]:
    count = len(scenario.partitions)
    batches = _spread(args.messages // BATCH, count)
    pubs = _spread(args.pub_messages, count)
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
    youzan = [
        [f"--nodes={args.nodes}", f"--topic={topic}:{n}:1", f"--channel={topic}:{CHANNEL}"]
        for topic, n in (("bench1", 1), ("bench4", 4))
    ]
    classic = ["--classic", "--nodes=1", "--topic=bench", f"--channel=bench:{CHANNEL}"]
    rows = []
    for extra in (*youzan, classic):
        with tempfile.TemporaryDirectory() as tmp:
            port_file = Path(tmp) / "cluster.json"
            argv = [sys.executable, "-m", "smartnsq", "cluster", *extra]
            child = subprocess.Popen(
                [*argv, f"--port-file={port_file}"], stdout=subprocess.PIPE, text=True
            )
            try:
                _pin(child.pid, args.cluster_cpu)
                _wait_ready(child)
                rows += asyncio.run(bench_info(json.loads(port_file.read_text()), args))
            finally:
                child.terminate()
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    return rows


def _pin(pid: int, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu in os.sched_getaffinity(0):
        os.sched_setaffinity(pid, {cpu})


def _wait_ready(child: subprocess.Popen[str]) -> None:
    """The child prints its address block, ending with the "Ready" line, once it serves."""
    if child.stdout is None:
        raise RuntimeError("no stdout pipe")
    for line in child.stdout:
        if line.startswith("Ready"):
            return
    raise RuntimeError(f"smartnsq cluster exited with {child.wait()}")


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
        _pin(os.getpid(), args.bench_cpu)
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
        args.json.write_text(json.dumps({"where": where, "rows": data}, indent=2) + "\n")


if __name__ == "__main__":
    main()
