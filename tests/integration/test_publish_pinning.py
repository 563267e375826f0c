"""A keyed publish is pinned to its partition at its first routing, also when that partition
has no writable leader then: it waits for that partition, and the error names it."""

from __future__ import annotations

import pytest

from smartnsq import errors as e
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster


async def test_a_keyed_publish_without_a_leader_stays_pinned_and_says_where() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("t", 2, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], publish_timeout=0.5) as producer:
            partition = producer.options.sharder.partition_for("k", 2)
            await cluster.set_writable("t", partition, False)
            with pytest.raises(e.PublishError) as info:
                await producer.publish("t", b"x", sharding_key="k")
        assert info.value.partition == partition
        assert cluster.messages("t") == []
