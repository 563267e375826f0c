"""The fault proxy over real sockets, in front of a small recording server: every mode,
switched on and off while connections are open, checked by counts, bytes and states."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from smartnsq.errors import ValidationError
from smartnsq.testing.changes import Changes
from smartnsq.testing.faults import FaultProxy, FaultProxyError
from smartnsq.testing.faults.shaping import Slicer

WAIT = 5.0
# How long a test listens for something that must not arrive.
SILENCE = 0.2


@dataclass
class Accepted:
    """One connection the server accepted: what it received, and how it ended."""

    writer: asyncio.StreamWriter
    data: bytearray = field(default_factory=bytearray)
    ended: str = ""  # "eof" or "reset"


class Upstream:
    """A server that records every connection, echoes what it receives (``echo``) and
    closes its side when the client closed its own."""

    def __init__(self, *, echo: bool = True) -> None:
        self.echo = echo
        self.accepted: list[Accepted] = []
        self.changes = Changes()
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Upstream:
        self.changes.start()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Accepted(writer)
        self.accepted.append(connection)
        self.changes.changed()
        task = asyncio.get_running_loop().create_task(self._serve(reader, connection))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, connection: Accepted) -> None:
        try:
            while data := await reader.read(65536):
                connection.data += data
                self.changes.changed()
                if self.echo:
                    connection.writer.write(data)
                    await connection.writer.drain()
            connection.ended = "eof"
            connection.writer.close()  # a FIN back
        except ConnectionError:
            connection.ended = "reset"
        self.changes.changed()

    @property
    def first(self) -> Accepted:
        """The first connection (a placeholder until there is one)."""
        return self.accepted[0] if self.accepted else Accepted(None)  # type: ignore[arg-type]

    async def wait_for(self, predicate: object, timeout: float = WAIT) -> None:
        await self.changes.wait_for(predicate, timeout)  # type: ignore[arg-type]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in self.accepted:
            connection.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = await Upstream().start()
    yield server
    await server.close()


@pytest.fixture
async def proxy(upstream: Upstream) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", upstream.port, seed=11) as started:
        yield started


async def _connect(proxy: FaultProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", proxy.port), WAIT)


async def _silent(reader: asyncio.StreamReader) -> bool:
    """Nothing arrives, and the connection is not closed, within SILENCE."""
    try:
        await asyncio.wait_for(reader.read(1), SILENCE)
    except TimeoutError:
        return True
    return False


async def _round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bytes:
    writer.write(data)
    return await asyncio.wait_for(reader.readexactly(len(data)), WAIT)


async def test_forwards_both_ways_and_counts(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"hello") == b"hello"
    assert await _round_trip(reader, writer, b"world!") == b"world!"
    stats = proxy.stats()
    assert (stats.accepted, stats.open, stats.upstream_bytes, stats.downstream_bytes) == (
        1,
        1,
        11,
        11,
    )
    assert upstream.first.data == b"helloworld!"
    writer.close()
    await proxy.wait_for(lambda: proxy.stats().open == 0)
    await upstream.wait_for(lambda: upstream.first.ended == "eof")


async def test_a_half_close_passes_through(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    writer.write(b"last words")
    writer.write_eof()
    # The server saw the end of the stream and may still answer: the echo comes back.
    await upstream.wait_for(lambda: upstream.first.ended == "eof")
    assert await asyncio.wait_for(reader.readexactly(10), WAIT) == b"last words"
    writer.close()


async def test_blackhole_holds_data_until_healed(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"before") == b"before"
    proxy.blackhole()
    assert proxy.blackholed
    writer.write(b"held")
    assert await _silent(reader)  # no echo, no FIN, no RST
    assert upstream.first.data == b"before"
    assert proxy.stats().open == 1
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(4), WAIT) == b"held"
    assert upstream.first.data == b"beforeheld"
    assert proxy.stats().dropped_bytes == 0
    writer.close()


async def test_blackhole_holds_the_end_of_a_stream(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"x") == b"x"
    proxy.blackhole(hold=False)
    writer.write_eof()
    assert await _silent(reader)
    assert upstream.first.ended == ""
    proxy.heal()
    await upstream.wait_for(lambda: upstream.first.ended == "eof")
    assert await asyncio.wait_for(reader.read(1), WAIT) == b""  # the server's FIN came back
    writer.close()


async def test_a_dropping_blackhole_throws_data_away(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"a") == b"a"
    proxy.blackhole("upstream", hold=False)
    writer.write(b"lost bytes")
    await proxy.wait_for(lambda: proxy.stats().dropped_bytes == 10)
    proxy.heal()
    assert await _round_trip(reader, writer, b"b") == b"b"
    assert upstream.first.data == b"ab"
    writer.close()


async def test_one_direction_blackholed(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    proxy.blackhole("downstream")
    writer.write(b"up")
    await upstream.wait_for(lambda: upstream.first.data == b"up")  # goes up
    assert await _silent(reader)  # the echo is held
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(2), WAIT) == b"up"
    writer.close()


async def test_a_connection_made_in_a_blackhole_reaches_the_server_once_healed(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    proxy.blackhole()
    reader, writer = await _connect(proxy)  # the kernel accepts it
    writer.write(b"hi")
    await proxy.wait_for(lambda: proxy.stats().accepted == 1)
    assert await _silent(reader)
    assert upstream.accepted == []
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(2), WAIT) == b"hi"
    assert len(upstream.accepted) == 1
    writer.close()


async def test_reset_resets_every_connection_on_both_sides(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    clients = [await _connect(proxy) for _ in range(3)]
    for reader, writer in clients:
        assert await _round_trip(reader, writer, b"x") == b"x"
    assert proxy.reset() == 3
    for reader, _ in clients:
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), WAIT)
    await upstream.wait_for(lambda: all(c.ended == "reset" for c in upstream.accepted))
    await proxy.wait_for(lambda: proxy.stats().open == 0)
    assert proxy.stats().reset == 3
    reader, writer = await _connect(proxy)  # new connections are not affected
    assert await _round_trip(reader, writer, b"y") == b"y"
    writer.close()


async def test_reset_new_connections_until_healed(proxy: FaultProxy, upstream: Upstream) -> None:
    assert proxy.reset(new_connections=True) == 0
    for _ in range(2):
        reader, writer = await _connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), WAIT)
        writer.close()
    assert (proxy.stats().accepted, proxy.stats().reset) == (2, 2)
    assert upstream.accepted == []
    proxy.heal()
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"ok") == b"ok"
    writer.close()


async def test_refuse_new_connections_and_listen_again(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    reader, writer = await _connect(proxy)
    proxy.refuse()
    assert proxy.refusing
    with pytest.raises(ConnectionRefusedError):
        await _connect(proxy)
    assert await _round_trip(reader, writer, b"open ones live") == b"open ones live"
    proxy.heal()
    again_reader, again_writer = await _connect(proxy)  # the same port
    assert await _round_trip(again_reader, again_writer, b"back") == b"back"
    assert proxy.stats().accepted == 2
    for w in (writer, again_writer):
        w.close()


async def test_latency_delays_each_way_in_order(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_latency(0.05)
    started = time.monotonic()
    assert await _round_trip(reader, writer, b"x") == b"x"
    assert time.monotonic() - started >= 0.1  # 0.05 up, 0.05 down
    proxy.set_latency(0.02, jitter=0.02, direction="upstream")
    chunks = [b"%03d;" % i for i in range(40)]
    for chunk in chunks:
        writer.write(chunk)
        await writer.drain()
        await asyncio.sleep(0)  # one read per chunk, so each draws its own jitter
    received = await asyncio.wait_for(reader.readexactly(4 * len(chunks)), WAIT)
    assert received == b"".join(chunks)
    proxy.set_latency(0)
    started = time.monotonic()
    assert await _round_trip(reader, writer, b"z") == b"z"
    assert time.monotonic() - started < 0.1
    writer.close()


async def test_bandwidth(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_bandwidth(100_000, direction="upstream")
    started = time.monotonic()
    writer.write(bytes(30_000))
    await upstream.wait_for(lambda: len(upstream.first.data) == 30_000)
    assert time.monotonic() - started >= 0.28  # 30 kB at 100 kB/s (the first write is free)
    assert proxy.stats().upstream_writes >= 30_000 // 2_000
    proxy.set_bandwidth(None)
    await asyncio.wait_for(reader.readexactly(30_000), WAIT)
    writer.close()


async def test_slicing_writes_seeded_pieces(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_slicing(7, direction="upstream")
    stream = bytes(range(200))
    writer.write(stream)
    await upstream.wait_for(lambda: bytes(upstream.first.data) == stream)
    # The pieces are those of a Slicer seeded as the proxy seeds connection 1 upstream
    # (more only if the proxy read the 200 bytes in several reads).
    expected = list(Slicer(7, random.Random(f"{proxy.seed}:1:upstream")).cut(stream))
    assert proxy.stats().upstream_writes >= len(expected) > 200 // 7
    assert await asyncio.wait_for(reader.readexactly(200), WAIT) == stream
    assert proxy.stats().downstream_writes < len(expected)  # not sliced
    writer.close()


async def test_slicing_with_a_delay_between_pieces(proxy: FaultProxy, upstream: Upstream) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_slicing(1, delay=0.002, direction="downstream")
    assert await _round_trip(reader, writer, b"sliced") == b"sliced"
    assert proxy.stats().downstream_writes == 6
    writer.close()


async def test_close_after_n_bytes(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.close_after(10, direction="upstream")
    reader, writer = await _connect(proxy)
    writer.write(b"0123456789abcdef")
    await upstream.wait_for(lambda: upstream.first.ended == "eof")
    assert upstream.first.data == b"0123456789"
    # The echo of those 10 bytes races the close: some of it, then FIN.
    assert b"0123456789".startswith(await asyncio.wait_for(reader.read(), WAIT))
    await proxy.wait_for(lambda: proxy.stats().open == 0)
    assert proxy.stats().limited == 1
    writer.close()


async def test_close_after_counts_from_now_and_may_reset(
    proxy: FaultProxy, upstream: Upstream
) -> None:
    reader, writer = await _connect(proxy)
    assert await _round_trip(reader, writer, b"0123456789") == b"0123456789"
    proxy.close_after(3, direction="downstream", reset=True)
    writer.write(b"abcdef")
    assert await asyncio.wait_for(reader.readexactly(3), WAIT) == b"abc"
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(reader.read(1), WAIT)
    assert (proxy.stats().limited, proxy.stats().reset) == (1, 1)
    writer.close()


async def test_an_unreachable_upstream_resets_the_client(upstream: Upstream) -> None:
    port = upstream.port
    await upstream.close()  # nothing listens there any more
    async with FaultProxy("127.0.0.1", port) as proxy:
        reader, writer = await _connect(proxy)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), WAIT)
        assert proxy.stats().upstream_failed == 1
        writer.close()


async def test_close_ends_everything_and_leaks_nothing(upstream: Upstream) -> None:
    tasks_before = asyncio.all_tasks()
    proxy = await FaultProxy("127.0.0.1", upstream.port).start()
    clients = [await _connect(proxy) for _ in range(3)]
    for reader, writer in clients:
        assert await _round_trip(reader, writer, b"x") == b"x"
    proxy.blackhole()
    proxy.refuse()
    await proxy.close()
    await proxy.close()  # idempotent
    assert proxy.stats().open == 0
    assert asyncio.all_tasks() == tasks_before
    for reader, writer in clients:
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(1), WAIT)
        writer.close()
    with pytest.raises(ConnectionRefusedError):
        await _connect(proxy)
    with pytest.raises(FaultProxyError, match="not running"):
        proxy.heal()


async def test_no_address_before_the_os_chose_the_port(upstream: Upstream) -> None:
    proxy = FaultProxy("127.0.0.1", upstream.port)
    with pytest.raises(FaultProxyError, match=r"no address before start\(\)"):
        proxy.address  # noqa: B018 - the property raises
    assert "a port not chosen yet" in repr(proxy)
    async with proxy:
        assert proxy.address == f"127.0.0.1:{proxy.port}"
        assert proxy.port != 0
        assert proxy.address in repr(proxy)
    fixed = FaultProxy("127.0.0.1", upstream.port, port=proxy.port)
    assert fixed.address == proxy.address  # known before start: it was given


async def test_clear_ends_every_fault(proxy: FaultProxy) -> None:
    reader, writer = await _connect(proxy)
    proxy.set_latency(5)
    proxy.set_slicing(1)
    proxy.set_bandwidth(10)
    proxy.close_after(1)
    proxy.clear()
    assert await _round_trip(reader, writer, b"plain") == b"plain"
    assert proxy.stats().upstream_writes == 1
    writer.close()


async def test_wait_for_is_bounded(proxy: FaultProxy) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await proxy.wait_for(lambda: proxy.stats().accepted == 1, timeout=0.05)


async def test_bad_arguments_raise_before_anything_changes(proxy: FaultProxy) -> None:
    with pytest.raises(ValidationError, match="direction"):
        proxy.blackhole("sideways")
    assert not proxy.blackholed
    with pytest.raises(ValidationError, match="seconds"):
        proxy.set_latency(-1)
    with pytest.raises(ValidationError, match="bytes_per_second"):
        proxy.set_bandwidth(0)
    with pytest.raises(ValidationError, match="max_size"):
        proxy.set_slicing(0)
    with pytest.raises(ValidationError, match="nbytes"):
        proxy.close_after(-5)
    with pytest.raises(ValidationError, match="upstream_port"):
        FaultProxy("127.0.0.1", 0)
    with pytest.raises(FaultProxyError, match="not running"):
        FaultProxy("127.0.0.1", 1).blackhole()
    for bad in ("127.0.0.1", "127.0.0.1:x", ":4150", None):
        with pytest.raises(ValidationError, match="upstream"):
            FaultProxy.to(bad)  # type: ignore[arg-type]
    assert FaultProxy.to(" [::1]:4150 ").upstream == "::1:4150"
    assert FaultProxy.to("nsqd0:4150").upstream_host == "nsqd0"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_reset_cycles_leak_nothing(upstream: Upstream) -> None:
    async with FaultProxy("127.0.0.1", upstream.port) as proxy:
        reader, writer = await _connect(proxy)  # the first connection's costs are paid
        assert await _round_trip(reader, writer, b"x") == b"x"
        proxy.reset()
        writer.close()
        await proxy.wait_for(lambda: proxy.stats().open == 0)
        fds, tasks = _open_fds(), len(asyncio.all_tasks())
        for cycle in range(30):
            reader, writer = await _connect(proxy)
            assert await _round_trip(reader, writer, b"%d" % cycle) == b"%d" % cycle
            assert proxy.reset() == 1
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(reader.read(1), WAIT)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            await proxy.wait_for(lambda: proxy.stats().open == 0)
        await upstream.wait_for(lambda: all(c.ended for c in upstream.accepted))
        for connection in upstream.accepted:
            connection.writer.close()
        await asyncio.sleep(0)  # the transports close on the next loop iteration
        assert (_open_fds(), len(asyncio.all_tasks())) == (fds, tasks)
        assert proxy.stats().reset == 31
