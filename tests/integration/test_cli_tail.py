"""``smartnsq tail -n N`` on a busy topic (issue 13): it must exit at once after the N-th
message, handing the extra messages back, instead of waiting out the consumer's drain
timeout (10 s) with "1 messages still unanswered"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster
from tests.integration.test_cli import (
    TAIL_LINE,
    _finish,
    _subscribed,
    _wait_subscribed,
    cluster,
    spawn,
)

__all__ = ["cluster"]  # the fixture, shared with test_cli.py

# Well under the consumer's drain timeout (10 s), well over a loaded machine's exit time.
EXIT_WITHIN = 3.0
LATENCY = 0.2


@contextlib.asynccontextmanager
async def busy(cluster: Cluster, topic: str) -> AsyncIterator[list[int]]:
    """Publishes to every partition of ``topic`` until the block ends; yields the count."""
    published = [0]
    stop = asyncio.Event()

    async def publish() -> None:
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            while not stop.is_set():
                await asyncio.gather(*(batch(producer, p) for p in range(4)))
                await asyncio.sleep(0.002)  # yield to the cluster; a pace, not a wait

    async def batch(producer: Producer, partition: int) -> None:
        bodies = [b"busy %d %d" % (partition, published[0] + i) for i in range(10)]
        published[0] += len(bodies)
        await producer.publish_many(topic, bodies, partition=partition)

    task = asyncio.create_task(publish())
    try:
        yield published
    finally:
        stop.set()
        await task


def _unanswered(cluster: Cluster, topic: str, channel: str) -> int:
    """Deliveries the client never answered with FIN or REQ. nsqd takes them back when the
    client leaves (youzan at once; classic only after msg_timeout): answering them is the
    client's job. A copy of a delivery (same attempt: youzan's ordered echo) is one."""
    record = cluster.channel_record(topic, channel)
    deliveries = Counter({(p, i, a) for p, i, a, _ in record.deliveries})
    attempts = Counter((p, i) for p, i, _ in deliveries)
    answers = Counter(record.finished) + Counter(record.requeued)
    return sum(max(0, n - answers[key]) for key, n in attempts.items())


@pytest.mark.parametrize(
    ("topic", "channel"),
    [("orders", None), ("orders", "audit"), ("ordered", "audit")],
    ids=["ephemeral", "durable", "ordered"],
)
async def test_tail_n_on_a_busy_topic_exits_at_once(
    cluster: Cluster, topic: str, channel: str | None
) -> None:
    """Exit well under the drain timeout after the 3rd line, print nothing more, and leave
    no delivery unanswered. With smartnsq/consumer.py patched as the report proposes (REQ 0
    for what arrives while closing), all three pass in about 3 s each."""
    args = ["tail", topic, "--lookupd", cluster.lookupd_url, "-n", "3"]
    if channel is not None:
        args += ["--channel", channel]
    async with busy(cluster, topic) as published:
        await cluster.wait_for(lambda: published[0] >= 400)  # a backlog on every partition
        # A network, not loopback: whatever nsqd sends takes LATENCY to arrive, so the
        # messages nsqd sends while tail prints its last one (a FIN frees a slot, a REQ
        # comes back at once) arrive after tail has begun to close.
        for node in range(len(cluster.nodes)):
            cluster.set_latency(node, LATENCY)
        async with spawn(*args) as proc:
            assert proc.stdout is not None
            prefix = channel or "tail-"
            name = await _wait_subscribed(cluster, proc, topic, prefix)
            lines = [await asyncio.wait_for(proc.stdout.readline(), 20) for _ in range(3)]
            printed = time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), EXIT_WITHIN)
            took = time.monotonic() - printed
            assert proc.returncode == 0, f"still running {took:.1f} s after the 3rd line"
            result = await _finish(proc)
    assert all(TAIL_LINE.fullmatch(line.decode().rstrip("\n")) for line in lines), lines
    assert result.out == ""  # nothing after the 3rd line
    note = f"smartnsq tail: note: {topic} is an ordered topic: subscribing with SUB_ORDERED\n"
    assert result.err == (note if topic == "ordered" else "")  # no "still unanswered"
    await cluster.wait_for(lambda: not _subscribed(cluster, topic, name, [0, 1, 2, 3]))
    assert _unanswered(cluster, topic, name) == 0
