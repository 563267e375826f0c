"""Soak: publish and consume for a long time through periodic network faults, and watch what
the client holds and how its loop keeps up.

The cluster (youzan, 4 nodes, one keyed topic of 4 partitions x 2 replicas with a registered
channel; ``--classic``: classic nsqd, the clients in direct mode) runs in a child process
pinned to core 0 (``bench/soak_cluster.py``: the embedded cluster as ``smartnsq cluster``
runs it, with ``cluster_proxies`` before its nodes). The proxies live in the cluster's
process, not here: in this process their sockets, tasks, queues and the bytes a half-open
link holds would count as the client's, and on a heal their flush would run on the loop
whose lag is measured. This process is the client alone, pinned to core 1: one Producer and
one Consumer, through the proxies (``address_map``).

Publishes are keyed (``--keys`` keys in turn) at a fixed rate (``--rate``, 800/s), each a
task started on time whatever the earlier ones are doing (as a service publishing what comes
in would), its body (``--body-size`` bytes) carrying its key and a sequence number per key.
The consumer is ordered (``ordered=True`` on an ordered topic) or plain (``--unordered``).

Faults come in cycles (``--cycle`` seconds; ``--faults``, in order, each in its own slot at
a seeded moment, on a seeded node; ``--seed`` repeats a run): ``reset`` (every link of a node
reset), ``blackhole`` (the link to a partition leader half-open for ``--blackhole-seconds``:
nothing forwarded, no FIN, no RST, then healed), ``burst`` (``--burst-resets`` resets
``--burst-gap`` s apart), ``latency`` and ``slicing`` (for ``--episode-seconds``), and
``node-blackhole`` (``Cluster.blackhole``: the node silent to everyone).

Every ``--interval`` seconds a line: RSS, open fds, asyncio tasks, traced memory and its
peak (``--tracemalloc``), the loop's lag (a 10 ms ticker's lateness: max and p99), publish
latency (p50/p99/max of the publishes answered in the window), publishes waiting (now and
the window's max), and the totals sent, acknowledged, failed, received and the producer's
retries. Each fault prints what it did. A half-open window also measures what issue 27
item 5 names: traced memory per waiting publish at the window's peak (tracemalloc runs for
the window only, unless ``--tracemalloc``), RSS before, at the heal and after, and the
loop's lag in the 2 s after the heal. At the end: sent, acknowledged, received, lost
(acknowledged, never received), duplicated, order violations per key (ordered mode), and
each kind of fault's effect. Exit status 1 if anything acknowledged was lost.

Usage: python bench/soak.py [--minutes 30 | --quick] [--classic] [--unordered] [--ext] [--rate 800]
       [--seed 1] [--faults reset,blackhole,...] [--tracemalloc] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import BENCH, cpu_seconds, die_with_parent, exit_on_sigterm, log, pin, proc_cpu
from clients._worker import rss_bytes

import smartnsq

TOPIC = "soak"
CHANNEL = "soak"
TICK = 0.01  # the lag ticker's period
PACE = 0.005  # how often the publisher starts what is due
HEAL_WATCH = 2.0  # the loop's lag is watched this long after a heal
SETTLE_WATCH = 60.0  # after a heal, how long the pile-up's draining is followed
SAMPLE = 0.25  # a half-open window's sampling period
MIN_GAP = 4.0  # the least time between two faults' slots
READY_TIMEOUT = 60.0
ANSWER_TIMEOUT = 60.0
MIB = 1024 * 1024
KINDS = ("reset", "blackhole", "node-blackhole", "burst", "latency", "slicing")
DEFAULT_FAULTS = "reset,blackhole,reset,burst,reset,latency,slicing"
QUICK_FAULTS = "reset,blackhole,burst,latency,slicing"


# --------------------------------------------------------------------------- process meters


def rss_mib() -> float | None:
    """This process's resident set now (Linux), in MiB."""
    rss = rss_bytes()
    return None if rss is None else rss / MIB


