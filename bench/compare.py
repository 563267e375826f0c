"""Side-by-side comparison of smartnsq, pynsq and gnsq against the embedded cluster.

Run it through ``bench/compare`` (it prepares ``bench/.env`` with pynsq and gnsq from PyPI and
this repository). Method, per round (default 5), in an order of (workload, client) shuffled
each round:

1. a fresh ``smartnsq cluster`` (classic nsqd; youzan with 4 partitions for the smartnsq
   youzan rows) in a child process pinned to core 0 (``--cluster-cpu``);
2. for consume: the topic pre-filled with raw MPUB (no client code);
3. the client's worker (``clients/<client>_worker.py``) in its own process pinned to core 1
   (``--client-cpu``), where it connects, warms up (publish) and measures one phase: wall
   time, its CPU (getrusage) and the cluster's CPU (/proc), read at the same instants, plus
   the machine's other load in that time (/proc/stat);
4. the cluster is stopped (a fresh one per run: the emulator keeps every message).

100-byte bodies. Workloads: consume (pre-filled topic, max_in_flight 2500, FIN each),
pub1 (sequential PUB, one in flight; latency of each), pub100 (100 concurrent publishers
sharing one producer), mpub100 (batches of 100, ``--mpub-window`` in flight); smartnsq also
pub1 through its blocking ``smartnsq.sync.Producer`` (pub1-blocking: beside gnsq's blocking
publish and its own async pub1 of the same round), pub100 with auto-batching (``linger``)
and the youzan rows, among them ordered consumption (``consume-ordered-youzan4``: an ordered
topic of 4 partitions, ``ordered=True``, one message at a time per partition,
``--consume-ordered`` messages).

smartnsq runs in *variants*, each a row of its own: ``smartnsq`` (this tree, asyncio's
loop, the compiled hot path where it is built), ``+uvloop`` (the worker on uvloop),
``/pure`` (``SMARTNSQ_PURE=1``: the pure-Python modules even where compiled ones are built),
and ``base`` (another tree, e.g. ``git archive main | tar -x -C /tmp/base``, given with
``--baseline``: the worker runs with ``PYTHONPATH`` pointing there), in any combination
(``base+uvloop``, ``smartnsq/pure+uvloop``). The cluster is the same for every variant: this
tree, asyncio's loop. ``--variants all`` runs every combination.

Other clients beside pynsq and gnsq (``--clients``), each compared with the smartnsq rows of
the same workload (msgs/s and client CPU per message):

- ``raw`` and ``raw+uvloop``: the raw asyncio ceiling (``clients/raw_worker.py``), a minimal
  ``asyncio.Protocol`` that reads each message frame and writes its FIN (consume, the youzan
  rows, ordered too) or writes a PUB and awaits its OK (pub1), on asyncio's loop or uvloop:
  a smartnsq variant is compared with the one on its loop, its client CPU over the
  ceiling's being what smartnsq itself costs per message (issue 35: within 1.3x);
- ``go-nsq`` and ``youzan-go-nsq``: Go workers (``bench/go``, built from a GOPATH by
  ``bench/go/build.sh``; skipped with a message when not built): synchronous ``Publish``
  (pub1, also beside smartnsq's blocking publish; pub100 from 100 goroutines),
  ``MultiPublish`` (mpub100), a consumer (ordered with ``EnableOrdered`` on youzan).

The table shows medians over rounds; the ratios are medians of same-round ratios, with the
lowest and highest of them (the spread).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from _common import (
    GO_CLIENTS,
    GO_MISSING,
    ROOT,
    Conditions,
    Job,
    WorkerError,
    describe,
    exit_on_sigterm,
    go_worker,
    log,
    measure,
    median,
    other_load,
    parallel_cores,
    per_message,
    pin,
    rate,
)

CLIENTS = ("smartnsq", "pynsq", "gnsq")
PYTHON_OTHERS = CLIENTS[1:]  # the default other clients
# The raw asyncio ceiling (clients/raw_worker.py: a frame read, its FIN or OK written, no
# client library) on each loop, and the Go clients (bench/go, built by bench/go/build.sh).
CEILINGS = ("raw", "raw+uvloop")
OTHERS = (*PYTHON_OTHERS, *CEILINGS, *GO_CLIENTS)
# The workloads each of the non-default others runs (pynsq and gnsq: the classic four).
OWN_WORKLOADS = {
    "raw": ("consume", "consume-youzan4", "consume-ordered-youzan4", "pub1"),
    "go-nsq": ("consume", "pub1", "pub100", "mpub100"),
    "youzan-go-nsq": (
        "consume-youzan4",
        "consume-ordered-youzan4",
        "pub1-youzan4",
        "pub100-youzan4",
        "mpub100-youzan4",
    ),
}
OWN_WORKLOADS["raw+uvloop"] = OWN_WORKLOADS["raw"]
YOUZAN_PARTITIONS = 4


@dataclass(frozen=True)
class Variant:
    """How a smartnsq worker runs: which tree, which loop, which build."""

    name: str  # smartnsq, smartnsq+uvloop, smartnsq/pure, base, base/pure+uvloop+gc ...
    base: bool
    pure: bool
    uvloop: bool
    gc: bool = False  # gc.freeze() once warmed up

    @classmethod
    def parse(cls, name: str) -> Variant:
        head, *extras = name.split("+")
        tree, slash, build = head.partition("/")
        if tree not in ("smartnsq", "base") or (slash and build != "pure"):
            raise ValueError(name)
        if set(extras) - {"uvloop", "gc"} or len(set(extras)) != len(extras):
            raise ValueError(name)
        return cls(name, tree == "base", bool(slash), "uvloop" in extras, "gc" in extras)

    def env(self, baseline: Path | None) -> tuple[tuple[str, str], ...]:
        env = []
        if self.base:
            if baseline is None:
                raise ValueError(f"variant {self.name} needs --baseline")
            env.append(("PYTHONPATH", str(baseline)))
        else:  # this tree by path: the interpreter's install may be another checkout's
            env.append(("PYTHONPATH", str(ROOT)))
        if self.pure:
            env.append(("SMARTNSQ_PURE", "1"))
        return tuple(env)


ALL_VARIANTS = tuple(
    f"{tree}{build}{loop}"
    for tree in ("smartnsq", "base")
    for build in ("", "/pure")
    for loop in ("", "+uvloop")
)


@dataclass(frozen=True)
class Case:
    """One row of the table: a workload label, a client, and how its worker runs."""

    workload: str  # label in the table
    client: str
    mode: str  # worker workload: consume, pub1, pub100, mpub100
    youzan: bool = False
    linger: float | None = None
    max_batch: int = 50
    handler: str = "async"
    blocking: bool = False  # through smartnsq.sync.Producer
    ordered: bool = False

    @property
    def base(self) -> str:
        """The workload the other clients ran that this row is compared to."""
        return BASES.get(self.workload, self.workload)


BASES = {
    "pub1-blocking": "pub1",
    "pub100-batched": "pub100",
    "consume-youzan4": "consume",
    "pub1-youzan4": "pub1",
    "pub100-youzan4": "pub100",
    "mpub100-youzan4": "mpub100",
    "consume-plain": "consume",
}
WORKLOADS = (
    "consume",
    "consume-plain",
    "pub1",
    "pub1-blocking",
    "pub100",
    "pub100-batched",
    "mpub100",
    "consume-youzan4",
    "pub1-youzan4",
    "pub100-youzan4",
    "mpub100-youzan4",
    "consume-ordered-youzan4",
)


def cases(linger: float, max_batch: int, variants: Sequence[str]) -> list[Case]:
    found = []
    for mode in ("consume", "pub1", "pub100", "mpub100"):
        found += [Case(mode, client, mode) for client in (*variants, *PYTHON_OTHERS)]
    for client, workloads in OWN_WORKLOADS.items():
        for workload in workloads:
            mode = workload.split("-")[0]
            youzan, ordered = "youzan" in workload, "ordered" in workload
            found.append(Case(workload, client, mode, youzan=youzan, ordered=ordered))
    for variant in variants:
        found.append(Case("consume-plain", variant, "consume", handler="plain"))
        found.append(Case("pub1-blocking", variant, "pub1", blocking=True))
        found.append(Case("pub100-batched", variant, "pub100", linger=linger, max_batch=max_batch))
        found.append(Case("consume-youzan4", variant, "consume", youzan=True))
        found.append(Case("pub1-youzan4", variant, "pub1", youzan=True))
        found.append(Case("pub100-youzan4", variant, "pub100", youzan=True))
        found.append(Case("mpub100-youzan4", variant, "mpub100", youzan=True))
        found.append(Case("consume-ordered-youzan4", variant, "consume", youzan=True, ordered=True))
    return found


def is_smartnsq(client: str) -> bool:
    return client not in OTHERS


def references_of(case: Case, present: set[str]) -> list[tuple[str, str]]:
    """What another client's rows a smartnsq row is compared with: (client, workload)."""
    found = [(other, case.base) for other in PYTHON_OTHERS if other in present]
    variant = Variant.parse(case.client)
    # the ceiling on the same loop, same workload (the blocking publish has no loop)
    ceiling = "raw+uvloop" if variant.uvloop else "raw"
    if ceiling in present and case.workload in OWN_WORKLOADS[ceiling]:
        found.append((ceiling, case.workload))
    for go in GO_CLIENTS:
        if go in present:
            workload = BLOCKING_GO.get(case.workload, case.workload)
            if workload in OWN_WORKLOADS[go]:
                found.append((go, workload))
    return found


