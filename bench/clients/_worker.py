"""What every benchmark worker shares: arguments, pinning, clocks and the JSON result line.

Standard library only: each worker runs one client library (smartnsq, pynsq or gnsq) and
nothing else of ours on its hot path. The orchestrators (``bench/_common.py``) import the
clocks from here too, so a process's CPU is read one way everywhere.

Measurement: a worker connects and warms up first (not measured), then measures one phase:
wall time (``time.perf_counter``), its own CPU (``getrusage(RUSAGE_SELF)``: user + system, all
threads) and, given ``--cluster-pid``, the cluster's CPU (``/proc/<pid>/stat``) read at the
same two instants. It prints one JSON object on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BODY = b"x" * 100
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONSUME_WORKLOADS = ("consume",)
PUBLISH_WORKLOADS = ("pub1", "pub100", "mpub100")


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> float:
    """CPU seconds every core of the machine spent busy so far (all processes, the kernel,
    steal), from /proc/stat: what this run's processes did not use of it is other load."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def rss_bytes() -> int | None:
    """This process's resident set now, from /proc (None where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_split() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def pin(cpu: int | None, pid: int = 0) -> bool:
    """Pin a process (0: this one) to one core; False where that is impossible (not Linux,
    no such core). Whatever the caller's own affinity: an orchestrator pinned to one core
    still pins its children to another."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(pid, {cpu})
    except OSError:
        return False
    return True


def affinity(pid: int = 0) -> list[int] | None:
    """The cores a process may run on (None where unknown)."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99/max and mean of latency samples (nanoseconds in, microseconds out)."""
    if not samples_ns:
        return {}
    ordered = sorted(samples_ns)
    last = len(ordered) - 1

    def at(q: float) -> float:
        return ordered[min(last, round(q * last))] / 1000

    return {
        "p50": at(0.50),
        "p90": at(0.90),
        "p99": at(0.99),
        "max": ordered[-1] / 1000,
        "mean": sum(ordered) / len(ordered) / 1000,
    }


@dataclass
class Result:
    client: str
    version: str
    workload: str
    messages: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    cpu_system: float = 0.0  # the kernel's share of ``cpu`` (sockets, epoll...)
    cluster_cpu: float | None = None
    other_cpu: float | None = None  # busy CPU of the machine not used by worker nor cluster
    latency_us: dict[str, float] = field(default_factory=dict)
    cpus: dict[str, list[int] | None] = field(default_factory=dict)  # where each process ran
    extra: dict[str, Any] = field(default_factory=dict)


class Meter:
    """Wall clock, this process's CPU and the cluster's CPU over one measured phase."""

    def __init__(self, cluster_pid: int | None) -> None:
        self.cluster_pid = cluster_pid
        self.t0 = self.user0 = self.system0 = 0.0
        self.cluster0: float | None = None
        self.busy0 = 0.0
        self.seconds = self.cpu = self.cpu_system = 0.0
        self.cluster_cpu: float | None = None
        self.other_cpu: float | None = None

    def _cluster(self) -> float | None:
        if self.cluster_pid is None:
            return None
        try:
            return proc_cpu(self.cluster_pid)
        except OSError:
            return None

    def start(self) -> None:
        self.busy0 = machine_busy()
        self.cluster0 = self._cluster()
        self.user0, self.system0 = cpu_split()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        t1 = time.perf_counter()
        user1, system1 = cpu_split()
        cluster1 = self._cluster()
        busy = machine_busy() - self.busy0
        self.seconds = t1 - self.t0
        self.cpu_system = system1 - self.system0
        self.cpu = user1 - self.user0 + self.cpu_system
        if self.cluster0 is not None and cluster1 is not None:
            self.cluster_cpu = cluster1 - self.cluster0
            self.other_cpu = max(0.0, busy - self.cpu - self.cluster_cpu)

    def fill(self, result: Result, messages: int) -> Result:
        result.messages = messages
        result.seconds = self.seconds
        result.cpu = self.cpu
        result.cpu_system = self.cpu_system
        result.cluster_cpu = self.cluster_cpu
        result.other_cpu = self.other_cpu
        result.cpus = {"client": affinity()}
        if self.cluster_pid is not None:
            result.cpus["cluster"] = affinity(self.cluster_pid)
        return result


def parse_args(client: str, workloads: tuple[str, ...], argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=f"{client} benchmark worker")
    parser.add_argument("workload", choices=workloads)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--nsqd", action="append", help="nsqd TCP address (repeatable)")
    where.add_argument("--lookupd", action="append", help="nsqlookupd HTTP URL (repeatable)")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", default="bench")
    parser.add_argument("--messages", type=int, required=True, help="measured messages")
    parser.add_argument("--warmup", type=int, default=1000, help="publish: unmeasured first")
    parser.add_argument("--concurrency", type=int, default=100, help="pub100: publishers")
    parser.add_argument("--batch", type=int, default=100, help="mpub100: messages per MPUB")
    parser.add_argument("--mpub-window", type=int, default=1, help="mpub100: MPUBs in flight")
    parser.add_argument("--max-in-flight", type=int, default=2500, help="consume")
    parser.add_argument(
        "--ordered", action="store_true", help="smartnsq consume: ordered=True (an ordered topic)"
    )
    parser.add_argument("--linger", type=float, help="smartnsq: auto-batching linger (s)")
    parser.add_argument("--max-batch", type=int, default=100, help="smartnsq: auto-batch size")
    parser.add_argument(
        "--handler",
        choices=("async", "plain"),
        default="async",
        help="consume: an async def handler, or a plain def (run in threads)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the worker's event loop (made here: the same for every smartnsq version)",
    )
    parser.add_argument(
        "--gc",
        choices=("default", "freeze"),
        default="default",
        help="freeze: gc.freeze() once started and warmed up (what exists then is never "
        "collected again)",
    )
    parser.add_argument(
        "--blocking",
        action="store_true",
        help="smartnsq pub1: publish through smartnsq.sync.Producer (blocking calls)",
    )
    parser.add_argument("--cluster-pid", type=int, help="read this process's CPU too")
    parser.add_argument("--cpu", type=int, help="pin this worker to this core")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (s)")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be >= 1")
    if args.workload == "mpub100" and args.messages % args.batch:
        parser.error(f"mpub100: --messages must be a multiple of --batch ({args.batch})")
    pin(args.cpu)
    return args


def run_loop(main: Any, loop: str) -> Any:
    """Run the coroutine ``main`` to completion on a new loop of the kind asked for."""
    import asyncio

    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def settle_gc(mode: str) -> None:
    """Once started and warmed up: with ``freeze``, collect once and move every object to
    the permanent generation."""
    if mode == "freeze":
        import gc

        gc.collect()
        gc.freeze()


def refuse_unsupported(args: Any, client: str, publisher: str) -> None:
    """pynsq and gnsq: no auto-batching, and their publishers take nsqd addresses only."""
    if args.linger is not None:
        raise SystemExit(f"{client} has no auto-batching (--linger)")
    if args.workload != "consume" and not args.nsqd:
        raise SystemExit(f"{client}'s {publisher} needs --nsqd")


def emit(result: Result) -> None:
    """The result as the last line of stdout."""
    sys.stdout.write(json.dumps(asdict(result)) + "\n")
    sys.stdout.flush()


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
