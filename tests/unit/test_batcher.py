"""The auto-batcher without sockets: lanes, limits, one batch in flight per ordered lane and
several per unordered one, results and errors fanned out to each caller."""

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

import pytest

from smartnsq.producer.batching import UNORDERED_IN_FLIGHT, Batcher


class Recorder:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.batches: list[tuple[Hashable, list[bytes], list[int] | None]] = []
        self.running: dict[Hashable, int] = {}
        self.max_concurrent_per_lane = 0
        self.fail = fail
        self.gate: asyncio.Event | None = None

    async def __call__(
        self, lane: Hashable, bodies: list[bytes], trace_ids: list[int] | None
    ) -> list[Any]:
        self.running[lane] = self.running.get(lane, 0) + 1
        self.max_concurrent_per_lane = max(self.max_concurrent_per_lane, self.running[lane])
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
            self.batches.append((lane, list(bodies), trace_ids))
            if self.fail is not None:
                raise self.fail
            return [(lane, b) for b in bodies]
        finally:
            self.running[lane] -= 1


async def until(condition: Callable[[], bool], turns: int = 100) -> None:
    """Let the loop run until ``condition`` holds (no clock involved)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_concurrent_adds_share_a_batch() -> None:
    flush = Recorder()
    batcher = Batcher(flush, linger=0.01, max_batch=100, max_bytes=10_000)
    futures = [batcher.add("a", b"%d" % i, None) for i in range(10)]
    results = await asyncio.gather(*futures)
    assert results == [("a", b"%d" % i) for i in range(10)]
    assert len(flush.batches) == 1


async def test_max_batch_and_byte_limit_split_batches() -> None:
    flush = Recorder()
    batcher = Batcher(flush, linger=10, max_batch=3, max_bytes=8 + 3 * (4 + 10))
    futures = [batcher.add("a", b"x" * 10, None) for _ in range(7)]
    await batcher.flush()
    await asyncio.gather(*futures)
    assert [len(b[1]) for b in flush.batches] == [3, 3, 1]
    flush2 = Recorder()
    small = Batcher(flush2, linger=10, max_batch=100, max_bytes=8 + 2 * (4 + 10))
    futures = [small.add("a", b"y" * 10, None) for _ in range(5)]
    await small.flush()
    await asyncio.gather(*futures)
    assert [len(b[1]) for b in flush2.batches] == [2, 2, 1]


async def test_one_batch_in_flight_per_lane_keeps_order() -> None:
    flush = Recorder()
    flush.gate = asyncio.Event()
    batcher = Batcher(flush, linger=0, max_batch=2, max_bytes=10_000)
    futures = [batcher.add("k", b"%d" % i, None) for i in range(6)]
    other = batcher.add("other", b"o", None)
    await until(lambda: flush.running.get("other") == 1)  # its linger timer fired later
    assert flush.running == {"k": 1, "other": 1}
    flush.gate.set()
    await asyncio.gather(*futures, other)
    assert flush.max_concurrent_per_lane == 1
    sent = [body for lane, bodies, _ in flush.batches if lane == "k" for body in bodies]
    assert sent == [b"%d" % i for i in range(6)]


async def test_an_unordered_lane_keeps_several_batches_in_flight() -> None:
    flush = Recorder()
    flush.gate = asyncio.Event()
    batcher = Batcher(flush, linger=0, max_batch=2, max_bytes=10_000)
    count = 2 * (UNORDERED_IN_FLIGHT + 2)
    futures = [batcher.add("any", b"%d" % i, None, ordered=False) for i in range(count)]
    await asyncio.sleep(0)  # every flush task created so far runs up to the gate
    assert flush.running == {"any": UNORDERED_IN_FLIGHT}  # the other two batches wait
    flush.gate.set()
    results = await asyncio.gather(*futures)
    assert results == [("any", b"%d" % i) for i in range(count)]  # each caller its own
    assert len(flush.batches) == UNORDERED_IN_FLIGHT + 2
    assert flush.max_concurrent_per_lane == UNORDERED_IN_FLIGHT


async def test_errors_reach_every_caller_of_the_batch() -> None:
    flush = Recorder(fail=ValueError("nsqd said no"))
    batcher = Batcher(flush, linger=0, max_batch=10, max_bytes=10_000)
    futures = [batcher.add("a", b"x", None) for _ in range(3)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)


async def test_traced_and_plain_messages_do_not_mix() -> None:
    flush = Recorder()
    batcher = Batcher(flush, linger=0.01, max_batch=10, max_bytes=10_000)
    futures = [
        batcher.add("a", b"plain", None),
        batcher.add("a", b"traced", 7),
        batcher.add("a", b"traced", 8),
    ]
    await asyncio.gather(*futures)
    assert [(b[1], b[2]) for b in flush.batches] == [
        ([b"plain"], None),
        ([b"traced", b"traced"], [7, 8]),
    ]


async def test_a_traced_batch_counts_the_trace_id_of_each_message() -> None:
    # MPUB_TRACE: [size][trace id][body] per message; room for two, not three.
    flush = Recorder()
    batcher = Batcher(flush, linger=10, max_batch=10, max_bytes=8 + 2 * (4 + 8 + 10))
    futures = [batcher.add("a", b"x" * 10, n) for n in range(3)]
    await batcher.flush()
    await asyncio.gather(*futures)
    assert [b[2] for b in flush.batches] == [[0, 1], [2]]


async def test_flush_also_sends_what_arrives_while_it_waits() -> None:
    flush = Recorder()
    flush.gate = asyncio.Event()
    batcher = Batcher(flush, linger=10, max_batch=10, max_bytes=10_000)
    first = batcher.add("a", b"1", None)
    flushing = asyncio.ensure_future(batcher.flush())
    await until(lambda: flush.running.get("a") == 1)
    second = batcher.add("a", b"2", None)  # lingers 10 s unless flush picks it up
    flush.gate.set()
    assert await asyncio.wait_for(flushing, 5) is True
    assert await first == ("a", b"1")
    assert await second == ("a", b"2")


async def test_flush_gives_up_at_its_timeout_without_cancelling_the_sends() -> None:
    flush = Recorder()
    flush.gate = asyncio.Event()
    batcher = Batcher(flush, linger=10, max_batch=10, max_bytes=10_000)
    future = batcher.add("a", b"x", None)
    assert await batcher.flush(timeout=0.01) is False
    assert flush.running["a"] == 1
    assert not future.done()
    flush.gate.set()
    assert await asyncio.wait_for(future, 5) == ("a", b"x")


async def test_close_gives_every_waiting_caller_its_error_and_sends_nothing_more() -> None:
    closed = RuntimeError("closed")
    flush = Recorder()
    flush.gate = asyncio.Event()
    batcher = Batcher(flush, linger=10, max_batch=1, max_bytes=10_000)
    in_flight = batcher.add("a", b"1", None)  # max_batch 1: sent at once, held by the gate
    queued = batcher.add("a", b"2", None)  # waits for the lane
    await until(lambda: flush.running.get("a") == 1)
    batcher.close(closed)
    for future in (in_flight, queued):
        with pytest.raises(RuntimeError, match="closed"):
            await future
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.add("a", b"3", None)
    await until(lambda: flush.running.get("a") == 0)
    assert flush.batches == []  # the in-flight send was cancelled, the queued one never left


async def test_a_publish_cancelled_before_its_batch_leaves_is_taken_out() -> None:
    flush = Recorder()
    batcher = Batcher(flush, linger=10, max_batch=100, max_bytes=10_000)
    kept, cancelled = batcher.add("a", b"kept", None), batcher.add("a", b"gone", None)
    cancelled.cancel()  # its caller gave up while the batch lingered
    alone = batcher.add("b", b"alone", None)
    alone.cancel()
    await batcher.flush()
    assert await kept == ("a", b"kept")
    assert flush.batches == [("a", [b"kept"], None)]  # nothing of the others sent
