"""What a short-lived process pays (a CLI, a cron job, a serverless handler, a test): the
import, the first publish and the client's memory, each measured in a fresh process, in
shuffled rounds, this tree beside baseline trees (``--baseline DIR``, run with ``PYTHONPATH``
pointing there, as ``bench/compare``'s ``--baseline`` does).

Per variant:

* import: ``python -X importtime -c "import smartnsq; smartnsq.Producer"``, the sum of the
  imports an empty interpreter does not make, and the packages they come from; the wall
  and CPU time of ``python -c "import smartnsq; smartnsq.Producer"`` less those of
  ``python -c pass`` (measured in the same round);
* the first publish (``clients/startup_worker.py first``): ``async with Producer(...)`` and
  one keyed publish awaited until nsqd answers, through the nsqlookupd of an embedded youzan
  cluster (a topic of 4 partitions), and to a classic nsqd directly; the import, ``start()``
  and the publish, in milliseconds;
* RSS: after importing the Producer and the Consumer; a Consumer receiving a pre-filled topic
  (``--consume`` messages, max_in_flight 2500, youzan, 4 partitions): after its import, at
  the end and at its peak; a Producer publishing ``--publish`` messages 100 at a time: the
  same three.

Every process runs pinned to ``--client-cpu``, the two clusters (started once) to
``--cluster-cpu``; a run during which other processes kept more than ``--max-other-load``
cores busy is made again (``--retries``). Bytecode caches are written to a directory of the
run's own (whatever ``PYTHONDONTWRITEBYTECODE`` says), warmed before the first round, so
that no variant compiles its modules while measured. Medians over rounds with the lowest
and highest; ratios are medians of same-round ratios [lowest-highest].

Usage: python bench/startup.py [--baseline DIR ...] [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    BENCH,
    Cluster,
    exit_on_sigterm,
    log,
    median,
    prefill,
    spawn_cluster,
    wait_for_quiet,
)
from clients._worker import machine_busy

ROOT = BENCH.parent
WORKER = BENCH / "clients" / "startup_worker.py"
IMPORT = "import smartnsq; smartnsq.Producer"
TOPIC, CHANNEL, SINK = "bench", "bench", "sink"
PARTITIONS = 4
MIB = 1024 * 1024

# Where an import's time goes: the package an imported module belongs to, grouped.
GROUPS = {
    "smartnsq": "smartnsq",
    "asyncio": "asyncio",
    **dict.fromkeys(("httpx", "httpcore", "anyio", "h11", "idna", "certifi", "sniffio"), "httpx"),
    **dict.fromkeys(("opentelemetry", "typing_extensions", "importlib_metadata"), "otel"),
    "tenacity": "tenacity",
    **dict.fromkeys(("snappy", "cramjam"), "snappy"),
}
GROUP_ORDER = ("smartnsq", "asyncio", "httpx", "otel", "tenacity", "snappy", "other")


@dataclass(frozen=True)
class Variant:
    name: str
    tree: Path


@dataclass(frozen=True)
class Case:
    kind: str  # empty, importtime, import, first-youzan, first-classic, rss-*
    variant: Variant | None


@dataclass
class Setup:
    args: argparse.Namespace
    pycache: Path
    workdir: Path
    youzan: Cluster
    classic: Cluster
    empty_modules: frozenset[str]
    other_load: float = 0.0  # cores busy outside this run's processes during the last one


# --------------------------------------------------------------------------- processes


def environment(setup: Setup, variant: Variant | None) -> dict[str, str]:
    drop = ("PYTHONPATH", "SMARTNSQ_PURE", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("OTEL_")}
    env["PYTHONPYCACHEPREFIX"] = str(setup.pycache)
    if variant is not None:
        env["PYTHONPATH"] = str(variant.tree)
    return env


def run(
    setup: Setup, variant: Variant | None, argv: Sequence[str], timeout: float = 300.0
) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """``python argv`` in a fresh process pinned to the client core, from a directory where
    no smartnsq lies (``-c`` puts it first on the path); (result, wall s, CPU s)."""
    cpu = setup.args.client_cpu

    def pin() -> None:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    clusters = setup.youzan.cpu() + setup.classic.cpu()
    busy = machine_busy()
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=setup.workdir,
        env=environment(setup, variant),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=pin,
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    ours = cpu_s + setup.youzan.cpu() + setup.classic.cpu() - clusters
    setup.other_load = max(0.0, machine_busy() - busy - ours) / wall
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)[:80]} exited {done.returncode}: {done.stderr[-2000:]}")
    return done, wall, cpu_s


def worker(setup: Setup, variant: Variant, *argv: str) -> dict[str, Any]:
    done, _, _ = run(setup, variant, [str(WORKER), *argv])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


ImportTimes = list[tuple[int, str, int, int]]  # (depth, module, self µs, cumulative µs)


def parse_importtime(stderr: str) -> ImportTimes:
    found = []
    for line in stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if match:
            depth = (len(match.group(3)) - 1) // 2
            found.append((depth, match.group(4), int(match.group(1)), int(match.group(2))))
    return found


def group_of(module: str) -> str:
    return GROUPS.get(module.split(".")[0], "other")


# --------------------------------------------------------------------------- the cases


def measure(setup: Setup, case: Case) -> dict[str, Any]:
    variant = case.variant
    args = setup.args
    if case.kind == "empty":
        _, wall, cpu = run(setup, None, ["-c", "pass"])
        return {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000}
    assert variant is not None
    if case.kind == "import":
        _, wall, cpu = run(setup, variant, ["-c", IMPORT])
        return {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000}
    if case.kind == "importtime":
        done, _, _ = run(setup, variant, ["-X", "importtime", "-c", IMPORT])
        times = [t for t in parse_importtime(done.stderr) if t[1] not in setup.empty_modules]
        groups = dict.fromkeys(GROUP_ORDER, 0.0)
        for _, module, self_us, _ in times:
            groups[group_of(module)] += self_us / 1000
        total = sum(cum for depth, _, _, cum in times if depth == 0) / 1000
        return {"importtime_ms": total, "groups_ms": groups}
    youzan_lookupd = setup.youzan.lookupd[0]
    if case.kind == "first-youzan":
        return worker(setup, variant, "first", "lookupd", youzan_lookupd, TOPIC, "key-1")
    if case.kind == "first-classic":
        return worker(setup, variant, "first", "nsqd", setup.classic.nsqd(TOPIC)[0], TOPIC, "-")
    if case.kind == "rss-import":
        return worker(setup, variant, "rss-import")
    if case.kind == "rss-consume":
        asyncio.run(prefill(setup.youzan.info, TOPIC, args.consume))
        return worker(
            setup, variant, "rss-consume", youzan_lookupd, TOPIC, CHANNEL, str(args.consume), "2500"
        )
    if case.kind == "rss-publish":
        return worker(setup, variant, "rss-publish", youzan_lookupd, SINK, str(args.publish))
    raise ValueError(case.kind)


KINDS = ("import", "importtime", "first-youzan", "first-classic", "rss-import")
RSS_RUNS = ("rss-consume", "rss-publish")


def cases(variants: Sequence[Variant], with_rss_runs: bool) -> list[Case]:
    kinds = KINDS + (RSS_RUNS if with_rss_runs else ())
    return [Case("empty", None)] + [Case(kind, v) for kind in kinds for v in variants]


def warm(setup: Setup, variants: Sequence[Variant]) -> None:
    """Write every variant's bytecode caches (and the workers') before measuring."""
    for variant in variants:
        run(setup, variant, ["-c", IMPORT + "; smartnsq.Consumer"])
        worker(setup, variant, "first", "nsqd", setup.classic.nsqd(TOPIC)[0], TOPIC, "-")
        worker(setup, variant, "first", "lookupd", setup.youzan.lookupd[0], TOPIC, "key-1")


# --------------------------------------------------------------------------- the summary

# (case kind, field, label, unit divisor)
METRICS: tuple[tuple[str, str, str, float], ...] = (
    ("importtime", "importtime_ms", "import, -X importtime total (ms)", 1.0),
    ("import", "wall_ms", "import, wall less an empty interpreter (ms)", 1.0),
    ("import", "cpu_ms", "import, CPU less an empty interpreter (ms)", 1.0),
    ("first-youzan", "import_ms", "youzan: import in the worker (ms)", 1.0),
    ("first-youzan", "start_ms", "youzan: Producer(...) + start() (ms)", 1.0),
    ("first-youzan", "publish_ms", "youzan: first keyed publish (ms)", 1.0),
    ("first-youzan", "first_ms", "youzan: construction to first ack (ms)", 1.0),
    ("first-classic", "import_ms", "classic nsqd: import in the worker (ms)", 1.0),
    ("first-classic", "start_ms", "classic nsqd: Producer(...) + start() (ms)", 1.0),
    ("first-classic", "publish_ms", "classic nsqd: first publish (ms)", 1.0),
    ("first-classic", "first_ms", "classic nsqd: construction to first ack (ms)", 1.0),
    ("rss-import", "rss_before", "RSS before the import (MiB)", MIB),
    ("rss-import", "rss_after", "RSS after importing Producer and Consumer (MiB)", MIB),
    ("rss-consume", "rss_imported", "consumer: RSS after import (MiB)", MIB),
    ("rss-consume", "rss_end", "consumer: RSS at the end (MiB)", MIB),
    ("rss-consume", "rss_peak", "consumer: peak RSS (MiB)", MIB),
    ("rss-publish", "rss_imported", "producer: RSS after import (MiB)", MIB),
    ("rss-publish", "rss_end", "producer: RSS at the end (MiB)", MIB),
    ("rss-publish", "rss_peak", "producer: peak RSS (MiB)", MIB),
)


def value_of(run_: dict[str, Any], kind: str, field: str, empty: dict[int, dict[str, Any]]) -> Any:
    value = run_.get(field)
    if value is not None and kind == "import":  # less an empty interpreter, same round
        base = empty.get(run_["round"])
        value = None if base is None else value - base[field]
    return value


def summarize(runs: list[dict[str, Any]], variants: Sequence[Variant]) -> dict[str, Any]:
    empty = {r["round"]: r for r in runs if r["kind"] == "empty"}
    rows = []
    for kind, field, label, unit in METRICS:
        row: dict[str, Any] = {"metric": label, "values": {}, "ratios": {}}
        per_round: dict[str, dict[int, float]] = {}
        for variant in variants:
            mine = [r for r in runs if r["kind"] == kind and r["variant"] == variant.name]
            values = {r["round"]: value_of(r, kind, field, empty) for r in mine}
            values = {k: v / unit for k, v in values.items() if v is not None}
            per_round[variant.name] = values
            if values:
                row["values"][variant.name] = {
                    "median": median(list(values.values())),
                    "min": min(values.values()),
                    "max": max(values.values()),
                }
        this = per_round.get(variants[0].name, {})
        for other in variants[1:]:
            theirs = per_round.get(other.name, {})
            ratios = [this[n] / theirs[n] for n in sorted(this.keys() & theirs.keys()) if theirs[n]]
            if ratios:
                row["ratios"][other.name] = {
                    "median": median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                }
        if row["values"]:
            rows.append(row)
    groups = {}
    for variant in variants:
        mine = [r for r in runs if r["kind"] == "importtime" and r["variant"] == variant.name]
        groups[variant.name] = {
            group: median([r["groups_ms"][group] for r in mine]) for group in GROUP_ORDER
        }
    other = median([r["other_load"] for r in runs])
    return {"rows": rows, "import_groups_ms": groups, "other_load_median": other}


def print_summary(summary: dict[str, Any], variants: Sequence[Variant]) -> None:
    names = [v.name for v in variants]
    head = f"{'':<50}" + "".join(f"{name:>24}" for name in names)
    head += "".join(f"{names[0] + ' / ' + n:>26}" for n in names[1:])
    print(head)
    for row in summary["rows"]:
        line = f"{row['metric']:<50}"
        for name in names:
            v = row["values"].get(name)
            line += f"{_spread(v, '.1f'):>24}"
        for name in names[1:]:
            r = row["ratios"].get(name)
            line += f"{_spread(r, '.2f', 'x'):>26}"
        print(line)
    print()
    print(f"other load during the runs: {summary['other_load_median']:.2f} cores (median)")
    print()
    print("import, -X importtime self time by package (ms, medians):")
    print(f"{'':<12}" + "".join(f"{g:>10}" for g in GROUP_ORDER))
    for name, groups in summary["import_groups_ms"].items():
        print(f"{name:<12}" + "".join(f"{_fmt(groups[g], '.1f'):>10}" for g in GROUP_ORDER))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _spread(value: dict[str, float] | None, spec: str, suffix: str = "") -> str:
    if value is None:
        return "-"
    return (
        f"{format(value['median'], spec)}{suffix} "
        f"[{format(value['min'], spec)}-{format(value['max'], spec)}]"
    )


# --------------------------------------------------------------------------- main


def parse_baseline(text: str) -> Variant:
    name, sep, path = text.partition("=")
    tree = Path(path if sep else name).resolve()
    if not (tree / "smartnsq" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"{tree} holds no smartnsq package")
    return Variant(name if sep else "base", tree)


def empty_modules(setup: Setup) -> frozenset[str]:
    done, _, _ = run(setup, None, ["-X", "importtime", "-c", "pass"])
    return frozenset(module for _, module, _, _ in parse_importtime(done.stderr))


def run_rounds(setup: Setup, variants: Sequence[Variant]) -> list[dict[str, Any]]:
    args = setup.args
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    for round_ in range(1, args.rounds + 1):
        if args.quiet_patience > 0:
            wait_for_quiet(args.quiet_load, args.quiet_patience)
        order = cases(variants, not args.no_rss_runs)
        rng.shuffle(order)
        for case in order:
            name = case.variant.name if case.variant else "-"
            for attempt in range(1, args.retries + 2):
                result = measure(setup, case)
                other = setup.other_load
                if other <= args.max_other_load or attempt > args.retries:
                    break
                log(f"round {round_}: {case.kind} {name}: other load {other:.2f} cores; again")
            runs.append(
                {"round": round_, "kind": case.kind, "variant": name, "other_load": other, **result}
            )
            shown = {k: round(v, 2) for k, v in result.items() if isinstance(v, float)}
            log(f"round {round_}: {case.kind:<14} {name:<10} {shown} other load {other:.2f}")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline",
        action="append",
        type=parse_baseline,
        default=[],
        metavar="[NAME=]DIR",
        help="a tree holding another smartnsq (repeatable; NAME defaults to base)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--consume", type=int, default=20_000, help="messages consumed")
    parser.add_argument("--publish", type=int, default=20_000, help="messages published")
    parser.add_argument("--no-rss-runs", action="store_true", help="skip consume and publish")
    parser.add_argument("--cluster-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    parser.add_argument("--quiet-load", type=float, default=0.25)
    parser.add_argument("--quiet-patience", type=float, default=30.0)
    parser.add_argument(
        "--max-other-load",
        type=float,
        default=0.3,
        help="run again when other processes used more cores than this during a run",
    )
    parser.add_argument("--retries", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every run and the summary here")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    variants = [Variant("smartnsq", ROOT), *args.baseline]
    if len({v.name for v in variants}) != len(variants):
        parser.error("every --baseline needs a name of its own (NAME=DIR)")
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="smartnsq-startup-")))
        (scratch / "cwd").mkdir()
        youzan = stack.enter_context(
            spawn_cluster(
                topics=[f"{TOPIC}:{PARTITIONS}:1", f"{SINK}:{PARTITIONS}:1"],
                channels=[f"{TOPIC}:{CHANNEL}", f"{SINK}:{SINK}"],
                cpu=args.cluster_cpu,
            )
        )
        classic = stack.enter_context(
            spawn_cluster(
                classic=True, topics=[TOPIC], channels=[f"{TOPIC}:{CHANNEL}"], cpu=args.cluster_cpu
            )
        )
        setup = Setup(args, scratch / "pycache", scratch / "cwd", youzan, classic, frozenset())
        setup.empty_modules = empty_modules(setup)
        log("warming the bytecode caches")
        warm(setup, variants)
        runs = run_rounds(setup, variants)
    summary = summarize(runs, variants)
    print_summary(summary, variants)
    if args.json is not None:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        options["baseline"] = [f"{v.name}={v.tree}" for v in args.baseline]
        data = {"options": options, "summary": summary, "runs": runs}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
