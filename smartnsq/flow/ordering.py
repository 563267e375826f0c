"""What an ordered consumer knows about each partition's sequence (pure: no I/O).

youzan delivers an ordered partition strictly in queue order, one message at a time. Two
things can still come back: a message this consumer already finished (a new leader resumes
from the consume offset the old one had synced to it: a *replay*), and, if something is
wrong, a message from before the last one seen (an *order violation*: the internal id and
the queue offset must never go backwards; a redelivery of the same message is fine).
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["PartitionSequence"]


class PartitionSequence:
    """Per partition: the last message seen, and where the next unfinished one starts."""

    __slots__ = ("_finished_upto", "_last_seen")

    def __init__(self) -> None:
        self._last_seen: dict[Hashable, tuple[int, int]] = {}  # (internal id, offset)
        self._finished_upto: dict[Hashable, tuple[int, int]] = {}  # (offset after, timestamp)

    def finished(self, partition: Hashable, offset: int, raw_size: int, timestamp: int) -> None:
        """A message of ``partition`` at queue ``offset`` (``raw_size`` bytes on disk,
        published at ``timestamp`` ns) was finished."""
        upto = offset + raw_size
        done = self._finished_upto.get(partition)
        if done is None or upto > done[0]:
            self._finished_upto[partition] = (upto, timestamp)

    def is_replay(self, partition: Hashable, offset: int, timestamp: int) -> bool:
        """Whether a delivery at ``offset`` is one this consumer finished before: below the
        next unfinished offset, and not newer than the last message finished (a topic
        deleted and created again restarts its offsets, with newer messages)."""
        done = self._finished_upto.get(partition)
        return done is not None and offset < done[0] and timestamp <= done[1]

    def violation(self, partition: Hashable, internal_id: int, offset: int) -> str | None:
        """Record a delivery; describe how it went backwards, or None when it did not.
        ``offset`` is -1 when the subscription carries no queue offsets."""
        last = self._last_seen.get(partition)
        self._last_seen[partition] = (internal_id, offset)
        if last is None or internal_id == last[0]:
            return None
        if internal_id > last[0] and offset >= last[1]:
            return None
        return (
            f"partition {partition} went backwards: id {last[0]} -> {internal_id}, "
            f"offset {last[1]} -> {offset}"
        )
