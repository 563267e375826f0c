"""Blocking connections to nsqd: the :class:`~smartnsq.protocol.session.ClientSession` of
:class:`~smartnsq.transport.connection.Connection` driven by the calling thread over a plain
socket, as h11 serves blocking and async users alike, and the idle ones kept for the threads
that publish.

The session decides everything about the conversation (the handshake, TLS, compression,
AUTH, pairing answers with requests, which errors are fatal, a request's deadline); a
:class:`BlockingConnection` moves the bytes and waits, in the thread that calls it, for the
answer it needs. A wait that the caller's own deadline cuts short raises the builtin
:class:`TimeoutError` (not an ``NSQError``): the caller says what ran out of time; the
request stays on the connection, whose session pairs its late answer and drops it.

A blocking connection is idle between publishes, for as long as its thread does not
publish: it asks nsqd for no heartbeats (``heartbeat_interval`` -1), so that nsqd neither
sends any nor closes a connection that sends nothing between two of them. nsqd then sets no
read deadline on it at all (``IOLoop`` in nsqd/protocol_v2.go, nsqio/nsq v1.3.0, and in
nsqdserver/protocol_v2.go, youzan/nsq 0.3.7-HA.1.13.0; ``SetHeartbeatInterval`` takes -1 as
"none"). A connection idle for a while is looked at before it is used again: one closed
meanwhile (nsqd restarted, a leader moved) is dropped and another one opened.
"""

from __future__ import annotations

import dataclasses
import logging
import select
import socket
import ssl
import struct
import sys
import threading
import time

from smartnsq.errors import ClientClosedError, ConnectionClosedError, NSQError, NSQTimeoutError
from smartnsq.protocol import session_events as events
from smartnsq.transport.config import ConnectionConfig
from smartnsq.transport.link import SessionLink
from smartnsq.transport.pool import PoolKey
from smartnsq.transport.reading import thread_read_buffer

__all__ = ["BlockingConnection", "BlockingPool"]

log = logging.getLogger("smartnsq.connection")

# A connection idle for this long is checked before it is used again (one syscall): closed
# by nsqd meanwhile, it is replaced rather than failing a try.
IDLE_CHECK_AFTER = 0.5


