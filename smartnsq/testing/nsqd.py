"""Emulated nsqd (TCP protocol V2), youzan HA flavour or classic.

Each client connection is a :class:`ClientSession`: it parses commands with the protocol
floor's server-side parser, answers with the same frames, error strings and fatal/non-fatal
behaviour as the real servers (youzan/nsq 0.3.7-HA.1.13.0 ``nsqdserver/protocol_v2.go``,
nsqio/nsq v1.3.0 ``nsqd/protocol_v2.go``; what only shows when they run is in
docs/protocol.md), and receives messages from the channels it subscribes to. Nothing of the
client's transport is used here.

Malformed commands are answered as the servers' ``protocol_v2.go`` answers them: the same
checks in the same order, the same code and text, fatal (the connection closes after the
error frame) or not. In short, for youzan nsqd:

- a bad protocol magic: the frame ``E_BAD_PROTOCOL`` (no description), then close;
- an unknown command (DPUB included): fatal ``E_INVALID invalid command [[..] ..]``; with TLS
  required, anything but IDENTIFY before the upgrade: ``cannot X in current state (TLS
  required)``;
- IDENTIFY and AUTH are allowed until SUB (a second IDENTIFY is answered again); AUTH without
  auth configured: ``E_AUTH_DISABLED AUTH Disabled``;
- argument, body-size, state, name, partition, topic-existence, auth, subscription and id
  errors are fatal; a topic partition this node does not hold is ``E_TOPIC_NOT_EXIST`` (an
  invalid topic name too, on publish), partition -1 or none is the partition this node
  leads (an ordered topic refuses that on publish, not on SUB/SUB_ORDERED);
- after a publish passed those checks, ext header problems (``E_INVALID_JSON_HEADER``, an
  empty header included; ``INVALID_TRACE_ID``; ``E_EXT_NOT_SUPPORT``) and the write itself
  (``E_FAILED_ON_NOT_LEADER``, ``E_FAILED_ON_NOT_WRITABLE``) are not fatal, in that order;
- ``E_FIN_FAILED``/``E_REQ_FAILED``/``E_TOUCH_FAILED`` are not fatal; FIN on a node that no
  longer leads the partition is fatal ``E_FAILED_ON_NOT_LEADER``, and FIN on an ordered
  channel while the partition lacks a majority of in-sync replicas fatal
  ``E_FAILED_ON_NOT_WRITABLE`` (SUB_ORDERED still succeeds and delivers; REQ and TOUCH stay
  local to the node, and FINs on other channels too).

Classic nsqd 1.x keeps its own texts (``invalid command X``, ``PUB invalid message body
size``, ``invalid message ID``...) and clamps REQ delays like youzan. The table of every
check, with the real texts, is ``tests/integration/test_cluster_tcp_error_paths.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from smartnsq.errors import ProtocolError
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from smartnsq.protocol.message import encode_message_frame
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT, OK, AuthResponse, TraceReceipt
from smartnsq.protocol.server import (
    CLASSIC_BODY_COMMANDS,
    YOUZAN_BODY_COMMANDS,
    ClientCommand,
    CommandParser,
    MpubFormatError,
    encode_error,
    encode_response,
    split_mpub,
)
from smartnsq.protocol.server_session import (
    Negotiation,
    Peer,
    ServerFeatures,
    UpgradeConflict,
    negotiate,
)
from smartnsq.protocol.validation import TRACE_ID_KEY
from smartnsq.testing.directory import CLASSIC_VERSION, YOUZAN_VERSION, Directory
from smartnsq.testing.golang import (
    JsonParseError,
    JsonValue,
    byte_to_base10,
    go_parse_bool,
    go_quote,
    json_get_string,
    json_keys,
    parse_json,
    to_int64,
)
from smartnsq.testing.offsets import (
    ConsumeOffset,
    OffsetError,
    locate_position,
    parse_position,
    seek_channel,
)
from smartnsq.testing.publish import (
    TAG_KEY,
    TOPIC_NOT_EXIST,
    PublishError,
    append_message,
    check_leader,
    check_writable,
    go_atoi,
    parse_trace_id,
    resolve_partition,
    valid_name,
)
from smartnsq.testing.state import Channel, Delivery, Partition, PartitionLog, Topic

if TYPE_CHECKING:
    from smartnsq.testing.changes import Changes
    from smartnsq.testing.topology import Topology

__all__ = ["ClientSession", "NodeSettings", "NsqdNode"]

log = logging.getLogger("smartnsq.testing.nsqd")

_READ_SIZE = 64 * 1024
_OK_FRAME = encode_response(OK)  # the answer to nearly every PUB
_BAD_PROTOCOL_FRAME = encode_error(b"E_BAD_PROTOCOL")  # a literal: no description, no space
CONSUMER_OUTPUT_BUFFER_SIZE = 4 * 1024  # youzan defaultConsumerWriteBufferSize
ZAN_TEST_KEY = "zan_test"
# The head of a message frame: size, frame type, timestamp, attempts.
_pack_plain_head = struct.Struct(">iiqH").pack


@dataclass
class NodeSettings:
    """Server options; defaults are the real servers' (``NewOptions`` in nsqd/options.go of
    youzan/nsq 0.3.7-HA.1.13.0 and nsqio/nsq v1.3.0)."""

    youzan: bool = True
    max_msg_size: int = 1024 * 1024
    max_body_size: int = 5 * 1024 * 1024
    max_rdy_count: int = 2500
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    heartbeat_interval: float = 30.0
    max_heartbeat_interval: float = 60.0
    max_req_timeout: float = 3 * 24 * 3600.0
    tls_context: ssl.SSLContext | None = None
    tls_required: bool = False
    auth_secrets: dict[str, str] = field(default_factory=dict)
    allow_ext_compatible: bool = False
    snappy: bool = True
    deflate: bool = True

    @property
    def version(self) -> str:
        return YOUZAN_VERSION if self.youzan else CLASSIC_VERSION

    def features(self) -> ServerFeatures:
        """What IDENTIFY can negotiate with this node."""
        return ServerFeatures(
            youzan=self.youzan,
            version=self.version,
            max_rdy_count=self.max_rdy_count,
            max_msg_timeout=self.max_msg_timeout,
            max_heartbeat_interval=self.max_heartbeat_interval,
            tls=self.tls_context is not None,
            snappy=self.snappy,
            deflate=self.deflate,
            auth=bool(self.auth_secrets),
        )

    @property
    def read_deadline_factor(self) -> int:
        # youzan allows 3 missed heartbeats, classic 2: the read deadline protocolV2.IOLoop
        # sets (nsqdserver/protocol_v2.go in youzan/nsq, nsqd/protocol_v2.go in nsqio/nsq).
        return 3 if self.youzan else 2


class ClientError(Exception):
    """An error frame to send; ``fatal`` closes the connection after it."""

    def __init__(self, code: str, description: str = "", *, fatal: bool = True) -> None:
        super().__init__(code)
        self.code = code
        self.description = description
        self.fatal = fatal

    @property
    def text(self) -> bytes:
        """The frame's text, ``CODE description`` (a space even with no description); Go
        formats raw command bytes into some descriptions, kept as they were."""
        return f"{self.code} {self.description}".encode("utf-8", "surrogateescape")


def _go_bytes(data: bytes) -> str:
    """Go's ``%v`` of a []byte, as youzan nsqd prints ids and params in errors."""
    return "[" + " ".join(str(b) for b in data) + "]"