def open_fds() -> int | None:
    """File descriptors this process holds (Linux)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def show(value: float | None, spec: str = ".1f", width: int = 7) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


# --------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Episode:
    """One fault: ``kind`` on ``node`` at ``at`` seconds from the start, for ``seconds``."""

    at: float
    kind: str
    node: int
    seconds: float
    partition: int | None = None  # blackhole: the partition whose leader's link is cut

    def describe(self) -> str:
        where = f"node {self.node}"
        if self.partition is not None:
            where += f" (leader of partition {self.partition})"
        length = f" for {self.seconds:g} s" if self.seconds else ""
        return f"{self.kind} {where}{length}"


def episode_length(kind: str, args: argparse.Namespace) -> float:
    if kind in ("blackhole", "node-blackhole"):
        return float(args.blackhole_seconds)
    if kind == "burst":
        return float((args.burst_resets - 1) * args.burst_gap)
    if kind in ("latency", "slicing"):
        return float(args.episode_seconds)
    return 0.0


def plan(args: argparse.Namespace, nodes: int, leaders: dict[int, int]) -> list[Episode]:
    """Every fault of the run. Each cycle gives every kind of ``--faults`` a slot as long as
    the fault plus an equal share of the rest of the cycle; a fault starts 30-70 % into its
    share (seeded), so two never overlap and at least 0.6 shares (>= 2.4 s) separate
    them. Faults that would end past the run are dropped."""
    kinds: list[str] = args.faults
    if not kinds:
        return []
    rng = random.Random(args.seed)
    lengths = [episode_length(kind, args) for kind in kinds]
    gap = (args.cycle - sum(lengths)) / len(kinds)
    if gap < MIN_GAP:
        raise SystemExit(
            f"soak: --cycle {args.cycle:g} s is too short for {','.join(kinds)} "
            f"({sum(lengths):g} s of faults, {MIN_GAP:g} s between each at least)"
        )
    episodes = []
    cycle_start = 0.0
    while cycle_start < args.seconds:
        at = cycle_start
        for kind, length in zip(kinds, lengths, strict=True):
            begin = at + gap * rng.uniform(0.3, 0.7)
            partition = None
            if kind in ("blackhole", "node-blackhole") and leaders:
                partition = rng.choice(sorted(leaders))
                node = leaders[partition]
            else:
                node = rng.randrange(nodes)
            if begin + length + HEAL_WATCH <= args.seconds:
                episodes.append(Episode(round(begin, 2), kind, node, length, partition))
            at += gap + length
        cycle_start += args.cycle
    return episodes


# --------------------------------------------------------------------------- the cluster


class ClusterProcess:
    """``bench/soak_cluster.py`` in a child process; its commands over a pipe."""

    def __init__(self, process: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.process = process
        self.info = info
        self._lock = asyncio.Lock()

    @classmethod
    async def spawn(cls, args: argparse.Namespace, port_file: Path, errors: Any) -> ClusterProcess:
        argv = [
            sys.executable,
            str(BENCH / "soak_cluster.py"),
            f"--port-file={port_file}",
            f"--nodes={args.nodes}",
            f"--topic={TOPIC}",
            f"--channel={CHANNEL}",
            f"--partitions={args.partitions}",
            f"--replicas={args.replicas}",
            f"--seed={args.seed}",
        ]
        argv += ["--classic"] if args.classic else []
        argv += ["--ordered"] if args.ordered else []
        argv += ["--ext"] if args.ext else []
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SMARTNSQ_PURE")}
        env["SMARTNSQ_UVLOOP"] = "0"
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
            env=env,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        pin(args.cluster_cpu, process.pid)
        child = cls(process, {})
        try:
            await asyncio.wait_for(child._ready(), READY_TIMEOUT)
        except (TimeoutError, RuntimeError):
            await child.stop()
            errors.seek(0)
            raise RuntimeError(
                f"the soak cluster did not start:\n{errors.read()[-3000:]}"
            ) from None
        child.info = json.loads(await asyncio.to_thread(port_file.read_text))
        return child

    async def _ready(self) -> None:
        output = self.process.stdout
        if output is None:
            raise RuntimeError("the soak cluster has no pipes")
        while True:
            line = await output.readline()
            if not line:
                raise RuntimeError("the soak cluster exited")
            if line.startswith(b"Ready"):
                return

    @property
    def pid(self) -> int:
        return self.process.pid

    async def call(self, op: str, **arguments: Any) -> Any:
        commands, answers = self.process.stdin, self.process.stdout
        if commands is None or answers is None:
            raise RuntimeError("the soak cluster has no pipes")
        async with self._lock:
            commands.write(json.dumps({"op": op, **arguments}).encode() + b"\n")
            await commands.drain()
            line = await asyncio.wait_for(answers.readline(), ANSWER_TIMEOUT)
        if not line:
            raise RuntimeError(f"the soak cluster exited (answering {op})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the soak cluster: {op}: {answer['error']}")
        return answer["ok"]

    async def clear_all(self) -> None:
        """Every fault ended (the run is over), on every node."""
        for node in range(len(self.info["nsqd"])):
            for op in ("clear", "heal", "node_heal"):
                await self.call(op, node=node)

    async def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


# --------------------------------------------------------------------------- bookkeeping


class Ledger:
    """Every message by key and sequence number, two bytes each: its publish's outcome
    (0 waiting, 1 acknowledged, 2 failed) and how many times it was delivered (up to 255),
    so that a long run costs this process little memory of its own."""

    def __init__(self, keys: int) -> None:
        self.outcome = [bytearray() for _ in range(keys)]
        self.copies = [bytearray() for _ in range(keys)]
        self.top = [-1] * keys  # the highest sequence number of each key handled so far
        self.violations = [0] * keys  # first deliveries of a key below its highest so far
        self.last_offset: dict[int | None, int] = {}
        self.sent = self.acked = self.failed = 0
        self.received = self.distinct = self.duplicates = 0
        self.acked_received = 0  # acknowledged and received: the drain is done at acked
        self.failed_received = 0  # failed (outcome unknown) and still stored
        self.stored_out_of_order = 0  # a key's message stored after a later one of the key
        self.delivered_out_of_order = 0  # handled after a later one of its partition's queue

    def send(self, key: int) -> int:
        outcome = self.outcome[key]
        outcome.append(0)
        self.sent += 1
        return len(outcome) - 1

    def answered(self, key: int, seq: int, ok: bool) -> None:
        self.outcome[key][seq] = 1 if ok else 2
        delivered = seq < len(self.copies[key]) and self.copies[key][seq] > 0
        if ok:
            self.acked += 1
            self.acked_received += delivered
        else:
            self.failed += 1
            self.failed_received += delivered

    def deliver(self, key: int, seq: int, partition: int | None, offset: int | None) -> None:
        """Count one delivery of a message."""
        copies = self.copies[key]
        if seq >= len(copies):
            copies.extend(bytes(seq + 1 - len(copies)))
        count = copies[seq]
        copies[seq] = min(count + 1, 255)
        self.received += 1
        if count:
            self.duplicates += 1
            return
        self.distinct += 1
        outcome = self.outcome[key][seq] if seq < len(self.outcome[key]) else 0
        self.acked_received += outcome == 1
        self.failed_received += outcome == 2
        backwards = False
        if offset is not None:
            backwards = offset < self.last_offset.get(partition, -1)
            if not backwards:
                self.last_offset[partition] = offset
        if seq < self.top[key]:
            self.violations[key] += 1
            # The queue itself had them in this order (concurrent publishes of a key, one
            # retried), or the consumer handled them against the queue's order.
            if backwards:
                self.delivered_out_of_order += 1
            else:
                self.stored_out_of_order += 1
        else:
            self.top[key] = seq

    def lost(self) -> int:
        """Acknowledged and never received."""
        lost = 0
        for outcome, copies in zip(self.outcome, self.copies, strict=True):
            for seq, state in enumerate(outcome):
                if state == 1 and (seq >= len(copies) or copies[seq] == 0):
                    lost += 1
        return lost


@dataclass
class Window:
    """What one report interval saw."""

    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    max_waiting: int = 0


@dataclass
class EpisodeRecord:
    """What one fault did."""

    episode: Episode
    started: float = 0.0
    reset: int | None = None
    latencies: list[float] = field(default_factory=list)
    failed: int = 0
    max_waiting: int = 0
    consumer_reconnects: int = 0
    retries: int | None = None  # the producer's, during the episode
    lag_max: float = 0.0  # the loop's worst lag during the episode...
    lag_at: float = 0.0  # ...this long after it began
    half_open: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        data = asdict(self.episode) | {
            "reset": self.reset,
            "publishes_answered": len(self.latencies),
            "p99_ms": ms(quantile(self.latencies, 0.99)),
            "max_ms": ms(max(self.latencies, default=None)),
            "failed": self.failed,
            "max_waiting": self.max_waiting,
            "consumer_reconnects": self.consumer_reconnects,
            "retries": self.retries,
            "lag_max_ms": self.lag_max * 1000,
            "lag_at_s": round(self.lag_at, 2),
        }
        if self.half_open is not None:
            data["half_open"] = self.half_open
        return data


# --------------------------------------------------------------------------- the run


async def _parked(topic: str, body: bytes, key: int, gate: asyncio.Future[None]) -> None:
    await gate


def _ignore(*_: Any) -> None:
    return None


async def caller_share(body_size: int, count: int = 2000) -> float:
    """Traced bytes of a publish the caller keeps waiting before any client code runs: the
    task around it, its coroutine, its callback and its body (what a waiting publish cannot
    cost less than)."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tasks = []
        for i in range(count):
            task = asyncio.ensure_future(_parked(TOPIC, make_body(i, i, body_size), i, gate))
            task.add_done_callback(functools.partial(_ignore, i, i, time.perf_counter()))
            tasks.append(task)
        await asyncio.sleep(0)
        share = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    gate.set_result(None)
    await asyncio.gather(*tasks)
    return share


