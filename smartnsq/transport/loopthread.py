"""An asyncio event loop in a daemon thread, for blocking code that drives async code: the
blocking facade (``smartnsq.sync``) runs its clients on one, and so does the Spark source
(``smartnsq.spark``), whose methods Spark calls from plain threads.

Every call submits a coroutine to the loop (``run_coroutine_threadsafe``) and waits for its
outcome, so results and exceptions are the coroutine's own. Two calls are refused rather than
left to hang: from a process forked after the loop started (its thread is not there), and
from the loop's own thread (it would wait for itself). Stopping cancels what still runs on
the loop, lets it unwind (bounded), then closes the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from smartnsq.errors import ClientClosedError, ForkedClientError, NSQTimeoutError
from smartnsq.transport import loops

__all__ = ["GRACE", "LoopThread", "call_plain"]

log = logging.getLogger("smartnsq.sync")

T = TypeVar("T")

# Added to the async code's own time limits: only a blocked event loop ever runs into it.
GRACE = 5.0
# Unbounded waits wake up this often, so Ctrl-C works on every platform and a loop thread
# that died is noticed.
_SLICE = 0.5


class LoopThread:
    """An event loop in a daemon thread: the only place the async code it serves runs.

    Its guards: :meth:`check` refuses a call from a forked child (the thread does not
    survive ``os.fork()``: ForkedClientError) and from the loop's own thread (it would wait
    for the loop it blocks: RuntimeError); :meth:`run` gives up when the thread died.
    """

    def __init__(self, name: str) -> None:
        self.pid = os.getpid()
        self.loop = loops.new_event_loop()  # uvloop's when installed (smartnsq[uvloop])
        # Reentrant: close() may run in a signal handler that interrupted this same thread.
        self._lock = threading.RLock()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ident = self._thread.ident  # read per blocking call: no property on the way
        #: The loop thread's ident (what :meth:`in_loop_thread` compares, for a caller that
        #: inlines it on a path taken per call).
        self.ident = self._ident

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._ident

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                _cancel_remaining(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def check(self, what: str) -> None:
        """Refuse calls that cannot work: from a forked child, or from the loop itself."""
        if os.getpid() != self.pid:
            raise ForkedClientError(
                f"{what}: this client was created in process {self.pid} and is used in "
                f"process {os.getpid()}, and its event loop thread does not survive "
                "os.fork(): create the client after fork, in the worker process"
            )
        if self.in_loop_thread():
            raise RuntimeError(
                f"{what} was called from the client's own event loop thread (from a "
                "coroutine handler or another callback running on that loop): it would wait "
                "for the loop it blocks and deadlock. Call it from another thread, or use "
                "the async client in async code"
            )

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None, what: str) -> T:
        """Run ``coro`` on the loop and wait for it (at most ``timeout`` seconds; None waits
        until it ends). Its result is returned and its exception raised here, unchanged."""
        with self._lock:
            if self._stopping:
                coro.close()
                raise ClientClosedError(f"{what}: the client is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not future.done():
                wait = _SLICE
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise NSQTimeoutError(
                            f"{what} did not finish within {timeout} s: the client's event "
                            "loop looks blocked (blocking code in a coroutine handler?)"
                        )
                    wait = min(wait, remaining)
                concurrent.futures.wait((future,), wait)
                if not future.done() and not self._thread.is_alive():
                    raise ClientClosedError(f"{what}: the client's event loop thread is gone")
        except BaseException:
            future.cancel()  # cancels the task on the loop too
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._stopping:
                raise ClientClosedError(f"{what} was interrupted: the client closed") from None
            raise

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run a plain function on the loop (directly when already there: it cannot block)."""
        if self.in_loop_thread():
            return fn()
        return self.run(call_plain(fn), GRACE, what)

    def stop(self, timeout: float) -> bool:
        """Stop the loop (cancelling whatever still runs on it) and join its thread. True
        when the thread ended in time."""
        self._request_stop(None)
        if self.in_loop_thread():
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop_soon(self, closing: Callable[[], Awaitable[Any]]) -> None:
        """Run ``closing()`` on the loop (bounded), then stop it; do not wait. For garbage
        collection, which must never block."""
        self._request_stop(closing)

    def join(self, timeout: float) -> None:
        if not self.in_loop_thread():
            self._thread.join(timeout)

    def _request_stop(self, closing: Callable[[], Awaitable[Any]] | None) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            loop = self.loop
            if loop.is_closed():
                return
            if closing is None:
                loop.call_soon_threadsafe(loop.stop)
            else:
                asyncio.run_coroutine_threadsafe(_close_then_stop(closing), loop)


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does on exit: cancel leftover tasks and let them unwind (their
    waiters see a cancellation, reported as ClientClosedError). Bounded, and a task that
    misbehaves when cancelled cannot keep the others from being cancelled."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        try:
            task.cancel()
        except Exception:
            log.exception("cancelling %r failed", task)
    _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=GRACE))
    for task in pending:
        log.error("%r did not end within %s s of being cancelled", task, GRACE)


async def _close_then_stop(closing: Callable[[], Awaitable[Any]]) -> None:
    try:
        await asyncio.wait_for(closing(), GRACE)
    except Exception as exc:  # noqa: BLE001 - garbage collection path: nobody to tell
        log.debug("closing an abandoned client failed: %r", exc)
    finally:
        asyncio.get_running_loop().stop()


async def call_plain(fn: Callable[[], T]) -> T:
    """``fn()`` as a coroutine, to run it on the loop."""
    return fn()
