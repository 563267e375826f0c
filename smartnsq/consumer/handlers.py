"""Running a consumer's handler on a message.

A coroutine function runs eagerly, as a task (:mod:`smartnsq.consumer.eager`): no Task is created
unless it really waits, yet it has a current task and a context of its own from its first
line. A plain function runs in worker threads, each call in a copy of the context (as
``asyncio.to_thread`` would run it); what it returns, when awaitable (``lambda m:
process(m)`` with an async ``process``), is awaited on the loop as a coroutine handler runs,
and the message is answered once that is over. With OpenTelemetry on, each call is a
``process`` span, current inside the handler, that continues the producer's trace on ext
topics.

Plain functions are handed to the threads in batches (:class:`_ThreadPool`): the messages
released in one loop iteration go to a shared work queue at once, idle workers take them one
by one, and each worker reports what it handled with one ``call_soon_threadsafe`` per batch
of results. ``run_in_executor`` per message cost a future in each world, their chaining and
a wake-up of the loop per message (measured: ~29 µs of client CPU per message).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from smartnsq.client.telemetry import Telemetry, describe_process
from smartnsq.consumer.eager import run_eager
from smartnsq.consumer.message import Message

__all__ = ["Done", "Handler", "HandlerRunner", "is_coroutine_function"]

log = logging.getLogger("smartnsq.consumer")

Handler = Callable[[Message], Any]
# Called once a handler is over: (message, None) when it returned, (message, exc) if it raised.
Done = Callable[[Message, "BaseException | None"], None]
# A worker reports back after this many handled messages, or this long, whichever first (and
# whenever it runs out of work): a slow handler's answers do not wait for a whole batch.
RESULTS_EVERY = 64
RESULTS_AFTER = 0.002


def is_coroutine_function(handler: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


class HandlerRunner:
    """Runs ``handler`` on messages and calls ``done(message, exc)`` when each is over.
    Plain functions get up to ``threads`` worker threads (started lazily)."""

    def __init__(
        self,
        handler: Handler,
        *,
        topic: str,
        channel: str,
        threads: int,
        telemetry: Telemetry,
        metric_attributes: dict[str, str],
    ) -> None:
        self.handler = handler
        self.is_coroutine = is_coroutine_function(handler)
        self.topic = topic
        self.channel = channel
        self.threads = threads
        self.telemetry = telemetry
        self.metric_attributes = metric_attributes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: _ThreadPool | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if not self.is_coroutine:
            self._pool = _ThreadPool(
                self.handler, loop, self.threads, name=f"smartnsq-{self.topic}"
            )

    async def close(self, timeout: float = 5.0) -> bool:
        """Let handlers still running in threads finish, without blocking the loop (what
        waits for a thread is handed back unhandled: ``done(message, CancelledError)``);
        whether they did within ``timeout`` (0: do not wait). A handler still running
        after that finishes in its thread, which then exits."""
        pool, self._pool = self._pool, None
        if pool is None:
            return True
        exited = pool.shutdown()
        if exited is None or exited.done():
            return True
        if timeout <= 0:
            return False
        # asyncio.wait, not wait_for: the future stays for the threads to set later
        done, _ = await asyncio.wait((exited,), timeout=timeout)
        return bool(done)

    def starter(self, done: Done) -> Callable[[Message], None]:
        """What starts the handler on a message (``done`` is called when it is over): the
        shortest path for this handler and telemetry."""
        if not self.is_coroutine and not self.telemetry.enabled and self._pool is not None:
            submit = self._pool.submit
            copy_context = contextvars.copy_context

            def start_in_thread(message: Message) -> None:
                submit((copy_context(), message, done))  # the thread sees what a task would

            return start_in_thread
        if not self.is_coroutine or self.telemetry.enabled:
            return functools.partial(self.run, done=done)
        loop = self._loop
        handler = self.handler
        if loop is None:
            raise RuntimeError("HandlerRunner.starter() before start()")

        def start(message: Message) -> None:
            try:
                coro = handler(message)
            except Exception as exc:  # noqa: BLE001 - creating the coroutine is the handler's failure
                done(message, exc)
                return
            run_eager(loop, coro, done, message)

        return start

    def run(self, message: Message, done: Done) -> None:
        """Start the handler on ``message``; ``done`` is called when it is over (at once,
        when a coroutine handler never waits)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("HandlerRunner.run() before start()")
        token = None
        if self.telemetry.enabled:
            done, token = self._observe(message, done)
        try:
            if self.is_coroutine:
                try:
                    coro = self.handler(message)
                except Exception as exc:  # noqa: BLE001 - creating the coroutine is the handler's failure
                    done(message, exc)
                    return
                run_eager(loop, coro, done, message)
            elif self._pool is not None:
                # the thread sees what a task would (the process span too)
                self._pool.submit((contextvars.copy_context(), message, done))
            else:  # closed: unhandled, nsqd redelivers it
                done(message, asyncio.CancelledError())
        finally:
            if token is not None:
                Telemetry.detach(token)

    def _observe(self, message: Message, done: Done) -> tuple[Done, object | None]:
        """The ``process`` span around one call, current while the handler starts (the
        handler's context is copied from this one); returns what to call instead of
        ``done`` (it also records the duration and ends the span) and the token to
        detach once the handler has started."""
        telemetry = self.telemetry
        started = time.perf_counter()
        opened = telemetry.start_process(self.topic, self.channel, message.ext)
        if opened is None:
            span, token = None, None
        else:
            span, token = opened
            describe_process(span, message)
        attributes = self.metric_attributes

        def observed(message: Message, exc: BaseException | None) -> None:
            telemetry.handler_duration(time.perf_counter() - started, attributes)
            if span is not None:
                if exc is not None and not isinstance(exc, asyncio.CancelledError):
                    Telemetry.fail(span, exc)
                span.end()
            done(message, exc)

        return observed, token


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """An awaitable that is not a coroutine (a Future...), as one, for :func:`run_eager`."""
    return await awaitable