def make_body(key: int, seq: int, size: int) -> bytes:
    head = b"%06d:%010d:" % (key, seq)
    return head + b"x" * max(0, size - len(head))


class Soak:
    def __init__(self, args: argparse.Namespace, cluster: ClusterProcess) -> None:
        self.args = args
        self.cluster = cluster
        self.loop = asyncio.get_running_loop()
        self.ledger = Ledger(args.keys)
        self.window = Window()
        self.windows: list[dict[str, Any]] = []
        self.episodes: list[EpisodeRecord] = []
        self.current: EpisodeRecord | None = None
        self.failures: Counter[str] = Counter()
        self.waiting = 0
        self.idle = asyncio.Event()  # set when no publish is waiting
        self.next_key = 0
        self.heal_watch_until = 0.0
        self.heal_lag = 0.0
        self.started = 0.0
        self.settling: set[asyncio.Future[None]] = set()  # after a heal (see settle)
        info = cluster.info
        if args.classic:
            where: dict[str, Any] = {"nsqd": info["proxies"]}
        else:
            where = {"lookupd": info["lookupd_http"], "address_map": info["address_map"]}
        timeouts: dict[str, Any] = {}
        if args.heartbeat is not None:
            timeouts["heartbeat_interval"] = args.heartbeat
        options: dict[str, Any] = {}
        if args.publish_timeout is not None:
            options["publish_timeout"] = args.publish_timeout
        self.producer = smartnsq.Producer(**where, **timeouts, **options)
        consumer_options: dict[str, Any] = {"ordered": args.ordered}
        if args.max_in_flight is not None:
            consumer_options["max_in_flight"] = args.max_in_flight
        self.consumer = smartnsq.Consumer(
            TOPIC, CHANNEL, handler=self.handle, **where, **timeouts, **consumer_options
        )

    # ------------------------------------------------------------------ the two clients

    async def handle(self, message: smartnsq.Message) -> None:
        body = message.body
        key, seq = int(body[:6]), int(body[7:17])
        self.ledger.deliver(key, seq, message.partition, message.offset)

    def publish_one(self) -> None:
        key = self.next_key
        self.next_key = (key + 1) % self.args.keys
        seq = self.ledger.send(key)
        body = make_body(key, seq, self.args.body_size)
        task = asyncio.ensure_future(self.producer.publish(TOPIC, body, sharding_key=key))
        task.add_done_callback(functools.partial(self.answered, key, seq, time.perf_counter()))
        self.waiting += 1
        if self.waiting > self.window.max_waiting:
            self.window.max_waiting = self.waiting
            current = self.current
            if current is not None and self.waiting > current.max_waiting:
                current.max_waiting = self.waiting

    def answered(self, key: int, seq: int, sent: float, task: asyncio.Future[Any]) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.idle.set()
        error: BaseException | None = (
            asyncio.CancelledError() if task.cancelled() else task.exception()
        )
        self.ledger.answered(key, seq, error is None)
        if error is None:
            latency = time.perf_counter() - sent
            self.window.latencies.append(latency)
            if self.current is not None:
                self.current.latencies.append(latency)
            return
        self.failures[type(error).__name__] += 1
        if self.current is not None:
            self.current.failed += 1

    async def pace(self, until: float) -> None:
        """Start the publishes due at ``--rate``; after a stall, all those it missed."""
        started = self.loop.time()
        rate = self.args.rate
        while (now := self.loop.time()) < until:
            for _ in range(int((now - started) * rate) - self.ledger.sent):
                self.publish_one()
            await asyncio.sleep(PACE)

    async def tick(self) -> None:
        """The loop's lag: how late a 10 ms sleep wakes up."""
        loop = self.loop
        while True:
            expected = loop.time() + TICK
            await asyncio.sleep(TICK)
            now = loop.time()
            late = max(0.0, now - expected)
            self.window.lags.append(late)
            if now <= self.heal_watch_until and late > self.heal_lag:
                self.heal_lag = late
            current = self.current
            if current is not None and late > current.lag_max:
                current.lag_max, current.lag_at = late, now - self.started - current.started

    def retries(self) -> int | None:
        return getattr(self.producer.stats(), "retries", None)

    # ------------------------------------------------------------------ reports

    HEADER = (
        f"{'time':>6} {'RSS':>6} {'fds':>5} {'tasks':>6} {'traced':>7} {'peak':>6} |"
        f"{'lag max':>8} {'p99':>6} |{'pub p50':>8} {'p99':>7} {'max':>7} |"
        f"{'waiting':>8} {'max':>6} |{'sent':>9} {'acked':>9} {'failed':>7} "
        f"{'received':>9} {'retries':>7}"
    )
    UNITS = (
        f"{'s':>6} {'MiB':>6} {'':>5} {'':>6} {'MiB':>7} {'MiB':>6} |{'ms':>8} {'ms':>6} |"
        f"{'ms':>8} {'ms':>7} {'ms':>7} |{'now':>8} {'':>6} |{'(totals so far)':>37}"
    )

    def report(self) -> None:
        window, self.window = self.window, Window(max_waiting=self.waiting)
        traced = peak = None
        if self.args.tracemalloc and tracemalloc.is_tracing():
            current, top = tracemalloc.get_traced_memory()
            traced, peak = current / MIB, top / MIB
            tracemalloc.reset_peak()
        row = {
            "time": round(self.loop.time() - self.started, 1),
            "rss_mib": rss_mib(),
            "fds": open_fds(),
            "tasks": len(asyncio.all_tasks()),
            "traced_mib": traced,
            "traced_peak_mib": peak,
            "lag_max_ms": ms(max(window.lags, default=None)),
            "lag_p99_ms": ms(quantile(window.lags, 0.99)),
            "publish_p50_ms": ms(quantile(window.latencies, 0.5)),
            "publish_p99_ms": ms(quantile(window.latencies, 0.99)),
            "publish_max_ms": ms(max(window.latencies, default=None)),
            "waiting": self.waiting,
            "max_waiting": window.max_waiting,
            "sent": self.ledger.sent,
            "acked": self.ledger.acked,
            "failed": self.ledger.failed,
            "received": self.ledger.received,
            "retries": self.retries(),
        }
        self.windows.append(row)
        print(
            f"{row['time']:>6.0f} {show(row['rss_mib'], '.1f', 6)} {row['fds'] or '-':>5} "
            f"{row['tasks']:>6} {show(traced, '.1f', 7)} {show(peak, '.1f', 6)} |"
            f"{show(row['lag_max_ms'], '.1f', 8)} {show(row['lag_p99_ms'], '.1f', 6)} |"
            f"{show(row['publish_p50_ms'], '.1f', 8)} {show(row['publish_p99_ms'], '.1f', 7)} "
            f"{show(row['publish_max_ms'], '.0f', 7)} |{row['waiting']:>8} "
            f"{row['max_waiting']:>6} |{row['sent']:>9} {row['acked']:>9} {row['failed']:>7} "
            f"{row['received']:>9} {row['retries'] if row['retries'] is not None else '-':>7}",
            flush=True,
        )

    async def reporter(self) -> None:
        while True:
            await asyncio.sleep(self.args.interval)
            self.report()

    def say(self, text: str) -> None:
        print(f"{self.loop.time() - self.started:>6.1f}   {text}", flush=True)

    # ------------------------------------------------------------------ faults

    async def faults(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            delay = self.started + episode.at - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            record = EpisodeRecord(episode, started=self.loop.time() - self.started)
            reconnects, retries = self.consumer.stats().reconnects, self.retries()
            self.current = record
            record.max_waiting = self.waiting
            try:
                await self.run_episode(record)
            finally:
                self.current = None
                record.consumer_reconnects = self.consumer.stats().reconnects - reconnects
                retries_after = self.retries()
                if retries is not None and retries_after is not None:
                    record.retries = retries_after - retries
                self.episodes.append(record)
            self.say(self.episode_line(record))

    async def run_episode(self, record: EpisodeRecord) -> None:
        episode, args, node = record.episode, self.args, record.episode.node
        if episode.kind == "reset":
            record.reset = await self.cluster.call("reset", node=node)
            await asyncio.sleep(HEAL_WATCH)  # the recovery is the episode's too
        elif episode.kind == "burst":
            record.reset = await self.cluster.call(
                "burst", node=node, count=args.burst_resets, gap=args.burst_gap
            )
            await asyncio.sleep(HEAL_WATCH)
        elif episode.kind in ("latency", "slicing"):
            if episode.kind == "latency":
                await self.cluster.call(
                    "latency", node=node, seconds=args.latency, jitter=args.latency / 5
                )
            else:
                await self.cluster.call("slicing", node=node, max_size=args.slice)
            await asyncio.sleep(episode.seconds)
            await self.cluster.call("clear", node=node)
            await asyncio.sleep(HEAL_WATCH)
        else:
            await self.half_open(record)

    async def half_open(self, record: EpisodeRecord) -> None:
        """A silent link for the episode's length, measured: the traced memory the waiting
        publishes pile up (tracemalloc from the window's start: what was allocated then and
        is still alive), RSS, and on heal the loop's lag and the retries that leave.

        tracemalloc slows every allocation (and its traces take memory): a window it does
        not trace (``--trace-windows``) gives the cleaner lag and RSS."""
        node, proxied = record.episode.node, record.episode.kind == "blackhole"
        traced = tracemalloc.is_tracing() or self.args.trace_windows == "all"
        if self.args.trace_windows == "first":
            traced = traced or not any(r.half_open for r in self.episodes)
        tracing_here = traced and not tracemalloc.is_tracing()
        rss_before = rss_mib()
        waiting_before = self.waiting
        if tracing_here:
            tracemalloc.start()
        traced_before = tracemalloc.get_traced_memory()[0] if traced else 0
        peak_waiting, peak_traced = waiting_before, traced_before
        await self.cluster.call("blackhole" if proxied else "node_blackhole", node=node)
        ends = self.loop.time() + record.episode.seconds
        while (remaining := ends - self.loop.time()) > 0:
            await asyncio.sleep(min(SAMPLE, remaining))
            if self.waiting >= peak_waiting:
                peak_waiting = self.waiting
                peak_traced = tracemalloc.get_traced_memory()[0] if traced else 0
        rss_at_heal = rss_mib()
        if tracing_here:
            tracemalloc.stop()
            await asyncio.sleep(2 * TICK)  # the stop's own pause is not the heal's
        retries_at_heal = self.retries()
        self.heal_lag = 0.0
        healed = self.loop.time()
        self.heal_watch_until = healed + HEAL_WATCH
        await self.cluster.call("heal" if proxied else "node_heal", node=node)
        await asyncio.sleep(max(0.0, self.heal_watch_until - self.loop.time()))
        retries_after = self.retries()
        piled = peak_waiting - waiting_before
        record.half_open = {
            "traced": traced,
            "waiting_before": waiting_before,
            "waiting_peak": peak_waiting,
            "traced_growth_mib": (peak_traced - traced_before) / MIB if traced else None,
            "bytes_per_waiting_publish": (
                (peak_traced - traced_before) / piled if traced and piled > 0 else None
            ),
            "rss_before_mib": rss_before,
            "rss_at_heal_mib": rss_at_heal,
            "rss_after_heal_mib": rss_mib(),
            "rss_later_mib": None,
            "lag_after_heal_ms": self.heal_lag * 1000,
            "retries_after_heal": (
                retries_after - retries_at_heal
                if retries_after is not None and retries_at_heal is not None
                else None
            ),
            "settled_after_s": None,
        }
        settling = asyncio.ensure_future(self.settle(record.half_open, healed, waiting_before))
        self.settling.add(settling)
        settling.add_done_callback(self.settling.discard)

    async def settle(self, half: dict[str, Any], healed: float, waiting_before: int) -> None:
        """After a heal: when the pile-up drained (publishes waiting back to what they were
        before the window, give or take a tenth of a second's worth), and RSS 10 s on."""
        normal = waiting_before + max(1, int(self.args.rate / 10))
        while self.loop.time() - healed < SETTLE_WATCH:
            if self.waiting <= normal:
                half["settled_after_s"] = round(self.loop.time() - healed, 2)
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, healed + 10.0 - self.loop.time()))
        half["rss_later_mib"] = rss_mib()

    def episode_line(self, record: EpisodeRecord) -> str:
        text = f"fault: {record.episode.describe()}"
        if record.reset is not None:
            text += f": {record.reset} connection(s) reset"
        text += (
            f"; until {HEAL_WATCH:g} s after: publishes answered {len(record.latencies)}, p99 "
            f"{show(ms(quantile(record.latencies, 0.99)), '.1f', 0)} ms, max "
            f"{show(ms(max(record.latencies, default=None)), '.0f', 0)} ms, failed "
            f"{record.failed}, max waiting {record.max_waiting}, producer retries "
            f"{show(record.retries, 'd', 0)}, consumer reconnects {record.consumer_reconnects}"
            f", loop lag max {record.lag_max * 1000:.0f} ms (at +{record.lag_at:.1f} s)"
        )
        half = record.half_open
        if half is not None:
            text += "\n" + " " * 9 + half_open_line(half)
        return text

    # ------------------------------------------------------------------ the whole run

    async def run(self, episodes: list[Episode]) -> dict[str, Any]:
        args = self.args
        await self.consumer.start()
        await self.producer.start()
        self.started = self.loop.time()
        ticker = asyncio.ensure_future(self.tick())
        reporter = asyncio.ensure_future(self.reporter())
        faults = asyncio.ensure_future(self.faults(episodes))
        print(self.HEADER)
        print(self.UNITS, flush=True)
        try:
            await self.pace(self.started + args.seconds)
            faults.cancel()
            await asyncio.gather(faults, return_exceptions=True)
            await self.cluster.clear_all()
            drained = await self.drain()
            self.report()
        finally:
            for task in (ticker, reporter, faults, *self.settling):
                task.cancel()
            with contextlib.suppress(Exception):
                await self.consumer.close()
            with contextlib.suppress(Exception):
                await self.producer.close()
        return drained

    async def drain(self) -> dict[str, Any]:
        """Wait for the publishes still waiting (their own bound, plus a margin), then for
        the consumer to receive everything acknowledged (until it stops making progress for
        ``--drain`` seconds)."""
        ended = self.loop.time()
        bound = self.producer.publish_timeout + 30.0
        if self.waiting:
            self.idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), bound)
        still_waiting = self.waiting
        publishes_done = self.loop.time() - ended
        progress, last = self.loop.time(), self.ledger.distinct
        ledger = self.ledger
        while ledger.acked_received < ledger.acked:
            if ledger.distinct != last:
                progress, last = self.loop.time(), ledger.distinct
            if self.loop.time() - progress > self.args.drain:
                break
            await asyncio.sleep(0.05)
        return {
            "publishes_done_after_s": round(publishes_done, 2),
            "still_waiting": still_waiting,
            "received_all_after_s": round(self.loop.time() - ended, 2),
        }


