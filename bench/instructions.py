"""Client instructions per message, counted with callgrind: what a change costs or saves on
a hot path, whatever else the machine is doing (the count repeats for the same binary and
inputs; wall-clock rates on a shared 2-core VM spread by 20-30 %).

Each row runs the smartnsq benchmark worker (``clients/smartnsq_worker.py``, the public
API) under ``valgrind --tool=callgrind`` twice, with a small and a large message count,
against an embedded cluster in another process (``smartnsq cluster``, classic nsqd or youzan
with 4 partitions); the difference of the two totals over the difference of the counts is
the client's own instructions per message, start-up and warm-up cancelled out. ``--baseline
DIR`` counts another tree beside this one (DIR holds its ``smartnsq`` package, compiled in
place: ``python setup.py build_ext --inplace`` there).

The consume rows fill the topic with as many 100-byte messages as the run takes first
(raw MPUB, not counted: another process), unordered on classic nsqd and ordered on an
ordered youzan topic of 4 partitions.

Usage: python bench/instructions.py [--only pub1,pub100,...] [--baseline DIR] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import BENCH, CHANNEL, TOPIC, prefill, spawn_cluster

WORKER = BENCH / "clients" / "smartnsq_worker.py"
# row -> (worker arguments, youzan?, small count, large count)
ROWS: dict[str, tuple[list[str], bool, int, int]] = {
    "pub1": (["pub1", "--concurrency=1"], False, 200, 1200),
    "pub1-blocking": (["pub1", "--blocking"], False, 200, 1200),
    "pub1-youzan4": (["pub1", "--concurrency=1"], True, 200, 1200),
    "pub100": (["pub100", "--concurrency=100"], False, 2000, 12000),
    "pub100-youzan4": (["pub100", "--concurrency=100"], True, 2000, 12000),
    "mpub100": (["mpub100", "--batch=100"], False, 2000, 22000),
    "pub100-batched": (
        ["pub100", "--concurrency=100", "--linger=0.002", "--max-batch=50"],
        False,
        2000,
        22000,
    ),
    "consume": (["consume", "--max-in-flight=2500"], False, 2000, 12000),
    "consume-ordered-youzan4": (["consume", "--ordered"], True, 1000, 4000),
}
# rows that read a topic filled before each run, and the topic's flags
CONSUMING = {"consume": "", "consume-ordered-youzan4": ":ordered"}
_TOTAL = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def count(argv: list[str], env: dict[str, str]) -> int:
    """Instructions of one worker run under callgrind."""
    with tempfile.TemporaryDirectory(prefix="smartnsq-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--dump-instr=no",
            sys.executable,
            *argv,
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
        found = _TOTAL.search(out.read_text())
        if found is None:
            raise RuntimeError("no total in the callgrind output")
        return int(found.group(1))


def per_message(
    row: str, where: list[str], tree: Path | None, info: dict[str, object] | None = None
) -> float:
    arguments, _, small, large = ROWS[row]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["SMARTNSQ_UVLOOP"] = "0"
    # This tree unless another is named: without a PYTHONPATH the worker would import
    # whatever smartnsq the environment installed (an editable install of another checkout).
    env["PYTHONPATH"] = str(tree if tree is not None else BENCH.parent)
    totals = []
    for messages in (small, large):
        if row in CONSUMING and info is not None:
            asyncio.run(prefill(info, TOPIC, messages))
        argv = [
            str(WORKER),
            *arguments,
            *where,
            f"--topic={TOPIC}",
            f"--messages={messages}",
            "--warmup=200",
        ]
        totals.append(count(argv, env))
    return (totals[1] - totals[0]) / (large - small)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma list of rows ({', '.join(ROWS)})")
    parser.add_argument("--baseline", type=Path, help="another tree, counted beside this one")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    rows = args.only.split(",") if args.only else list(ROWS)
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    trees: dict[str, Path | None] = {"now": None}
    if args.baseline is not None:
        trees["base"] = args.baseline.resolve()
    results: dict[str, dict[str, float]] = {}
    # a cluster per kind: classic, youzan, and youzan with an ordered topic
    for youzan, flags in ((False, ""), (True, ""), (True, ":ordered")):
        chosen = [row for row in rows if ROWS[row][1] == youzan and CONSUMING.get(row, "") == flags]
        if not chosen:
            continue
        topic = f"{TOPIC}:4:1{flags}" if youzan else TOPIC
        consuming = any(row in CONSUMING for row in chosen)
        channels = [f"{TOPIC}:{CHANNEL}"] if consuming else []
        with spawn_cluster(
            classic=not youzan, topics=[topic], channels=channels, nodes=1
        ) as cluster:
            where = (
                [f"--lookupd={url}" for url in cluster.lookupd]
                if youzan
                else [f"--nsqd={address}" for address in cluster.nsqd(TOPIC)]
            )
            for row in chosen:
                results[row] = {}
                for name, tree in trees.items():
                    results[row][name] = per_message(row, where, tree, cluster.info)
                line = ", ".join(f"{n} {v / 1000:.1f}k" for n, v in results[row].items())
                if "base" in results[row]:
                    line += f"; now/base {results[row]['now'] / results[row]['base']:.3f}x"
                print(f"{row:16s} instructions per message: {line}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
