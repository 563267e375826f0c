"""Consume positions of youzan channels: the ``<type>:<value>`` that ``POST
/channel/setoffset`` and SUB_ADVANCED take, where each lands in a partition's queue, and what
moving a live channel does.

The rules and error texts are youzan nsqd's (youzan/nsq 0.3.7-HA.1.13.0); what a read after a
seek delivers was observed (docs/protocol.md#reading-after-a-seek):

* :func:`parse_position` is ``ConsumeOffset.FromBytes`` (nsqdserver/protocol_v2.go): exactly
  one ``:``, one of four types, a decimal int64 (``strconv.ParseInt``'s error text otherwise).
* :func:`locate_position` is ``SetChannelOffset`` (nsqdserver/context.go) with the coordinator's
  searches (consistence/nsqd_coordinator.go) over the commit log (consistence/commitlog.go):
  ``virtual_queue`` lands on the first message boundary at or after the byte offset;
  ``msgcount:N`` on the N-th message (1-based: the search stops with N - 1 messages before the
  position); ``timestamp`` on the first message published at or after that second, its
  nanoseconds an int64 (a second past 2262 wraps round: to a negative value, refused, or to
  another instant, searched for);
  ``special:-1`` at the end. The searches clamp: a position before the queue lands on its first
  message, one past it on the end (``SearchLogByMsgOffset`` and ``SearchLogByMsgCnt`` find
  the last commit log entry, then read the queue on from it until the disk queue's EOF,
  which leaves them at the end), and ``doSetChannelOffset`` (nsqdserver/http.go) answers
  200 with an empty body all the same: only nsqd's own log says where the channel went. An
  empty queue has no commit log entry to search ("commit log end of file"); a negative
  second, or a special value other than -1, is refused.
* :func:`seek_channel` moves the channel (``Channel.SetConsumeOffset`` and ``drainChannelWaiting``,
  nsqd/channel.go, see :meth:`Channel.move_reader`) and syncs the position to the live
  replicas, which create the channel if they lack it (``SetChannelConsumeOffsetToCluster`` and
  ``updateChannelOffsetOnSlave``). A replica that is down keeps its old copy until the next
  sync (the emulator's in-sync replicas are the live ones).
* After an HTTP seek, delivery is not in queue order: b24, b31, b12... were seen after a seek
  to b10, and a0..b49 in the order a9, a4, a10... after ``msgcount:0``. nsqd re-reads the
  queue while messages drained from the old position still pass through its requeue paths
  (Go maps, iterated in random order), so the order depends on timing. The emulator models it
  deterministically: the first :data:`REREAD_WINDOW` messages from the new position go out in
  a shuffled order, seeded by the channel and the position, never in queue order when there
  are two or more of them; the rest follow in queue order. An ordered channel keeps its order
  (nsqd resets its reader to the confirmed position on any message out of order), and so does
  SUB_ADVANCED's start position, seen delivered in order (same section).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from smartnsq.testing.golang import go_parse_int, to_int64
from smartnsq.testing.state import Channel, PartitionLog

__all__ = [
    "KINDS",
    "REREAD_WINDOW",
    "ConsumeOffset",
    "OffsetError",
    "locate_position",
    "parse_position",
    "seek_channel",
]

KINDS = (b"timestamp", b"special", b"virtual_queue", b"msgcount")
# How many messages after a new position an HTTP seek delivers out of queue order.
REREAD_WINDOW = 32
_EMPTY_QUEUE = "commit log end of file"  # consistence.ErrCommitLogEOF


class OffsetError(Exception):
    """A position nsqd refuses; the text is nsqd's."""


@dataclass(frozen=True)
class ConsumeOffset:
    kind: str
    value: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_position(data: bytes) -> ConsumeOffset:
    """``<type>:<value>`` as ConsumeOffset.FromBytes reads it."""
    parts = data.split(b":")
    if len(parts) != 2 or parts[0] not in KINDS:
        raise OffsetError("invalid consume offset:" + data.decode("utf-8", "surrogateescape"))
    try:
        return ConsumeOffset(parts[0].decode(), go_parse_int(parts[1]))
    except ValueError as exc:
        raise OffsetError(str(exc)) from None


def locate_position(log: PartitionLog, position: ConsumeOffset) -> int:
    """The log index a position lands on (see the module doc)."""
    records = log.records
    kind, value = position.kind, position.value
    if kind == "special":
        if value != -1:
            raise OffsetError("not supported offset type")
        return len(records)
    # nsqd's nanoseconds are an int64: a second past 2262 wraps round, below zero (refused)
    # or to another positive instant (searched for, wherever that lands).
    nanoseconds = to_int64(value * 1_000_000_000)
    if kind == "timestamp" and nanoseconds < 0:
        raise OffsetError(f"Invalid timestamp {value}")
    if not records:
        raise OffsetError(_EMPTY_QUEUE)
    if kind == "virtual_queue":
        return log.index_for_offset(value)
    if kind == "msgcount":
        return min(max(value - 1, 0), len(records))
    return log.index_for_timestamp(nanoseconds)


def seek_channel(channel: Channel, index: int, *, reorder: bool) -> None:
    """Move ``channel`` to log index ``index`` and sync its replicas. ``reorder``: the first
    messages go out of queue order (an HTTP seek of an unordered channel; module doc)."""
    reread = _reread_order(channel, index) if reorder and not channel.ordered else None
    channel.move_reader(index, reread)
    if channel.on_confirm is not None:
        channel.on_confirm(channel)  # the leader's sync of the consume offset to its replicas


def _reread_order(channel: Channel, index: int) -> list[int]:
    log = channel.log
    window = list(range(index, min(index + REREAD_WINDOW, len(log.records))))
    rng = random.Random(f"{log.topic_name}/{log.partition}/{channel.name}/{index}")
    rng.shuffle(window)
    if len(window) > 1 and window == sorted(window):
        window[0], window[1] = window[1], window[0]
    return window
