"""smartnsq Producer benchmark: publish throughput of 100-byte bodies.

Workloads (each run against a fresh ``smartnsq cluster`` pinned to core 0, the producer in a
worker process pinned to core 1, warmed up before measuring):

* sequential: ``await producer.publish`` one after another (one in flight; latency p50/p99);
* pipelined: 100 concurrent publishers sharing one producer;
* batched: ``publish_many`` batches of 100 (``--mpub-window`` in flight);
* auto-batched: the pipelined workload with ``Producer(linger=...)``.

Default: youzan, one topic of 4 partitions, through nsqlookupd; ``--classic``: classic nsqd.
Prints medians over ``--rounds``: msgs/s and CPU seconds per 100k messages of the client and
of the cluster. Aims (Producer issue): pipelined >= 50,000 msgs/s, batched >= 200,000 msgs/s.

Usage: python bench/producer.py [--classic] [--messages N] [--rounds R] [--json out.json]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    Aim,
    Conditions,
    Job,
    exit_on_sigterm,
    measure_round,
    parallel_cores,
    report,
)

WORKLOADS = {
    "sequential": ("pub1", None),
    "pipelined": ("pub100", None),
    "batched": ("mpub100", None),
    "auto-batched": ("pub100", "linger"),
}
AIMS = (
    Aim("pipelined", 50_000, "Producer issue: >= 50,000 msgs/s pipelined"),
    Aim("batched", 200_000, "Producer issue: >= 200,000 msgs/s batched"),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classic", action="store_true", help="classic nsqd (default youzan)")
    parser.add_argument("--partitions", type=int, default=4, help="youzan partitions")
    parser.add_argument("--messages", type=int, default=100_000, help="per pipelined run")
    parser.add_argument("--sequential", type=int, default=10_000, help="per sequential run")
    parser.add_argument("--batched", type=int, default=500_000, help="per batched run")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--mpub-window", type=int, default=1, help="batches in flight")
    parser.add_argument("--linger", type=float, default=0.002, help="auto-batched linger (s)")
    parser.add_argument("--max-batch", type=int, default=50, help="auto-batched max_batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help=f"comma list of: {','.join(WORKLOADS)}")
    Conditions.add_arguments(parser)
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    where = Conditions.from_args(args)
    if args.batched % 100:
        parser.error("--batched must be a multiple of 100")
    only = args.only.split(",") if args.only else list(WORKLOADS)
    if set(only) - set(WORKLOADS):
        parser.error(f"--only: unknown {sorted(set(only) - set(WORKLOADS))}")
    counts = {"pub1": args.sequential, "pub100": args.messages, "mpub100": args.batched}
    cores = [parallel_cores((args.cluster_cpu, args.client_cpu))]

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in only}
    for round_ in range(1, args.rounds + 1):
        order = only[:]
        random.shuffle(order)
        for name in order:
            mode, linger = WORKLOADS[name]
            job = Job(
                "smartnsq",
                mode,
                counts[mode],
                youzan=not args.classic,
                partitions=args.partitions,
                linger=args.linger if linger else None,
                max_batch=args.max_batch,
                warmup=args.warmup,
                mpub_window=args.mpub_window,
            )
            measure_round(job, where, runs, name, round_)

    cores.append(parallel_cores((args.cluster_cpu, args.client_cpu)))
    mode = "classic nsqd" if args.classic else f"youzan, {args.partitions} partitions"
    header = (
        f"smartnsq Producer, {mode}; cluster pinned to core {args.cluster_cpu}, producer to "
        f"core {args.client_cpu}; 100-byte bodies; medians of {args.rounds} round(s)"
    )
    report(header, runs, AIMS, cores, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
