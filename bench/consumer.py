"""smartnsq Consumer benchmark: consume throughput from a pre-filled topic.

Each round: a fresh ``smartnsq cluster`` pinned to core 0, the topic pre-filled with
``--messages`` 100-byte messages by raw MPUB (no client code), then a worker process pinned
to core 1 runs ``Consumer(topic, channel, handler=async fn, max_in_flight=2500)``; the
handler only counts, returning finishes (FIN) each message. Measured from ``start()`` (lookup,
connect, subscribe) to the handler's N-th call.

Default: youzan, one topic of 4 partitions, through nsqlookupd; ``--classic``: classic nsqd;
``--ordered``: an ordered topic of 4 partitions consumed with ``ordered=True`` (nsqd delivers
one message at a time per partition, the next one after the FIN of the previous: each
message is a round trip, so the client's turnaround per message is the throughput).
Prints medians over ``--rounds``: msgs/s and CPU seconds per 100k messages of the client and
of the cluster. Aim (Consumer issue): >= 50,000 msgs/s (unordered).

Usage: python bench/consumer.py [--classic | --ordered] [--messages N] [--rounds R]
       [--json out.json]
"""

from __future__ import annotations

import argparse
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

AIMS = (Aim("consume", 50_000, "Consumer issue: >= 50,000 msgs/s"),)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classic", action="store_true", help="classic nsqd (default youzan)")
    parser.add_argument(
        "--ordered", action="store_true", help="an ordered youzan topic, Consumer(ordered=True)"
    )
    parser.add_argument("--partitions", type=int, default=4, help="youzan partitions")
    parser.add_argument(
        "--messages", type=int, help="pre-filled, per round (default 200,000; ordered 40,000)"
    )
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=3)
    Conditions.add_arguments(parser)
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    args = parser.parse_args(argv)
    if args.ordered and args.classic:
        parser.error("--ordered needs youzan (classic nsqd has no ordered topics)")
    if args.messages is None:
        args.messages = 40_000 if args.ordered else 200_000
    exit_on_sigterm()
    where = Conditions.from_args(args)
    cores = [parallel_cores((args.cluster_cpu, args.client_cpu))]

    name = "consume-ordered" if args.ordered else "consume"
    runs: dict[str, list[dict[str, Any]]] = {name: []}
    for round_ in range(1, args.rounds + 1):
        job = Job(
            "smartnsq",
            "consume",
            args.messages,
            youzan=not args.classic,
            partitions=args.partitions,
            max_in_flight=args.max_in_flight,
            ordered=args.ordered,
        )
        measure_round(job, where, runs, name, round_)

    cores.append(parallel_cores((args.cluster_cpu, args.client_cpu)))
    mode = "classic nsqd" if args.classic else f"youzan, {args.partitions} partitions"
    mode += ", ordered" if args.ordered else ""
    header = (
        f"smartnsq Consumer, {mode}, max_in_flight {args.max_in_flight}, "
        f"{args.messages:,} messages per round; cluster pinned to core {args.cluster_cpu}, "
        f"consumer to core {args.client_cpu}; medians of {args.rounds} round(s)"
    )
    report(header, runs, AIMS, cores, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
