"""Consumer backoff over real sockets: handler failures cost the policy's windows, no more.

Each test records the windows the controller asks its :class:`BackoffPolicy` for, then
checks that consuming took at most their sum plus a small margin (connecting, handling,
scheduling on a shared machine), whatever the timing of the failures.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

# Everything but the backoff windows: loopback round trips and a few handler calls, on a
# 2-core machine shared with other test runs. A stalled test of the waters costs
# low_rdy_idle_timeout (10 s) per window, far beyond it.
MARGIN = 2.0


@dataclass(frozen=True)
class RecordingPolicy(BackoffPolicy):
    """A BackoffPolicy that remembers every window it was asked for, in seconds."""

    windows: list[float] = field(default_factory=list, compare=False, repr=False)

    def delay(self, level: int, rand: Callable[[], float] | None = None) -> float:
        seconds = super().delay(level, rand)
        self.windows.append(seconds)
        return seconds


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=2) as c:
        await c.create_topic("flaky", 2, 1, channels=["c"])
        yield c


def _consumer(cluster: Cluster, policy: BackoffPolicy, handler: Any) -> Consumer:
    # Default settings (max_in_flight=None: one unit per partition, low_rdy_idle_timeout
    # 10 s) except short windows and requeue_delay=0: failed messages come back as soon as
    # the flow resumes, so the time to consume everything is the backoff's cost.
    return Consumer(
        "flaky",
        "c",
        lookupd=[cluster.lookupd_url],
        handler=handler,
        backoff=policy,
        requeue_delay=0.0,
    )


async def _publish(cluster: Cluster, bodies: list[bytes]) -> None:
    """Everything to partition 0: partition 1 stays idle."""
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for start in range(0, len(bodies), 50):
            await producer.publish_many("flaky", bodies[start : start + 50], partition=0)


def _finished(cluster: Cluster) -> int:
    return len(cluster.channel_record("flaky", "c").finished)


def _worst_case(policy: BackoffPolicy, failures: int) -> float:
    """The longest the windows can add up to: every failure and every success that forgives
    one opens a window of at most max_delay."""
    return 2 * failures * policy.max_delay + MARGIN


async def test_transient_failures_with_an_idle_partition_cost_only_the_windows(
    cluster: Cluster,
) -> None:
    total = 100
    failing = {i for i in range(total) if i % 10 == 0}  # 10 %, first attempt only
    await _publish(cluster, [str(i).encode() for i in range(total)])
    policy = RecordingPolicy(multiplier=0.2, max_delay=2.0)

    async def handle(message: Message) -> None:
        if int(message.body) in failing and message.attempts == 1:
            raise RuntimeError("transient")

    loop = asyncio.get_running_loop()
    started = loop.time()
    async with _consumer(cluster, policy, handle) as consumer:
        await cluster.wait_for(
            lambda: _finished(cluster) == total, _worst_case(policy, len(failing))
        )
        elapsed = loop.time() - started
        stats = consumer.stats()
    assert stats.handler_errors == len(failing)
    assert stats.per_partition == {0: total}
    assert cluster.unfinished("flaky", "c") == 0
    assert policy.windows  # backoff did happen
    assert elapsed <= sum(policy.windows) + MARGIN, (elapsed, policy.windows)


async def test_a_window_opened_by_a_success_ends_on_time(cluster: Cluster) -> None:
    """Two failures in a row reach level 2; the success that forgives one opens a window of
    level 1, which must end after its delay (not at the next unrelated event)."""
    policy = RecordingPolicy(multiplier=0.2, max_delay=2.0)
    handled: list[tuple[bytes, int]] = []

    async def handle(message: Message) -> None:
        handled.append((message.body, message.attempts))
        if message.body == b"first" and message.attempts <= 2:
            raise RuntimeError("transient")

    loop = asyncio.get_running_loop()
    async with _consumer(cluster, policy, handle) as consumer:
        started = loop.time()
        await _publish(cluster, [b"first"])
        await cluster.wait_for(lambda: _finished(cluster) == 1, _worst_case(policy, 2))
        # Level 2 -> 1 with an open window: the next messages must flow once it ends.
        await _publish(cluster, [str(i).encode() for i in range(20)])
        await cluster.wait_for(lambda: _finished(cluster) == 21, _worst_case(policy, 2))
        elapsed = loop.time() - started
        stats = consumer.stats()
    assert handled[:3] == [(b"first", 1), (b"first", 2), (b"first", 3)]
    assert stats.handler_errors == 2
    assert policy.windows[:3] == [0.2, 0.4, 0.2]  # level 1, 2, then 1 again after a success
    assert elapsed <= sum(policy.windows) + MARGIN, (elapsed, policy.windows)
