"""One TCP connection to nsqd: the socket under a :class:`~smartnsq.protocol.session.ClientSession`.

The session (the protocol floor) decides everything about the conversation: the handshake,
pairing answers with requests, heartbeats, which errors are fatal, deadlines. The
:class:`Connection` moves bytes and time: it opens the socket (``connect_timeout``), starts
TLS when the session says so, keys the waiters of requests by the session's tokens, writes,
arms one timer at the session's next deadline, and closes.

Every read is handed to the session in ``data_received``, with no task or future per frame;
everything written while handling it (FINs, RDYs, NOPs) leaves in one ``transport.write``,
and writes from elsewhere in one loop iteration are coalesced the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, cast

from smartnsq.errors import ConnectionClosedError, NSQError, NSQTimeoutError, ServerError
from smartnsq.protocol.identify import IdentifyResponse
from smartnsq.protocol.message import MessageFrame, MessageLayout
from smartnsq.protocol.responses import AuthResponse
from smartnsq.protocol.session import SubscribeCommand
from smartnsq.protocol.session_events import (
    Closed,
    Event,
    Ready,
    RequestFailed,
    SessionFailed,
    StartTLS,
    UnsolicitedError,
)
from smartnsq.transport.config import Compression, ConnectionConfig
from smartnsq.transport.link import SessionLink
from smartnsq.transport.reading import ReusableReadBuffer
from smartnsq.transport.writing import FLUSH_AT, CoalescingWriter

__all__ = ["FLUSH_AT", "Compression", "Connection", "ConnectionConfig", "Receiver"]

log = logging.getLogger("smartnsq.connection")

M = TypeVar("M", bound=MessageFrame)
CloseCallback = Callable[["Connection", "BaseException | None"], None]
_NO_TARGET: Any = object()


class Receiver(Protocol):
    """Where the answers to :meth:`Connection.request_for` go: the driver of a producer's
    publish flow, told about each request's target with no future per request."""

    def answered(self, target: Any, data: bytes) -> None: ...

    def failed(self, target: Any, error: BaseException) -> None: ...

    def paused(self, conn: Connection) -> None: ...

    def resumed(self, conn: Connection) -> None: ...


