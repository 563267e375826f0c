"""Reading an exact range of a youzan partition's queue: which deliveries belong to it, when
it is complete, and its messages in queue order. Pure: it is fed (offset, raw size) pairs and
answers; the reader in ``smartnsq.transport.ranges`` does the I/O.

A range ``[start, end)`` holds the messages whose queue offset lies in it. Offsets are byte
positions; a message's successor starts at ``offset + raw_size``, so the messages form a
chain, and the range is complete once the chain runs unbroken from its first message to the
first position at or past ``end``. What nsqd delivers after a seek is not that chain in order
(``channel_setoffset.txt``: messages still passing through nsqd's requeue paths come out in
any order): copies, messages before the start (stragglers from the old position, or a
deliberate look-behind), messages past the end. The chain keeps each message of the range
once and hands them out in offset order as soon as the prefix before them is there.

Where the range really begins (its *anchor*) must be proven, not guessed: the first message
received may not be the first of the range. ``start`` itself is proven a message boundary by a
message at ``start``, by one ending at ``start``, or by the caller (the queue's start and end,
which ``/stats`` gives, are boundaries; so is any offset the caller saw end a message). A ``start``
inside a message (a capped micro-batch ends wherever the cap falls; nsqd's seek lands on the next
boundary: docs/protocol.md#reading-after-a-seek) is proven by the message that straddles it: the
range then begins where that message ends. Hence :meth:`RangeChain.seek_position`: where to seek so
that such a proof arrives, a little before ``start`` while it is unproven.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from smartnsq.errors import ValidationError

__all__ = ["DEFAULT_LOOK_BEHIND", "OffsetRange", "Placement", "RangeChain"]

T = TypeVar("T")

# Bytes read before an unproven start: covers the message straddling it for messages up to
# this size on disk; larger ones widen it (RangeChain.widen).
DEFAULT_LOOK_BEHIND = 4096
_WIDEN_FACTOR = 8


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """``[start, end)`` in the queue of ``partition`` (byte offsets, ``0 <= start <= end``)."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        for name in ("partition", "start", "end"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValidationError(name, f"must be an int >= 0, got {value!r}")
        if self.end < self.start:
            raise ValidationError("end", f"{self.end} is before the start {self.start}")

    @property
    def empty(self) -> bool:
        return self.end == self.start


class Placement(enum.Enum):
    """What a delivery is to the range. Every placement but AFTER can be finished on nsqd at
    once (the range holds it, or it lies before the range); what lies after belongs to the
    next range, and leaving it unfinished keeps the channel's position at this range's end."""

    KEPT = "kept"  # in the range, the first time: it will be handed out
    DUPLICATE = "duplicate"  # in the range, already held or handed out
    BEFORE = "before"  # before the start (it may prove where the range begins)
    AFTER = "after"  # at or past the end


class RangeChain(Generic[T]):
    """The messages of one range, from deliveries in any order, each handed out once.

    ``known_boundaries``: offsets the caller knows to be message boundaries (the queue's
    start and end from ``/stats``, offsets seen ending a message). ``look_behind``: bytes to
    read before an unproven start. ``T`` is whatever the caller keeps per message.
    """

    def __init__(
        self,
        start: int,
        end: int,
        *,
        known_boundaries: Iterable[int] = (),
        look_behind: int = DEFAULT_LOOK_BEHIND,
    ) -> None:
        OffsetRange(0, start, end)  # checks the bounds
        if type(look_behind) is not int or look_behind < 1:
            raise ValidationError("look_behind", "must be an int >= 1")
        self.start = start
        self.end = end
        self.look_behind = look_behind
        self._anchor: int | None = None
        self._frontier = start  # the next offset to hand out (meaningful once anchored)
        self._held: dict[int, tuple[int, T]] = {}  # offset -> (raw size, item), past a gap
        self._ready: list[T] = []
        self.kept = 0
        self.duplicates = 0
        self.outside = 0
        for boundary in known_boundaries:
            self.note_boundary(boundary)

    # ------------------------------------------------------------------ state

    @property
    def anchor(self) -> int | None:
        """Where the range begins (the first message boundary at or after ``start``), once
        proven."""
        return self._anchor

    @property
    def frontier(self) -> int | None:
        """The offset of the next message needed (everything before it has arrived), once
        the anchor is proven. At or past ``end``: complete."""
        return None if self._anchor is None else self._frontier

    @property
    def complete(self) -> bool:
        return self._anchor is not None and self._frontier >= self.end

    @property
    def buffered(self) -> int:
        """Messages received and not yet taken (held past a gap, or ready)."""
        return len(self._held) + len(self._ready)

    @property
    def ready(self) -> int:
        """Messages :meth:`take` would hand out now."""
        return len(self._ready)

    def seek_position(self, queue_start: int = 0) -> int:
        """Where a (re)read should seek: the frontier once anchored (a proven boundary, so
        nothing received so far is read again), else ``look_behind`` bytes before the start,
        not before the queue's first message."""
        if self._anchor is not None:
            return self._frontier
        return max(queue_start, self.start - self.look_behind, 0)

    def widen(self) -> None:
        """The look-behind did not reach the message straddling the start (it is larger than
        ``look_behind``): read further back next time."""
        self.look_behind *= _WIDEN_FACTOR

    # ------------------------------------------------------------------ feeding

    def note_boundary(self, offset: int) -> None:
        """``offset`` is known to be a message boundary (or the queue's end)."""
        if self._anchor is None and offset == self.start:
            self._anchor_at(offset)

    def limit_end(self, end: int) -> None:
        """The queue ends before ``end`` (what was planned is not there any more): the range
        stops at ``end``."""
        if end < self.end:
            self.end = max(end, self.start)
            for offset in [o for o in self._held if o >= self.end]:
                del self._held[offset]

    def offer(self, offset: int, raw_size: int, item: T) -> Placement:
        """A delivery of the message at ``offset`` (``raw_size`` bytes on disk)."""
        following = offset + raw_size
        if self._anchor is None and offset <= self.start <= following:
            # A message at the start, or one ending at or straddling it: the range begins
            # at the first boundary at or after the start.
            self._anchor_at(self.start if offset == self.start else following)
        if offset < self.start:
            self.outside += 1
            return Placement.BEFORE
        if offset >= self.end:
            self.outside += 1
            return Placement.AFTER
        anchor = self._anchor
        if (anchor is not None and offset < self._frontier) or offset in self._held:
            self.duplicates += 1
            return Placement.DUPLICATE
        self.kept += 1
        if offset == self._frontier and anchor is not None:
            self._ready.append(item)
            self._frontier = following
            if self._held:
                self._advance()
        else:
            self._held[offset] = (raw_size, item)
        return Placement.KEPT

    def take(self) -> list[T]:
        """The messages that follow the last ones taken without a gap, in offset order."""
        ready, self._ready = self._ready, []
        return ready

    # ------------------------------------------------------------------ internals

    def _anchor_at(self, offset: int) -> None:
        self._anchor = offset
        self._frontier = offset
        # Received before the proof: messages between the start and the anchor cannot
        # exist (the anchor is the first boundary), so all that is held lies at or after it.
        self._advance()

    def _advance(self) -> None:
        held = self._held
        frontier = self._frontier
        ready = self._ready
        end = self.end
        while frontier < end and frontier in held:
            size, item = held.pop(frontier)
            ready.append(item)
            frontier += size
        self._frontier = frontier
