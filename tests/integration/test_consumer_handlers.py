"""The handler contract: a coroutine handler behaves like a task from its first line (a
current task for asyncio.timeout, TaskGroup and anyio, whose cancel scopes httpx uses), and
every call runs in a context of its own, as asyncio.create_task would give it. Plain
functions run in threads, in a copy of the context."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1) as c:
        await c.create_topic("events", 1, 1, channels=["c"])
        yield c


async def _consume(cluster: Cluster, handler: Any, bodies: list[bytes]) -> Consumer:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        await producer.publish_many("events", bodies, partition=0)
    return Consumer(
        "events",
        "c",
        lookupd=[cluster.lookupd_url],
        handler=handler,
        max_in_flight=len(bodies),
        reconnect_backoff=Backoff(initial=0.01, maximum=0.05),
        requeue_delay=0.0,
    )


async def test_context_variables_do_not_leak_from_one_message_to_the_next(
    cluster: Cluster,
) -> None:
    seen: list[tuple[bytes, str | None]] = []

    async def handle(message: Message) -> None:
        seen.append((message.body, REQUEST.get()))  # what an earlier handler set?
        REQUEST.set(message.body.decode())

    bodies = [b"m0", b"m1", b"m2", b"m3"]
    async with await _consume(cluster, handle, bodies) as consumer:
        await cluster.wait_for(lambda: len(seen) == len(bodies))
        stats = consumer.stats()
    assert sorted(seen) == [(body, None) for body in bodies]
    assert stats.handler_errors == 0


async def test_asyncio_timeout_and_current_task_work_before_the_first_await(
    cluster: Cluster,
) -> None:
    outcome: list[tuple[bool, bool]] = []

    async def handle(message: Message) -> None:
        task = asyncio.current_task()
        async with asyncio.timeout(5):  # "Timeout should be used inside a task" on 0.1
            await asyncio.sleep(0)
        outcome.append((task is not None, asyncio.current_task() is task))

    async with await _consume(cluster, handle, [b"a", b"b"]) as consumer:
        await cluster.wait_for(lambda: len(outcome) == 2)
        stats = consumer.stats()
    assert outcome == [(True, True), (True, True)]
    assert (stats.handler_errors, stats.finished) == (0, 2)


async def test_a_timeout_that_expires_fails_the_message_like_any_error(cluster: Cluster) -> None:
    attempts: list[int] = []

    async def handle(message: Message) -> None:
        attempts.append(message.attempts)
        async with asyncio.timeout(0.01 if message.attempts == 1 else 5):
            await asyncio.sleep(1)

    async with await _consume(cluster, handle, [b"slow once"]) as consumer:
        await cluster.wait_for(lambda: consumer.stats().finished == 1, timeout=10)
        stats = consumer.stats()
    assert attempts == [1, 2]
    assert (stats.handler_errors, stats.requeued) == (1, 1)


async def test_task_groups_shield_and_httpx_in_a_handler(cluster: Cluster) -> None:
    results: list[tuple[str, str, int]] = []
    url = cluster.lookupd_url + "/ping"

    async def handle(message: Message) -> None:
        async with httpx.AsyncClient() as client:  # anyio cancel scopes: a current task
            response = await client.get(url, timeout=5)
        async with asyncio.TaskGroup() as group:
            child = group.create_task(asyncio.sleep(0, message.body.decode()))
        shielded = await asyncio.shield(asyncio.sleep(0, "shielded"))
        results.append((child.result(), shielded, response.status_code))

    async with await _consume(cluster, handle, [b"x", b"y"]) as consumer:
        await cluster.wait_for(lambda: len(results) == 2)
        stats = consumer.stats()
    assert sorted(results) == [("x", "shielded", 200), ("y", "shielded", 200)]
    assert stats.handler_errors == 0


async def test_plain_function_handlers_get_a_context_of_their_own(cluster: Cluster) -> None:
    seen: list[tuple[bytes, str | None]] = []

    def handle(message: Message) -> None:
        seen.append((message.body, REQUEST.get()))
        REQUEST.set(message.body.decode())

    bodies = [b"p0", b"p1", b"p2"]
    async with await _consume(cluster, handle, bodies):
        await cluster.wait_for(lambda: len(seen) == len(bodies))
    assert sorted(seen) == [(body, None) for body in bodies]


async def test_a_plain_function_returning_a_coroutine_has_it_awaited(cluster: Cluster) -> None:
    """``handler=lambda m: process(m)`` with an async ``process``: the coroutine runs on the
    consumer's loop, and the message is finished once it is over (it used to be dropped
    unawaited in the thread and the message finished unprocessed)."""
    processed: list[bytes] = []
    entered = asyncio.Event()
    release = asyncio.Event()

    async def process(message: Message) -> None:
        entered.set()
        await release.wait()
        processed.append(message.body)

    async with await _consume(cluster, lambda m: process(m), [b"order"]) as consumer:
        await asyncio.wait_for(entered.wait(), 10)
        assert cluster.channel_record("events", "c").finished == []  # not before it is over
        release.set()
        await cluster.wait_for(lambda: len(cluster.channel_record("events", "c").finished) == 1)
        stats = consumer.stats()
    assert processed == [b"order"]
    assert (stats.finished, stats.handler_errors) == (1, 0)
