"""What users bring from pynsq, go-nsq, aiokafka and nats.py (issue 13): ``async with
message``, batch fetch, an error hook; and what a consumer says about itself (handler
tracebacks, a topic that does not exist yet, httpx's per-request lines)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq import sync
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import OrderedSubscribeRequiredError
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster
from smartnsq.transport.lookup import LookupManager
from tests.integration.threaded_cluster import ThreadedCluster

FAST = Backoff(initial=0.01, maximum=0.05)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1) as c:
        await c.create_topic("events", 2, 1, channels=["c"])
        await c.create_topic("ordered", 2, 1, ordered=True, channels=["c"])
        yield c


async def _publish(cluster: Cluster, topic: str, bodies: list[bytes]) -> None:
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for i, body in enumerate(bodies):
            await producer.publish(topic, body, partition=i % 2)


def _consumer(cluster: Cluster, topic: str = "events", **kwargs: Any) -> Consumer:
    kwargs.setdefault("reconnect_backoff", FAST)
    return Consumer(topic, "c", lookupd=[cluster.lookupd_url], **kwargs)


# --------------------------------------------------------------------------- async with


async def test_async_with_message_finishes_or_requeues(cluster: Cluster) -> None:
    await _publish(cluster, "events", [b"ok", b"fails once"])
    outcomes: list[tuple[bytes, int]] = []
    async with _consumer(cluster, requeue_delay=0, backoff=False) as consumer:
        async for message in consumer:
            async with message:
                outcomes.append((message.body, message.attempts))
                if message.body == b"fails once" and message.attempts == 1:
                    raise RuntimeError("transient")  # logged and swallowed: the loop goes on
            if len(outcomes) == 3:
                break
        await cluster.wait_for(lambda: cluster.unfinished("events", "c") == 0)
        stats = consumer.stats()
    assert sorted(outcomes) == [(b"fails once", 1), (b"fails once", 2), (b"ok", 1)]
    assert (stats.finished, stats.requeued, stats.handler_errors) == (2, 1, 1)


async def test_an_answer_inside_async_with_stands(cluster: Cluster) -> None:
    await _publish(cluster, "events", [b"x"])
    async with _consumer(cluster, requeue_delay=0) as consumer:
        message = await consumer.__anext__()
        async with message:
            await message.requeue(0, backoff=False)
        again = await consumer.__anext__()
        assert (again.body, again.attempts) == (b"x", 2)
        await again.finish()
        stats = consumer.stats()
    assert (stats.requeued, stats.finished, stats.handler_errors) == (1, 1, 0)


async def test_cancellation_inside_async_with_propagates_and_hands_back(cluster: Cluster) -> None:
    await _publish(cluster, "events", [b"x"])
    async with _consumer(cluster) as consumer:
        message = await consumer.__anext__()

        async def work() -> None:
            async with message:
                await asyncio.Event().wait()

        task = asyncio.ensure_future(work())
        await asyncio.sleep(0)  # let it enter the block
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        again = await consumer.__anext__()  # handed back at once (REQ 0): here again
        assert again.attempts == 2
        await again.finish()


# --------------------------------------------------------------------------- getmany


async def test_getmany(cluster: Cluster) -> None:
    async with _consumer(cluster, max_in_flight=10) as consumer:
        assert await consumer.getmany(5, timeout=0.05) == []  # nothing yet
        await _publish(cluster, "events", [b"%d" % i for i in range(6)])
        # all six received by the client (nsqd may hold some in its output buffer a while)
        await cluster.wait_for(lambda: consumer.stats().received == 6)
        first = await consumer.getmany(4, timeout=1)
        rest = await consumer.getmany(4, timeout=1)
        assert (len(first), len(rest)) == (4, 2)
        for message in first + rest:
            await message.finish()
        assert sorted(m.body for m in first + rest) == [b"%d" % i for i in range(6)]
    assert await consumer.getmany(1, timeout=0.01) == []  # closed


async def test_getmany_raises_what_stopped_the_consumer(cluster: Cluster) -> None:
    consumer = _consumer(cluster, "ordered")  # ordered=False on an ordered topic: refused
    with pytest.raises(OrderedSubscribeRequiredError):
        await consumer.getmany(1, timeout=5)


# --------------------------------------------------------------------------- on_error


@pytest.mark.parametrize("kind", ["function", "coroutine"])
async def test_on_error_hears_the_fatal_error(cluster: Cluster, kind: str) -> None:
    heard: list[BaseException] = []
    heard_event = asyncio.Event()

    def hook(exc: BaseException) -> None:
        heard.append(exc)
        heard_event.set()

    async def async_hook(exc: BaseException) -> None:
        hook(exc)

    consumer = _consumer(
        cluster,
        "events",
        handler=lambda m: None,
        on_error=hook if kind == "function" else async_hook,
    )
    await consumer.start()
    # A fatal answer after start: the topic is deleted, then made ordered, under it.
    await cluster.delete_topic("events")
    await cluster.create_topic("events", 2, 1, ordered=True, channels=["c"])
    await asyncio.wait_for(heard_event.wait(), 10)
    with pytest.raises(OrderedSubscribeRequiredError):
        await consumer.join()
    assert len(heard) == 1
    assert isinstance(heard[0], OrderedSubscribeRequiredError)


# --------------------------------------------------------------------------- logging


async def test_handler_failures_log_a_traceback_rate_limited(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    await _publish(cluster, "events", [b"%d" % i for i in range(5)])
    failed = 0

    def handle(message: Message) -> None:
        nonlocal failed
        failed += 1
        raise ValueError(f"bad {message.body!r}")

    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with _consumer(cluster, handler=handle, requeue_delay=60, backoff=False):
        await cluster.wait_for(lambda: failed == 5)
    records = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert len(records) == 1  # one per exception type per 10 s
    assert records[0].exc_info is not None
    assert records[0].exc_info[0] is ValueError


async def test_a_consumer_waits_for_a_topic_that_does_not_exist_yet(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[bytes] = []
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    async with _consumer(cluster, "later", handler=lambda m: got.append(m.body)):
        warnings = [r.getMessage() for r in caplog.records if "does not exist" in r.getMessage()]
        assert warnings == [
            "later/c: topic 'later' does not exist (no nsqlookupd knows it): waiting for it to "
            "be created; this consumer subscribes as soon as a lookup shows its partitions (it "
            "looks again every few seconds)"
        ]
        await cluster.create_topic("later", 1, 1, channels=["c"])
        await cluster.wait_for(lambda: cluster.subscriber_rdy("later", "c") != [], timeout=10)
        await _publish(cluster, "later", [b"first"])
        await cluster.wait_for(lambda: got == [b"first"])


async def test_lookups_do_not_log_a_line_per_http_request(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "httpx")
    async with LookupManager([cluster.lookupd_url]) as lookup:
        await lookup.refresh("events", "r")
    assert [r for r in caplog.records if r.name == "httpx"] == []
    async with httpx.AsyncClient() as http:  # the application's own requests still do
        await http.get(f"{cluster.lookupd_url}/ping")
    assert [r.name for r in caplog.records] == ["httpx"]


# --------------------------------------------------------------------------- SystemExit


SCRIPT = """
import asyncio, sys, threading
from smartnsq import Consumer, Producer
from smartnsq.testing import Cluster

