"""An nsqlookupd (or nsqd HTTP API) that trickles, floods or errs cannot hold the client: every
exchange has one deadline for its whole answer and a bounded size, failures are typed errors,
a lookupd that failed is asked again at the next poll, and a storm of failures logs once per
interval (issue 27, items 3 and 4)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from smartnsq.admin import Admin
from smartnsq.consumer.consumer import Consumer
from smartnsq.errors import LookupFailedError, NSQError, NSQTimeoutError, ProtocolError
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.transport.httpclient import DEFAULT_MAX_ANSWER_BYTES
from smartnsq.transport.lookup import LookupManager
from tests.integration.hostile import Answer, HostileHttp, lookup_answer, with_leader_port

GOOD = lookup_answer()
# Every wait below is bounded; none of these should come near it.
BOUND = 10.0


async def test_a_trickling_lookupd_cannot_hold_a_lookup() -> None:
    async with (
        HostileHttp(Answer.trickle(GOOD, pause=0.2)) as server,
        LookupManager([server.url], timeout=1.0) as manager,
    ):
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with asyncio.timeout(BOUND):
            with pytest.raises(LookupFailedError, match="no complete answer within 1 s"):
                await manager.lookup("ptest", "w")
        assert loop.time() - began < 3.0  # 1 s per lookupd (discovery, then the lookup)


async def test_a_lookupd_that_failed_is_asked_again_at_the_next_poll() -> None:
    """It answered, then trickled: the poll gives up on it in time and asks it again, so the
    next layout it gives is seen (before, the poll waited on the trickle for ever)."""
    moved = asyncio.Event()

    def seen(layout: TopicLayout) -> None:
        if {node.tcp_port for node in layout.partitions.values()} == {4150}:
            moved.set()

    async with (
        HostileHttp(Answer(GOOD)) as server,
        LookupManager(
            [server.url], timeout=0.5, poll_interval=0.2, poll_jitter=0.0, backoff_base=30.0
        ) as manager,
    ):
        await manager.lookup("ptest", "w")
        manager.watch("ptest", "w", seen)
        server.answer = Answer.trickle(GOOD, pause=0.2)
        async with asyncio.timeout(BOUND):
            # two polls met the trickle (and gave up on it)
            await server.wait_requests("/lookup", server.requests["/lookup"] + 2)
            server.answer = Answer(with_leader_port(GOOD, 4150))
            await moved.wait()


@pytest.mark.parametrize("declare_length", [True, False], ids=["declared", "undeclared"])
async def test_a_huge_answer_is_refused_without_reading_it(declare_length: bool) -> None:
    padded = GOOD + b" " * (50 << 20)  # the right answer, padded to 50 MiB
    async with HostileHttp(Answer(padded, declare_length=declare_length)) as server:
        async with LookupManager([server.url]) as manager:
            with pytest.raises(LookupFailedError, match=f"over the {DEFAULT_MAX_ANSWER_BYTES}"):
                await manager.lookup("ptest", "w")
        # The client hung up at 4 MiB: the server could not write the rest (a few MiB may
        # sit in the sockets' buffers).
        assert server.sent < 20 << 20


async def test_the_size_bound_is_configurable() -> None:
    async with HostileHttp(Answer(GOOD)) as server:
        async with LookupManager([server.url], max_answer_bytes=100) as manager:
            with pytest.raises(LookupFailedError, match="over the 100 bytes"):
                await manager.lookup("ptest", "w")
        async with LookupManager([server.url], max_answer_bytes=len(GOOD)) as manager:
            assert (await manager.lookup("ptest", "w")).partitions


async def test_a_consumer_start_from_cold_raises_a_typed_error() -> None:
    """Before: the builtin TimeoutError, with an empty message. (start() raises only with
    fail_fast=True; by default it goes on trying in the background.)"""
    async with HostileHttp(Answer.trickle(GOOD, pause=0.5)) as server:
        consumer = Consumer("ptest", "c", lookupd=[server.url], connect_timeout=1.0, fail_fast=True)
        with pytest.raises(NSQError) as info:
            async with asyncio.timeout(BOUND):
                await consumer.start()
        assert isinstance(info.value, LookupFailedError)
        assert "no nsqlookupd answered" in str(info.value)
        await consumer.close()


async def test_admin_requests_are_bounded_too() -> None:
    async with (
        HostileHttp(Answer.trickle(GOOD, pause=0.3)) as server,
        Admin([server.url], timeout=1.0) as admin,
        asyncio.timeout(BOUND),
    ):
        with pytest.raises(NSQTimeoutError, match="no complete answer within 1 s"):
            await admin.is_youzan()
    async with (
        HostileHttp(Answer(GOOD + b" " * 200)) as server,
        Admin([server.url], max_answer_bytes=len(GOOD)) as admin,
    ):
        with pytest.raises(ProtocolError, match="over the"):
            await admin.is_youzan()


@pytest.mark.parametrize("answer", [Answer.html_error(500), Answer(b"<html>hi</html>")])
async def test_a_broken_lookupd_is_logged_once_per_interval(
    answer: Answer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="smartnsq.lookup")
    now = [1000.0]  # the manager's clock: backoff and the log's interval follow it
    async with (
        HostileHttp(answer) as server,
        LookupManager(
            [server.url], http_attempts=1, clock=lambda: now[0], poll_interval=1.0, poll_jitter=0
        ) as manager,
    ):
        with pytest.raises(LookupFailedError):
            await manager.lookup("ptest", "w")
        for _ in range(9):  # nine polls, a second apart, each failing
            now[0] += 1.0
            await manager.poll_once()
        assert server.requests["/lookup"] >= 10
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # One record per kind (the lookupd failed; the periodic lookup failed) in 10 s.
    assert 1 <= len(warnings) <= 2, warnings