# go-nsq's Publish is synchronous: smartnsq's blocking publish is compared with it too
BLOCKING_GO = {"pub1-blocking": "pub1"}


# A target's reference: the same variant's run of the workload's base (its async twin).
SAME_VARIANT = "the same variant"


@dataclass(frozen=True)
class Target:
    text: str
    workload: str
    kind: str  # "ratio" (>=), "latency" (p50 ratio <=), "cpu" (µs/msg <=)
    limit: float
    against: str = "pynsq"


TARGETS = (
    Target("consume >= 6x pynsq", "consume", "ratio", 6.0),
    Target("consume: client CPU <= 2 µs/msg (issue 23)", "consume", "cpu", 2.0),
    Target("plain-function handler: client CPU <= 8 µs/msg", "consume-plain", "cpu", 8.0),
    Target("sequential PUB: client CPU <= 25 µs/msg", "pub1", "cpu", 25.0),
    Target("sequential PUB: p99 <= 2x p50", "pub1", "tail", 2.0),
    Target("MPUB of 100: client CPU <= 0.5 µs/msg", "mpub100", "cpu", 0.5),
    Target("PUB, 100 in flight >= 2.9x pynsq", "pub100", "ratio", 2.9),
    Target("PUB, 100 in flight, auto-batching >= 5x pynsq", "pub100-batched", "ratio", 5.0),
    Target("sequential PUB latency p50 <= 0.85x pynsq", "pub1", "latency", 0.85),
    Target(
        "blocking sequential PUB >= 0.9x the async one (issue 29)",
        "pub1-blocking",
        "ratio",
        0.9,
        against=SAME_VARIANT,
    ),
)


