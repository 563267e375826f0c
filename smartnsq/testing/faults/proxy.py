"""A TCP fault proxy, in the manner of toxiproxy: it listens on 127.0.0.1 (a port the OS
chooses), forwards every connection to one upstream ``host:port`` in both directions, and
breaks the network on demand, on open connections too.

Directions: ``"upstream"`` is what the client sends to the server, ``"downstream"`` what the
server sends back; faults that make sense per direction take ``direction="both"`` by
default. Each direction of each connection is read by one task and written by another,
through a short queue: a slow or held writer stops the reads once the queue is full, and
then the kernel's buffers fill, as on a real link.

Faults (plain calls, usable from callbacks; ``heal()`` and ``clear()`` end them):

- :meth:`FaultProxy.blackhole`: nothing is forwarded, no FIN and no RST, connections stay
  open (new ones are accepted and not connected upstream until healed). What arrives is
  held and delivered on :meth:`~FaultProxy.heal` (``hold=True``, as TCP retransmits through
  a partition that heals) or thrown away (``hold=False``; an end of stream is held anyway);
- :meth:`FaultProxy.reset`: every open connection is reset now (RST on both sides,
  ``SO_LINGER`` 0), and with ``new_connections=True`` every new one as it comes, until
  healed;
- :meth:`FaultProxy.refuse`: the listening socket is closed, so new connections are refused
  by the kernel (``ECONNREFUSED``); healing listens again on the same port;
- :meth:`FaultProxy.set_latency`: each chunk waits ``seconds`` +- ``jitter``, in order;
- :meth:`FaultProxy.set_bandwidth`: bytes per second;
- :meth:`FaultProxy.set_slicing`: the stream is cut into pieces of 1..N bytes, each written
  on its own, optionally ``delay`` seconds apart;
- :meth:`FaultProxy.close_after`: a connection is closed (FIN, or RST with ``reset=True``)
  once N more bytes went through in a direction.

Random choices (jitter, slice sizes) come from ``random.Random`` seeded per connection and
direction from the proxy's ``seed``: the slices of a stream fall at the same positions in
every run with the same seed. :meth:`FaultProxy.stats` counts connections and bytes;
:meth:`FaultProxy.wait_for` waits for a condition on them, re-checked whenever they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.testing.changes import Changes
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.faults.shaping import (
    DIRECTIONS,
    DOWNSTREAM,
    UPSTREAM,
    ByteLimit,
    Latency,
    Slicer,
    Throttle,
    directions,
)
from smartnsq.testing.lifecycle import StartsAndCloses

__all__ = ["FaultProxy", "FaultProxyError", "ProxyStats"]

log = logging.getLogger("smartnsq.testing.faults")

_READ_SIZE = 64 * 1024
_QUEUE_ITEMS = 16  # chunks read ahead of the writer, per direction
_RST_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_DATA, _EOF, _RESET = 0, 1, 2


class FaultProxyError(ClusterError):
    """The proxy cannot do what was asked (not started, its port taken while refusing)."""


@dataclass(frozen=True)
class ProxyStats:
    """What a proxy has seen so far (:meth:`FaultProxy.stats`)."""

    accepted: int  # client connections accepted (a refused one never is)
    open: int  # connections accepted and not yet ended
    reset: int  # connections the proxy reset (reset(), new ones while resetting, a limit)
    limited: int  # connections closed by close_after
    upstream_failed: int  # connections whose upstream could not be reached (client reset)
    upstream_bytes: int  # bytes forwarded from clients to the upstream
    downstream_bytes: int  # bytes forwarded from the upstream to clients
    upstream_writes: int  # writes those bytes took (slicing and bandwidth make more)
    downstream_writes: int
    dropped_bytes: int  # bytes thrown away by a blackhole with hold=False


class _Faults:
    """The faults of one direction, read live by every connection's pipe."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()  # set: not blackholed
        self.gate.set()
        self.hold = True
        self.latency: Latency | None = None
        self.bandwidth: float | None = None
        self.bandwidth_generation = 0
        self.slice_size: int | None = None
        self.slice_delay = 0.0
        self.slice_generation = 0
        self.limit: int | None = None
        self.limit_reset = False

    @property
    def blackholed(self) -> bool:
        return not self.gate.is_set()


