"""Run a coroutine eagerly: synchronously until it first suspends, and only then as a Task.

Most message handlers finish without ever waiting (or after awaiting something already
done); creating a Task for each would cost more than the handler. Python 3.12's
``asyncio.eager_task_factory`` does the same at C level; this works on 3.10 and 3.11.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

__all__ = ["run_eager"]

Done = Callable[[Any, BaseException | None], None]


def run_eager(
    coro: Coroutine[Any, Any, Any], done: Done, arg: Any = None
) -> asyncio.Task[None] | None:
    """Start ``coro`` now. ``done(arg, exc)`` is called once it finishes (``exc`` None on
    success); an exception that is not an ``Exception`` (SystemExit, KeyboardInterrupt) is
    raised again after ``done``. Returns the Task that carries on if the coroutine
    suspended, else None. (``arg`` saves callers a closure per call on hot paths.)"""
    try:
        yielded = coro.send(None)
    except StopIteration:
        done(arg, None)
        return None
    except BaseException as exc:  # the handler's failure goes to done()
        done(arg, exc)
        if not isinstance(exc, (Exception, asyncio.CancelledError)):
            raise  # SystemExit, KeyboardInterrupt: they stop the program, not the message
        return None
    return asyncio.get_running_loop().create_task(_finish(coro, yielded, done, arg))


async def _finish(coro: Coroutine[Any, Any, Any], yielded: Any, done: Done, arg: Any) -> None:
    try:
        await _resume(coro, yielded)
    except BaseException as exc:
        done(arg, exc)
        if not isinstance(exc, Exception):
            raise  # cancellation, SystemExit, KeyboardInterrupt go on up
        return
    done(arg, None)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Hand what ``coro`` yielded (the future it waits on) to the running Task and pass
    every resumption (value or exception, cancellation included) back into ``coro``."""
    while True:
        try:
            sent = yield yielded
        except BaseException as exc:  # noqa: BLE001 - every resumption goes into coro
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value