def half_open_line(half: dict[str, Any]) -> str:
    per = half["bytes_per_waiting_publish"]
    settled = half["settled_after_s"]
    memory = (
        f"traced +{half['traced_growth_mib']:.1f} MiB = "
        f"{show(None if per is None else per / 1024, '.2f', 0)} KiB per waiting publish"
        if half["traced"]
        else "not traced"
    )
    return (
        f"half-open: {half['waiting_peak'] - half['waiting_before']} publishes piled up "
        f"(peak {half['waiting_peak']} waiting); {memory}; RSS "
        f"{show(half['rss_before_mib'], '.0f', 0)} -> {show(half['rss_at_heal_mib'], '.0f', 0)}"
        f" MiB at heal; on heal: loop lag max {half['lag_after_heal_ms']:.0f} ms in "
        f"{HEAL_WATCH:g} s, {show(half['retries_after_heal'], 'd', 0)} retries"
        + ("" if settled is None else f", drained in {settled:g} s")
    )


# --------------------------------------------------------------------------- the summary


def fault_kinds(records: list[EpisodeRecord]) -> dict[str, dict[str, Any]]:
    """What each kind of fault did, over all its episodes."""
    kinds: dict[str, dict[str, Any]] = {}
    for record in records:
        kind = kinds.setdefault(
            record.episode.kind,
            {
                "episodes": 0,
                "reset": None,
                "answered": 0,
                "worst_p99_ms": None,
                "worst_max_ms": None,
                "failed": 0,
                "max_waiting": 0,
                "consumer_reconnects": 0,
                "retries": 0,
                "worst_lag_ms": 0.0,
            },
        )
        kind["episodes"] += 1
        if record.reset is not None:
            kind["reset"] = (kind["reset"] or 0) + record.reset
        kind["answered"] += len(record.latencies)
        for name, value in (
            ("worst_p99_ms", ms(quantile(record.latencies, 0.99))),
            ("worst_max_ms", ms(max(record.latencies, default=None))),
        ):
            if value is not None and (kind[name] is None or value > kind[name]):
                kind[name] = value
        kind["failed"] += record.failed
        kind["max_waiting"] = max(kind["max_waiting"], record.max_waiting)
        kind["consumer_reconnects"] += record.consumer_reconnects
        kind["retries"] += record.retries or 0
        kind["worst_lag_ms"] = max(kind["worst_lag_ms"], record.lag_max * 1000)
    return kinds