class BlockingConnection(SessionLink):
    """One TCP connection to nsqd, used by one thread at a time: ``connect()``, then a
    ``request()`` after the other."""

    def __init__(self, address: str, config: ConnectionConfig) -> None:
        super().__init__(address, config)
        self._sock: socket.socket | None = None
        self._token = 0  # the request whose answer is awaited
        self._answer: bytes | None = None
        self._failure: BaseException | None = None
        self._ready = False
        self._handshake_end = 0.0  # the connect's deadline, for TLS
        # SO_RCVTIMEO and SO_SNDTIMEO as set (0: never, the socket waits without bound)
        self._receive_bound = 0.0
        self._send_bound = 0.0
        #: Whether the last request was written whole (nsqd may have it).
        self.written = False
        self.used_at = 0.0  # when its last request was answered (time.monotonic)

    def __repr__(self) -> str:
        return f"<BlockingConnection {self.address} {self._session.state}>"

    # ------------------------------------------------------------------ connect

    def connect(self, deadline: float) -> None:
        """Open the socket and run the handshake, within ``connect_timeout`` and by
        ``deadline`` (``time.monotonic()``; past it: :class:`TimeoutError`).

        Raises :class:`ConnectionClosedError` (cannot connect, or closed during the
        handshake), :class:`NSQTimeoutError`, or the server's typed error (e.g. AUTH)."""
        limit = self.config.connect_timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        try:
            sock = socket.create_connection((self.host, self.port), min(limit, remaining))
        except OSError as exc:
            error = self._not_connected(exc, limit)
            if isinstance(error, NSQTimeoutError):
                if remaining < limit:
                    raise TimeoutError from None  # the caller's deadline came first
                raise error from None
            raise error from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        sock.settimeout(None)  # blocking: each wait is bounded by SO_RCVTIMEO or SO_SNDTIMEO
        self._sock = sock
        self._handshake_end = deadline
        try:
            # the session bounds the handshake by connect_timeout itself
            self._write(self._session.initiate(), deadline, time.monotonic())
            until: float | None = None
            while not self._ready:
                failure = self._failure
                if failure is not None:
                    raise failure
                if until is None:
                    until = self._until(deadline)
                elif not self._read(until):
                    until = None
        except BaseException:
            self.close()
            raise

    def _start_tls(self) -> None:
        """The session asks for TLS: the handshake, by what remains of the connect's time."""
        sock = self._sock
        if sock is None:
            raise ConnectionClosedError("connection closed before TLS", self.address)
        config = self.config
        sock.settimeout(max(self._handshake_end - time.monotonic(), 1e-3))
        try:
            upgraded = config.ssl_context().wrap_socket(
                sock, server_hostname=config.tls_server_hostname or self.host
            )
        except (ssl.SSLError, OSError) as exc:
            raise ConnectionClosedError(f"TLS handshake failed: {exc}", self.address) from exc
        upgraded.settimeout(None)
        self._sock = upgraded
        self._carry_out(self._session.tls_started())

    # ------------------------------------------------------------------ requests

    def request(self, data: bytes, command: str, deadline: float, now: float) -> bytes:
        """Send a command nsqd answers (``command`` names it) and wait for its answer (the
        response frame's data), by ``deadline`` (``now``: ``time.monotonic()`` lately).

        :attr:`written` says whether it was written whole. A write blocked past
        ``write_timeout`` closes the connection. The deadline passing first raises
        :class:`TimeoutError` and leaves the request to the session (its late answer is
        dropped); its own deadline (``request_timeout``) passing first fails the session,
        which closes the connection."""
        if self._closed:
            raise ConnectionClosedError("connection is closed", self.address)
        session = self._session
        token, request_deadline = session.send_request(command)
        self._token = token
        self.written = False
        try:
            compress = session.compress
            try:
                self._write(data if compress is None else compress(data), deadline, now)
            except BaseException:
                # Cut short (Ctrl-C) with part of it in the socket, maybe: nothing can follow.
                if not self._closed:
                    self._lost(ConnectionClosedError("a write was interrupted", self.address))
                raise
            self.written = True
            until: float | None = None
            if request_deadline < deadline and session.pending_count == 1:
                until = request_deadline  # the common case: nothing else to watch
            while True:
                answer = self._answer
                if answer is not None:
                    self._answer = None
                    self.used_at = now
                    return answer
                failure = self._failure
                if failure is not None:
                    self._failure = None
                    raise failure
                if until is None:
                    until = self._until(deadline)
                elif not self._read(until):
                    until = None  # the wait ended: what expired, and what to wait for next
        finally:
            self._token = 0

    def _answered(self, token: int, data: bytes) -> None:
        """nsqd's answer to a request, paired by the session (a late answer to a request
        given up is dropped)."""
        if token == self._token:
            self._answer = data

    # ------------------------------------------------------------------ reading and writing

    def _until(self, deadline: float) -> float:
        """When the next read must end: at the session's next deadline, or the caller's.
        What expired is carried out first; :class:`TimeoutError` once ``deadline`` passed."""
        session = self._session
        now = time.monotonic()
        wake = session.next_deadline()
        if wake is not None and wake <= now:
            expired = session.expired(now)
            if expired:
                self._carry_out(expired)
                return now  # the caller looks at what that failed before reading again
            wake = None
        if deadline <= now:
            raise TimeoutError
        return deadline if wake is None or deadline < wake else wake

    def _read(self, until: float) -> bool:
        """One read: what arrived fed to the session, what it queued written. False when
        nothing came by ``until``."""
        sock = self._sock
        if sock is None:
            raise ConnectionClosedError("connection is closed", self.address)
        remaining = until - time.monotonic()
        if remaining < 1.0 or self._receive_bound != 1.0:
            if remaining <= 0:
                return False
            self._receive_bound = self._bound(socket.SO_RCVTIMEO, remaining, self._receive_bound)
        view = thread_read_buffer()  # the calling thread's: the session copies what it keeps
        try:
            size = sock.recv_into(view)
        except (BlockingIOError, TimeoutError, ssl.SSLWantReadError):
            return False
        except OSError as exc:
            self._lost(ConnectionClosedError(f"connection lost: {exc}", self.address))
            return True
        if not size:
            self._lost(ConnectionClosedError("connection closed by nsqd", self.address))
            return True
        session = self._session
        happened = session.receive_data(view[:size])
        if happened:
            self._carry_out(happened)
        if session.outbox and not self._closed:
            self._write(session.data_to_send(), until, time.monotonic())
        return True

    def _write(self, data: bytes, deadline: float, now: float) -> None:
        """Write all of ``data``, within ``write_timeout`` and by ``deadline`` (past it:
        :class:`TimeoutError`); a write cut short closes the connection."""
        sock = self._sock
        if sock is None or self._closed:
            raise ConnectionClosedError("connection is closed", self.address)
        limit = self.config.write_timeout
        end = now + limit if now + limit < deadline else deadline
        view = memoryview(data)
        while True:
            if end - now < 1.0 or self._send_bound != 1.0:
                self._send_bound = self._bound(socket.SO_SNDTIMEO, end - now, self._send_bound)
            try:
                sent = sock.send(view)
            except (BlockingIOError, TimeoutError, ssl.SSLWantWriteError):
                sent = 0
            except OSError as exc:
                error = ConnectionClosedError(f"connection lost: {exc}", self.address)
                self._lost(error)
                raise error from exc
            if sent == len(view):
                return
            view = view[sent:]
            now = time.monotonic()
            if now >= end:
                break
        # Part of it may be in the socket: nothing else can follow it on this connection.
        timeout = NSQTimeoutError(f"write to {self.address} blocked for {limit} s")
        self._lost(timeout)
        if end < deadline:
            raise timeout
        raise TimeoutError

    def _bound(self, option: int, seconds: float, bound: float) -> float:
        """Bound the socket's blocking receives or sends (``SO_RCVTIMEO``, ``SO_SNDTIMEO``,
        now ``bound``) by at most ``seconds``: by a step of 1 s, 0.1 s, 10 ms or 1 ms, so
        that the bound (a system call to change) changes only as a deadline draws near; a
        wait that ends early is resumed by its caller. The bound set."""
        step = (
            1.0 if seconds >= 1.0 else 0.1 if seconds >= 0.1 else 0.01 if seconds >= 0.01 else 0.001
        )
        if step != bound:
            sock = self._sock
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, option, _timeval(step))
        return step

    def _carry_out(self, happened: list[events.Event]) -> None:
        """What the session says happened: the request's failure, the handshake's steps,
        the end of the session."""
        for event in happened:
            match event:
                case events.RequestFailed(token, error):
                    if token == self._token:
                        self._failure = error
                case events.UnsolicitedError(error):
                    log.warning("%s: %s", self.address, error)
                case events.StartTLS():
                    self._start_tls()
                case events.Ready():
                    self._ready = True
                case events.SessionFailed(error) | events.Closed(error):
                    if self._failure is None:
                        self._failure = error
                    self._drop()

    # ------------------------------------------------------------------ idle

    def alive(self) -> bool:
        """Whether the connection is still open, looked at without waiting (an idle one may
        have been closed by nsqd meanwhile): what waits to be read is read."""
        sock = self._sock
        if sock is None or not self.is_open:
            return False
        try:
            readable = _readable(sock)
        except (OSError, ValueError):
            self._drop()
            return False
        if readable:
            try:
                self._read(time.monotonic() + 1e-3)
            except (NSQError, TimeoutError):
                self._drop()
            self._failure = None
        return self.is_open

    # ------------------------------------------------------------------ closing

    def _lost(self, error: NSQError) -> None:
        self._drop()
        self._carry_out(self._session.connection_lost(error))

    def _drop(self) -> None:
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        """Close the socket; a request waiting fails. From the thread using it only (another
        thread: :meth:`interrupt`)."""
        if not self._closed:
            self._lost(ConnectionClosedError("connection closed by the client", self.address))

    def interrupt(self) -> None:
        """From another thread: end what the connection's thread waits for (the read sees
        the end of the stream); it closes the connection then."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class BlockingPool:
    """The idle blocking connections of a producer, by (nsqd address, topic, partition) as
    in :class:`~smartnsq.transport.pool.ConnectionPool`. A thread takes one for a try and
    gives it back after it, so there are as many per key as threads publishing there at
    once, and a thread that ends leaves its connection to the next one."""

    def __init__(self, config: ConnectionConfig) -> None:
        # No heartbeats: a connection may sit idle between one thread's publishes.
        self.config = dataclasses.replace(config, heartbeat_interval=-1)
        self._idle: dict[PoolKey, list[BlockingConnection]] = {}
        self._open: set[BlockingConnection] = set()
        self._lock = threading.Lock()
        self._closed = False

    def take(self, key: PoolKey, now: float) -> BlockingConnection | None:
        """An open connection for ``key`` that no thread uses, or None (``now``:
        ``time.monotonic()``, lately)."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn = idle.pop()
            if now - conn.used_at < IDLE_CHECK_AFTER or conn.alive():
                return conn
            self._forget(conn)

    def connect(self, key: PoolKey, deadline: float) -> BlockingConnection:
        """A new connection for ``key``, connected by ``deadline`` (see
        :meth:`BlockingConnection.connect`)."""
        if self._closed:
            raise ClientClosedError("the connection pool is closed")
        conn = BlockingConnection(key[0], self.config)
        conn.connect(deadline)
        with self._lock:
            closed = self._closed
            if not closed:
                self._open.add(conn)
        if closed:
            conn.close()
            raise ClientClosedError("the connection pool is closed")
        return conn

    def give_back(self, key: PoolKey, conn: BlockingConnection) -> None:
        """A connection taken or made for ``key`` is free again (closed: forgotten)."""
        if conn.is_open:
            with self._lock:
                if not self._closed:
                    self._idle.setdefault(key, []).append(conn)
                    return
        self._forget(conn)

    def _forget(self, conn: BlockingConnection) -> None:
        conn.close()
        with self._lock:
            self._open.discard(conn)

    def open_connections(self) -> int:
        with self._lock:
            return sum(conn.is_open for conn in self._open)

    def close(self) -> None:
        """Close the idle connections, and interrupt those in use (their threads close them
        when they give them back). Nothing is taken or made afterwards."""
        with self._lock:
            self._closed = True
            idle = {conn for conns in self._idle.values() for conn in conns}
            busy = self._open - idle
            self._idle.clear()
            self._open = set(busy)  # forgotten by their threads, once given back
        for conn in idle:
            conn.close()
        for conn in busy:
            conn.interrupt()


def _readable(sock: socket.socket) -> bool:
    """Whether something (or the end of the stream) waits to be read, without waiting (poll:
    no limit on the descriptor's number, as select has)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def _timeval(seconds: float) -> bytes:
    """``seconds`` as the ``struct timeval`` of ``SO_RCVTIMEO`` and ``SO_SNDTIMEO`` (a DWORD
    of milliseconds on Windows)."""
    if sys.platform == "win32":
        return struct.pack("<I", max(1, round(seconds * 1000)))
    whole = int(seconds)
    return struct.pack("@ll", whole, round((seconds - whole) * 1_000_000))
