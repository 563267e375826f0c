"""Emulated nsqd (TCP protocol V2), youzan HA flavour or classic.

Each client connection is a :class:`ClientSession`: it parses commands with the protocol
floor's server-side parser, answers with the same frames, error strings and fatal/non-fatal
behaviour as the real servers recorded in ``../shared/captures``, and receives messages from
the channels it subscribes to. Nothing of the client's transport is used here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smartnsq.errors import ProtocolError
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec, StreamCodec
from smartnsq.protocol.identify import IdentifyResponse
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
from smartnsq.protocol.validation import MAX_DPUB_DELAY_MS, TRACE_ID_KEY
from smartnsq.testing.publish import (
    PublishError,
    append_message,
    check_leader,
    check_writable,
    go_atoi,
    header_trace_id,
    resolve_partition,
    valid_name,
)
from smartnsq.testing.state import Channel, Delivery, Partition, PartitionLog, Topic

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["ClientSession", "NodeSettings", "NsqdNode"]

log = logging.getLogger("smartnsq.testing.nsqd")

YOUZAN_VERSION = "0.3.7-HA.1.13.0"
CLASSIC_VERSION = "1.3.0"
_READ_SIZE = 64 * 1024
_OK_FRAME = encode_response(OK)  # the answer to nearly every PUB
# The head of a message frame: size, frame type, timestamp, attempts.
_pack_plain_head = struct.Struct(">iiqH").pack


@dataclass
class NodeSettings:
    """Server options; defaults are the real servers' (PROTOCOL.md section 11)."""

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

    @property
    def read_deadline_factor(self) -> int:
        # youzan allows 3 missed heartbeats, classic 2 (PROTOCOL.md section 1).
        return 3 if self.youzan else 2


class ClientError(Exception):
    """An error frame to send; ``fatal`` closes the connection after it."""

    def __init__(self, code: str, description: str = "", *, fatal: bool = True) -> None:
        super().__init__(code)
        self.code = code
        self.description = description
        self.fatal = fatal

    @property
    def text(self) -> str:
        return f"{self.code} {self.description}"


