"""ProducerStats.failures counts the publishes that raised once sent, as the reference
defines it: not those refused before anything was sent."""

from __future__ import annotations

import pytest

from smartnsq import errors as e
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster


async def test_publishes_refused_before_anything_was_sent_are_no_failures() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 2, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url], publish_timeout=0.5) as producer:
            await producer.publish("t", b"ok", partition=0)
            with pytest.raises(e.ValidationError, match="2 partitions"):
                await producer.publish("t", b"x", partition=99)
            with pytest.raises(e.ValidationError, match="2 partitions"):
                await producer.publish_many("t", [b"x", b"y"], partition=99)
            with pytest.raises(e.UnsupportedFeatureError, match="DPUB"):
                await producer.publish("t", b"x", delay=1)
            with pytest.raises(e.UnsupportedFeatureError, match="not an ext topic"):
                await producer.publish("t", b"x", ext={"k": "v"})
            assert (producer.stats().failures, producer.stats().failed_messages) == (0, 0)
            await cluster.set_writable("t", 1, False)
            with pytest.raises(e.PublishError):
                await producer.publish_many("t", [b"x", b"y"], partition=1)
            stats = producer.stats()
        assert (stats.failures, stats.failed_messages, stats.published) == (1, 2, 1)
        assert len(cluster.messages("t")) == 1