# --------------------------------------------------------------------------- running


def counts(args: argparse.Namespace, case: Case) -> dict[str, int]:
    if case.ordered:
        return {"consume": args.consume_ordered}
    return {
        "consume": args.consume,
        "pub1": args.pub1,
        "pub100": args.pub100,
        "mpub100": args.mpub100,
    }


def run_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    program, loop = case.client, "asyncio"
    env: tuple[tuple[str, str], ...] = ()
    if is_smartnsq(case.client):
        variant = Variant.parse(case.client)
        program, env = "smartnsq", variant.env(args.baseline)
        loop = "uvloop" if variant.uvloop else "asyncio"
    elif case.client in CEILINGS:
        program, _, uvloop = case.client.partition("+")
        loop = uvloop or "asyncio"
    job = Job(
        program,
        case.mode,
        counts(args, case)[case.mode],
        youzan=case.youzan,
        partitions=YOUZAN_PARTITIONS,
        linger=case.linger,
        max_batch=case.max_batch,
        warmup=args.warmup,
        mpub_window=args.mpub_window,
        handler=case.handler,
        ordered=case.ordered,
        loop=loop,
        gc="freeze" if is_smartnsq(case.client) and Variant.parse(case.client).gc else "default",
        blocking=case.blocking,
        env=env,
    )
    return measure(job, Conditions.from_args(args), log)


