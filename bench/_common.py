"""What the benchmark orchestrators share (``cluster.py``, ``producer.py``, ``consumer.py``,
``compare.py``): a ``smartnsq cluster`` in a child process pinned to one core, raw-socket
NSQ connections (the protocol floor only, no client code) to pre-fill topics fast, the CPU
clocks, worker subprocesses and their JSON results, and the summary arithmetic.

The workers themselves (``clients/*_worker.py``) share ``clients/_worker.py`` (standard
library only); the clocks and pinning here are the same functions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clients._worker import BODY, cpu_seconds, machine_busy, percentiles, pin, proc_cpu, split

from smartnsq.protocol import commands
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT

__all__ = [
    "BATCH",
    "BENCH",
    "BODY",
    "CHANNEL",
    "GO_CLIENTS",
    "ROOT",
    "TOPIC",
    "Aim",
    "Cluster",
    "Conditions",
    "Connection",
    "Job",
    "Publisher",
    "Subscriber",
    "WorkerError",
    "cpu_clock",
    "cpu_seconds",
    "describe",
    "die_with_parent",
    "exit_on_sigterm",
    "log",
    "measure",
    "median",
    "other_load",
    "parallel_cores",
    "per_message",
    "percentiles",
    "pin",
    "prefill",
    "print_table",
    "proc_cpu",
    "rate",
    "run_fresh",
    "run_worker",
    "spawn_cluster",
    "split",
    "wait_for_quiet",
    "wait_ready",
    "write_json",
]

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent  # the tree these benchmarks belong to
BATCH = 100
TIMEOUT = 120.0
READY_TIMEOUT = 60.0


def cpu_clock(pid: int | None) -> Callable[[], float]:
    """CPU seconds of ``pid`` (None or this process: ``time.process_time``)."""
    if pid is None or pid == os.getpid():
        return time.process_time
    return lambda: proc_cpu(pid)


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``signum`` when this process dies (Linux), so no
    cluster or worker outlives an orchestrator that was killed."""

    def preexec() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG

    return preexec


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so ``finally`` blocks stop the children we started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def wait_for_quiet(max_load: float, patience: float, window: float = 0.5) -> float:
    """Between runs (our processes idle), wait until the machine's busy CPU over ``window``
    is at most ``max_load`` cores, for up to ``patience`` seconds; the seconds waited.
    The machine may be shared: other load during a run skews every number."""
    started = time.perf_counter()
    while True:
        busy0, t0 = machine_busy(), time.perf_counter()
        time.sleep(window)
        load = (machine_busy() - busy0) / (time.perf_counter() - t0)
        waited = time.perf_counter() - started
        if load <= max_load or waited >= patience:
            return waited


_SPIN = """
import os, sys, time
os.sched_setaffinity(0, {%d})
end = time.perf_counter() + %f
cpu = time.process_time()
while time.perf_counter() < end:
    pass
print(time.process_time() - cpu)
"""


def parallel_cores(cores: Sequence[int] = (0, 1), seconds: float = 0.4) -> float | None:
    """How many cores the machine really delivers when ``cores`` are all busy: one busy loop
    pinned to each, for ``seconds``; the sum of the CPU time they got over the wall time. A
    virtual machine's cores may share physical ones with other tenants: 2 cores can deliver
    1.3 (then the client and the cluster slow each other down)."""
    if not hasattr(os, "sched_setaffinity") or max(cores) >= (os.cpu_count() or 1):
        return None
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SPIN % (core, seconds)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent(),
        )
        for core in cores
    ]
    total = 0.0
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        total += float(out.strip() or 0)
    return total / seconds


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# --------------------------------------------------------------------------- raw connections


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
        if batches == 0:
            self.done.set_result(None)
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


def partitions_of(info: dict[str, Any], topic: str) -> list[tuple[int | None, str]]:
    """(partition id or None for classic, nsqd TCP address) of every writable partition."""
    if info["mode"] == "classic":
        return [(None, address) for address in info["topics"][topic]["nsqd"]]
    return [(row["partition"], row["tcp"]) for row in info["topics"][topic]["partitions"]]


