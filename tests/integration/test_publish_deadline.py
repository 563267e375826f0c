"""One deadline per publish: every try, the connection it waits for and the answer it waits
for end by what remains of ``publish_timeout`` (or the publish's ``timeout``), whatever
``request_timeout`` says. Slow answers come from a node's write latency."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq import errors as e
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

# How late the node answers; every bound below is far shorter.
LATENCY = 4.0
# What a publish may outlast its bound by on a busy machine (the loop's own delays).
SLACK = 1.5


async def _raises_within(publish: asyncio.Future[object] | object, bound: float) -> e.NSQError:
    """Await ``publish``; it must raise a PublishError within ``bound`` (+ SLACK) seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(e.PublishError) as info:
        await asyncio.wait_for(publish, LATENCY + 5)  # type: ignore[arg-type]
    assert loop.time() - began < bound + SLACK
    return info.value


async def test_the_connection_a_first_try_waits_for_is_cut_at_the_deadline() -> None:
    """The first publish to a partition connects to its leader: the handshake is waited for
    within the publish's time, not within connect and request timeouts of its own."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        cluster.set_latency(0, LATENCY)  # every answer of the nsqd comes 4 s late
        async with Producer(lookupd=[cluster.lookupd_url], publish_timeout=0.5) as producer:
            error = await _raises_within(producer.publish("t", b"x"), 0.5)
            assert isinstance(error.__cause__, e.NSQTimeoutError)
        cluster.set_latency(0, 0)


async def test_an_answer_queued_behind_a_later_deadline_is_cut_at_its_own() -> None:
    """The connection watches the time of its oldest request only: a publish with a short
    timeout queued behind one with a long timeout still ends by its own deadline."""
    async with Cluster(classic=True, nodes=1) as cluster:
        address = cluster.nsqd_addresses[0]
        async with Producer(nsqd=[address], publish_timeout=30) as producer:
            await producer.publish("t", b"warm")
            cluster.set_latency(0, LATENCY)
            patient = asyncio.create_task(producer.publish("t", b"patient"))
            await asyncio.sleep(0)  # the patient PUB is the oldest request on the connection
            await _raises_within(producer.publish("t", b"hurried", timeout=0.5), 0.5)
            assert (await patient).tries == 1
            cluster.set_latency(0, 0)
