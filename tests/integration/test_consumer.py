"""The Consumer against the embedded cluster over real sockets."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import random
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import snappy

from smartnsq import errors as e
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.protocol.commands import StartPosition
from smartnsq.testing import Cluster
from smartnsq.transport.reading import thread_read_buffer
from tests.integration.spy import spy_writes

FAST = Backoff(initial=0.01, maximum=0.05)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=3) as c:
        await c.create_topic("events", 4, 3, channels=["c"])
        await c.create_topic("ordered", 4, 3, ordered=True, channels=["c"])
        yield c


def _consumer(cluster: Cluster, topic: str = "events", **kwargs: Any) -> Consumer:
    kwargs.setdefault("reconnect_backoff", FAST)
    kwargs.setdefault("max_in_flight", 8)  # at least one per partition
    kwargs.setdefault("requeue_delay", 0.0)
    return Consumer(topic, "c", lookupd=[cluster.lookupd_url], **kwargs)


async def _publish(cluster: Cluster, topic: str, count: int, *, keys: int = 0) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for start in range(0, count, 50):
            batch = [f"{i}".encode() for i in range(start, min(start + 50, count))]
            if keys:
                for body in batch:
                    await producer.publish(topic, body, sharding_key=int(body) % keys)
            else:
                await producer.publish_many(topic, batch, partition=(start // 50) % 4)


def _assert_each_finished_once(cluster: Cluster, topic: str, total: int) -> None:
    record = cluster.channel_record(topic, "c")
    assert record.duplicates_finished() == []
    assert len(record.finished) == total
    assert cluster.unfinished(topic, "c") == 0


# --------------------------------------------------------------------------- basics


async def test_consumes_every_partition(cluster: Cluster) -> None:
    seen: list[Message] = []

    async def handle(message: Message) -> None:
        seen.append(message)

    async with _consumer(cluster, handler=handle, max_in_flight=50) as consumer:
        await _publish(cluster, "events", 400)
        await cluster.wait_for(lambda: len(seen) == 400)
        stats = consumer.stats()
    assert Counter(m.partition for m in seen) == {0: 100, 1: 100, 2: 100, 3: 100}
    assert stats.finished == 400
    assert stats.per_partition == {0: 100, 1: 100, 2: 100, 3: 100}
    assert stats.in_flight == 0
    first = seen[0]
    assert (first.topic, first.channel) == ("events", "c")
    assert first.address in cluster.nsqd_addresses
    assert first.internal_id is not None
    assert first.offset is not None  # 4-word SUB_ADVANCED: every message has its position
    _assert_each_finished_once(cluster, "events", 400)


async def test_partition_subset(cluster: Cluster) -> None:
    seen: list[int | None] = []
    handler = seen.append
    async with _consumer(
        cluster, handler=lambda m: handler(m.partition), partitions=[0, 2], max_in_flight=4
    ):
        await _publish(cluster, "events", 200)
        await cluster.wait_for(lambda: len(seen) == 100)
        # nobody listens to partitions 1 and 3, so their halves stay where they are
        assert [len(cluster.subscriber_rdy("events", "c", p)) for p in range(4)] == [1, 0, 1, 0]
        assert cluster.depth("events", "c", partition=1) == 50
        assert cluster.depth("events", "c", partition=3) == 50
    assert set(seen) == {0, 2}
    with pytest.raises(e.ValidationError, match="partitions"):
        async with _consumer(cluster, handler=lambda m: None, partitions=[9]):
            pass


async def test_plain_function_handler_runs_in_a_thread(cluster: Cluster) -> None:
    import threading

    threads: set[str] = set()

    def handle(message: Message) -> None:
        threads.add(threading.current_thread().name)

    async with _consumer(cluster, handler=handle, max_in_flight=10):
        await _publish(cluster, "events", 50)
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
    assert threads
    assert all(name.startswith("smartnsq-events") for name in threads)
    _assert_each_finished_once(cluster, "events", 50)


async def test_manual_iteration(cluster: Cluster) -> None:
    consumer = _consumer(cluster, max_in_flight=5)
    await consumer.start()
    await _publish(cluster, "events", 3)
    answers = []
    async for message in consumer:
        if message.attempts == 1 and not answers:
            await message.touch()
            await message.requeue(0, backoff=False)
            answers.append("requeued")
            continue
        await message.finish()
        assert message.responded
        with pytest.raises(e.NSQError, match="already answered"):
            await message.finish()
        answers.append("finished")
        if answers.count("finished") == 3:
            break
    await consumer.close()
    assert consumer.stats().requeued == 1
    assert consumer.stats().touched == 1
    _assert_each_finished_once(cluster, "events", 3)


async def test_handler_error_requeues_with_attempts(cluster: Cluster) -> None:
    attempts: dict[bytes, list[int]] = defaultdict(list)

    async def handle(message: Message) -> None:
        attempts[message.body].append(message.attempts)
        if message.attempts < 3:
            raise RuntimeError("transient")

    async with _consumer(cluster, handler=handle, max_in_flight=10, backoff=False):
        await _publish(cluster, "events", 20)
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
    assert all(v == [1, 2, 3] for v in attempts.values())
    _assert_each_finished_once(cluster, "events", 20)


async def test_max_attempts_gives_up_and_dead_letters(cluster: Cluster, tmp_path: Path) -> None:
    given_up: list[Message] = []
    dead = tmp_path / "dead.jsonl"

    async def handle(message: Message) -> None:
        raise ValueError("poison")

    async with _consumer(
        cluster,
        handler=handle,
        max_attempts=3,
        backoff=False,
        on_giving_up=given_up.append,
        dead_letter_path=dead,
    ) as consumer:
        await _publish(cluster, "events", 1)
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
        assert consumer.stats().given_up == 1
    assert [m.attempts for m in given_up] == [3]  # right after the third failure
    record = json.loads(dead.read_text())
    assert record["body"] == "0"
    assert (record["attempts"], record["attempts_run"]) == (3, 3)
    assert len(cluster.channel_record("events", "c").requeued) == 2  # the first 2 failures
    _assert_each_finished_once(cluster, "events", 1)


async def test_backoff_pauses_delivery(cluster: Cluster) -> None:
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def handle(message: Message) -> None:
        calls.append(loop.time())
        if len(calls) == 1:
            raise RuntimeError("downstream is down")

    policy = BackoffPolicy(multiplier=0.3, max_delay=1.0)
    async with _consumer(
        cluster, handler=handle, max_in_flight=1, backoff=policy, low_rdy_idle_timeout=0.2
    ) as consumer:
        await _publish(cluster, "events", 1)
        await cluster.wait_for(lambda: len(calls) >= 1)
        await _publish(cluster, "events", 1)
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0, 5)
        assert consumer.stats().handler_errors == 1
    assert calls[1] - calls[0] >= 0.25  # nothing delivered during the backoff window


async def test_is_starved_and_pause(cluster: Cluster) -> None:
    release = asyncio.Event()

    async def handle(message: Message) -> None:
        await release.wait()

    async with _consumer(cluster, handler=handle, max_in_flight=8) as consumer:
        await _publish(cluster, "events", 200)  # 50 per partition
        await cluster.wait_for(lambda: consumer.stats().in_flight == 8)
        assert consumer.is_starved()
        assert cluster.in_flight("events", "c") == 8  # never more than max_in_flight
        consumer.set_max_in_flight(0)
        release.set()
        await cluster.wait_for(lambda: consumer.stats().in_flight == 0)
        assert not consumer.is_starved()
        # paused: every connection told nsqd RDY 0, so nothing more can be delivered
        await cluster.wait_for(lambda: set(cluster.subscriber_rdy("events", "c")) == {0})
        assert cluster.in_flight("events", "c") == 0
        assert cluster.unfinished("events", "c") > 0
        consumer.set_max_in_flight(8)
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
    _assert_each_finished_once(cluster, "events", 200)


# --------------------------------------------------------------------------- ordered


async def test_ordered_per_partition_under_failures(cluster: Cluster) -> None:
    rng = random.Random(7)
    calls: dict[int | None, list[int]] = defaultdict(list)
    succeeded: dict[int | None, list[int]] = defaultdict(list)
    running: Counter[int | None] = Counter()

    async def handle(message: Message) -> None:
        partition = message.partition
        running[partition] += 1
        assert running[partition] == 1, "two messages of one partition at once"
        assert message.offset is not None
        calls[partition].append(message.internal_id or 0)
        await asyncio.sleep(rng.random() / 1000)
        running[partition] -= 1
        if rng.random() < 0.2:
            raise RuntimeError("injected failure")
        succeeded[partition].append(message.internal_id or 0)

    async with _consumer(
        cluster, "ordered", handler=handle, max_in_flight=20, ordered=True, backoff=False
    ) as consumer:
        await _publish(cluster, "ordered", 300, keys=16)
        await cluster.wait_for(lambda: cluster.unfinished("ordered", "c") == 0, 30)
        assert consumer.stats().order_violations == 0
    for partition, ids in succeeded.items():
        log_ids = [r.internal_id for r in cluster.messages("ordered", partition)]  # type: ignore[arg-type]
        assert ids == log_ids  # every message once, strictly in queue order
        assert calls[partition] == sorted(calls[partition])  # retries never jump ahead
    _assert_each_finished_once(cluster, "ordered", 300)


async def test_ordered_partitions_get_their_rdy_once(cluster: Cluster) -> None:
    """nsqd keeps the RDY count as sent (since 0.2.29; youzan's too): an ordered partition
    at RDY 1 (max_in_flight None) answers each message with its FIN alone, not with RDY 1
    again (go-nsq and youzan's go-nsq do not send an unchanged count either)."""
    seen: list[Message] = []

    async def handle(message: Message) -> None:
        seen.append(message)

    async with _consumer(
        cluster, "ordered", handler=handle, ordered=True, max_in_flight=None
    ) as consumer:
        subs = consumer._subscriber.subs.values()
        await cluster.wait_for(lambda: cluster.subscriber_rdy("ordered", "c") == [1, 1, 1, 1])
        writes = [spy_writes(sub.conn._transport) for sub in subs]
        await _publish(cluster, "ordered", 40, keys=8)
        await cluster.wait_for(lambda: len(seen) == 40)
        sent = b"".join(b"".join(w) for w in writes)
    assert sent.count(b"FIN ") == 40
    assert b"RDY" not in sent
    _assert_each_finished_once(cluster, "ordered", 40)


async def test_ordered_failure_waits_client_side(cluster: Cluster) -> None:
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def handle(message: Message) -> None:
        times.append(loop.time())
        if len(times) == 1:
            raise RuntimeError("retry me")

    async with _consumer(
        cluster, "ordered", handler=handle, ordered=True, backoff=False, requeue_delay=0.3
    ):
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("ordered", b"one", partition=0)
        await cluster.wait_for(lambda: len(times) == 2, 5)
    assert times[1] - times[0] >= 0.3  # waited by the client; nsqd ignores REQ delays
    requeues = cluster.channel_record("ordered", "c").requeued
    assert len(requeues) == 1


async def test_ordered_max_attempts_policies(cluster: Cluster, tmp_path: Path) -> None:
    attempts: list[int] = []

    async def fail(message: Message) -> None:
        attempts.append(message.attempts)
        raise RuntimeError("poison")

    async with _consumer(
        cluster, "ordered", handler=fail, ordered=True, max_attempts=2, backoff=False
    ):
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("ordered", b"poison", partition=1)
        await cluster.wait_for(lambda: len(attempts) >= 5, 5)  # blocks: keeps retrying
    assert attempts[:5] == [1, 2, 3, 4, 5]

    given_up: list[Message] = []
    async with _consumer(
        cluster,
        "ordered",
        handler=fail,
        ordered=True,
        max_attempts=2,
        ordered_give_up=True,
        on_giving_up=given_up.append,
    ):
        await cluster.wait_for(lambda: cluster.unfinished("ordered", "c") == 0, 5)
    assert len(given_up) == 1


async def test_plain_sub_on_ordered_topic_explains(cluster: Cluster) -> None:
    consumer = _consumer(cluster, "ordered", handler=lambda m: None)
    with pytest.raises(e.OrderedSubscribeRequiredError, match="ordered=True"):
        await consumer.start()


# --------------------------------------------------------------------------- faults


async def _consume_through(
    cluster: Cluster, total: int, fault: Any, topic: str = "events"
) -> dict[tuple[int | None, int], int]:
    calls: Counter[tuple[int | None, int]] = Counter()

    async def handle(message: Message) -> None:
        calls[(message.partition, message.internal_id or 0)] += 1
        await asyncio.sleep(0.001)

    async with _consumer(cluster, topic, handler=handle, max_in_flight=40):
        publishing = asyncio.create_task(_publish(cluster, topic, total))
        await cluster.wait_for(lambda: sum(calls.values()) > total // 3, 30)
        await fault()
        await publishing
        await cluster.wait_for(lambda: cluster.unfinished(topic, "c") == 0, 30)
    return calls


def _assert_handled_as_delivered(
    cluster: Cluster, topic: str, calls: Counter[tuple[int | None, int]]
) -> None:
    """Every message was handled, and never more often than nsqd delivered it: the client
    hands each delivery to the handler at most once. (A delivery written into a connection
    that was being reset never reaches the client, so fewer handlings than deliveries is
    possible.)"""
    record = cluster.channel_record(topic, "c")
    deliveries = Counter((p, i) for p, i, _attempts, _client in record.deliveries)
    assert set(calls) == set(deliveries)
    assert all(calls[key] <= deliveries[key] for key in calls)


def _assert_at_least_once(cluster: Cluster, topic: str, total: int) -> None:
    """What a leader change guarantees, no more: every published body was stored (a publish
    retried after a lost answer may be stored twice: at-least-once) and every stored message
    was finished (the new leader resumes from the consume offset the old one had synced to
    it, so a message finished just before the change may be delivered and finished again)."""
    partitions = cluster.topology(topic)
    stored = {
        (pid, r.internal_id): r.body for pid in partitions for r in cluster.messages(topic, pid)
    }
    assert set(stored.values()) == {str(i).encode() for i in range(total)}
    assert set(cluster.channel_record(topic, "c").finished) == set(stored)
    assert cluster.unfinished(topic, "c") == 0


async def test_no_loss_no_duplicate_handling_across_move_leader(cluster: Cluster) -> None:
    async def fault() -> None:
        for partition in range(4):
            leader = cluster.leader("events", partition)
            await cluster.move_leader("events", partition, to_node=(leader + 1) % 3)  # type: ignore[operator]

    calls = await _consume_through(cluster, 600, fault)
    _assert_at_least_once(cluster, "events", 600)
    # a message is handled again only when nsqd delivered it again (unfinished at the move)
    _assert_handled_as_delivered(cluster, "events", calls)


async def test_no_loss_no_duplicate_handling_across_stop_node(cluster: Cluster) -> None:
    async def fault() -> None:
        await cluster.stop_node(1)

    calls = await _consume_through(cluster, 600, fault)
    _assert_at_least_once(cluster, "events", 600)
    _assert_handled_as_delivered(cluster, "events", calls)


async def test_reconnects_after_dropped_connections(cluster: Cluster) -> None:
    async def fault() -> None:
        for node in range(3):
            await cluster.drop_connections(node, producers=False)

    calls = await _consume_through(cluster, 400, fault)
    _assert_each_finished_once(cluster, "events", 400)
    _assert_handled_as_delivered(cluster, "events", calls)


@pytest.mark.parametrize("max_in_flight", [1, 2])
async def test_the_low_max_in_flight_warning_counts_every_partition(
    cluster: Cluster, max_in_flight: int, caplog: pytest.LogCaptureFixture
) -> None:
    """It counted the subscriptions open when it was said, one more than max_in_flight
    ("below the 2 partitions" on a 4-partition topic): the subscriber now tells what it
    wants before it subscribes."""
    with caplog.at_level(logging.WARNING, logger="smartnsq.consumer"):
        async with _consumer(cluster, max_in_flight=max_in_flight) as consumer:
            await cluster.wait_for(lambda: consumer.stats().connections == 4)
    warnings = [r.getMessage() for r in caplog.records if "take turns" in r.getMessage()]
    assert len(warnings) == 1
    assert f"max_in_flight={max_in_flight} is below the 4 partitions" in warnings[0]


async def test_a_requeue_delay_error_is_in_seconds(cluster: Cluster) -> None:
    """message.requeue(delay=) past what nsqd takes (3 days) said milliseconds; it says
    seconds, and the message can still be answered."""
    async with _consumer(cluster) as consumer:
        await _publish(cluster, "events", 1)
        [message] = await consumer.getmany(1, timeout=10)
        with pytest.raises(e.ValidationError) as raised:
            await message.requeue(delay=4 * 24 * 3600)
        assert raised.value.field == "delay"
        assert "259200 seconds" in str(raised.value)
        assert " ms" not in str(raised.value)
        await message.finish()
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)


async def test_close_timeout_bounds_a_stuck_plain_function_handler(cluster: Cluster) -> None:
    """close(timeout=0.5) with a plain-function handler stuck in its thread used to give the
    thread 5 s more after the drain. The bound is timeout; the wait below allows 3 s of a
    loaded machine's delays, less than those 5 s."""
    entered = threading.Event()
    release = threading.Event()

    def stuck(message: Message) -> None:
        entered.set()
        release.wait(30)

    consumer = _consumer(cluster, handler=stuck)
    await consumer.start()
    await _publish(cluster, "events", 1)
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, entered.wait, 10)
    closing = asyncio.ensure_future(consumer.close(timeout=0.5))
    try:
        done, _ = await asyncio.wait({closing}, timeout=3.5)
        assert done, "close(timeout=0.5) still running after 3.5 s"
    finally:
        release.set()
        await closing
    assert cluster.in_flight("events", "c") <= 1  # unanswered: nsqd redelivers it


async def test_drain_under_load(cluster: Cluster) -> None:
    started: list[bytes] = []
    finished: list[bytes] = []

    async def slow(message: Message) -> None:
        started.append(message.body)
        await asyncio.sleep(0.05)
        finished.append(message.body)

    consumer = _consumer(cluster, handler=slow, max_in_flight=30)
    await consumer.start()
    await _publish(cluster, "events", 300)
    await cluster.wait_for(lambda: len(started) >= 60)
    await consumer.close(timeout=5)
    assert sorted(started) == sorted(finished)  # every running handler completed...
    record = cluster.channel_record("events", "c")
    assert len(record.finished) == len(finished)  # ...and was answered, once
    assert record.duplicates_finished() == []
    assert cluster.in_flight("events", "c") == 0  # the rest went back to the queue

    rest: list[bytes] = []
    async with _consumer(cluster, handler=lambda m: rest.append(m.body), max_in_flight=50):
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
    assert sorted(finished + rest) == sorted(f"{i}".encode() for i in range(300))
    _assert_each_finished_once(cluster, "events", 300)


# --------------------------------------------------------------------------- many partitions


async def test_many_idle_partitions_hold_small_buffers_and_still_read_a_large_message() -> None:
    """64 subscriptions read into their thread's one read buffer and keep no frame bytes
    while idle; a 1 MiB message (16 reads' worth) arrives whole, and its connection gives
    the memory back once it is decoded."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("wide", 64, 1, channels=["c"])
        seen: list[Message] = []

        async def handle(message: Message) -> None:
            seen.append(message)

        async with _consumer(cluster, "wide", handler=handle, max_in_flight=None) as consumer:
            await cluster.wait_for(lambda: consumer.stats().connections == 64)
            conns = [sub.conn for sub in consumer._subscriber.subs.values()]
            shared = thread_read_buffer().obj
            assert all(conn._read_view is not None for conn in conns)
            assert {id(conn._read_view.obj) for conn in conns} == {id(shared)}
            await cluster.wait_for(lambda: all(c._session._decoder.buffered == 0 for c in conns))
            assert max(_frame_buffer_bytes(conn) for conn in conns) < 64

            body = random.Random(7).randbytes(1024 * 1024)
            async with Producer(lookupd=[cluster.lookupd_url]) as producer:
                await producer.publish("wide", body, partition=37)
            await cluster.wait_for(lambda: len(seen) == 1)
            assert (seen[0].partition, seen[0].body == body) == (37, True)
            await cluster.wait_for(lambda: cluster.unfinished("wide", "c") == 0)
            assert max(_frame_buffer_bytes(conn) for conn in conns) < 64


def _frame_buffer_bytes(conn: Any) -> int:
    """The storage a connection's frame buffer holds beyond an empty bytearray's."""
    return sys.getsizeof(conn._session._decoder._buf) - sys.getsizeof(bytearray())


# --------------------------------------------------------------------------- modes


async def test_classic_direct_mode_and_reconnect() -> None:
    async with Cluster(classic=True) as cluster:
        seen: list[bytes] = []
        async with Producer(nsqd=cluster.nsqd_addresses) as producer:
            await producer.publish("events", b"first")  # creates the topic
            consumer = Consumer(
                "events",
                "c",
                nsqd=cluster.nsqd_addresses,
                handler=lambda m: seen.append(m.body),
                reconnect_backoff=FAST,
            )
            async with consumer:
                await cluster.wait_for(lambda: seen == [b"first"])
                assert consumer.stats().per_partition == {None: 1}
                await cluster.stop_node(0)
                await cluster.start_node(0)
                await producer.publish("events", b"after restart")
                await cluster.wait_for(lambda: b"after restart" in seen, 10)
                assert consumer.stats().reconnects >= 1


async def test_sub_advanced_start_position(cluster: Cluster) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for i in range(5):
            await producer.publish("events", f"old-{i}", partition=0)
    seen: list[Message] = []
    async with _consumer(
        cluster,
        "events",
        handler=seen.append,
        partitions=[0],
        start=StartPosition.message_count(4),  # 1-based: the 4th message
    ):
        await cluster.wait_for(lambda: len(seen) == 2)
    # After a seek nsqd redelivers from the position, not necessarily in queue order.
    assert sorted(m.body for m in seen) == [b"old-3", b"old-4"]
    assert all(m.offset is not None for m in seen)


async def test_ext_topic_headers_tags_and_payload_compression() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("ext", 1, 1, ext=True, channels=["c", "tagged"])
        seen: list[Message] = []
        async with _consumer(cluster, "ext", handler=seen.append):
            async with Producer(lookupd=[cluster.lookupd_url]) as producer:
                await producer.publish("ext", b"plain")
                await producer.publish("ext", b"with header", ext={"k": "v", "##trace_id": "9"})
                original = b"compressed " * 100
                await producer.publish(
                    "ext",
                    gzip.compress(original),
                    ext={"nsq.client.compress": "1", "nsq.msg.size": str(len(original))},
                )
                await producer.publish(
                    "ext",
                    snappy.compress(original),
                    ext={"nsq.client.compress": "2", "nsq.msg.size": str(len(original))},
                )
            await cluster.wait_for(lambda: len(seen) == 4)
        assert seen[0].ext is None
        assert seen[1].ext == {"k": "v", "##trace_id": "9"}
        assert seen[1].trace_id == 9
        assert seen[2].body == seen[3].body == b"compressed " * 100
        assert seen[2].ext == {}
        assert seen[3].ext == {}


async def test_follows_leader_moves(cluster: Cluster) -> None:
    seen: list[Message] = []
    async with _consumer(cluster, handler=seen.append, max_in_flight=10) as consumer:
        await cluster.move_leader("events", 0, to_node=(cluster.leader("events", 0) + 1) % 3)  # type: ignore[operator]
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("events", b"to the new leader", partition=0)
        await cluster.wait_for(lambda: len(seen) == 1, 10)
        assert seen[0].address == cluster.nsqd_addresses[cluster.leader("events", 0)]  # type: ignore[index]
        assert consumer.stats().connections == 4


async def test_lifecycle(cluster: Cluster) -> None:
    consumer = _consumer(cluster, handler=lambda m: None)
    await consumer.start()
    joined = asyncio.create_task(consumer.join())
    await asyncio.sleep(0)
    assert not joined.done()
    await consumer.close()
    await asyncio.wait_for(joined, 5)
    with pytest.raises(e.ClientClosedError):
        await consumer.start()
    with pytest.raises(e.ValidationError):
        Consumer("events", "c")
    with pytest.raises(e.ValidationError):
        Consumer("bad topic", "c", nsqd=["127.0.0.1:4150"])
    with pytest.raises(e.ValidationError, match="iterated"):
        _consumer(cluster, handler=lambda m: None).__aiter__()


async def test_direct_mode_start_fails_fast_when_no_nsqd_accepts() -> None:
    async with Cluster(classic=True) as cluster:
        address = cluster.nsqd_addresses[0]
        await cluster.stop_node(0)
        consumer = Consumer("events", "c", nsqd=[address], handler=lambda m: None, fail_fast=True)
        with pytest.raises(e.ConnectionClosedError):
            await consumer.start()
        with pytest.raises(e.UnsupportedFeatureError, match="lookupd"):
            Consumer("events", "c", nsqd=[address], handler=lambda m: None, ordered=True)
