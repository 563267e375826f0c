"""Eager coroutine execution: no Task unless the coroutine really suspends, and from its
first line everything a task gives: a current task (asyncio.timeout, TaskGroup, shield,
anyio) and a context of its own."""

import asyncio
import contextvars
import sys
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from smartnsq.consumer.eager import EagerTask, run_eager

# asyncio.timeout and TaskGroup, which some handlers here use, exist from Python 3.11.
needs_311 = pytest.mark.skipif(sys.version_info < (3, 11), reason="asyncio.timeout, TaskGroup")


def _recorder() -> tuple[list[BaseException | None], Any]:
    seen: list[BaseException | None] = []
    return seen, lambda _arg, exc: seen.append(exc)


def _run(coro: Any, done: Any, arg: Any = None) -> EagerTask:
    return run_eager(asyncio.get_running_loop(), coro, done, arg)


def _tasks_now() -> set[asyncio.Task[Any]]:
    return set(asyncio.all_tasks())


async def test_synchronous_completion_creates_no_task() -> None:
    seen, done = _recorder()
    before = _tasks_now()

    async def handler() -> int:
        return 7

    task = _run(handler(), done)
    assert task.done()
    assert task.result() == 7
    assert seen == [None]
    assert _tasks_now() == before


async def test_synchronous_failure_is_reported() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        raise ValueError("bad message")

    task = _run(handler(), done)
    assert isinstance(seen[0], ValueError)
    assert isinstance(task.exception(), ValueError)


async def test_awaiting_a_done_future_stays_synchronous() -> None:
    seen, done = _recorder()
    future = asyncio.get_running_loop().create_future()
    future.set_result(3)

    async def handler() -> None:
        assert await future == 3

    assert _run(handler(), done).done()
    assert seen == [None]


async def test_suspension_continues_in_a_task() -> None:
    seen, done = _recorder()
    gate = asyncio.Event()
    order: list[str] = []

    async def handler() -> str:
        order.append("start")
        await gate.wait()
        await asyncio.sleep(0)  # a bare yield inside the task
        order.append("end")
        return "result"

    task = _run(handler(), done)
    assert not task.done()
    assert order == ["start"]  # ran synchronously up to the first suspension
    assert seen == []
    gate.set()
    assert await asyncio.wait_for(task, 1) == "result"
    assert order == ["start", "end"]
    assert seen == [None]


async def test_exception_after_suspension() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("late")

    task = _run(handler(), done)
    with pytest.raises(KeyError):
        await asyncio.wait_for(task, 1)
    assert isinstance(seen[0], KeyError)


async def test_cancellation_reaches_the_coroutine() -> None:
    seen, done = _recorder()
    cleaned = []

    async def handler() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(True)

    task = _run(handler(), done)
    await asyncio.sleep(0)
    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert cleaned == [True]
    assert isinstance(seen[0], asyncio.CancelledError)


async def test_a_cancel_requested_before_suspending_lands_at_the_first_await() -> None:
    seen, done = _recorder()
    reached = []

    async def handler() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        reached.append("after cancel")
        await asyncio.sleep(1)
        reached.append("not reached")

    task = _run(handler(), done)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1)
    assert reached == ["after cancel"]
    assert isinstance(seen[0], asyncio.CancelledError)


async def test_exceptions_thrown_in_are_catchable() -> None:
    seen, done = _recorder()
    future = asyncio.get_running_loop().create_future()

    async def handler() -> str:
        try:
            await future
        except RuntimeError:
            return "handled"
        return "not reached"

    task = _run(handler(), done)
    future.set_exception(RuntimeError("boom"))
    assert await asyncio.wait_for(task, 1) == "handled"
    assert seen == [None]


async def test_done_receives_the_argument() -> None:
    got: list[object] = []

    async def handler() -> None:
        return None

    _run(handler(), lambda arg, exc: got.append((arg, exc)), "message")
    assert got == [("message", None)]


async def test_context_variables_are_visible() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")
    var.set("outer")
    _, done = _recorder()
    values = []

    async def handler() -> None:
        values.append(var.get())
        await asyncio.sleep(0)
        values.append(var.get())

    await _run(handler(), done)
    assert values == ["outer", "outer"]