# An ext element of PUB_EXT/MPUB_EXT: raw header, header, payload, trace id text and value.
_ExtElement = tuple[bytes, "dict[str, Any] | None", bytes, "str | None", int]


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
    """One emulated nsqd: a TCP listener (protocol V2) and an HTTP listener."""

    def __init__(self, cluster: Cluster, index: int, settings: NodeSettings) -> None:
        self.cluster = cluster
        self.index = index
        self.settings = settings
        self.host = cluster.host  # bind address
        self.tcp_port = cluster.planned_port(index, "tcp")
        self.http_port = 0
        self.running = False
        self.sessions: set[ClientSession] = set()
        self.latency = 0.0
        self.heartbeats_enabled = True
        self.start_time = int(time.time())
        self.classic_topics: dict[str, PartitionLog] = {}
        self.registration_port = 0
        self._server: asyncio.base_events.Server | None = None
        self._session_ids = 0

    # ------------------------------------------------------------------ lifecycle

    @property
    def tcp_address(self) -> str:
        """Where a client on this machine connects (not what nsqlookupd announces)."""
        return f"{self.cluster.local_host}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"{self.cluster.local_host}:{self.http_port}"

    @property
    def announced_tcp_address(self) -> str:
        """``broadcast_address:tcp_port``: the address nsqlookupd hands out."""
        return f"{self.cluster.broadcast_address}:{self.tcp_port}"

    @property
    def name(self) -> str:
        return f"nsqd{self.index}"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientSession(self), self.host, self.tcp_port, reuse_address=True
        )
        self.tcp_port = self._server.sockets[0].getsockname()[1]
        self.running = True
        self.start_time = int(time.time())
        self.cluster.registrations += 1
        # A stand-in for the ephemeral port of nsqd's connection to nsqlookupd: it changes
        # on every restart, like the "id"/"remote_address" lookupd reports.
        self.registration_port = 30000 + (self.cluster.registrations * 7 + self.index) % 30000

    async def stop(self) -> None:
        """Stop like a crash: listener closed, every connection reset."""
        self.running = False
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
        self.cluster = node.cluster
        self.label = node.next_session_label()
        body_commands = YOUZAN_BODY_COMMANDS if self.settings.youzan else CLASSIC_BODY_COMMANDS
        self.parser = CommandParser(
            body_commands=body_commands, max_body_size=self.settings.max_body_size
        )
        self._handlers = _YOUZAN_HANDLERS if self.settings.youzan else _CLASSIC_HANDLERS
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._inbox = memoryview(bytearray(_READ_SIZE))
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._codec: StreamCodec | None = None
        self._upgrading = False
        self._closed = False
        self._closing_after_flush = False
        # identity and negotiated settings
        self.identified = False
        self.authed = not self.settings.auth_secrets
        self.tls = False
        self.heartbeat_interval = self.settings.heartbeat_interval
        self.msg_timeout = self.settings.msg_timeout
        self.extend_support = False
        self.desired_tag = ""
        self.sample_rate = 0
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
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
        self.node.sessions.add(self)
        self._schedule_heartbeat()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.node.sessions.discard(self)
        if self._hb_handle is not None:
            self._hb_handle.cancel()
        if self.channel is not None:
            channel = self.channel
            self.channel = None
            channel.remove_client(self)
            self.cluster.client_left(channel)
        self.cluster.changed()

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
            except ProtocolError as exc:
                self._fatal(ClientError("E_BAD_PROTOCOL", str(exc)))
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

    def _write(self, frame: bytes) -> None:
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
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
        elif self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------------ heartbeats

    def _schedule_heartbeat(self) -> None:
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        if self.heartbeat_interval > 0:
            self._hb_handle = self._loop.call_later(self.heartbeat_interval, self._heartbeat)

    def _heartbeat(self) -> None:
        self._hb_handle = None
        if self._closed:
            return
        deadline = self.heartbeat_interval * self.settings.read_deadline_factor
        if time.monotonic() - self._last_read > deadline:
            log.debug("%s: read deadline passed, closing", self.label)
            self.abort()
            return
        if self.node.heartbeats_enabled:
            self._write(encode_response(HEARTBEAT))
        self._schedule_heartbeat()

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, command: ClientCommand) -> bytes | None:
        name = command.name
        handler = self._handlers.get(name)
        if handler is None:
            words = (name, *command.params)
            raise ClientError(
                "E_INVALID", "invalid command " + "[" + " ".join(_go_bytes(w) for w in words) + "]"
            )
        if self.settings.tls_required and not self.tls and name != b"IDENTIFY":
            raise ClientError(
                "E_INVALID", f"cannot {name.decode()} in current state (TLS required)"
            )
        return handler(self, command)

    def _need_auth(self, name: str) -> None:
        if not self.authed:
            raise ClientError("E_AUTH_FIRST", f"AUTH required before {name}")

    # IDENTIFY ---------------------------------------------------------------------------

    def _identify(self, command: ClientCommand) -> bytes | None:
        if self.identified or self.channel is not None:
            raise ClientError("E_INVALID", "cannot IDENTIFY in current state")
        body = command.body
        if body is None:
            raise ClientError("E_BAD_BODY", f"IDENTIFY invalid body size {command.body_size}")
        try:
            data = json.loads(body)
        except ValueError:
            raise ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        if not isinstance(data, dict):
            raise ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        self.identified = True
        settings = self.settings
        self.client_id = str(data.get("client_id", data.get("short_id", "")))
        self.hostname = str(data.get("hostname", data.get("long_id", "")))
        self.user_agent = str(data.get("user_agent", ""))

        hb = _int(data, "heartbeat_interval")
        if hb == -1:
            self.heartbeat_interval = 0.0
        elif hb == 0:
            self.heartbeat_interval = settings.heartbeat_interval
        elif 1000 <= hb <= settings.max_heartbeat_interval * 1000:
            self.heartbeat_interval = hb / 1000
        else:
            raise ClientError("E_BAD_BODY", f"IDENTIFY heartbeat interval ({hb}) is invalid")
        self._schedule_heartbeat()

        obs = _int(data, "output_buffer_size")
        if obs not in (-1, 0) and not obs >= 64:
            raise ClientError("E_BAD_BODY", f"IDENTIFY output buffer size ({obs}) is invalid")
        obt = _int(data, "output_buffer_timeout")
        if obt not in (-1, 0) and not 1 <= obt <= 1000:
            raise ClientError("E_BAD_BODY", f"IDENTIFY output buffer timeout ({obt}) is invalid")
        rate = _int(data, "sample_rate")
        if not 0 <= rate <= 99:
            raise ClientError("E_BAD_BODY", f"IDENTIFY sample rate ({rate}) is invalid")
        self.sample_rate = rate
        mt = _int(data, "msg_timeout")
        if mt != 0:
            if not 1000 <= mt <= settings.max_msg_timeout * 1000:
                raise ClientError(
                    "E_BAD_BODY",
                    f"IDENTIFY msg timeout ({mt}) is invalid, "
                    f"max {int(settings.max_msg_timeout * 1000)}",
                )
            self.msg_timeout = mt / 1000
        tag = data.get("desired_tag", "")
        if not isinstance(tag, str) or len(tag) > 100:
            raise ClientError("E_BAD_BODY", "IDENTIFY desired tag is invalid")
        self.extend_support = bool(data.get("extend_support", False)) and settings.youzan
        self.desired_tag = tag if settings.youzan else ""

        want_tls = bool(data.get("tls_v1")) and settings.tls_context is not None
        want_snappy = bool(data.get("snappy")) and settings.snappy
        want_deflate = bool(data.get("deflate")) and settings.deflate
        if want_snappy and want_deflate:
            raise ClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        level = _int(data, "deflate_level")
        if settings.youzan:
            deflate_level = min(max(level, 0), 6)  # youzan: missing/0 -> level 0 (its bug)
        else:
            deflate_level = min(level, 6) if level > 0 else 6

        if not bool(data.get("feature_negotiation", False)):
            self._start_upgrades(want_tls, want_snappy, want_deflate, deflate_level, reply=OK)
            return None
        if settings.youzan:
            buffer_size, buffer_timeout = 100, 50
        else:
            buffer_size, buffer_timeout = 16384, 250
        if obs > 0:
            buffer_size = min(obs, 64 * 1024)
        if obt > 0:
            buffer_timeout = max(obt, 10) if settings.youzan else obt
        reply = IdentifyResponse(
            max_rdy_count=settings.max_rdy_count,
            version=settings.version,
            max_msg_timeout=int(settings.max_msg_timeout * 1000),
            msg_timeout=int(self.msg_timeout * 1000),
            tls_v1=want_tls,
            deflate=want_deflate,
            deflate_level=deflate_level,
            max_deflate_level=6,
            snappy=want_snappy,
            sample_rate=self.sample_rate,
            auth_required=bool(settings.auth_secrets),
            output_buffer_size=buffer_size,
            output_buffer_timeout=buffer_timeout,
            desired_tag=self.desired_tag,
        ).encode()
        self._start_upgrades(want_tls, want_snappy, want_deflate, deflate_level, reply=reply)
        return None

    def _start_upgrades(
        self, tls: bool, snappy: bool, deflate: bool, deflate_level: int, *, reply: bytes
    ) -> None:
        """Send the IDENTIFY answer in the clear, then TLS, snappy or deflate, each followed
        by an ``OK`` in the upgraded stream (PROTOCOL.md section 2.3)."""
        self._write(encode_response(reply))
        self._flush()
        if not (tls or snappy or deflate):
            return
        codec: StreamCodec | None = None
        if snappy:
            codec = SnappyCodec()
        elif deflate:
            codec = DeflateCodec(max(deflate_level, 1)) if deflate_level else _StoredDeflate()
        if tls:
            self._upgrading = True
            if self.transport is not None:
                self.transport.pause_reading()
            task = self._loop.create_task(self._upgrade_tls(codec))
            self.cluster.track(task)
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
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError) as exc:
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
        self._process()

    # AUTH -------------------------------------------------------------------------------

    def _auth(self, command: ClientCommand) -> bytes | None:
        if not self.identified or self.channel is not None:
            raise ClientError("E_INVALID", "cannot AUTH in current state")
        if not self.settings.auth_secrets:
            raise ClientError("E_AUTH_DISABLED", "AUTH disabled")
        if self.authed:
            raise ClientError("E_INVALID", "AUTH Already set")
        if command.body is None:
            raise ClientError("E_BAD_BODY", f"AUTH invalid body size {command.body_size}")
        identity = self.settings.auth_secrets.get(command.body.decode("utf-8", "replace"))
        if identity is None:
            raise ClientError("E_AUTH_FAILED", "AUTH failed")
        self.authed = True
        return AuthResponse(identity, "", 1).encode()

    # SUB family -------------------------------------------------------------------------

    def _sub(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB")

    def _sub_ordered(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB_ORDERED")

    def _sub_advanced(self, command: ClientCommand) -> bytes | None:
        return self._subscribe(command, "SUB_ADVANCED")

    def _subscribe(self, command: ClientCommand, kind: str) -> bytes | None:
        if self.channel is not None or self.closing:
            raise ClientError("E_INVALID", f"cannot {kind} in current state")
        if self.heartbeat_interval <= 0:
            raise ClientError("E_INVALID", f"cannot {kind} with heartbeats disabled")
        params = [p.decode("utf-8", "replace") for p in command.params]
        if len(params) < 2:
            raise ClientError("E_INVALID", f"{kind} insufficient number of parameters")
        self._need_auth(kind)
        topic_name, channel_name = params[0], params[1]
        if not valid_name(topic_name):
            raise ClientError("E_BAD_TOPIC", f'{kind} topic name "{topic_name}" is not valid')
        if not valid_name(channel_name):
            raise ClientError("E_BAD_CHANNEL", f'{kind} channel name "{channel_name}" is not valid')
        if not self.settings.youzan:
            log_ = self.cluster.classic_topic(self.node, topic_name)
            channel = self.cluster.ensure_channel(log_, channel_name)
            return self._join(channel, detail=False, ext=False)

        topic, partition = self._resolve(kind, topic_name, params[2] if len(params) > 2 else None)
        try:
            check_leader(partition, self.node.index)
        except PublishError as exc:
            raise _refused(exc) from None
        if kind == "SUB" and topic.ordered:
            raise ClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub"
            )
        if topic.ext and not self.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_NEED",
                "this topic is extended and should identify as extend support.",
            )
        if not topic.ext and self.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.",
            )
        if kind == "SUB_ORDERED" and self.sample_rate:
            raise ClientError(
                "E_INVALID", "order consume is not allowed while sample rate is not 0"
            )
        if topic.disable_channel_auto_create and channel_name not in partition.log.channels:
            raise ClientError(
                "E_SUB_CHANNEL_NOT_REGISTERED",
                f"channel {channel_name} is not registered for topic {topic_name}",
            )
        channel = self.cluster.ensure_channel(partition.log, channel_name)
        if kind == "SUB_ADVANCED" and len(params) > 3:
            self._apply_start(channel, params[3])
        if kind == "SUB_ORDERED":
            channel.ordered = True
        return self._join(channel, detail=kind != "SUB", ext=topic.ext)

    def _apply_start(self, channel: Channel, spec: str) -> None:
        kind, _, value_text = spec.partition(":")
        try:
            value = int(value_text)
        except ValueError:
            raise ClientError("E_INVALID", f"invalid consume offset: {spec}") from None
        if channel.clients or channel.in_flight:
            return  # only honoured for the first client of a channel
        records = channel.log
        if kind == "msgcount" and value >= 0:
            channel.next_index = min(value, len(records.records))
        elif kind == "virtual_queue" and value >= 0:
            channel.next_index = records.index_for_offset(value)
        elif kind == "timestamp" and value >= 0:
            channel.next_index = records.index_for_timestamp(value)
        elif kind == "special" and value == -1:
            channel.next_index = len(records.records)
        else:
            raise ClientError("E_INVALID", f"invalid consume offset: {spec}")
        channel.requeue.clear()

    def _join(self, channel: Channel, *, detail: bool, ext: bool) -> bytes:
        self.channel = channel
        self.detail = detail
        self.ext_block = ext and self.extend_support
        self._plain_frames = not (self.detail or self.ext_block)
        channel.add_client(self)
        self.cluster.changed()
        return OK

    def _resolve(
        self, kind: str, topic_name: str, partition_text: str | None
    ) -> tuple[Topic, Partition]:
        """youzan: the topic partition this command targets, hosted on this node: TCP's own
        checks of the partition argument, then :func:`resolve_partition`."""
        partition_id = -1
        if partition_text is not None:
            try:
                partition_id = go_atoi(partition_text)
            except ValueError as exc:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {exc}"
                ) from None
            if partition_id < 0:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {partition_id}"
                )
        if partition_id < 0:
            # An ordered or multi-part topic needs an explicit partition over TCP (a topic
            # that does not exist is E_TOPIC_NOT_EXIST, below).
            topic = self.cluster.topics.get(topic_name)
            if topic is not None and (topic.ordered or topic.multi_part):
                raise ClientError(
                    "E_BAD_PARTITION", "topic partition is not valid for multi partition: -1"
                )
        try:
            return resolve_partition(self.cluster, self.node.index, topic_name, partition_id)
        except PublishError as exc:
            raise _refused(exc) from None

    # PUB family -------------------------------------------------------------------------

    def _pub_target(self, kind: str, command: ClientCommand) -> tuple[PartitionLog, Topic | None]:
        params = command.params
        if not params:
            raise ClientError("E_INVALID", f"{kind} insufficient number of parameters")
        self._need_auth(kind)
        topic_name = params[0].decode("utf-8", "replace")
        if not valid_name(topic_name):
            raise ClientError("E_BAD_TOPIC", f'{kind} topic name "{topic_name}" is not valid')
        if not self.settings.youzan:
            return self.cluster.classic_topic(self.node, topic_name), None
        partition_text = params[1].decode("utf-8", "replace") if len(params) > 1 else None
        topic, partition = self._resolve(kind, topic_name, partition_text)
        try:
            check_writable(partition, self.node.index)
        except PublishError as exc:
            raise _refused(exc, fatal=False) from None  # after a publish: not fatal
        return partition.log, topic

    def _body(self, kind: str, command: ClientCommand, limit: int, error: str) -> bytes:
        body = command.body
        if body is None:
            raise ClientError("E_BAD_BODY", f"invalid body size {command.body_size}")
        if len(body) > limit:
            raise ClientError(error, f"{kind} message too big {len(body)} > {limit}")
        return body

    def _published(self, count: int) -> None:
        self.published += count
        self.cluster.changed()

    def _pub(self, command: ClientCommand) -> bytes | None:
        body = self._body("PUB", command, self.settings.max_msg_size, "E_BAD_MESSAGE")
        log_, _ = self._pub_target("PUB", command)
        log_.append(body)
        self._published(1)
        return OK

    def _dpub(self, command: ClientCommand) -> bytes | None:
        params = command.params
        if len(params) < 2:
            raise ClientError("E_INVALID", "DPUB insufficient number of parameters")
        try:
            delay_ms = go_atoi(params[1].decode("utf-8", "replace"))
        except ValueError:
            raise ClientError("E_INVALID", "DPUB could not parse timeout") from None
        if not 0 <= delay_ms <= MAX_DPUB_DELAY_MS:
            raise ClientError(
                "E_INVALID", f"DPUB timeout {delay_ms} out of range 0-{MAX_DPUB_DELAY_MS}"
            )
        body = self._body("DPUB", command, self.settings.max_msg_size, "E_BAD_MESSAGE")
        log_, _ = self._pub_target("DPUB", command)
        record = log_.append(body)
        record.not_before = time.monotonic() + delay_ms / 1000
        self._published(1)
        return OK

    def _pub_trace(self, command: ClientCommand) -> bytes | None:
        body = self._body("PUB_TRACE", command, self.settings.max_msg_size + 8, "E_BAD_MESSAGE")
        if len(body) <= 8:
            raise ClientError("E_BAD_BODY", f"invalid body size {len(body)} with trace id enabled")
        log_, _ = self._pub_target("PUB_TRACE", command)
        trace_id = int.from_bytes(body[:8], "big")
        record = log_.append(body[8:], trace_id=trace_id)
        self._published(1)
        return TraceReceipt(record.internal_id, trace_id, record.offset, record.raw_size).encode()

    def _check_ext_topic(self, topic: Topic | None) -> None:
        """PUB_EXT/MPUB_EXT to a topic without ext: refused, unless ext-compatible publishes
        are allowed (then :meth:`_parse_ext` decides by the header's keys)."""
        if topic is not None and not topic.ext and not self.settings.allow_ext_compatible:
            raise _ext_not_supported(topic)

    def _parse_ext(self, element: bytes, topic: Topic | None) -> _ExtElement:
        """Split ``[uint16 len][json][payload]``; validate like youzan nsqd. Returns the raw
        header, the header (None: store no ext header), the payload and the trace id (its
        text, None if absent, and its value)."""
        if len(element) < 2:
            raise ClientError("E_BAD_BODY", "invalid body size with ext json header")
        json_len = int.from_bytes(element[:2], "big")
        if len(element) <= 2 + json_len:
            raise ClientError(
                "E_BAD_BODY", f"invalid body size {len(element)} with ext json header"
            )
        raw = element[2 : 2 + json_len]
        payload = element[2 + json_len :]
        if json_len == 0:
            return b"", None, payload, None, 0
        try:
            header = json.loads(raw)
        except ValueError as exc:
            raise ClientError(
                "E_INVALID_JSON_HEADER", f"fail to parse json header:{exc}", fatal=False
            ) from None
        if not isinstance(header, dict):
            raise ClientError(
                "E_INVALID_JSON_HEADER", "fail to parse json header:not an object", fatal=False
            )
        if topic is not None and not topic.ext:
            if self.settings.allow_ext_compatible and all(
                k.startswith("##") or k == "zan_test" for k in header
            ):
                return b"", None, payload, None, 0
            raise _ext_not_supported(topic)
        if header.get(TRACE_ID_KEY) is None:
            # A JSON null trace id is no trace id here (header_trace_id refuses it).
            return raw, header, payload, None, 0
        try:
            trace_text, trace_id = header_trace_id(header)
        except PublishError as exc:
            raise _refused(exc, fatal=False) from None
        return raw, header, payload, trace_text, trace_id

    def _pub_ext(self, command: ClientCommand) -> bytes | None:
        body = self._body(
            "PUB_EXT", command, self.settings.max_msg_size + 2 + 65535, "E_BAD_MESSAGE"
        )
        log_, topic = self._pub_target("PUB_EXT", command)
        self._check_ext_topic(topic)
        raw, header, payload, trace_text, trace_id = self._parse_ext(body, topic)
        record = append_message(log_, payload, trace_id=trace_id, header=header, raw_header=raw)
        self._published(1)
        if trace_text is not None:
            return TraceReceipt(
                record.internal_id, trace_id, record.offset, record.raw_size
            ).encode()
        return OK

    def _mpub_common(
        self, kind: str, command: ClientCommand
    ) -> tuple[PartitionLog, Topic | None, list[bytes]]:
        body = command.body
        if body is None:
            raise ClientError("E_BAD_BODY", f"{kind} invalid body size {command.body_size}")
        extra = {"MPUB": 0, "MPUB_TRACE": 8, "MPUB_EXT": 2 + 65535}[kind]
        try:
            elements = split_mpub(
                body, self.settings.max_msg_size + extra, self.settings.max_body_size
            )
        except MpubFormatError as exc:
            code = "E_BAD_BODY" if exc.reason == "count" else "E_BAD_MESSAGE"
            raise ClientError(code, str(exc)) from None
        log_, topic = self._pub_target(kind, command)
        return log_, topic, elements

    def _mpub(self, command: ClientCommand) -> bytes | None:
        log_, _, elements = self._mpub_common("MPUB", command)
        log_.extend(elements)
        self._published(len(elements))
        return OK

    def _mpub_trace(self, command: ClientCommand) -> bytes | None:
        log_, _, elements = self._mpub_common("MPUB_TRACE", command)
        if any(len(e) <= 8 for e in elements):
            raise ClientError("E_BAD_BODY", "invalid body size with trace id enabled")
        records = [
            log_.append(element[8:], trace_id=int.from_bytes(element[:8], "big"))
            for element in elements
        ]
        self._published(len(records))
        total = sum(r.raw_size for r in records)
        return TraceReceipt(records[0].internal_id, 0, records[0].offset, total).encode()

    def _mpub_ext(self, command: ClientCommand) -> bytes | None:
        log_, topic, elements = self._mpub_common("MPUB_EXT", command)
        self._check_ext_topic(topic)
        parsed = [self._parse_ext(e, topic) for e in elements]  # all or nothing
        for raw, header, payload, _, trace_id in parsed:
            append_message(log_, payload, trace_id=trace_id, header=header, raw_header=raw)
        self._published(len(parsed))
        return OK

    # consumer commands ------------------------------------------------------------------

    def _rdy(self, command: ClientCommand) -> bytes | None:
        if self.closing:
            return None  # RDY after CLS is ignored
        if self.channel is None:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        text = command.params[0].decode("utf-8", "replace") if command.params else ""
        try:
            count = go_atoi(text)
        except ValueError:
            raise ClientError("E_INVALID", f"RDY could not parse count {text}") from None
        if not 0 <= count <= self.settings.max_rdy_count:
            raise ClientError(
                "E_INVALID", f"RDY count {count} out of range 0-{self.settings.max_rdy_count}"
            )
        self.rdy = count
        self.channel.schedule_pump()
        return None

    def _check_leader(self, name: str) -> Channel:
        channel = self.channel
        if channel is None:
            raise ClientError("E_INVALID", f"cannot {name} in current state")
        partition = self.cluster.partition_of(channel.log)
        if partition is not None and partition.leader != self.node.index:
            raise ClientError("E_FAILED_ON_NOT_LEADER", "")
        return channel

    def _id_failed(self, code: str, name: str, message_id: bytes) -> ClientError:
        if self.settings.youzan:
            shown = _go_bytes(message_id)
            reason = "failed ErrType:7 ErrCode:0 : Message ID not in flight"
        else:
            shown = message_id.decode("ascii", "replace")
            reason = "failed ID not in flight"
        return ClientError(code, f"{name} {shown} {reason}", fatal=False)

    def _message_id(self, name: str, command: ClientCommand) -> bytes:
        if not command.params or len(command.params[0]) != 16:
            raise ClientError("E_INVALID", f"{name} invalid message id")
        return command.params[0]

    def _fin(self, command: ClientCommand) -> bytes | None:
        message_id = self._message_id("FIN", command)
        channel = self._check_leader("FIN")
        if not channel.finish(message_id, self):
            raise self._id_failed("E_FIN_FAILED", "FIN", message_id)
        self.cluster.changed()
        return None

    def _fins_allowed(self) -> bool:
        """Whether a FIN now would pass every check of :meth:`_dispatch` and :meth:`_fin`
        but the id's, so a run of FINs can skip them (the fast path of a consumer)."""
        if self.settings.tls_required and not self.tls:
            return False
        channel = self.channel
        if channel is None:
            return False
        partition = self.cluster.partition_of(channel.log)
        return partition is None or partition.leader == self.node.index

    def _finish_many(self, message_ids: list[bytes]) -> None:
        """A run of FINs, answered as :meth:`_fin` answers each of them."""
        channel = self.channel
        if channel is None:
            return
        failed = channel.finish_many(message_ids, self)
        for message_id in failed:
            self._write(encode_error(self._id_failed("E_FIN_FAILED", "FIN", message_id).text))
        if len(failed) < len(message_ids):
            self.cluster.changed()

    def _req(self, command: ClientCommand) -> bytes | None:
        message_id = self._message_id("REQ", command)
        channel = self._check_leader("REQ")
        text = command.params[1].decode("utf-8", "replace") if len(command.params) > 1 else ""
        try:
            timeout_ms = go_atoi(text)
        except ValueError:
            raise ClientError("E_INVALID", f"REQ could not parse timeout {text}") from None
        max_ms = int(self.settings.max_req_timeout * 1000)
        if self.settings.youzan:
            timeout_ms = min(max(timeout_ms, 0), max_ms)
        elif not 0 <= timeout_ms <= max_ms:
            raise ClientError("E_INVALID", f"REQ timeout {timeout_ms} out of range 0-{max_ms}")
        if not channel.requeue_message(message_id, self, timeout_ms / 1000):
            raise self._id_failed("E_REQ_FAILED", "REQ", message_id)
        self.cluster.changed()
        return None

    def _touch(self, command: ClientCommand) -> bytes | None:
        message_id = self._message_id("TOUCH", command)
        channel = self._check_leader("TOUCH")
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
        raise ClientError("E_CREATE_TOPIC_FAILED", "create topic is not allowed in cluster mode")

    # ------------------------------------------------------------------ delivery

    def deliver_many(self, deliveries: list[Delivery]) -> None:
        out = self._out
        if self._plain_frames:
            # encode_message_frame's bytes without its generality: the layout has no ext or
            # detail block, so a frame is [head][id][body].
            for delivery in deliveries:
                record = delivery.record
                body = record.body
                out.append(_pack_plain_head(30 + len(body), 2, record.timestamp, delivery.attempts))
                out.append(record.id)
                out.append(body)
        else:
            ext = self.ext_block
            detail = self.detail
            for delivery in deliveries:
                record = delivery.record
                out.append(
                    encode_message_frame(
                        record.timestamp,
                        delivery.attempts,
                        record.id,
                        record.body,
                        ext_version=record.ext_version if ext else None,
                        ext_raw=record.ext_raw,
                        offset=record.offset if detail else None,
                        raw_size=record.raw_size if detail else None,
                    )
                )
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)


class _StoredDeflate(DeflateCodec):
    """youzan's deflate_level 0 (its missing-level bug): stored blocks, still raw deflate."""

    def __init__(self) -> None:
        import zlib

        super().__init__(1)
        self._compressor = zlib.compressobj(0, zlib.DEFLATED, -15)


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ClientError("E_BAD_BODY", f"IDENTIFY failed to decode JSON body: {key}")
    return int(value)


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
