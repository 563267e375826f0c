"""wait_event: a loop that waits for an event with a timeout stays cancellable, also when
the cancellation comes as the event is set (asyncio.wait_for before Python 3.12 loses it,
and the loop goes on forever: the consumer's supervisor hung asyncio.run's exit)."""

from __future__ import annotations

import asyncio

from smartnsq.transport.waiting import wait_event


async def test_set_within_the_timeout_or_not() -> None:
    event = asyncio.Event()
    assert not await wait_event(event, 0.01)
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 5)
    assert await wait_event(event, 0)  # already set


async def test_a_cancellation_as_the_event_is_set_is_not_lost() -> None:
    event = asyncio.Event()
    rounds = 0

    async def supervise() -> None:
        nonlocal rounds
        while True:
            event.clear()
            rounds += 1
            await wait_event(event, 10)

    task = asyncio.create_task(supervise())
    await asyncio.sleep(0)  # it waits
    event.set()
    task.cancel()  # in the same step as the wake-up
    done, _ = await asyncio.wait((task,), timeout=2)
    assert task in done
    assert task.cancelled()
    assert rounds == 1
