"""A user's tenacity strategies at work over the embedded cluster (issue 34): a tenacity wait
spaces a publish's retries and a consumer's reconnections, a tenacity stop ends a publish,
in the asyncio clients and the blocking ones. Every wait is for an event, bounded."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest
import tenacity

import smartnsq
import smartnsq.sync
from smartnsq import errors as e
from smartnsq.testing import Cluster

WAIT = 15.0


class Recording:
    """A tenacity wait (or stop) that notes the attempt number and the failure of every
    RetryCallState it is asked with (from the client's loop, or the caller's thread)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.calls: list[tuple[int, BaseException | None]] = []
        self._lock = threading.Lock()

    def __call__(self, state: tenacity.RetryCallState) -> Any:
        failure = state.outcome.exception() if state.outcome is not None else None
        with self._lock:
            self.calls.append((state.attempt_number, failure))
        return self.strategy(state)

    @property
    def attempts(self) -> list[int]:
        with self._lock:
            return [attempt for attempt, _ in self.calls]


def _closed_port() -> str:
    """An address where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_a_tenacity_wait_spaces_the_retries_of_a_publish() -> None:
    wait = Recording(tenacity.wait_exponential(multiplier=0.01, max=0.1))
    async with Cluster(nodes=1, classic=True) as cluster:
        await cluster.stop_node(0)  # its port refuses connections
        producer = smartnsq.Producer(
            nsqd=cluster.nsqd_addresses, publish_timeout=20, retry_backoff=wait
        )
        try:
            publish = asyncio.ensure_future(producer.publish("t", b"x"))
            await cluster.wait_for(lambda: len(wait.attempts) >= 3, WAIT)
            await cluster.start_node(0)
            result = await asyncio.wait_for(publish, WAIT)
        finally:
            await producer.close()
        attempts = wait.attempts
        assert attempts == list(range(1, len(attempts) + 1))  # one call per failed try
        assert result.tries == len(attempts) + 1
        assert all(isinstance(failure, e.ConnectionClosedError) for _, failure in wait.calls)
        assert [record.body for record in cluster.messages("t")] == [b"x"]


async def test_a_tenacity_stop_ends_a_publish_long_before_its_deadline() -> None:
    wait = Recording(tenacity.wait_fixed(0.01))
    # Not started: start() says at once that no nsqd accepted; a publish retries.
    producer = smartnsq.Producer(
        nsqd=[_closed_port()],
        publish_timeout=60,
        retry_backoff=wait,
        retry_stop=tenacity.stop_after_attempt(3),
    )
    try:
        with pytest.raises(e.PublishError) as info:
            await asyncio.wait_for(producer.publish("t", b"x"), WAIT)
    finally:
        await producer.close()
    assert info.value.tries == 3
    assert "retry_stop" in str(info.value)
    assert not info.value.outcome_unknown  # nothing was ever sent
    assert wait.attempts == [1, 2]  # asked between the tries, not after the last


def test_the_blocking_producer_takes_the_same_strategies() -> None:
    wait = Recording(tenacity.wait_fixed(0.01))
    stop = Recording(tenacity.stop_after_attempt(2))
    producer = smartnsq.sync.Producer(
        nsqd=[_closed_port()], publish_timeout=60, retry_backoff=wait, retry_stop=stop
    )
    try:
        with pytest.raises(e.PublishError) as info:
            producer.publish("t", b"x", timeout=WAIT)
    finally:
        producer.close()
    assert info.value.tries == 2
    assert wait.attempts == [1]
    assert stop.attempts == [1, 2]
    with pytest.raises(e.ValidationError) as refused:
        smartnsq.sync.Producer(nsqd=[_closed_port()], retry_stop=2)  # type: ignore[arg-type]
    assert refused.value.field == "retry_stop"


async def test_a_tenacity_wait_spaces_a_consumers_reconnections() -> None:
    wait = Recording(tenacity.wait_fixed(0.02))
    seen: list[bytes] = []
    async with Cluster(nodes=1, classic=True) as cluster:
        consumer = smartnsq.Consumer(
            "t",
            "c",
            nsqd=cluster.nsqd_addresses,
            handler=lambda message: seen.append(message.body),
            reconnect_backoff=wait,
        )
        async with consumer:
            await cluster.wait_for(lambda: consumer.stats().connections == 1, WAIT)
            await cluster.stop_node(0)  # the connection drops, and reconnecting is refused
            await cluster.wait_for(lambda: len(wait.attempts) >= 3, WAIT)
            await cluster.start_node(0)
            await cluster.wait_for(lambda: consumer.stats().connections == 1, WAIT)
            async with smartnsq.Producer(nsqd=cluster.nsqd_addresses) as producer:
                await producer.publish("t", b"after")
            await cluster.wait_for(lambda: seen == [b"after"], WAIT)
        attempts = wait.attempts
        # failures in a row for that nsqd: the first may go again at once (a subscription
        # that had lasted) without asking the wait
        assert attempts == list(range(attempts[0], attempts[0] + len(attempts)))
        assert attempts[0] in (1, 2)
        assert any(isinstance(failure, e.ConnectionClosedError) for _, failure in wait.calls)
