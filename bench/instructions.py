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

Consume rows fill the topic before each run (raw MPUB, not counted). ``--ceiling`` counts
the raw asyncio worker (``clients/raw_worker.py``: a frame read, its FIN or OK written, no
client library) beside the rows it has: what smartnsq costs over the floor of any asyncio
client.

Usage: python bench/instructions.py [--only pub1,consume,...] [--baseline DIR] [--ceiling]
[--json F]
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import BENCH, CHANNEL, ROOT, TOPIC, prefill, spawn_cluster

WORKER = BENCH / "clients" / "smartnsq_worker.py"
CEILING = BENCH / "clients" / "raw_worker.py"  # the raw asyncio ceiling (--ceiling)


@dataclass(frozen=True)
class Row:
    """A counted row: the worker's arguments, the cluster it needs, the two counts."""

    arguments: list[str]
    youzan: bool = False
    small: int = 200
    large: int = 1200
    ordered: bool = False  # an ordered topic (youzan)
    ceiling: bool = False  # the raw worker runs it too

    @property
    def consume(self) -> bool:
        return self.arguments[0] == "consume"


ROWS: dict[str, Row] = {
    "pub1": Row(["pub1", "--concurrency=1"], ceiling=True),
    "pub1-blocking": Row(["pub1", "--blocking"]),
    "pub1-youzan4": Row(["pub1", "--concurrency=1"], youzan=True),
    "pub100": Row(["pub100", "--concurrency=100"], small=2000, large=12000),
    "pub100-youzan4": Row(["pub100", "--concurrency=100"], True, 2000, 12000),
    "mpub100": Row(["mpub100", "--batch=100"], small=2000, large=22000),
    "pub100-batched": Row(
        ["pub100", "--concurrency=100", "--linger=0.002", "--max-batch=50"],
        small=2000,
        large=22000,
    ),
    "consume": Row(["consume", "--max-in-flight=2500"], small=5000, large=25000, ceiling=True),
    "consume-ordered-youzan4": Row(
        ["consume", "--ordered"], youzan=True, small=500, large=2500, ordered=True, ceiling=True
    ),
}
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
    row: Row, where: list[str], tree: Path | None, cluster: Any, worker: Path = WORKER
) -> float:
    """The client's instructions per message: two runs, the difference of their totals over
    the difference of their counts. Consume rows fill the topic first (outside the count)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["SMARTNSQ_UVLOOP"] = "0"
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    totals = []
    for messages in (row.small, row.large):
        if row.consume:
            asyncio.run(prefill(cluster.info, TOPIC, messages))
        argv = [
            str(worker),
            *row.arguments,
            *where,
            f"--topic={TOPIC}",
            f"--channel={CHANNEL}",
            f"--messages={messages}",
            "--warmup=200",
        ]
        totals.append(count(argv, env))
    return (totals[1] - totals[0]) / (row.large - row.small)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma list of rows ({', '.join(ROWS)})")
    parser.add_argument("--baseline", type=Path, help="another tree, counted beside this one")
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="count the raw asyncio worker (clients/raw_worker.py) too, where a row has it",
    )
    args = parser.parse_args()
    rows = args.only.split(",") if args.only else list(ROWS)
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    # this tree by path: the interpreter's own install may be another checkout's (editable)
    trees: dict[str, Path | None] = {"now": ROOT}
    if args.baseline is not None:
        trees["base"] = args.baseline.resolve()
    results: dict[str, dict[str, float]] = {}
    for youzan, ordered in ((False, False), (True, False), (True, True)):
        chosen = [r for r in rows if (ROWS[r].youzan, ROWS[r].ordered) == (youzan, ordered)]
        if not chosen:
            continue
        topic = f"{TOPIC}:4:1" if youzan else TOPIC
        topic += ":ordered" if ordered else ""
        # youzan's lookupd gives no writable partition of a topic without a channel
        channels = [f"{TOPIC}:{CHANNEL}"]
        with spawn_cluster(
            classic=not youzan, topics=[topic], channels=channels, nodes=1
        ) as cluster:
            where = (
                [f"--lookupd={url}" for url in cluster.lookupd]
                if youzan
                else [f"--nsqd={address}" for address in cluster.nsqd(TOPIC)]
            )
            for name in chosen:
                row = ROWS[name]
                results[name] = {}
                for label, tree in trees.items():
                    results[name][label] = per_message(row, where, tree, cluster)
                if args.ceiling and row.ceiling:
                    results[name]["raw"] = per_message(row, where, None, cluster, CEILING)
                found = results[name]
                line = ", ".join(f"{n} {v / 1000:.1f}k" for n, v in found.items())
                if "base" in found:
                    line += f"; now/base {found['now'] / found['base']:.3f}x"
                if "raw" in found:
                    line += f"; now/raw {found['now'] / found['raw']:.2f}x"
                print(f"{name:24s} instructions per message: {line}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
