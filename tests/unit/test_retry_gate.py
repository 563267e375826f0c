"""The retry gate spreads a storm of retries over turns of the event loop: at most PER_TURN
start in one turn, first come first served; a few retries never wait."""

from __future__ import annotations

import asyncio

from smartnsq.producer.gate import PER_TURN, RetryGate


async def test_a_few_retries_go_at_once() -> None:
    gate = RetryGate()
    for _ in range(PER_TURN):
        step = gate.enter().__await__()
        try:
            next(step)
        except StopIteration:
            continue  # done without suspending
        raise AssertionError("a retry waited although the turn had room")


async def test_a_storm_goes_per_turn_in_order() -> None:
    gate = RetryGate(per_turn=10)
    turn = 0
    ticking = True

    def tick() -> None:
        nonlocal turn
        turn += 1
        if ticking:
            asyncio.get_running_loop().call_soon(tick)

    started: list[tuple[int, int]] = []  # (retry, turn it started in)

    async def retry(number: int) -> None:
        await gate.enter()
        started.append((number, turn))

    asyncio.get_running_loop().call_soon(tick)
    await asyncio.gather(*(retry(n) for n in range(95)))
    ticking = False
    assert [number for number, _ in started] == list(range(95))  # first come, first served
    per_turn: dict[int, int] = {}
    for _, when in started:
        per_turn[when] = per_turn.get(when, 0) + 1
    assert max(per_turn.values()) <= 10
    assert len(per_turn) >= 10  # spread over at least ten turns
    assert gate.waiting == 0


async def test_a_cancelled_retry_gives_its_place_to_the_next() -> None:
    gate = RetryGate(per_turn=1)
    # Three retries in one turn: the first takes its one place, the others wait.
    retries = [asyncio.ensure_future(gate.enter()) for _ in range(3)]
    await asyncio.sleep(0)
    assert retries[0].done()
    assert gate.waiting == 2
    retries[1].cancel()
    await asyncio.wait_for(retries[2], 1.0)
    assert retries[1].cancelled()
    assert gate.waiting == 0