class Connection(SessionLink, ReusableReadBuffer, CoalescingWriter):
    """A connection to one nsqd. Create, then ``await connect()``."""

    # Slots, its bases' attributes included (SessionLink, ReusableReadBuffer and
    # CoalescingWriter have none of their own): a connection has more attributes than an
    # instance dictionary shares keys for (30), and as a dictionary they cost 1.6 KiB per
    # connection, as slots 0.3 (a consumer may hold thousands).
    __slots__ = (
        "_close_exc",
        "_closed",
        "_drain_waiters",
        "_flush_handle",
        "_futures",
        "_in_read",
        "_loop",
        "_lost",
        "_on_close",
        "_on_error",
        "_outbox",
        "_read_view",
        "_session",
        "_step",
        "_targets",
        "_timer",
        "_timer_at",
        "_transport",
        "_wbuf",
        "_write_paused",
        "_wrote_directly",
        "_wsize",
        "address",
        "config",
        "host",
        "label",
        "local_address",
        "port",
        "receiver",
        "write_timeout",
    )

    def __init__(
        self,
        address: str,
        config: ConnectionConfig | None = None,
        *,
        extend_support: bool | None = None,
        desired_tag: str | None = None,
        on_close: CloseCallback | None = None,
        label: str = "",
    ) -> None:
        SessionLink.__init__(
            self,
            address,
            config or ConnectionConfig(),
            extend_support=extend_support,
            desired_tag=desired_tag,
        )
        CoalescingWriter.__init__(self, self.config.write_timeout)
        self._read_view = None  # the thread's read buffer, from the first read on
        self.label = label or address
        self.local_address = ""
        self._outbox = self._session.outbox
        self._on_close = on_close
        self._on_error: Callable[[ServerError], None] | None = None
        self._futures: dict[int, asyncio.Future[bytes]] = {}  # request waiters by token
        self._targets: dict[int, Any] = {}  # request_for's targets by token
        self.receiver: Receiver | None = None
        self._step: asyncio.Future[bool] | None = None  # the handshake: True to start TLS
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._close_exc: BaseException | None = None
        self._lost: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def __repr__(self) -> str:
        return f"<Connection {self.label} {self._session.state}>"

    # ------------------------------------------------------------------ state

    @property
    def closed(self) -> bool:
        """Closed, or failed (a fatal error, a timeout) and closing."""
        return self._closed or self._session.failure is not None

    @property
    def identify(self) -> IdentifyResponse | None:
        return self._session.identify

    @property
    def auth(self) -> AuthResponse | None:
        return self._session.auth

    @property
    def max_rdy_count(self) -> int:
        return self._session.max_rdy_count

    @property
    def keeps_rdy_count(self) -> bool:
        """nsqd keeps the RDY count as sent (every version since 0.2.29, youzan's too): it
        needs no refresh as messages arrive. False before the handshake's answer."""
        identify = self._session.identify
        return identify is not None and identify.keeps_rdy_count

    @property
    def layout(self) -> MessageLayout:
        return self._session.layout

    def set_close_callback(self, callback: CloseCallback | None) -> None:
        """Called once, with the error, when the connection closes (None: nobody)."""
        self._on_close = callback

    # ------------------------------------------------------------------ connect

    async def connect(self) -> None:
        """Open the socket within ``connect_timeout`` and run the handshake within it too.

        Raises :class:`ConnectionClosedError` (cannot connect, or closed during the
        handshake), :class:`NSQTimeoutError`, or the server's typed error (e.g. AUTH).
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._lost = loop.create_future()
        step = self._step = loop.create_future()
        timeout = self.config.connect_timeout
        try:
            # a timeout scope, not wait_for: no task of its own per connection
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: self, self.host, self.port)
        except OSError as exc:  # TimeoutError included
            error = self._not_connected(exc, timeout)
            raise error from (None if isinstance(error, NSQTimeoutError) else exc)
        try:
            while await step:  # the session asks for TLS
                step = self._step = loop.create_future()
                await self._start_tls()
        except BaseException as exc:
            self.abort(exc if isinstance(exc, Exception) else None)
            raise
        finally:
            self._step = None

    async def _start_tls(self) -> None:
        loop, transport = self._loop, self._transport
        if loop is None or transport is None:
            raise ConnectionClosedError("connection closed before TLS", self.address)
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
        self._act(self._session.tls_started())

    # ------------------------------------------------------------------ subscribing

    async def subscribe(
        self,
        command: SubscribeCommand,
        *,
        on_message: Callable[[M], None],
        message_class: type[M],
        on_error: Callable[[ServerError], None] | None = None,
    ) -> None:
        """Subscribe and wait for nsqd's ``OK``. Each message is then decoded as
        ``message_class`` and handed to ``on_message`` as it is read; ``on_error`` gets the
        errors that answer no request (a FIN's ``E_FIN_FAILED``). Raises the typed error of
        a refusal (every one closes the connection)."""
        if self._closed or self._loop is None:
            raise ConnectionClosedError("connection is closed", self.address)
        data, token, deadline = self._session.subscribe(
            command, on_message=on_message, message_class=message_class
        )
        self._on_error = on_error
        await self._waiter(token, deadline, data)

    # ------------------------------------------------------------------ requests

    def request_future(
        self, data: bytes, command: str, timeout: float | None = None
    ) -> asyncio.Future[bytes]:
        """Queue a command that nsqd answers; the future gets the response frame's data.

        A server error sets its typed :class:`ServerError`. No answer within the timeout
        (``request_timeout`` by default) closes the connection (a late answer would pair
        with the wrong request) and fails every pending request with
        :class:`NSQTimeoutError`.
        """
        if self._closed or self._loop is None:
            raise ConnectionClosedError("connection is closed", self.address)
        token, deadline = self._session.send_request(command, timeout)
        return self._waiter(token, deadline, data)

    def request_for(
        self, target: Any, data: bytes, command: str, timeout: float | None = None
    ) -> None:
        """Queue a command that nsqd answers, as :meth:`request_future` does, with no
        future: its answer goes to ``receiver.answered(target, data)``, a failure (an error
        frame, the timeout, the connection's end) to ``receiver.failed(target, error)``.
        Raises :class:`ConnectionClosedError` when nothing can be written."""
        if self._closed or self._loop is None:
            raise ConnectionClosedError("connection is closed", self.address)
        token, deadline = self._session.send_request(command, timeout)
        self._targets[token] = target
        self._queue(deadline, data)

    async def request(self, data: bytes, command: str, timeout: float | None = None) -> bytes:
        """Send a command that nsqd answers and wait for its response (see request_future)."""
        future = self.request_future(data, command, timeout)
        if self._write_paused:
            await self.drain()
        return await future

    def _waiter(self, token: int, deadline: float, data: bytes) -> asyncio.Future[bytes]:
        future: asyncio.Future[bytes] = self._loop.create_future()  # type: ignore[union-attr]
        self._futures[token] = future
        self._queue(deadline, data)
        return future

    def _queue(self, deadline: float, data: bytes) -> None:
        if deadline < self._timer_at:
            self._arm(deadline)
        transport = self._transport
        if (
            len(self._futures) + len(self._targets) > 1
            or self._flush_handle is not None
            or self._wbuf
            or self._in_read
            or transport is None
        ):
            self.send(data)
            return
        # The only request on an idle connection (a sequential publish) leaves now, with no
        # flush scheduled behind it (a loop iteration less per round trip).
        compress = self._session.compress
        transport.write(data if compress is None else compress(data))
        self._wrote_directly = True

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        local = transport.get_extra_info("sockname")
        if local:
            self.local_address = f"{local[0]}:{local[1]}"
        transport.write(self._session.initiate())
        self._arm(self._session.next_deadline())

    def connection_lost(self, exc: Exception | None) -> None:
        error: BaseException
        if self._close_exc is not None:
            error = self._close_exc
        elif exc is not None:
            error = ConnectionClosedError(f"connection lost: {exc}", self.address)
        else:
            error = ConnectionClosedError("connection closed by nsqd", self.address)
        self._finish_close(error)

    def data_received(self, data: memoryview) -> None:
        self._in_read = True
        try:
            events = self._session.receive_data(data)
            if events:
                self._handle(events)
        finally:
            self._in_read = False
            if self._outbox:
                self._wbuf.append(self._session.data_to_send())
            if self._wbuf:
                self._write_out()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.receiver is not None:
            self.receiver.paused(self)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.receiver is not None:
            self.receiver.resumed(self)

    def _act(self, events: list[Event]) -> None:
        """Events from outside a read (the timer, TLS): handled, then what they queued."""
        self._handle(events)
        if self._outbox and not self._closed:
            self.send(self._session.data_to_send())

    def _answered(self, token: int, data: bytes) -> None:
        """nsqd's answer to a request, paired by the session (called as it reads)."""
        if self._targets:
            target = self._targets.pop(token, _NO_TARGET)
            if target is not _NO_TARGET:
                self.receiver.answered(target, data)  # type: ignore[union-attr]
                return
        future = self._futures.pop(token, None)
        if future is not None and not future.done():
            future.set_result(data)

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            match event:
                case RequestFailed(token, error):
                    target = self._targets.pop(token, _NO_TARGET)
                    if target is not _NO_TARGET:
                        self.receiver.failed(target, error)  # type: ignore[union-attr]
                        continue
                    future = self._futures.pop(token, None)
                    if future is not None and not future.done():
                        future.set_exception(error)
                        future.exception()  # retrieved: its caller may have gone
                case UnsolicitedError(error):
                    if self._on_error is not None:
                        self._on_error(error)
                    else:
                        log.warning("%s: %s", self.label, error)
                case StartTLS():
                    self._next_step(True)
                case Ready():
                    self._next_step(False)
                    self._arm(self._session.next_deadline())  # the link is watched from now
                case SessionFailed(error):
                    self._fail_step(error)
                    self.abort(error)
                case Closed(error):
                    self._fail_step(error)

    def _next_step(self, start_tls: bool) -> None:
        if self._step is not None and not self._step.done():
            self._step.set_result(start_tls)

    def _fail_step(self, error: BaseException) -> None:
        step = self._step
        if step is not None and not step.done():
            step.set_exception(error)
            step.exception()

    # ------------------------------------------------------------------ time

    def _arm(self, deadline: float | None) -> None:
        """One timer, at the session's next deadline."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        if deadline is None or self._loop is None or self._closed:
            return
        self._timer_at = deadline
        self._timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        if self._closed:
            return
        self._act(self._session.expired(time.monotonic()))
        self._arm(self._session.next_deadline())

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
        self._arm(None)
        self._stop_writing(error)
        closing = (
            error
            if isinstance(error, NSQError)
            else ConnectionClosedError(f"connection aborted: {error!r}", self.address)
        )
        self._handle(self._session.connection_lost(closing))
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        if self._on_close is not None:
            callback, self._on_close = self._on_close, None
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
            "compression": self._session.compression,
            "max_rdy_count": self.max_rdy_count,
            "pending": self.pending_count,
        }
