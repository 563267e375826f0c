"""How a fault proxy shapes one direction of a stream: pure decisions, no sockets, no clock
of their own (the proxy passes ``now``).

- :func:`directions`: ``"upstream"`` (client to server), ``"downstream"`` (server to client)
  or ``"both"``, checked;
- :class:`Latency`: when a chunk read at ``now`` may leave, with jitter, never before the
  chunk read before it (order is kept);
- :class:`Slicer`: cuts a stream into pieces of 1..N bytes at positions drawn from a seeded
  generator; a piece cut short by the end of a read goes on in the next read, so the cuts
  fall at the same stream positions however the reads split it;
- :class:`Throttle`: a byte rate, as the time each piece may be written;
- :class:`ByteLimit`: how much more may pass before the connection is closed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from smartnsq.errors import ValidationError

__all__ = [
    "DIRECTIONS",
    "DOWNSTREAM",
    "UPSTREAM",
    "ByteLimit",
    "Latency",
    "Slicer",
    "Throttle",
    "directions",
]

UPSTREAM = "upstream"  # client -> server
DOWNSTREAM = "downstream"  # server -> client
DIRECTIONS = (UPSTREAM, DOWNSTREAM)
_BOTH = "both"
# A throttled write is at most this share of a second's bytes, so a big read is spread.
_THROTTLE_SLICES = 50


def directions(direction: str) -> tuple[str, ...]:
    """``"upstream"``, ``"downstream"`` or ``"both"`` -> the directions it names."""
    if direction == _BOTH:
        return DIRECTIONS
    if direction in DIRECTIONS:
        return (direction,)
    raise ValidationError(
        "direction", f"expected 'upstream', 'downstream' or 'both', not {direction!r}"
    )


def _non_negative(field: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValidationError(field, f"must be a number >= 0, not {value!r}")
    return float(value)


def _positive_int(field: str, value: int) -> int:
    if type(value) is not int or value < 1:
        raise ValidationError(field, f"must be an int >= 1, not {value!r}")
    return value


class Latency:
    """A delay of ``seconds`` +- ``jitter`` (uniform) per chunk, order kept."""

    __slots__ = ("jitter", "seconds")

    def __init__(self, seconds: float, jitter: float = 0.0) -> None:
        self.seconds = _non_negative("seconds", seconds)
        self.jitter = _non_negative("jitter", jitter)

    def due(self, now: float, previous_due: float, rng: random.Random) -> float:
        """When a chunk read at ``now`` leaves: never before ``now``, nor before the chunk
        read before it (``previous_due``)."""
        delay = self.seconds
        if self.jitter:
            delay += rng.uniform(-self.jitter, self.jitter)
        return max(now + max(delay, 0.0), previous_due)


class Slicer:
    """Cuts a stream into pieces of 1..``max_size`` bytes, sizes drawn from ``rng``."""

    __slots__ = ("_left", "_rng", "max_size")

    def __init__(self, max_size: int, rng: random.Random) -> None:
        self.max_size = _positive_int("max_size", max_size)
        self._rng = rng
        self._left = 0  # bytes still owed to the piece begun in an earlier read

    def cut(self, data: bytes) -> Iterator[bytes]:
        """The pieces of ``data``, in order. A piece the read ends inside is finished by the
        next read's first piece."""
        view = memoryview(data)
        position = 0
        while position < len(view):
            if self._left == 0:
                self._left = self._rng.randint(1, self.max_size)
            size = min(self._left, len(view) - position)
            self._left -= size
            yield bytes(view[position : position + size])
            position += size


class Throttle:
    """``rate`` bytes per second: when each piece may be written. A connection sends at
    most a fiftieth of a second's bytes in one write (``piece_size``)."""

    __slots__ = ("_free_at", "rate")

    def __init__(self, rate: float) -> None:
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
            raise ValidationError("bytes_per_second", f"must be a number > 0, not {rate!r}")
        self.rate = float(rate)
        self._free_at = 0.0

    @property
    def piece_size(self) -> int:
        return max(1, int(self.rate / _THROTTLE_SLICES))

    def start(self, now: float, size: int) -> float:
        """When a piece of ``size`` bytes ready at ``now`` may be written; the link is busy
        with it for ``size / rate`` seconds from then."""
        start = max(now, self._free_at)
        self._free_at = start + size / self.rate
        return start


class ByteLimit:
    """``limit`` more bytes pass, then the connection is closed."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        if type(limit) is not int or limit < 0:
            raise ValidationError("nbytes", f"must be an int >= 0, not {limit!r}")
        self.left = limit

    def take(self, size: int) -> int:
        """How many of ``size`` bytes may still pass (the rest, and everything after, not)."""
        allowed = min(size, self.left)
        self.left -= allowed
        return allowed

    @property
    def reached(self) -> bool:
        return self.left == 0
