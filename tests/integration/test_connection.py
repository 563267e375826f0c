"""The client connection over real sockets: handshake and upgrades, pipelining, errors,
heartbeats, timeouts and closing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from smartnsq import errors as e
from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.responses import CLOSE_WAIT, OK
from smartnsq.protocol.session import SubscribeCommand, SubscribeKind
from smartnsq.testing import Cluster
from smartnsq.testing.tls import self_signed_contexts
from smartnsq.transport.connection import FLUSH_AT, Connection, ConnectionConfig
from tests.integration.spy import spy_writes


async def _open(address: str, **config: object) -> Connection:
    conn = Connection(address, ConnectionConfig(**config))  # type: ignore[arg-type]
    await conn.connect()
    return conn


@pytest.fixture
async def single() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        yield cluster


async def _consume(conn: Connection, count: int) -> list[MessageFrame]:
    got: list[MessageFrame] = []
    done = asyncio.get_running_loop().create_future()

    def on_message(message: MessageFrame) -> None:
        got.append(message)
        conn.send(c.fin(message.id))
        if len(got) == count and not done.done():
            done.set_result(None)

    await conn.subscribe(
        SubscribeCommand(SubscribeKind.PLAIN, "t", "c", 0),
        on_message=on_message,
        message_class=MessageFrame,
    )
    conn.send(c.rdy(100))
    await asyncio.wait_for(done, 5)
    return got


async def test_youzan_handshake(single: Cluster) -> None:
    conn = await _open(single.nsqd_addresses[0])
    assert conn.youzan
    assert conn.identify is not None
    assert conn.identify.version == "0.3.7-HA.1.13.0"
    assert conn.max_rdy_count == 2500
    assert conn.layout.binary_id
    assert conn.local_address.startswith("127.0.0.1:")
    await conn.close()
    assert conn.closed


async def test_classic_handshake() -> None:
    async with Cluster(classic=True) as cluster:
        conn = await _open(cluster.nsqd_addresses[0])
        assert not conn.youzan
        assert not conn.layout.binary_id
        assert await conn.request(c.pub("t1", b"x"), "PUB") == OK
        await conn.close()


@pytest.mark.parametrize(
    ("compression", "level"), [("snappy", 6), ("deflate", 1), ("deflate", 6), (None, 6)]
)
async def test_compression(single: Cluster, compression: str | None, level: int) -> None:
    conn = await _open(single.nsqd_addresses[0], compression=compression, deflate_level=level)
    assert conn.identify is not None
    assert conn.identify.snappy == (compression == "snappy")
    assert conn.identify.deflate == (compression == "deflate")
    bodies = [bytes([i % 256]) * (i + 1) for i in range(300)]
    answers = await asyncio.gather(*(conn.request(c.pub("t", b, 0), "PUB") for b in bodies))
    assert answers == [OK] * 300
    consumer = await _open(single.nsqd_addresses[0], compression=compression, deflate_level=level)
    got = await _consume(consumer, 300)
    assert [m.body for m in got] == bodies
    await single.wait_for(lambda: single.unfinished("t", "c") == 0)
    await conn.close()
    await consumer.close()


async def test_tls_then_snappy(tmp_path: Path) -> None:
    server_ctx, client_ctx = self_signed_contexts(tmp_path)
    async with Cluster(nodes=1, tls_context=server_ctx, tls_required=True) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        conn = await _open(cluster.nsqd_addresses[0], tls=client_ctx, compression="snappy")
        assert conn.describe()["tls"]
        assert conn.describe()["compression"] == "SnappyCodec"
        assert await conn.request(c.pub("t", b"secret", 0), "PUB") == OK
        consumer = await _open(cluster.nsqd_addresses[0], tls=client_ctx)
        assert [m.body for m in await _consume(consumer, 1)] == [b"secret"]
        await conn.close()
        await consumer.close()


async def test_the_embedded_nsqd_reads_large_commands_over_tls(tmp_path: Path) -> None:
    # One read then holds several TLS records; asyncio's TLS reader fills the server's
    # buffer through slices, which must not be copies.
    server_ctx, client_ctx = self_signed_contexts(tmp_path)
    async with Cluster(nodes=1, tls_context=server_ctx) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        conn = await _open(cluster.nsqd_addresses[0], tls=client_ctx)
        bodies = [os.urandom(100_000) for _ in range(5)]
        answers = await asyncio.wait_for(
            asyncio.gather(*(conn.request(c.pub("t", b, 0), "PUB") for b in bodies)), 10
        )
        assert answers == [OK] * len(bodies)
        assert [r.body for r in cluster.messages("t")] == bodies
        await conn.close()


async def test_tls_required_refuses_plain_clients(tmp_path: Path) -> None:
    server_ctx, _ = self_signed_contexts(tmp_path)
    async with Cluster(nodes=1, tls_context=server_ctx, tls_required=True) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        conn = await _open(cluster.nsqd_addresses[0])
        with pytest.raises(e.InvalidCommandError, match="TLS required"):
            await conn.request(c.pub("t", b"x", 0), "PUB")
        await conn.wait_closed()


async def test_auth() -> None:
    async with Cluster(nodes=1, auth_secrets={"s3cret": "billing-service"}) as cluster:
        await cluster.create_topic("t", 1, 1, channels=["c"])
        conn = await _open(cluster.nsqd_addresses[0], auth_secret="s3cret")
        assert conn.auth is not None
        assert conn.auth.identity == "billing-service"
        assert await conn.request(c.pub("t", b"x", 0), "PUB") == OK
        await conn.close()
        with pytest.raises(e.AuthFailedError):
            await _open(cluster.nsqd_addresses[0], auth_secret="wrong")
        with pytest.raises(e.ValidationError, match="auth_secret"):
            await _open(cluster.nsqd_addresses[0])


async def test_pipelining_keeps_order(single: Cluster) -> None:
    conn = await _open(single.nsqd_addresses[0])
    bodies = [f"m{i}".encode() for i in range(2000)]
    futures = [conn.request_future(c.pub("t", b, 0), "PUB") for b in bodies]
    assert await asyncio.gather(*futures) == [OK] * len(bodies)
    assert [r.body for r in single.messages("t")] == bodies
    await conn.close()


async def test_a_lone_request_leaves_at_once_with_no_flush_scheduled(single: Cluster) -> None:
    """A sequential publish on an idle connection costs one write and no loop callback (a
    loop iteration less per round trip); one queued behind it waits for the flush."""
    conn = await _open(single.nsqd_addresses[0])
    writes = spy_writes(conn._transport)
    for _ in range(3):
        future = conn.request_future(c.pub("t", b"x", 0), "PUB")
        assert len(writes) == 1
        assert conn._flush_handle is None
        assert await future == OK
        writes.clear()
    first = conn.request_future(c.pub("t", b"a", 0), "PUB")
    second = conn.request_future(c.pub("t", b"b", 0), "PUB")
    assert len(writes) == 1  # the second is coalesced with whatever else this iteration sends
    assert conn._flush_handle is not None
    assert await asyncio.gather(first, second) == [OK, OK]
    assert len(writes) == 2
    assert [r.body for r in single.messages("t")][-2:] == [b"a", b"b"]
    await conn.close()


async def test_a_burst_of_requests_leaves_in_chunks_of_flush_at(single: Cluster) -> None:
    """Writes start before the burst is fully queued (nsqd works while the client encodes);
    the small writes of one loop iteration still leave together."""
    conn = await _open(single.nsqd_addresses[0])
    writes = spy_writes(conn._transport)
    frame = c.pub("t", b"x" * 100, 0)
    futures = [conn.request_future(frame, "PUB") for _ in range(100)]
    queued = len(writes)  # written before this coroutine yielded once
    assert await asyncio.gather(*futures) == [OK] * 100
    # the first request leaves at once (the connection was idle), then every FLUSH_AT bytes
    assert len(writes[0]) == len(frame)
    assert queued == 1 + 99 * len(frame) // FLUSH_AT
    assert all(len(write) >= FLUSH_AT for write in writes[1:queued])
    assert sum(map(len, writes)) == 100 * len(frame)
    before = len(writes)
    small = [conn.request_future(c.pub("t", b"y", 0), "PUB") for _ in range(10)]
    assert len(writes) == before + 1  # the first at once, the other nine wait
    await asyncio.gather(*small)
    assert len(writes) == before + 2  # and leave together
    await conn.close()


async def test_non_fatal_error_fails_only_its_request(youzan: Cluster) -> None:
    conn = await _open(youzan.nsqd_addresses[1])  # leads ptest-0, replica of nothing else
    results = await asyncio.gather(
        conn.request(c.pub("ptest", b"a", 0), "PUB"),
        conn.request(c.pub_ext("ptest", b"b", {"k": "v"}, 0), "PUB_EXT"),  # not an ext topic
        conn.request(c.pub("ptest", b"c", 0), "PUB"),
        return_exceptions=True,
    )
    assert results[0] == OK
    assert isinstance(results[1], e.ExtNotSupportedError)
    assert not results[1].fatal
    assert results[2] == OK
    assert conn.is_open
    await conn.close()


async def test_fatal_error_fails_every_pending_request(youzan: Cluster) -> None:
    conn = await _open(youzan.nsqd_addresses[1])
    first = conn.request_future(c.pub("ptest", b"ok", 0), "PUB")
    fatal = conn.request_future(c.pub("ptest", b"x", 7), "PUB")  # no such partition here
    after = conn.request_future(c.pub("ptest", b"never", 0), "PUB")
    assert await first == OK
    with pytest.raises(e.TopicNotExistError):
        await fatal
    with pytest.raises(e.TopicNotExistError):
        await after
    await conn.wait_closed()
    assert conn.closed
    with pytest.raises(e.ConnectionClosedError):
        await conn.request(c.pub("ptest", b"x", 0), "PUB")


async def test_heartbeats_answered_and_filtered(single: Cluster) -> None:
    conn = await _open(single.nsqd_addresses[0], heartbeat_interval=1.0)
    # Pipelined requests straddle heartbeats; the FIFO must ignore them.
    for _ in range(6):
        assert await conn.request(c.pub("t", b"x", 0), "PUB") == OK
        await asyncio.sleep(0.5)
    assert conn.is_open  # youzan drops clients that do not answer within 3 intervals
    await conn.close()


async def test_dead_server_is_detected(single: Cluster) -> None:
    """A server gone silent (hung, or cut off by a partition: blackholed, so it closes
    nothing either) is found out by the client's own deadline: two missed heartbeats and a
    second. A node that only stops its heartbeats would also drop the client itself at its
    read deadline (3 intervals on youzan), about when the client's deadline falls: on a
    loaded machine either came first."""
    conn = await _open(single.nsqd_addresses[0], heartbeat_interval=1.0)
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    conn.set_close_callback(lambda _conn, exc: closed.set_result(exc))
    silent_since = loop.time()
    single.blackhole(0)
    error = await asyncio.wait_for(closed, 15)  # 3 s, unless the machine is very busy
    assert isinstance(error, e.NSQTimeoutError)
    assert "no heartbeat" in str(error)
    assert loop.time() - silent_since >= 2.0  # not before two heartbeats were missed


async def test_request_timeout_closes_the_connection(single: Cluster) -> None:
    conn = await _open(single.nsqd_addresses[0], request_timeout=0.2)
    single.set_latency(0, 1.0)
    with pytest.raises(e.NSQTimeoutError):
        await conn.request(c.pub("t", b"slow", 0), "PUB")
    assert conn.closed
    single.set_latency(0, 0)


async def test_a_shorter_timeout_behind_a_longer_one_is_kept(single: Cluster) -> None:
    """A request given less time than those before it (a publish cut at what remains of its
    publish_timeout) fails at its own deadline, not when the oldest one's passes."""
    conn = await _open(single.nsqd_addresses[0], request_timeout=5.0)
    single.set_latency(0, 2.0)
    loop = asyncio.get_running_loop()
    first = conn.request_future(c.pub("t", b"a", 0), "PUB")
    started = loop.time()
    second = conn.request_future(c.pub("t", b"b", 0), "PUB", timeout=0.2)
    with pytest.raises(e.NSQTimeoutError, match=r"no answer within 0\.2 s"):
        await asyncio.wait_for(second, 1.5)
    assert loop.time() - started < 1.0
    with pytest.raises(e.NSQTimeoutError):
        await first  # a late answer would pair with the wrong request: all fail
    assert conn.closed
    single.set_latency(0, 0)