def summarize(
    soak: Soak, drained: dict[str, Any], cluster: dict[str, Any], share: float
) -> dict[str, Any]:
    ledger, consumer = soak.ledger, soak.consumer.stats()
    return {
        "sent": ledger.sent,
        "acknowledged": ledger.acked,
        "failed": ledger.failed,
        "failures": dict(soak.failures),
        "still_waiting": drained["still_waiting"],
        "received": ledger.received,
        "distinct_received": ledger.distinct,
        "lost": ledger.lost(),
        "duplicated": ledger.duplicates,
        "failed_but_stored": ledger.failed_received,
        "stored_by_cluster": cluster["stored"],
        "order_violations": sum(ledger.violations),
        "keys_with_order_violations": sum(1 for v in ledger.violations if v),
        "stored_out_of_key_order": ledger.stored_out_of_order,
        "delivered_against_queue_order": ledger.delivered_out_of_order,
        "consumer_order_violations": consumer.order_violations,
        "consumer_duplicates": consumer.duplicates,
        "consumer_stamped_replays": consumer.stamped_replays,
        "consumer_reconnects": consumer.reconnects,
        "producer_retries": soak.retries(),
        "drain": drained,
        "caller_share_bytes": share,
        "faults": fault_kinds(soak.episodes),
        "half_open": [
            {k: v for k, v in r.summary().items() if k != "half_open"} | r.half_open
            for r in soak.episodes
            if r.half_open is not None
        ],
        "client_cpu_s": cluster["client_cpu"],
        "cluster_cpu_s": cluster["cluster_cpu"],
        "cluster_rss_mib": cluster["rss_mib"],
        "proxies": cluster["proxies"],
    }