def _refused(exc: PublishError, *, fatal: bool = True) -> ClientError:
    """A refusal by a shared publishing rule as an error frame: the same code and text."""
    return ClientError(exc.code, exc.description, fatal=fatal)


def _ext_not_supported(topic: Topic) -> ClientError:
    return ClientError(
        "E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic.name}", fatal=False
    )


class NsqdNode:
    """One emulated nsqd: its TCP listener (protocol V2) and what its sessions and HTTP API
    share. Its ports and whether it runs are its entry in the cluster's directory."""

    def __init__(
        self,
        index: int,
        settings: NodeSettings,
        directory: Directory,
        topology: Topology,
        changes: Changes,
        track: Callable[[asyncio.Task[Any]], None],
    ) -> None:
        self.index = index
        self.settings = settings
        self.directory = directory
        self.topology = topology
        self.changes = changes
        self.track = track  # keeps a background task until done; cancelled when all stops
        self.entry = directory.nsqds[index]
        self.classic_topics = topology.classic_topics[index]
        # a dict, not a set: what acts on every session does so in the order they came
        self.sessions: dict[ClientSession, None] = {}
        self.latency = 0.0
        self.heartbeats_enabled = True
        self.blackholed = False  # see blackhole()
        self.start_time = int(time.time())
        self._server: asyncio.base_events.Server | None = None
        self._session_ids = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self.entry.running

    @property
    def host(self) -> str:
        """The bind address."""
        return self.directory.host

    @property
    def tcp_port(self) -> int:
        return self.entry.tcp_port

    @property
    def http_port(self) -> int:
        return self.entry.http_port

    @property
    def registration_port(self) -> int:
        return self.entry.registration_port

    @property
    def tcp_address(self) -> str:
        """Where a client on this machine connects (not what nsqlookupd announces)."""
        return self.directory.tcp_address(self.entry)

    @property
    def http_address(self) -> str:
        return self.directory.http_address(self.entry)

    @property
    def announced_tcp_address(self) -> str:
        """``broadcast_address:tcp_port``: the address nsqlookupd hands out."""
        return self.directory.announced_tcp_address(self.entry)

    @property
    def name(self) -> str:
        return f"nsqd{self.index}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # The system's limit for the accept queue, as Go's net.Listen asks (asyncio's default
        # is 100): a consumer opening a thousand partitions at once would otherwise see SYNs
        # dropped and retried a second later.
        self._server = await loop.create_server(
            lambda: ClientSession(self),
            self.host,
            self.tcp_port,
            reuse_address=True,
            backlog=socket.SOMAXCONN,
        )
        self.start_time = int(time.time())
        self.directory.nsqd_started(self.index, self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop like a crash: listener closed, every connection reset."""
        self.directory.nsqd_stopped(self.index)
        if self._server is not None:
            self._server.close()
            self._server = None
        for session in list(self.sessions):
            session.abort()
        await asyncio.sleep(0)

    def next_session_label(self) -> str:
        self._session_ids += 1
        return f"{self.name}/c{self._session_ids}"

    # ------------------------------------------------------------------ topology

    def drop_sessions(self, *, producers: bool = True, consumers: bool = True) -> int:
        dropped = 0
        for session in list(self.sessions):
            is_consumer = session.channel is not None
            if (is_consumer and consumers) or (not is_consumer and producers):
                session.abort()
                dropped += 1
        return dropped

    def blackhole(self) -> None:
        """The node's network goes silent: its sessions read nothing more and what they
        write is held (no FIN, no RST), new connections are accepted and never answered.
        Stays on across a restart of the node, until :meth:`heal`."""
        self.blackholed = True
        for session in list(self.sessions):
            session.go_silent()

    def heal(self) -> None:
        """The network answers again: sessions read what waited and deliver what they
        held; those nsqd gave up on during the blackhole (read deadline) are closed."""
        self.blackholed = False
        for session in list(self.sessions):
            session.answer_again()

    def detach_consumers(self, log_: PartitionLog) -> None:
        """This node no longer serves ``log_``: its consumers leave the channel now (their
        in-flight messages go back to the queue) and their connections are closed."""
        for session in list(self.sessions):
            channel = session.channel
            if channel is not None and channel.log is log_:
                session.channel = None
                channel.remove_client(session)
                session.close_after_flush()


class ClientSession(asyncio.BufferedProtocol):
    """One client connection to an emulated nsqd."""

    def __init__(self, node: NsqdNode) -> None:
        self.node = node
        self.settings = node.settings
        self.topology = node.topology
        self.changes = node.changes
        self.label = node.next_session_label()
        youzan = self.settings.youzan
        self.parser = CommandParser(
            body_commands=YOUZAN_BODY_COMMANDS if youzan else CLASSIC_BODY_COMMANDS,
            max_body_size=self.settings.max_body_size,
            fixed_ids=youzan,
        )
        self._handlers = _YOUZAN_HANDLERS if self.settings.youzan else _CLASSIC_HANDLERS
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._inbox = memoryview(bytearray(_READ_SIZE))
        # nsqd's buffered writer: frames waiting to be written, and how many bytes of them
        self._out: list[bytes] = []
        self._out_size = 0
        self._ticker: asyncio.TimerHandle | None = None  # the output buffer timeout's flush
        self._ticker_origin = self._loop.time()
        self._codec: StreamCodec | None = None
        self._upgrading = False
        self._closed = False
        self._closing_after_flush = False
        # Written while the node is blackholed, sent on heal (TCP would retransmit it).
        self._held: list[bytes] = []
        self._expired = False  # nsqd's read deadline passed in a blackhole: closed on heal
        # identity and negotiated settings: nsqd's defaults, then what IDENTIFY set
        self.auth_identity: str | None = None
        self.tls = False
        self.peer = Peer.initial(
            youzan=youzan,
            heartbeat_interval=self.settings.heartbeat_interval,
            msg_timeout=self.settings.msg_timeout,
        )
        # subscription
        self.channel: Channel | None = None
        self.closing = False
        self.rdy = 0
        self.in_flight = 0
        self.ext_block = False
        self.detail = False
        self._plain_frames = True
        self.published = 0
        self._last_read = time.monotonic()
        self._hb_handle: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node.sessions[self] = None
        self._schedule_heartbeat()
        if self.node.blackholed:
            self.go_silent()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.node.sessions.pop(self, None)
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._leave_channel()
        self.changes.changed()

    def _leave_channel(self) -> None:
        if self.channel is not None:
            channel = self.channel
            self.channel = None
            channel.remove_client(self)
            self.topology.client_left(channel)

    # Reads land in one buffer per session (recv_into), not in a fresh 256 KiB bytes object
    # per read, whose cost swings with the allocator's state. Written here rather than
    # shared with the client's transport: the emulator uses nothing of the client's. A
    # memoryview, not the bytearray: asyncio's TLS reader fills it through slices, and a
    # slice of a bytearray is a copy (the records after the first one would be lost).

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._inbox

    def buffer_updated(self, nbytes: int) -> None:
        self._last_read = time.monotonic()
        try:
            self.parser.feed(self._inbox[:nbytes])
        except ProtocolError:
            self.abort()
            return
        self._process()

    def _process(self) -> None:
        parser = self.parser
        while not self._upgrading and not self._closed and not self._closing_after_flush:
            if self.channel is not None and self._fins_allowed():
                fins = parser.take_fins()
                if fins:
                    self._finish_many(fins)
                    continue
            try:
                command = parser.next_command()
            except ProtocolError:  # a bad protocol magic
                self._write(_BAD_PROTOCOL_FRAME)
                self.close_after_flush()
                return
            if command is None:
                return
            try:
                response = self._dispatch(command)
            except ClientError as exc:
                if exc.fatal:
                    self._fatal(exc)
                    return
                self._write(encode_error(exc.text))
                continue
            if response is OK:
                self._write(_OK_FRAME)
            elif response is not None:
                self._write(encode_response(response))

    # ------------------------------------------------------------------ output
    #
    # As nsqd writes (protocol_v2.go Send and messagePump; client_v2.go's buffered writer of
    # output_buffer_size bytes): a response or error frame is flushed as soon as it is
    # written, one write per frame, with whatever message frames were buffered before it.
    # Message frames are buffered: written once output_buffer_size bytes wait, at once when
    # the client is not ready for more (in flight >= RDY), else at the next tick of the
    # output_buffer_timeout ticker (never, with the timeout disabled). youzan flushes every
    # message frame of an ordered channel as it is written (youzan/nsq 0.3.7-HA.1.13.0,
    # nsqdserver/protocol_v2.go, protocolV2.messagePump: SendMessage's needFlush is the
    # channel's IsOrdered, and internalSend flushes when it is set): an ordered channel has
    # one message in flight, so waiting for the ticker would hold each one that long.

    def _write(self, frame: bytes) -> None:
        """A response or error frame: written now (nsqd flushes every non-message frame)."""
        self._out.append(frame)
        self._flush()

    def _flush(self) -> None:
        ticker = self._ticker
        if ticker is not None:
            ticker.cancel()
            self._ticker = None
        self._out_size = 0
        if not self._out or self.transport is None:
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        if self._codec is not None:
            data = self._codec.compress(data)
        latency = self.node.latency
        if latency > 0:
            self._loop.call_later(latency, self._raw_write, data)
        else:
            self._raw_write(data)

    def _raw_write(self, data: bytes) -> None:
        if self.node.blackholed:
            self._held.append(data)  # and a close after it waits too
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
        if self._closing_after_flush and self.transport is not None:
            self.transport.close()

    def _fatal(self, error: ClientError) -> None:
        self._write(encode_error(error.text))
        self.close_after_flush()

    def close_after_flush(self) -> None:
        """Send what is buffered, then close (how nsqd closes after a fatal error)."""
        if self._closing_after_flush:
            return
        self._closing_after_flush = True
        if self._out:
            self._flush()
        elif self.node.latency > 0:
            self._loop.call_later(self.node.latency, self._raw_write, b"")
        elif self.node.blackholed:
            self._held.append(b"")
        elif self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ blackhole

    def go_silent(self) -> None:
        """The node was blackholed: read nothing more (what the client sends waits in the
        kernel); writes are held by ``_raw_write``."""
        if self.transport is not None and not self._upgrading:
            self.transport.pause_reading()

    def answer_again(self) -> None:
        """The node was healed: a session nsqd gave up on meanwhile is closed now (nsqd's
        FIN gets through; RST if the client's unread bytes wait); the others read again and
        send what they held, closing after it when a close waited."""
        if self.transport is None or self._closed:
            return
        if self._expired:
            self.abort()
            return
        held, self._held = self._held, []
        for data in held:
            self._raw_write(data)
        if not self._upgrading and not self.transport.is_closing():
            self.transport.resume_reading()

    # ------------------------------------------------------------------ heartbeats

    def _schedule_heartbeat(self) -> None:
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        if self.peer.heartbeat_interval > 0:
            self._hb_handle = self._loop.call_later(self.peer.heartbeat_interval, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_handle = None
        if self._closed:
            return
        deadline = self.peer.heartbeat_interval * self.settings.read_deadline_factor
        if time.monotonic() - self._last_read > deadline:
            if self.node.blackholed:
                # nsqd closes the connection, but in a blackhole the client sees nothing:
                # the session leaves its channel now and is closed on heal.
                log.debug("%s: read deadline passed in a blackhole", self.label)
                self._expired = True
                self._leave_channel()
                self.changes.changed()
                return
            log.debug("%s: read deadline passed, closing", self.label)
            self.abort()
            return
        if self.node.heartbeats_enabled and not self.node.blackholed:
            self._write(encode_response(HEARTBEAT))
        self._schedule_heartbeat()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, command: ClientCommand) -> bytes | None:
        """nsqd's Exec: IDENTIFY is always allowed, then the TLS policy, then the command
        table (an unknown command is a fatal E_INVALID)."""
        name = command.name
        if self.settings.tls_required and not self.tls and name != b"IDENTIFY":
            raise ClientError("E_INVALID", f"cannot {_arg(name)} in current state (TLS required)")
        handler = self._handlers.get(name)
        if handler is None:
            if self.settings.youzan:
                words = (name, *command.params)
                shown = "[" + " ".join(_go_bytes(w) for w in words) + "]"
            else:
                shown = _arg(name)
            raise ClientError("E_INVALID", f"invalid command {shown}")
        return handler(self, command)

    def _check_auth(self, command_name: str) -> None:
        """CheckAuth: with auth enabled, nothing but IDENTIFY and AUTH before a successful AUTH.
        (The emulator's secrets allow every topic and channel.)"""
        if self.settings.auth_secrets and self.auth_identity is None:
            raise ClientError("E_AUTH_FIRST", f"AUTH required before {command_name}")

    def _sized_body(self, kind: str, command: ClientCommand) -> bytes:
        """The body of IDENTIFY or AUTH: ``<kind> body too big`` above max_body_size, ``<kind>
        invalid body size`` at 0 or below."""
        if command.body is not None:
            return command.body
        size = command.body_size or 0
        if size > self.settings.max_body_size:
            raise ClientError(
                "E_BAD_BODY", f"{kind} body too big {size} > {self.settings.max_body_size}"
            )
        raise ClientError("E_BAD_BODY", f"{kind} invalid body size {size}")

    # IDENTIFY ---------------------------------------------------------------------------

    def _identify(self, command: ClientCommand) -> bytes | None:
        # Allowed as long as the client has not subscribed: a second IDENTIFY is answered
        # like the first (the state only changes with SUB).
        if self.channel is not None:
            raise ClientError("E_INVALID", "cannot IDENTIFY in current state")
        settings = self.settings
        body = self._sized_body("IDENTIFY", command)
        data = _decode_identify(body, _YOUZAN_IDENTIFY if settings.youzan else _CLASSIC_IDENTIFY)
        features = settings.features()
        try:
            self.peer = self.peer.identified(data, features)
        except ValueError as exc:
            raise ClientError("E_BAD_BODY", f"IDENTIFY {exc}") from None
        self._ticker_origin = self._loop.time()  # messagePump starts a new ticker
        self._schedule_heartbeat()
        try:
            negotiation = negotiate(data, self.peer, features)
        except UpgradeConflict as exc:
            raise ClientError("E_IDENTIFY_FAILED", str(exc)) from None
        if not negotiation.negotiated:
            return OK  # no negotiation: no upgrade either
        self._start_upgrades(negotiation)
        return None

    def _start_upgrades(self, negotiation: Negotiation) -> None:
        """Send the IDENTIFY answer in the clear, then TLS, snappy or deflate, each followed
        by an ``OK`` in the upgraded stream (protocolV2.IDENTIFY in protocol_v2.go, youzan/nsq
        0.3.7-HA.1.13.0 and nsqio/nsq v1.3.0)."""
        self._write(encode_response(negotiation.reply))
        self._flush()
        codec: StreamCodec | None = None
        if negotiation.snappy:
            codec = SnappyCodec()
        elif negotiation.deflate:
            # level 0 (youzan's missing-level bug) stores; Go's negative levels compress
            level = negotiation.deflate_level
            codec = _StoredDeflate() if level == 0 else DeflateCodec(abs(level))
        if negotiation.tls:
            self._upgrading = True
            if self.transport is not None:
                self.transport.pause_reading()
            task = self._loop.create_task(self._upgrade_tls(codec))
            self.node.track(task)
        elif codec is not None:
            self._install_codec(codec)

    def _install_codec(self, codec: StreamCodec) -> None:
        self._codec = codec
        self.parser.install_decompressor(codec.decompress)
        self._write(encode_response(OK))

    async def _upgrade_tls(self, codec: StreamCodec | None) -> None:
        context = self.settings.tls_context
        if self.transport is None or context is None:
            return
        try:
            transport = await asyncio.wait_for(
                self._loop.start_tls(self.transport, self, context, server_side=True), 5.0
            )
        except (TimeoutError, OSError, ssl.SSLError, ConnectionError) as exc:
            log.debug("%s: TLS handshake failed: %s", self.label, exc)
            self.abort()
            return
        if transport is None:
            return
        self.transport = transport
        self.tls = True
        self._write(encode_response(OK))
        self._flush()
        if codec is not None:
            self._install_codec(codec)
        self._upgrading = False
        if self.node.blackholed:
            self.go_silent()
        self._process()

    # AUTH -------------------------------------------------------------------------------

    def _auth(self, command: ClientCommand) -> bytes | None:
        if self.channel is not None:
            raise ClientError("E_INVALID", "cannot AUTH in current state")
        if command.params:
            raise ClientError("E_INVALID", "AUTH invalid number of parameters")
        body = self._sized_body("AUTH", command)
        if self.auth_identity is not None:
            raise ClientError("E_INVALID", "AUTH Already set")
        if not self.settings.auth_secrets:
            raise ClientError("E_AUTH_DISABLED", "AUTH Disabled")
        identity = self.settings.auth_secrets.get(body.decode("utf-8", "replace"))
        if identity is None:
            raise ClientError("E_AUTH_FAILED", "AUTH failed")
        self.auth_identity = identity
        return AuthResponse(identity, "", 1).encode()

    # SUB family -------------------------------------------------------------------------

    def _sub(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB")

    def _sub_ordered(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB_ORDERED")

    def _sub_advanced(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB_ADVANCED")

    def _subscribe(self, command: ClientCommand, kind: str) -> bytes | None:
        """internalSUB, in nsqd's order of checks. Every text says SUB, whatever the kind."""
        params = command.params
        start = None
        if kind == "SUB_ADVANCED" and len(params) > 3 and params[3]:
            start = _consume_offset(params[3])  # parsed before anything else
        if self.channel is not None:
            raise ClientError("E_INVALID", "cannot SUB in current state")
        if self.peer.heartbeat_interval <= 0:
            raise ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 2:
            raise ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic_name, channel_name = _name(params[0]), _name(params[1])
        if not valid_name(topic_name):
            raise ClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[0])} is not valid")
        if not valid_name(channel_name):
            raise ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[1])} is not valid"
            )
        if not self.settings.youzan:
            self._check_auth("SUB")
            log_ = self.topology.classic_topic(self.node.index, topic_name)
            channel = self.topology.ensure_channel(log_, channel_name)
            return self._join(channel, detail=False, ext=False)

        # Only a fourth word is a partition: SUB_ADVANCED with a start position (five
        # words) subscribes to the node's default partition, whatever the third says.
        partition_id = _partition_arg(params[2]) if len(params) == 3 else -1
        self._check_auth("SUB")
        topic, partition = self._existing(topic_name, partition_id)
        if kind != "SUB_ORDERED" and topic.ordered:  # SUB_ADVANCED too (internalSUB)
            raise ClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if topic.ext and not self.peer.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_NEED",
                "this topic is extended and should identify as extend support.",
            )
        if not topic.ext and self.peer.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        try:
            check_leader(partition, self.node.index)
        except PublishError as exc:
            raise _refused(exc) from None
        if topic.disable_channel_auto_create and channel_name not in partition.log.channels:
            raise ClientError(
                "E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic."
            )
        channel = self.topology.ensure_channel(partition.log, channel_name)
        if not topic.ext:
            self.peer = replace(self.peer, desired_tag="")  # nothing on a topic without ext
        if kind == "SUB_ORDERED" and self.peer.sample_rate:
            raise ClientError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        if start is not None:
            self._apply_start(channel, start)
        if kind == "SUB_ORDERED":
            channel.make_ordered()
        return self._join(channel, detail=kind != "SUB", ext=topic.ext)

    def _switch_to_consumer(self, channel: Channel) -> None:
        """youzan's ClientV2.SwitchToConsumer: its 100 B default suits producers; on SUB to
        a durable channel a client that chose no output_buffer_size, without TLS or
        compression, gets 4 KiB (so consumed messages wait for 4 KiB or the ticker)."""
        if channel.name.endswith("#ephemeral") or self.peer.buffer_size_chosen:
            return
        if self.tls or self._codec is not None:
            return
        self.peer = replace(self.peer, output_buffer_size=CONSUMER_OUTPUT_BUFFER_SIZE)

    def _apply_start(self, channel: Channel, start: ConsumeOffset) -> None:
        """internalSUB's SetChannelOffset (the same search as ``/channel/setoffset``), for
        the channel's first client only; nsqd refuses a position it cannot place with a fatal
        E_INVALID. The first messages keep their queue order (see ``testing.offsets``)."""
        if channel.clients or channel.in_flight:
            return  # only honoured for the first client of a channel
        try:
            index = locate_position(channel.log, start)
        except OffsetError as exc:
            raise ClientError("E_INVALID", str(exc)) from None
        seek_channel(channel, index, reorder=False)

    def _join(self, channel: Channel, *, detail: bool, ext: bool) -> bytes:
        if self.settings.youzan:
            self._switch_to_consumer(channel)
        self.channel = channel
        self.detail = detail
        self.ext_block = ext and self.peer.extend_support
        self._plain_frames = not (self.detail or self.ext_block)
        channel.add_client(self)
        self.changes.changed()
        return OK

    def _existing(self, topic_name: str, partition_id: int) -> tuple[Topic, Partition]:
        """getExistingTopic: the topic partition hosted here (leader or replica); -1 is the
        partition this node leads. Anything else is E_TOPIC_NOT_EXIST (names nsqd would
        refuse elsewhere simply do not exist)."""
        if partition_id < -1:
            raise ClientError(TOPIC_NOT_EXIST, "")
        try:
            return resolve_partition(
                self.topology.topics, self.node.index, topic_name, partition_id
            )
        except PublishError as exc:
            raise _refused(exc) from None

    # PUB family (youzan) ------------------------------------------------------------------

    def _prepare_pub(
        self, command: ClientCommand, *, batch: bool
    ) -> tuple[Topic, Partition, bytes]:
        """preparePub: arguments, body size, the topic partition, then the ordered-topic and
        auth checks. Shared by every PUB and MPUB variant; their errors say no command."""
        params = command.params
        if not params:
            raise ClientError("E_INVALID", "insufficient number of parameters")
        # Only a third word is a partition ("PUB t 0 x" goes to the default partition); -1
        # is the default partition too.
        partition_id = _partition_arg(params[1]) if len(params) == 2 else -1
        size, body = _body(command)
        limit = self.settings.max_body_size if batch else self.settings.max_msg_size
        if size <= 0:
            raise ClientError("E_BAD_BODY", f"invalid body size {size}")
        if size > limit or body is None:
            if batch:
                raise ClientError("E_BAD_BODY", f"body too big {size} > {limit}")
            raise ClientError("E_BAD_MESSAGE", f"message too big {size} > {limit}")
        topic, partition = self._existing(_name(params[0]), partition_id)
        if partition_id == -1 and topic.ordered:
            raise ClientError(
                "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
            )
        if self.settings.auth_secrets:
            self._check_auth("PUB")
        return topic, partition, body

    def _writable(self, partition: Partition) -> PartitionLog:
        """The write itself: refused without being fatal when this node is not the leader
        (or has lost its quorum), after every other check passed."""
        try:
            check_writable(partition, self.node.index)
        except PublishError as exc:
            raise _refused(exc, fatal=False) from None
        return partition.log

    def _published(self, count: int) -> None:
        self.published += count
        self.changes.changed()

    def _pub(self, command: ClientCommand) -> bytes | None:
        if not self.settings.youzan:
            return self._classic_pub(command)
        _, partition, body = self._prepare_pub(command, batch=False)
        self._writable(partition).append(body)
        self._published(1)
        return OK

    def _pub_trace(self, command: ClientCommand) -> bytes | None:
        _, partition, body = self._prepare_pub(command, batch=False)
        if len(body) <= 8:
            raise ClientError("E_BAD_BODY", f"invalid body size {len(body)} with trace id enabled")
        trace_id = int.from_bytes(body[:8], "big")
        record = self._writable(partition).append(body[8:], trace_id=trace_id)
        self._published(1)
        return TraceReceipt(record.internal_id, trace_id, record.offset, record.raw_size).encode()

    def _pub_ext(self, command: ClientCommand) -> bytes | None:
        topic, partition, body = self._prepare_pub(command, batch=False)
        size = len(body)
        if size <= 2:
            raise ClientError(
                "E_BAD_BODY", f"invalid body size {size} with ext json header enabled"
            )
        json_len = int.from_bytes(body[:2], "big")
        if size <= 2 + json_len:
            raise ClientError(
                "E_BAD_BODY", f"invalid body size {size} in ext json header content length"
            )
        raw = body[2 : 2 + json_len]
        # An empty header is parsed too, and refused, on any topic.
        header = _ext_header(raw)
        trace_text, trace_id = _ext_trace_id(header)
        stored = self._ext_for_topic(topic, header)
        log_ = self._writable(partition)
        record = append_message(
            log_,
            body[2 + json_len :],
            trace_id=trace_id,
            header=stored,
            raw_header=raw if stored is not None else b"",
        )
        self._published(1)
        if trace_text is not None:
            return TraceReceipt(
                record.internal_id, trace_id, record.offset, record.raw_size
            ).encode()
        return OK

    def _ext_for_topic(self, topic: Topic, header: JsonValue) -> dict[str, Any] | None:
        """What is stored of a valid ext header: on an ext topic the header (with its dispatch
        tag); on another topic nothing, if nsqd runs with allow_ext_compatible and every key
        is internal (``##...``, ``zan_test``); E_EXT_NOT_SUPPORT otherwise."""
        if topic.ext:
            try:
                tag = json_get_string(header, TAG_KEY)
            except TypeError:
                tag = None
            return {TAG_KEY: tag} if tag is not None else {}
        if self.settings.allow_ext_compatible and all(
            key == ZAN_TEST_KEY or key.startswith("##") for key in json_keys(header)
        ):
            return None
        raise _ext_not_supported(topic)

    def _mpub(self, command: ClientCommand) -> bytes | None:
        if not self.settings.youzan:
            return self._classic_mpub(command)
        _, partition, body = self._prepare_pub(command, batch=True)
        messages, malformed = self._batch(body)
        if malformed is not None:
            raise malformed
        self._writable(partition).extend(messages)
        self._published(len(messages))
        return OK

    def _mpub_trace(self, command: ClientCommand) -> bytes | None:
        _, partition, body = self._prepare_pub(command, batch=True)
        elements, malformed = self._batch(body)
        messages = []
        for index, element in enumerate(elements):
            if len(element) <= 8:
                raise ClientError(
                    "E_BAD_MESSAGE",
                    f"MPUB invalid message({index}) body size {len(element)} for tracing",
                )
            messages.append((element[8:], int.from_bytes(element[:8], "big")))
        if malformed is not None:
            raise malformed
        log_ = self._writable(partition)
        records = [log_.append(payload, trace_id=trace_id) for payload, trace_id in messages]
        self._published(len(records))
        total = sum(r.raw_size for r in records)
        return TraceReceipt(records[0].internal_id, 0, records[0].offset, total).encode()

    def _mpub_ext(self, command: ClientCommand) -> bytes | None:
        topic, partition, body = self._prepare_pub(command, batch=True)
        elements, malformed = self._batch(body)
        messages = [self._ext_element(topic, element) for element in elements]
        if malformed is not None:
            raise malformed
        log_ = self._writable(partition)  # all or nothing
        for payload, trace_id, stored, raw in messages:
            append_message(log_, payload, trace_id=trace_id, header=stored, raw_header=raw)
        self._published(len(messages))
        return OK

    def _ext_element(
        self, topic: Topic, element: bytes
    ) -> tuple[bytes, int, dict[str, Any] | None, bytes]:
        """One MPUB_EXT element ``[uint16 len][json][payload]``: payload, trace id, the header
        to store (None: none) and its raw JSON. A zero length means no header, on any topic."""
        size = len(element)
        json_len = int.from_bytes(element[:2], "big")
        # (nsqd itself crashes on a 1-byte element; refused here like a short one)
        if size < 2 or size <= 2 + json_len:
            raise ClientError(
                "E_BAD_BODY", f"invalid body size {size} in ext json header content length"
            )
        payload = element[2 + json_len :]
        if json_len == 0:
            return payload, 0, None, b""
        if not topic.ext and not self.settings.allow_ext_compatible:
            raise _ext_not_supported(topic)
        raw = element[2 : 2 + json_len]
        header = _ext_header(raw)
        _, trace_id = _ext_trace_id(header)
        stored = self._ext_for_topic(topic, header)
        return payload, trace_id, stored, raw if stored is not None else b""

    def _batch(self, body: bytes) -> tuple[list[bytes], ClientError | None]:
        """The elements of an MPUB body and, if it is malformed, the error nsqd answers once
        it has read (and checked) the elements before the bad one."""
        settings = self.settings
        try:
            return split_mpub(body, settings.max_msg_size, settings.max_body_size), None
        except MpubFormatError as exc:
            code = "E_BAD_BODY" if exc.reason == "count" else "E_BAD_MESSAGE"
            return exc.elements, ClientError(code, str(exc))

    # PUB family (classic) -----------------------------------------------------------------

    def _classic_topic(self, kind: str, command: ClientCommand, words: int = 1) -> PartitionLog:
        params = command.params
        if len(params) < words:
            raise ClientError("E_INVALID", f"{kind} insufficient number of parameters")
        name = _name(params[0])
        if not valid_name(name):
            # nsqd 1.x really repeats the code in MPUB's text
            prefix = "E_BAD_TOPIC " if kind == "MPUB" else ""
            raise ClientError(
                "E_BAD_TOPIC", f"{prefix}{kind} topic name {go_quote(params[0])} is not valid"
            )
        return self.topology.classic_topic(self.node.index, name)

    def _classic_message(self, kind: str, command: ClientCommand) -> bytes:
        """A single message body: E_BAD_MESSAGE when empty or above max_msg_size."""
        size, body = _body(command)
        limit = self.settings.max_msg_size
        if size <= 0:
            raise ClientError("E_BAD_MESSAGE", f"{kind} invalid message body size {size}")
        if size > limit or body is None:
            raise ClientError("E_BAD_MESSAGE", f"{kind} message too big {size} > {limit}")
        return body

    def _classic_pub(self, command: ClientCommand) -> bytes | None:
        log_ = self._classic_topic("PUB", command)
        body = self._classic_message("PUB", command)
        self._check_auth("PUB")
        log_.append(body)
        self._published(1)
        return OK

    def _classic_mpub(self, command: ClientCommand) -> bytes | None:
        log_ = self._classic_topic("MPUB", command)
        self._check_auth("MPUB")
        size, body = _body(command)
        limit = self.settings.max_body_size
        if size <= 0:
            raise ClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > limit or body is None:
            raise ClientError("E_BAD_BODY", f"MPUB body too big {size} > {limit}")
        messages, malformed = self._batch(body)
        if malformed is not None:
            raise malformed
        log_.extend(messages)
        self._published(len(messages))
        return OK

    def _dpub(self, command: ClientCommand) -> bytes | None:
        log_ = self._classic_topic("DPUB", command, words=2)
        text = command.params[1]
        try:
            delay_ms = byte_to_base10(text)
        except ValueError:
            raise ClientError("E_INVALID", f"DPUB could not parse timeout {_arg(text)}") from None
        max_ms = int(self.settings.max_req_timeout * 1000)
        delay_ns = to_int64(to_int64(delay_ms) * 1_000_000)
        if not 0 <= delay_ns <= max_ms * 1_000_000:
            raise ClientError("E_INVALID", f"DPUB timeout {delay_ms} out of range 0-{max_ms}")
        body = self._classic_message("DPUB", command)
        self._check_auth("DPUB")
        record = log_.append(body)
        record.not_before = time.monotonic() + delay_ns / 1e9
        self._published(1)
        return OK

    # consumer commands ------------------------------------------------------------------

    def _rdy(self, command: ClientCommand) -> bytes | None:
        if self.closing:
            return None  # RDY after CLS is ignored
        if self.channel is None:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        count = 1  # a bare RDY means 1
        if command.params:
            try:
                count = to_int64(byte_to_base10(command.params[0]))
            except ValueError:
                raise ClientError(
                    "E_INVALID", f"RDY could not parse count {_arg(command.params[0])}"
                ) from None
        if not 0 <= count <= self.settings.max_rdy_count:
            raise ClientError(
                "E_INVALID", f"RDY count {count} out of range 0-{self.settings.max_rdy_count}"
            )
        self.rdy = count
        self.channel.schedule_pump()
        return None

    def _subscribed(self, name: str) -> Channel:
        channel = self.channel
        if channel is None:
            raise ClientError("E_INVALID", f"cannot {name} in current state")
        return channel

    def _message_id(self, name: str, command: ClientCommand, words: int = 1) -> bytes:
        params = command.params
        if len(params) < words:
            raise ClientError("E_INVALID", f"{name} insufficient number of params")
        message_id = params[0]
        if len(message_id) != 16:
            text = "Invalid Message ID" if self.settings.youzan else "invalid message ID"
            raise ClientError("E_INVALID", text)
        return message_id

    def _id_failed(self, code: str, name: str, message_id: bytes) -> ClientError:
        if self.settings.youzan:
            shown = _go_bytes(message_id)
            reason = "failed ErrType:7 ErrCode:0 : Message ID not in flight"
        else:
            shown = message_id.decode("ascii", "replace")
            reason = "failed ID not in flight"
        return ClientError(code, f"{name} {shown} {reason}", fatal=False)

    def _fin(self, command: ClientCommand) -> bytes | None:
        channel = self._subscribed("FIN")
        message_id = self._message_id("FIN", command)
        if self.settings.youzan:
            if not _valid_internal_id(message_id):
                raise ClientError("E_INVALID", "Invalid Message ID")
            partition = self.topology.partition_of(channel.log)
            if partition is not None and partition.leader != self.node.index:
                raise ClientError("E_FAILED_ON_NOT_LEADER", "")
            if partition is not None and channel.ordered and not partition.in_sync:
                # FinishMessageToCluster: an ordered channel's confirmation needs a majority
                # of in-sync replicas (a cluster error, so fatal), whatever the id
                raise ClientError("E_FAILED_ON_NOT_WRITABLE", "")
        if not channel.finish(message_id, self):
            raise self._id_failed("E_FIN_FAILED", "FIN", message_id)
        self.changes.changed()
        return None

    def _fins_allowed(self) -> bool:
        """Whether a FIN now would pass every check of :meth:`_dispatch` and :meth:`_fin`
        but the id's, so a run of FINs can skip them (the fast path of a consumer)."""
        if self.settings.tls_required and not self.tls:
            return False
        channel = self.channel
        if channel is None:
            return False
        partition = self.topology.partition_of(channel.log)
        return partition is None or (
            partition.leader == self.node.index and (partition.in_sync or not channel.ordered)
        )

    def _finish_many(self, message_ids: list[bytes]) -> None:
        """A run of FINs, answered as :meth:`_fin` answers each of them."""
        channel = self.channel
        if channel is None:
            return
        invalid = _first_invalid_id(message_ids) if self.settings.youzan else None
        if invalid is not None:
            message_ids = message_ids[:invalid]
        failed = channel.finish_many(message_ids, self) if message_ids else []
        for message_id in failed:
            self._write(encode_error(self._id_failed("E_FIN_FAILED", "FIN", message_id).text))
        if len(failed) < len(message_ids):
            self.changes.changed()
        if invalid is not None:
            self._fatal(ClientError("E_INVALID", "Invalid Message ID"))

    def _req(self, command: ClientCommand) -> bytes | None:
        channel = self._subscribed("REQ")
        message_id = self._message_id("REQ", command, words=2)
        text = command.params[1]
        try:
            timeout_ms = to_int64(byte_to_base10(text))
        except ValueError:
            # youzan prints the raw id too
            shown = f"{_arg(message_id)}, {_arg(text)}" if self.settings.youzan else _arg(text)
            raise ClientError("E_INVALID", f"REQ could not parse timeout {shown}") from None
        # both flavours clamp the delay into 0..max_req_timeout
        timeout_ns = to_int64(timeout_ms * 1_000_000)
        max_ns = int(self.settings.max_req_timeout * 1e9)
        delay = min(max(timeout_ns, 0), max_ns) / 1e9
        if channel.ordered and delay > 0:
            return None  # youzan ignores a delayed REQ on an ordered channel, known id or not
        if not channel.requeue_message(message_id, self, delay):
            raise self._id_failed("E_REQ_FAILED", "REQ", message_id)
        self.changes.changed()
        return None

    def _touch(self, command: ClientCommand) -> bytes | None:
        channel = self._subscribed("TOUCH")
        message_id = self._message_id("TOUCH", command)
        if not channel.touch(message_id, self):
            raise self._id_failed("E_TOUCH_FAILED", "TOUCH", message_id)
        return None

    def _cls(self, command: ClientCommand) -> bytes | None:
        if self.channel is None or self.closing:
            raise ClientError("E_INVALID", "cannot CLS in current state")
        self.closing = True
        self.rdy = 0
        return CLOSE_WAIT

    def _nop(self, command: ClientCommand) -> bytes | None:
        return None

    def _internal_create_topic(self, command: ClientCommand) -> bytes | None:
        params = command.params
        if len(params) < 2:
            raise ClientError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        if not valid_name(_name(params[0])):
            raise ClientError("E_BAD_TOPIC", f"topic name {go_quote(params[0])} is not valid")
        partition = _partition_arg(params[1])
        self._check_auth("CREATE_TOPIC")
        if partition < 0:
            raise ClientError("E_BAD_PARTITION", "partition should not less than 0")
        if len(params) >= 3:
            try:
                go_parse_bool(params[2])
            except ValueError as exc:
                raise ClientError("E_BAD_EXT", f"topic ext is not valid: {exc}") from None
        # the emulated nodes always run with the cluster coordinator
        raise ClientError(
            "E_CREATE_TOPIC_FAILED",
            "CREATE_TOPIC is not allowed here while cluster feature enabled.",
            fatal=False,
        )

    # ------------------------------------------------------------------ delivery

    def deliver_many(self, deliveries: list[Delivery]) -> None:
        out = self._out
        added = 0
        if self._plain_frames:
            # encode_message_frame's bytes without its generality: the layout has no ext or
            # detail block, so a frame is [head][id][body].
            for delivery in deliveries:
                record = delivery.record
                body = record.body
                size = len(body)
                out.append(_pack_plain_head(30 + size, 2, record.timestamp, delivery.attempts))
                out.append(record.id)
                out.append(body)
                added += 34 + size
        else:
            ext = self.ext_block
            detail = self.detail
            for delivery in deliveries:
                record = delivery.record
                frame = encode_message_frame(
                    record.timestamp,
                    delivery.attempts,
                    record.id,
                    record.body,
                    ext_version=record.ext_version if ext else None,
                    ext_raw=record.ext_raw,
                    offset=record.offset if detail else None,
                    raw_size=record.raw_size if detail else None,
                )
                out.append(frame)
                added += len(frame)
        self._buffered(added)

    def _buffered(self, size: int) -> None:
        """``size`` bytes of message frames were buffered: flush as nsqd's pump would."""
        self._out_size += size
        channel = self.channel
        if (
            self._out_size >= self.peer.output_buffer_size
            or self.in_flight >= self.rdy
            or (channel is not None and channel.ordered)
        ):
            self._flush()  # the buffer is full, the client is not ready, or ordered delivery
        elif self._ticker is None and self.peer.output_buffer_timeout > 0:
            period = self.peer.output_buffer_timeout / 1000
            phase = (self._loop.time() - self._ticker_origin) % period
            self._ticker = self._loop.call_later(period - phase, self._tick)

    def _tick(self) -> None:
        self._ticker = None
        self._flush()


