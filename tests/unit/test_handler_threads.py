"""Plain-function handlers run in worker threads, handed over and reported in batches."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest

from smartnsq.client.telemetry import Telemetry
from smartnsq.consumer.handlers import HandlerRunner
from smartnsq.consumer.message import Message

WHO = contextvars.ContextVar("who", default="nobody")


def _message(n: int) -> Message:
    return Message(0, 1, n.to_bytes(16, "big"), None, None, 0, None, None, None, b"body")


def _runner(handler: Any, threads: int) -> HandlerRunner:
    return HandlerRunner(
        handler,
        topic="t",
        channel="c",
        threads=threads,
        telemetry=Telemetry("consumer"),
        metric_attributes={},
    )


class Results:
    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.seen: list[tuple[Message, BaseException | None]] = []
        self.all_done = asyncio.get_running_loop().create_future()

    def __call__(self, message: Message, exc: BaseException | None) -> None:
        self.seen.append((message, exc))
        if len(self.seen) == self.expected and not self.all_done.done():
            self.all_done.set_result(None)


async def test_results_come_back_in_batches_not_one_wake_up_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    calls = 0
    original = loop.call_soon_threadsafe

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
    handled: list[int] = []
    runner = _runner(lambda message: handled.append(message.attempts), threads=4)
    runner.start(loop)
    results = Results(500)
    start = runner.starter(results)
    for n in range(500):
        start(_message(n))
    await asyncio.wait_for(results.all_done, 10)
    assert len(handled) == 500
    assert all(exc is None for _, exc in results.seen)
    assert {m.id for m, _ in results.seen} == {_message(n).id for n in range(500)}
    assert calls <= 50, f"{calls} wake-ups of the loop for 500 messages"
    assert await runner.close()


async def test_each_call_runs_in_a_copy_of_the_context_it_was_started_in() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    def handler(message: Message) -> None:
        seen.append(WHO.get())
        WHO.set("handler")  # never leaks into the next call

    runner = _runner(handler, threads=1)
    runner.start(loop)
    results = Results(3)
    start = runner.starter(results)
    WHO.set("loop")
    for n in range(3):
        start(_message(n))
    await asyncio.wait_for(results.all_done, 10)
    assert seen == ["loop", "loop", "loop"]
    assert WHO.get() == "loop"
    assert await runner.close()


async def test_handlers_run_concurrently_up_to_the_threads() -> None:
    loop = asyncio.get_running_loop()
    barrier = threading.Barrier(4, timeout=10)
    runner = _runner(lambda message: barrier.wait(), threads=4)
    runner.start(loop)
    results = Results(8)
    start = runner.starter(results)
    for n in range(8):
        start(_message(n))
        await asyncio.sleep(0)  # separate hand-overs: threads start as work waits
    await asyncio.wait_for(results.all_done, 10)
    assert all(exc is None for _, exc in results.seen)  # no broken barrier: 4 at once
    assert await runner.close()


async def test_one_hand_over_of_blocking_handlers_gets_all_the_threads() -> None:
    """Eight messages released at once, each handler waiting for the others: eight threads
    start, or the ones queued behind the first would wait forever."""
    loop = asyncio.get_running_loop()
    barrier = threading.Barrier(8, timeout=10)
    runner = _runner(lambda message: barrier.wait(), threads=8)
    runner.start(loop)
    results = Results(8)
    start = runner.starter(results)
    for n in range(8):
        start(_message(n))
    await asyncio.wait_for(results.all_done, 15)
    assert all(exc is None for _, exc in results.seen)
    assert await runner.close()


async def test_a_failure_is_reported_with_its_message() -> None:
    loop = asyncio.get_running_loop()

    def handler(message: Message) -> None:
        if message.id == _message(1).id:
            raise ValueError("bad")

    runner = _runner(handler, threads=2)
    runner.start(loop)
    results = Results(3)
    start = runner.starter(results)
    for n in range(3):
        start(_message(n))
    await asyncio.wait_for(results.all_done, 10)
    failed = {m.id: exc for m, exc in results.seen}
    assert isinstance(failed[_message(1).id], ValueError)
    assert failed[_message(0).id] is None
    assert failed[_message(2).id] is None
    assert await runner.close()


async def test_close_hands_back_what_waits_and_lets_the_running_handler_finish() -> None:
    loop = asyncio.get_running_loop()
    entered = threading.Event()
    release = threading.Event()

    def handler(message: Message) -> None:
        entered.set()
        release.wait(10)

    runner = _runner(handler, threads=1)
    runner.start(loop)
    results = Results(3)
    start = runner.starter(results)
    for n in range(3):
        start(_message(n))
    await loop.run_in_executor(None, entered.wait, 10)
    closing = asyncio.ensure_future(runner.close(timeout=10))
    await asyncio.sleep(0.05)
    assert not closing.done()  # the running handler is waited for
    cancelled = [m for m, exc in results.seen if isinstance(exc, asyncio.CancelledError)]
    assert len(cancelled) == 2  # the two waiting: unhandled, nsqd redelivers them
    release.set()
    assert await closing
    await asyncio.wait_for(results.all_done, 10)
    assert [exc for m, exc in results.seen if m.id == _message(0).id] == [None]
    start(_message(9))  # after close: handed back at once
    await asyncio.sleep(0.01)
    assert isinstance(results.seen[-1][1], asyncio.CancelledError)


async def test_a_coroutine_a_plain_function_returns_is_awaited_on_the_loop() -> None:
    """``lambda m: process(m)`` with an async ``process``: called in a thread, its coroutine
    runs on the loop, as a task, in the context the function ran in; the message is over
    when the coroutine is, not when the function returned it."""
    loop = asyncio.get_running_loop()
    ran: list[Any] = []
    started, proceed = asyncio.Event(), asyncio.Event()

    async def process(message: Message) -> None:
        ran.append((threading.get_ident(), asyncio.current_task() is not None, WHO.get()))
        started.set()
        await proceed.wait()
        ran.append(message.attempts)

    def handler(message: Message) -> Any:
        WHO.set("the function")
        return process(message)

    runner = _runner(handler, threads=2)
    runner.start(loop)
    results = Results(1)
    runner.starter(results)(_message(0))
    await asyncio.wait_for(started.wait(), 10)
    assert ran == [(threading.get_ident(), True, "the function")]
    assert results.seen == []  # not over while the coroutine waits
    proceed.set()
    await asyncio.wait_for(results.all_done, 10)
    assert ran[1:] == [1]
    assert [(m.id, exc) for m, exc in results.seen] == [(_message(0).id, None)]
    assert await runner.close()


async def test_a_returned_coroutine_that_raises_fails_its_message() -> None:
    loop = asyncio.get_running_loop()

    async def process(message: Message) -> None:
        raise ValueError("bad")

    future: asyncio.Future[str] = loop.create_future()
    loop.call_soon(future.set_result, "done")

    def handler(message: Message) -> Any:
        # any awaitable is awaited, a Future too (made on the loop, handed over)
        return process(message) if message.id == _message(0).id else future

    runner = _runner(handler, threads=1)
    runner.start(loop)
    results = Results(2)
    start = runner.starter(results)
    start(_message(0))
    start(_message(1))
    await asyncio.wait_for(results.all_done, 10)
    outcome = {m.id: exc for m, exc in results.seen}
    assert isinstance(outcome[_message(0).id], ValueError)
    assert outcome[_message(1).id] is None
    assert await runner.close()


async def test_close_with_no_time_left_returns_at_once_and_the_threads_still_exit() -> None:
    """A consumer's close() gives the threads what is left of its timeout, possibly nothing:
    the waiting work is handed back at once, close returns without waiting, and the thread
    exits once its handler returns."""
    loop = asyncio.get_running_loop()
    entered = threading.Event()
    release = threading.Event()

    def handler(message: Message) -> None:
        entered.set()
        release.wait(10)

    runner = _runner(handler, threads=1)
    runner.start(loop)
    results = Results(2)
    start = runner.starter(results)
    start(_message(0))
    start(_message(1))
    assert await loop.run_in_executor(None, entered.wait, 10)
    workers = [t for t in threading.enumerate() if t.name.startswith("smartnsq-t_")]
    assert len(workers) == 1
    assert not await runner.close(timeout=0)
    assert [(m.id, type(exc)) for m, exc in results.seen] == [
        (_message(1).id, asyncio.CancelledError)
    ]
    release.set()
    await asyncio.wait_for(results.all_done, 10)
    await loop.run_in_executor(None, workers[0].join, 10)
    assert not workers[0].is_alive()