def print_summary(totals: dict[str, Any], args: argparse.Namespace, windows: list[Any]) -> None:
    failures = ", ".join(f"{n} {name}" for name, n in sorted(totals["failures"].items()))
    print(f"\ntotals over {args.seconds:g} s of publishing ({args.rate:g}/s):")
    print(
        f"  sent {totals['sent']:,}, acknowledged {totals['acknowledged']:,}, failed "
        f"{totals['failed']:,}{f' ({failures})' if failures else ''}, still waiting "
        f"{totals['still_waiting']:,} after {totals['drain']['publishes_done_after_s']:g} s"
    )
    print(
        f"  received {totals['received']:,} deliveries of {totals['distinct_received']:,} "
        f"messages; stored by the cluster {totals['stored_by_cluster']:,}"
    )
    print(
        f"  lost {totals['lost']:,} (acknowledged, never received); duplicated "
        f"{totals['duplicated']:,}; failed but stored {totals['failed_but_stored']:,}"
    )
    if args.ordered:
        print(
            f"  order: {totals['order_violations']:,} violations on "
            f"{totals['keys_with_order_violations']} of {args.keys} keys (a key's message "
            f"handled after a later one of the key): {totals['stored_out_of_key_order']:,} "
            f"stored so (concurrent publishes of a key, one retried), "
            f"{totals['delivered_against_queue_order']:,} handled against the queue's order; "
            f"the consumer counted {totals['consumer_order_violations']}"
        )
    print(
        f"  producer retries {totals['producer_retries']}, consumer reconnects "
        f"{totals['consumer_reconnects']}, consumer duplicates dropped "
        f"{totals['consumer_duplicates']}, stamped replays dropped "
        f"{totals['consumer_stamped_replays']}"
    )
    cpu = totals["client_cpu_s"]
    print(
        f"  CPU: client {cpu:.1f} s ({100 * cpu / max(args.seconds, 1):.1f} % of a core), "
        f"cluster and proxies {totals['cluster_cpu_s']:.1f} s; cluster RSS "
        f"{show(totals['cluster_rss_mib'], '.0f', 0)} MiB"
    )
    if windows:
        first, last = windows[0], windows[-1]
        print(
            f"  first -> last line: RSS {show(first['rss_mib'], '.1f', 0)} -> "
            f"{show(last['rss_mib'], '.1f', 0)} MiB, fds {first['fds']} -> {last['fds']}, "
            f"tasks {first['tasks']} -> {last['tasks']}"
        )
    if totals["faults"]:
        print("faults:")
    for kind, done in totals["faults"].items():
        reset = "" if done["reset"] is None else f"{done['reset']} connections reset; "
        print(
            f"  {kind:<15} x{done['episodes']}: {reset}publishes answered during "
            f"{done['answered']:,}, worst p99 {show(done['worst_p99_ms'], '.1f', 0)} ms, "
            f"worst max {show(done['worst_max_ms'], '.0f', 0)} ms, failed {done['failed']}, "
            f"max waiting {done['max_waiting']:,}, producer retries {done['retries']:,}, "
            f"consumer reconnects {done['consumer_reconnects']}, worst loop lag "
            f"{done['worst_lag_ms']:.0f} ms"
        )
    for half in totals["half_open"]:
        per = half["bytes_per_waiting_publish"]
        where = f"{half['kind']} node {half['node']} at {half['at']:g} s"
        print(f"half-open window ({where}, {half['seconds']:g} s):")
        piled = half["waiting_peak"] - half["waiting_before"]
        if half["traced"]:
            print(
                f"  memory per waiting publish: "
                f"{show(None if per is None else per / 1024, '.2f', 0)} KiB (traced growth "
                f"{half['traced_growth_mib']:.1f} MiB / {piled:,} publishes piled up at the "
                f"peak; the caller's own task, callback and {args.body_size}-byte body: "
                f"{totals['caller_share_bytes'] / 1024:.2f} KiB)"
            )
        else:
            print("  memory per waiting publish: not traced (--trace-windows)")
        before, at_heal = half["rss_before_mib"], half["rss_at_heal_mib"]
        grown = None
        if before is not None and at_heal is not None and piled > 0:
            grown = (at_heal - before) * 1024 / piled
        print(
            f"  RSS: {show(before, '.1f', 0)} MiB before, {show(at_heal, '.1f', 0)} at the "
            f"heal ({show(grown, '.1f', 0)} KiB per waiting publish"
            f"{', tracemalloc included' if half['traced'] else ''}), "
            f"{show(half['rss_after_heal_mib'], '.1f', 0)} {HEAL_WATCH:g} s after, "
            f"{show(half['rss_later_mib'], '.1f', 0)} 10 s after"
        )
        print(
            f"  loop lag in the window: {half['lag_max_ms']:.0f} ms max, "
            f"{half['lag_at_s']:g} s after it began"
            f"{' (tracemalloc on)' if half['traced'] else ''}; producer retries "
            f"{show(half['retries'], 'd', 0)} in it"
        )
        settled = half["settled_after_s"]
        print(
            f"  loop lag on heal: {half['lag_after_heal_ms']:.0f} ms max in the "
            f"{HEAL_WATCH:g} s after the heal; {show(half['retries_after_heal'], 'd', 0)} "
            f"retries then; pile-up drained "
            + (f"in {settled:g} s" if settled is not None else f"not within {SETTLE_WATCH:g} s")
        )


