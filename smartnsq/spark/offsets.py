"""The offsets mode's positions and plans, as Spark's Kafka source has them, for youzan queue
offsets. Pure code: no Spark, no I/O.

* A Spark offset is ``{"<topic>": {"<partition>": <queue offset>}}``: per partition, the byte
  position in its queue up to which the stream has planned (the next micro-batch starts
  there).
* ``startingOffsets`` / ``endingOffsets``: ``earliest``, ``latest`` or that JSON, where -2
  stands for a partition's earliest offset and -1 for its latest (as in Kafka's options).
  ``startingTimestamp``: milliseconds since the epoch. A stream given neither starts at the
  channel's position (:data:`CHANNEL`): unlike a Kafka group, an NSQ channel is a durable
  consume position the server keeps, so a new query on a channel holding a backlog reads it.
* Caps (Kafka's ``rateLimit``): a limit is spread over the partitions in proportion to what
  each has to read (a partition with less than one unit to get gets one, so none starves),
  and no partition's end passes its latest offset. ``maxOffsetsPerTrigger`` counts queue
  offsets (bytes); ``maxMessagesPerTrigger`` counts messages, turned into offsets with each
  partition's average message size (nsqd's ``/stats``: a channel's depth in bytes over its
  depth in messages), so it holds on average, not to the message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from smartnsq.errors import ValidationError

__all__ = [
    "CHANNEL",
    "EARLIEST",
    "LATEST",
    "Position",
    "cap_messages",
    "offsets_from_spark",
    "offsets_to_spark",
    "parse_position",
    "rate_limit",
]

# Kafka's per-partition stand-ins in startingOffsets / endingOffsets JSON.
EARLIEST = -2
LATEST = -1

Offsets = dict[int, int]


@dataclass(frozen=True)
class Position:
    """Where a read starts or ends: the ``earliest`` or ``latest`` offset of every
    partition, per-partition ``offsets`` (EARLIEST / LATEST allowed), the first message
    published at or after ``timestamp_ms``, or (a stream's default start) the ``channel``'s
    own position in each partition, where the channel exists."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "channel"]
    offsets: Mapping[int, int] = field(default_factory=dict)
    timestamp_ms: int | None = None

    def at(self, partition: int) -> int | None:
        """EARLIEST, LATEST or the offset for ``partition`` (None: not named in the JSON, or
        a position the queue's own numbers do not give: a timestamp, the channel's)."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        return self.offsets.get(partition)


# A stream's start when neither startingOffsets nor startingTimestamp is given.
CHANNEL = Position("channel")


def parse_position(name: str, text: str, topic: str, *, ending: bool = False) -> Position:
    """``earliest``, ``latest`` or ``{"<topic>": {"<partition>": offset}}`` (offsets >= 0,
    -2 earliest, -1 latest). An ending position cannot be earliest (nothing would be read)."""
    word = text.strip()
    if word in ("earliest", "latest"):
        if ending and word == "earliest":
            raise ValidationError(name, "earliest cannot end a read (it would read nothing)")
        return Position(word)  # type: ignore[arg-type] # one of the two literals
    try:
        value = json.loads(word)
    except ValueError:
        raise ValidationError(
            name, f'expected earliest, latest or JSON like {{"{topic}": {{"0": 42}}}}'
        ) from None
    offsets = _partition_offsets(name, value, topic, special=True)
    for partition, offset in offsets.items():
        if ending and offset == EARLIEST:
            raise ValidationError(name, f"partition {partition}: -2 (earliest) cannot end a read")
    return Position("offsets", offsets)


def offsets_to_spark(topic: str, offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """The Spark offset of per-partition queue offsets."""
    return {topic: {str(p): offsets[p] for p in sorted(offsets)}}


def offsets_from_spark(value: Any, topic: str, name: str) -> Offsets:
    """Per-partition queue offsets from a Spark offset (as Spark hands it back: a dict, or
    its JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValidationError(name, f"not an nsq source offset: {value!r}") from None
    return _partition_offsets(name, value, topic, special=False)


def _partition_offsets(name: str, value: Any, topic: str, *, special: bool) -> Offsets:
    if not isinstance(value, dict) or set(value) != {topic} or not isinstance(value[topic], dict):
        raise ValidationError(
            name, f'expected {{"{topic}": {{"<partition>": <offset>}}}}, got {value!r}'
        )
    lowest = EARLIEST if special else 0
    offsets: Offsets = {}
    for key, offset in value[topic].items():
        try:
            partition = int(key)
        except (TypeError, ValueError):
            raise ValidationError(name, f"{key!r} is not a partition number") from None
        if partition < 0 or type(offset) is not int or offset < lowest:
            raise ValidationError(name, f"partition {key}: bad offset {offset!r}")
        offsets[partition] = offset
    return offsets


def _shares(limit: int, weights: Mapping[int, float]) -> dict[int, int]:
    """``limit`` spread over the partitions in proportion to ``weights`` (all positive), as
    Kafka spreads it: a share under 1 rounds up (every partition moves), others round down."""
    total = sum(weights.values())
    shares = {}
    for partition, weight in weights.items():
        share = limit * (weight / total)
        shares[partition] = math.ceil(share) if share < 1 else math.floor(share)
    return shares


def rate_limit(limit: int, start: Mapping[int, int], end: Mapping[int, int]) -> Offsets:
    """Kafka's cap: at most about ``limit`` offsets past ``start`` over all partitions,
    spread in proportion to what each has between ``start`` and ``end``."""
    sizes = {p: end[p] - start.get(p, end[p]) for p in end}
    available = {p: size for p, size in sizes.items() if size > 0}
    if not available:
        return dict(end)
    steps = _shares(limit, available)
    return {
        partition: min(last, start[partition] + steps[partition]) if partition in steps else last
        for partition, last in end.items()
    }


def cap_messages(
    limit: int,
    start: Mapping[int, int],
    end: Mapping[int, int],
    message_sizes: Mapping[int, float],
) -> Offsets:
    """At most about ``limit`` messages past ``start``: messages are spread over the
    partitions as in :func:`rate_limit`, each partition's share turned into offsets with
    its average message size (``message_sizes``; a partition without one is not capped)."""
    counts: dict[int, float] = {}
    for partition, last in end.items():
        size = message_sizes.get(partition)
        first = start.get(partition, last)
        if size is not None and size > 0 and last > first:
            counts[partition] = (last - first) / size
    if not counts:
        return dict(end)
    messages = _shares(limit, counts)
    capped: Offsets = {}
    for partition, last in end.items():
        if partition not in messages:
            capped[partition] = last
            continue
        step = max(1, math.ceil(messages[partition] * message_sizes[partition]))
        capped[partition] = min(last, start[partition] + step)
    return capped
