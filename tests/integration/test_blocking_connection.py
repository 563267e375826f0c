"""The blocking connection (the protocol session driven by a calling thread over a plain
socket) against the embedded cluster: handshake and upgrades, answers and errors, the two
deadlines, and a connection closed while idle. The cluster runs on the test's loop, so every
blocking call runs in a thread of its own (``asyncio.to_thread``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from smartnsq import errors as e
from smartnsq.protocol import commands as c
from smartnsq.protocol.responses import OK
from smartnsq.testing import Cluster
from smartnsq.testing.tls import self_signed_contexts
from smartnsq.transport.blocking import BlockingConnection, BlockingPool
from smartnsq.transport.config import ConnectionConfig

T = TypeVar("T")


def _in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    return asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))


def _connected(address: str, **config: Any) -> BlockingConnection:
    conn = BlockingConnection(address, ConnectionConfig(**config))
    conn.connect(time.monotonic() + 5)
    return conn


def _request(
    conn: BlockingConnection, data: bytes, command: str = "PUB", within: float = 5
) -> bytes:
    now = time.monotonic()
    return conn.request(data, command, now + within, now)


@pytest.fixture
async def single() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1, classic=True) as cluster:
        yield cluster


async def test_handshake_and_requests(single: Cluster) -> None:
    conn = await _in_thread(_connected, single.nsqd_addresses[0])
    assert conn.is_open
    assert not conn.youzan
    for body in (b"a", b"b"):
        assert await _in_thread(_request, conn, c.pub("t", body)) == OK
        assert conn.written
    assert conn.pending_count == 0
    assert [r.body for r in single.messages("t")] == [b"a", b"b"]
    conn.close()
    assert not conn.is_open
    with pytest.raises(e.ConnectionClosedError):
        _request(conn, c.pub("t", b"late"))


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(single: Cluster, compression: str) -> None:
    conn = await _in_thread(_connected, single.nsqd_addresses[0], compression=compression)
    assert await _in_thread(_request, conn, c.pub("t", b"squeezed" * 100)) == OK
    assert [r.body for r in single.messages("t")] == [b"squeezed" * 100]
    conn.close()


async def test_tls_then_snappy(tmp_path: Path) -> None:
    server_ctx, client_ctx = self_signed_contexts(tmp_path)
    async with Cluster(nodes=1, tls_context=server_ctx, tls_required=True) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        address = cluster.nsqd_addresses[0]
        conn = await _in_thread(_connected, address, tls=client_ctx, compression="snappy")
        assert await _in_thread(_request, conn, c.pub("t", b"secret", 0)) == OK
        assert [r.body for r in cluster.messages("t")] == [b"secret"]
        conn.close()


async def test_auth() -> None:
    async with Cluster(nodes=1, classic=True, auth_secrets={"s3cret": "billing"}) as cluster:
        address = cluster.nsqd_addresses[0]
        conn = await _in_thread(_connected, address, auth_secret="s3cret")
        assert await _in_thread(_request, conn, c.pub("t", b"x")) == OK
        conn.close()
        with pytest.raises(e.AuthFailedError):
            await _in_thread(_connected, address, auth_secret="wrong")
        with pytest.raises(e.ValidationError, match="auth_secret"):
            await _in_thread(_connected, address)


async def test_an_error_fails_its_request_a_fatal_one_the_connection() -> None:
    async with Cluster(nodes=2) as cluster:
        await cluster.create_topic("ptest", 1, 1, channels=["c"])
        leader = cluster.leader("ptest", 0)
        assert leader is not None
        conn = await _in_thread(_connected, cluster.nsqd_addresses[leader])
        assert conn.youzan
        ext = c.pub_ext("ptest", b"b", {"k": "v"}, 0)  # not an ext topic
        with pytest.raises(e.ExtNotSupportedError):
            await _in_thread(_request, conn, ext, "PUB_EXT")
        assert conn.is_open
        assert await _in_thread(_request, conn, c.pub("ptest", b"c", 0)) == OK
        with pytest.raises(e.TopicNotExistError):  # no such partition: fatal
            await _in_thread(_request, conn, c.pub("ptest", b"x", 7))
        assert not conn.is_open
        with pytest.raises(e.ConnectionClosedError):
            await _in_thread(_request, conn, c.pub("ptest", b"never", 0))


async def test_the_callers_deadline_leaves_the_request_to_the_session(single: Cluster) -> None:
    """The caller gives up first (the builtin TimeoutError): the connection stays open, the
    late answer is paired with the request given up, and the next request gets its own."""
    conn = await _in_thread(_connected, single.nsqd_addresses[0])
    single.set_latency(0, 0.3)
    with pytest.raises(TimeoutError) as caught:
        await _in_thread(_request, conn, c.pub("t", b"slow"), "PUB", 0.05)
    assert not isinstance(caught.value, e.NSQError)
    assert conn.written
    assert conn.is_open
    assert conn.pending_count == 1
    single.set_latency(0, 0.0)
    assert await _in_thread(_request, conn, c.pub("t", b"next")) == OK
    assert conn.pending_count == 0
    conn.close()


async def test_a_request_unanswered_within_request_timeout_ends_the_connection(
    single: Cluster,
) -> None:
    conn = await _in_thread(_connected, single.nsqd_addresses[0], request_timeout=0.2)
    single.blackhole(0)
    started = time.monotonic()
    with pytest.raises(e.NSQTimeoutError, match=r"no answer within 0\.2 s"):
        await _in_thread(_request, conn, c.pub("t", b"lost"))
    assert 0.2 <= time.monotonic() - started < 1.5
    assert not conn.is_open
    single.heal(0)


async def test_connecting(single: Cluster) -> None:
    address = single.nsqd_addresses[0]
    await single.stop_node(0)
    with pytest.raises(e.ConnectionClosedError, match="cannot connect"):
        await _in_thread(_connected, address)
    await single.start_node(0)
    single.blackhole(0)  # accepted, never answered: the session's handshake bound
    with pytest.raises(e.NSQTimeoutError, match="handshake"):
        await _in_thread(_connected, address, connect_timeout=0.2)
    conn = BlockingConnection(address, ConnectionConfig())
    with pytest.raises(TimeoutError) as caught:  # the caller's deadline first
        await _in_thread(conn.connect, time.monotonic() + 0.1)
    assert not isinstance(caught.value, e.NSQError)
    single.heal(0)


async def test_interrupt_ends_a_wait_from_another_thread(single: Cluster) -> None:
    conn = await _in_thread(_connected, single.nsqd_addresses[0])
    single.blackhole(0)
    waiting = _in_thread(_request, conn, c.pub("t", b"held"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    conn.interrupt()
    with pytest.raises(e.ConnectionClosedError):
        await asyncio.wait_for(waiting, 5)
    assert not conn.is_open
    single.heal(0)


async def test_an_idle_connection_closed_by_nsqd_is_seen_before_it_is_used(
    single: Cluster,
) -> None:
    conn = await _in_thread(_connected, single.nsqd_addresses[0])
    assert await _in_thread(conn.alive)
    await single.drop_connections(0)
    await single.wait_for(lambda: single.clients(0) == 0)
    assert not await _in_thread(conn.alive)
    assert not conn.is_open


async def test_the_pool_keeps_one_per_thread_at_once_and_asks_for_no_heartbeats(
    single: Cluster,
) -> None:
    pool = BlockingPool(ConnectionConfig(heartbeat_interval=5.0))
    key = (single.nsqd_addresses[0], "*", None)
    assert pool.take(key, time.monotonic()) is None
    first = await _in_thread(pool.connect, key, time.monotonic() + 5)
    second = await _in_thread(pool.connect, key, time.monotonic() + 5)
    assert [s.peer.heartbeat_interval for s in single.nodes[0].sessions] == [0.0, 0.0]
    pool.give_back(key, first)
    pool.give_back(key, second)
    assert pool.open_connections() == 2
    now = time.monotonic()
    assert {pool.take(key, now), pool.take(key, now)} == {first, second}
    assert pool.take(key, now) is None
    pool.give_back(key, first)
    barrier = threading.Event()

    def wait_in_use() -> None:
        barrier.set()
        with pytest.raises(e.ConnectionClosedError):
            _request(second, c.pub("t", b"held"))

    single.blackhole(0)
    in_use = _in_thread(wait_in_use)
    await asyncio.to_thread(barrier.wait, 5)
    await asyncio.sleep(0.05)
    pool.close()  # the idle one closed, the one in use interrupted
    await asyncio.wait_for(in_use, 5)
    assert not first.is_open
    pool.give_back(key, second)
    assert pool.open_connections() == 0
    with pytest.raises(e.ClientClosedError):
        await _in_thread(pool.connect, key, time.monotonic() + 5)
    single.heal(0)


async def test_a_write_cut_short_closes_the_connection(
    single: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the middle of a write may leave part of a command in the socket: nothing
    can follow it on this connection."""
    conn = await _in_thread(_connected, single.nsqd_addresses[0])

    def interrupted(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(conn, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _request(conn, c.pub("t", b"cut"))
    assert not conn.written
    assert not conn.is_open