async def soak_run(args: argparse.Namespace, port_file: Path, errors: Any) -> dict[str, Any]:
    """Start the cluster, run, stop the cluster; everything the summary needs."""
    cluster = await ClusterProcess.spawn(args, port_file, errors)
    try:
        info = cluster.info
        leaders = {}
        if not args.classic:
            rows = info["topics"][TOPIC]["partitions"]
            leaders = {row["partition"]: row["leader"] for row in rows}
        episodes = plan(args, len(info["nsqd"]), leaders)
        describe_run(args, info, episodes)
        share = await caller_share(args.body_size)
        soak = Soak(args, cluster)
        if args.tracemalloc:
            tracemalloc.start()
        cpu_before, cluster_before = cpu_seconds(), proc_cpu(cluster.pid)
        drained = await soak.run(episodes)
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        stats = await cluster.call("stats")
        final = {
            "stored": await cluster.call("stored"),
            "client_cpu": cpu_seconds() - cpu_before,
            "cluster_cpu": proc_cpu(cluster.pid) - cluster_before,
            "rss_mib": None if stats["rss"] is None else stats["rss"] / MIB,
            "proxies": stats["proxies"],
        }
    finally:
        await cluster.stop()
    return {
        "episodes": [r.summary() for r in soak.episodes],
        "windows": soak.windows,
        "totals": summarize(soak, drained, final, share),
    }


