"""A publish returns or raises PublishError within ``publish_timeout`` when the network
misbehaves (issue 27, items 1 and 2): a half-open link, a server that stops reading, an nsqd
refusing connections in direct mode. A try that was sent and never answered makes the error
say that the outcome is unknown."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from typing import Any

import pytest

from smartnsq import errors as e
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

PUBLISH_TIMEOUT = 2.0
# What a publish may outlast its bound by on a busy machine (the loop's own delays).
SLACK = 1.0
QUICK = Backoff(initial=0.02, maximum=0.1)


async def _raises_in_time(
    publish: Awaitable[Any], bound: float = PUBLISH_TIMEOUT
) -> e.PublishError:
    """``publish`` raises a PublishError within ``bound`` (+ SLACK) seconds."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(e.PublishError) as info:
        await asyncio.wait_for(publish, bound + 20)
    took = loop.time() - began
    assert took < bound + SLACK, f"raised after {took:.1f} s"
    return info.value


async def _producer_on(cluster: Cluster, **options: Any) -> Producer:
    if cluster.classic:
        return Producer(nsqd=cluster.nsqd_addresses, **options)
    await cluster.create_topic("t", 1, 1, channels=["c"])
    return Producer(lookupd=[cluster.lookupd_url], **options)


@pytest.mark.parametrize("classic", [False, True], ids=["youzan", "classic-direct"])
async def test_a_half_open_link_ends_a_publish_by_its_deadline(classic: bool) -> None:
    """Before: request_timeout (10 s) after publish_timeout, 12 s in all."""
    async with Cluster(nodes=1, classic=classic) as cluster:
        producer = await _producer_on(cluster, publish_timeout=PUBLISH_TIMEOUT)
        async with producer:
            await producer.publish("t", b"warm")  # the connection is open
            cluster.blackhole(0)  # nothing answers: no FIN, no RST
            error = await _raises_in_time(producer.publish("t", b"held"))
            assert error.outcome_unknown  # the PUB was sent: nsqd may have stored it
            assert "may have stored it" in str(error)
            cluster.heal(0)
        # What the half-open link held reached nsqd on heal: the outcome was indeed unknown.
        await cluster.wait_for(lambda: len(cluster.messages("t", 0 if not classic else None)) == 2)


async def test_a_server_that_stops_reading_cannot_hold_publishes_past_their_deadline() -> None:
    """600 publishes of 64 KiB to an nsqd that reads nothing: each ends by its deadline,
    waiting for nsqd to read rather than in an ever larger write buffer (before: 10-12 s)."""
    async with Cluster(nodes=1, classic=True) as cluster:
        async with Producer(
            nsqd=cluster.nsqd_addresses, publish_timeout=PUBLISH_TIMEOUT
        ) as producer:
            await producer.publish("t", b"warm")
            cluster.blackhole(0)
            body = b"x" * (64 << 10)
            loop = asyncio.get_running_loop()
            began = loop.time()
            outcomes = await asyncio.wait_for(
                asyncio.gather(
                    *(producer.publish("t", body) for _ in range(600)), return_exceptions=True
                ),
                PUBLISH_TIMEOUT + 20,
            )
            took = loop.time() - began
            cluster.heal(0)
        assert took < PUBLISH_TIMEOUT + SLACK, f"the last publish ended after {took:.1f} s"
        assert all(isinstance(outcome, e.PublishError) for outcome in outcomes)


def _closed_port() -> str:
    """An address where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_a_direct_publish_retries_an_nsqd_that_refuses_connections() -> None:
    """Before: ConnectionClosedError at once, after 2 connection attempts."""
    producer = Producer(nsqd=[_closed_port()], publish_timeout=1.0, retry_backoff=QUICK)
    try:
        error = await _raises_in_time(producer.publish("t", b"x"), 1.0)
    finally:
        await producer.close()
    assert error.tries > 2
    assert not error.outcome_unknown  # nothing was ever sent
    assert isinstance(error.__cause__, e.ConnectionClosedError)


async def test_a_direct_publish_goes_through_once_nsqd_listens_again() -> None:
    async with Cluster(nodes=1, classic=True) as cluster:
        await cluster.stop_node(0)  # its port refuses connections
        # Not started first: start() itself says at once that no nsqd accepted (its
        # contract); a publish retries within its deadline.
        producer = Producer(nsqd=cluster.nsqd_addresses, publish_timeout=20, retry_backoff=QUICK)
        try:
            publish = asyncio.ensure_future(producer.publish("t", b"x"))
            await cluster.wait_for(lambda: producer.stats().retries >= 2)
            await cluster.start_node(0)
            result = await asyncio.wait_for(publish, 20)
        finally:
            await producer.close()
        assert result.tries >= 3
        assert [record.body for record in cluster.messages("t")] == [b"x"]


async def test_an_answered_failure_is_no_unknown_outcome() -> None:
    """nsqd refused every try (a partition that is not writable): nothing was stored."""
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        async with Producer(
            lookupd=[cluster.lookupd_url], publish_timeout=1.0, retry_backoff=QUICK
        ) as producer:
            await producer.publish("t", b"warm", partition=0)
            await cluster.set_writable("t", 0, False)
            error = await _raises_in_time(producer.publish("t", b"x", partition=0), 1.0)
        assert not error.outcome_unknown


async def test_every_wait_of_a_direct_publish_is_cut_at_its_deadline() -> None:
    """Classic nsqd in direct mode behind a half-open link, publishes one after the other:
    each ends by its own deadline, whether it waited for an answer, for the connection the
    link holds half-open, or for a new one (on real nsqd 1.3.0, 1 of 15 took 10 s, twice
    its bound: "ran out of time waiting for a connection (try 2)")."""
    async with (
        Cluster(nodes=1, classic=True) as cluster,
        Producer(nsqd=cluster.nsqd_addresses, publish_timeout=0.5, retry_backoff=QUICK) as producer,
    ):
        await producer.publish("t", b"warm")
        cluster.blackhole(0)  # the open connection and every new one: silent
        for number in range(8):
            await _raises_in_time(producer.publish("t", b"%d" % number), 0.5)
        cluster.heal(0)
        await producer.publish("t", b"after")  # and it recovers
