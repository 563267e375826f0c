"""How a Consumer starts when its servers are not there yet, or when something no retry can
fix is wrong (issue 28, items 1 and 4): by default start() returns, says so once at WARNING
and keeps trying in the background, subscribing as soon as the servers answer (services
started by an orchestrator often come up before nsqlookupd); fail_fast=True raises instead;
a subscribe nsqd refuses for good reaches on_error and start()/join() raise it."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from smartnsq import errors as e
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

QUICK = Backoff(initial=0.02, maximum=0.1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_consumer_started_before_nsqlookupd_waits_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: start() raised LookupFailedError 0.1 s after logging the failure."""
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    port = _free_port()
    handled = asyncio.Event()

    def handle(message: Message) -> None:
        handled.set()

    consumer = Consumer(
        "orders",
        "c",
        lookupd=[f"http://127.0.0.1:{port}"],
        handler=handle,
        connect_timeout=1.0,
        reconnect_backoff=QUICK,
    )
    async with consumer:  # returns although nothing listens
        assert len(_warnings(caplog)) == 1  # said once, not twice
        assert "fail_fast=True" in _warnings(caplog)[0]
        # nsqlookupd (and its cluster) come up on the port the consumer was given
        async with Cluster(nodes=1, lookupd_port=port) as cluster:
            await cluster.create_topic("orders", 1, 1, channels=["c"])
            async with Producer(lookupd=[cluster.lookupd_url]) as producer:
                await producer.publish("orders", b"x")
            await asyncio.wait_for(handled.wait(), 15)
            # Counted before the cluster stops: its nsqd closing the connection under the
            # running consumer is a warning of its own.
            assert len(_warnings(caplog)) == 1


async def test_fail_fast_raises_at_start() -> None:
    port = _free_port()
    consumer = Consumer("orders", "c", lookupd=[f"127.0.0.1:{port}"], fail_fast=True)
    with pytest.raises(e.LookupFailedError):
        await consumer.start()
    await consumer.close()
    direct = Consumer("orders", "c", nsqd=[f"127.0.0.1:{port}"], fail_fast=True)
    with pytest.raises(e.ConnectionClosedError):
        await direct.start()
    await direct.close()


async def test_a_direct_consumer_started_before_nsqd_waits_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="smartnsq")
    async with Cluster(nodes=1, classic=True) as cluster:
        await cluster.stop_node(0)
        handled = asyncio.Event()
        consumer = Consumer(
            "events",
            "c",
            nsqd=cluster.nsqd_addresses,
            handler=lambda message: handled.set(),
            reconnect_backoff=QUICK,
        )
        async with consumer:
            assert any("retrying in the background" in m for m in _warnings(caplog))
            await cluster.start_node(0)
            async with Producer(nsqd=cluster.nsqd_addresses) as producer:
                await producer.publish("events", b"x")
            await asyncio.wait_for(handled.wait(), 15)


async def test_a_subscribe_no_retry_can_fix_raises_from_start() -> None:
    """An HTTP port given as nsqd's: before, retried silently for ever."""
    async with Cluster(nodes=1, classic=True) as cluster:
        errors: list[BaseException] = []
        consumer = Consumer(
            "events",
            "c",
            nsqd=cluster.nsqd_http_addresses,
            on_error=errors.append,
            reconnect_backoff=QUICK,
        )
        with pytest.raises(e.NotNsqdError, match="HTTP port"):
            await consumer.start()
        await consumer.close()
    assert len(errors) == 1
    assert isinstance(errors[0], e.NotNsqdError)


async def test_a_subscribe_no_retry_can_fix_reaches_on_error_and_join() -> None:
    """A start position on classic nsqd, found out once the topic exists (after start()
    returned): before, 'subscribing failed ...; retrying' for ever, on_error never called."""
    async with Cluster(nodes=1, classic=True) as cluster:
        errors: list[BaseException] = []
        consumer = Consumer(
            "events",
            "c",
            lookupd=[cluster.lookupd_url],
            start="earliest",
            on_error=errors.append,
            reconnect_backoff=QUICK,
        )
        await consumer.start()  # the topic does not exist yet: the consumer waits for it
        async with Producer(nsqd=cluster.nsqd_addresses) as producer:
            await producer.publish("events", b"x")  # classic nsqd creates the topic
        with pytest.raises(e.UnsupportedFeatureError, match="queue offsets"):
            await asyncio.wait_for(consumer.join(), 15)
        await consumer.close()
    assert len(errors) == 1
    assert isinstance(errors[0], e.UnsupportedFeatureError)