class _StoredDeflate(DeflateCodec):
    """youzan's deflate_level 0 (its missing-level bug): stored blocks, still raw deflate."""

    def __init__(self) -> None:
        import zlib

        super().__init__(1)
        self._compressor = zlib.compressobj(0, zlib.DEFLATED, -15)


def _body(command: ClientCommand) -> tuple[int, bytes | None]:
    """A body command's size as sent, and its body (None when the size was out of the
    parser's range: 0 or less, or above max_body_size, which nothing accepts)."""
    body = command.body
    return (len(body) if body is not None else command.body_size or 0), body


def _arg(data: bytes) -> str:
    """A command word as Go's ``%s`` prints it (bytes kept as they are)."""
    return data.decode("utf-8", "surrogateescape")


def _name(data: bytes) -> str:
    """A topic or channel name as looked up (bytes that are not UTF-8 make it invalid)."""
    return data.decode("utf-8", "replace")


def _partition_arg(data: bytes) -> int:
    if data.isdigit() and len(data) < 19:  # the usual case, within int64 (bytes: ASCII only)
        return int(data)
    try:
        return go_atoi(_arg(data))
    except ValueError as exc:
        raise ClientError("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None


def _consume_offset(data: bytes) -> ConsumeOffset:
    """SUB_ADVANCED's start position ``<type>:<value>`` (ConsumeOffset.FromBytes)."""
    try:
        return parse_position(data)
    except OffsetError as exc:
        raise ClientError("E_INVALID", str(exc)) from None


def _valid_internal_id(message_id: bytes) -> bool:
    """youzan refuses a FIN whose internal id (the first 8 bytes, as int64) is not positive."""
    return int.from_bytes(message_id[:8], "big", signed=True) > 0


def _first_invalid_id(message_ids: list[bytes]) -> int | None:
    """The index of the first id of a FIN run :func:`_valid_internal_id` refuses (all of
    them unpacked at once: this runs for every FIN of a consumer)."""
    internal = struct.unpack(">" + "q8x" * len(message_ids), b"".join(message_ids))
    if min(internal) > 0:
        return None
    return next(i for i, value in enumerate(internal) if value <= 0)


def _ext_header(raw: bytes) -> JsonValue:
    """An ext header as youzan nsqd validates it (fastjson; an empty one does not parse)."""
    try:
        return parse_json(raw)
    except JsonParseError as exc:
        raise ClientError(
            "E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}", fatal=False
        ) from None


def _ext_trace_id(header: JsonValue) -> tuple[str | None, int]:
    """The header's ``##trace_id``: (its text or None, its value); INVALID_TRACE_ID when it
    is not a string of decimal digits within uint64."""
    try:
        text = json_get_string(header, TRACE_ID_KEY)
    except TypeError:
        raise ClientError(
            "INVALID_TRACE_ID", "passin trace id should be string", fatal=False
        ) from None
    if text is None:
        return None, 0
    value = parse_trace_id(text)
    if value is None:
        raise ClientError("INVALID_TRACE_ID", "invalid trace id", fatal=False)
    return text, value


# IDENTIFY's JSON fields and their Go types (nsqd's IdentifyDataV2); other keys are ignored.
_CLASSIC_IDENTIFY: dict[str, str] = {
    "client_id": "string",
    "hostname": "string",
    "heartbeat_interval": "int",
    "output_buffer_size": "int",
    "output_buffer_timeout": "int",
    "feature_negotiation": "bool",
    "tls_v1": "bool",
    "deflate": "bool",
    "deflate_level": "int",
    "snappy": "bool",
    "sample_rate": "int32",
    "user_agent": "string",
    "msg_timeout": "int",
}
_YOUZAN_IDENTIFY: dict[str, str] = {
    **_CLASSIC_IDENTIFY,
    "short_id": "string",
    "long_id": "string",
    "desired_tag": "string",
    "extend_support": "bool",
    "ext_filter": "object",
}
_INT_RANGES = {"int": (-(1 << 63), (1 << 63) - 1), "int32": (-(1 << 31), (1 << 31) - 1)}


class _JsonObject(list[tuple[str, Any]]):
    """A decoded JSON object, members in order (Go matches keys one by one)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def _decode_identify(body: bytes, fields: dict[str, str]) -> dict[str, Any]:
    """``json.Unmarshal`` of IDENTIFY's body into nsqd's struct: an object (or null); keys
    matched exactly, else without regard to case, the last one winning; a value of the wrong
    type is an error; null leaves a field unset."""
    try:
        data = json.loads(body, object_pairs_hook=_JsonObject, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        data = False
    if data is None:
        return {}
    if not isinstance(data, _JsonObject):
        raise ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    folded = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    for key, value in data:
        name = key if key in fields else folded.get(key.lower())
        if name is None or value is None:
            continue
        kind = fields[name]
        if kind == "string":
            ok = isinstance(value, str)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "object":
            ok = isinstance(value, _JsonObject)
        else:
            low, high = _INT_RANGES[kind]
            ok = type(value) is int and low <= value <= high
        if not ok:
            raise ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        out[name] = value
    return out


_Handler = Callable[[ClientSession, ClientCommand], "bytes | None"]
_HANDLERS: dict[bytes, _Handler] = {
    b"IDENTIFY": ClientSession._identify,
    b"AUTH": ClientSession._auth,
    b"SUB": ClientSession._sub,
    b"SUB_ORDERED": ClientSession._sub_ordered,
    b"SUB_ADVANCED": ClientSession._sub_advanced,
    b"PUB": ClientSession._pub,
    b"MPUB": ClientSession._mpub,
    b"DPUB": ClientSession._dpub,
    b"PUB_TRACE": ClientSession._pub_trace,
    b"MPUB_TRACE": ClientSession._mpub_trace,
    b"PUB_EXT": ClientSession._pub_ext,
    b"MPUB_EXT": ClientSession._mpub_ext,
    b"RDY": ClientSession._rdy,
    b"FIN": ClientSession._fin,
    b"REQ": ClientSession._req,
    b"TOUCH": ClientSession._touch,
    b"CLS": ClientSession._cls,
    b"NOP": ClientSession._nop,
    b"INTERNAL_CREATE_TOPIC": ClientSession._internal_create_topic,
}

# The command table of each flavour (a session picks one); any other command is answered
# E_INVALID "invalid command". youzan nsqd has no DPUB, classic nsqd none of the extensions.
_YOUZAN_HANDLERS: dict[bytes, _Handler] = {n: h for n, h in _HANDLERS.items() if n != b"DPUB"}
_CLASSIC_HANDLERS: dict[bytes, _Handler] = {
    name: _HANDLERS[name]
    for name in (
        b"IDENTIFY",
        b"AUTH",
        b"SUB",
        b"PUB",
        b"MPUB",
        b"DPUB",
        b"RDY",
        b"FIN",
        b"REQ",
        b"TOUCH",
        b"CLS",
        b"NOP",
    )
}
