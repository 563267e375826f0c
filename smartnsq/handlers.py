"""Running a consumer's handler on a message.

A coroutine function runs eagerly, as a task (:mod:`smartnsq.eager`): no Task is created
unless it really waits, yet it has a current task and a context of its own from its first
line. A plain function runs in a thread pool, in a copy of the context (as
``asyncio.to_thread`` would run it). With OpenTelemetry on, each call is a ``process`` span,
current inside the handler, that continues the producer's trace on ext topics.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

from smartnsq.eager import run_eager
from smartnsq.message import Message
from smartnsq.telemetry import Telemetry, describe_process

__all__ = ["Done", "Handler", "HandlerRunner", "is_coroutine_function"]

Handler = Callable[[Message], Any]
# Called once a handler is over: (message, None) when it returned, (message, exc) if it raised.
Done = Callable[[Message, "BaseException | None"], None]


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
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if not self.is_coroutine:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.threads, thread_name_prefix=f"smartnsq-{self.topic}"
            )

    async def close(self, timeout: float = 5.0) -> bool:
        """Let handlers still running in threads finish, without blocking the loop;
        whether they did within ``timeout``."""
        executor, self._executor = self._executor, None
        if executor is None:
            return True
        shutdown = functools.partial(executor.shutdown, wait=True, cancel_futures=True)
        try:
            await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(None, shutdown), timeout
            )
        except asyncio.TimeoutError:
            return False
        return True

    def starter(self, done: Done) -> Callable[[Message], None]:
        """What starts the handler on a message (``done`` is called when it is over): the
        shortest path for this handler and telemetry."""
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
            elif self._executor is not None:
                run = contextvars.copy_context().run  # the thread sees what a task would
                future = loop.run_in_executor(self._executor, run, self.handler, message)
                future.add_done_callback(functools.partial(_thread_done, done, message))
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


def _thread_done(done: Done, message: Message, future: asyncio.Future[Any]) -> None:
    """A handler run in a thread is over: ``done(message, exc)``. SystemExit and
    KeyboardInterrupt raised by the handler are raised again, on the loop."""
    exc = asyncio.CancelledError() if future.cancelled() else future.exception()
    done(message, exc)
    if exc is not None and not isinstance(exc, (Exception, asyncio.CancelledError)):
        raise exc
