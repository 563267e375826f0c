"""What an ordered consumer knows about each partition's sequence (pure: no I/O).

youzan delivers an ordered partition strictly in queue order, one message at a time: on one
connection, each delivery is the one before it again (a redelivery) or the next message in
the queue. Three things break that sequence:

* a *move*: the channel was moved (``/channel/setoffset``: a seek, by this process's
  ``Admin`` or by anyone), and nsqd goes on reading from the new position. On the
  connection that was reading, the next delivery is neither the last one again nor the one
  after it. A move is the user's intent: order checking starts anew from there, and what
  the consumer finished before is no longer a replay (a seek backwards replays on purpose).
* a *replay*: a message this consumer already finished, delivered again after it
  reconnected (a new leader resumes from the consume offset the old one had synced to it);
* an *order violation*: if something is wrong, a message from before the last one seen (the
  internal id and the queue offset must never go backwards).
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["PartitionSequence"]


class PartitionSequence:
    """Per partition: the last message seen (and on which connection), and where the next
    unfinished one starts."""

    __slots__ = ("_finished_upto", "_last_seen")

    def __init__(self) -> None:
        # (internal id, offset, offset after it, the connection it came on)
        self._last_seen: dict[Hashable, tuple[int, int, int, object]] = {}
        self._finished_upto: dict[Hashable, tuple[int, int]] = {}  # (offset after, timestamp)

    def finished(self, partition: Hashable, offset: int, raw_size: int, timestamp: int) -> None:
        """A message of ``partition`` at queue ``offset`` (``raw_size`` bytes on disk,
        published at ``timestamp`` ns) was finished."""
        upto = offset + raw_size
        done = self._finished_upto.get(partition)
        if done is None or upto > done[0]:
            self._finished_upto[partition] = (upto, timestamp)

    def moved_from(
        self, partition: Hashable, lane: object, offset: int, replay: bool = False
    ) -> int | None:
        """Where ``partition`` was expected to go on (the queue offset after the last message
        seen) when a delivery on connection ``lane`` at ``offset`` shows that its channel was
        moved; None when it is in sequence (the last message again, or the next one).

        On the connection that delivered the last message, any other offset is a move. On a
        connection made since, nsqd starts where the channel is: further on is in order, and
        further back is a move unless it is a ``replay`` of what this consumer finished (a
        new leader resuming from the position the old one had synced)."""
        last = self._last_seen.get(partition)
        if last is None or last[1] < 0 or offset == last[1] or offset == last[2]:
            return None
        if last[3] is lane or (offset < last[2] and not replay):
            return last[2]
        return None

    def next_in_line(
        self,
        partition: Hashable,
        lane: object,
        internal_id: int,
        offset: int,
        raw_size: int,
        timestamp: int,
    ) -> bool:
        """The common case, in one call: a delivery on connection ``lane`` that is the next
        message after the last one seen on it (its offset follows that one's, its internal id
        is higher) and not one this consumer finished: recorded as :meth:`violation` would
        (it is no move, replay or violation). False: nothing is recorded, ask the other
        methods."""
        last = self._last_seen.get(partition)
        if last is None or last[3] is not lane or offset != last[2] or internal_id <= last[0]:
            return False
        if self.is_replay(partition, offset, timestamp):
            return False
        self._last_seen[partition] = (internal_id, offset, offset + raw_size, lane)
        return True

    def restart(self, partition: Hashable) -> None:
        """The channel of ``partition`` was moved: forget its sequence (what was finished is
        no replay now, and the next delivery is the new start)."""
        self._last_seen.pop(partition, None)
        self._finished_upto.pop(partition, None)

    def is_replay(self, partition: Hashable, offset: int, timestamp: int) -> bool:
        """Whether a delivery at ``offset`` is one this consumer finished before: below the
        next unfinished offset, and not newer than the last message finished (a topic
        deleted and created again restarts its offsets, with newer messages)."""
        done = self._finished_upto.get(partition)
        return done is not None and offset < done[0] and timestamp <= done[1]

    def violation(
        self,
        partition: Hashable,
        internal_id: int,
        offset: int,
        raw_size: int = 0,
        lane: object = None,
    ) -> str | None:
        """Record a delivery (on connection ``lane``); describe how it went backwards, or
        None when it did not. ``offset`` is -1 when the subscription carries no queue
        offsets."""
        last = self._last_seen.get(partition)
        self._last_seen[partition] = (internal_id, offset, offset + raw_size, lane)
        if last is None or internal_id == last[0]:
            return None
        if internal_id > last[0] and offset >= last[1]:
            return None
        return (
            f"partition {partition} went backwards: id {last[0]} -> {internal_id}, "
            f"offset {last[1]} -> {offset}"
        )
