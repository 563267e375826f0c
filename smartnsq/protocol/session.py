"""The client side of an NSQ connection as a sans-IO state machine, in the way h11's
``Connection`` works: the transport feeds it what the socket read and writes what it says.

* :meth:`ClientSession.receive_data` decodes bytes (decompressed by the session once snappy
  or deflate is negotiated) and returns typed events (``protocol.session_events``): an error
  reply to a request, an unsolicited error, a heartbeat (the session queues the NOP
  itself), the handshake's steps, the end of the session. The two frames of the hot paths
  are handed over inline, in the order read, with no event object: a response, paired with
  its request, to ``on_response(token, data)`` (sequential publishing is one response per
  read), and a message, decoded, to the hook ``subscribe`` set (consuming).
* :meth:`~ClientSession.initiate`, :meth:`~ClientSession.send_request` and
  :meth:`~ClientSession.subscribe` return what to write and, for commands nsqd answers, a
  token (the transport keys its waiters by token) and the request's deadline.
  :meth:`~ClientSession.data_to_send` returns what the session queued itself (NOP, AUTH);
  :attr:`~ClientSession.compress` is applied to everything written once compression is on.
* The handshake is a flow the session drives: magic and IDENTIFY, the answer (JSON, or a
  plain ``OK`` from a server without feature negotiation), then in nsqd's fixed order TLS
  (:class:`~smartnsq.protocol.session_events.StartTLS`: the transport upgrades the socket
  and calls :meth:`~ClientSession.tls_started`), snappy or deflate (the decompressor takes
  over bytes already read: the answer and the compressed ``OK`` can come in one read), then
  AUTH when nsqd requires it. A server answering ``HTTP/`` is an HTTP port.
* Deadlines are decisions: :meth:`~ClientSession.next_deadline` says when to look again and
  :meth:`~ClientSession.expired` what has expired: the handshake (each answer within
  ``request_timeout``, the whole within ``connect_timeout``), a request (its own timeout,
  ``request_timeout`` by default: a late answer would pair with the wrong request, so the
  session ends) and the link (no bytes for two heartbeat intervals and a second).
* Every request waiting is answered or failed: a fatal error frame, a protocol violation,
  an expired deadline or the end of the connection fails all of them (then
  ``SessionFailed`` or ``Closed``); a non-fatal error fails only its own.

What each state accepts is in ``protocol.session_states``.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from smartnsq.errors import (
    ConnectionClosedError,
    NotNsqdError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
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
from smartnsq.protocol.session_events import (
    HEARTBEAT_EVENT,
    START_TLS,
    Closed,
    Event,
    Ready,
    RequestFailed,
    SessionFailed,
    UnsolicitedError,
)
from smartnsq.protocol.session_states import (
    ACCEPTS,
    HANDSHAKE_STATES,
    REQUEST_STATES,
    SENDS,
    SUBSCRIBE_COMMANDS,
    TERMINAL_STATES,
    Received,
    State,
)

__all__ = ["ClientSession", "ResponseHook", "SubscribeCommand", "SubscribeKind"]

M = TypeVar("M", bound=MessageFrame)
#: Takes nsqd's answer (the response frame's data) to the request of a token.
ResponseHook = Callable[[int, bytes], None]

# Errors answering FIN, REQ and TOUCH, which have no reply on success: never the answer to a
# request waiting (go-nsq and the Java SDK treat them alike).
_MESSAGE_COMMAND_ERRORS = frozenset({b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED"})
# Commands whose sending changes the state (SENDS), or that have a method of their own.
_STATE_COMMANDS = frozenset({"IDENTIFY", "AUTH", "CLS"}) | SUBSCRIBE_COMMANDS
_OWN_METHOD = frozenset({"IDENTIFY", "AUTH"})
# What a subscribed connection's unsolicited errors answer: the consumer's FIN, REQ, TOUCH.
_MESSAGE_COMMAND = "FIN"


class SubscribeKind(enum.StrEnum):
    """The SUB command, which decides what message frames carry."""

    PLAIN = "SUB"
    ORDERED = "SUB_ORDERED"  # youzan: one message at a time per partition, queue positions
    ADVANCED = "SUB_ADVANCED"  # youzan: queue positions, optionally a start position

    @classmethod
    def for_partition(cls, partition: int | None, *, ordered: bool) -> SubscribeKind:
        """A youzan partition is subscribed with SUB_ORDERED, or SUB_ADVANCED (every message
        then carries its queue offset and size); classic nsqd (no partition) with SUB."""
        if partition is None:
            return cls.PLAIN
        return cls.ORDERED if ordered else cls.ADVANCED


@dataclass(frozen=True)
class SubscribeCommand:
    """What a connection subscribes to: the SUB command of ``kind`` for a channel of a topic
    (youzan: of one partition), SUB_ADVANCED from ``start`` when given."""

    kind: SubscribeKind
    topic: str
    channel: str
    partition: int | None = None
    start: commands.StartPosition | None = None

    def encode(self) -> bytes:
        """The command's bytes; a bad argument raises :class:`ValidationError`."""
        kind, partition = self.kind, self.partition
        if self.start is not None and kind is not SubscribeKind.ADVANCED:
            raise ValidationError("start", "only SUB_ADVANCED takes a start position")
        if kind is SubscribeKind.PLAIN:
            return commands.sub(self.topic, self.channel, partition)
        if partition is None:
            raise ValidationError("partition", f"{kind.value} needs a partition")
        if kind is SubscribeKind.ORDERED:
            return commands.sub_ordered(self.topic, self.channel, partition)
        return commands.sub_advanced(self.topic, self.channel, partition, self.start)


