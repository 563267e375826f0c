"""Giving up on a message whose on_giving_up callback returns an awaitable: the FIN waits
for it, and in ordered mode so does the rest of the partition."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1) as c:
        await c.create_topic("events", 1, 1, channels=["c"])
        await c.create_topic("ordered", 1, 1, ordered=True, channels=["c"])
        yield c


def _consumer(cluster: Cluster, topic: str, **kwargs: Any) -> Consumer:
    kwargs.setdefault("requeue_delay", 0.0)
    return Consumer(
        topic,
        "c",
        lookupd=[cluster.lookupd_url],
        reconnect_backoff=Backoff(initial=0.01, maximum=0.05),
        backoff=False,
        max_in_flight=4,
        **kwargs,
    )


async def _publish(cluster: Cluster, topic: str, *bodies: bytes) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for body in bodies:
            await producer.publish(topic, body, partition=0)


async def test_awaitable_on_giving_up_is_awaited_before_the_fin(cluster: Cluster) -> None:
    release = asyncio.Event()
    given_up: list[int] = []

    async def handle(message: Message) -> None:
        raise ValueError("poison")

    async def give_up(message: Message) -> None:
        given_up.append(message.attempts)
        await release.wait()

    async with _consumer(
        cluster, "events", handler=handle, max_attempts=1, on_giving_up=give_up
    ) as consumer:
        await _publish(cluster, "events", b"poison")
        await cluster.wait_for(lambda: bool(given_up))
        await asyncio.sleep(0.05)
        assert cluster.unfinished("events", "c") == 1  # still in flight: not answered yet
        assert consumer.stats().finished == 0
        release.set()
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
        stats = consumer.stats()
    assert given_up == [1]  # given up right after its one allowed attempt, not requeued
    assert (stats.given_up, stats.finished, stats.requeued) == (1, 1, 0)
    assert len(cluster.channel_record("events", "c").finished) == 1


async def test_ordered_partition_waits_for_an_awaitable_on_giving_up(cluster: Cluster) -> None:
    release = asyncio.Event()
    handled: list[bytes] = []

    async def handle(message: Message) -> None:
        handled.append(message.body)
        if message.body == b"poison":
            raise ValueError("poison")

    async def give_up(message: Message) -> None:
        await release.wait()

    async with _consumer(
        cluster,
        "ordered",
        handler=handle,
        ordered=True,
        ordered_give_up=True,
        max_attempts=1,
        on_giving_up=give_up,
    ) as consumer:
        await _publish(cluster, "ordered", b"poison", b"next")
        await cluster.wait_for(lambda: handled == [b"poison"])
        await asyncio.sleep(0.05)
        assert handled == [b"poison"]  # the partition is blocked behind the give-up
        release.set()
        await cluster.wait_for(lambda: cluster.unfinished("ordered", "c") == 0)
        stats = consumer.stats()
    assert handled == [b"poison", b"next"]
    assert (stats.given_up, stats.finished, stats.requeued) == (1, 2, 0)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_message_is_given_up_right_after_its_last_allowed_attempt(
    cluster: Cluster, ordered: bool, tmp_path: Path
) -> None:
    """Unordered with max_attempts=2 used to requeue the message a third time (with
    requeue_delay x attempts) only to give it up when it came back; ordered gave up right
    after the second. Both now give up after the handler's second attempt."""
    attempts: list[int] = []
    dead_letters = tmp_path / "dead.jsonl"

    def handle(message: Message) -> None:
        attempts.append(message.attempts)
        raise ValueError("poison")

    topic = "ordered" if ordered else "events"
    async with _consumer(
        cluster,
        topic,
        handler=handle,
        ordered=ordered,
        ordered_give_up=True,
        max_attempts=2,
        dead_letter_path=dead_letters,
    ) as consumer:
        await _publish(cluster, topic, b"poison")
        await cluster.wait_for(lambda: cluster.unfinished(topic, "c") == 0)
        stats = consumer.stats()
    assert attempts == [1, 2]
    assert (stats.given_up, stats.requeued) == (1, 1)
    record = json.loads(dead_letters.read_text())
    assert (record["attempts"], record["attempts_run"]) == (2, 2)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
async def test_a_message_whose_dead_letter_cannot_be_written_is_requeued_not_finished(
    cluster: Cluster, ordered: bool, tmp_path: Path
) -> None:
    """The dead-letter file's directory is replaced by a regular file after the consumer was
    made: the message used to be finished anyway (lost, the error only logged). It goes back
    to nsqd instead, is given up again when it comes back, and is written and finished once
    the file can be written."""
    directory = tmp_path / "dead"
    directory.mkdir()
    dead_letters = directory / "dead.jsonl"
    given_up: list[int] = []

    def handle(message: Message) -> None:
        raise ValueError("poison")

    topic = "ordered" if ordered else "events"
    async with _consumer(
        cluster,
        topic,
        handler=handle,
        ordered=ordered,
        ordered_give_up=True,
        max_attempts=1,
        requeue_delay=0.01,
        dead_letter_path=dead_letters,
        on_giving_up=lambda message: given_up.append(message.attempts),
    ) as consumer:
        directory.rmdir()
        directory.write_text("not a directory")
        await _publish(cluster, topic, b"poison")
        record = cluster.channel_record(topic, "c")
        await cluster.wait_for(lambda: len(record.requeued) >= 2)
        assert record.finished == []
        assert (consumer.stats().given_up, given_up) == (0, [])
        directory.unlink()
        directory.mkdir()
        await cluster.wait_for(lambda: cluster.unfinished(topic, "c") == 0)
        stats = consumer.stats()
    assert stats.given_up == 1
    assert len(given_up) == 1
    assert len(record.finished) == 1
    lines = dead_letters.read_text().splitlines()
    assert [json.loads(line)["body"] for line in lines] == ["poison"]
