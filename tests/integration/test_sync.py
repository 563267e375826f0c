"""The blocking facade (smartnsq.sync) against the embedded cluster.

The cluster runs on its own event loop in a background thread (ThreadedCluster); the tests
themselves are plain blocking code, like the facade's users. Every test also checks that no
thread outlives it.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smartnsq import errors as e
from smartnsq import sync
from smartnsq.consumer.message import Message as AsyncMessage
from smartnsq.flow.retry import Backoff
from smartnsq.producer.producer import Producer as AsyncProducer
from smartnsq.routing.sharding import Sharder
from smartnsq.transport import blocking as blocking_transport
from tests.integration.threaded_cluster import ThreadedCluster

FAST = Backoff(initial=0.01, maximum=0.05)
WAIT = 20.0  # bound of every wait on another thread


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every thread a test starts (loop threads, handler pools, helpers) is gone after it.
    Loop threads are joined by close() itself (asserted in the tests); handler pool threads
    end on their own right after close, hence the bounded join here."""
    before = set(threading.enumerate())
    yield
    leftover = [t for t in threading.enumerate() if t not in before]
    for thread in leftover:
        thread.join(WAIT)
    assert [t.name for t in leftover if t.is_alive()] == []


@pytest.fixture
def tc() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(nodes=3) as cluster:
        cluster.run(cluster.cluster.create_topic("orders", 4, 2, channels=["c"]))
        cluster.run(cluster.cluster.create_topic("ordered", 2, 1, ordered=True, channels=["c"]))
        yield cluster


@pytest.fixture(params=["here", "loop"])
def first_try(request: pytest.FixtureRequest) -> str:
    """Where a blocking publish makes its first try: in the calling thread, over a blocking
    connection (the default), or on the producer's loop, as every try does with
    auto-batching or OpenTelemetry. The retries are the loop's either way."""
    return str(request.param)


def _producer(tc: ThreadedCluster, first_try: str = "here", **kwargs: Any) -> sync.Producer:
    kwargs.setdefault("retry_backoff", FAST)
    producer = sync.Producer(lookupd=[tc.lookupd_url], **kwargs)
    assert producer._here is not None
    if first_try == "loop":
        producer._here = None
    return producer


def _idle_connections(producer: sync.Producer) -> list[Any]:
    """The blocking connections no thread uses now."""
    assert producer._here is not None
    return [conn for conns in producer._here._pool._idle.values() for conn in conns]


def _tried_here(producer: sync.Producer) -> int:
    """Publishes whose first try, made in their calling thread, was answered."""
    return 0 if producer._here is None else producer._here.answered_here


def _consumer(tc: ThreadedCluster, topic: str = "orders", **kwargs: Any) -> sync.Consumer:
    kwargs.setdefault("reconnect_backoff", FAST)
    kwargs.setdefault("max_in_flight", 8)
    kwargs.setdefault("requeue_delay", 0.0)
    return sync.Consumer(topic, "c", lookupd=[tc.lookupd_url], **kwargs)