async def prefill(info: dict[str, Any], topic: str, messages: int, window: int = 16) -> None:
    """Put ``messages`` 100-byte messages in ``topic`` (spread evenly over its partitions, or
    its nsqd), by raw MPUB batches of 100, ``window`` in flight per connection."""
    targets = partitions_of(info, topic)
    counts = split(messages, len(targets))
    publishers: list[Publisher] = []
    try:
        waits = []
        for (partition, address), count in zip(targets, counts, strict=True):
            conn = await Publisher.open(address)
            publishers.append(conn)
            full, rest = divmod(count, BATCH)
            command = commands.mpub(topic, [BODY] * BATCH, partition)
            waits.append(conn.start(command, full, window))
            if rest:
                waits.append(asyncio.ensure_future(_mpub_once(address, topic, partition, rest)))
        await asyncio.wait_for(asyncio.gather(*waits), TIMEOUT)
    finally:
        for conn in publishers:
            conn.close()


async def _mpub_once(address: str, topic: str, partition: int | None, count: int) -> None:
    conn = await Publisher.open(address)
    try:
        await conn.start(commands.mpub(topic, [BODY] * count, partition), 1, 1)
    finally:
        conn.close()


# --------------------------------------------------------------------------- cluster process


@dataclass
class Cluster:
    """A running ``smartnsq cluster`` child and what its port file says."""

    process: subprocess.Popen[str]
    info: dict[str, Any]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def classic(self) -> bool:
        return bool(self.info["mode"] == "classic")

    def nsqd(self, topic: str) -> list[str]:
        return sorted({address for _, address in partitions_of(self.info, topic)})

    @property
    def lookupd(self) -> list[str]:
        return list(self.info["lookupd_http"])

    def cpu(self) -> float:
        return proc_cpu(self.pid)


def wait_ready(child: subprocess.Popen[str], timeout: float = READY_TIMEOUT) -> None:
    """The child prints its address block, ending with the "Ready" line, once it serves."""
    if child.stdout is None:
        raise RuntimeError("no stdout pipe")
    deadline = time.monotonic() + timeout
    for line in child.stdout:
        if line.startswith("Ready"):
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"smartnsq cluster did not start (exit status {child.poll()})")