def run_all(
    args: argparse.Namespace, selected: list[Case]
) -> tuple[list[dict[str, Any]], list[float]]:
    """Every run (with its round) and, per round, the cores the machine delivered."""
    rng = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    probes: list[float] = []
    for round_ in range(1, args.rounds + 1):
        cores = parallel_cores((args.cluster_cpu, args.client_cpu))
        if cores is not None:
            probes.append(cores)
            log(f"round {round_}: two busy pinned loops got {cores:.2f} cores")
        order = selected[:]
        rng.shuffle(order)
        for case in order:
            record: dict[str, Any] = {
                "round": round_,
                "workload": case.workload,
                "client": case.client,
            }
            started = time.perf_counter()
            try:
                result = run_case(case, args)
            except (WorkerError, RuntimeError) as exc:
                record["error"] = str(exc)
                log(f"round {round_}: {case.workload:<23} {case.client:<22} FAILED: {exc}")
            else:
                record.update(result)
                record["workload"] = case.workload
                record["client"] = case.client  # the variant, not the worker's name
                log(f"round {round_}: {case.workload:<23} {case.client:<22} {describe(record)}")
            record["run_seconds"] = time.perf_counter() - started
            runs.append(record)
    return runs, probes


# --------------------------------------------------------------------------- summary


