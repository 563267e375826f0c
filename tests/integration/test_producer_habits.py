"""What users of other clients expect of a producer: publish_timeout as the one bound (an
explicit max_retries still stops earlier), stats(), a repr that says where it publishes, and
expected events (a planned leader move, a reset connection) logged at the right level."""

from __future__ import annotations

import asyncio
import logging

import pytest

from smartnsq import errors as e
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import DEFAULT_PUBLISH_TIMEOUT, Producer, ProducerStats
from smartnsq.publishing import flow as flow_module
from smartnsq.testing import Cluster

# Tries come fast with this backoff: the old default of 60 retries lasted well under 1 s.
RAPID = Backoff(initial=0.001, maximum=0.001)


def test_publish_timeout_is_the_one_bound_by_default() -> None:
    producer = Producer(lookupd=["127.0.0.1:4161"])
    assert producer.max_retries is None
    # The slowest failover measured on real youzan (2 replicas; docs/protocol.md, leader
    # change timings): writes came back after about 112 s.
    assert producer.publish_timeout == DEFAULT_PUBLISH_TIMEOUT > 112
    with pytest.raises(e.ValidationError):
        Producer(lookupd=["127.0.0.1:4161"], max_retries=-1)
    with pytest.raises(e.ValidationError):
        Producer(lookupd=["127.0.0.1:4161"], publish_timeout=True)  # type: ignore[arg-type]


async def test_retries_do_not_cut_publish_timeout_short() -> None:
    async with Cluster(classic=True, nodes=1) as cluster:
        address = cluster.nsqd_addresses[0]
        async with Producer(nsqd=[address], publish_timeout=10, retry_backoff=RAPID) as producer:
            await producer.publish("t", b"first")
            await cluster.stop_node(0)
            pending = asyncio.create_task(producer.publish("t", b"waits"))
            await asyncio.sleep(1.0)  # the outage: far more than 60 fast tries
            assert not pending.done()
            await cluster.start_node(0)
            result = await pending
            assert result.tries > 61


async def test_an_explicit_max_retries_still_stops_earlier() -> None:
    async with Cluster(classic=True, nodes=1) as cluster:
        address = cluster.nsqd_addresses[0]
        options = {"publish_timeout": 10, "retry_backoff": RAPID, "max_retries": 3}
        async with Producer(nsqd=[address], **options) as producer:  # type: ignore[arg-type]
            await cluster.stop_node(0)
            with pytest.raises(e.PublishError) as info:
                await producer.publish("t", b"x")
            assert info.value.tries == 4
            assert "max_retries=3" in str(info.value)
            assert isinstance(info.value.__cause__, e.ConnectionClosedError)
            assert producer.stats().failures == 1


async def test_stats_count_publishes_retries_failures_and_bytes() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 2, 2, channels=["c"])
        producer = Producer(lookupd=[cluster.lookupd_url], publish_timeout=0.5)
        assert producer.stats() == ProducerStats()
        async with producer:
            await producer.publish("t", b"abc", partition=0)
            await producer.publish("t", b"de", partition=1)
            await producer.publish_many("t", [b"f", b"gh"], partition=1)
            await cluster.set_writable("t", 0, False)
            with pytest.raises(e.PublishError):
                await producer.publish("t", b"lost", partition=0)
            stats = producer.stats()
            assert stats.published == 4
            assert stats.publishes == 3
            assert stats.published_bytes == 8
            assert stats.per_partition == {0: 1, 1: 3}
            assert stats.failures == 1
            assert stats.failed_messages == 1
            assert stats.retries >= 1
            assert stats.connections == 2
            stats.per_partition[0] = 99  # a snapshot: the producer's own counters stay
            assert producer.stats().per_partition[0] == 1
        assert producer.stats().connections == 0
        assert producer.stats().published == 4


async def test_batched_publishes_are_counted_per_message() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], linger=0.05) as producer:
            await asyncio.gather(*(producer.publish("t", f"m{i}") for i in range(10)))
            stats = producer.stats()
        assert stats.published == 10
        assert stats.publishes < 10  # MPUB batches, each counted once
        assert stats.published_bytes == 20


def test_repr_says_where_it_publishes() -> None:
    assert repr(Producer(lookupd=["10.0.0.1:4161", "http://10.0.0.2"])) == (
        "<Producer lookupd=10.0.0.1:4161,10.0.0.2:4161 new>"
    )
    assert repr(Producer(nsqd=["10.0.0.1:4150"])) == "<Producer nsqd=10.0.0.1:4150 new>"


async def test_a_planned_leader_move_is_information_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic("t", 1, 3, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("t", b"before", partition=0)
            leader = cluster.leader("t", 0)
            assert leader is not None
            await cluster.move_leader("t", 0, to_node=(leader + 1) % 3)
            result = await producer.publish("t", b"after", partition=0)
            assert result.tries > 1
            await cluster.drop_connections((leader + 1) % 3)  # a reset, as nsqd restarts do
            await producer.publish("t", b"reset", partition=0)
    records = [r for r in caplog.records if r.name == "smartnsq.producer"]
    assert not [r for r in records if r.levelno >= logging.WARNING]
    moved = [r.getMessage() for r in records if r.levelno == logging.INFO]
    assert len(moved) == 1
    assert "t partition 0: the leader moved from" in moved[0]
    assert any(r.levelno == logging.DEBUG and "retrying" in r.getMessage() for r in records)


async def test_a_long_outage_is_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.producer")
    monkeypatch.setattr(flow_module, "WARN_AFTER", 0.3)  # 5 s in real life
    async with Cluster(classic=True, nodes=1) as cluster:
        address = cluster.nsqd_addresses[0]
        async with Producer(nsqd=[address], publish_timeout=1) as producer:
            await cluster.stop_node(0)
            with pytest.raises(e.PublishError):
                await producer.publish("t", b"x")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "publishes to t have been failing for 0." in warnings[0]
    assert "still retrying, within publish_timeout" in warnings[0]
