"""Growth: what a consumer of many partitions costs, at 16, 256 and 1,024 partitions.

A consumer per topic, all started at once in one process (``clients/scale_worker.py``), on
topics of up to 128 partitions each (at least two topics), against a youzan ``smartnsq
cluster`` of one node in a child process (this tree's emulator, pinned to
``--cluster-cpu``; the worker to ``--client-cpu``). A fresh cluster per size and round;
in each round every variant runs, in an order that rotates from round to round:

* ``main``: the lookup answered, then every consumer started: the time until every
  partition has its subscription (and the CPU the client and the cluster spent meanwhile);
  the client's memory per connection (RSS after less before, idle, garbage collected); its
  CPU over ``--idle`` seconds with nothing to consume (heartbeats at nsqd's default 30 s);
  then every consumer paused (``set_max_in_flight(0)``), every partition filled with
  ``--messages`` 100-byte messages in all, and the time and client CPU until every message
  is finished with the budget (``--max-in-flight``, split over the topics) given back;
* ``heartbeats``: the same subscriptions asking for heartbeats every
  ``--fast-heartbeat`` seconds, idle for ``--fast-idle`` seconds: what a heartbeat costs;
* ``traced`` (Python only): the memory per connection under tracemalloc, and the
  allocation sites that grew most (``--top``), per connection.

Variants: this tree; ``--baseline DIR`` (another smartnsq tree, run with ``PYTHONPATH``
pointing there); ``--gopath DIR``: youzan's go-nsq (``go/scale_consumer.go``, built in
GOPATH mode against DIR, which holds ``github.com/youzan/go-nsq`` and its dependencies;
it connects each topic's partitions one after the other, and its lookup is inside its
subscribe time; its traced memory is the Go runtime's heap and stacks in use).

Medians over rounds [lowest-highest]; ratios are medians of same-round ratios. The machine
may be shared: before each run the bench waits (up to ``--quiet-patience`` s) for other
processes to calm down, and the wall times are the noisiest figures (the CPU ones less so).

Usage: python bench/scale.py [--sizes 16,256,1024] [--rounds 3] [--baseline DIR]
       [--gopath DIR] [--json out.json]
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BENCH,
    Cluster,
    die_with_parent,
    exit_on_sigterm,
    log,
    prefill,
    spawn_cluster,
    wait_for_quiet,
    worker_env,
)

ROOT = BENCH.parent
WORKER = BENCH / "clients" / "scale_worker.py"
GO_SOURCE = BENCH / "go" / "scale_consumer.go"
CHANNEL = "scale"
WARMUP = "warmup"  # a topic the Python workers subscribe to and leave before measuring
PER_TOPIC = 128  # partitions per topic at most (youzan allows 254)
KIB = 1024


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path | None = None  # a smartnsq tree (PYTHONPATH); None: the Go consumer
    binary: Path | None = None

    @property
    def python(self) -> bool:
        return self.tree is not None


def layout(partitions: int) -> list[tuple[str, int]]:
    """(topic, partitions) for ``partitions`` in all: at least two topics."""
    topics = max(2, -(-partitions // PER_TOPIC))
    if partitions % topics:
        raise ValueError(f"{partitions} partitions do not split evenly over {topics} topics")
    return [(f"scale{i}", partitions // topics) for i in range(topics)]


# --------------------------------------------------------------------------- one run


def run(
    variant: Variant,
    cluster: Cluster,
    topics: list[tuple[str, int]],
    args: argparse.Namespace,
    *,
    mode: str,
) -> dict[str, Any]:
    """One worker run (``main``, ``heartbeats`` or ``traced``); its JSON result."""
    expected = sum(n for _, n in topics)
    messages = args.messages if mode == "main" else 0
    idle = {"main": args.idle, "heartbeats": args.fast_idle, "traced": 0.0}[mode]
    heartbeat = args.fast_heartbeat if mode == "heartbeats" else 30.0
    lookupd = cluster.lookupd[0]
    if variant.python:
        argv = [sys.executable, str(WORKER), f"--lookupd={lookupd}"]
        argv += [f"--topic={name}" for name, _ in topics]
        argv += [f"--warmup-topic={WARMUP}"]
        argv += ["--tracemalloc", f"--top={args.top}"] if mode == "traced" else []
        if args.client_cpu is not None:
            argv.append(f"--cpu={args.client_cpu}")
        env = worker_env({"PYTHONPATH": str(variant.tree)})
    else:
        argv = [
            str(variant.binary),
            f"-lookupd={lookupd.removeprefix('http://')}",
            f"-topics={','.join(name for name, _ in topics)}",
            f"-connections={expected}",
        ]
        if args.client_cpu is not None:
            argv = ["taskset", "-c", str(args.client_cpu), *argv]
        env = worker_env({})
    common = {
        "channel": CHANNEL,
        "max-in-flight": args.max_in_flight,
        "heartbeat-interval": heartbeat,
        "idle": idle,
        "messages": messages,
        "cluster-pid": cluster.pid,
        "timeout": args.timeout,
    }
    dash = "--" if variant.python else "-"
    argv += [f"{dash}{key}={value}" for key, value in common.items()]
    if args.quiet_patience > 0:
        wait_for_quiet(args.quiet_load, args.quiet_patience)
    child = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=die_with_parent(),
    )
    if child.stdin is None or child.stdout is None or child.stderr is None:
        raise RuntimeError("no pipes")
    last = ""
    for line in child.stdout:
        last = line.strip()
        if last == "paused":
            asyncio.run(_fill(cluster, topics, messages))
            child.stdin.write("go\n")
            child.stdin.flush()
    errors = child.stderr.read()
    if child.wait() != 0 or not last.startswith("{"):
        raise RuntimeError(f"{variant.name} {mode} failed ({child.returncode}): {errors[-3000:]}")
    result: dict[str, Any] = json.loads(last)
    result["mode"] = mode
    return result


async def _fill(cluster: Cluster, topics: list[tuple[str, int]], messages: int) -> None:
    """``messages`` spread over every partition of every topic (raw MPUB)."""
    total = sum(n for _, n in topics)
    await asyncio.gather(
        *(prefill(cluster.info, name, messages * n // total) for name, n in topics)
    )


# --------------------------------------------------------------------------- rounds


def measure(
    variants: list[Variant], sizes: Sequence[int], args: argparse.Namespace
) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """{size: {variant: [every run's result, with its round]}}."""
    results: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for size in sizes:
        topics = layout(size)
        runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        results[size] = runs
        for round_ in range(args.rounds):
            names = [WARMUP] + [name for name, _ in topics]
            with spawn_cluster(
                topics=[f"{WARMUP}:1:1"] + [f"{name}:{n}:1" for name, n in topics],
                channels=[f"{name}:{CHANNEL}" for name in names],
                cpu=args.cluster_cpu,
                env={"PYTHONPATH": str(ROOT)},
            ) as cluster:
                order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
                for variant in order:
                    modes = ["main", "heartbeats"] + (["traced"] if variant.python else [])
                    for mode in modes:
                        result = run(variant, cluster, topics, args, mode=mode)
                        result["round"] = round_
                        runs[variant.name].append(result)
                        log(
                            f"{size} partitions, round {round_}, {variant.name} {mode}: "
                            + _brief(result)
                        )
    return results


def _brief(result: dict[str, Any]) -> str:
    text = f"subscribed in {result['subscribe_s']:.3f} s"
    text += f", {result['rss_per_connection'] / KIB:.1f} KiB RSS/conn"
    if "traced_per_connection" in result:
        text += f", {result['traced_per_connection'] / KIB:.1f} KiB traced/conn"
    if "idle_cpu" in result:
        text += f", idle {100 * result['idle_cpu']:.3f}% CPU"
    if result.get("messages"):
        text += f", {result['messages'] / result['traffic_s']:,.0f} msgs/s"
    return text


# --------------------------------------------------------------------------- report

Getter = Callable[[dict[str, Any]], float | None]


def _get(key: str, scale: float = 1.0) -> Getter:
    def get(result: dict[str, Any]) -> float | None:
        value = result.get(key)
        return None if value is None else float(value) * scale

    return get


def _rate(result: dict[str, Any]) -> float | None:
    return result["messages"] / result["traffic_s"] if result.get("messages") else None


def _cpu_per_message(result: dict[str, Any]) -> float | None:
    if not result.get("messages"):
        return None
    return float(result["traffic_cpu_s"] * 1e6 / result["messages"])


# (label, the runs it is read from, how, format)
METRICS: list[tuple[str, tuple[str, ...], Getter, str]] = [
    ("memory per connection, RSS (KiB)", ("main",), _get("rss_per_connection", 1 / KIB), ".1f"),
    (
        # Python: under tracemalloc, in a run of its own; Go: the runtime's heap and stacks
        "memory per connection, traced (KiB)",
        ("traced", "main"),
        _get("traced_per_connection", 1 / KIB),
        ".1f",
    ),
    ("subscribe, lookup to all (s)", ("main", "heartbeats"), _get("subscribe_s"), ".3f"),
    ("subscribe, client CPU (s)", ("main", "heartbeats"), _get("subscribe_cpu_s"), ".3f"),
    ("subscribe, cluster CPU (s)", ("main", "heartbeats"), _get("subscribe_cluster_cpu_s"), ".2f"),
    ("idle CPU, heartbeats 30 s (% core)", ("main",), _get("idle_cpu", 100), ".3f"),
    ("idle CPU, fast heartbeats (% core)", ("heartbeats",), _get("idle_cpu", 100), ".3f"),
    ("throughput, all partitions (msgs/s)", ("main",), _rate, ",.0f"),
    ("client CPU per message (µs)", ("main",), _cpu_per_message, ".1f"),
]


def _values(runs: list[dict[str, Any]], modes: tuple[str, ...], get: Getter) -> dict[int, float]:
    """{round: the median of the round's values} (a round may have several runs)."""
    by_round: dict[int, list[float]] = {}
    for result in runs:
        if result["mode"] in modes and (value := get(result)) is not None:
            by_round.setdefault(result["round"], []).append(value)
    return {r: statistics.median(v) for r, v in by_round.items()}


def _cell(values: dict[int, float], spec: str) -> str:
    if not values:
        return "-"
    ordered = sorted(values.values())
    median = statistics.median(ordered)
    if len(ordered) == 1:
        return f"{median:{spec}}"
    return f"{median:{spec}} [{ordered[0]:{spec}}-{ordered[-1]:{spec}}]"


def _ratio(mine: dict[int, float], theirs: dict[int, float]) -> str:
    ratios = [mine[r] / theirs[r] for r in mine if theirs.get(r)]
    if not ratios:
        return "-"
    text = f"{statistics.median(ratios):.2f}x"
    return text if len(ratios) == 1 else f"{text} [{min(ratios):.2f}-{max(ratios):.2f}]"


def report(
    results: dict[int, dict[str, list[dict[str, Any]]]], variants: list[Variant]
) -> list[str]:
    """The table in Markdown: per size and metric, each variant, and this tree's ratio to
    each other variant (same-round)."""
    mine, others = variants[0].name, [v.name for v in variants[1:]]
    head = ["partitions", "metric", *[v.name for v in variants]]
    head += [f"{mine} / {other}" for other in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size, runs in results.items():
        for label, modes, get, spec in METRICS:
            values = {name: _values(runs[name], modes, get) for name in runs}
            if not any(values.values()):
                continue
            row = [f"{size:,}", label, *[_cell(values[v.name], spec) for v in variants]]
            row += [_ratio(values[mine], values[other]) for other in others]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def top_sites(results: dict[int, dict[str, list[dict[str, Any]]]], name: str) -> list[str]:
    """The allocation sites that grew most per connection (the largest size, last round)."""
    size = max(results)
    traced = [r for r in results[size][name] if r["mode"] == "traced"]
    if not traced:
        return []
    lines = [f"{name}: allocation sites per connection at {size:,} partitions (tracemalloc)"]
    for site in traced[-1].get("top_sites", []):
        path = site["site"].replace(str(ROOT) + "/", "")
        lines.append(
            f"  {site['bytes_per_connection']:8.0f} B {site['blocks_per_connection']:5.1f} "
            f"blocks  {path}"
        )
    return lines


# --------------------------------------------------------------------------- main


def build_go(gopath: Path, into: Path) -> Path:
    """``go/scale_consumer.go`` built against ``gopath`` (GOPATH mode, no module proxy)."""
    binary = into / "scale_consumer"
    env = dict(os.environ, GOPATH=str(gopath), GO111MODULE="off", GOFLAGS="")
    subprocess.run(
        ["go", "build", "-o", str(binary), str(GO_SOURCE)], check=True, env=env, cwd=into
    )
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="16,256,1024", help="partitions, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another smartnsq tree to run beside")
    parser.add_argument("--gopath", type=Path, help="a GOPATH holding youzan's go-nsq")
    parser.add_argument("--idle", type=float, default=30.0, help="s of idle CPU measured")
    parser.add_argument("--fast-heartbeat", type=float, default=1.0, help="s between them")
    parser.add_argument("--fast-idle", type=float, default=10.0, help="s idle with them")
    parser.add_argument("--messages", type=int, default=100_000, help="traffic, in all")
    parser.add_argument("--max-in-flight", type=int, default=2500, help="split over topics")
    parser.add_argument("--top", type=int, default=15, help="allocation sites shown")
    parser.add_argument("--cluster-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--quiet-load", type=float, default=0.25)
    parser.add_argument("--quiet-patience", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="also write every run's result here")
    args = parser.parse_args()
    exit_on_sigterm()
    sizes = [int(s) for s in args.sizes.split(",")]
    for size in sizes:
        layout(size)  # refused before anything starts
    variants = [Variant("smartnsq", tree=ROOT)]
    if args.baseline is not None:
        variants.append(Variant("baseline", tree=args.baseline.resolve()))
    with tempfile.TemporaryDirectory(prefix="smartnsq-scale-") as tmp:
        if args.gopath is not None:
            variants.append(Variant("go-nsq", binary=build_go(args.gopath.resolve(), Path(tmp))))
        results = measure(variants, sizes, args)
    print(
        f"consumers of {args.sizes} partitions (topics of up to {PER_TOPIC}), youzan emulator "
        f"of one node; idle {args.idle:g} s (heartbeats every 30 s) and {args.fast_idle:g} s "
        f"(every {args.fast_heartbeat:g} s); {args.messages:,} messages of 100 B, "
        f"max_in_flight {args.max_in_flight} in all; medians of {args.rounds} rounds "
        "[lowest-highest]"
    )
    print("\n".join(report(results, variants)))
    for variant in variants:
        if variant.python:
            print("\n".join(top_sites(results, variant.name)))
    if args.json:
        data = {
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": {str(size): runs for size, runs in results.items()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
