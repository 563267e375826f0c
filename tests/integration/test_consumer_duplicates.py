"""Deliveries a real youzan nsqd repeats never reach the handler twice (issue: the first
delivery of a channel's first SUB_ORDERED goes out twice; a new leader replays what the
old one had confirmed after its replica's last sync; a timed-out message comes back while
its handler still runs)."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import ValidationError
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

FAST = Backoff(initial=0.01, maximum=0.05)


def _consumer(cluster: Cluster, topic: str, **kwargs: Any) -> Consumer:
    kwargs.setdefault("reconnect_backoff", FAST)
    kwargs.setdefault("max_in_flight", 8)
    return Consumer(topic, "c", lookupd=[cluster.lookupd_url], **kwargs)


async def test_first_ordered_subscription_delivers_each_message_once() -> None:
    """Messages wait in the channel before its first SUB_ORDERED: nsqd sends the first one
    twice; the handler still sees every key's sequence once, in order. The copy, which comes
    after the first copy was finished, gets the FIN again (nsqd refuses that one as not in
    flight, as the capture shows: expected, and nothing is finished twice)."""
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("orders", 4, 2, ordered=True, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for seq in range(5):
                for key in range(8):
                    await producer.publish("orders", f"{key}:{seq}", sharding_key=key)
        seen: dict[str, list[int]] = defaultdict(list)

        async def handle(message: Message) -> None:
            key, seq = message.body.decode().split(":")
            seen[key].append(int(seq))

        async with _consumer(cluster, "orders", handler=handle, ordered=True) as consumer:
            await cluster.wait_for(lambda: sum(map(len, seen.values())) >= 40)
            await cluster.wait_for(lambda: cluster.unfinished("orders", "c") == 0)
            stats = consumer.stats()
        assert dict(seen) == {str(key): [0, 1, 2, 3, 4] for key in range(8)}
        record = cluster.channel_record("orders", "c")
        assert len(record.deliveries) == 40 + 4  # the server did send each first one twice
        assert record.duplicates_finished() == []
        assert stats.duplicates == 4
        assert (stats.received, stats.finished, stats.server_errors) == (40, 40, 4)


async def test_a_copy_put_in_flight_after_the_first_answer_is_answered_not_dropped() -> None:
    """Real youzan, about 3 fresh channels in 20: the copy of the first ordered delivery is
    put in flight only after the client's FIN of the first copy reached nsqd (that FIN
    fails: not in flight). Dropping the copy unanswered stalled the partition until
    msg_timeout (60 s); it is answered again, never handled twice."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("orders", 1, 1, ordered=True, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for seq in range(5):
                await producer.publish("orders", f"m{seq}", partition=0)
        cluster.set_ordered_echo_late("orders", "c")
        handled: list[str] = []

        async def handle(message: Message) -> None:
            handled.append(message.body.decode())

        async with _consumer(cluster, "orders", handler=handle, ordered=True) as consumer:
            await cluster.wait_for(lambda: len(handled) >= 5, timeout=10)
            await cluster.wait_for(lambda: cluster.unfinished("orders", "c") == 0)
            stats = consumer.stats()
        assert handled == [f"m{seq}" for seq in range(5)]
        assert cluster.channel_record("orders", "c").timed_out == []
        assert (stats.duplicates, stats.finished, stats.server_errors) == (1, 5, 1)


async def test_iterating_an_ordered_first_subscription_yields_each_message_once() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("orders", 1, 1, ordered=True, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            for seq in range(3):
                await producer.publish("orders", f"{seq}", partition=0)
        bodies = []
        async with _consumer(cluster, "orders", ordered=True) as consumer:
            async for message in consumer:
                bodies.append(message.body)
                await message.finish()
                if len(bodies) == 3:
                    break
            await cluster.wait_for(lambda: cluster.unfinished("orders", "c") == 0)
            assert consumer.stats().duplicates == 1
        assert bodies == [b"0", b"1", b"2"]


async def test_a_message_redelivered_while_its_handler_runs_is_not_handled_twice() -> None:
    """Unordered: the handler outlives msg_timeout, nsqd redelivers the message on the same
    connection; the copy is dropped and the one FIN finishes it."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("events", 1, 1, channels=["c"])
        release = asyncio.Event()
        calls = 0

        async def handle(message: Message) -> None:
            nonlocal calls
            calls += 1
            await release.wait()

        async with _consumer(
            cluster, "events", handler=handle, msg_timeout=1.0, backoff=False
        ) as consumer:
            async with Producer(lookupd=[cluster.lookupd_url]) as producer:
                await producer.publish("events", b"slow", partition=0)
            record = cluster.channel_record("events", "c")
            await cluster.wait_for(lambda: len(record.deliveries) == 2, timeout=5)
            await cluster.wait_for(lambda: consumer.stats().duplicates == 1)
            release.set()
            await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
            stats = consumer.stats()
        assert calls == 1
        assert [attempts for _, _, attempts, _ in record.deliveries] == [1, 2]
        assert len(record.finished) == 1
        assert (stats.finished, stats.server_errors) == (1, 0)


async def _replay_after_failover(skip_replays: bool | None) -> tuple[Counter[str], Any]:
    """An ordered partition on nodes [0, 1, 2]: node 1 misses offset syncs while it is
    down, then becomes the leader and resumes the channel from its stale position."""
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic(
            "orders", 1, 3, ordered=True, channels=["c"], placement={0: [0, 1, 2]}
        )
        handled: Counter[str] = Counter()

        async def handle(message: Message) -> None:
            handled[message.body.decode()] += 1

        async def publish(start: int, stop: int) -> None:
            async with Producer(lookupd=[cluster.lookupd_url]) as producer:
                for i in range(start, stop):
                    await producer.publish("orders", f"m{i}", partition=0)

        kwargs: dict[str, Any] = {"handler": handle, "ordered": True}
        if skip_replays is not None:
            kwargs["skip_replays"] = skip_replays
        async with _consumer(cluster, "orders", **kwargs) as consumer:
            await publish(0, 10)
            await cluster.wait_for(lambda: sum(handled.values()) >= 10)
            await cluster.stop_node(1)  # 2 of 3 replicas: still writable
            await publish(10, 20)
            await cluster.wait_for(lambda: sum(handled.values()) >= 20)
            await cluster.start_node(1)  # stale: no sync since it stopped
            await cluster.stop_node(0)  # the partition fails over to node 1
            assert cluster.leader("orders", 0) == 1
            await publish(20, 25)
            await cluster.wait_for(lambda: handled["m24"] >= 1, timeout=15)
            await cluster.wait_for(lambda: cluster.unfinished("orders", "c") == 0)
            return handled, consumer.stats()


async def test_ordered_consumer_skips_what_a_new_leader_replays() -> None:
    handled, stats = await _replay_after_failover(None)  # on by default when ordered
    assert handled == Counter({f"m{i}": 1 for i in range(25)})
    assert stats.replays_skipped == 10
    assert stats.finished == 25


async def test_skip_replays_off_hands_replays_to_the_handler() -> None:
    handled, stats = await _replay_after_failover(False)
    assert handled == Counter({f"m{i}": 2 if 10 <= i < 20 else 1 for i in range(25)})
    assert stats.replays_skipped == 0


def test_skip_replays_needs_ordered() -> None:
    with pytest.raises(ValidationError, match="skip_replays"):
        Consumer("t", "c", lookupd=["127.0.0.1:4161"], skip_replays=True)