def _reset_socket(writer: asyncio.StreamWriter) -> None:
    """Close with RST: SO_LINGER 0, then abort."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
    writer.transport.abort()


class _Pipe:
    """One direction of one connection: a reader task and a writer task."""

    def __init__(
        self,
        link: _Link,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.link = link
        self.direction = direction
        self.faults = link.proxy._faults[direction]
        self.reader = reader
        self.writer = writer
        self.rng = random.Random(f"{link.proxy.seed}:{link.index}:{direction}")
        self.queue: asyncio.Queue[tuple[int, float, bytes]] = asyncio.Queue(_QUEUE_ITEMS)
        self.last_due = 0.0
        self.slicer: Slicer | None = None
        self.slice_generation = -1
        self.throttle: Throttle | None = None
        self.bandwidth_generation = -1
        limit = self.faults.limit
        self.limit = ByteLimit(limit) if limit is not None else None

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await self.reader.read(_READ_SIZE)
            except (ConnectionError, OSError):
                await self.queue.put((_RESET, loop.time(), b""))
                return
            latency = self.faults.latency
            now = loop.time()
            due = latency.due(now, self.last_due, self.rng) if latency is not None else now
            self.last_due = due
            await self.queue.put((_DATA if data else _EOF, due, data))
            if not data:
                return

    async def write(self) -> None:
        loop = asyncio.get_running_loop()
        faults = self.faults
        while True:
            kind, due, data = await self.queue.get()
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if kind != _DATA:
                await faults.gate.wait()  # an end of stream is never lost in a blackhole
                if kind == _EOF:
                    self.link.end_of_stream(self)
                else:
                    self.link.reset(count=False)
                return
            for piece in self._pieces(data):
                if faults.blackholed:
                    if not faults.hold:
                        self.link.proxy._dropped(len(piece))
                        continue
                    await faults.gate.wait()
                if self.throttle is not None:
                    start = self.throttle.start(loop.time(), len(piece))
                    if start > loop.time():
                        await asyncio.sleep(start - loop.time())
                if self.limit is not None:
                    piece = piece[: self.limit.take(len(piece))]
                if piece:
                    self.writer.write(piece)
                    await self.writer.drain()
                    self.link.proxy._forwarded(self.direction, len(piece))
                if self.limit is not None and self.limit.reached:
                    self.link.limit_reached(reset=faults.limit_reset)
                    return
                if self.slicer is not None and faults.slice_delay > 0:
                    await asyncio.sleep(faults.slice_delay)

    def _pieces(self, data: bytes) -> list[bytes]:
        """``data`` as the writes it goes out in (sliced, then cut to the bandwidth's piece
        size), with the shapers brought up to date with the faults."""
        faults = self.faults
        if self.slice_generation != faults.slice_generation:
            self.slice_generation = faults.slice_generation
            size = faults.slice_size
            self.slicer = Slicer(size, self.rng) if size is not None else None
        if self.bandwidth_generation != faults.bandwidth_generation:
            self.bandwidth_generation = faults.bandwidth_generation
            rate = faults.bandwidth
            self.throttle = Throttle(rate) if rate is not None else None
        pieces = list(self.slicer.cut(data)) if self.slicer is not None else [data]
        if self.throttle is None:
            return pieces
        step = self.throttle.piece_size
        return [p[i : i + step] for p in pieces for i in range(0, len(p), step)]


class _Link:
    """One proxied connection: the client's socket, the upstream's, and two pipes."""

    def __init__(
        self,
        proxy: FaultProxy,
        index: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.proxy = proxy
        self.index = index
        self.client_reader = reader
        self.client_writer = writer
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.pipes: list[_Pipe] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.ended = asyncio.Event()
        self._eofs = 0

    async def run(self) -> None:
        proxy = self.proxy
        try:
            # A connection begun in a blackhole reaches the upstream only once healed.
            for direction in DIRECTIONS:
                await proxy._faults[direction].gate.wait()
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(proxy.upstream_host, proxy.upstream_port),
                    proxy.connect_timeout,
                )
            except (TimeoutError, OSError) as exc:
                log.debug("%s: upstream %s unreachable: %s", proxy, proxy.upstream, exc)
                proxy._upstream_failed += 1
                _reset_socket(self.client_writer)
                return
            self.upstream_writer = up_writer
            self.pipes = [
                _Pipe(self, UPSTREAM, self.client_reader, up_writer),
                _Pipe(self, DOWNSTREAM, up_reader, self.client_writer),
            ]
            loop = asyncio.get_running_loop()
            for pipe in self.pipes:
                self.tasks += [loop.create_task(pipe.read()), loop.create_task(pipe.write())]
            for task in self.tasks:
                task.add_done_callback(self._task_done)
            await self.ended.wait()
        finally:
            await self._finish()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, (ConnectionError, OSError)):
            self.reset(count=False)  # a peer went away while written to: tell the other
        else:
            log.error("%s: connection %d failed", self.proxy, self.index, exc_info=exc)
            self.reset(count=False)

    def writers(self) -> list[asyncio.StreamWriter]:
        found = [self.client_writer]
        if self.upstream_writer is not None:
            found.append(self.upstream_writer)
        return found

    def end_of_stream(self, pipe: _Pipe) -> None:
        """One side finished sending: pass the FIN on; both did: the connection ends."""
        if pipe.writer.can_write_eof() and not pipe.writer.transport.is_closing():
            with contextlib.suppress(OSError):
                pipe.writer.write_eof()
        self._eofs += 1
        if self._eofs == len(DIRECTIONS):
            self.close()

    def close(self) -> None:
        """End with FIN on both sides."""
        for writer in self.writers():
            writer.close()
        self.ended.set()

    def reset(self, *, count: bool = True) -> None:
        """End with RST on both sides."""
        if self.ended.is_set():
            return
        for writer in self.writers():
            _reset_socket(writer)
        if count:
            self.proxy._reset += 1
        self.ended.set()

    def limit_reached(self, *, reset: bool) -> None:
        self.proxy._limited += 1
        if reset:
            self.reset()
        else:
            self.close()

    async def _finish(self) -> None:
        self.ended.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers():
            if not writer.transport.is_closing():
                writer.transport.abort()
            with contextlib.suppress(ConnectionError, OSError, asyncio.CancelledError):
                await writer.wait_closed()
        self.proxy._link_ended(self)


class FaultProxy(StartsAndCloses):
    """Forwards ``127.0.0.1:<port>`` to ``upstream_host:upstream_port``, with faults.

    ``async with FaultProxy(host, port, seed=1) as proxy:`` starts it (``address`` is then
    where clients connect) and closes every connection and the listener when done.
    ``seed`` makes jitter and slicing repeatable (by default one is drawn and kept in
    ``seed``). ``connect_timeout`` bounds the connect to the upstream: a client whose
    upstream is unreachable is reset."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int | None = None,
        connect_timeout: float = 10.0,
        name: str = "",
    ) -> None:
        if not isinstance(upstream_host, str) or not upstream_host:
            raise ValidationError("upstream_host", f"must name a host, not {upstream_host!r}")
        if type(upstream_port) is not int or not 0 < upstream_port < 65536:
            raise ValidationError("upstream_port", f"must be 1..65535, not {upstream_port!r}")
        if type(port) is not int or not 0 <= port < 65536:
            raise ValidationError("port", f"must be 0..65535, not {port!r}")
        if not connect_timeout > 0:
            raise ValidationError("connect_timeout", "must be > 0 seconds")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.host = host
        self.port = port
        self.seed = seed if seed is not None else random.randrange(2**32)
        self.connect_timeout = float(connect_timeout)
        self.name = name or f"proxy->{upstream_host}:{upstream_port}"
        self._faults: dict[str, _Faults] = {}
        self._changes = Changes()
        self._server: asyncio.base_events.Server | None = None
        self._closed_servers: list[asyncio.base_events.Server] = []
        self._listening: asyncio.Task[Any] | None = None
        self._links: dict[_Link, asyncio.Task[None]] = {}
        self._refusing = False
        self._resetting_new = False
        self._started = False
        self._closed = False
        self._accepted = 0
        self._reset = 0
        self._limited = 0
        self._upstream_failed = 0
        self._dropped_bytes = 0
        self._bytes = dict.fromkeys(DIRECTIONS, 0)
        self._writes = dict.fromkeys(DIRECTIONS, 0)

    @classmethod
    def to(cls, upstream: str, **options: Any) -> FaultProxy:
        """A proxy to ``"host:port"`` (``"[v6]:port"``); ``options`` as the constructor's."""
        text = upstream.strip() if isinstance(upstream, str) else ""
        host, _, port = text.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ValidationError("upstream", f"expected 'host:port', not {upstream!r}")
        return cls(host.removeprefix("[").removesuffix("]"), int(port), **options)

    def __repr__(self) -> str:
        where = self.address if self.port else "a port not chosen yet"
        return f"<FaultProxy {self.name} on {where}>"

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FaultProxy:
        """Listen (what ``async with`` does)."""
        if self._started:
            raise FaultProxyError("the proxy was started already")
        self._started = True
        self._changes.start()
        self._faults = {direction: _Faults() for direction in DIRECTIONS}
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Reset every connection and stop listening; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._listening is not None:
            with contextlib.suppress(OSError):
                await self._listening
        servers = [*self._closed_servers, *([self._server] if self._server else [])]
        self._server = None
        self._closed_servers.clear()
        for server in servers:
            server.close()
        for link in list(self._links):
            link.reset(count=False)
        tasks = list(self._links.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in servers:
            await server.wait_closed()

    @property
    def address(self) -> str:
        """``host:port`` clients connect to. With ``port=0`` (the default) the OS chooses
        the port when the proxy starts: FaultProxyError before :meth:`start`."""
        if self.port == 0:
            raise FaultProxyError(
                f"{self.name} has no address before start(): the OS chooses its port then "
                "(start it first, or give it a port=)"
            )
        return f"{self.host}:{self.port}"

    @property
    def upstream(self) -> str:
        return f"{self.upstream_host}:{self.upstream_port}"

    def _require_started(self) -> None:
        if not self._started or self._closed:
            raise FaultProxyError(f"{self.name} is not running")

    # ------------------------------------------------------------------ connections

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:
            writer.transport.abort()
            return
        self._accepted += 1
        if self._resetting_new:
            self._reset += 1
            _reset_socket(writer)
            self._changes.changed()
            return
        link = _Link(self, self._accepted, reader, writer)
        self._links[link] = asyncio.get_running_loop().create_task(link.run())
        self._changes.changed()

    def _link_ended(self, link: _Link) -> None:
        self._links.pop(link, None)
        self._changes.changed()

    def _forwarded(self, direction: str, size: int) -> None:
        self._bytes[direction] += size
        self._writes[direction] += 1
        self._changes.changed()

    def _dropped(self, size: int) -> None:
        self._dropped_bytes += size
        self._changes.changed()

    # ------------------------------------------------------------------ faults

    def blackhole(self, direction: str = "both", *, hold: bool = True) -> None:
        """Forward nothing in ``direction`` (no FIN, no RST) until :meth:`heal`: what arrives
        is held and delivered then (``hold=True``) or thrown away (``hold=False``)."""
        self._require_started()
        for name in directions(direction):
            faults = self._faults[name]
            faults.hold = hold
            faults.gate.clear()

    def refuse(self) -> None:
        """Stop listening: new connections are refused (``ECONNREFUSED``) until
        :meth:`heal`. Open connections are left alone."""
        self._require_started()
        if self._refusing:
            return
        self._refusing = True
        if self._server is not None:
            self._server.close()
            self._closed_servers.append(self._server)
            self._server = None

    def reset(self, *, new_connections: bool = False) -> int:
        """Reset every open connection now (RST to the client and to the upstream); with
        ``new_connections``, also every connection accepted from now until :meth:`heal`.
        Returns how many were reset now."""
        self._require_started()
        links = list(self._links)
        for link in links:
            link.reset()
        if new_connections:
            self._resetting_new = True
        self._changes.changed()
        return len(links)

    def heal(self) -> None:
        """End the blackhole (delivering what it held), the refusal (listening again on the
        same port) and the resetting of new connections. Shaping faults (latency,
        bandwidth, slicing, close_after) stay: :meth:`clear` ends those too."""
        self._require_started()
        self._resetting_new = False
        for faults in self._faults.values():
            faults.gate.set()
        if self._refusing:
            self._refusing = False
            self._listen_again()

    def _listen_again(self) -> None:
        # Bound and listening before heal() returns: a connection made right after it
        # waits in the kernel's backlog until the server takes the socket.
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(100)
        except OSError as exc:
            sock.close()
            raise FaultProxyError(
                f"{self.name}: cannot listen on {self.address} again: {exc.strerror or exc}"
            ) from None
        sock.setblocking(False)
        self._listening = asyncio.get_running_loop().create_task(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_server(self._accept, sock=sock)

    def set_latency(self, seconds: float, jitter: float = 0.0, direction: str = "both") -> None:
        """Delay every chunk by ``seconds`` +- ``jitter`` (uniform, seeded), order kept; 0
        ends it. Applies to what is read from now on."""
        self._require_started()
        latency = Latency(seconds, jitter)
        for name in directions(direction):
            self._faults[name].latency = latency if latency.seconds or latency.jitter else None

    def set_bandwidth(self, bytes_per_second: float | None, direction: str = "both") -> None:
        """Forward at most ``bytes_per_second`` per connection and direction; None ends it."""
        self._require_started()
        if bytes_per_second is not None:
            Throttle(bytes_per_second)  # checks the rate
        for name in directions(direction):
            faults = self._faults[name]
            faults.bandwidth = bytes_per_second
            faults.bandwidth_generation += 1

    def set_slicing(
        self, max_size: int | None, delay: float = 0.0, direction: str = "both"
    ) -> None:
        """Write the stream in pieces of 1..``max_size`` bytes (sizes seeded), ``delay``
        seconds apart; None ends it."""
        self._require_started()
        if max_size is not None:
            Slicer(max_size, random.Random(0))  # checks the size
        if not isinstance(delay, (int, float)) or not delay >= 0:
            raise ValidationError("delay", f"must be a number >= 0, not {delay!r}")
        for name in directions(direction):
            faults = self._faults[name]
            faults.slice_size = max_size
            faults.slice_delay = float(delay)
            faults.slice_generation += 1

    def close_after(
        self, nbytes: int | None, direction: str = "both", *, reset: bool = False
    ) -> None:
        """Close a connection (FIN both ways, or RST with ``reset``) once ``nbytes`` more
        bytes went through in ``direction``: counted from now on open connections, from
        their start on new ones. None ends it."""
        self._require_started()
        if nbytes is not None:
            ByteLimit(nbytes)  # checks the count
        for name in directions(direction):
            faults = self._faults[name]
            faults.limit = nbytes
            faults.limit_reset = reset
            for link in self._links:
                for pipe in link.pipes:
                    if pipe.direction == name:
                        pipe.limit = ByteLimit(nbytes) if nbytes is not None else None

    def clear(self) -> None:
        """End every fault: :meth:`heal`, and no latency, bandwidth, slicing or limit."""
        self.heal()
        for direction in DIRECTIONS:
            self.set_latency(0.0, direction=direction)
            self.set_bandwidth(None, direction=direction)
            self.set_slicing(None, direction=direction)
            self.close_after(None, direction=direction)

    # ------------------------------------------------------------------ observation

    @property
    def blackholed(self) -> bool:
        """A direction is blackholed."""
        return any(faults.blackholed for faults in self._faults.values())

    @property
    def refusing(self) -> bool:
        return self._refusing

    def stats(self) -> ProxyStats:
        """The counts so far."""
        return ProxyStats(
            accepted=self._accepted,
            open=len(self._links),
            reset=self._reset,
            limited=self._limited,
            upstream_failed=self._upstream_failed,
            upstream_bytes=self._bytes[UPSTREAM],
            downstream_bytes=self._bytes[DOWNSTREAM],
            upstream_writes=self._writes[UPSTREAM],
            downstream_writes=self._writes[DOWNSTREAM],
            dropped_bytes=self._dropped_bytes,
        )

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` is true, re-checked whenever a connection opens or
        ends and whenever bytes go through. Raises ``TimeoutError`` after ``timeout``."""
        self._require_started()
        await self._changes.wait_for(predicate, timeout)
