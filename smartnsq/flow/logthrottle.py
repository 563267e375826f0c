"""Rate limits for repeated log records: a storm of the same failure (a handler failing on
every message, a node that refuses every reconnection) logs once per interval, with the
count of what was held back, instead of flooding the log."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

__all__ = ["LogThrottle"]


class LogThrottle:
    """Lets one record per key through every ``interval`` seconds.

    :meth:`allow` returns None when the record must be held back, else how many records of
    that key were held back since the last one let through (0 for the first)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] | None = None):
        self.interval = interval
        # Read from the time module when made (a simulation stands in for its clocks).
        self._clock = clock if clock is not None else time.monotonic
        self._next: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        now = self._clock()
        if now < self._next.get(key, float("-inf")):
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._next[key] = now + self.interval
        return self._held.pop(key, 0)

    @staticmethod
    def note(held: int, interval: float) -> str:
        """The suffix telling how many similar records were held back."""
        if not held:
            return ""
        similar = "1 similar record" if held == 1 else f"{held} similar records"
        return f" ({similar} in the last {interval:g} s not shown)"
