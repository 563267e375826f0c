"""Change notification of the embedded cluster: whatever changes something observable
(a message stored, delivered or finished, a client gone, a leader moved) calls
:meth:`Changes.changed`, and :meth:`Changes.wait_for` re-checks its predicate then.

It costs nothing while nobody waits: ``changed()`` runs on every PUB and FIN.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from smartnsq.testing.errors import ClusterError

__all__ = ["Changes"]

# wait_for also re-checks this often: timers (timeouts, deferrals) change state too.
_RECHECK = 0.05


class Changes:
    """Wakes the waiters of :meth:`wait_for` when the cluster changes."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._waiters = 0

    def start(self) -> None:
        """Bind to the running event loop (the cluster starts)."""
        self._event = asyncio.Event()

    def changed(self) -> None:
        """Something observable changed: wake waiters."""
        if self._waiters and self._event is not None:
            self._event.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait until ``predicate()`` is true, re-checking on every change.

        Raises ``TimeoutError`` (``asyncio.TimeoutError``) if it does not become true in time.
        """
        event = self._event
        if event is None:
            raise ClusterError("cluster not started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._waiters += 1
        try:
            while not predicate():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"condition not met within {timeout} s")
                event.clear()
                # asyncio.wait, not wait_for: before Python 3.12 wait_for can lose a
                # cancellation that comes as the event is set, and this loop would go on.
                waiter = asyncio.ensure_future(event.wait())
                try:
                    await asyncio.wait((waiter,), timeout=min(remaining, _RECHECK))
                finally:
                    waiter.cancel()
        finally:
            self._waiters -= 1
