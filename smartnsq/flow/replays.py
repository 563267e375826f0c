"""What an ordered consumer knows of the stamped messages it took (pure: no I/O).

A producer stamps each message it publishes to a partition of a youzan ext topic with its
id, the message's number in the partition and a floor
(:mod:`smartnsq.publishing.stamps`). Per partition and producer, a :class:`ReplayFilter`
keeps the highest floor seen (every number below it was settled by that producer: a message
of it delivered now is a copy of one already delivered, or one the producer gave up on) and
the numbers at or above it already taken. A delivery whose number is either is a *replay*:
the consumer FINs it without handing it to the handler.

A number is *claimed* when its delivery is taken for the handler, *finished* once the
handler succeeded (or gave up on it); a failed handler's requeue releases the claim, so
that its redelivery is taken again. Only finished numbers are kept by :meth:`snapshot`:
what a consumer that restores it after a restart must not hand over again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.publishing.stamps import Stamp

__all__ = ["ReplayFilter"]


class _Producer:
    """One producer's numbers in one partition."""

    __slots__ = ("claimed", "finished", "floor")

    def __init__(self, floor: int = 1) -> None:
        self.floor = floor
        self.finished: set[int] = set()
        self.claimed: set[int] = set()

    def raise_floor(self, floor: int) -> None:
        if floor > self.floor:
            self.floor = floor
            self.finished = {seq for seq in self.finished if seq >= floor}
            self.claimed = {seq for seq in self.claimed if seq >= floor}


class ReplayFilter:
    """The stamps an ordered consumer took, per partition and producer. ``producers``: the
    producers remembered per partition (the least recently seen is forgotten past it);
    ``window``: the numbers remembered per producer above its floor (a producer whose floor
    stopped rising, the lowest are forgotten past it)."""

    def __init__(self, *, producers: int = 1024, window: int = 65536) -> None:
        if type(producers) is not int or producers < 1:
            raise ValidationError("producers", "must be an int >= 1")
        if type(window) is not int or window < 1:
            raise ValidationError("window", "must be an int >= 1")
        self._producers = producers
        self._window = window
        self._partitions: dict[Hashable, OrderedDict[str, _Producer]] = {}

    def claim(self, partition: Hashable, stamp: Stamp) -> bool:
        """Whether a delivery stamped ``stamp`` is news (then claimed), or a replay."""
        state = self._state(partition, stamp.producer)
        state.raise_floor(stamp.floor)
        seq = stamp.seq
        if seq < state.floor or seq in state.finished or seq in state.claimed:
            return False
        state.claimed.add(seq)
        return True

    def finish(self, partition: Hashable, stamp: Stamp) -> None:
        """The claimed delivery was handled (or given up on): its number is taken for good."""
        state = self._state(partition, stamp.producer)
        state.claimed.discard(stamp.seq)
        if stamp.seq >= state.floor:
            finished = state.finished
            finished.add(stamp.seq)
            if len(finished) > self._window:
                state.raise_floor(min(finished) + 1)

    def release(self, partition: Hashable, stamp: Stamp) -> None:
        """The claimed delivery goes back to nsqd unhandled (a failed handler, a
        hand-back): its redelivery is news again."""
        producers = self._partitions.get(partition)
        state = producers.get(stamp.producer) if producers is not None else None
        if state is not None:
            state.claimed.discard(stamp.seq)

    def restart(self, partition: Hashable) -> None:
        """The channel was moved (a seek): what follows is the user's new start, replays
        included."""
        self._partitions.pop(partition, None)

    def _state(self, partition: Hashable, producer: str) -> _Producer:
        producers = self._partitions.get(partition)
        if producers is None:
            producers = self._partitions[partition] = OrderedDict()
        state = producers.get(producer)
        if state is None:
            state = producers[producer] = _Producer()
            if len(producers) > self._producers:
                producers.popitem(last=False)
        else:
            producers.move_to_end(producer)
        return state

    # ------------------------------------------------------------------ keeping it

    def snapshot(self) -> dict[str, Any]:
        """What was finished, as plain JSON data: ``{partition: {producer: [floor,
        [numbers...]]}}`` (partitions as strings). Give it to :meth:`restore` after a
        restart (keep it where the handler's own effects are kept)."""
        return {
            str(partition): {
                producer: [state.floor, sorted(state.finished)]
                for producer, state in producers.items()
            }
            for partition, producers in self._partitions.items()
        }

    @classmethod
    def restore(
        cls, data: Mapping[str, Mapping[str, Any]], *, producers: int = 1024, window: int = 65536
    ) -> ReplayFilter:
        """A filter that knows what :meth:`snapshot` said (partition keys back as ints
        where they are numbers)."""
        restored = cls(producers=producers, window=window)
        try:
            for key, states in data.items():
                partition: Hashable = int(key) if key.lstrip("-").isdigit() else key
                table: OrderedDict[str, _Producer] = OrderedDict()
                for producer, (floor, numbers) in states.items():
                    state = _Producer(int(floor))
                    state.finished = {int(n) for n in numbers}
                    table[str(producer)] = state
                restored._partitions[partition] = table
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValidationError("replay_filter", f"not a ReplayFilter snapshot: {exc}") from None
        return restored
