"""Many concurrent publishers (keyed, explicit partition, round-robin, auto-batched) through a
partition that stops taking writes and through a leader crash: every publish returns or raises
a PublishError, none fails while publish_timeout outlasts the outage, a waiting publish goes
as soon as a lookup names a writable leader, and every acknowledged message is consumed.
Tracing on or off changes none of it (it used to: it took another path), and neither does
publishing from threads through the blocking producer (smartnsq.sync), whose publishes make
their first try in their own thread and their retries on the producer's loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from smartnsq import errors as e
from smartnsq import sync
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster

TOPIC = "events"
PARTITIONS = 2
# Keys of both partitions, so keyed publishers wait on the partition in trouble and not only.
KEYS = [f"key-{i}" for i in range(8)]
FAST_RETRY = Backoff(initial=0.01, maximum=0.2)


@dataclass
class Outcome:
    acknowledged: set[bytes] = field(default_factory=set)
    failures: list[BaseException] = field(default_factory=list)


Publish = Callable[[Producer, bytes, int], Awaitable[object]]

MODES: dict[str, Publish] = {
    "keyed": lambda p, body, i: p.publish(TOPIC, body, sharding_key=KEYS[i % len(KEYS)]),
    "partition": lambda p, body, i: p.publish(TOPIC, body, partition=i % PARTITIONS),
    "round-robin": lambda p, body, i: p.publish(TOPIC, body),
}


async def _publish_one(
    producer: Producer, publish: Publish, body: bytes, i: int, outcome: Outcome
) -> None:
    try:
        await publish(producer, body, i)
    except Exception as exc:  # noqa: BLE001 - every failure is checked by the test
        outcome.failures.append(exc)
    else:
        outcome.acknowledged.add(body)


async def _publisher(
    producer: Producer, name: str, publish: Publish, stop: asyncio.Event, outcome: Outcome
) -> None:
    """One publish after the other: stuck on a publish that waits for its partition."""
    i = 0
    while not stop.is_set():
        await _publish_one(producer, publish, f"{name}-{i}".encode(), i, outcome)
        i += 1
        await asyncio.sleep(0.002)  # pacing: thousands of messages to consume, not millions


async def _arrivals(
    producer: Producer, name: str, publish: Publish, stop: asyncio.Event, outcome: Outcome
) -> None:
    """A new publish every few milliseconds, each its own task: publishes that start while
    the producer already knows of the outage (they used to fail at once)."""
    started: list[asyncio.Task[None]] = []
    i = 0
    while not stop.is_set():
        body = f"{name}-{i}".encode()
        started.append(asyncio.create_task(_publish_one(producer, publish, body, i, outcome)))
        i += 1
        await asyncio.sleep(0.01)
    await asyncio.gather(*started)


@dataclass(frozen=True)
class Publishers:
    """Who publishes: async tasks (traced with OpenTelemetry or not), or threads through the
    blocking producer."""

    tracer_provider: Any = None
    blocking: bool = False


@asynccontextmanager
async def _publishing(
    cluster: Cluster, publish_timeout: float, publishers: Publishers
) -> AsyncIterator[tuple[Outcome, Any]]:
    """Publishers of every mode running until the event is set; the outcome holds what was
    acknowledged and what failed."""
    if publishers.blocking:
        async with _publishing_threads(cluster, publish_timeout) as running:
            yield running
    else:
        async with _publishing_tasks(cluster, publish_timeout, publishers) as running:
            yield running


@asynccontextmanager
async def _publishing_threads(
    cluster: Cluster, publish_timeout: float
) -> AsyncIterator[tuple[Outcome, threading.Event]]:
    """Threads of every mode, three each, sharing one blocking producer, one publish after
    the other. The first tries of their publishes are theirs, the retries the loop's (both
    happen here: the retries are counted)."""
    outcome, stop = Outcome(), threading.Event()
    producer = sync.Producer(
        lookupd=[cluster.lookupd_url], publish_timeout=publish_timeout, retry_backoff=FAST_RETRY
    )

    def publisher(name: str, publish: Publish) -> None:
        i = 0
        while not stop.is_set():
            body = f"{name}-{i}".encode()
            try:
                publish(producer, body, i)  # type: ignore[arg-type]  # blocks, returns no awaitable
            except Exception as exc:  # noqa: BLE001 - every failure is checked by the test
                outcome.failures.append(exc)
            else:
                outcome.acknowledged.add(body)
            i += 1
            stop.wait(0.002)  # pacing: thousands of messages to consume, not millions

    threads = [
        threading.Thread(target=publisher, args=(f"thread-{mode}-{n}", publish), daemon=True)
        for mode, publish in MODES.items()
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    try:
        yield outcome, stop
    finally:
        stop.set()

        def join() -> None:
            for thread in threads:
                thread.join(30)
            producer.close()

        await asyncio.to_thread(join)
    assert not any(thread.is_alive() for thread in threads)
    here = producer._here
    assert here is not None
    assert here.answered_here > 0  # first tries answered in their threads
    assert producer.stats().retries > 0  # and first tries that failed, retried on the loop


@asynccontextmanager
async def _publishing_tasks(
    cluster: Cluster, publish_timeout: float, publishers: Publishers
) -> AsyncIterator[tuple[Outcome, asyncio.Event]]:
    """Publishers of every mode, plain and auto-batched (linger), sequential and arriving,
    running until the event is set."""
    tracer_provider = publishers.tracer_provider
    outcome, stop = Outcome(), asyncio.Event()
    options: dict[str, Any] = {
        "publish_timeout": publish_timeout,
        "retry_backoff": FAST_RETRY,
        "tracer_provider": tracer_provider,
    }
    plain = Producer(lookupd=[cluster.lookupd_url], **options)
    batched = Producer(lookupd=[cluster.lookupd_url], linger=0.005, **options)
    async with plain, batched:
        tasks = [
            asyncio.create_task(run(producer, f"{label}-{mode}-{n}", publish, stop, outcome))
            for label, producer in (("plain", plain), ("batched", batched))
            for mode, publish in MODES.items()
            for n, run in enumerate((_publisher, _publisher, _arrivals))
        ]
        try:
            yield outcome, stop
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def _consume_all(cluster: Cluster, acknowledged: set[bytes]) -> None:
    received: set[bytes] = set()

    def handler(message: Message) -> None:
        received.add(message.body)

    async with Consumer(TOPIC, "check", lookupd=[cluster.lookupd_url], handler=handler):
        await cluster.wait_for(lambda: acknowledged <= received, timeout=20)


async def _more_published(cluster: Cluster, outcome: Outcome, count: int) -> None:
    target = len(outcome.acknowledged) + count
    await cluster.wait_for(lambda: len(outcome.acknowledged) >= target, timeout=20)


def _only_publish_errors(failures: list[BaseException]) -> None:
    bare = [f for f in failures if not isinstance(f, e.PublishError)]
    assert not bare, f"{len(bare)} failures are not PublishError, e.g. {bare[0]!r}"


@pytest.fixture(params=["untraced", "traced", "blocking"])
def publishers(request: pytest.FixtureRequest) -> Publishers:
    if request.param == "traced":
        return Publishers(tracer_provider=TracerProvider())
    return Publishers(blocking=request.param == "blocking")


async def _cluster(failover_delay: float = 0.0) -> Cluster:
    cluster = Cluster(nodes=3, failover_delay=failover_delay)
    await cluster.start()
    await cluster.create_topic(TOPIC, PARTITIONS, 3, channels=["check"])
    return cluster


async def test_no_failure_through_an_unwritable_window(publishers: Publishers) -> None:
    cluster = await _cluster()
    try:
        async with _publishing(cluster, 10.0, publishers) as (outcome, _):
            await _more_published(cluster, outcome, 100)
            await cluster.set_writable(TOPIC, 0, False)
            await asyncio.sleep(1.5)  # the outage: publishes to partition 0 wait through it
            await cluster.set_writable(TOPIC, 0, True)
            await _more_published(cluster, outcome, 100)
        assert outcome.failures == []
        await _consume_all(cluster, outcome.acknowledged)
    finally:
        await cluster.stop()


async def test_no_failure_through_a_leader_crash(publishers: Publishers) -> None:
    cluster = await _cluster(failover_delay=1.0)
    try:
        async with _publishing(cluster, 10.0, publishers) as (outcome, _):
            await _more_published(cluster, outcome, 100)
            leader = cluster.leader(TOPIC, 0)
            assert leader is not None
            await cluster.stop_node(leader)
            await cluster.wait_for(lambda: cluster.leader(TOPIC, 0) not in (None, leader))
            await _more_published(cluster, outcome, 100)
        assert outcome.failures == []
        await _consume_all(cluster, outcome.acknowledged)
    finally:
        await cluster.stop()


async def test_an_outage_longer_than_publish_timeout_raises_publish_errors_only(
    publishers: Publishers,
) -> None:
    cluster = await _cluster()
    try:
        async with _publishing(cluster, 0.3, publishers) as (outcome, _):
            await _more_published(cluster, outcome, 100)
            await cluster.set_writable(TOPIC, 0, False)
            await cluster.wait_for(lambda: len(outcome.failures) >= 20)
            await cluster.set_writable(TOPIC, 0, True)
            await _more_published(cluster, outcome, 100)
        _only_publish_errors(outcome.failures)
        assert {f.partition for f in outcome.failures if isinstance(f, e.PublishError)} <= {0}
        await _consume_all(cluster, outcome.acknowledged)
    finally:
        await cluster.stop()


async def test_a_waiting_publish_goes_as_soon_as_a_lookup_names_a_leader() -> None:
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic(TOPIC, PARTITIONS, 3, channels=["check"])
        key = next(k for k in KEYS if Sharder("java").partition_for(k, PARTITIONS) == 0)
        async with Producer(lookupd=[cluster.lookupd_url], publish_timeout=10) as producer:
            await producer.publish(TOPIC, b"first", sharding_key=key)
            await cluster.set_writable(TOPIC, 0, False)
            waiting = [
                asyncio.create_task(producer.publish(TOPIC, f"w{i}".encode(), sharding_key=key))
                for i in range(10)
            ]
            # Long enough for the default backoff to reach its 1 s cap.
            await asyncio.sleep(2.0)
            assert not any(task.done() for task in waiting)
            recovered = time.monotonic()
            await cluster.set_writable(TOPIC, 0, True)
            await asyncio.gather(*waiting)
            # Rounds of lookups 0.25 s apart: well under the 1 s backoff cap plus a refresh.
            assert time.monotonic() - recovered < 0.8


async def test_a_waiting_blocking_publish_goes_as_soon_as_a_lookup_names_a_leader() -> None:
    """The same from threads: each first try is refused in its thread, and the retries wait
    on the producer's loop for the lookup that names a writable leader."""
    async with Cluster(nodes=3) as cluster:
        await cluster.create_topic(TOPIC, PARTITIONS, 3, channels=["check"])
        key = next(k for k in KEYS if Sharder("java").partition_for(k, PARTITIONS) == 0)
        producer = sync.Producer(lookupd=[cluster.lookupd_url], publish_timeout=10)
        try:
            for body in (b"first", b"second"):  # the layout, then a connection of this thread
                await asyncio.to_thread(producer.publish, TOPIC, body, sharding_key=key)
            await cluster.set_writable(TOPIC, 0, False)
            waiting = [
                asyncio.ensure_future(
                    asyncio.to_thread(producer.publish, TOPIC, f"w{i}".encode(), sharding_key=key)
                )
                for i in range(4)  # within the default executor's threads
            ]
            await asyncio.sleep(2.0)
            assert not any(task.done() for task in waiting)
            recovered = time.monotonic()
            await cluster.set_writable(TOPIC, 0, True)
            results = await asyncio.gather(*waiting)
            assert time.monotonic() - recovered < 0.8
            # The first was refused and tried again; those behind it in its partition's
            # lane waited their turn, untried, and went in order after it.
            assert max(result.tries for result in results) > 1
        finally:
            await asyncio.to_thread(producer.close)
