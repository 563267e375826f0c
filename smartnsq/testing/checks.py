"""nsqlookupd's topic checks: when the leader lookupd makes a new topic writable.

youzan nsqlookupd writes a new topic's placement at once (its partitions have leaders), but
the leaders take writes only once a *full topic check* has enabled them. The checks run
(``NsqLookupCoordinator.checkTopics``, consistence/nsqlookup_coordinator.go, youzan/nsq
0.3.7-HA.1.13.0):

* when the nsqd nodes join, as the cluster starts;
* on a ticker of ``interval`` (``doCheckInterval``, 60 s), skipped when the last full check is
  more recent than ``interval``, so a tick soon after a requested check waits for the next;
* when asked: ``/topic/create`` asks for one (for a new topic, and again for an existing
  topic of the same settings), which runs about ``delay`` (0.9 s) later, unless the last full
  check is more recent than a tenth of ``interval`` (6 s): then the request is dropped.

So a topic created right after the cluster starts stays unwritable until a tick runs a check
(about 112 s: docs/protocol.md#topic-check-delay), and posting ``/topic/create`` again once
6 s have passed makes it writable about a second later.

Nothing here knows the topics: a check calls ``run_check``, and every check or dropped request
``changed``. Timers come from the loop given at :meth:`TopicChecks.start`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["CheckTimers", "TopicChecks"]


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


class CheckTimers(Protocol):
    """The event loop's clock and timers (an ``asyncio`` loop is one)."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Cancellable: ...


class TopicChecks:
    """The leader lookupd's topic checks (see the module doc)."""

    def __init__(
        self,
        *,
        interval: float,
        delay: float,
        run_check: Callable[[], None],
        changed: Callable[[], None],
    ) -> None:
        self.interval = interval
        self.delay = delay
        self.full_checks = 0  # how many ran (the one at start included)
        self.dropped_requests = 0  # requests too close to the last check
        self._run_check = run_check
        self._changed = changed  # told of every check and dropped request
        self._timers: CheckTimers | None = None
        self._last_full_check = 0.0
        self._pending: set[_Cancellable] = set()

    @property
    def min_gap(self) -> float:
        """A requested check closer than this to the last one is dropped."""
        return self.interval / 10

    def start(self, timers: CheckTimers) -> None:
        """The nodes joined: a full check runs, and the ticker starts."""
        self._timers = timers
        self._full_check()
        self._later(self.interval, self._tick)

    def stop(self) -> None:
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()
        self._timers = None

    def request(self) -> None:
        """A full check is asked for (``/topic/create``): it runs ``delay`` later unless the
        last one is too recent then."""
        if self._timers is not None:
            self._later(self.delay, self._requested)

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        timers = self._timers
        if timers is None:
            return
        handle: _Cancellable | None = None

        def fire() -> None:
            self._pending.discard(handle)
            callback()

        handle = timers.call_later(delay, fire)
        self._pending.add(handle)

    def _since_last(self) -> float:
        timers = self._timers
        return timers.time() - self._last_full_check if timers is not None else 0.0

    def _requested(self) -> None:
        if self._since_last() < self.min_gap:
            self.dropped_requests += 1
            self._changed()
            return
        self._full_check()

    def _tick(self) -> None:
        if self._since_last() >= self.interval:
            self._full_check()
        self._later(self.interval, self._tick)

    def _full_check(self) -> None:
        timers = self._timers
        if timers is None:
            return
        self._last_full_check = timers.time()
        self.full_checks += 1
        self._run_check()
        self._changed()