async def test_context_variables_do_not_leak_between_runs() -> None:
    """What one handler sets is its own, as with create_task (it leaked on 0.1)."""
    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
    seen: list[tuple[str, str | None]] = []
    _, done = _recorder()

    async def handler(name: str) -> None:
        seen.append((name, var.get()))
        var.set(name)

    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    def from_a_callback() -> None:  # as a connection's data_received runs handlers
        for name in ("m0", "m1", "m2"):
            _run(handler(name), done)
        finished.set_result(var.get())

    loop.call_soon(from_a_callback)
    assert await finished is None
    assert seen == [("m0", None), ("m1", None), ("m2", None)]
    assert var.get() is None


async def test_a_handler_has_a_current_task_from_its_first_line() -> None:
    seen: list[Any] = []
    _, done = _recorder()

    async def handler() -> None:
        first = asyncio.current_task()
        seen.append(first)
        await asyncio.sleep(0)
        seen.append(asyncio.current_task())

    loop = asyncio.get_running_loop()
    started = loop.create_future()
    loop.call_soon(lambda: started.set_result(_run(handler(), done)))
    task = await started
    await task
    assert seen[0] is task
    assert seen[1] is task
    assert asyncio.current_task() is not task  # the caller's is back


@needs_311
async def test_timeout_task_group_and_shield_work_before_the_first_await() -> None:
    outcome: dict[str, Any] = {}
    _, done = _recorder()

    async def handler() -> None:
        async with asyncio.timeout(5):  # RuntimeError outside a task
            await asyncio.sleep(0)
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(5)
        except TimeoutError:
            outcome["timed out"] = True
        async with asyncio.TaskGroup() as group:
            child = group.create_task(asyncio.sleep(0, "child"))
        outcome["group"] = child.result()
        outcome["shield"] = await asyncio.shield(asyncio.sleep(0, "shielded"))

    loop = asyncio.get_running_loop()
    started = loop.create_future()
    loop.call_soon(lambda: started.set_result(_run(handler(), done)))
    await asyncio.wait_for(await started, 2)
    assert outcome == {"timed out": True, "group": "child", "shield": "shielded"}


@needs_311
async def test_a_failing_task_group_child_cancels_the_handler() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(5))
            group.create_task(_fail_soon())

    task = _run(handler(), done)
    with pytest.raises(BaseExceptionGroup):
        await asyncio.wait_for(task, 2)
    assert isinstance(seen[0], BaseExceptionGroup)


async def _fail_soon() -> None:
    await asyncio.sleep(0.01)
    raise LookupError("child failed")


async def test_anyio_cancel_scopes_work_before_the_first_await() -> None:
    """httpx runs on anyio, whose cancel scopes need a current task (TypeError on 0.1)."""
    seen, done = _recorder()

    async def handler() -> str:
        with anyio.move_on_after(0.01) as scope:
            await anyio.sleep(5)
        assert scope.cancelled_caught
        with anyio.fail_after(1):
            await anyio.lowlevel.checkpoint()
        return "ok"

    loop = asyncio.get_running_loop()
    started = loop.create_future()
    loop.call_soon(lambda: started.set_result(_run(handler(), done)))
    assert await asyncio.wait_for(await started, 2) == "ok"
    assert seen == [None]


async def test_run_from_inside_another_task_restores_it() -> None:
    _, done = _recorder()
    inside: list[Any] = []

    async def handler() -> None:
        inside.append(asyncio.current_task())

    outer = asyncio.current_task()
    task = _run(handler(), done)  # called from a Task (an ordered turn passed on)
    assert inside == [task]
    assert asyncio.current_task() is outer


async def test_done_runs_outside_any_task_also_after_suspending() -> None:
    """An ordered partition's next turn starts from done(): with no task to step out of, it
    starts on the fast path (raising out of _enter_task cost about 5 µs per message)."""
    current: list[object] = []

    async def handler() -> None:
        await asyncio.sleep(0)

    task = _run(handler(), lambda _arg, _exc: current.append(asyncio.current_task()))
    await task
    assert current == [None]
