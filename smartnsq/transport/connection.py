"""One TCP connection to nsqd: handshake, pipelined requests, heartbeats, message delivery.

:class:`Connection` is an ``asyncio.Protocol`` (the layer under asyncio streams): every read
is decoded in ``data_received`` without a task or future per frame, and everything written
while handling one read (FINs, RDYs, NOPs) leaves in one ``transport.write``; writes from
elsewhere in one loop iteration are coalesced the same way.

Requests (PUB, SUB, ...) are answered in order, so many can be in flight on one connection:
a FIFO pairs each response with its request, with heartbeats filtered out. A fatal error
frame fails every pending request and closes the connection; a non-fatal one fails only its
own request.

Handshake: magic, IDENTIFY (feature negotiation), then in nsqd's fixed order TLS, snappy or
deflate (each confirmed by an ``OK`` in the upgraded stream), then AUTH when required.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from smartnsq._version import __version__
from smartnsq.errors import (
    ConnectionClosedError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    ValidationError,
)
from smartnsq.protocol import commands
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from smartnsq.protocol.errors import error_from_frame
from smartnsq.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FrameDecoder,
)
from smartnsq.protocol.identify import IdentifyRequest, IdentifyResponse
from smartnsq.protocol.message import MessageFrame, MessageLayout, decode_message
from smartnsq.protocol.responses import HEARTBEAT, OK, AuthResponse
from smartnsq.routing.addresses import split_host_port
from smartnsq.transport.reading import ReusableReadBuffer

__all__ = ["Connection", "ConnectionConfig"]

log = logging.getLogger("smartnsq.connection")

_HOSTNAME = socket.gethostname()
# Responses to FIN/REQ/TOUCH never answer a pending request (those commands have no reply).
_MESSAGE_COMMAND_ERRORS = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

Compression = Literal["snappy", "deflate"] | None


@dataclass(frozen=True)
class ConnectionConfig:
    """Per-connection settings (durations in seconds). Validated at construction."""

    client_id: str = field(default_factory=lambda: f"{_HOSTNAME.split('.')[0]}:{os.getpid()}")
    hostname: str = _HOSTNAME
    user_agent: str = f"smartnsq/{__version__}"
    heartbeat_interval: float = 30.0
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    tls: bool | ssl.SSLContext = False
    tls_server_hostname: str | None = None
    compression: Compression = None
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: float | None = None
    auth_secret: str | bytes | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    write_timeout: float = 10.0
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "request_timeout", "write_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValidationError(name, f"must be a positive number of seconds, got {value!r}")
        if self.compression not in (None, "snappy", "deflate"):
            raise ValidationError("compression", "must be None, 'snappy' or 'deflate'")
        # IdentifyRequest validates the negotiable values (heartbeat range, levels...).
        self.identify_request(extend_support=None, desired_tag=None)

    @classmethod
    def build(
        cls, *, client_id: str | None = None, user_agent: str | None = None, **options: Any
    ) -> ConnectionConfig:
        """A config where ``client_id``/``user_agent`` None keep the defaults."""
        if client_id is not None:
            options["client_id"] = client_id
        if user_agent is not None:
            options["user_agent"] = user_agent
        return cls(**options)

    def identify_request(
        self, *, extend_support: bool | None, desired_tag: str | None
    ) -> IdentifyRequest:
        return IdentifyRequest(
            client_id=self.client_id,
            hostname=self.hostname,
            user_agent=self.user_agent,
            heartbeat_interval=_ms(self.heartbeat_interval),
            output_buffer_size=self.output_buffer_size,
            output_buffer_timeout=(
                None if self.output_buffer_timeout is None else _ms(self.output_buffer_timeout)
            ),
            tls_v1=bool(self.tls),
            snappy=self.compression == "snappy",
            deflate=self.compression == "deflate",
            deflate_level=self.deflate_level,
            sample_rate=self.sample_rate,
            msg_timeout=None if self.msg_timeout is None else _ms(self.msg_timeout),
            extend_support=extend_support,
            desired_tag=desired_tag,
        )

    def ssl_context(self) -> ssl.SSLContext:
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return ssl.create_default_context()


def _ms(seconds: float) -> int:
    if seconds == -1:
        return -1
    return round(seconds * 1000)


class _Pending:
    """A request waiting for its response. ``hold`` stops frame processing right after the
    response, for handshake steps that switch the stream's encoding."""

    __slots__ = ("command", "deadline", "future", "hold")

    def __init__(
        self, future: asyncio.Future[bytes], command: str, hold: bool, deadline: float
    ) -> None:
        self.future = future
        self.command = command
        self.hold = hold
        self.deadline = deadline