async def main():
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            await producer.publish("t", b"x")
        {handler}
        async with Consumer("t", "c", lookupd=[cluster.lookupd_url], handler=handle):
            await asyncio.sleep(30)  # the handler ends the program long before
    print("not reached")

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("handler", "returncode"),
    [
        ("async def handle(m): raise SystemExit(3)", 3),
        ("def handle(m): raise SystemExit(4)", 4),
        ("async def handle(m): raise KeyboardInterrupt", -2),
    ],
    ids=["async-SystemExit", "thread-SystemExit", "async-KeyboardInterrupt"],
)
def test_system_exit_and_keyboard_interrupt_in_a_handler_propagate(
    handler: str, returncode: int, tmp_path: Path
) -> None:
    script = tmp_path / "exit.py"
    script.write_text(SCRIPT.replace("{handler}", handler))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "not reached" not in result.stdout
    assert result.returncode in (returncode, 130 if returncode == -2 else returncode), result


LEFT_OPEN = """
import asyncio
from smartnsq.consumer.consumer import Consumer
from smartnsq.testing import Cluster

async def main():
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic("events", 4, 3, channels=["c"])
        consumer = Consumer("events", "c", lookupd=[cluster.lookupd_url], handler=print)
        await consumer.start()  # and never closed

asyncio.run(main())
print("asyncio.run returned")
"""


def test_asyncio_run_returns_when_a_consumer_is_left_open(tmp_path: Path) -> None:
    """asyncio.run cancels what is left: the consumer's supervisor, waiting with
    asyncio.wait_for, lost that cancellation and looped on forever (the run never ended)."""
    script = tmp_path / "left_open.py"
    script.write_text(LEFT_OPEN)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("asyncio.run returned")


# --------------------------------------------------------------------------- sync


def test_sync_with_message_getmany_and_ordered_iteration() -> None:
    with ThreadedCluster(nodes=1) as tc:
        tc.run(tc.cluster.create_topic("o", 2, 1, ordered=True, channels=["c"]))
        with sync.Producer(lookupd=[tc.lookupd_url]) as producer:
            for seq in range(3):
                for partition in range(2):
                    producer.publish("o", f"{partition}:{seq}", partition=partition)
        seen: list[str] = []
        with sync.Consumer("o", "c", lookupd=[tc.lookupd_url], ordered=True) as consumer:
            for message in consumer:  # iterating an ordered consumer goes past the first
                with message:
                    seen.append(message.body.decode())
                if len(seen) == 4:
                    break
            batch: list[sync.Message] = []
            while len(batch) < 2:
                batch += consumer.getmany(2, timeout=5)
            for message in batch:
                with message:
                    seen.append(message.body.decode())
        for partition in range(2):
            assert [s for s in seen if s.startswith(f"{partition}:")] == [
                f"{partition}:{seq}" for seq in range(3)
            ]


async def test_close_hands_back_what_classic_nsqd_would_hold_a_minute() -> None:
    """Classic nsqd keeps a departed client's unanswered messages in flight until their
    msg_timeout (60 s): a consumer that stops after one message must give the rest back
    (REQ 0) itself, so the next consumer gets them at once."""
    async with Cluster(classic=True, nodes=1) as cluster:
        nsqd = cluster.nsqd_addresses
        async with Producer(nsqd=nsqd) as producer:
            await producer.publish("events", b"first")  # creates the topic
            first = Consumer("events", "c", nsqd=nsqd, max_in_flight=10)
            async with first:
                await producer.publish_many("events", [b"%d" % i for i in range(5)])
                await cluster.wait_for(lambda: cluster.in_flight("events", "c") == 6)
                taken = await first.__anext__()
                await taken.finish()
        assert first.stats().requeued == 5
        assert cluster.channel_record("events", "c").timed_out == []
        async with Consumer("events", "c", nsqd=nsqd, max_in_flight=10) as second:
            rest = [await asyncio.wait_for(second.__anext__(), 5) for _ in range(5)]
            for message in rest:
                await message.finish()
    assert sorted(m.body for m in [taken, *rest]) == sorted(
        [b"first", b"0", b"1", b"2", b"3", b"4"]
    )