async def test_connect_refused() -> None:
    async with Cluster(nodes=1) as cluster:
        address = cluster.nsqd_addresses[0]
        await cluster.stop_node(0)
        with pytest.raises(e.ConnectionClosedError, match="cannot connect"):
            await _open(address)


async def test_close_fails_pending_and_leaks_nothing(single: Cluster) -> None:
    before = len(asyncio.all_tasks())
    conn = await _open(single.nsqd_addresses[0])
    single.set_latency(0, 0.5)
    pending = conn.request_future(c.pub("t", b"x", 0), "PUB")
    await conn.close()
    with pytest.raises(e.ConnectionClosedError):
        await pending
    single.set_latency(0, 0)
    assert len(asyncio.all_tasks()) == before


async def test_cls_and_unsolicited_errors(single: Cluster) -> None:
    errors: list[e.ServerError] = []
    conn = await _open(single.nsqd_addresses[0])
    await conn.subscribe(
        SubscribeCommand(SubscribeKind.PLAIN, "t", "c", 0),
        on_message=lambda message: None,
        message_class=MessageFrame,
        on_error=errors.append,
    )
    # not in flight: E_FIN_FAILED, non-fatal (an internal id of 0 would be a fatal E_INVALID)
    conn.send(c.fin(bytes(7) + b"\x01" + bytes(8)))
    assert await conn.request(c.cls(), "CLS") == CLOSE_WAIT
    assert [err.code for err in errors] == ["E_FIN_FAILED"]
    assert conn.is_open
    await conn.close()


async def test_a_refused_protocol_magic_is_a_clear_typed_error() -> None:
    """What nsqd does with a magic it does not know: the bare frame E_BAD_PROTOCOL, then
    close. A peer that answers so is not an nsqd speaking protocol V2 on that port."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        writer.write(b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(e.BadProtocolError) as caught:
            await _open(f"127.0.0.1:{port}")
        assert caught.value.fatal
        assert not caught.value.retriable
        assert "is this the nsqd TCP address?" in str(caught.value)
    finally:
        server.close()
        await server.wait_closed()
