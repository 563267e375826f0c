"""Producer auto-batching over real sockets."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from smartnsq import errors as e
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster


async def test_concurrent_publishes_become_batches() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 2, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], linger=0.005, max_batch=50) as producer:
            results = await asyncio.gather(*(producer.publish("t", f"m{i}") for i in range(1000)))
            assert producer.stats().publishes < 100  # ~10x fewer round trips at least
        assert len(results) == 1000
        assert {r.partition for r in results} == {0, 1}  # unkeyed batches spread
        bodies = sorted(r.body for r in cluster.messages("t"))
        assert bodies == sorted(f"m{i}".encode() for i in range(1000))


async def test_keyed_order_is_kept_per_partition() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 4, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], linger=0.002, max_batch=7) as p:
            sent: dict[int, list[bytes]] = defaultdict(list)
            tasks = []
            for i in range(600):
                key = i % 13
                body = f"{key}:{i}".encode()
                sent[key].append(body)
                tasks.append(asyncio.ensure_future(p.publish("t", body, sharding_key=key)))
            results = await asyncio.gather(*tasks)
        sharder = Sharder("java")
        for key, bodies in sent.items():
            partition = sharder.partition_for(key, 4)
            mine = [r.body for r in cluster.messages("t", partition) if r.body in set(bodies)]
            assert mine == bodies  # every key on its partition, in publish order
        keys = [i % 13 for i in range(600)]
        assert [r.partition for r in results] == [sharder.partition_for(k, 4) for k in keys]


async def test_each_caller_gets_the_batch_error() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = Producer(
            lookupd=[cluster.lookupd_url],
            linger=0.01,
            publish_timeout=0.3,
            retry_backoff=Backoff(initial=0.01, maximum=0.05),
        )
        async with producer:
            await producer.publish("t", b"warm")
            await cluster.set_writable("t", 0, False)
            results = await asyncio.gather(
                *(producer.publish("t", b"x", partition=0) for _ in range(5)),
                return_exceptions=True,
            )
        assert all(isinstance(r, e.PublishError) for r in results)
        assert len(cluster.messages("t")) == 1


async def test_traced_batches_give_receipts_per_message() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], linger=0.01, trace=True) as p:
            results = await asyncio.gather(*(p.publish("t", f"m{i}") for i in range(5)))
        records = cluster.messages("t")
        assert [r.internal_id for r in results] == [r.internal_id for r in records]
        assert [r.offset for r in results] == [r.offset for r in records]
        assert [r.trace_id for r in results] == [r.trace_id for r in records]


async def test_close_flushes_lingering_messages() -> None:
    async with Cluster(classic=True) as cluster:
        producer = Producer(nsqd=cluster.nsqd_addresses, linger=5.0)
        await producer.start()
        pending = asyncio.ensure_future(producer.publish("t", b"waiting"))
        await _until_batched(producer, 1)
        await asyncio.wait_for(producer.close(), 5)  # well before the 5 s linger
        assert (await pending).partition is None
        assert [r.body for r in cluster.messages("t")] == [b"waiting"]


async def test_close_refuses_new_publishes_and_sends_those_accepted() -> None:
    async with Cluster(classic=True) as cluster:
        producer = Producer(nsqd=cluster.nsqd_addresses, linger=5.0)
        await producer.start()
        accepted = asyncio.ensure_future(producer.publish("t", b"accepted"))
        await _until_batched(producer, 1)
        closing = asyncio.ensure_future(producer.close())
        await asyncio.sleep(0)  # one loop turn: close() has begun
        for late in (producer.publish("t", b"late"), producer.publish_many("t", [b"late"])):
            with pytest.raises(e.ClientClosedError, match="closing"):
                await late
        await asyncio.wait_for(closing, 5)
        assert (await accepted).partition is None
        assert [r.body for r in cluster.messages("t")] == [b"accepted"]


async def test_traced_auto_batches_fit_the_mpub_trace_frame() -> None:
    # 100 bodies of 52,420 bytes fit max_body_size as MPUB, not as MPUB_TRACE (8 bytes more
    # each): the batcher must count the trace ids, or every caller gets a ValidationError.
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        producer = Producer(lookupd=[cluster.lookupd_url], linger=0.05, max_batch=100, trace=True)
        async with producer:
            body = b"x" * 52_420
            results = await asyncio.wait_for(
                asyncio.gather(*(producer.publish("t", body) for _ in range(100))), 10
            )
        assert len(results) == 100
        assert len(cluster.messages("t")) == 100
        assert producer.stats().publishes == 2


async def _until_batched(producer: Producer, count: int) -> None:
    """Let the loop run until ``count`` publishes wait in the producer (for company)."""
    for _ in range(100):
        if producer.sender.flow.pending >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{count} publish(es) never reached the producer")
