"""Run a coroutine eagerly, as a task: synchronously until it first suspends, then on in a
Task, with the guarantees of a task from its first line.

Most message handlers finish without ever waiting (or after awaiting something already
done); a Task for each would cost about 2 µs more per message than running the handler
directly. Python 3.12's eager tasks do the same at C level; this also works on 3.11, and
for a handler that never waits it costs less than they do (measured on 3.13: about 560 ns
compiled against 790 ns for ``asyncio.Task(..., eager_start=True)``). What a handler run this
way sees is what ``asyncio.create_task`` would give it:

* a context of its own: a copy of the caller's, so context variables set by one handler
  never leak into the next one (``contextvars``, as a Task copies it);
* a current task from its first line: :class:`EagerTask`, the same object until it is
  over (``asyncio.current_task()``), which ``asyncio.timeout``, ``asyncio.TaskGroup``,
  ``asyncio.shield``, anyio (httpx) and ``cancel()`` work with. Once the coroutine first
  suspends, a real Task carries it on and the view forwards to it; it is not an
  ``asyncio.Task`` instance, and ``asyncio.all_tasks()`` lists the carrying Task instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from smartnsq.protocol._build import compiled

__all__ = ["EagerTask", "run_eager"]

Done = Callable[[Any, "BaseException | None"], None]

_current_task = asyncio.current_task
# What a Task's step does around each resumption, for any object acting as a task (typed
# loosely: typeshed names Task, the C functions take any object).
_enter_task: Callable[[asyncio.AbstractEventLoop, Any], None] = asyncio.tasks._enter_task
_leave_task: Callable[[asyncio.AbstractEventLoop, Any], None] = asyncio.tasks._leave_task
_copy_context = contextvars.copy_context
_new = object.__new__
_OVER = object()  # the coroutine did not suspend
_RUNNING, _FINISHED, _CANCELLED, _FAILED = 0, 1, 2, 3


def run_eager(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], done: Done, arg: Any = None
) -> EagerTask:
    """Start ``coro`` now, as an :class:`EagerTask` in a copy of the current context.
    ``done(arg, exc)`` is called once it is over (``exc`` None on success), outside the
    task; an exception that is not an ``Exception`` (SystemExit, KeyboardInterrupt) is raised
    again after ``done``. (``arg`` saves callers a closure per call on hot paths.)"""
    context = _copy_context()
    task = _new(EagerTask)  # the fields a run needs; the rest when used (per message)
    task._loop = loop
    task._coro = coro
    task._context = context
    task._carrier = None
    task._state = _RUNNING
    task._extras = None
    outer = None
    try:
        _enter_task(loop, task)
    except RuntimeError:  # a Task is running this (an ordered turn passed on from one)
        outer = _current_task(loop)
        _leave_task(loop, outer)
        _enter_task(loop, task)
    error: BaseException | None = None
    try:
        yielded = context.run(coro.send, None)
        while yielded is None and task._extras is not None and task._extras.cancel_due:
            # cancel() from the coroutine itself, then a bare yield: a Task throws the
            # cancellation in at its next step.
            task._extras.cancel_due = False
            error = asyncio.CancelledError(task._extras.cancel_message)
            yielded = context.run(coro.throw, error)
            error = None
    except StopIteration as stop:
        task._result = stop.value
        yielded = _OVER
    except BaseException as exc:  # noqa: BLE001 - the coroutine's failure goes to done()
        error = exc
        yielded = _OVER
    finally:
        _leave_task(loop, task)
        if outer is not None:
            _enter_task(loop, outer)
    if yielded is not _OVER:
        task._carry_on(yielded, done, arg)
        return task
    if error is None and task._extras is None:
        task._state = _FINISHED
        done(arg, None)
        return task
    task._over(error)
    done(arg, error)
    if error is not None and not isinstance(error, (Exception, asyncio.CancelledError)):
        raise error  # SystemExit, KeyboardInterrupt: they stop the program, not the message
    return task


class _Extras:
    """What few eager tasks need: cancellations before the carrying Task, done callbacks,
    a name."""

    __slots__ = ("callbacks", "cancel_due", "cancel_message", "cancels", "name")

    def __init__(self) -> None:
        self.cancels = 0  # cancel() calls before the carrier existed
        self.cancel_due = False  # one of them is still to be delivered
        self.cancel_message: Any = None
        self.callbacks: list[tuple[Callable[[Any], object], contextvars.Context | None]] = []
        self.name: str | None = None


class EagerTask:
    """The task a coroutine started by :func:`run_eager` runs as: ``asyncio.current_task()``
    inside it, from its first line to its end. Until the coroutine first suspends it is
    driven synchronously; after that, a Task carries it on and this view forwards
    cancellation to it. Made only by :func:`run_eager`."""

    __slots__ = (
        "__weakref__",
        "_carrier",
        "_context",
        "_coro",
        "_extras",
        "_loop",
        "_result",
        "_state",
    )

    _loop: asyncio.AbstractEventLoop
    _coro: Coroutine[Any, Any, Any]
    _context: contextvars.Context
    _carrier: asyncio.Task[None] | None
    _state: int
    _result: Any  # the coroutine's value, or (failed) what it raised
    _extras: _Extras | None

    def _more(self) -> _Extras:
        extras = self._extras
        if extras is None:
            extras = self._extras = _Extras()
        return extras

    # ------------------------------------------------------------------ the task API

    def cancel(self, msg: Any = None) -> bool:
        """Request cancellation, as ``Task.cancel``: the coroutine gets ``CancelledError``
        at its next suspension."""
        if self._state:
            return False
        carrier = self._carrier
        if carrier is not None:
            return carrier.cancel(msg)
        extras = self._more()
        extras.cancels += 1
        extras.cancel_due = True
        extras.cancel_message = msg
        return True

    def cancelling(self) -> int:
        carrier = self._carrier
        own = self._extras.cancels if self._extras is not None else 0
        # Task.cancelling() and uncancel() exist from Python 3.11, like asyncio.timeout.
        return own + (carrier.cancelling() if carrier is not None else 0)  # type: ignore[attr-defined,unused-ignore]

    def uncancel(self) -> int:
        extras = self._extras
        if extras is not None and extras.cancels:
            extras.cancels -= 1
        elif self._carrier is not None:
            self._carrier.uncancel()  # type: ignore[attr-defined,unused-ignore]
        return self.cancelling()

    def done(self) -> bool:
        return self._state != _RUNNING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> Any:
        state = self._state
        if state == _RUNNING:
            raise asyncio.InvalidStateError("Result is not set.")
        if state == _CANCELLED:
            raise asyncio.CancelledError()
        if state == _FAILED:
            raise self._result
        return self._result

    def exception(self) -> BaseException | None:
        state = self._state
        if state == _RUNNING:
            raise asyncio.InvalidStateError("Exception is not set.")
        if state == _CANCELLED:
            raise asyncio.CancelledError()
        return self._result if state == _FAILED else None

    def add_done_callback(
        self, fn: Callable[[Any], object], *, context: contextvars.Context | None = None
    ) -> None:
        if self._state:
            self._loop.call_soon(fn, self, context=context)
        else:
            self._more().callbacks.append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], object]) -> int:
        extras = self._extras
        if extras is None:
            return 0
        kept = [entry for entry in extras.callbacks if entry[0] != fn]
        removed = len(extras.callbacks) - len(kept)
        extras.callbacks = kept
        return removed

    def get_coro(self) -> Coroutine[Any, Any, Any]:
        return self._coro

    def get_context(self) -> contextvars.Context:
        return self._context

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def get_name(self) -> str:
        extras = self._extras
        if extras is not None and extras.name is not None:
            return extras.name
        return f"smartnsq-handler-{id(self):x}"

    def set_name(self, value: object) -> None:
        self._more().name = str(value)

    def get_stack(self, *, limit: int | None = None) -> list[types.FrameType]:
        frame = getattr(self._coro, "cr_frame", None)
        return [frame] if frame is not None and limit != 0 else []

    def __await__(self) -> Generator[Any, None, Any]:
        """Wait for the coroutine to be over, from another task: its result, or what it
        raised (as awaiting a Task gives)."""
        if not self._state:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self.add_done_callback(functools.partial(_wake, waiter))
            yield from waiter
        return self.result()

    # Read by anyio (and thus httpx) when it delivers a cancellation.
    @property
    def _must_cancel(self) -> bool:
        carrier = self._carrier
        if carrier is None:
            return self._extras is not None and self._extras.cancel_due
        return bool(carrier._must_cancel)  # type: ignore[attr-defined]

    @property
    def _fut_waiter(self) -> Any:
        carrier = self._carrier
        return None if carrier is None else carrier._fut_waiter  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        state = ("running", "finished", "cancelled", "failed")[self._state]
        return f"<EagerTask {self.get_name()} {state} coro={self._coro!r}>"

    # ------------------------------------------------------------------ internals

    def _carry_on(self, yielded: Any, done: Done, arg: Any) -> None:
        """The coroutine suspended on ``yielded``: a Task carries it on from there."""
        extras = self._extras
        if extras is not None and extras.cancel_due and isinstance(yielded, asyncio.Future):
            extras.cancel_due = False
            yielded.cancel(extras.cancel_message)  # what a Task does to its waiter
        carry = _carry(self, yielded, done, arg)
        self._carrier = self._loop.create_task(carry, context=self._context)

    def _over(self, error: BaseException | None) -> None:
        if error is None:
            self._state = _FINISHED
        elif isinstance(error, asyncio.CancelledError):
            self._state = _CANCELLED
        else:
            self._state = _FAILED
            self._result = error
        extras = self._extras
        if extras is not None and extras.callbacks:
            callbacks, extras.callbacks = extras.callbacks, []
            for fn, context in callbacks:
                self._loop.call_soon(fn, self, context=context)


def _wake(waiter: asyncio.Future[None], _task: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _carry(task: EagerTask, yielded: Any, done: Done, arg: Any) -> None:
    try:
        task._result = await _resume(task, yielded)
    except BaseException as exc:
        task._over(exc)
        _done_outside(task, done, arg, exc)
        if not isinstance(exc, Exception):
            raise  # cancellation, SystemExit, KeyboardInterrupt go on up
        return
    task._over(None)
    _done_outside(task, done, arg, None)


def _done_outside(task: EagerTask, done: Done, arg: Any, exc: BaseException | None) -> None:
    """``done(arg, exc)`` outside the carrying Task, as run_eager calls it: a coroutine it
    starts (an ordered partition's next turn) then finds no task to step out of."""
    loop, carrier = task._loop, task._carrier
    _leave_task(loop, carrier)
    try:
        done(arg, exc)
    finally:
        _enter_task(loop, carrier)


@types.coroutine
def _resume(task: EagerTask, yielded: Any) -> Generator[Any, Any, Any]:
    """Hand what the coroutine yielded (the future it waits on) to the carrying Task, and
    pass every resumption (value or exception, cancellation included) back into it with
    ``task`` as the current task."""
    coro = task._coro
    loop = task._loop
    while True:
        throw: BaseException | None = None
        sent: Any = None
        try:
            sent = yield yielded
        except BaseException as exc:  # noqa: BLE001 - every resumption goes into coro
            throw = exc
        carrier = task._carrier
        if carrier is not None:
            _leave_task(loop, carrier)
        _enter_task(loop, task)
        try:
            yielded = coro.send(sent) if throw is None else coro.throw(throw)
        except StopIteration as stop:
            return stop.value
        finally:
            _leave_task(loop, task)
            if carrier is not None:
                _enter_task(loop, carrier)


# The compiled twin, where it was built (and SMARTNSQ_PURE is not set): the same steps, the
# first send into the coroutine done in C (no StopIteration, no context.run call).
pure_run_eager = run_eager
_twin = compiled("smartnsq.consumer._eager_speedups")
if _twin is not None:
    _twin.install(EagerTask, _enter_task, _leave_task, _current_task)
    run_eager = _twin.run_eager
