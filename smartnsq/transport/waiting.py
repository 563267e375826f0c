"""Waiting for an event, with a timeout, in a loop that must stay cancellable.

``asyncio.wait_for`` before Python 3.12 can swallow a cancellation that arrives as the
awaited thing completes (the caller's ``cancel()`` is then lost): a task that waits in a
``while`` loop goes on forever, and ``asyncio.run`` hangs on exit waiting for it. This waits
with ``asyncio.wait``, which never swallows the caller's cancellation.
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds."""
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait((waiter,), timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)