MessageCallback = Callable[["Connection", MessageFrame], None]
ErrorCallback = Callable[["Connection", ServerError], None]
CloseCallback = Callable[["Connection", "BaseException | None"], None]

# Queued writes leave at the end of the loop iteration, or as soon as this many bytes are
# queued: nsqd then starts on the first commands while the client encodes the rest, instead
# of the two sides taking turns (measured: 100 concurrent PUBs 82k -> 142k msgs/s with the
# cluster on another core; ~32 PUBs or one 40-message MPUB per write). Answers produced
# while handling a read (FIN, RDY) still leave in one write at its end: splitting those
# cost nsqd CPU and gained nothing.
FLUSH_AT = 4096


class Connection(ReusableReadBuffer):
    """A connection to one nsqd. Create, then ``await connect()``."""

    def __init__(
        self,
        address: str,
        config: ConnectionConfig | None = None,
        *,
        extend_support: bool | None = None,
        desired_tag: str | None = None,
        on_message: MessageCallback | None = None,
        on_error: ErrorCallback | None = None,
        on_close: CloseCallback | None = None,
        message_class: type[MessageFrame] = MessageFrame,
        label: str = "",
    ) -> None:
        self.address = address
        self.host, self.port = split_host_port(address)
        self.config = config or ConnectionConfig()
        self.extend_support = extend_support
        self.desired_tag = desired_tag
        self.label = label or address
        self.on_message = on_message
        self.on_error = on_error
        self.on_close = on_close
        self.message_class = message_class
        self.identify: IdentifyResponse | None = None
        self.auth: AuthResponse | None = None
        self.layout = MessageLayout()
        self.max_rdy_count = 2500
        self.youzan = False
        self.local_address = ""
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._decoder = FrameDecoder(self.config.max_frame_size)
        self._pending: deque[_Pending] = deque()
        self._wbuf: list[bytes] = []
        self._wsize = 0
        self._flush_handle: asyncio.Handle | None = None
        self._wrote_directly = False  # a request left at once, with no flush scheduled
        self._in_read = False
        self._held = False
        self._codec: StreamCodec | None = None
        self._connected = False
        self._closed = False
        self._close_exc: BaseException | None = None
        self._lost: asyncio.Future[None] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._last_recv = 0.0
        self._monitor: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        # What errors that answer no request refer to: a consumer's FIN/REQ/TOUCH.
        self.unsolicited_command: str | None = None
        self.messages_received = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._connected else "connecting"
        return f"<Connection {self.label} {state}>"

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        return self._connected and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    # ------------------------------------------------------------------ connect

    async def connect(self) -> None:
        """Open the socket and run the handshake within ``connect_timeout``.

        Raises :class:`ConnectionClosedError` (cannot connect, or closed during the
        handshake), :class:`NSQTimeoutError`, or the server's typed error (e.g. AUTH).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._lost = loop.create_future()
        timeout = self.config.connect_timeout
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self, self.host, self.port), timeout
            )
        except TimeoutError:
            self._closed = True
            raise NSQTimeoutError(
                f"connecting to {self.address} timed out after {timeout} s"
            ) from None
        except OSError as exc:
            self._closed = True
            raise ConnectionClosedError(f"cannot connect: {exc}", self.address) from exc
        try:
            await asyncio.wait_for(self._handshake(), timeout)
        except TimeoutError:
            error = NSQTimeoutError(
                f"{self.address} accepted the connection but did not answer the NSQ handshake "
                f"(IDENTIFY) within {timeout} s: is it an nsqd TCP port (default 4150), and is "
                "that nsqd responsive?"
            )
            self.abort(error)
            raise error from None
        except BaseException as exc:
            self.abort(exc if isinstance(exc, Exception) else None)
            raise
        self._connected = True
        self._schedule_monitor()

    async def _handshake(self) -> None:
        request = self.config.identify_request(
            extend_support=self.extend_support, desired_tag=self.desired_tag
        )
        identify = self._request_nowait(commands.MAGIC_V2 + request.encode(), "IDENTIFY", hold=True)
        self._write_out()
        answer = await identify
        response = IdentifyResponse.decode(answer)
        self.identify = response
        if response is not None:
            self.max_rdy_count = response.max_rdy_count
            self.youzan = response.is_youzan
            if response.tls_v1:
                await self._upgrade_tls()
            codec: StreamCodec | None = None
            if response.snappy:
                codec = SnappyCodec()
            elif response.deflate:
                codec = DeflateCodec(request.deflate_level)
            if codec is not None:
                confirmed = self._request_nowait(b"", "COMPRESSION")
                self._codec = codec
                self._decoder.install_decompressor(codec.decompress)
                self._resume_reading()
                _expect_ok(await confirmed, "compression")
            else:
                self._resume_reading()
        else:
            self._resume_reading()
        self.layout = MessageLayout(
            binary_id=self.youzan, ext=bool(self.extend_support and self.youzan)
        )
        if response is not None and response.auth_required:
            secret = self.config.auth_secret
            if secret is None:
                raise ValidationError(
                    "auth_secret", f"nsqd {self.address} requires AUTH; no auth_secret given"
                )
            answer = await self.request(commands.auth(secret), "AUTH")
            self.auth = AuthResponse.decode(answer)

    async def _upgrade_tls(self) -> None:
        loop = self._loop
        transport = self._transport
        if loop is None or transport is None:
            raise ConnectionClosedError("connection closed before TLS", self.address)
        confirmed = self._request_nowait(b"", "TLS", hold=True)
        try:
            upgraded = await loop.start_tls(
                transport,
                self,
                self.config.ssl_context(),
                server_hostname=self.config.tls_server_hostname or self.host,
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConnectionClosedError(f"TLS handshake failed: {exc}", self.address) from exc
        if upgraded is None:
            raise ConnectionClosedError("TLS handshake failed", self.address)
        self._transport = upgraded
        self._resume_reading()
        _expect_ok(await confirmed, "TLS")

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._last_recv = time.monotonic()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        local = transport.get_extra_info("sockname")
        if local:
            self.local_address = f"{local[0]}:{local[1]}"

    def connection_lost(self, exc: Exception | None) -> None:
        error: BaseException
        if self._close_exc is not None:
            error = self._close_exc
        elif exc is not None:
            error = ConnectionClosedError(f"connection lost: {exc}", self.address)
        else:
            error = ConnectionClosedError("connection closed by nsqd", self.address)
        self._finish_close(error)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def data_received(self, data: memoryview) -> None:
        self._last_recv = time.monotonic()
        if not self._connected and bytes(data[:5]) == b"HTTP/":
            # An HTTP server refusing our IDENTIFY: not an NSQ TCP port.
            status = bytes(data[:64]).split(b"\r\n", 1)[0].decode("latin-1")
            self.abort(
                ProtocolError(
                    f"{self.address} answered in HTTP ({status!r}): it is an HTTP port, not "
                    "an nsqd TCP port (nsqd's default is 4150, its HTTP port 4151)"
                )
            )
            return
        try:
            self._decoder.feed(data)
        except ProtocolError as exc:
            self.abort(exc)
            return
        if not self._held:
            self._process_and_flush()

    def _process_and_flush(self) -> None:
        """Decode what is buffered; everything written meanwhile leaves in one write."""
        self._in_read = True
        try:
            self._process()
        finally:
            self._in_read = False
            if self._wbuf:
                self._write_out()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def _process(self) -> None:
        next_frame = self._decoder.next_frame
        decode = decode_message
        while True:
            try:
                frame = next_frame()
            except ProtocolError as exc:
                self.abort(exc)
                return
            if frame is None:
                return
            frame_type, data = frame
            if frame_type == FRAME_TYPE_MESSAGE:
                # a message: decoded and handed on here, a call less per message
                callback = self.on_message
                if callback is None:
                    log.warning(
                        "%s: message frame on a connection without subscription", self.label
                    )
                    continue
                try:
                    message = decode(data, self.layout, self.message_class)
                except ProtocolError as exc:
                    self.abort(exc)
                    continue
                self.messages_received += 1
                callback(self, message)
            elif frame_type == FRAME_TYPE_ERROR:
                self._on_error_frame(data)
                if self._closed:
                    return
            elif data == HEARTBEAT:
                self._wbuf.append(commands.NOP)
            else:
                if not self._pending:
                    log.warning("%s: unexpected response %r", self.label, data[:64])
                    continue
                entry = self._pending.popleft()
                if not entry.future.done():
                    entry.future.set_result(data)
                if entry.hold:
                    self._held = True
                    return

    def _resume_reading(self) -> None:
        """Continue decoding after a handshake step (frames may already be buffered)."""
        self._held = False
        if self._decoder.buffered:
            self._process_and_flush()

    def _on_error_frame(self, data: bytes) -> None:
        code = data.split(b" ", 1)[0].decode("ascii", "replace")
        solicited = bool(self._pending) and code not in _MESSAGE_COMMAND_ERRORS
        command = self._pending[0].command if solicited else self.unsolicited_command
        error = error_from_frame(data, command, self.address)
        if error.fatal:
            # nsqd closes the connection after a fatal error: everything pending fails.
            self.abort(error)
            if not solicited and self.on_error is not None:
                self.on_error(self, error)
            return
        if solicited:
            entry = self._pending.popleft()
            if not entry.future.done():
                entry.future.set_exception(error)
        elif self.on_error is not None:
            self.on_error(self, error)
        else:
            log.warning("%s: %s", self.label, error)

    # ------------------------------------------------------------------ writing

    def send(self, data: bytes) -> None:
        """Send bytes to nsqd: at once on an idle connection; otherwise with everything else
        written in this loop iteration (or at the end of the current read), or once FLUSH_AT
        bytes are queued."""
        if self._closed:
            raise ConnectionClosedError("connection is closed", self.address)
        self._wbuf.append(data)
        self._wsize += len(data)
        if self._in_read:
            return  # leaves with the answers to this read, at its end
        if self._flush_handle is None:
            # The first write of this loop iteration leaves now (on an idle connection: a loop
            # iteration less per round trip, sequential PUB p50 113 -> 106 µs); the rest of
            # the iteration's writes are coalesced behind it. After a request that left
            # directly (_request_nowait), this write is one of the rest.
            if not self._wrote_directly:
                self._write_out()
            if self._loop is not None:
                self._flush_handle = self._loop.call_soon(self._flush)
        elif self._wsize >= FLUSH_AT:
            self._write_out()

    def _flush(self) -> None:
        self._flush_handle = None
        self._wrote_directly = False
        self._write_out()

    def _write_out(self) -> None:
        buf = self._wbuf
        transport = self._transport
        if not buf or transport is None or self._closed:
            return
        data = b"".join(buf) if len(buf) > 1 else buf[0]
        buf.clear()
        self._wsize = 0
        if self._codec is not None:
            data = self._codec.compress(data)
        transport.write(data)

    async def drain(self) -> None:
        """Wait while the socket's write buffer is over its high-water mark."""
        if not self._write_paused or self._loop is None:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.config.write_timeout)
        except TimeoutError:
            error = NSQTimeoutError(
                f"write to {self.address} blocked for {self.config.write_timeout} s"
            )
            self.abort(error)
            raise error from None

    def _request_nowait(
        self, data: bytes, command: str, *, hold: bool = False, timeout: float | None = None
    ) -> asyncio.Future[bytes]:
        loop = self._loop
        if self._closed or loop is None:
            raise ConnectionClosedError("connection is closed", self.address)
        future: asyncio.Future[bytes] = loop.create_future()
        limit = self.config.request_timeout if timeout is None else timeout
        deadline = loop.time() + limit
        pending = self._pending
        pending.append(_Pending(future, command, hold, deadline))
        if self._deadline_timer is None:
            self._deadline_timer = loop.call_at(deadline, self._check_deadline)
        if not data:
            return future
        if len(pending) == 1 and self._flush_handle is None and not self._wbuf:
            # The only request on an idle connection (a sequential publish): it leaves now,
            # and no flush is scheduled behind it (a loop iteration less per round trip).
            # Requests that follow it before its answer are coalesced as usual.
            transport = self._transport
            if transport is not None and not self._in_read:
                transport.write(data if self._codec is None else self._codec.compress(data))
                self._wrote_directly = True
                return future
        self.send(data)
        return future

    def _check_deadline(self) -> None:
        """Answers come in request order, so only the oldest request can be overdue."""
        self._deadline_timer = None
        if self._closed or not self._pending or self._loop is None:
            return
        head = self._pending[0]
        if head.deadline <= self._loop.time():
            limit = self.config.request_timeout
            self.abort(
                NSQTimeoutError(f"{head.command} to {self.address}: no answer within {limit} s")
            )
            return
        self._deadline_timer = self._loop.call_at(head.deadline, self._check_deadline)

    def request_future(
        self, data: bytes, command: str, timeout: float | None = None
    ) -> asyncio.Future[bytes]:
        """Queue a command that nsqd answers; the future gets the response frame's data.

        A server error sets its typed :class:`ServerError`. No answer within the timeout
        closes the connection (a late answer would desynchronise the FIFO) and fails every
        pending request with :class:`NSQTimeoutError`.
        """
        return self._request_nowait(data, command, timeout=timeout)

    async def request(self, data: bytes, command: str, timeout: float | None = None) -> bytes:
        """Send a command that nsqd answers and wait for its response (see request_future)."""
        future = self._request_nowait(data, command, timeout=timeout)
        if self._write_paused:
            await self.drain()
        return await future

    # ------------------------------------------------------------------ liveness

    def _schedule_monitor(self) -> None:
        interval = self.config.heartbeat_interval
        if interval > 0 and self._loop is not None and not self._closed:
            self._monitor = self._loop.call_later(interval, self._check_alive)

    def _check_alive(self) -> None:
        self._monitor = None
        if self._closed:
            return
        interval = self.config.heartbeat_interval
        # nsqd sends a heartbeat every interval; two missed ones mean the link is dead.
        silent = time.monotonic() - self._last_recv
        if silent > 2 * interval + 1:
            self.abort(NSQTimeoutError(f"no heartbeat from {self.address} for {silent:.1f} s"))
            return
        self._schedule_monitor()

    # ------------------------------------------------------------------ closing

    def abort(self, exc: BaseException | None = None) -> None:
        """Drop the connection now; pending requests fail with ``exc``."""
        if self._close_exc is None:
            self._close_exc = exc or ConnectionClosedError("connection aborted", self.address)
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.abort()
        elif transport is None or self._lost is None:
            self._finish_close(self._close_exc)

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued, close, and wait until the socket is closed."""
        if self._close_exc is None:
            self._close_exc = ConnectionClosedError("connection closed by the client", self.address)
        if self._wbuf:
            self._write_out()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.close()
        elif transport is None:
            self._finish_close(self._close_exc)
        if self._lost is not None and not self._lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), timeout)
            except TimeoutError:
                if self._transport is not None:
                    self._transport.abort()

    async def wait_closed(self) -> None:
        if self._lost is not None:
            await asyncio.shield(self._lost)

    def _finish_close(self, error: BaseException) -> None:
        if self._closed and (self._lost is None or self._lost.done()):
            return
        self._closed = True
        for timer in (self._monitor, self._deadline_timer):
            if timer is not None:
                timer.cancel()
        self._monitor = self._deadline_timer = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        pending, self._pending = self._pending, deque()
        for entry in pending:
            if not entry.future.done():
                entry.future.set_exception(error)
                entry.future.exception()  # retrieved here: nobody may be waiting any more
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()
        self._drain_waiters = []
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self.on_close is not None:
            callback, self.on_close = self.on_close, None
            try:
                callback(self, error)
            except Exception:
                log.exception("%s: close callback failed", self.label)

    # ------------------------------------------------------------------ helpers

    def describe(self) -> Mapping[str, Any]:
        return {
            "address": self.address,
            "local_address": self.local_address,
            "youzan": self.youzan,
            "tls": bool(self.identify and self.identify.tls_v1),
            "compression": type(self._codec).__name__ if self._codec else None,
            "max_rdy_count": self.max_rdy_count,
            "pending": len(self._pending),
        }


def _expect_ok(data: bytes, step: str) -> None:
    if data != OK:
        raise ProtocolError(f"expected OK after the {step} upgrade, got {data[:40]!r}")
