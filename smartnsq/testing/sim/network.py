"""The in-memory network of a simulation: listeners, connections and the faults of each link.

A connection is two :class:`SimTransport` ends joined by two :class:`_Pipe` directions. What
one end writes reaches the other end's protocol (``data_received``, or ``get_buffer`` and
``buffer_updated`` for a buffered protocol) on the loop's clock, after the link's latency,
in order, cut into the pieces the link's faults say. Per link and direction:

* **latency and jitter**: each write waits ``latency`` +- ``jitter`` (uniform), order kept;
* **slicing**: a write arrives in pieces of 1..``slice`` bytes (each its own read);
* **a half-open window** (:meth:`Link.hold`): nothing arrives either way, and neither end
  hears of the other's close or reset; what was written is held, and on
  :meth:`Link.release` delivered (a proxy, or TCP retransmitting through a partition that
  heals) or lost (``deliver=False``: the state of the connection was lost with them, a NAT's
  or a firewall's, and the next segment draws a reset: both ends are reset);
* **a reset** (:meth:`Link.reset`): both ends are reset at once (``ECONNRESET``), what was
  in flight is lost;
* **backpressure**: bytes written and not yet read by the other end count against the
  writer's buffer; over its high-water mark the writer's protocol is paused
  (``pause_writing``) until the reader catches up (a server that stops reading, a held link).

A listener can refuse connections (:meth:`SimNetwork.refuse`: ``ECONNREFUSED``), and a host
can be partitioned from another (:meth:`SimNetwork.partition`): connecting hangs (the SYN is
lost) and existing links are held, until healed.

Every random draw comes from the network's own ``random.Random`` (seeded by the
simulation); every delivery is recorded in :attr:`SimNetwork.trace` as it happens, so two
runs of a seed are equal exactly when their traces are.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Link", "LinkFaults", "SimNetwork", "SimServer", "SimTransport"]

_HIGH_WATER = 64 * 1024
_LOW_WATER = 16 * 1024
_FIRST_PORT = 20_000


@dataclass
class LinkFaults:
    """What a direction of a link does to what crosses it (seconds, bytes)."""

    latency: float = 0.0002
    jitter: float = 0.0
    slice: int | None = None  # pieces of 1..slice bytes

    def copy(self) -> LinkFaults:
        return LinkFaults(self.latency, self.jitter, self.slice)


class _Pipe:
    """One direction of a link: what ``source`` wrote, on its way to ``sink``."""

    def __init__(self, link: Link, source: SimTransport, sink: SimTransport) -> None:
        self.link = link
        self.source = source
        self.sink = sink
        self.faults = link.network.default_faults.copy()
        self.queue: deque[bytes] = deque()  # arrived, waiting for the sink to read
        self.held: list[bytes] = []  # written during a half-open window
        self.caught: list[bytes] = []  # on the way when a window began (before ``held``)
        self.pending = 0  # bytes written and not yet read by the sink
        self.last_due = 0.0
        # On the way, in order: (when it arrives, the piece; None: the source's FIN). One
        # timer walks it: asyncio runs timers due at the same instant in no set order.
        self.flight: deque[tuple[float, bytes | None]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.eof = False  # the source closed: after what is queued, the sink's end

    def write(self, data: bytes) -> None:
        self.pending += len(data)
        if self.link.held:
            self.held.append(data)
        else:
            self._send(data)
        self.source.check_writing()

    def _send(self, data: bytes) -> None:
        network = self.link.network
        faults = self.faults
        pieces = [data]
        if faults.slice:
            rng = network.random
            pieces = []
            start = 0
            while start < len(data):
                size = rng.randint(1, faults.slice)
                pieces.append(data[start : start + size])
                start += size
        loop = network.loop
        for piece in pieces:
            delay = faults.latency
            if faults.jitter:
                delay += network.random.uniform(-faults.jitter, faults.jitter)
            self._schedule(max(self.last_due, loop.time() + max(0.0, delay)), piece)

    def finish(self) -> None:
        """The source's FIN, after what it wrote (the link's latency after now at least)."""
        self._schedule(
            max(self.last_due, self.link.network.loop.time() + self.faults.latency), None
        )

    def _schedule(self, due: float, piece: bytes | None) -> None:
        self.last_due = due
        self.flight.append((due, piece))
        if self.timer is None:
            self.timer = self.link.network.loop.call_at(self.flight[0][0], self._arrive)

    def _arrive(self) -> None:
        """What is due arrives, in the order it left."""
        self.timer = None
        loop = self.link.network.loop
        flight = self.flight
        now = loop.time()
        arrived = False
        while flight and flight[0][0] <= now:
            piece = flight.popleft()[1]
            link = self.link
            if link.closed:
                continue
            if piece is None:
                self.eof = True
                arrived = True
            elif link.held:
                self.caught.append(piece)  # caught by a window that began after it left
            else:
                self.queue.append(piece)
                arrived = True
        if arrived:
            self.sink.feed()
        if flight:
            self.timer = loop.call_at(flight[0][0], self._arrive)

    def release(self, deliver: bool) -> None:
        held = self.caught + self.held
        self.caught, self.held = [], []
        if deliver:
            for data in held:
                self._send(data)
        else:
            self.pending -= sum(map(len, held))
            self.source.check_writing()

    def read_one(self) -> bytes | None:
        if not self.queue:
            return None
        piece = self.queue.popleft()
        self.pending -= len(piece)
        self.source.check_writing()
        return piece


class SimTransport(asyncio.Transport):
    """One end of a simulated connection."""

    def __init__(
        self,
        link: Link,
        protocol: asyncio.BaseProtocol,
        local: tuple[str, int],
        peer: tuple[str, int],
    ) -> None:
        super().__init__()
        self.link = link
        self._protocol = protocol
        self.local = local
        self.peer = peer
        self.inbound: _Pipe | None = None
        self.outbound: _Pipe | None = None
        self._closing = False
        self._lost = False
        self._reading = True
        self._paused = False
        self._high = _HIGH_WATER
        self._low = _LOW_WATER
        self._eof_seen = False

    # ------------------------------------------------------------------ asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self.local
        if name == "peername":
            return self.peer
        return default

    def is_closing(self) -> bool:
        return self._closing or self._lost

    def write(self, data: bytes | bytearray | memoryview) -> None:
        outbound = self.outbound
        if self._closing or self._lost or not data or outbound is None:
            return
        data = bytes(data)
        watcher = self.link.network.on_write
        if watcher is not None:
            watcher(self, data)
        outbound.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("a simulated link has no half-close")

    def close(self) -> None:
        """FIN: what was written still arrives, then the other end sees the end."""
        if self._closing or self._lost:
            return
        self._closing = True
        self.link.closed_by(self)

    def abort(self) -> None:
        """RST: nothing more arrives either way."""
        if self._lost:
            return
        self._closing = True
        self.link.reset(by=self)

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        if not self._reading:
            self._reading = True
            self.link.network.loop.call_soon(self.feed)

    def is_reading(self) -> bool:
        return self._reading and not self._lost

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = _HIGH_WATER if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        return self.outbound.pending if self.outbound is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # ------------------------------------------------------------------ the link's side

    def feed(self) -> None:
        """Hand what arrived to the protocol, one piece per read, then the end of the
        stream if the other end closed."""
        inbound = self.inbound
        if inbound is None or self._lost:
            return
        protocol = self._protocol
        while self._reading and not self._lost:
            piece = inbound.read_one()
            if piece is None:
                break
            self.link.network.record(self, "read", len(piece))
            if isinstance(protocol, asyncio.BufferedProtocol):
                view = piece
                while view and not self._lost:
                    buffer = memoryview(protocol.get_buffer(len(view)))
                    size = min(len(buffer), len(view))
                    buffer[:size] = view[:size]
                    protocol.buffer_updated(size)
                    view = view[size:]
            else:
                protocol.data_received(piece)  # type: ignore[attr-defined]
        if inbound.eof and not inbound.queue and not self._eof_seen and not self._lost:
            self._eof_seen = True
            keep_open = protocol.eof_received() if hasattr(protocol, "eof_received") else None
            if not keep_open:
                self.close()
                self.link.network.loop.call_soon(self.lose, None)

    def check_writing(self) -> None:
        outbound = self.outbound
        if outbound is None or self._lost:
            return
        if not self._paused and outbound.pending > self._high:
            self._paused = True
            self._protocol.pause_writing()
        elif self._paused and outbound.pending <= self._low:
            self._paused = False
            self._protocol.resume_writing()

    def lose(self, exc: Exception | None) -> None:
        """The end of this end: the protocol hears it once."""
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self.link.network.record(self, "lost", 0 if exc is None else 1)
        self._protocol.connection_lost(exc)


class Link:
    """A connection: its two ends (``client``, ``server``), their pipes, and its faults."""

    def __init__(self, network: SimNetwork, number: int) -> None:
        self.network = network
        self.number = number
        self.client: SimTransport
        self.server: SimTransport
        self.held = False
        self.closed = False  # reset, or both ends gone
        self._closed_ends: list[SimTransport] = []

    def __repr__(self) -> str:
        return f"<Link {self.number} {self.client.local}->{self.server.local}>"

    @property
    def pipes(self) -> tuple[_Pipe, _Pipe]:
        """(client to server, server to client): made with the link."""
        return self.client.outbound, self.server.outbound  # type: ignore[return-value]

    def set_faults(self, faults: LinkFaults, direction: str = "both") -> None:
        to_server, to_client = self.pipes
        if direction in ("both", "upstream"):
            to_server.faults = faults.copy()
        if direction in ("both", "downstream"):
            to_client.faults = faults.copy()

    def hold(self) -> None:
        """A half-open window: nothing crosses, no FIN, no RST."""
        if not self.closed:
            self.held = True
            self.network.record(self.client, "hold", 0)

    def release(self, deliver: bool = True) -> None:
        """The window ends: what was held arrives (``deliver``) or was lost; an end that
        closed meanwhile is now heard of."""
        if not self.held:
            return
        self.held = False
        self.network.record(self.client, "release", int(deliver))
        if not deliver:
            # TCP cannot go on after a gap in its stream: the next segment either way draws
            # a reset (the state the window lost, a NAT's or a firewall's).
            for pipe in self.pipes:
                pipe.release(False)
            self.reset()
            return
        for pipe in self.pipes:
            pipe.release(not self.closed)
        for end in list(self._closed_ends):
            self._propagate_close(end)

    def reset(self, by: SimTransport | None = None) -> None:
        """RST: both ends lose the connection now (one end's own abort: if the link is held,
        the other end hears nothing)."""
        if self.closed:
            return
        network = self.network
        network.record(self.client, "reset", 0 if by is None else 1)
        if by is not None and self.held:
            # The RST is lost in the partition: the other end still thinks it is open.
            network.loop.call_soon(by.lose, None)
            self._closed_ends.append(by)
            return
        self.closed = True
        error = ConnectionResetError(104, "Connection reset by peer")
        for end in (self.client, self.server):
            network.loop.call_soon(end.lose, None if end is by else error)

    def closed_by(self, end: SimTransport) -> None:
        self._closed_ends.append(end)
        if not self.held:
            self._propagate_close(end)
        else:
            self.network.loop.call_soon(end.lose, None)

    def _propagate_close(self, end: SimTransport) -> None:
        pipe = end.outbound
        if pipe is None:
            return
        pipe.finish()
        if not end._lost:
            self.network.loop.call_at(pipe.last_due, end.lose, None)


class SimServer(asyncio.AbstractServer):
    """A listener of the network."""

    def __init__(self, network: SimNetwork, host: str, port: int, factory: Any) -> None:
        self.network = network
        self.host = host
        self.port = port
        self.factory = factory
        self.sockets = (_Address(host, port),)
        self._serving = True

    def close(self) -> None:
        self._serving = False
        self.network.unlisten(self)

    async def wait_closed(self) -> None:
        return None

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.network.loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        return None

    async def serve_forever(self) -> None:
        raise RuntimeError("not in a simulation")


class _Address:
    """What a bound socket tells of itself (``getsockname``), without a socket."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def getsockname(self) -> tuple[str, int]:
        return (self.host, self.port)

    def close(self) -> None:
        return None


