"""Queue offsets of youzan partitions as nsqd's HTTP API moves and shows them (youzan/nsq
0.3.7-HA.1.13.0 ``nsqdserver/http.go``: ``doSetChannelOffset``, ``doStats``). Pure: the requests'
arguments, and the answers as typed values.

Every message of a partition has a queue offset: its byte position in the partition's queue
(the next message starts at offset + raw size). ``POST /channel/setoffset`` on the partition
leader moves a channel's consume position (the body is a
:class:`~smartnsq.protocol.commands.StartPosition`); ``GET /stats`` shows, per partition,
the queue's start and end (``backend_start``, ``backend_depth``) and, per channel, how far
its confirmed position is from the end (``depth`` in messages, ``depth_size`` in bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from smartnsq.errors import ProtocolError, ValidationError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.validation import check_channel, check_partition, check_topic

__all__ = [
    "CHANNEL_NOT_FOUND",
    "EMPTY_QUEUE",
    "NOT_LEADER",
    "SETOFFSET_PATH",
    "STATS_PATH",
    "PartitionOffsets",
    "SeekResult",
    "landed_offset",
    "lies_past_end",
    "parse_partition_offsets",
    "setoffset_body",
    "setoffset_params",
    "stats_params",
    "v1_error_message",
]

SETOFFSET_PATH = "/channel/setoffset"
STATS_PATH = "/stats"
# nsqd's answers: the channel does not exist on that node (404); the node does not lead the
# partition (400); the partition has no message, so its commit log has nothing to search
# (500, consistence.ErrCommitLogEOF): the channel is at the only position there is.
CHANNEL_NOT_FOUND = "CHANNEL_NOT_FOUND"
NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
EMPTY_QUEUE = "commit log end of file"
_V1_ERROR_HEAD = b'{"message":"'
_V1_ERROR_TAIL = b'"}'
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SeekResult:
    """One partition of a seek: its ``leader`` (nsqd HTTP address) moved the channel to
    ``position``, unless the partition was ``empty`` (no message: the channel is at the only
    position there is, so nothing was moved).

    Where the channel went, read from the leader's ``/stats`` right after the move (None
    when the partition was empty or the read failed): ``offset``, the queue offset it
    resumes from, and ``end``, the queue's end. nsqd moves a position past the queue's end
    to the end without an error: ``past_end`` says that happened (an offset past ``end``, or
    a message count past the partition's messages)."""

    partition: int
    leader: str
    position: StartPosition
    empty: bool = False
    offset: int | None = None
    end: int | None = None
    past_end: bool = False


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A channel's position in one partition, from its ``leader``'s ``/stats`` (nsqd HTTP
    address). Offsets are byte positions in the partition's queue.

    - ``start``: the queue's first offset (``backend_start``; above 0 once old data was
      deleted); ``end``: the offset after its last message (``backend_depth``).
    - ``position``: where the channel resumes, the offset of its first unconfirmed message
      (``end`` minus the channel's ``depth_size``); everything before it is consumed.
    - ``depth``: the messages from ``position`` to ``end``; ``lag``: the same span in bytes
      (``end - position``).
    - ``position``, ``depth`` and ``lag`` are None when the leader has no such channel.
    - ``messages``: every message the partition ever took (``message_count``, those deleted
      since included: what ``message:N`` counts); None when ``/stats`` does not say.
    """

    partition: int
    leader: str
    start: int
    end: int
    position: int | None
    depth: int | None
    messages: int | None = None

    @property
    def lag(self) -> int | None:
        return None if self.position is None else self.end - self.position


def lies_past_end(position: StartPosition, queue: PartitionOffsets) -> bool:
    """Whether ``position`` lies past the end of ``queue`` (where nsqd puts the channel
    instead, without an error): an offset past its end, or a message count past the message
    that would come next (``message:N+1`` of N messages is the end, as the end's offset is).
    A timestamp later than every message lands on the end too, but that is where it
    belongs."""
    if position.kind == "virtual_queue":
        return position.value > queue.end
    if position.kind == "msgcount":
        return queue.messages is not None and position.value > queue.messages + 1
    return False


def landed_offset(position: StartPosition, queue: PartitionOffsets) -> int | None:
    """Where a seek to ``position`` put the channel, from the leader's ``/stats`` read right
    after it (``queue``). Where the numbers alone say it (the end for ``latest`` and past
    the end, the start for an offset before the queue), that; otherwise the channel's
    position as ``/stats`` shows it (youzan's leader moves the channel's reader in the
    background, so that read may still show where it was)."""
    if position.kind == "special" or lies_past_end(position, queue):
        return queue.end
    if position.kind == "virtual_queue" and position.value <= queue.start:
        return queue.start
    return queue.position


def setoffset_params(topic: str, partition: int, channel: str) -> dict[str, str]:
    """The query of ``POST /channel/setoffset`` (the body is ``str(position)``)."""
    return {
        "topic": check_topic(topic),
        "partition": str(check_partition(partition)),
        "channel": check_channel(channel),
    }


def setoffset_body(position: StartPosition) -> bytes:
    """The body of ``POST /channel/setoffset``: the position's wire form."""
    if not isinstance(position, StartPosition):
        raise ValidationError("position", f"must be a StartPosition, not {type(position).__name__}")
    return str(position).encode()


def stats_params(topic: str, partition: int, channel: str) -> dict[str, str]:
    """The query of ``GET /stats`` for one partition of a topic, as JSON."""
    return {**setoffset_params(topic, partition, channel), "format": "json"}


def v1_error_message(body: bytes) -> str | None:
    """The message of a v1 error body. nsqd formats it with Sprintf, so a message holding a
    quote (Go's error texts quote the input) is not valid JSON; None if ``body`` is no such
    body."""
    if body.startswith(_V1_ERROR_HEAD) and body.endswith(_V1_ERROR_TAIL):
        return body[len(_V1_ERROR_HEAD) : -len(_V1_ERROR_TAIL)].decode("utf-8", "replace")
    return None


def parse_partition_offsets(
    payload: object, topic: str, partition: int, channel: str, leader: str
) -> PartitionOffsets:
    """The :class:`PartitionOffsets` of ``/stats`` JSON (the v1 payload, already unwrapped).
    ProtocolError when the answer lacks the partition or has the wrong shape."""
    topics = _get(payload, "topics", "stats", list)
    name = f"{topic}-{partition}"
    entry = next(
        (
            t
            for t in topics
            if isinstance(t, Mapping)
            and t.get("topic_name") == topic
            and t.get("topic_partition") == str(partition)
        ),
        None,
    )
    if entry is None:
        raise ProtocolError(f"{leader} /stats does not list partition {name}")
    where = f"stats[{name}]"
    start = _get(entry, "backend_start", where, int)
    end = _get(entry, "backend_depth", where, int)
    channels = _get(entry, "channels", where, list)
    found = next(
        (c for c in channels if isinstance(c, Mapping) and c.get("channel_name") == channel),
        None,
    )
    count = entry.get("message_count")
    messages = count if type(count) is int else None
    if found is None:
        return PartitionOffsets(partition, leader, start, end, None, None, messages)
    where = f"{where}.channels[{channel}]"
    depth = _get(found, "depth", where, int)
    size = _get(found, "depth_size", where, int)
    return PartitionOffsets(partition, leader, start, end, end - size, depth, messages)


def _get(obj: object, key: str, where: str, kind: type[_T]) -> _T:
    if not isinstance(obj, Mapping):
        raise ProtocolError(f"{where}: expected a JSON object")
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ProtocolError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value