def summarize(runs: list[dict[str, Any]], selected: list[Case]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    rows = []
    for case in selected:
        mine = [r for r in ok if r["workload"] == case.workload and r["client"] == case.client]
        failed = sum(
            1
            for r in runs
            if "error" in r and r["workload"] == case.workload and r["client"] == case.client
        )
        row: dict[str, Any] = {"workload": case.workload, "client": case.client, "runs": len(mine)}
        row["failed"] = failed
        if mine:
            rates = [rate(r) for r in mine]
            row["msgs_per_s"] = median(rates)
            row["msgs_per_s_min"], row["msgs_per_s_max"] = min(rates), max(rates)
            row["client_us_per_msg"] = median([per_message(r, "cpu") for r in mine])
            row["client_sys_us_per_msg"] = median([per_message(r, "cpu_system") for r in mine])
            row["cluster_us_per_msg"] = median([per_message(r, "cluster_cpu") for r in mine])
            row["other_load"] = median([other_load(r) for r in mine])
            if any(r.get("latency_us") for r in mine):
                row["p50_us"] = median([r["latency_us"].get("p50") for r in mine])
                row["p99_us"] = median([r["latency_us"].get("p99") for r in mine])
                row["p99_over_p50"] = median(
                    [
                        r["latency_us"]["p99"] / r["latency_us"]["p50"]
                        for r in mine
                        if r.get("latency_us")
                    ]
                )
            row["version"] = mine[0].get("version")
        rows.append(row)
    ratios = []
    present = {case.client for case in selected}
    for case in selected:
        if not is_smartnsq(case.client):
            continue
        references = references_of(case, present)
        # the same workload against the other smartnsq variants it differs from by one lever
        references += [
            (other, case.workload)
            for other in reference_variants(case.client)
            if other in present and other != case.client
        ]
        if case.blocking:  # against the same variant's async publish, too
            references.append((case.client, case.base))
        for other, base in references:
            for metric, ratio in METRICS:
                latency = metric in ("p50", "p99")
                if latency and case.mode != "pub1":
                    continue
                if other in PYTHON_OTHERS and metric not in ("msgs/s", "p50"):
                    continue
                per_round = same_round(ok, case.client, case.workload, other, base, ratio)
                if per_round:
                    ratios.append(
                        {
                            "workload": case.workload,
                            "client": case.client,
                            "against": other,
                            "metric": metric,
                            "ratio": median(per_round),
                            "min": min(per_round),
                            "max": max(per_round),
                            "rounds": len(per_round),
                        }
                    )
    return {"rows": rows, "ratios": ratios, "targets": check_targets(rows, ratios)}


def reference_variants(name: str) -> list[str]:
    """What a variant is compared with: the base tree run the same way (before/after), and
    the same tree without uvloop, and compiled rather than pure (one lever each)."""
    variant = Variant.parse(name)
    found = []
    if not variant.base:
        found.append(name.replace("smartnsq", "base", 1))
    if variant.uvloop:
        found.append(name.replace("+uvloop", ""))
    if variant.gc:
        found.append(name.replace("+gc", ""))
    if variant.pure:
        found.append(name.replace("/pure", ""))
    return found


def _cpu(run: dict[str, Any]) -> float:
    return float(per_message(run, "cpu") or 0.0)


METRICS: tuple[tuple[str, Callable[[dict[str, Any], dict[str, Any]], float]], ...] = (
    ("msgs/s", lambda a, b: rate(a) / rate(b)),
    ("client CPU", lambda a, b: _cpu(a) / _cpu(b)),
    ("p50", lambda a, b: a["latency_us"]["p50"] / b["latency_us"]["p50"]),
    ("p99", lambda a, b: a["latency_us"]["p99"] / b["latency_us"]["p99"]),
)


def same_round(
    runs: list[dict[str, Any]],
    client: str,
    workload: str,
    other: str,
    base: str,
    ratio: Callable[[dict[str, Any], dict[str, Any]], float],
) -> list[float]:
    mine = {r["round"]: r for r in runs if r["workload"] == workload and r["client"] == client}
    theirs = {r["round"]: r for r in runs if r["workload"] == base and r["client"] == other}
    return [ratio(mine[n], theirs[n]) for n in sorted(mine.keys() & theirs.keys())]


def check_targets(rows: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target, for every smartnsq variant measured."""
    checked = []
    variants = sorted({row["client"] for row in rows if is_smartnsq(row["client"])})
    for variant in variants:
        for target in TARGETS:
            value: float | None = None
            if target.kind in ("cpu", "tail"):
                key = "client_us_per_msg" if target.kind == "cpu" else "p99_over_p50"
                for row in rows:
                    if row["workload"] == target.workload and row["client"] == variant:
                        value = row.get(key)
            else:
                metric = "p50" if target.kind == "latency" else "msgs/s"
                against = variant if target.against == SAME_VARIANT else target.against
                for ratio in ratios:
                    if (ratio["workload"], ratio["client"], ratio["against"], ratio["metric"]) == (
                        target.workload,
                        variant,
                        against,
                        metric,
                    ):
                        value = ratio["ratio"]
            if value is None:
                continue
            met = value >= target.limit if target.kind == "ratio" else value <= target.limit
            checked.append(
                {
                    "target": target.text,
                    "client": variant,
                    "value": value,
                    "met": met,
                    "kind": target.kind,
                }
            )
    return checked


def _num(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def report(summary: dict[str, Any], args: argparse.Namespace, env: dict[str, Any]) -> str:
    lines = [
        f"smartnsq {env['versions']['smartnsq']} / pynsq {env['versions']['pynsq']} / "
        f"gnsq {env['versions']['gnsq']} (tornado {env['versions']['tornado']}, "
        f"gevent {env['versions']['gevent']}); Python {env['python']}; {env['cpus']} cores",
        f"cluster (embedded, fresh per run) pinned to core {args.cluster_cpu}, each client "
        f"worker in its own process pinned to core {args.client_cpu}; 100-byte bodies; "
        f"{args.rounds} round(s), order shuffled per round (seed {args.seed})",
        f"messages per run: consume {args.consume:,} (pre-filled, max_in_flight 2500; ordered "
        f"{args.consume_ordered:,}), pub1 "
        f"{args.pub1:,}, pub100 {args.pub100:,} (100 publishers), mpub100 {args.mpub100:,} "
        f"(batches of 100, {args.mpub_window} in flight); warm-up {args.warmup:,} (publish); "
        f"pub100-batched: Producer(linger={args.linger}, max_batch={args.max_batch})",
        "",
        parallel_line(summary.get("parallel_cores") or []),
        "msgs/s: median (min-max spread as +-% of it); CPU in µs per message: the client's "
        "(of which in the kernel), the cluster's; other load: CPU other processes used while "
        "measuring (% of one core)",
        "",
        f"{'workload':<24}{'client':<22}{'msgs/s':>10}{'+-%':>5}{'client µs/msg':>15}"
        f"{'(sys)':>7}{'cluster µs/msg':>16}{'other load':>12}{'p50 µs':>9}{'p99 µs':>9}"
        f"{'runs':>6}",
    ]
    for row in summary["rows"]:
        other = row.get("other_load")
        spread = None
        if row.get("msgs_per_s"):
            spread = 50 * (row["msgs_per_s_max"] - row["msgs_per_s_min"]) / row["msgs_per_s"]
        lines.append(
            f"{row['workload']:<24}{row['client']:<22}"
            f"{_num(row.get('msgs_per_s'), ',.0f', 10)}{_num(spread, '.0f', 5)}"
            f"{_num(row.get('client_us_per_msg'), '.2f', 15)}"
            f"{_num(row.get('client_sys_us_per_msg'), '.1f', 7)}"
            f"{_num(row.get('cluster_us_per_msg'), '.2f', 16)}"
            f"{_num(None if other is None else 100 * other, '.0f', 11)}%"
            f"{_num(row.get('p50_us'), '.0f', 9)}{_num(row.get('p99_us'), '.0f', 9)}"
            f"{row['runs']:>6}" + (f"  ({row['failed']} failed)" if row["failed"] else "")
        )
    unpinned = summary.get("unpinned_runs", 0)
    if unpinned:
        lines.append(f"WARNING: {unpinned} run(s) did not run on the cores asked for (see JSON)")
    lines += [
        "",
        "same-round ratios: median over rounds [lowest-highest]; msgs/s: higher is better; "
        "client CPU per message and latency: lower is better",
        f"{'workload':<24}{'client':<22}{'against':<22}{'metric':<12}{'ratio':>8}"
        f"{'spread':>16}{'rounds':>8}",
    ]
    for ratio in summary["ratios"]:
        spread = f"[{ratio['min']:.2f}-{ratio['max']:.2f}]"
        lines.append(
            f"{ratio['workload']:<24}{ratio['client']:<22}{ratio['against']:<22}"
            f"{ratio['metric']:<12}{ratio['ratio']:>7.2f}x{spread:>16}{ratio['rounds']:>8}"
        )
    lines += ["", "targets"]
    for target in summary["targets"]:
        state = "MET " if target["met"] else "MISS"
        unit = " µs/msg" if target["kind"] == "cpu" else "x"
        lines.append(
            f"  [{state}] {target['client']:<22} {target['target']}: {target['value']:.2f}{unit}"
        )
    return "\n".join(lines)


def parallel_line(probes: list[float]) -> str:
    if not probes:
        return "cores delivered: not probed"
    low, mid, high = min(probes), median(probes) or 0.0, max(probes)
    return (
        f"cores delivered when both pinned cores are busy (probe per round): median {mid:.2f}"
        f" (min {low:.2f}, max {high:.2f}); below 2, client and cluster slow each other down"
    )


def environment() -> dict[str, Any]:
    versions = {}
    for name in ("smartnsq", "pynsq", "gnsq", "tornado", "gevent"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "missing"
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
    }


# --------------------------------------------------------------------------- main


# messages per run (full, --quick), and the publishers' warm-up
COUNTS = {
    "consume": (200_000, 5_000),
    "consume-ordered": (40_000, 2_000),
    "pub1": (20_000, 500),
    "pub100": (150_000, 5_000),
    "mpub100": (500_000, 10_000),
    "warmup": (2_000, 200),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small counts, 1 round (smoke)")
    parser.add_argument("--only", help=f"comma list of workloads: {','.join(WORKLOADS)}")
    parser.add_argument(
        "--clients",
        help="comma list of the other clients: pynsq,gnsq (the default), raw,raw+uvloop (the "
        "raw asyncio ceiling), go-nsq,youzan-go-nsq (built by bench/go/build.sh, skipped "
        "when not); none: ''",
    )
    parser.add_argument(
        "--variants",
        default="smartnsq",
        help="comma list of smartnsq variants ([smartnsq|base][/pure][+uvloop]), or 'all' "
        "(default: smartnsq)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="the smartnsq tree the base variants run (its parent directory goes first in "
        "PYTHONPATH: pass the directory that holds the smartnsq package)",
    )
    parser.add_argument("--json", type=Path, help="write runs and summary here")
    for name, (full, quick) in COUNTS.items():
        what = "publish: unmeasured first" if name == "warmup" else f"messages per {name} run"
        parser.add_argument(
            f"--{name}", type=int, help=f"{what} (default {full:,}; quick {quick:,})"
        )
    parser.add_argument("--mpub-window", type=int, default=1, help="MPUBs in flight")
    parser.add_argument("--linger", type=float, default=0.002, help="pub100-batched linger (s)")
    parser.add_argument(
        "--max-batch", type=int, default=50, help="pub100-batched: Producer(max_batch=...)"
    )
    Conditions.add_arguments(parser)
    parser.add_argument("--seed", type=int, help="shuffle seed (default: random)")
    args = parser.parse_args(argv)
    for name, (full, quick) in COUNTS.items():
        if getattr(args, name.replace("-", "_")) is None:
            setattr(args, name.replace("-", "_"), quick if args.quick else full)
    if args.quick:
        args.rounds = 1
        args.quiet_patience = min(args.quiet_patience, 5.0)
        args.retries = 0
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.mpub100 % 100:
        parser.error("--mpub100 must be a multiple of 100")
    only = set(WORKLOADS if not args.only else args.only.split(","))
    unknown = only - set(WORKLOADS)
    if unknown:
        parser.error(f"--only: unknown workload(s) {sorted(unknown)}; known: {WORKLOADS}")
    if args.clients is None:
        others = set(PYTHON_OTHERS)
    else:
        others = set(filter(None, args.clients.split(",")))
    for go in sorted(others & set(GO_CLIENTS)):
        if go_worker(go) is None:
            log(f"bench/compare: skipping {go}: {GO_MISSING}")
            others.discard(go)
    if others - set(OTHERS):
        parser.error(f"--clients: unknown {sorted(others - set(OTHERS))}")
    names = ALL_VARIANTS if args.variants == "all" else tuple(args.variants.split(","))
    if args.variants == "all" and args.baseline is None:
        names = tuple(n for n in names if not n.startswith("base"))
    for name in names:
        try:
            Variant.parse(name).env(args.baseline)
        except ValueError as exc:
            parser.error(f"--variants: {exc}")
    if args.baseline is not None and not (args.baseline / "smartnsq").is_dir():
        parser.error(f"--baseline: no smartnsq package in {args.baseline}")
    args.variant_names = names
    clients = set(names) | others
    args.selected = [
        c
        for c in cases(args.linger, args.max_batch, names)
        if c.workload in only and c.client in clients
    ]
    if not args.selected:
        parser.error("nothing selected")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if {args.cluster_cpu, args.client_cpu} - cores:
        print(
            f"warning: cores {args.cluster_cpu}/{args.client_cpu} not all available",
            file=sys.stderr,
        )
    pin(args.client_cpu)  # this process only waits while a worker measures
    env = environment()

    started = time.perf_counter()
    runs, probes = run_all(args, args.selected)
    summary = summarize(runs, args.selected)
    summary["parallel_cores"] = probes
    summary["unpinned_runs"] = sum(1 for r in runs if r.get("pinned") is False)
    print(report(summary, args, env))
    print(f"\n({len(runs)} runs in {time.perf_counter() - started:.0f} s)")
    if args.json:
        options = {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("selected", "json")
        }
        data = {"environment": env, "options": options, "runs": runs, "summary": summary}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    failed = sum(1 for r in runs if "error" in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
