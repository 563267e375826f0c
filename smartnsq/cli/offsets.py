"""``smartnsq channel seek`` and ``smartnsq channel lag``: a youzan channel's position in
each partition of its topic, moved or shown (Admin.seek, Admin.offsets)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from smartnsq.cli._common import (
    add_admin_options,
    add_verbosity,
    admin_for,
    channel_arg,
    dash,
    plural,
    setup_logging,
    table,
    topic_arg,
)
from smartnsq.cli.usage import UsageError
from smartnsq.errors import ValidationError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.offsets import PartitionOffsets, SeekResult
from smartnsq.transport import loops

__all__ = ["register_actions"]

SEEK_DESCRIPTION = """\
youzan: move CHANNEL's consume position in every partition of TOPIC (or in the --partition
ones), on each partition's leader. --to takes:

  earliest          the first message of the queue
  latest            after the last message (nothing is redelivered)
  offset:N          queue offset N (a byte position; inside a message: the next message)
  message:N         the N-th message of the partition, from 1 (message:1 is the first)
  timestamp:T       the first message published at or after T (unix seconds, a fraction
                    dropped: nsqd works in seconds, not milliseconds; or ISO 8601 with its
                    UTC offset, e.g. 2026-11-24T10:00:00Z)

nsqd forgets the messages in flight on the channel (their FINs fail) and delivers from the
new position again, not necessarily in queue order. A position past the end of a partition's
queue moves the channel to the end: each partition's line says where it went. A partition
without messages is left as it is. Classic nsqd has no queue offsets.
"""

LAG_DESCRIPTION = """\
youzan: per partition of TOPIC, from its leader: the queue's START and END offsets, where
CHANNEL resumes (POSITION: everything before it is consumed), the messages after it (DEPTH)
and the same span in bytes (LAG = END - POSITION). Offsets are byte positions in the
partition's queue. "-": the leader has no such channel. Classic nsqd has no queue offsets.
"""


def register_actions(actions: Any) -> None:
    """Add ``seek`` and ``lag`` to ``smartnsq channel``'s actions."""
    seek = actions.add_parser(
        "seek",
        help="move a channel's position (youzan)",
        description=SEEK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    seek.add_argument("topic", metavar="TOPIC")
    seek.add_argument("channel", metavar="CHANNEL")
    seek.add_argument(
        "--to",
        required=True,
        metavar="POSITION",
        help="earliest, latest, offset:N, message:N or timestamp:T",
    )
    seek.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="N",
        help="only this partition (repeatable; default: every partition)",
    )
    add_admin_options(seek)
    add_verbosity(seek)
    seek.set_defaults(func=run_seek)
    lag = actions.add_parser(
        "lag",
        help="show a channel's position and lag per partition (youzan)",
        description=LAG_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lag.add_argument("topic", metavar="TOPIC")
    lag.add_argument("channel", metavar="CHANNEL")
    lag.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_admin_options(lag)
    add_verbosity(lag)
    lag.set_defaults(func=run_lag)


def run_seek(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    channel = channel_arg(args.channel)
    try:
        position = StartPosition.parse(args.to)
    except ValidationError as exc:
        raise UsageError(f"invalid --to: {exc.reason}") from None
    setup_logging("channel", args.verbose)

    async def seek() -> list[SeekResult]:
        async with admin_for(args) as admin:
            return await admin.seek(topic, channel, position, partitions=args.partition)

    results = loops.run(seek())
    wanted = position.text()
    for result in results:
        print(f"partition {result.partition}: {_landing(result, wanted)}")
    moved = sum(not r.empty for r in results)
    past = sum(r.past_end for r in results)
    summary = f"channel {topic}/{channel}: {plural(moved, 'partition')} moved to {wanted}"
    if past:
        summary += f" ({past} of them past the end: moved to the end)"
    print(summary)
    return 0


def _landing(result: SeekResult, wanted: str) -> str:
    """One partition of a seek, in words: where its channel went."""
    if result.empty:
        return "no messages, left as it is"
    leader = result.leader
    if result.past_end:
        return f"{wanted} lies past the end: moved to the end, offset {result.end} ({leader})"
    if result.offset is None:
        return f"moved to {wanted} ({leader})"
    return f"moved to {wanted}, now at offset {result.offset} of {result.end} ({leader})"


def run_lag(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    channel = channel_arg(args.channel)
    setup_logging("channel", args.verbose)

    async def offsets() -> list[PartitionOffsets]:
        async with admin_for(args) as admin:
            return await admin.offsets(topic, channel)

    partitions = loops.run(offsets())
    if args.json:
        rows = [_as_json(offsets) for offsets in partitions]
        print(json.dumps({"topic": topic, "channel": channel, "partitions": rows}))
        return 0
    header = ("PARTITION", "LEADER", "START", "END", "POSITION", "DEPTH", "LAG")
    rows_text = [
        (
            str(o.partition),
            o.leader,
            str(o.start),
            str(o.end),
            dash(o.position),
            dash(o.depth),
            dash(o.lag),
        )
        for o in partitions
    ]
    print(f"{topic}/{channel}")
    print("\n".join(table(header, rows_text)))
    return 0


def _as_json(offsets: PartitionOffsets) -> dict[str, Any]:
    return {
        "partition": offsets.partition,
        "leader": offsets.leader,
        "start": offsets.start,
        "end": offsets.end,
        "position": offsets.position,
        "depth": offsets.depth,
        "lag": offsets.lag,
    }
