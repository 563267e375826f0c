"""The Producer against the embedded cluster over real sockets: routing, receipts, batches,
classic mode, every retry path (then the cluster's log proves nothing was lost, duplicated
by the client, or moved off its key's partition), timeouts and bad input."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator

import pytest

from smartnsq import errors as e
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.stamps import parse_stamp
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster

FAST_RETRY = Backoff(initial=0.01, maximum=0.1)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=3) as c:
        await c.create_topic("orders", 4, 3, channels=["billing"])
        yield c


def _producer(cluster: Cluster, **kwargs: object) -> Producer:
    kwargs.setdefault("retry_backoff", FAST_RETRY)
    return Producer(lookupd=[cluster.lookupd_url], **kwargs)  # type: ignore[arg-type]


def _check_log(
    cluster: Cluster,
    topic: str,
    published: dict[bytes, PublishResult],
    keys: dict[bytes, object] | None = None,
) -> None:
    """Every acknowledged body is in the log exactly once (or twice when a retry followed a
    lost acknowledgement: at-least-once), on the partition its result names; keyed bodies
    are on their key's partition, in publish order per key."""
    partitions = cluster.topology(topic)
    where: dict[bytes, list[int]] = defaultdict(list)
    order: dict[int, list[bytes]] = {}
    for p in partitions:
        order[p] = [r.body for r in cluster.messages(topic, p)]
        for body in order[p]:
            where[body].append(p)
    for body, result in published.items():
        assert where[body], f"{body!r} was acknowledged but is not in the log"
        assert result.partition in where[body]
        if len(where[body]) > 1:
            assert result.tries > 1, f"{body!r} duplicated without a retry"
    unexpected = set(where) - set(published)
    assert not unexpected
    if keys:
        sharder = Sharder("java")
        by_key: dict[object, list[bytes]] = defaultdict(list)
        for body, key in keys.items():
            by_key[key].append(body)
        for key, bodies in by_key.items():
            expected = sharder.partition_for(key, len(partitions))
            assert all(set(where[b]) == {expected} for b in bodies), key
            mine = set(bodies)
            first_seen = list(dict.fromkeys(b for b in order[expected] if b in mine))
            assert first_seen == bodies, f"key {key!r} out of order"


# --------------------------------------------------------------------------- routing