Work = tuple[contextvars.Context, Message, Done]
Result = tuple[Message, "BaseException | None", Done]


class _ThreadPool:
    """Up to ``threads`` worker threads (started as work waits and none is idle) running
    ``handler`` on messages, each call in the context that came with it.

    On the loop: :meth:`submit` collects what one loop iteration releases and hands it over
    at once (one wake-up of the idle workers per batch); ``done(message, exc)`` is called
    for each handled message, in batches (one ``call_soon_threadsafe`` per batch of
    results). SystemExit and KeyboardInterrupt raised by the handler are raised again on
    the loop, after ``done``.
    """

    def __init__(
        self, handler: Handler, loop: asyncio.AbstractEventLoop, threads: int, *, name: str
    ) -> None:
        self._handler = handler
        self._loop = loop
        self._threads = max(1, threads)
        self._name = name
        self._batch: list[Work] = []  # submitted in this loop iteration (loop side only)
        self._work: deque[Work] = deque()  # handed over, not taken by a worker yet
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._idle = 0  # workers waiting for work (under the lock)
        self._started = 0
        self._running = 0  # workers not exited yet (under the lock)
        self._closing = False
        self._exited: asyncio.Future[None] | None = None

    def submit(self, work: Work) -> None:
        """Run ``work`` in a thread (from the loop)."""
        batch = self._batch
        batch.append(work)
        if len(batch) == 1:
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        batch, self._batch = self._batch, []
        if self._closing:
            self._cancel(batch)
            return
        work = self._work
        work.extend(batch)
        with self._lock:
            idle = self._idle
            if idle:
                self._wake.notify(min(idle, len(batch)))
        # More threads while work waits that no idle one will take (up to the limit): a
        # handler that blocks must not hold up the messages behind it.
        for _ in range(min(len(work) - idle, self._threads - self._started)):
            self._start_worker()

    def _start_worker(self) -> None:
        self._started += 1
        with self._lock:
            self._running += 1
        thread = threading.Thread(
            target=self._worker, name=f"{self._name}_{self._started}", daemon=True
        )
        thread.start()

    def _worker(self) -> None:
        work = self._work
        take = work.popleft
        handler = self._handler
        isawaitable = inspect.isawaitable
        clock = time.monotonic
        results: list[Result] = []
        report_at = clock() + RESULTS_AFTER
        try:
            while True:
                try:
                    context, message, done = take()
                except IndexError:
                    if results:
                        self._report(results)
                        results = []
                    with self._lock:
                        while not work and not self._closing:
                            self._idle += 1
                            try:
                                self._wake.wait()
                            finally:
                                self._idle -= 1
                        if not work and self._closing:
                            return
                    report_at = clock() + RESULTS_AFTER
                    continue
                try:
                    returned = context.run(handler, message)
                except BaseException as exc:  # noqa: BLE001 - the handler's failure goes to done()
                    results.append((message, exc, done))
                else:
                    if returned is not None and isawaitable(returned):
                        # A plain function that made a coroutine (lambda m: process(m)):
                        # dropping it would FIN a message its code never saw. It runs on
                        # the loop, and done() comes when it is over.
                        done = functools.partial(self._await_on_loop, context, returned, done)
                    results.append((message, None, done))
                if len(results) >= RESULTS_EVERY or clock() >= report_at:
                    self._report(results)
                    results = []
                    report_at = clock() + RESULTS_AFTER
        finally:
            if results:
                self._report(results)
            with self._lock:
                self._running -= 1
                last = self._running == 0 and self._closing
            if last:
                self._call(self._all_exited)

    def _await_on_loop(
        self,
        context: contextvars.Context,
        awaitable: Awaitable[Any],
        done: Done,
        message: Message,
        exc: BaseException | None,
    ) -> None:
        """On the loop: what a handler returned, awaited as a coroutine handler runs (eagerly,
        as a task, in the context the handler ran in); ``done`` once it is over."""
        coro = awaitable if inspect.iscoroutine(awaitable) else _awaited(awaitable)
        context.run(run_eager, self._loop, coro, done, message)

    def _report(self, results: list[Result]) -> None:
        self._call(self._finished, results)

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is left to tell
            log.debug("%s: handler results after the loop closed", self._name)

    @staticmethod
    def _finished(results: list[Result]) -> None:
        """On the loop: ``done`` for each; SystemExit and KeyboardInterrupt raised by a
        handler go on up from here, once every result is delivered."""
        escaped: BaseException | None = None
        for message, exc, done in results:
            done(message, exc)
            if escaped is None and exc is not None and not isinstance(exc, Exception):
                escaped = exc
        if escaped is not None:
            raise escaped

    @staticmethod
    def _cancel(works: Any) -> None:
        for _context, message, done in works:
            done(message, asyncio.CancelledError())

    def _all_exited(self) -> None:
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(None)

    def shutdown(self) -> asyncio.Future[None] | None:
        """What waits for a thread is handed back (``done(message, CancelledError)``) now,
        and the threads exit once their running handlers finish: the future returned is
        set then (None: no thread is running)."""
        self._closing = True
        pending, self._batch = self._batch, []
        with self._lock:
            while self._work:
                pending.append(self._work.popleft())
            self._wake.notify_all()
            if self._running:
                self._exited = self._loop.create_future()
        self._cancel(pending)
        return self._exited
