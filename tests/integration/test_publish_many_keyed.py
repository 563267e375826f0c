"""``Producer.publish_many(topic, bodies, sharding_keys=[...])`` against the embedded cluster:
every message lands where ``publish(sharding_key=...)`` puts its key, in input order per key,
one MPUB per partition (or classic nsqd), with results in input order; bad input raises
before anything is sent."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest

import smartnsq.sync
from smartnsq import errors as e
from smartnsq.producer.producer import Producer
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster

from .threaded_cluster import ThreadedCluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=3) as c:
        await c.create_topic("orders", 4, 2, channels=["billing"])
        yield c


def _keys(count: int) -> list[object]:
    """Int and str keys, a few values each, interleaved (and a negative, a large int)."""
    pool: list[object] = [7, -3, 2**40 + 5, "customer-1", "kunde-ü", "c-9", 0]
    return [pool[i % len(pool)] for i in range(count)]


async def test_keys_land_on_their_partitions_in_order(cluster: Cluster) -> None:
    keys = _keys(350)
    bodies = [f"m{i}".encode() for i in range(len(keys))]
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        single = {
            k: (await producer.publish("orders", b"probe", sharding_key=k)).partition
            for k in dict.fromkeys(keys)
        }
        results = await producer.publish_many("orders", bodies, sharding_keys=keys)
    sharder = Sharder("java")
    assert [r.partition for r in results] == [sharder.partition_for(k, 4) for k in keys]
    assert [r.partition for r in results] == [single[k] for k in keys]
    by_key: dict[object, list[bytes]] = defaultdict(list)
    for key, body in zip(keys, bodies, strict=True):
        by_key[key].append(body)
    for key, expected in by_key.items():
        logged = [
            r.body for r in cluster.messages("orders", single[key]) if r.body in set(expected)
        ]
        assert logged == expected, f"key {key!r} lost its order"
    assert sum(len(cluster.messages("orders", p)) for p in range(4)) == len(keys) + len(single)


async def test_one_batch_per_partition_with_trace_ids(cluster: Cluster) -> None:
    keys = _keys(40)
    ids = [1000 + i for i in range(len(keys))]
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        results = await producer.publish_many(
            "orders", [f"t{i}" for i in range(len(keys))], sharding_keys=keys, trace_ids=ids
        )
    assert [r.trace_id for r in results] == ids
    for partition in {r.partition for r in results}:
        mine = [r for r in results if r.partition == partition]
        # one atomic MPUB_TRACE per partition: consecutive internal ids, in input order
        first = mine[0].internal_id
        assert first is not None
        assert [r.internal_id for r in mine] == list(range(first, first + len(mine)))
        records = {r.internal_id: r for r in cluster.messages("orders", partition)}
        assert [records[r.internal_id].trace_id for r in mine] == [r.trace_id for r in mine]


async def test_murmur3_and_ext_headers() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("ext", 3, 1, ext=True, channels=["c"])
        keys = ["a", "b", "c", "d", "e", "a"]
        # stamps=False: the headers go exactly as given (no sequence stamp added)
        async with Producer(
            lookupd=[cluster.lookupd_url], sharding="murmur3", stamps=False
        ) as producer:
            results = await producer.publish_many(
                "ext",
                [b"1", b"2", b"3", b"4", b"5", b"6"],
                sharding_keys=keys,
                exts=[{"n": str(i)} if i % 2 else None for i in range(6)],
            )
        sharder = Sharder("murmur3")
        assert [r.partition for r in results] == [sharder.partition_for(k, 3) for k in keys]
        logged = {r.body: r.ext_raw for p in range(3) for r in cluster.messages("ext", p)}
        assert logged[b"2"] == b'{"n":"1"}'
        assert not logged[b"1"]


async def test_classic_nsqd_by_key() -> None:
    async with Cluster(classic=True, nodes=2) as cluster:
        addresses = cluster.nsqd_addresses
        keys = _keys(30)
        async with Producer(nsqd=addresses) as producer:
            results = await producer.publish_many(
                "events", [f"e{i}" for i in range(len(keys))], sharding_keys=keys
            )
            alone = [(await producer.publish("events", b"p", sharding_key=k)).address for k in keys]
        sharder = Sharder("java")
        assert [r.address for r in results] == [
            addresses[sharder.partition_for(k, 2)] for k in keys
        ]
        assert [r.address for r in results] == alone
        assert {r.partition for r in results} == {None}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"sharding_keys": [1]}, "sharding_keys"),  # one key for two bodies
        ({"sharding_keys": [1, None]}, "sharding_keys[1]"),
        ({"sharding_keys": [1, True]}, "sharding_keys[1]"),
        ({"sharding_keys": [b"k", 1]}, "sharding_keys[0]"),  # bytes: not with java sharding
        ({"sharding_keys": [1, 2], "partition": 0}, "sharding_keys"),
        ({"sharding_keys": [1, 2], "sharding_key": 3}, "sharding_keys"),
        ({"sharding_keys": [1, 2], "trace_ids": [1]}, "trace_ids"),
    ],
)
async def test_bad_input_sends_nothing(
    cluster: Cluster, kwargs: dict[str, object], field: str
) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        with pytest.raises(e.ValidationError) as raised:
            await producer.publish_many("orders", [b"a", b"b"], **kwargs)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert cluster.messages("orders") == []


async def test_each_partition_batch_is_checked_against_max_body_size(cluster: Cluster) -> None:
    body = b"x" * 400
    # 3 keys on the same partition exceed the 1 KiB limit together; other keys do not.
    sharder = Sharder("java")
    same = [k for k in range(200) if sharder.partition_for(k, 4) == 0][:3]
    async with Producer(lookupd=[cluster.lookupd_url], max_body_size=1024) as producer:
        spread = [k for k in range(4) if sharder.partition_for(k, 4) != 0][:2]
        ok = await producer.publish_many("orders", [body] * 3, sharding_keys=[same[0], *spread])
        assert len(ok) == 3  # 1.2 KiB in total, but no partition's batch is over 1 KiB
        before = len(cluster.messages("orders"))
        with pytest.raises(e.ValidationError, match="partition 0"):
            await producer.publish_many("orders", [body] * 3, sharding_keys=same)
    assert len(cluster.messages("orders")) == before


def test_sync_facade_forwards_sharding_keys() -> None:
    with ThreadedCluster(nodes=1) as tc:
        tc.run(tc.cluster.create_topic("orders", 2, 1, channels=["billing"]))
        with smartnsq.sync.Producer(lookupd=[tc.lookupd_url]) as producer:
            results = producer.publish_many("orders", [b"a", b"b", b"c"], sharding_keys=[1, 2, 1])
    sharder = Sharder("java")
    assert [r.partition for r in results] == [sharder.partition_for(k, 2) for k in (1, 2, 1)]


async def test_keyed_batches_join_their_lanes_when_called(cluster: Cluster) -> None:
    """publish_many's batches take their places in their partitions' lanes when it is
    called: a publish of the same key called after it is stored after them (before, its
    batches left from tasks of their own, after publishes called later)."""
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        await producer.publish("orders", b"warm", sharding_key="k")  # the layout is known
        first = asyncio.ensure_future(
            producer.publish_many("orders", [b"1", b"2", b"x"], sharding_keys=["k", "k", "y"])
        )
        second = asyncio.ensure_future(producer.publish("orders", b"3", sharding_key="k"))
        await asyncio.gather(first, second)
        partition = second.result().partition
    stored = [r.body for r in cluster.messages("orders", partition) if r.body in (b"1", b"2", b"3")]
    assert stored == [b"1", b"2", b"3"]