@contextlib.contextmanager
def spawn_cluster(
    *,
    classic: bool = False,
    topics: Sequence[str] = (),
    channels: Sequence[str] = (),
    nodes: int = 1,
    cpu: int | None = 0,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """``smartnsq cluster`` in a child pinned to ``cpu``; stopped (then killed) on exit.

    ``topics`` are ``name[:partitions:replicas]``, ``channels`` ``topic:channel``; ``env``
    adds to the child's environment (e.g. ``PYTHONPATH``: which tree's emulator runs).
    """
    argv = [python, "-m", "smartnsq", "cluster", f"--nodes={nodes}"]
    argv += ["--classic"] if classic else []
    argv += [f"--topic={t}" for t in topics] + [f"--channel={c}" for c in channels]
    with tempfile.TemporaryDirectory(prefix="smartnsq-bench-") as tmp:
        port_file = Path(tmp) / "cluster.json"
        with open(Path(tmp) / "stderr", "w+") as errors:
            child = subprocess.Popen(
                [*argv, f"--port-file={port_file}"],
                stdout=subprocess.PIPE,
                stderr=errors,
                stdin=subprocess.DEVNULL,
                text=True,
                env=cluster_env() | (env or {}),
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
            try:
                pin(cpu, child.pid)
                try:
                    wait_ready(child)
                except RuntimeError as exc:
                    errors.seek(0)
                    raise RuntimeError(f"{exc}: {errors.read()[-2000:]}") from None
                yield Cluster(child, json.loads(port_file.read_text()))
            finally:
                stop(child)


def stop(child: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate a child we started; kill it if it does not go."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    if child.stdout is not None:
        child.stdout.close()


# --------------------------------------------------------------------------- workers

TOPIC = "bench"
CHANNEL = "bench"


class WorkerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Job:
    """One measured run: a client's worker doing ``mode`` against a fresh cluster."""

    client: str  # smartnsq, pynsq, gnsq
    mode: str  # consume, pub1, pub100, mpub100
    messages: int
    youzan: bool = False
    partitions: int = 4  # youzan only
    linger: float | None = None  # smartnsq auto-batching
    max_batch: int = 50  # smartnsq auto-batching: about half the concurrent publishers
    warmup: int = 2000
    mpub_window: int = 1
    concurrency: int = 100
    max_in_flight: int = 2500
    handler: str = "async"  # consume: "async" or "plain" (a def, run in threads)
    ordered: bool = False  # youzan consume: an ordered topic, Consumer(ordered=True)
    loop: str = "asyncio"  # the worker's event loop: "asyncio" or "uvloop"
    gc: str = "default"  # the worker's garbage collector: "default" or "freeze"
    blocking: bool = False  # smartnsq pub1 through smartnsq.sync.Producer
    # extra environment of the worker: PYTHONPATH (another smartnsq tree), SMARTNSQ_PURE
    env: tuple[tuple[str, str], ...] = ()


def run_fresh(
    job: Job,
    *,
    cluster_cpu: int | None = 0,
    client_cpu: int | None = 1,
    python: str = sys.executable,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Start a cluster pinned to ``cluster_cpu`` (classic, or youzan with one topic of
    ``partitions``, ordered for an ordered job), pre-fill it for consume, run the worker
    pinned to ``client_cpu``, stop the cluster; the worker's JSON result."""
    if job.ordered and not job.youzan:
        raise ValueError("ordered consumption needs youzan (an ordered topic)")
    topic = f"{TOPIC}:{job.partitions}:1" if job.youzan else TOPIC
    topic += ":ordered" if job.ordered else ""
    # Publish runs too: youzan nsqlookupd refuses writes to a topic without a channel, and a
    # topic usually has consumers; every client's messages then take the same server path.
    channels = [f"{TOPIC}:{CHANNEL}"]
    with spawn_cluster(
        classic=not job.youzan, topics=[topic], channels=channels, cpu=cluster_cpu, python=python
    ) as cluster:
        if job.mode == "consume":
            asyncio.run(prefill(cluster.info, TOPIC, job.messages))
        if job.youzan:
            targets = [f"--lookupd={url}" for url in cluster.lookupd]
        else:
            targets = [f"--nsqd={address}" for address in cluster.nsqd(TOPIC)]
        argv = [
            *targets,
            f"--topic={TOPIC}",
            f"--channel={CHANNEL}",
            f"--messages={job.messages}",
            f"--warmup={job.warmup}",
            f"--mpub-window={job.mpub_window}",
            f"--concurrency={job.concurrency}",
            f"--max-in-flight={job.max_in_flight}",
            f"--cluster-pid={cluster.pid}",
        ]
        if client_cpu is not None:
            argv.append(f"--cpu={client_cpu}")
        if job.linger is not None:
            argv += [f"--linger={job.linger}", f"--max-batch={job.max_batch}"]
        if job.client == "smartnsq":
            argv += [f"--handler={job.handler}", f"--gc={job.gc}"]
            if job.blocking:
                argv.append("--blocking")
        if job.client in ("smartnsq", "raw"):
            argv.append(f"--loop={job.loop}")
        argv += ["--ordered"] if job.ordered else []
        limit = timeout if timeout is not None else 60.0 + job.messages / 1000
        env = worker_env(dict(job.env))
        return run_worker(job.client, job.mode, argv, timeout=limit, python=python, env=env)


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """A worker's environment: ours without what picks a smartnsq tree or build, plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SMARTNSQ_PURE")}
    env.update(extra)
    return env


def cluster_env() -> dict[str, str]:
    """The embedded cluster's environment: always this tree, its default build, asyncio's
    loop, whatever the client under test runs (the server stays the same for all). This
    tree by path: the interpreter's own install may be another checkout's (editable)."""
    env = worker_env({"PYTHONPATH": str(ROOT)})
    env["SMARTNSQ_UVLOOP"] = "0"
    return env


@dataclass(frozen=True)
class Conditions:
    """Where runs happen and how much of a shared machine's other load is tolerated."""

    cluster_cpu: int | None = 0
    client_cpu: int | None = 1
    quiet_load: float = 0.25  # cores busy elsewhere before a run starts...
    quiet_patience: float = 30.0  # ...waited for up to this long (0: do not wait)
    max_other_load: float = 0.5  # cores busy elsewhere during a run: run it again...
    retries: int = 2  # ...up to this many times (the last try is kept whatever it saw)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("where and when runs happen")
        group.add_argument("--cluster-cpu", type=int, default=cls.cluster_cpu)
        group.add_argument("--client-cpu", type=int, default=cls.client_cpu)
        group.add_argument(
            "--quiet-load",
            type=float,
            default=cls.quiet_load,
            help="before a run, wait until other processes use at most this many cores",
        )
        group.add_argument(
            "--quiet-patience",
            type=float,
            default=cls.quiet_patience,
            help="wait at most this long (s; 0: never wait)",
        )
        group.add_argument(
            "--max-other-load",
            type=float,
            default=cls.max_other_load,
            help="run again when other processes used more cores than this during a run",
        )
        group.add_argument("--retries", type=int, default=cls.retries)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Conditions:
        return cls(
            args.cluster_cpu,
            args.client_cpu,
            args.quiet_load,
            args.quiet_patience,
            args.max_other_load,
            args.retries,
        )


def measure(job: Job, where: Conditions, log: Callable[[str], None]) -> dict[str, Any]:
    """``run_fresh`` when the machine is quiet enough, again if other load disturbed it."""
    for attempt in range(1, where.retries + 2):
        waited = 0.0
        if where.quiet_patience > 0:
            waited = wait_for_quiet(where.quiet_load, where.quiet_patience)
        result = run_fresh(job, cluster_cpu=where.cluster_cpu, client_cpu=where.client_cpu)
        result.pop("stderr", None)
        result["attempt"] = attempt
        result["waited_for_quiet"] = round(waited, 2)
        cpus = result.get("cpus") or {}
        wanted = {"client": where.client_cpu, "cluster": where.cluster_cpu}
        result["pinned"] = all(
            cpu is None or cpus.get(name) == [cpu] for name, cpu in wanted.items()
        )
        if not result["pinned"]:
            log(f"  warning: asked for {wanted}, the processes ran on {cpus}")
        other = other_load(result)
        if other is None or other <= where.max_other_load or attempt > where.retries:
            return result
        log(f"  {job.client} {job.mode}: other processes used {other:.2f} cores; again")
    raise AssertionError("unreachable")


def other_load(run: dict[str, Any]) -> float | None:
    """Cores used by other processes while a run measured."""
    other = run.get("other_cpu")
    return None if other is None or not run["seconds"] else float(other / run["seconds"])


def log(text: str) -> None:
    """Progress goes to stderr; the results table to stdout."""
    print(text, file=sys.stderr, flush=True)


def describe(run: dict[str, Any]) -> str:
    """One worker result on one line."""
    text = f"{rate(run):>10,.0f} msgs/s  client {per_message(run, 'cpu') or 0:6.2f} µs/msg"
    cluster = per_message(run, "cluster_cpu")
    if cluster is not None:
        text += f"  cluster {cluster:6.2f} µs/msg"
    other = other_load(run)
    if other is not None:
        text += f"  other load {100 * other:4.0f}%"
    latency = run.get("latency_us")
    if latency:
        text += f"  p50 {latency['p50']:.0f} µs  p99 {latency['p99']:.0f} µs"
    return text


def rate(run: dict[str, Any]) -> float:
    """Messages per second of a worker result."""
    return float(run["messages"] / run["seconds"])


def per_message(run: dict[str, Any], key: str) -> float | None:
    """A CPU field of a worker result in microseconds per message (None if not measured)."""
    value = run.get(key)
    return None if value is None else float(value * 1e6 / run["messages"])


def run_worker(
    client: str,
    workload: str,
    argv: Sequence[str],
    *,
    timeout: float,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``clients/<client>_worker.py`` (a Go client: its binary, ``go_worker``) in its
    own process; its JSON result."""
    preexec = die_with_parent()
    if client in GO_CLIENTS:
        binary = go_worker(client)
        if binary is None:
            raise WorkerError(f"{client}: {GO_MISSING}")
        command = [str(binary), workload, *argv, f"--timeout={timeout:g}"]
        preexec = _pinned(preexec, argv)  # a Go process has many threads: pin before exec
    else:
        script = BENCH / "clients" / f"{client}_worker.py"
        command = [python, str(script), workload, *argv, f"--timeout={timeout:g}"]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            stdin=subprocess.DEVNULL,
            check=False,
            env=env,
            preexec_fn=preexec,
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run killed it
        raise WorkerError(f"{client} {workload}: no answer after {timeout + 30:g} s") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-3000:]
        raise WorkerError(f"{client} {workload} exited with {done.returncode}:\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = done.stderr[-2000:]
    return result


GO_CLIENTS = ("go-nsq", "youzan-go-nsq")
GO_MISSING = "not built: GOPATH=... bench/go/build.sh (see that script)"


def go_worker(client: str) -> Path | None:
    """The Go worker binary of ``client`` (bench/go/bin), None when it is not built."""
    binary = BENCH / "go" / "bin" / f"{client}-worker"
    return binary if os.access(binary, os.X_OK) else None


def _pinned(preexec: Callable[[], None], argv: Sequence[str]) -> Callable[[], None]:
    """``preexec`` and the worker's ``--cpu=N`` applied to the child before it starts (its
    threads inherit it)."""
    cpu = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--cpu=")), None)

    def both() -> None:
        preexec()
        pin(cpu)

    return both


# --------------------------------------------------------------------------- reports


@dataclass(frozen=True)
class Aim:
    """An absolute throughput aim for one workload (msgs/s on this machine)."""

    workload: str
    rate: float
    text: str


def print_table(runs: dict[str, list[dict[str, Any]]], aims: Sequence[Aim] = ()) -> None:
    """Medians per workload: msgs/s, CPU seconds per 100k messages (client, cluster), the
    machine's other load, latency where measured; then whether each aim is met."""
    print(
        f"{'workload':<14}{'msgs/s':>10}{'client CPU s/100k':>19}{'cluster CPU s/100k':>20}"
        f"{'other load':>12}{'p50 µs':>9}{'p99 µs':>9}{'runs':>6}"
    )
    rates: dict[str, float | None] = {}
    for name, results in runs.items():
        rates[name] = median([rate(r) for r in results])
        client = median([per_message(r, "cpu") for r in results])
        cluster = median([per_message(r, "cluster_cpu") for r in results])
        other = median([other_load(r) for r in results])
        p50 = median([r["latency_us"].get("p50") for r in results if r.get("latency_us")])
        p99 = median([r["latency_us"].get("p99") for r in results if r.get("latency_us")])
        print(
            f"{name:<14}{_fmt(rates[name], ',.0f', 10)}"
            f"{_fmt(None if client is None else client / 10, '.3f', 19)}"
            f"{_fmt(None if cluster is None else cluster / 10, '.3f', 20)}"
            f"{_fmt(None if other is None else 100 * other, '.0f', 11)}%"
            f"{_fmt(p50, '.0f', 9)}{_fmt(p99, '.0f', 9)}{len(results):>6}"
        )
    for aim in aims:
        value = rates.get(aim.workload)
        if value is None:
            continue
        state = "MET " if value >= aim.rate else "MISS"
        print(f"  [{state}] {aim.text}: {value:,.0f} msgs/s")


def measure_round(
    job: Job, where: Conditions, runs: dict[str, list[dict[str, Any]]], name: str, round_: int
) -> None:
    """Run one job of a round (see measure), keep its result under ``name`` and log it."""
    result = measure(job, where, log)
    result["round"] = round_
    runs[name].append(result)
    log(f"round {round_}: {name}: {describe(result)}")


def report(
    header: str,
    runs: dict[str, list[dict[str, Any]]],
    aims: Sequence[Aim],
    cores: Sequence[float | None],
    args: Any,
) -> None:
    """What bench/producer.py and bench/consumer.py print at the end: the header, how many
    cores two busy pinned loops got before and after the runs, the table, the JSON file."""
    print(header)
    if None not in cores:
        print(f"two busy pinned loops got {cores[0]:.2f} cores before, {cores[-1]:.2f} after")
    print_table(runs, aims)
    if args.json:
        write_json(args.json, vars(args), runs)


def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def write_json(path: Path, options: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> None:
    summary = {
        name: {
            "msgs_per_s": median([rate(r) for r in results]),
            "client_cpu_s_per_100k": _scaled(median([per_message(r, "cpu") for r in results])),
            "cluster_cpu_s_per_100k": _scaled(
                median([per_message(r, "cluster_cpu") for r in results])
            ),
        }
        for name, results in runs.items()
    }
    shown = {k: str(v) if isinstance(v, Path) else v for k, v in options.items()}
    data = {"options": shown, "summary": summary, "runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _scaled(us_per_message: float | None) -> float | None:
    return None if us_per_message is None else us_per_message / 10