class ClientSession:
    """One connection's protocol state. Create it with the IDENTIFY to send, call
    :meth:`initiate` once the socket is open, then feed it what arrives."""

    # Slots: a connection's session has more attributes than an instance dictionary shares
    # keys for (30): as a dictionary it costs 1.6 KiB per connection, as slots 0.3.
    __slots__ = (
        "_accept_messages",
        "_auth_secret",
        "_clock",
        "_codec",
        "_cut_short",
        "_decoder",
        "_ended",
        "_handshake_deadline",
        "_handshake_end",
        "_handshake_timeout",
        "_hold",
        "_identify_request",
        "_last_received",
        "_message_class",
        "_next_token",
        "_nop_owed",
        "_on_message",
        "_on_response",
        "_pending",
        "_request_timeout",
        "_requests_open",
        "_silence_limit",
        "_state",
        "_sub_token",
        "_unsolicited_command",
        "address",
        "auth",
        "compress",
        "failure",
        "identify",
        "layout",
        "max_rdy_count",
        "messages_received",
        "outbox",
        "subscription",
        "youzan",
    )

    def __init__(
        self,
        identify: IdentifyRequest,
        *,
        on_response: ResponseHook,
        address: str = "",
        auth_secret: str | bytes | None = None,
        request_timeout: float = 10.0,
        handshake_timeout: float = 5.0,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.address = address
        self._on_response = on_response
        self._identify_request = identify
        self._auth_secret = auth_secret
        self._request_timeout = request_timeout
        self._handshake_timeout = handshake_timeout
        # nsqd sends a heartbeat every interval: two missed ones (and a second) mean the link
        # is dead. -1 and 0 (the server's default) watch nothing, as before.
        interval = identify.heartbeat_interval / 1000
        self._silence_limit = 2 * interval + 1 if interval > 0 else None
        # Read from the time module when made (a simulation stands in for its clocks).
        self._clock = clock if clock is not None else time.monotonic
        self._decoder = FrameDecoder(max_frame_size)
        self._state = State.CONNECTED
        self._ended = False  # the state is one of TERMINAL_STATES
        self._requests_open = False  # the state is one of REQUEST_STATES
        self._accept_messages = False  # the state accepts message frames
        self._hold = False  # the transport is starting TLS: decode nothing until it is up
        self._nop_owed = False  # a heartbeat during the handshake, answered once ready
        # Requests waiting for their answer, oldest first: (token, command, deadline,
        # timeout). Tokens grow by one per request: the oldest's tells which were answered.
        # Those that wait the whole request_timeout are due in the order sent; those cut
        # shorter are also candidates for the earliest deadline, (deadline, token), deadlines
        # growing: one answered before another due earlier can never be the earliest, so it
        # is not kept (a sliding-window minimum, O(1) per request).
        self._pending: deque[tuple[int, str, float, float]] = deque()
        # made by the first such request (a deque is 600 bytes; most connections never cut
        # a request short)
        self._cut_short: deque[tuple[float, int]] | None = None
        self._next_token = 1
        self._sub_token = 0  # the SUB waiting for its OK
        # The handshake ends within handshake_timeout, and each of its answers comes within
        # request_timeout: (when, the bound that ends it then, the step waited for).
        self._handshake_end = 0.0
        self._handshake_deadline: tuple[float, float, str] | None = None
        self._last_received = self._clock()
        #: What the session queued to send itself (NOP, AUTH): :meth:`data_to_send` takes it.
        self.outbox: list[bytes] = []
        self._on_message: Callable[[Any], None] | None = None
        self._message_class: type[MessageFrame] = MessageFrame
        self._unsolicited_command: str | None = None
        self._codec: StreamCodec | None = None
        #: Applied to everything written once compression is negotiated (None before).
        self.compress: Callable[[bytes], bytes] | None = None
        self.identify: IdentifyResponse | None = None
        self.auth: AuthResponse | None = None
        self.youzan = False
        self.max_rdy_count = 2500
        self.layout = MessageLayout()
        self.subscription: SubscribeKind | None = None
        self.messages_received = 0
        #: Why the session ended in error (None while it did not).
        self.failure: NSQError | None = None

    def __repr__(self) -> str:
        return f"<ClientSession {self.address} {self._state}>"

    # ------------------------------------------------------------------ state

    @property
    def state(self) -> State:
        return self._state

    @property
    def accepts_requests(self) -> bool:
        """The handshake is done and the session did not end."""
        return self._requests_open

    @property
    def pending_count(self) -> int:
        """Requests waiting for their answer."""
        return len(self._pending)

    @property
    def compression(self) -> str | None:
        """The negotiated stream codec's name (``SnappyCodec``, ``DeflateCodec``), or None."""
        return type(self._codec).__name__ if self._codec is not None else None

    def _set_state(self, state: State) -> None:
        self._state = state
        self._ended = state in TERMINAL_STATES
        self._requests_open = state in REQUEST_STATES
        self._accept_messages = Received.MESSAGE in ACCEPTS[state]

    # ------------------------------------------------------------------ sending

    def initiate(self) -> bytes:
        """The magic and IDENTIFY, to write first; the handshake's deadline starts now."""
        self._transition("IDENTIFY")
        self._handshake_end = self._clock() + self._handshake_timeout
        self._await_step("IDENTIFY")
        return commands.MAGIC_V2 + self._identify_request.encoded

    def send_request(self, command: str, timeout: float | None = None) -> tuple[int, float]:
        """A command nsqd answers (``command`` names it: ``PUB``, ``MPUB``, ``CLS``...) is
        being written: its token and its deadline, ``timeout`` from now when shorter than
        ``request_timeout``, which bounds every request.

        Raises :class:`ConnectionClosedError` once the session ended and
        :class:`ProtocolError` for a command its state does not take (SUB goes through
        :meth:`subscribe`).
        """
        if command in _STATE_COMMANDS:
            if command in _OWN_METHOD or (
                command in SUBSCRIBE_COMMANDS and self.subscription is None
            ):
                raise ProtocolError(f"{command} is sent by the session itself (subscribe())")
            self._transition(command)
        elif not self._requests_open:
            self._refuse(command)
        token = self._next_token
        self._next_token = token + 1
        limit = self._request_timeout
        if timeout is None or timeout >= limit:
            clock = self._clock  # an attribute called as a method: unspecialized (CPython 3.11)
            deadline = clock() + limit
            self._pending.append((token, command, deadline, limit))
            return token, deadline
        return token, self._cut_short_request(token, command, timeout)

    def subscribe(
        self, command: SubscribeCommand, *, on_message: Callable[[M], None], message_class: type[M]
    ) -> tuple[bytes, int, float]:
        """The SUB ``command`` to write, its token and its deadline.

        From now on message frames are decoded in the layout the command asks for (the queue
        position block with SUB_ORDERED and SUB_ADVANCED) as ``message_class`` and handed to
        ``on_message`` inline, once nsqd's ``OK`` has come; errors that answer no request
        are the consumer's FIN, REQ or TOUCH.
        """
        data = command.encode()  # checked before anything changes
        kind = command.kind
        if (self._state, kind.value) not in SENDS:
            self._refuse(kind.value)
        self.subscription = kind
        self.layout = MessageLayout(
            self.layout.binary_id, self.layout.ext, kind is not SubscribeKind.PLAIN
        )
        self._on_message = on_message
        self._message_class = message_class
        self._unsolicited_command = _MESSAGE_COMMAND
        token, deadline = self.send_request(kind.value)
        self._sub_token = token
        return data, token, deadline

    def data_to_send(self) -> bytes:
        """What the session queued itself (NOPs answering heartbeats, AUTH), uncompressed."""
        outbox = self.outbox
        if not outbox:
            return b""
        data = b"".join(outbox)
        outbox.clear()
        return data

    def _transition(self, command: str) -> None:
        following = SENDS.get((self._state, command))
        if following is None:
            self._refuse(command)
        self._set_state(following)

    def _refuse(self, command: str) -> NoReturn:
        if self._ended:
            raise ConnectionClosedError("connection is closed", self.address)
        raise ProtocolError(
            f"cannot send {command} to {self.address}: the session is {self._state}"
        )

    def _cut_short_request(self, token: int, command: str, timeout: float) -> float:
        """Queue a request that waits less than request_timeout; its deadline."""
        deadline = self._clock() + timeout
        pending = self._pending
        pending.append((token, command, deadline, timeout))
        cut = self._cut_short
        if cut is None:
            cut = self._cut_short = deque()
        oldest = pending[0][0]
        while cut and cut[0][1] < oldest:
            cut.popleft()  # answered
        while cut and cut[-1][0] >= deadline:
            cut.pop()  # answered before this one, and due no earlier: never the earliest
        cut.append((deadline, token))
        return deadline

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Feed what the socket read; the events it completes, in order. Responses go to
        ``on_response`` and messages to the subscription's hook as they are decoded. Never
        raises for what the server sent: a violation is a ``SessionFailed`` event with a
        :class:`ProtocolError`."""
        clock = self._clock  # an attribute called as a method: unspecialized (CPython 3.11)
        self._last_received = clock()
        events: list[Event] = []
        if self._ended:
            return events
        try:
            self._decoder.feed(data)
        except ProtocolError as exc:  # a corrupt compressed stream
            self._fail(exc, events)
            return events
        if self._hold:
            return events
        next_frame = self._decoder.next_frame
        pending = self._pending
        on_message = self._on_message if self._accept_messages else None
        decode: Callable[..., MessageFrame] | None = None  # bound at the read's first message
        while True:
            try:
                frame = next_frame()
            except ProtocolError as exc:
                self._fail(self._sniffed(exc), events)
                return events
            if frame is None:
                return events
            frame_type, data = frame
            if frame_type == FRAME_TYPE_MESSAGE:
                # a message: decoded and handed on here, without an event
                if on_message is None:
                    self._fail(ProtocolError(f"a message frame while {self._state}"), events)
                    return events
                if decode is None:
                    decode, layout, cls = decode_message, self.layout, self._message_class
                try:
                    message = decode(data, layout, cls)
                except ProtocolError as exc:
                    self._fail(exc, events)
                    return events
                self.messages_received += 1
                on_message(message)
            elif pending and frame_type != FRAME_TYPE_ERROR and data != HEARTBEAT:
                token = pending.popleft()[0]
                if token == self._sub_token:
                    if not self._subscribed(token, data, events):
                        return events
                    on_message = self._on_message
                self._on_response(token, data)
            elif not self._other_frame(frame_type, data, events):
                return events

    def tls_started(self) -> list[Event]:
        """The transport's TLS is up: nsqd's ``OK`` comes over it. (Nothing happens when the
        session ended meanwhile: its deadline passed during the TLS handshake.)"""
        if self._ended:
            return []
        if self._state is not State.TLS or not self._hold:
            raise ProtocolError(f"TLS started with the session {self._state}")
        self._hold = False
        return self.receive_data(b"")  # what was read meanwhile

    def _other_frame(self, frame_type: int, data: bytes, events: list[Event]) -> bool:
        """A heartbeat, an error frame, or a response that answers no request (the
        handshake's current step); False when decoding stops (the session failed, or the
        transport starts TLS)."""
        if frame_type == FRAME_TYPE_ERROR:
            kind = Received.ERROR_FRAME
        elif data == HEARTBEAT:
            kind = Received.HEARTBEAT
        else:
            kind = Received.RESPONSE
        if kind not in ACCEPTS[self._state]:
            self._fail(ProtocolError(f"a {kind} while {self._state}: {data[:40]!r}"), events)
            return False
        if kind is Received.ERROR_FRAME:
            return self._error_frame(data, events)
        if kind is Received.HEARTBEAT:
            if self._requests_open:
                self.outbox.append(commands.NOP)
            else:
                self._nop_owed = True  # answered once the stream's upgrades are in place
            events.append(HEARTBEAT_EVENT)
            return True
        return self._handshake_step(data, events)

    def _subscribed(self, token: int, answer: bytes, events: list[Event]) -> bool:
        self._sub_token = 0
        if answer != OK:
            error = ProtocolError(f"unexpected answer to SUB: {answer[:40]!r}")
            events.append(RequestFailed(token, error))
            self._fail(error, events)
            return False
        self._set_state(State.SUBSCRIBED)
        return True

    def _error_frame(self, data: bytes, events: list[Event]) -> bool:
        """An error frame; False when it ended the session."""
        pending = self._pending
        handshaking = self._state in HANDSHAKE_STATES
        solicited = bool(pending) and data.split(b" ", 1)[0] not in _MESSAGE_COMMAND_ERRORS
        if solicited:
            command: str | None = pending[0][1]
        elif handshaking:
            command = "AUTH" if self._state is State.AUTH else "IDENTIFY"
        else:
            command = self._unsolicited_command
        error = error_from_frame(data, command, self.address)
        if handshaking or error.fatal or (solicited and pending[0][0] == self._sub_token):
            # nsqd closes the connection after a fatal error (and a failed handshake or SUB
            # leaves nothing to use): everything waiting fails with it.
            if not solicited and not handshaking:
                events.append(UnsolicitedError(error))
            self._fail(error, events)
            return False
        if solicited:
            token = pending.popleft()[0]
            events.append(RequestFailed(token, error))
        else:
            events.append(UnsolicitedError(error))
        return True

    def _sniffed(self, error: ProtocolError) -> ProtocolError:
        """A corrupt first frame from an HTTP server says so: it is not an nsqd TCP port."""
        if self._state is State.IDENTIFYING and self._decoder.peek(5) == b"HTTP/":
            status = self._decoder.peek(64).split(b"\r\n", 1)[0].decode("latin-1")
            return NotNsqdError(
                f"{self.address} answered in HTTP ({status!r}): it is an HTTP port, not an "
                "nsqd TCP port (nsqd's default is 4150, its HTTP port 4151)"
            )
        return error

    # ------------------------------------------------------------------ the handshake

    def _handshake_step(self, answer: bytes, events: list[Event]) -> bool:
        """A response while no request waits: the answer to the handshake's current step.
        False when decoding stops (TLS to start, or the session failed)."""
        state = self._state
        try:
            if state is State.IDENTIFYING:
                return self._identified(answer, events)
            if state is State.TLS:
                _expect_ok(answer, "TLS")
                return self._upgrade_compression(events)
            if state is State.COMPRESSION:
                _expect_ok(answer, "compression")
                return self._authenticate(events)
            if state is State.AUTH:
                self.auth = AuthResponse.decode(answer)
                return self._ready(events)
        except ProtocolError as exc:
            self._fail(exc, events)
            return False
        self._fail(ProtocolError(f"a response with no request waiting: {answer[:40]!r}"), events)
        return False

    def _identified(self, answer: bytes, events: list[Event]) -> bool:
        response = IdentifyResponse.decode(answer)
        self.identify = response
        if response is not None:
            self.max_rdy_count = response.max_rdy_count
            self.youzan = response.is_youzan
        extend = bool(self._identify_request.extend_support and self.youzan)
        self.layout = MessageLayout(binary_id=self.youzan, ext=extend)
        if response is not None and response.tls_v1:
            self._set_state(State.TLS)
            self._hold = True
            self._await_step("TLS")  # the TLS handshake, then nsqd's OK over it
            events.append(START_TLS)
            return False
        return self._upgrade_compression(events)

    def _upgrade_compression(self, events: list[Event]) -> bool:
        response = self.identify
        codec: StreamCodec | None = None
        if response is not None and response.snappy:
            codec = SnappyCodec()
        elif response is not None and response.deflate:
            codec = DeflateCodec(self._identify_request.deflate_level)
        if codec is None:
            return self._authenticate(events)
        self._codec = codec
        self.compress = codec.compress
        # The rest of what was read is already compressed: the decompressor takes it over.
        self._decoder.install_decompressor(codec.decompress)
        self._set_state(State.COMPRESSION)
        self._await_step("compression")
        return True

    def _authenticate(self, events: list[Event]) -> bool:
        if self.identify is None or not self.identify.auth_required:
            return self._ready(events)
        secret = self._auth_secret
        if secret is None:
            error = ValidationError(
                "auth_secret", f"nsqd {self.address} requires AUTH; no auth_secret given"
            )
            self._fail(error, events)
            return False
        self.outbox.append(commands.auth(secret))
        self._set_state(State.AUTH)
        self._await_step("AUTH")
        return True

    def _await_step(self, step: str) -> None:
        """The handshake waits for an answer: by request_timeout, and the whole by
        handshake_timeout (``connect_timeout``)."""
        now = self._clock()
        if now + self._request_timeout < self._handshake_end:
            self._handshake_deadline = (now + self._request_timeout, self._request_timeout, step)
        else:
            self._handshake_deadline = (self._handshake_end, self._handshake_timeout, step)

    def _ready(self, events: list[Event]) -> bool:
        self._set_state(State.READY)
        self._handshake_deadline = None
        if self._nop_owed:
            self._nop_owed = False
            self.outbox.append(commands.NOP)
        events.append(Ready(self.identify, self.auth))
        return True

    # ------------------------------------------------------------------ deadlines

    def next_deadline(self) -> float | None:
        """When something may expire (in the clock's time): the handshake's deadline, the
        earliest request's, or when the link would count as silent. None: nothing to watch."""
        if self._ended:
            return None
        deadline = None if self._handshake_deadline is None else self._handshake_deadline[0]
        request = self._earliest_request()
        if request is not None and (deadline is None or request[2] < deadline):
            deadline = request[2]
        limit = self._silence_limit
        if limit is not None and self._requests_open:
            silent_at = self._last_received + limit
            if deadline is None or silent_at < deadline:
                deadline = silent_at
        return deadline

    def expired(self, now: float) -> list[Event]:
        """What has expired at ``now``: the session fails with :class:`NSQTimeoutError` (every
        request waiting with it), or nothing happens."""
        if self._ended:
            return []
        error: NSQError | None = None
        request = self._earliest_request()
        handshake = self._handshake_deadline
        if handshake is not None and now >= handshake[0]:
            _, limit, step = handshake
            error = NSQTimeoutError(
                f"{self.address} accepted the connection but did not answer the NSQ handshake "
                f"({step}) within {limit} s: is it an nsqd TCP port (default 4150), and is "
                "that nsqd responsive?"
            )
        elif request is not None and now >= request[2]:
            _, command, _, timeout = request
            error = NSQTimeoutError(f"{command} to {self.address}: no answer within {timeout} s")
        elif self._silence_limit is not None and self._requests_open:
            silent = now - self._last_received
            if silent >= self._silence_limit:
                error = NSQTimeoutError(f"no heartbeat from {self.address} for {silent:.1f} s")
        if error is None:
            return []
        return self._failed(error)

    def _earliest_request(self) -> tuple[int, str, float, float] | None:
        """The request waiting that is due first: (token, command, deadline, timeout)."""
        pending = self._pending
        cut = self._cut_short
        if not pending:
            if cut:
                cut.clear()
            return None
        oldest = pending[0][0]
        while cut and cut[0][1] < oldest:
            cut.popleft()  # answered
        earliest = None
        for entry in pending:  # the oldest that waits the whole request_timeout
            if entry[3] >= self._request_timeout:
                earliest = entry
                break
        if cut and (earliest is None or cut[0][0] < earliest[2]):
            earliest = pending[cut[0][1] - oldest]
        return earliest

    # ------------------------------------------------------------------ the end

    def connection_lost(self, error: NSQError) -> list[Event]:
        """The socket is gone (or never opened): every request waiting fails with ``error``."""
        if self._state is State.CLOSED:
            return []
        events = self._fail_pending(error)
        self._set_state(State.CLOSED)
        self._hold = False
        events.append(Closed(error))
        return events

    def _failed(self, error: NSQError) -> list[Event]:
        events: list[Event] = []
        self._fail(error, events)
        return events

    def _fail(self, error: NSQError, events: list[Event]) -> None:
        events.extend(self._fail_pending(error))
        self.failure = error
        self._set_state(State.ERROR)
        self._hold = False
        events.append(SessionFailed(error))

    def _fail_pending(self, error: NSQError) -> list[Event]:
        failed: list[Event] = [RequestFailed(token, error) for token, *_ in self._pending]
        self._pending.clear()
        if self._cut_short:
            self._cut_short.clear()
        self._handshake_deadline = None
        return failed


def _expect_ok(data: bytes, step: str) -> None:
    if data != OK:
        raise ProtocolError(f"expected OK after the {step} upgrade, got {data[:40]!r}")