def _publish(tc: ThreadedCluster, count: int, topic: str = "orders") -> None:
    with _producer(tc) as producer:
        for start in range(0, count, 25):
            bodies = [f"{i}".encode() for i in range(start, min(start + 25, count))]
            producer.publish_many(topic, bodies, partition=(start // 25) % 4)


def _log(tc: ThreadedCluster, topic: str = "orders") -> dict[int, list[bytes]]:
    """partition -> bodies in log order, read on the cluster's loop."""

    def read() -> dict[int, list[bytes]]:
        cluster = tc.cluster
        return {p: [r.body for r in cluster.messages(topic, p)] for p in cluster.topology(topic)}

    return tc.call(read)


def _wait_all_finished(tc: ThreadedCluster, total: int, topic: str = "orders") -> None:
    """The cluster saw every message finished exactly once (FINs may still be on the wire
    when close() returns, hence the wait)."""
    cluster = tc.cluster
    tc.wait_for(
        lambda: (
            len(cluster.channel_record(topic, "c").finished) >= total
            and cluster.unfinished(topic, "c") == 0
        )
    )

    def check() -> tuple[int, list[Any]]:
        record = cluster.channel_record(topic, "c")
        return len(record.finished), record.duplicates_finished()

    assert tc.call(check) == (total, [])


def _threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


class Counted:
    """A thread-safe counter whose value can be awaited with a bound (no sleeps)."""

    def __init__(self) -> None:
        self.value = 0
        self._cond = threading.Condition()

    def add(self, n: int = 1) -> int:
        with self._cond:
            self.value += n
            self._cond.notify_all()
            return self.value

    def wait_for(self, target: int, timeout: float = WAIT) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.value >= target, timeout), self.value


def _start_thread(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


# --------------------------------------------------------------------------- producer


def test_publish_forwards_routing_and_results(tc: ThreadedCluster, first_try: str) -> None:
    before = _threads_named("smartnsq-producer-loop")
    with _producer(tc, first_try) as producer:
        assert len(_threads_named("smartnsq-producer-loop")) == len(before) + 1
        results = [producer.publish("orders", f"rr{i}") for i in range(8)]
        assert Counter(r.partition for r in results) == {0: 2, 1: 2, 2: 2, 3: 2}
        assert all(isinstance(r, sync.PublishResult) and r.tries == 1 for r in results)
        keyed = [producer.publish("orders", f"k{i}".encode(), sharding_key=42) for i in range(3)]
        assert {r.partition for r in keyed} == {Sharder("java").partition_for(42, 4)}
        assert producer.publish("orders", b"explicit", partition=2).partition == 2
        traced = producer.publish("orders", b"traced", trace_id=987654321)
        assert traced.trace_id == 987654321
        assert traced.internal_id is not None
        batch = producer.publish_many("orders", [b"b1", b"b2", b"b3"], partition=1, trace=True)
        assert [r.partition for r in batch] == [1, 1, 1]
        first = batch[0].internal_id
        assert first is not None
        assert [r.internal_id for r in batch] == [first, first + 1, first + 2]
        # the first publish looked the topic up on the loop; the others needed nothing more
        assert _tried_here(producer) == (12 if first_try == "here" else 0)
    assert _threads_named("smartnsq-producer-loop") == before  # close() joined it
    log = _log(tc)
    for result, body in zip(results, [f"rr{i}".encode() for i in range(8)], strict=True):
        assert body in log[result.partition]  # type: ignore[index]
    keyed_partition = Sharder("java").partition_for(42, 4)
    assert [b for b in log[keyed_partition] if b.startswith(b"k")] == [b"k0", b"k1", b"k2"]
    assert log[1][-3:] == [b"b1", b"b2", b"b3"]


def test_one_producer_shared_by_8_threads(tc: ThreadedCluster, first_try: str) -> None:
    """8 threads x 200 publishes through one producer: every acknowledged body is in the log
    exactly once, on the partition its result names; a thread's keyed publishes keep their
    order on their key's partition."""
    threads_count, per_thread = 8, 200
    results: dict[bytes, sync.PublishResult] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_count)

    with _producer(tc, first_try) as producer:

        def work(index: int) -> None:
            try:
                barrier.wait(WAIT)
                for j in range(per_thread):
                    body = f"t{index}-{j}".encode()
                    if index % 2:  # odd threads: round-robin; even threads: keyed
                        result = producer.publish("orders", body)
                    else:
                        result = producer.publish("orders", body, sharding_key=index)
                    with lock:
                        results[body] = result
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                with lock:
                    errors.append(exc)

        workers = [_start_thread(work, f"publisher-{i}", i) for i in range(threads_count)]
        for worker in workers:
            worker.join(60)
        assert not any(w.is_alive() for w in workers)
    assert errors == []
    assert len(results) == threads_count * per_thread
    log = _log(tc)
    where: dict[bytes, list[int]] = defaultdict(list)
    for partition, bodies in log.items():
        for body in bodies:
            where[body].append(partition)
    assert set(where) == set(results)
    for body, result in results.items():
        assert where[body] == [result.partition], body  # once, where the result says
    sharder = Sharder("java")
    for index in range(0, threads_count, 2):
        partition = sharder.partition_for(index, 4)
        mine = [b for b in log[partition] if b.startswith(f"t{index}-".encode())]
        assert mine == [f"t{index}-{j}".encode() for j in range(per_thread)]


def test_exceptions_propagate_unchanged(tc: ThreadedCluster, first_try: str) -> None:
    """Each failing call raises in the calling thread what the async client raises."""
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("orders", b""), {}),
        (("bad topic!", b"x"), {}),
        (("orders", b"x"), {"partition": 1, "sharding_key": 2}),
        (("orders", b"x"), {"partition": 9}),
        (("orders", b"x"), {"delay": 1.0}),
        (("orders", b"x"), {"ext": {"k": "v"}}),
        (("missing", b"x"), {}),
        (("orders", b"x"), {"bogus": 1}),
    ]
    url = tc.lookupd_url

    async def async_errors() -> list[BaseException]:
        found: list[BaseException] = []
        async with AsyncProducer(lookupd=[url], max_retries=0) as producer:
            for args, kwargs in cases:
                try:
                    await producer.publish(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - compared below
                    found.append(exc)
        return found

    expected = tc.run(async_errors())
    assert len(expected) == len(cases)
    with _producer(tc, first_try, max_retries=0) as producer:
        producer.publish("orders", b"the layout, looked up")  # the others try from here
        for (args, kwargs), reference in zip(cases, expected, strict=True):
            with pytest.raises(Exception) as caught:
                producer.publish(*args, **kwargs)
            assert type(caught.value) is type(reference), (args, kwargs)
            assert str(caught.value) == str(reference)
            assert type(caught.value.__cause__) is type(reference.__cause__)
        assert producer.publish("orders", b"still fine").tries == 1  # nothing broke
    kinds = {type(x) for x in expected}
    assert {e.ValidationError, e.UnsupportedFeatureError, TypeError} <= kinds
    with pytest.raises(e.ValidationError):
        sync.Producer()  # argument errors come from the constructor, leaving no thread


def test_lifecycle_close_is_idempotent_and_final(tc: ThreadedCluster) -> None:
    producer = _producer(tc)
    assert len(_threads_named("smartnsq-producer-loop")) == 1
    assert producer.start() is producer
    assert producer.start() is producer
    producer.close()
    assert _threads_named("smartnsq-producer-loop") == []
    producer.close()
    with pytest.raises(e.ClientClosedError):
        producer.publish("orders", b"x")
    with pytest.raises(e.ClientClosedError):
        producer.publish_many("orders", [b"x"])
    with pytest.raises(e.ClientClosedError):
        producer.start()
    with pytest.raises(e.ClientClosedError), producer:
        pass
    # never started: close still releases the loop thread
    _producer(tc).close()
    assert _threads_named("smartnsq-producer-loop") == []


def test_producer_stats_and_the_trace_switch(tc: ThreadedCluster, first_try: str) -> None:
    """The blocking producer has the async one's stats(), set_trace() and tracing()."""
    with _producer(tc, first_try) as producer:
        assert not producer.tracing("orders")
        producer.set_trace(True, "orders")
        assert producer.tracing("orders")
        assert not producer.tracing("ordered")
        traced = producer.publish("orders", b"traced", partition=1)
        assert traced.trace_id is not None
        producer.set_trace(False)
        assert producer.publish("orders", b"plain", partition=1).trace_id is None
        stats = producer.stats()
        assert isinstance(stats, sync.ProducerStats)
        assert (stats.published, stats.per_partition) == (2, {1: 2})
        # the first looked the topic up on the loop, the second was answered here
        assert _tried_here(producer) == (1 if first_try == "here" else 0)
    assert producer.stats().published == 2  # also after close


def test_close_while_other_threads_publish(tc: ThreadedCluster, first_try: str) -> None:
    """Publishes racing close() return a result or raise ClientClosedError (refused, or
    interrupted when the pool or the loop closed under them); none hangs."""
    producer = _producer(tc, first_try, publish_timeout=5.0)
    published = Counted()
    outcomes: dict[int, BaseException] = {}

    def work(index: int) -> None:
        while True:
            try:
                producer.publish("orders", f"c{index}".encode())
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcomes[index] = exc
                return
            published.add()

    workers = [_start_thread(work, f"racer-{i}", i) for i in range(4)]
    published.wait_for(100)
    producer.close()
    for worker in workers:
        worker.join(WAIT)
    assert not any(w.is_alive() for w in workers)
    assert all(isinstance(exc, e.ClientClosedError) for exc in outcomes.values()), outcomes
    assert len(outcomes) == 4
    with pytest.raises(e.ClientClosedError):
        producer.publish("orders", b"late")


def test_garbage_collected_unclosed_client_warns_and_stops_its_thread(
    tc: ThreadedCluster,
) -> None:
    producer = _producer(tc)
    producer.start()
    (thread,) = _threads_named("smartnsq-producer-loop")
    with pytest.warns(ResourceWarning, match="unclosed"):
        del producer  # nothing else refers to the facade: collected at once
    thread.join(WAIT)
    assert not thread.is_alive()
    # never started: no warning, but the thread stops all the same
    idle = _producer(tc)
    (thread,) = _threads_named("smartnsq-producer-loop")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del idle
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    thread.join(WAIT)
    assert not thread.is_alive()


def test_blocking_call_from_the_producer_loop_raises(tc: ThreadedCluster) -> None:
    """A sharding callable runs on the producer's loop: publishing from it would deadlock."""
    holder: list[sync.Producer] = []

    def shard(key: Any, partition_num: int) -> int:
        holder[0].publish("orders", b"nested")
        return 0

    with _producer(tc, sharding=shard) as producer:
        holder.append(producer)
        with pytest.raises(RuntimeError, match="deadlock"):
            producer.publish("orders", b"x", sharding_key=1)
        assert producer.publish("orders", b"y").tries == 1


# --------------------------------------------------------------------------- first tries here


def _leader(tc: ThreadedCluster, partition: int, topic: str = "orders") -> int:
    leader = tc.call(lambda: tc.cluster.leader(topic, partition))
    assert leader is not None
    return leader


def test_a_connection_lost_between_publishes_is_retried_on_the_loop(
    tc: ThreadedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nsqd drops the connection a thread publishes on: the next first try made on it
    fails, and the producer's loop retries it as the async producer retries a try whose
    connection was lost; the thread's next publish opens a new one."""
    monkeypatch.setattr(blocking_transport, "IDLE_CHECK_AFTER", math.inf)  # never looked at
    with _producer(tc) as producer:
        producer.publish("orders", b"lookup", partition=1)
        assert producer.publish("orders", b"here", partition=1).tries == 1
        tc.run(tc.cluster.drop_connections(_leader(tc, 1), consumers=False))
        assert producer.publish("orders", b"after", partition=1).tries == 2
        assert producer.publish("orders", b"again", partition=1).tries == 1
        stats = producer.stats()
        assert (stats.published, stats.retries, stats.failures) == (4, 1, 0)
        assert _tried_here(producer) == 2
    assert _log(tc)[1] == [b"lookup", b"here", b"after", b"again"]


def test_an_idle_connection_closed_by_nsqd_is_replaced_before_a_try(
    tc: ThreadedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection idle for a while is looked at before it is used: one nsqd closed
    meanwhile is replaced, and no try fails for it."""
    monkeypatch.setattr(blocking_transport, "IDLE_CHECK_AFTER", 0.0)  # looked at every time
    with _producer(tc) as producer:
        producer.publish("orders", b"lookup", partition=1)
        producer.publish("orders", b"here", partition=1)
        tc.run(tc.cluster.drop_connections(_leader(tc, 1), consumers=False))
        assert producer.publish("orders", b"after", partition=1).tries == 1
        assert producer.stats().retries == 0
        assert _tried_here(producer) == 2
    assert _log(tc)[1] == [b"lookup", b"here", b"after"]


def test_a_moved_leader_is_looked_up_on_the_loop_and_then_published_to_here(
    tc: ThreadedCluster,
) -> None:
    """The layout a first try routes by is stale: the old leader refuses it
    (E_FAILED_ON_NOT_LEADER), the loop looks the topic up again and publishes to the new
    leader, and the next first tries route by the new layout."""
    with _producer(tc) as producer:
        producer.publish("orders", b"lookup", sharding_key=7)
        partition = producer.publish("orders", b"here", sharding_key=7).partition
        assert partition is not None
        old = _leader(tc, partition)
        new = next(node for node in range(3) if node != old)
        tc.run(tc.cluster.move_leader("orders", partition, new))
        moved = producer.publish("orders", b"moved", sharding_key=7)
        assert (moved.partition, moved.tries) == (partition, 2)
        assert moved.address == tc.nsqd_addresses[new]
        after = producer.publish("orders", b"after", sharding_key=7)
        assert (after.address, after.tries) == (moved.address, 1)
        assert _tried_here(producer) == 2
    assert _log(tc)[partition] == [b"lookup", b"here", b"moved", b"after"]


def test_a_first_try_nsqd_never_answers_ends_by_the_publish_deadline(
    tc: ThreadedCluster,
) -> None:
    """The leader goes silent: the first try waits for its answer until the publish's
    deadline, no longer, and the publish fails as a sent, unanswered one."""
    with _producer(tc, publish_timeout=0.5) as producer:
        producer.publish("orders", b"lookup", partition=3)
        producer.publish("orders", b"here", partition=3)
        leader = _leader(tc, 3)
        tc.call(tc.cluster.blackhole, leader)
        started = time.monotonic()
        try:
            with pytest.raises(e.PublishError, match="timed out") as caught:
                producer.publish("orders", b"unanswered", partition=3)
        finally:
            tc.call(tc.cluster.heal, leader)
        assert 0.5 <= time.monotonic() - started < 2.0
        assert caught.value.outcome_unknown
        assert caught.value.tries == 1
        assert producer.stats().failures == 1


def test_blocking_connections_ask_for_no_heartbeats(tc: ThreadedCluster) -> None:
    """A thread's connection may sit idle between its publishes: it asks nsqd for no
    heartbeats, so that nsqd does not close it for saying nothing (the loop's connections
    keep theirs)."""
    with _producer(tc, heartbeat_interval=1.0) as producer:
        producer.publish("orders", b"lookup", partition=0)
        producer.publish("orders", b"here", partition=0)
        node = tc.cluster.nodes[_leader(tc, 0)]
        intervals = tc.call(lambda: sorted(s.peer.heartbeat_interval for s in node.sessions))
        assert intervals == [0.0, 1.0]


# --------------------------------------------------------------------------- consumer


def test_run_with_a_plain_handler_until_closed_from_another_thread(tc: ThreadedCluster) -> None:
    seen: list[sync.Message] = []
    threads: set[str] = set()
    handled = Counted()
    entered = Counted()
    responded_inside: list[bool] = []

    def handle(message: sync.Message) -> None:
        threads.add(threading.current_thread().name)
        responded_inside.append(message.responded)
        if entered.add() == 1:
            message.touch()  # blocks: forwarded to the consumer's loop
        seen.append(message)
        handled.add()

    consumer = _consumer(tc, handler=handle, max_in_flight=20)
    _publish(tc, 100)

    def close_when_done() -> None:
        handled.wait_for(100)
        _wait_all_finished(tc, 100)
        consumer.close()

    closer = _start_thread(close_when_done, "closer")
    consumer.run()  # blocks until close()
    assert _threads_named("smartnsq-consumer-loop") == []  # close() was over
    closer.join(WAIT)
    assert all(isinstance(m, sync.Message) for m in seen)
    assert all(name.startswith("smartnsq-orders") for name in threads)
    assert responded_inside == [False] * 100
    assert all(m.responded for m in seen)  # finished when the handler returned
    assert sorted(int(m.body) for m in seen) == list(range(100))
    first = seen[0]
    assert (first.topic, first.channel) == ("orders", "c")
    assert first.partition in (0, 1, 2, 3)
    assert first.address in tc.nsqd_addresses
    assert isinstance(first.id, bytes)
    assert len(first.id) == 16
    assert first.attempts == 1
    assert first.timestamp > 0
    assert first.internal_id is not None
    assert first.offset is not None  # every youzan delivery carries its queue position
    assert first.raw_size is not None
    assert first.ext is None
    assert first.tag is None
    assert first.trace_id is not None
    assert repr(first).startswith("<sync <Message orders/")
    stats = consumer.stats()  # still readable after close
    assert (stats.finished, stats.touched, stats.in_flight) == (100, 1, 0)
    consumer.close()
    consumer.run()  # consuming is over: returns at once


def test_run_returns_at_once_when_close_came_first(tc: ThreadedCluster) -> None:
    """The closer thread may win the race with run(): run() then has nothing to wait for;
    a consumer closed before it ever started is an error."""
    consumer = _consumer(tc, handler=lambda m: None)
    consumer.start()
    _start_thread(consumer.close, "closer").join(WAIT)
    consumer.run()
    assert _threads_named("smartnsq-consumer-loop") == []
    never_started = _consumer(tc, handler=lambda m: None)
    never_started.close()
    with pytest.raises(e.ClientClosedError):
        never_started.run()


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_run_with_a_coroutine_handler_until_closed_by_a_signal_handler(
    tc: ThreadedCluster,
) -> None:
    kinds: set[type] = set()
    threads: set[str] = set()
    handled = Counted()

    async def handle(message: AsyncMessage) -> None:
        kinds.add(type(message))
        threads.add(threading.current_thread().name)
        handled.add()

    consumer = _consumer(tc, handler=handle)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: consumer.close())
    try:
        consumer.start()
        _publish(tc, 50)

        def signal_when_done() -> None:
            handled.wait_for(50)
            _wait_all_finished(tc, 50)
            os.kill(os.getpid(), signal.SIGUSR1)

        signaller = _start_thread(signal_when_done, "signaller")
        consumer.run()
        signaller.join(WAIT)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert kinds == {AsyncMessage}
    assert threads == {"smartnsq-consumer-loop"}
    assert _threads_named("smartnsq-consumer-loop") == []


def test_run_raises_the_error_that_stopped_the_start(tc: ThreadedCluster) -> None:
    """A plain SUB on an ordered topic is refused at start: run() raises that error and
    releases the loop thread; close() does not raise it again."""
    consumer = _consumer(tc, "ordered", handler=lambda m: None)
    with pytest.raises(e.OrderedSubscribeRequiredError, match="ordered=True"):
        consumer.run()
    assert _threads_named("smartnsq-consumer-loop") == []
    consumer.close()
    with pytest.raises(e.ClientClosedError):
        consumer.run()


@pytest.mark.parametrize("mode", ["run", "iterate"])
def test_the_error_that_stopped_the_consumer_is_raised_once(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer stops by itself once started (its credentials are revoked and its
    connections reset: AUTH fails on reconnect). run() or the iteration raises that error
    and releases the loop thread; close() does not raise it again."""
    with ThreadedCluster(nodes=1, auth_secrets={"s3cret": "svc"}) as tc:
        tc.run(tc.cluster.create_topic("t", 1, 1, channels=["c"]))
        handler = (lambda m: None) if mode == "run" else None
        consumer = _consumer(tc, "t", handler=handler, auth_secret="s3cret")
        consumer.start()
        raised: list[BaseException] = []

        def consume() -> None:
            try:
                if mode == "run":
                    consumer.run()
                else:
                    for _ in consumer:
                        pass
            except BaseException as exc:  # noqa: BLE001 - asserted below
                raised.append(exc)

        worker = _start_thread(consume, "consume")

        async def revoke() -> None:
            secrets = tc.cluster.settings.auth_secrets
            secrets.clear()
            secrets["other"] = "someone-else"
            await tc.cluster.drop_connections(0)

        tc.run(revoke())
        worker.join(2.0)  # the failure takes milliseconds
        if worker.is_alive():
            with pytest.raises(e.NSQTimeoutError):
                consumer.close(timeout=0)  # bounded even when the async close hangs
            worker.join(WAIT)
            pytest.fail(f"{mode} did not return after the consumer stopped")
        assert [type(x) for x in raised] == [e.AuthFailedError]
        assert _threads_named("smartnsq-consumer-loop") == []
        consumer.close()  # already reported: not raised again
        with pytest.raises(e.ClientClosedError):
            consumer.run()


def test_iteration_yields_blocking_messages(tc: ThreadedCluster) -> None:
    consumer = _consumer(tc, max_in_flight=5)
    _publish(tc, 3)
    answers: list[str] = []
    for message in consumer:
        assert isinstance(message, sync.Message)
        if message.attempts == 1 and not answers:
            message.touch()
            message.requeue(0, backoff=False)
            assert message.responded
            answers.append("requeued")
            continue
        message.finish()
        assert message.responded
        with pytest.raises(e.NSQError, match="already answered"):
            message.finish()
        answers.append("finished")
        if answers.count("finished") == 3:
            break
    _wait_all_finished(tc, 3)
    consumer.close()
    stats = consumer.stats()
    assert (stats.requeued, stats.touched, stats.finished) == (1, 1, 3)
    with pytest.raises(e.ClientClosedError):
        next(consumer)
    with pytest.raises(e.ClientClosedError):
        message.finish()  # the loop is gone


def test_iterating_threads_end_when_closed(tc: ThreadedCluster) -> None:
    """Two threads iterate one consumer (they take turns on the loop); close() from a third
    ends both loops."""
    consumer = _consumer(tc, max_in_flight=10)
    got = Counted()
    bodies: list[bytes] = []
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            for message in consumer:
                message.finish()
                bodies.append(message.body)
                got.add()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    consumer.start()
    workers = [_start_thread(drain, f"iterator-{i}") for i in range(2)]
    _publish(tc, 40)
    got.wait_for(40)
    _wait_all_finished(tc, 40)
    consumer.close()
    for worker in workers:
        worker.join(WAIT)
    assert not any(w.is_alive() for w in workers)
    assert errors == []
    assert sorted(int(b) for b in bodies) == list(range(40))


def test_stats_is_starved_and_set_max_in_flight(tc: ThreadedCluster) -> None:
    release = threading.Event()
    entered = Counted()

    def handle(message: sync.Message) -> None:
        entered.add()
        release.wait(WAIT)

    with _consumer(tc, handler=handle, max_in_flight=8) as consumer:
        _publish(tc, 200)  # 50 per partition
        entered.wait_for(8)
        assert consumer.stats().in_flight == 8
        assert consumer.is_starved()
        consumer.set_max_in_flight(0)  # RDY 0 is on the wire before the FINs below
        release.set()
        cluster = tc.cluster
        tc.wait_for(lambda: cluster.in_flight("orders", "c") == 0)
        assert consumer.stats().in_flight == 0
        assert not consumer.is_starved()
        assert tc.call(lambda: len(cluster.channel_record("orders", "c").deliveries)) == 8
        consumer.set_max_in_flight(8)
        _wait_all_finished(tc, 200)
        assert consumer.stats().finished == 200
    with pytest.raises(e.ClientClosedError):
        consumer.set_max_in_flight(1)


def test_blocking_call_from_the_consumer_loop_raises(tc: ThreadedCluster) -> None:
    """A coroutine handler runs on the consumer's loop: close() from there would deadlock and
    raises instead; reads and set_max_in_flight never wait, so they work there."""
    outcomes: list[Any] = []
    handled = Counted()
    holder: list[sync.Consumer] = []

    async def handle(message: AsyncMessage) -> None:
        consumer = holder[0]
        if not outcomes:
            try:
                consumer.close()
            except RuntimeError as exc:
                outcomes.append(exc)
            outcomes.append(consumer.stats().received)
            consumer.set_max_in_flight(4)
            outcomes.append(consumer.is_starved())
        handled.add()

    with _consumer(tc, handler=handle) as consumer:
        holder.append(consumer)
        _publish(tc, 10)
        handled.wait_for(10)
        _wait_all_finished(tc, 10)
    error, received, starved = outcomes
    assert isinstance(error, RuntimeError)
    assert not isinstance(error, e.NSQError)
    assert "deadlock" in str(error)
    assert received >= 1
    assert isinstance(starved, bool)


def test_consumer_lifecycle(tc: ThreadedCluster) -> None:
    with pytest.raises(e.ValidationError):
        sync.Consumer("orders", "c")  # neither lookupd nor nsqd: no thread left behind
    with_handler = _consumer(tc, handler=lambda m: None)
    with pytest.raises(e.ValidationError, match="iterated"):
        iter(with_handler)
    with_handler.close()
    # a start that fails closes the consumer (async and blocking alike)
    with (
        pytest.raises(e.OrderedSubscribeRequiredError),
        _consumer(tc, "ordered", handler=lambda m: None),
    ):
        pass
    assert _threads_named("smartnsq-consumer-loop") == []
    consumer = _consumer(tc, handler=lambda m: None)
    consumer.close()
    consumer.close()
    with pytest.raises(e.ClientClosedError):
        consumer.start()
    assert _threads_named("smartnsq-consumer-loop") == []
    with _consumer(tc, handler=lambda m: None) as started:
        assert started.topic == "orders"
        assert started.channel == "c"
        assert len(_threads_named("smartnsq-consumer-loop")) == 1
    assert _threads_named("smartnsq-consumer-loop") == []


def test_a_plain_handler_returning_a_coroutine_is_refused(tc: ThreadedCluster) -> None:
    """A lambda wrapping a coroutine function would have the message finished unprocessed;
    the facade makes it a handler error (the message is requeued) instead."""
    handled = Counted()

    async def process(message: Any) -> None:
        handled.add()

    with _consumer(tc, handler=lambda m: process(m), max_attempts=2) as consumer:
        _publish(tc, 1)
        cluster = tc.cluster
        tc.wait_for(lambda: len(cluster.channel_record("orders", "c").requeued) >= 1)
        assert consumer.stats().handler_errors >= 1
    assert handled.value == 0


# --------------------------------------------------------------------------- processes


def _child_report(inherited: sync.Producer, url: str) -> dict[str, Any]:
    """Runs in the forked child: the inherited producer refuses, a new one works."""
    report: dict[str, Any] = {}
    try:
        inherited.publish("orders", b"from-inherited")
    except e.ForkedClientError as exc:
        report["error"] = str(exc)
    inherited.close()  # drops the child's copy; must not raise
    with sync.Producer(lookupd=[url]) as fresh:
        report["partition"] = fresh.publish("orders", b"from-child", partition=3).partition
    return report


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_fork_safety(tc: ThreadedCluster) -> None:
    url = tc.lookupd_url
    with _producer(tc) as producer:
        producer.publish("orders", b"from-parent", partition=1)
        producer.publish("orders", b"from-parent-here", partition=1)
        idle_before = _idle_connections(producer)
        assert len(idle_before) == 1
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                os.close(read_end)
                payload = json.dumps(_child_report(producer, url))
                code = 0
            except BaseException as exc:  # noqa: BLE001 - the parent asserts on it
                payload = json.dumps({"crash": repr(exc)})
            finally:
                try:
                    os.write(write_end, payload.encode())
                finally:
                    os._exit(code)
        os.close(write_end)
        data = b""
        deadline = time.monotonic() + 60
        try:
            while True:
                remaining = deadline - time.monotonic()
                assert remaining > 0, "the child did not report in time"
                ready, _, _ = select.select([read_end], [], [], remaining)
                if ready:
                    chunk = os.read(read_end, 65536)
                    if not chunk:
                        break
                    data += chunk
        finally:
            os.close(read_end)
            if not data:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        report = json.loads(data)
        assert os.waitstatus_to_exitcode(status) == 0, report
        assert "create the client after fork, in the worker process" in report["error"]
        assert report["partition"] == 3
        producer.publish("orders", b"parent-still-works")
        # the child's close() left the parent's connections alone
        assert producer.publish("orders", b"here-still", partition=1).tries == 1
        assert idle_before[0] in _idle_connections(producer)
    log = _log(tc)
    everything = [b for bodies in log.values() for b in bodies]
    assert b"from-child" in log[3]
    assert b"from-inherited" not in everything
    assert {b"from-parent", b"parent-still-works"} <= set(everything)


SCRIPT = """
import json, sys, threading
from smartnsq.sync import Producer

with Producer(lookupd=[sys.argv[1]]) as producer:
    single = producer.publish("orders", b"script-1", sharding_key=7)
    batch = producer.publish_many("orders", [b"script-2", b"script-3"], partition=1)
print(json.dumps({
    "single": single.partition,
    "batch": [r.partition for r in batch],
    "threads": sorted(t.name for t in threading.enumerate()),
}))
"""


def test_plain_script_in_a_subprocess(tc: ThreadedCluster) -> None:
    """No event loop anywhere in the script: the facade brings its own."""
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-c", SCRIPT, tc.lookupd_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for marker in ("Warning", "Traceback", "never awaited"):
        assert marker not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out["threads"] == ["MainThread"]
    assert out["single"] == Sharder("java").partition_for(7, 4)
    assert out["batch"] == [1, 1]
    log = _log(tc)
    assert b"script-1" in log[out["single"]]
    assert log[1][-2:] == [b"script-2", b"script-3"]


def test_close_timeout_bounds_a_stuck_plain_function_handler(tc: ThreadedCluster) -> None:
    """close(timeout=0.5) with the handler stuck in its thread used to take 5 s more (the
    handler threads' own wait, and the CLS wait on top of timeout). The wait below allows
    3 s of a loaded machine's delays, less than those 5 s."""
    entered = threading.Event()
    release = threading.Event()

    def stuck(message: sync.Message) -> None:
        entered.set()
        release.wait(WAIT)

    consumer = _consumer(tc, handler=stuck)
    consumer.start()
    _publish(tc, 1)
    assert entered.wait(WAIT)
    closer = _start_thread(lambda: consumer.close(timeout=0.5), "closer")
    try:
        closer.join(3.5)
        assert not closer.is_alive(), "close(timeout=0.5) still running after 3.5 s"
    finally:
        release.set()
        closer.join(WAIT)
    assert _threads_named("smartnsq-consumer-loop") == []


@pytest.mark.parametrize(
    ("field", "options", "text"),
    [
        ("lookupd", {"lookupd": []}, "at least one nsqlookupd address"),
        ("lookupd", {"lookupd": ["ftp://127.0.0.1:4161"]}, "http or https"),
        ("lookupd_poll_interval", {"lookupd_poll_interval": 0}, "seconds"),
        ("heartbeat_interval", {"heartbeat_interval": 61}, "1..60 seconds"),
    ],
    ids=["lookupd-empty", "lookupd-scheme", "poll", "heartbeat"],
)
def test_argument_errors_name_the_argument_in_its_unit(
    field: str, options: dict[str, Any], text: str
) -> None:
    """The facade raises the async clients' errors unchanged: the argument's name, in its
    unit, and no loop thread left behind (the no_leaked_threads fixture)."""
    options = {"lookupd": ["http://127.0.0.1:4161"], **options}
    clients: list[Callable[[], Any]] = [
        lambda: sync.Producer(**options),
        lambda: sync.Consumer("orders", "c", **options),
    ]
    for make in clients:
        with pytest.raises(e.ValidationError) as raised:
            make()
        assert raised.value.field == field
        assert text in str(raised.value)
        assert " ms" not in str(raised.value)
    with pytest.raises(e.ValidationError) as raised:
        sync.Producer(lookupd=["http://127.0.0.1:4161"], connections_per_partition=0)
    assert raised.value.field == "connections_per_partition"