def describe_run(args: argparse.Namespace, info: dict[str, Any], episodes: list[Episode]) -> None:
    if args.classic:
        mode = f"classic nsqd x{len(info['nsqd'])}, direct mode"
    else:
        mode = (
            f"youzan x{len(info['nsqd'])}, topic {TOPIC} {args.partitions} partitions x "
            f"{args.replicas} replicas{' (ordered)' if args.ordered else ''}"
            f"{' (ext)' if args.ext else ''}"
        )
    consumer = "an ordered" if args.ordered else "a plain"
    print(
        f"soak: {mode}; {args.rate:g} keyed publishes/s ({args.keys} keys, "
        f"{args.body_size}-byte bodies) for {args.seconds:g} s, {consumer} consumer; "
        f"cluster and proxies pinned to core {args.cluster_cpu} (pid {info['pid']}), "
        f"client to core {args.client_cpu}; seed {args.seed}"
    )
    print(f"faults ({len(episodes)}, in cycles of {args.cycle:g} s):")
    for episode in episodes:
        print(f"  {episode.at:>7.1f} s  {episode.describe()}")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=30.0, help="how long to publish")
    length.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 60 s, one cycle of reset,blackhole,burst,latency,slicing, a line "
        "every 10 s",
    )
    parser.add_argument("--interval", type=float, help="seconds between lines (30; quick 10)")
    parser.add_argument("--rate", type=float, default=800.0, help="publishes per second")
    parser.add_argument("--keys", type=int, default=100, help="sharding keys, in turn")
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--classic", action="store_true", help="classic nsqd, direct mode")
    parser.add_argument("--unordered", action="store_true", help="a plain consumer")
    parser.add_argument(
        "--ext",
        action="store_true",
        help="an ext topic: the producer's sequence stamps let the ordered consumer drop copies",
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=4, help="youzan")
    parser.add_argument("--replicas", type=int, default=2, help="youzan")
    faults = parser.add_argument_group("faults")
    faults.add_argument("--seed", type=int, default=1, help="the schedule's and proxies' seed")
    faults.add_argument(
        "--faults",
        help=f"each cycle's faults, in order, from {', '.join(KINDS)}; 'none' for none "
        f"(default {DEFAULT_FAULTS}; quick {QUICK_FAULTS})",
    )
    faults.add_argument("--cycle", type=float, help="seconds per cycle (600; quick 60)")
    faults.add_argument("--blackhole-seconds", type=float, default=15.0)
    faults.add_argument("--burst-resets", type=int, default=20)
    faults.add_argument("--burst-gap", type=float, default=0.2)
    faults.add_argument("--latency", type=float, default=0.05, help="s each way, +- 20 %%")
    faults.add_argument("--slice", type=int, default=7, help="slicing: pieces of 1..N bytes")
    faults.add_argument(
        "--episode-seconds", type=float, help="latency and slicing last this long (30; quick 6)"
    )
    client = parser.add_argument_group("the clients (their defaults unless given)")
    client.add_argument("--publish-timeout", type=float)
    client.add_argument("--heartbeat", type=float, help="heartbeat_interval of both")
    client.add_argument("--max-in-flight", type=int)
    parser.add_argument(
        "--drain", type=float, default=30.0, help="at the end, wait this long without progress"
    )
    parser.add_argument(
        "--tracemalloc", action="store_true", help="trace memory all along (costs CPU)"
    )
    parser.add_argument(
        "--trace-windows",
        choices=("first", "all", "none"),
        default="first",
        help="which half-open windows tracemalloc follows to measure the memory per waiting "
        "publish (default: the first; the others give the cleaner lag and RSS)",
    )
    parser.add_argument("--cluster-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the lines, faults and totals here")
    args = parser.parse_args(argv)
    args.seconds = 60.0 if args.quick else args.minutes * 60
    defaults = (
        (10.0, 60.0, QUICK_FAULTS, 6.0) if args.quick else (30.0, 600.0, DEFAULT_FAULTS, 30.0)
    )
    for name, value in zip(
        ("interval", "cycle", "faults", "episode_seconds"), defaults, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.faults = [] if args.faults == "none" else [f for f in args.faults.split(",") if f]
    unknown = sorted(set(args.faults) - set(KINDS))
    if unknown:
        parser.error(f"--faults: unknown {unknown} (known: {', '.join(KINDS)})")
    args.ordered = not (args.unordered or args.classic)
    if args.rate <= 0 or args.keys < 1 or args.body_size < 18 or args.seconds <= 0:
        parser.error("--rate, --keys, --body-size (>= 18) and the length must be positive")
    if args.keys > 999_999:
        parser.error("--keys: at most 999,999")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    pin(args.client_cpu)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="smartnsq-soak-") as tmp:
        folder = Path(tmp)
        with open(folder / "stderr", "w+") as errors:
            try:
                run = asyncio.run(soak_run(args, folder / "cluster.json", errors))
            except KeyboardInterrupt:
                log("soak: interrupted")
                return 130
    totals = run["totals"]
    print_summary(totals, args, run["windows"])
    if args.json is not None:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"options": options, **run}, indent=2) + "\n")
    log(f"soak: {time.monotonic() - started:.0f} s in all")
    if totals["lost"]:
        print(f"FAIL: {totals['lost']:,} acknowledged message(s) never received")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