class SimNetwork:
    """Listeners, links and partitions, on one :class:`SimLoop` (``seed`` draws every
    random choice of the network)."""

    def __init__(self, seed: int = 0, *, latency: float = 0.0002) -> None:
        self.random = random.Random(f"network:{seed}")
        self.default_faults = LinkFaults(latency=latency)
        self.loop: asyncio.AbstractEventLoop  # a SimLoop (which imports this module)
        self._listeners: dict[tuple[str, int], SimServer] = {}
        self._reserved: set[int] = set()
        self._ports = itertools.count(_FIRST_PORT)
        self._refused: set[tuple[str, int]] = set()
        self._partitioned: set[frozenset[str]] = set()
        self._cut_ports: set[int] = set()
        self._healed: dict[int, asyncio.Event] = {}  # set when a cut port heals
        self._shaped: dict[int, LinkFaults] = {}  # a server port's links' faults, new ones too
        self.links: list[Link] = []
        self._numbers = itertools.count(1)
        self._digest = hashlib.blake2b(digest_size=16)
        self.events = 0
        #: The trace's lines themselves, when kept (a replay that must be read).
        self.lines: list[str] | None = None
        #: Called with each new link (the simulation gives it its faults).
        self.on_link: Callable[[Link], None] | None = None
        #: Called with each write (the end written to, its bytes), before it leaves.
        self.on_write: Callable[[SimTransport, bytes], None] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    # ------------------------------------------------------------------ the trace

    def record(self, end: SimTransport, what: str, size: int) -> None:
        """An event of the network, into the trace's digest."""
        self.events += 1
        line = f"{self.loop.time():.9f} {end.link.number} {end.local[1]} {what} {size}\n"
        self._digest.update(line.encode())
        if self.lines is not None:
            self.lines.append(line)

    def note(self, text: str) -> None:
        """Something the simulation did (a fault, a check), into the trace's digest."""
        self.events += 1
        line = f"{self.loop.time():.9f} {text}\n"
        self._digest.update(line.encode())
        if self.lines is not None:
            self.lines.append(line)

    @property
    def trace_hash(self) -> str:
        return self._digest.hexdigest()

    # ------------------------------------------------------------------ listeners

    def reserve(self, host: str) -> _Address:
        port = next(self._ports)
        self._reserved.add(port)
        return _Address(host, port)

    def listen(self, factory: Any, host: str, port: int) -> SimServer:
        if port == 0:
            port = next(self._ports)
        key = (host, port)
        if key in self._listeners:
            raise OSError(98, f"address already in use: {host}:{port}")
        server = SimServer(self, host, port, factory)
        self._listeners[key] = server
        return server

    def unlisten(self, server: SimServer) -> None:
        if self._listeners.get((server.host, server.port)) is server:
            del self._listeners[(server.host, server.port)]

    def refuse(self, host: str, port: int, refused: bool = True) -> None:
        """New connections to ``host:port`` are refused (the listener is there or not)."""
        if refused:
            self._refused.add((host, port))
        else:
            self._refused.discard((host, port))

    def cut(self, port: int, cut: bool = True) -> None:
        """The server at ``port`` partitioned from its clients: new connections hang (their
        SYN is lost), and its links are held; ``cut=False`` heals (what was held arrives)."""
        if cut:
            self._cut_ports.add(port)
            self._healed.setdefault(port, asyncio.Event())
            for link in self.links:
                if link.server.local[1] == port and not link.closed:
                    link.hold()
        else:
            self._cut_ports.discard(port)
            healed = self._healed.pop(port, None)
            if healed is not None:
                healed.set()
            for link in self.links:
                if link.server.local[1] == port:
                    link.release(deliver=True)

    def shape(self, port: int, faults: LinkFaults | None) -> None:
        """The links of the server at ``port``, open and new, cross ``faults`` both ways
        (None: the network's default again)."""
        if faults is None:
            self._shaped.pop(port, None)
        else:
            self._shaped[port] = faults
        for link in self.links:
            if link.server.local[1] == port and not link.closed:
                link.set_faults(faults or self.default_faults)

    # ------------------------------------------------------------------ connecting

    async def connect(
        self, factory: Callable[[], asyncio.BaseProtocol], host: str, port: int
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        # The SYN and its answer: one round trip.
        await asyncio.sleep(2 * self.default_faults.latency)
        healed = self._healed.get(port)
        if healed is not None:
            await healed.wait()  # the SYN is lost until then: the caller's timeout ends it
        server = self._listeners.get((host, port))
        if server is None or (host, port) in self._refused:
            raise ConnectionRefusedError(111, f"Connect call failed ({host!r}, {port})")
        link = Link(self, next(self._numbers))
        client_port = next(self._ports)
        client_protocol = factory()
        server_protocol = server.factory()
        client = SimTransport(link, client_protocol, ("127.0.0.1", client_port), (host, port))
        end = SimTransport(link, server_protocol, (host, port), ("127.0.0.1", client_port))
        link.client, link.server = client, end
        client.outbound = end.inbound = _Pipe(link, client, end)
        end.outbound = client.inbound = _Pipe(link, end, client)
        self.links = [each for each in self.links if not each.closed] + [link]
        self.record(client, "connect", port)
        shaped = self._shaped.get(port)
        if shaped is not None:
            link.set_faults(shaped)
        if port in self._cut_ports:
            link.hold()
        if self.on_link is not None:
            self.on_link(link)
        server_protocol.connection_made(end)
        client_protocol.connection_made(client)
        return client, client_protocol

    def open_links(self) -> list[Link]:
        return [link for link in self.links if not link.closed]
