"""Eager coroutine execution: no Task unless the coroutine really suspends."""

import asyncio
import contextvars

import pytest

from smartnsq._eager import run_eager


def _recorder() -> tuple[list[BaseException | None], object]:
    seen: list[BaseException | None] = []
    return seen, lambda _arg, exc: seen.append(exc)


async def test_synchronous_completion_creates_no_task() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        return None

    assert run_eager(handler(), done) is None  # type: ignore[arg-type]
    assert seen == [None]


async def test_synchronous_failure_is_reported() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        raise ValueError("bad message")

    assert run_eager(handler(), done) is None  # type: ignore[arg-type]
    assert isinstance(seen[0], ValueError)


async def test_awaiting_a_done_future_stays_synchronous() -> None:
    seen, done = _recorder()
    future = asyncio.get_running_loop().create_future()
    future.set_result(3)

    async def handler() -> None:
        assert await future == 3

    assert run_eager(handler(), done) is None  # type: ignore[arg-type]
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

    task = run_eager(handler(), done)  # type: ignore[arg-type]
    assert task is not None
    assert order == ["start"]  # ran synchronously up to the first suspension
    assert seen == []
    gate.set()
    await asyncio.wait_for(task, 1)
    assert order == ["start", "end"]
    assert seen == [None]


async def test_exception_after_suspension() -> None:
    seen, done = _recorder()

    async def handler() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("late")

    task = run_eager(handler(), done)  # type: ignore[arg-type]
    assert task is not None
    await asyncio.wait_for(task, 1)  # the failure goes to done(), not to the task
    assert isinstance(seen[0], KeyError)


async def test_cancellation_reaches_the_coroutine() -> None:
    seen, done = _recorder()
    cleaned = []

    async def handler() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(True)

    task = run_eager(handler(), done)  # type: ignore[arg-type]
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]
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

    task = run_eager(handler(), done)  # type: ignore[arg-type]
    future.set_exception(RuntimeError("boom"))
    assert task is not None
    await asyncio.wait_for(task, 1)
    assert seen == [None]


async def test_done_receives_the_argument() -> None:
    got: list[object] = []

    async def handler() -> None:
        return None

    run_eager(handler(), lambda arg, exc: got.append((arg, exc)), "message")
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

    task = run_eager(handler(), done)  # type: ignore[arg-type]
    assert task is not None
    await task
    assert values == ["outer", "outer"]