async def test_round_robin_explicit_and_keyed(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        results = [await producer.publish("orders", f"rr{i}") for i in range(40)]
        assert Counter(r.partition for r in results) == {0: 10, 1: 10, 2: 10, 3: 10}
        for result in results:
            leader = cluster.leader("orders", result.partition)  # type: ignore[arg-type]
            assert result.address == cluster.nsqd_addresses[leader]  # type: ignore[index]
            assert result.tries == 1
        explicit = await producer.publish("orders", b"p2", partition=2)
        assert explicit.partition == 2
        keyed = [await producer.publish("orders", f"k{i}", sharding_key=12345) for i in range(5)]
        expected = Sharder("java").partition_for(12345, 4)
        assert {r.partition for r in keyed} == {expected}
        murmur = _producer(cluster, sharding="murmur3")
        async with murmur:
            result = await murmur.publish("orders", b"m", sharding_key="customer-7")
            assert result.partition == Sharder("murmur3").partition_for("customer-7", 4)


async def test_trace_receipts(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        await producer.publish("orders", b"before", partition=1)
        result = await producer.publish("orders", b"traced body", partition=1, trace_id=424242)
        record = cluster.messages("orders", 1)[-1]
        assert result.internal_id == record.internal_id
        assert result.trace_id == 424242 == record.trace_id
        assert (result.offset, result.size) == (record.offset, record.raw_size)
        plain = await producer.publish("orders", b"plain", partition=1)
        assert plain.internal_id is None


async def test_publish_many_and_receipts(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        plain = await producer.publish_many("orders", [b"a", b"b", b"c"], partition=0)
        assert [r.partition for r in plain] == [0, 0, 0]
        traced = await producer.publish_many(
            "orders", [b"x", b"yy", b"zzz"], partition=0, trace=True
        )
        records = cluster.messages("orders", 0)[-3:]
        assert [r.internal_id for r in traced] == [r.internal_id for r in records]
        assert [r.offset for r in traced] == [r.offset for r in records]
        assert [r.size for r in traced] == [r.raw_size for r in records]
        assert [r.trace_id for r in traced] == [r.trace_id for r in records]
        keyed = await producer.publish_many("orders", [b"1", b"2"], sharding_key="c-1")
        assert len({r.partition for r in keyed}) == 1


async def test_ext_headers() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("ext", 2, 1, ext=True, channels=["c"])
        await cluster.create_topic("plain", 1, 1, channels=["c"])
        async with _producer(cluster) as producer:
            result = await producer.publish("ext", b"body", partition=1, ext={"k": "v"})
            assert result.internal_id is None  # no ##trace_id: plain OK
            record = cluster.messages("ext", 1)[-1]
            assert json.loads(record.ext_raw)["k"] == "v"
            # keyed to partition 1: the producer's sequence stamp rides along
            stamp = parse_stamp(record.ext_raw)
            assert stamp is not None
            assert (stamp.seq, stamp.floor) == (1, 1)
            traced = await producer.publish(
                "ext", b"body", partition=1, ext={"##trace_id": "77", "k": "v"}
            )
            assert traced.trace_id == 77
            # trace_id= with ext=: the id travels in the header (never dropped)
            both = await producer.publish("ext", b"body", partition=1, trace_id=78, ext={"k": "v"})
            assert (both.trace_id, cluster.messages("ext", 1)[-1].trace_id) == (78, 78)
            same = await producer.publish(
                "ext", b"body", partition=1, trace_id=79, ext={"##trace_id": "79"}
            )
            assert same.trace_id == 79
            with pytest.raises(e.ValidationError, match="differs from trace_id=80"):
                await producer.publish(
                    "ext", b"body", partition=1, trace_id=80, ext={"##trace_id": "81"}
                )
            producer.set_trace(True, "ext")  # the switch traces ext publishes too
            switched = await producer.publish("ext", b"body", partition=1, ext={"k": "v"})
            assert switched.trace_id == cluster.messages("ext", 1)[-1].trace_id
            assert switched.internal_id is not None
            kept = await producer.publish("ext", b"body", partition=1, ext={"##trace_id": "82"})
            assert kept.trace_id == 82
            producer.set_trace(False, "ext")
            await producer.publish_many("ext", [b"a", b"b"], partition=0, exts=[{"a": "1"}, None])
            first, second = cluster.messages("ext", 0)[-2:]
            assert json.loads(first.ext_raw)["a"] == "1"
            stamps = [parse_stamp(first.ext_raw), parse_stamp(second.ext_raw)]
            assert [s.seq for s in stamps if s is not None] == [1, 2]  # one number each
            with pytest.raises(e.UnsupportedFeatureError, match="not an ext topic"):
                await producer.publish("plain", b"x", ext={"k": "v"})
            assert cluster.messages("plain") == []
            with pytest.raises(e.UnsupportedFeatureError, match="DPUB"):
                await producer.publish("plain", b"x", delay=1)


# --------------------------------------------------------------------------- classic


async def test_classic_direct_mode() -> None:
    async with Cluster(classic=True, nodes=2) as cluster:
        async with Producer(nsqd=cluster.nsqd_addresses) as producer:
            results = [await producer.publish("events", f"e{i}") for i in range(4)]
            assert {r.partition for r in results} == {None}
            assert {r.address for r in results} == set(cluster.nsqd_addresses)
            await producer.publish("events", b"later", delay=0.5)
            batch = await producer.publish_many("events", [b"1", b"2"])
            assert len(batch) == 2
            for kwargs in ({"trace_id": 1}, {"ext": {"k": "v"}}, {"partition": 0}):
                with pytest.raises(e.UnsupportedFeatureError):
                    await producer.publish("events", b"x", **kwargs)  # type: ignore[arg-type]
        assert len(cluster.messages("events")) == 7


async def test_classic_lookupd_mode() -> None:
    async with Cluster(classic=True) as cluster:
        async with Producer(nsqd=cluster.nsqd_addresses) as seed:
            await seed.publish("events", b"creates the topic")
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            result = await producer.publish("events", b"via lookupd")
            assert result.partition is None
            assert result.address == cluster.nsqd_addresses[0]
            # A new topic: classic NSQ creates it on the first PUB to any nsqd (/nodes).
            created = await producer.publish("brand-new", b"first")
            assert created.address == cluster.nsqd_addresses[0]
        assert [r.body for r in cluster.messages("brand-new")] == [b"first"]


# --------------------------------------------------------------------------- retries


async def _publish_stream(
    producer: Producer, count: int, *, keys: int = 10, concurrency: int = 20
) -> tuple[dict[bytes, PublishResult], dict[bytes, object]]:
    """Publish ``count`` keyed messages from ``concurrency`` workers; per key one at a time
    (a key's messages must be published sequentially to be ordered)."""
    published: dict[bytes, PublishResult] = {}
    key_of: dict[bytes, object] = {}
    queues: dict[int, list[bytes]] = defaultdict(list)
    for i in range(count):
        body = f"msg-{i}".encode()
        queues[i % keys].append(body)
        key_of[body] = i % keys

    async def worker(key: int) -> None:
        for body in queues[key]:
            published[body] = await producer.publish("orders", body, sharding_key=key)

    await asyncio.gather(*(worker(k) for k in range(keys)))
    return published, key_of


async def test_retry_on_move_leader_mid_stream(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        stream = asyncio.create_task(_publish_stream(producer, 600))
        for partition in range(4):
            await cluster.wait_for(
                lambda p=partition: len(cluster.messages("orders")) > 100 * (p + 1)
            )
            leader = cluster.leader("orders", partition)
            await cluster.move_leader("orders", partition, to_node=(leader + 1) % 3)  # type: ignore[operator]
        published, keys = await stream
    assert any(r.tries > 1 for r in published.values())
    _check_log(cluster, "orders", published, keys)


async def test_retry_through_node_crash_with_failover_delay() -> None:
    async with Cluster(nodes=3, failover_delay=0.5) as cluster:
        await cluster.create_topic("orders", 4, 3, channels=["billing"])
        async with _producer(cluster) as producer:
            stream = asyncio.create_task(_publish_stream(producer, 400))
            await cluster.wait_for(lambda: len(cluster.messages("orders")) > 100)
            started = time.monotonic()
            await cluster.stop_node(0)
            published, keys = await stream
            assert time.monotonic() - started >= 0.4  # some publishes waited for the failover
        assert any(r.tries > 1 for r in published.values())
        _check_log(cluster, "orders", published, keys)


async def test_retry_until_partition_writable(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="smartnsq.producer")

    def retries() -> int:
        return sum("retrying" in r.getMessage() for r in caplog.records)

    async with _producer(cluster) as producer:
        await cluster.set_writable("orders", 1, False)
        pending = asyncio.create_task(producer.publish("orders", b"waits", partition=1))
        await cluster.wait_for(lambda: retries() >= 1)  # refused, waiting for a leader
        await asyncio.sleep(0.5)  # a while after: still waiting (this test's point, not sync)
        assert not pending.done()
        await cluster.set_writable("orders", 1, True)
        result = await pending
        assert result.partition == 1
        assert result.tries > 1
        # an unkeyed publish moves to another writable partition at once
        await cluster.set_writable("orders", 2, False)
        moved = [await producer.publish("orders", f"u{i}") for i in range(8)]
        assert 2 not in {r.partition for r in moved}
        await cluster.set_writable("orders", 2, True)


async def test_retry_after_dropped_connections(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        stream = asyncio.create_task(_publish_stream(producer, 400))
        for node in range(3):
            await cluster.wait_for(lambda n=node: len(cluster.messages("orders")) > 100 * (n + 1))
            await cluster.drop_connections(node)
        published, keys = await stream
    _check_log(cluster, "orders", published, keys)


async def test_publish_timeout(cluster: Cluster) -> None:
    async with _producer(cluster, publish_timeout=0.5, request_timeout=0.2) as producer:
        leader = cluster.leader("orders", 0)
        cluster.set_latency(leader, 2.0)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(e.PublishError) as info:
            await producer.publish("orders", b"slow", partition=0)
        assert time.monotonic() - started < 1.5
        assert isinstance(info.value.__cause__, e.NSQTimeoutError)
        assert info.value.partition == 0
        assert info.value.tries >= 2
        cluster.set_latency(leader, 0)  # type: ignore[arg-type]


async def test_keyed_publish_never_moves(cluster: Cluster) -> None:
    key = "customer-42"
    partition = Sharder("java").partition_for(key, 4)
    async with _producer(cluster, publish_timeout=0.5) as producer:
        await cluster.set_writable("orders", partition, False)
        with pytest.raises(e.PublishError) as info:
            await producer.publish("orders", b"x", sharding_key=key)
        assert info.value.partition == partition
        assert cluster.messages("orders") == []


# --------------------------------------------------------------------------- fail fast


async def test_bad_input_fails_fast_and_sends_nothing(cluster: Cluster) -> None:
    async with _producer(cluster) as producer:
        cases = [
            ({"topic": "orders", "body": b""}, "body"),
            ({"topic": "bad topic", "body": b"x"}, "topic"),
            ({"topic": "orders", "body": b"x", "partition": -1}, "partition"),
            ({"topic": "orders", "body": b"x", "partition": 1, "sharding_key": 1}, "partition"),
            ({"topic": "orders", "body": b"x", "sharding_key": True}, "sharding_key"),
            ({"topic": "orders", "body": b"x" * (1024 * 1024 + 1)}, "body"),
            ({"topic": "orders", "body": b"x", "trace_id": -1}, "trace_id"),
            ({"topic": "orders", "body": b"x", "ext": {"##trace_id": 5}}, "ext['##trace_id']"),
            ({"topic": "orders", "body": b"x", "partition": 9}, "partition"),
        ]
        for kwargs, field in cases:
            with pytest.raises(e.ValidationError) as info:
                await producer.publish(**kwargs)  # type: ignore[arg-type]
            assert info.value.field == field
        with pytest.raises(e.ValidationError):
            await producer.publish_many("orders", [])
    assert cluster.messages("orders") == []


async def test_server_rejection_is_not_retried() -> None:
    async with Cluster(nodes=1, max_msg_size=100) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        async with _producer(cluster) as producer:
            with pytest.raises(e.BadMessageError):
                await producer.publish("t", b"x" * 200)
            assert (await producer.publish("t", b"small")).tries == 1


async def test_topic_errors(cluster: Cluster) -> None:
    await cluster.create_topic("fresh", 2, 1)  # no channel yet
    async with _producer(cluster) as producer:
        with pytest.raises(e.TopicNotFoundError):
            await producer.publish("missing", b"x")
        with pytest.raises(e.TopicHasNoChannelError, match="start a consumer first"):
            await producer.publish("fresh", b"x")


async def test_lifecycle() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = _producer(cluster)
        result = await producer.publish("t", b"lazy start")  # start() on first use
        assert result.tries == 1
        await producer.close()
        with pytest.raises(e.ClientClosedError):
            await producer.publish("t", b"x")
        with pytest.raises(e.ClientClosedError):
            await producer.start()
        with pytest.raises(e.ValidationError):
            Producer()
        with pytest.raises(e.ValidationError):
            Producer(lookupd=[cluster.lookupd_url], nsqd=cluster.nsqd_addresses)
        url = cluster.lookupd_url
    unreachable = Producer(lookupd=[url], connect_timeout=1)
    with pytest.raises(e.LookupFailedError):
        await unreachable.start()
    await unreachable.close()
