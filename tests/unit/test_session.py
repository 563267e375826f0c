"""ClientSession: the client side of a connection, without sockets or a loop.

Whole connections recorded from real youzan nsqd are replayed byte for byte (each frame
whole, then cut into pieces); then each step of the handshake, each rule for unexpected
frames, requests and deadlines is checked on its own.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from smartnsq import errors as e
from smartnsq.protocol import commands
from smartnsq.protocol import session_events as ev
from smartnsq.protocol.compression import DeflateCodec, SnappyCodec
from smartnsq.protocol.errors import error_from_frame
from smartnsq.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, encode_frame
from smartnsq.protocol.identify import IdentifyRequest, IdentifyResponse, keeps_rdy_count
from smartnsq.protocol.message import (
    MessageFrame,
    encode_message_frame,
    pure_decode_message,
    youzan_message_id,
)
from smartnsq.protocol.responses import CLOSE_WAIT, HEARTBEAT, OK, AuthResponse
from smartnsq.protocol.server import encode_error, encode_response
from smartnsq.protocol.session import ClientSession, SubscribeCommand, SubscribeKind
from smartnsq.protocol.session_states import ACCEPTS, SENDS, Received, State
from tests.fixtures import server_frame, wire

ADDRESS = "127.0.0.1:4150"
YOUZAN_ANSWER = server_frame("identify_response")
CLASSIC_ANSWER = encode_response(json.dumps(wire()["classic"]["identify_response_json"]).encode())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorded(ClientSession):
    """A session whose answers (paired inline, not events) are kept in the order read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.answers: list[tuple[int, bytes]] = []
        super().__init__(*args, on_response=self._answered, **kwargs)

    def _answered(self, token: int, data: bytes) -> None:
        self.answers.append((token, data))

    def take(self) -> list[tuple[int, bytes]]:
        """The answers paired since the last call."""
        answers, self.answers = self.answers, []
        return answers


def _session(
    clock: Clock | None = None, *, extend_support: bool | None = None, **options: Any
) -> Recorded:
    identify = {
        key: options.pop(key)
        for key in ("heartbeat_interval", "tls_v1", "snappy", "deflate", "deflate_level")
        if key in options
    }
    request = IdentifyRequest(
        client_id="c", hostname="h", user_agent="u", extend_support=extend_support, **identify
    )
    return Recorded(request, address=ADDRESS, clock=clock or Clock(), **options)


def _ready(answer: bytes = YOUZAN_ANSWER, **options: Any) -> Recorded:
    session = _session(**options)
    session.initiate()
    events = session.receive_data(answer)
    assert [type(event) for event in events] == [ev.Ready]
    return session


def _subscribe(session: ClientSession, command: SubscribeCommand | None = None) -> int:
    """SUB (``SUB t c 0`` unless said), messages dropped; its token."""
    command = command or SubscribeCommand(SubscribeKind.PLAIN, "t", "c", 0)
    return session.subscribe(command, on_message=print, message_class=MessageFrame)[1]


def _subscribed(session: ClientSession) -> None:
    """SUB, and nsqd's OK."""
    _subscribe(session)
    session.receive_data(encode_response(OK))


def _answer(**fields: Any) -> bytes:
    """An IDENTIFY answer (youzan's) with ``fields`` changed."""
    return encode_response(IdentifyResponse(version="0.3.7-HA.1.13.0", **fields).encode())


def _pieces(data: bytes, size: int | None) -> Iterator[bytes]:
    if size is None:
        yield data
        return
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _shape(events: list[ev.Event]) -> list[tuple[Any, ...]]:
    """Events comparable across runs (errors by type and text)."""
    shaped: list[tuple[Any, ...]] = []
    for event in events:
        if isinstance(event, (ev.RequestFailed,)):
            shaped.append((ev.RequestFailed, event.token, type(event.error), str(event.error)))
        elif isinstance(event, (ev.UnsolicitedError, ev.SessionFailed, ev.Closed)):
            shaped.append((type(event), type(event.error), str(event.error)))
        elif isinstance(event, ev.Ready):
            shaped.append((ev.Ready,))
        else:
            shaped.append((type(event), *event))
    return shaped


# ---------------------------------------------------------------------- recorded connections


def _sessions() -> list[str]:
    return [name for name in wire()["sessions"] if not name.startswith("_")]


class Replay:
    """Drives a session through one recorded connection: the client's steps through the
    session's API (its bytes compared with what was sent where the session makes them),
    the server's frames fed as they were received, and the events checked against what the
    frame must mean."""

    def __init__(self, steps: list[dict[str, str]], size: int | None) -> None:
        self.steps = [(step["dir"], bytes.fromhex(step["hex"])) for step in steps]
        self.size = size
        identify = json.loads(self.steps[0][1][13:])
        self.session = _session(
            extend_support=identify.get("extend_support"),
            heartbeat_interval=identify.get("heartbeat_interval", 30_000),
        )
        self.pending: deque[tuple[int, str]] = deque()
        self.messages: list[MessageFrame] = []
        self.nop_due = False

    def run(self) -> None:
        for direction, data in self.steps:
            if self.session.state is State.ERROR:
                break  # nsqd closed the connection: what the probe sent after is unanswered
            if direction == "C>S":
                self.client(data)
            else:
                self.server(data)

    def client(self, data: bytes) -> None:
        session = self.session
        name = data.split(b"\n", 1)[0].split(b" ", 1)[0].decode()
        if name == "IDENTIFY":
            assert session.initiate().startswith(commands.MAGIC_V2 + b"IDENTIFY\n")
        elif name in ("SUB", "SUB_ORDERED", "SUB_ADVANCED"):
            words = data.decode().split()
            kind = SubscribeKind(name)
            start = None
            if len(words) == 5:  # the wire form as sent (msgcount:0 included)
                position, value = words[4].split(":")
                start = commands.StartPosition(position, int(value))
            sent, token, _ = session.subscribe(
                SubscribeCommand(kind, words[1], words[2], int(words[3]), start),
                on_message=self.messages.append,
                message_class=MessageFrame,
            )
            assert sent == data
            self.pending.append((token, name))
        elif name == "NOP":
            if self.nop_due:
                assert session.data_to_send() == data == commands.NOP
                self.nop_due = False
        elif name == "FIN" and self.messages and data[4:20] == self.messages[-1].id:
            assert commands.fin(self.messages[-1].id) == data
        elif name not in ("FIN", "REQ", "TOUCH", "RDY"):
            token, _ = session.send_request(name)
            self.pending.append((token, name))

    def server(self, data: bytes) -> None:
        session = self.session
        before = session.state
        events: list[ev.Event] = []
        for piece in _pieces(data, self.size):
            events.extend(session.receive_data(piece))
        frame_type, body = int.from_bytes(data[4:8], "big"), data[8:]
        if frame_type == FRAME_TYPE_MESSAGE:
            assert events == []
            message = self.messages[-1]
            expected = pure_decode_message(body, session.layout, MessageFrame)
            assert (message.id, message.body, message.offset, message.ext_raw) == (
                expected.id,
                expected.body,
                expected.offset,
                expected.ext_raw,
            )
        elif frame_type == FRAME_TYPE_ERROR:
            assert _shape(events) == self.error_events(body)
        elif body == HEARTBEAT:
            assert events == [ev.HEARTBEAT_EVENT]
            self.nop_due = True
        elif before is State.IDENTIFYING:
            assert _shape(events) == [(ev.Ready,)]
            assert session.identify == IdentifyResponse.decode(body)
        else:
            token, name = self.pending.popleft()
            assert events == []
            assert session.take() == [(token, body)]
            if name.startswith("SUB"):
                assert session.state is State.SUBSCRIBED
            if name == "CLS":
                assert body == CLOSE_WAIT
                assert session.state is State.CLOSING

    def error_events(self, body: bytes) -> list[tuple[Any, ...]]:
        pending = self.pending
        solicited = bool(pending) and not body.startswith(b"E_FIN_FAILED")
        error = error_from_frame(body, pending[0][1] if solicited else "FIN", ADDRESS)
        shape = (type(error), str(error))
        if not error.fatal and not (solicited and pending[0][1].startswith("SUB")):
            if solicited:
                return [(ev.RequestFailed, pending.popleft()[0], *shape)]
            return [(ev.UnsolicitedError, *shape)]
        failed = [(ev.RequestFailed, token, *shape) for token, _ in pending]
        pending.clear()
        return (
            failed
            + ([] if solicited else [(ev.UnsolicitedError, *shape)])
            + [(ev.SessionFailed, *shape)]
        )


@pytest.mark.parametrize("size", [None, 1, 7], ids=["whole", "bytes", "sevens"])
@pytest.mark.parametrize("name", _sessions())
def test_recorded_connections_replay(name: str, size: int | None) -> None:
    replay = Replay(wire()["sessions"][name], size)
    replay.run()
    assert not replay.pending or replay.session.state is State.ERROR


def test_the_recorded_heartbeat_is_answered_with_the_recorded_nop() -> None:
    replay = Replay(wire()["sessions"]["tcp_heartbeat#0"], None)
    replay.run()
    assert not replay.nop_due  # the NOP step compared the session's bytes


def test_recorded_errors_close_the_connection_as_observed() -> None:
    """What the capture saw nsqd do after each error (closed or not) is what the session
    decides."""
    observed = wire()["observed_connection_closed_after"]
    cases = {
        "E_FAILED_ON_NOT_LEADER after PUB/MPUB": ("tcp_pub_errors#0", 0),
        "E_FAILED_ON_NOT_LEADER after SUB": ("tcp_sub_errors#0", 0),
        "E_TOPIC_NOT_EXIST": ("tcp_pub_errors#1", 0),
        "E_BAD_PARTITION": ("tcp_pub_errors#4", 0),
        "E_SUB_ORDER_IS_MUST": ("tcp_sub_errors#2", 0),
        "E_SUB_EXTEND_NEED": ("tcp_sub_errors#3", 0),
        "E_SUB_EXTEND_FORBIDDON": ("tcp_sub_errors#4", 0),
        "E_BAD_BODY": ("tcp_pub_variants#1", 0),
        "E_INVALID": ("tcp_pub_variants#2", 0),
        "E_INVALID_JSON_HEADER": ("tcp_ext#1", 0),
        "E_EXT_NOT_SUPPORT": ("tcp_ext#2", 0),
        "E_FIN_FAILED": ("tcp_sub_message#1", 0),
    }
    for label, (name, index) in cases.items():
        steps = wire()["sessions"][name]
        errors = [i for i, step in enumerate(steps) if step["hex"][8:16] == "00000001"]
        replay = Replay(steps[: errors[index] + 1], None)
        replay.run()
        assert (replay.session.state is State.ERROR) == observed[label], label


# ---------------------------------------------------------------------- the handshake


def test_initiate_sends_the_magic_and_identify() -> None:
    session = _session()
    sent = session.initiate()
    assert sent.startswith(commands.MAGIC_V2 + b"IDENTIFY\n")
    assert json.loads(sent[17:])["client_id"] == "c"
    assert session.state is State.IDENTIFYING


@pytest.mark.parametrize(
    ("version", "keeps"),
    [
        ("0.3.7-HA.1.13.0", True),  # youzan
        ("1.3.0", True),
        ("0.2.29", True),
        ("0.3.8", True),
        ("0.2.28", False),  # took one off the count per message sent
        ("0.2.7", False),
        ("", False),  # unknown: refreshed, which every version takes
        ("v1.3.0", False),
        ("1.3", False),
    ],
)
def test_which_nsqd_keeps_the_rdy_count(version: str, keeps: bool) -> None:
    assert keeps_rdy_count(version) is keeps
    assert IdentifyResponse(version=version).keeps_rdy_count is keeps


def test_youzan_and_classic_answers() -> None:
    youzan = _ready(extend_support=True)
    assert youzan.youzan
    assert youzan.max_rdy_count == 2500
    assert youzan.layout.binary_id
    assert youzan.layout.ext
    assert not youzan.layout.detail
    classic = _ready(CLASSIC_ANSWER, extend_support=True)
    assert not classic.youzan
    assert not classic.layout.binary_id
    assert not classic.layout.ext
    assert classic.identify is not None
    assert classic.identify.version == "1.3.0"


def test_a_server_without_feature_negotiation_answers_ok() -> None:
    session = _ready(encode_response(OK))
    assert session.identify is None
    assert not session.youzan
    assert session.state is State.READY


def test_tls_then_snappy_then_auth() -> None:
    session = _session(tls_v1=True, snappy=True, auth_secret="s3cret")
    session.initiate()
    server = SnappyCodec()
    events = session.receive_data(_answer(tls_v1=True, snappy=True, auth_required=True))
    assert events == [ev.START_TLS]
    assert session.state is State.TLS
    # nsqd's OK over TLS and its snappy OK arrive before the transport said TLS is up
    assert session.receive_data(encode_response(OK)) == []
    tail = server.compress(encode_response(OK))
    assert session.tls_started() == []
    assert session.receive_data(tail) == []
    assert session.state is State.AUTH
    assert session.compression == "SnappyCodec"
    assert session.data_to_send() == commands.auth("s3cret")  # compressed by the transport
    answer = AuthResponse("billing", "", 2).encode()
    events = session.receive_data(server.compress(encode_response(answer)))
    assert _shape(events) == [(ev.Ready,)]
    assert session.auth == AuthResponse("billing", "", 2)
    assert session.compress is not None
    # both directions stay compressed
    token, _ = session.send_request("PUB")
    assert session.receive_data(server.compress(encode_response(OK))) == []
    assert session.take() == [(token, OK)]
    assert SnappyCodec().decompress(session.compress(b"NOP\n")).endswith(b"NOP\n")


@pytest.mark.parametrize("level", [1, 6])
def test_deflate_ok_in_the_same_read_as_the_answer(level: int) -> None:
    session = _session(deflate=True, deflate_level=level)
    session.initiate()
    server = DeflateCodec(level)
    read = _answer(deflate=True, deflate_level=level) + server.compress(
        encode_response(OK) + encode_response(HEARTBEAT)
    )
    events = session.receive_data(read)
    assert _shape(events) == [(ev.Ready,), (type(ev.HEARTBEAT_EVENT),)]
    assert session.compression == "DeflateCodec"
    assert session.data_to_send() == commands.NOP


def test_auth_required_without_a_secret() -> None:
    session = _session()
    session.initiate()
    events = session.receive_data(_answer(auth_required=True))
    assert isinstance(events[-1], ev.SessionFailed)
    assert isinstance(events[-1].error, e.ValidationError)
    assert events[-1].error.field == "auth_secret"


def test_a_heartbeat_during_the_handshake_is_answered_once_ready() -> None:
    session = _session(snappy=True)
    session.initiate()
    events = session.receive_data(encode_response(HEARTBEAT) + _answer(snappy=True))
    assert events == [ev.HEARTBEAT_EVENT]
    assert session.data_to_send() == b""  # NOP now would reach nsqd uncompressed
    assert _shape(session.receive_data(SnappyCodec().compress(encode_response(OK)))) == [
        (ev.Ready,)
    ]
    assert session.data_to_send() == commands.NOP


def test_an_http_server_is_named() -> None:
    session = _session()
    session.initiate()
    events = session.receive_data(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(events[-1], ev.SessionFailed)
    assert "answered in HTTP ('HTTP/1.1 400 Bad Request')" in str(events[-1].error)
    assert "HTTP port, not an nsqd TCP port" in str(events[-1].error)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (b"E_BAD_PROTOCOL", e.BadProtocolError),
        (b"too much client connections", e.TooManyConnectionsError),
        (
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
            e.IdentifyFailedError,
        ),
    ],
)
def test_an_error_during_the_handshake_ends_it(text: bytes, error: type[e.ServerError]) -> None:
    session = _session()
    session.initiate()
    events = session.receive_data(encode_error(text))
    assert [type(event) for event in events] == [ev.SessionFailed]
    assert isinstance(events[0].error, error)  # type: ignore[union-attr]
    assert session.state is State.ERROR


def test_a_corrupt_identify_answer() -> None:
    session = _session()
    session.initiate()
    events = session.receive_data(encode_response(b"{not json"))
    assert isinstance(events[-1], ev.SessionFailed)
    assert isinstance(events[-1].error, e.ProtocolError)


def test_the_upgrade_must_be_confirmed_with_ok() -> None:
    session = _session(snappy=True)
    session.initiate()
    events = session.receive_data(
        _answer(snappy=True) + SnappyCodec().compress(encode_response(b"NO"))
    )
    assert isinstance(events[-1], ev.SessionFailed)
    assert "expected OK after the compression upgrade" in str(events[-1].error)


def test_each_handshake_answer_is_bounded() -> None:
    clock = Clock()
    session = _session(clock, request_timeout=0.2, handshake_timeout=5.0)
    session.initiate()
    assert session.next_deadline() == pytest.approx(100.2)
    clock.now = 100.19
    assert session.expired(clock.now) == []
    clock.now = 100.2
    events = session.expired(clock.now)
    assert [type(event) for event in events] == [ev.SessionFailed]
    assert "did not answer the NSQ handshake (IDENTIFY) within 0.2 s" in str(events[0].error)
    assert session.next_deadline() is None


def test_tls_started_after_the_session_ended_changes_nothing() -> None:
    clock = Clock()
    session = _session(clock, tls_v1=True)
    session.initiate()
    assert session.receive_data(_answer(tls_v1=True)) == [ev.START_TLS]
    assert [type(event) for event in session.expired(clock.now + 60)] == [ev.SessionFailed]
    assert session.tls_started() == []
    assert session.state is State.ERROR


def test_the_whole_handshake_is_bounded_by_the_connect_timeout() -> None:
    clock = Clock()
    session = _session(clock, tls_v1=True, request_timeout=10.0, handshake_timeout=5.0)
    session.initiate()
    clock.now = 103.0
    session.receive_data(_answer(tls_v1=True))
    assert session.next_deadline() == pytest.approx(105.0)
    events = session.expired(105.0)
    assert "(TLS) within 5.0 s" in str(events[0].error)  # type: ignore[union-attr]


# ---------------------------------------------------------------------- unexpected frames


def test_a_response_with_no_request_waiting_is_a_protocol_error() -> None:
    session = _ready()
    events = session.receive_data(encode_response(OK))
    assert isinstance(events[-1], ev.SessionFailed)
    assert "a response with no request waiting" in str(events[-1].error)


@pytest.mark.parametrize("subscribing", [False, True], ids=["ready", "subscribing"])
def test_a_message_before_subs_ok_is_a_protocol_error(subscribing: bool) -> None:
    session = _ready()
    if subscribing:
        _subscribe(session)
    frame = encode_message_frame(1, 1, youzan_message_id(1), b"x")
    events = session.receive_data(frame)
    assert isinstance(events[-1], ev.SessionFailed)
    assert "a message frame while" in str(events[-1].error)
    failed = [event for event in events if isinstance(event, ev.RequestFailed)]
    assert len(failed) == int(subscribing)  # the SUB fails with the session


def test_frames_after_a_fatal_error_are_dropped() -> None:
    session = _ready()
    _token, _ = session.send_request("PUB")
    late = encode_response(HEARTBEAT) + encode_response(OK)
    events = session.receive_data(encode_error(b"E_TOPIC_NOT_EXIST ") + late)
    assert _shape(events)[-1][0] is ev.SessionFailed
    assert session.receive_data(late) == []
    assert session.data_to_send() == b""  # no NOP for a heartbeat after the end
    with pytest.raises(e.ConnectionClosedError):
        session.send_request("PUB")


def test_a_sub_answered_with_something_else_than_ok() -> None:
    session = _ready()
    _subscribe(session)
    events = session.receive_data(encode_response(b"WHAT"))
    assert [type(event) for event in events] == [ev.RequestFailed, ev.SessionFailed]
    assert "unexpected answer to SUB" in str(events[-1].error)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\x00\x00\x02\x00\x00\x00\x00",  # a size below 4
        b"\x7f\xff\xff\xff\x00\x00\x00\x00",  # 2^31-1
        b"\x00\x00\x00\x06\x00\x00\x00\x05OK",  # an unknown frame type
    ],
    ids=["small", "huge", "type"],
)
def test_corrupt_frames(data: bytes) -> None:
    session = _ready()
    _token, _ = session.send_request("PUB")
    events = session.receive_data(data)
    assert [type(event) for event in events] == [ev.RequestFailed, ev.SessionFailed]
    assert isinstance(events[-1].error, e.ProtocolError)  # type: ignore[union-attr]


def test_a_short_message_frame() -> None:
    session = _ready()
    _subscribed(session)
    events = session.receive_data(encode_frame(FRAME_TYPE_MESSAGE, b"short"))
    assert isinstance(events[-1], ev.SessionFailed)
    assert "shorter than its header" in str(events[-1].error)


def test_every_state_has_a_row() -> None:
    assert set(ACCEPTS) == set(State)
    assert all(Received.MESSAGE not in ACCEPTS[state] for state in (State.READY, State.SUBSCRIBING))
    assert {state for state, _ in SENDS} <= set(State)


# ---------------------------------------------------------------------- requests


def test_pipelined_answers_pair_in_order_around_heartbeats() -> None:
    session = _ready()
    tokens = [session.send_request("PUB")[0] for _ in range(3)]
    read = encode_response(OK) + encode_response(HEARTBEAT) + encode_response(OK) * 2
    assert session.receive_data(read) == [ev.HEARTBEAT_EVENT]
    assert session.take() == [(token, OK) for token in tokens]
    assert session.data_to_send() == commands.NOP
    assert session.pending_count == 0


def test_a_non_fatal_error_fails_only_its_request() -> None:
    session = _ready()
    first, _ = session.send_request("PUB")
    ext, _ = session.send_request("PUB_EXT")
    last, _ = session.send_request("PUB")
    read = (
        encode_response(OK)
        + encode_error(b"E_EXT_NOT_SUPPORT ext content not supported")
        + encode_response(OK)
    )
    events = session.receive_data(read)
    assert session.take() == [(first, OK), (last, OK)]
    assert [(type(ev), ev[0]) for ev in events] == [(ev.RequestFailed, ext)]
    assert isinstance(events[0].error, e.ExtNotSupportedError)  # type: ignore[union-attr]
    assert not events[0].error.fatal  # type: ignore[union-attr]
    assert session.state is State.READY


def test_a_fatal_error_fails_every_request_waiting() -> None:
    session = _ready()
    tokens = [session.send_request("PUB")[0] for _ in range(3)]
    events = session.receive_data(encode_error(b"E_TOPIC_NOT_EXIST "))
    assert [(type(ev), getattr(ev, "token", None)) for ev in events] == [
        *((ev.RequestFailed, token) for token in tokens),
        (ev.SessionFailed, None),
    ]
    assert all(isinstance(ev.error, e.TopicNotExistError) for ev in events)  # type: ignore[union-attr]
    assert session.failure is not None
    assert session.state is State.ERROR


def test_errors_of_fin_req_touch_never_answer_a_request() -> None:
    session = _ready()
    _subscribed(session)
    token, _ = session.send_request("CLS")
    events = session.receive_data(encode_error(b"E_FIN_FAILED FIN 1 failed ID not in flight"))
    assert [type(event) for event in events] == [ev.UnsolicitedError]
    assert isinstance(events[0].error, e.FinFailedError)  # type: ignore[union-attr]
    assert session.receive_data(encode_response(CLOSE_WAIT)) == []
    assert session.take()[-1] == (token, CLOSE_WAIT)


def test_an_unsolicited_fatal_error_is_reported_then_ends_the_session() -> None:
    session = _ready()
    _subscribed(session)
    events = session.receive_data(encode_error(b"E_FAILED_ON_NOT_LEADER "))
    assert [type(event) for event in events] == [ev.UnsolicitedError, ev.SessionFailed]
    assert events[0].error.fatal
    assert events[0].error.command == "FIN"


def test_what_each_state_refuses_to_send() -> None:
    session = _session()
    with pytest.raises(e.ProtocolError, match="the session is connected"):
        session.send_request("PUB")
    session.initiate()
    with pytest.raises(e.ProtocolError, match="identifying"):
        session.send_request("PUB")
    session.receive_data(YOUZAN_ANSWER)
    with pytest.raises(e.ProtocolError, match="subscribe"):
        session.send_request("SUB")
    with pytest.raises(e.ProtocolError, match="cannot send CLS"):
        session.send_request("CLS")
    _subscribe(session)
    with pytest.raises(e.ProtocolError, match="cannot send SUB_ORDERED"):
        _subscribe(session, SubscribeCommand(SubscribeKind.ORDERED, "t", "c", 0))
    session.connection_lost(e.ConnectionClosedError("gone"))
    with pytest.raises(e.ConnectionClosedError):
        session.send_request("PUB")


def test_subscribe_checks_its_arguments_before_anything_is_sent() -> None:
    session = _ready()
    start = commands.StartPosition.earliest()
    with pytest.raises(e.ValidationError, match="start"):
        _subscribe(session, SubscribeCommand(SubscribeKind.PLAIN, "t", "c", 0, start))
    with pytest.raises(e.ValidationError, match="partition"):
        _subscribe(session, SubscribeCommand(SubscribeKind.ORDERED, "t", "c"))
    with pytest.raises(e.ValidationError, match="topic"):
        _subscribe(session, SubscribeCommand(SubscribeKind.PLAIN, "bad topic", "c"))
    assert session.state is State.READY
    assert session.pending_count == 0


@pytest.mark.parametrize("kind", list(SubscribeKind))
def test_subscribe_owns_the_layout(kind: SubscribeKind) -> None:
    session = _ready(extend_support=True)
    got: list[MessageFrame] = []
    data, token, _ = session.subscribe(
        SubscribeCommand(kind, "t", "c", 0), on_message=got.append, message_class=MessageFrame
    )
    assert data.startswith(kind.value.encode() + b" t c 0")
    assert session.receive_data(encode_response(OK)) == []
    assert session.take() == [(token, OK)]
    detail = kind is not SubscribeKind.PLAIN
    assert session.layout.detail == detail
    assert session.layout.ext
    assert session.layout.binary_id
    frame = encode_message_frame(
        7,
        1,
        youzan_message_id(5),
        b"body",
        ext_version=0,
        offset=40 if detail else None,
        raw_size=30,
    )
    assert session.receive_data(frame) == []
    assert [(m.internal_id, m.body, m.offset) for m in got] == [
        (5, b"body", 40 if detail else None)
    ]
    assert session.messages_received == 1


def test_for_partition() -> None:
    assert SubscribeKind.for_partition(None, ordered=True) is SubscribeKind.PLAIN
    assert SubscribeKind.for_partition(0, ordered=True) is SubscribeKind.ORDERED
    assert SubscribeKind.for_partition(3, ordered=False) is SubscribeKind.ADVANCED


# ---------------------------------------------------------------------- deadlines and the end


def test_a_shorter_timeout_on_a_later_request_expires_first() -> None:
    clock = Clock()
    session = _ready(clock=clock, request_timeout=10.0, heartbeat_interval=-1)
    session.send_request("PUB")
    clock.now = 101.0
    _, deadline = session.send_request("MPUB", timeout=2.0)
    assert deadline == session.next_deadline() == pytest.approx(103.0)
    assert session.expired(102.9) == []
    events = session.expired(103.0)
    assert [type(event) for event in events] == [
        ev.RequestFailed,
        ev.RequestFailed,
        ev.SessionFailed,
    ]
    assert str(events[-1].error) == f"MPUB to {ADDRESS}: no answer within 2.0 s"  # type: ignore[union-attr]


def test_answered_requests_leave_no_deadline() -> None:
    clock = Clock()
    session = _ready(clock=clock, heartbeat_interval=-1)
    for _ in range(1000):
        session.send_request("PUB")
        session.receive_data(encode_response(OK))
        clock.now += 0.01
    assert session.next_deadline() is None
    assert session.expired(clock.now + 1000) == []
    _token, deadline = session.send_request("PUB")
    assert session.next_deadline() == deadline == pytest.approx(clock.now + 10.0)


def test_a_silent_link_expires() -> None:
    clock = Clock()
    session = _ready(clock=clock, heartbeat_interval=1000)
    assert session.next_deadline() == pytest.approx(103.0)  # two intervals and a second
    clock.now = 102.5
    session.receive_data(encode_response(HEARTBEAT))
    assert session.next_deadline() == pytest.approx(105.5)
    assert session.expired(105.4) == []
    events = session.expired(105.5)
    assert [type(event) for event in events] == [ev.SessionFailed]
    assert str(events[0].error) == f"no heartbeat from {ADDRESS} for 3.0 s"  # type: ignore[union-attr]


def test_connection_lost_fails_every_request() -> None:
    session = _ready()
    tokens = [session.send_request("PUB")[0] for _ in range(2)]
    error = e.ConnectionClosedError("connection closed by nsqd", ADDRESS)
    events = session.connection_lost(error)
    assert events == [*(ev.RequestFailed(token, error) for token in tokens), ev.Closed(error)]
    assert session.state is State.CLOSED
    assert session.pending_count == 0
    assert session.connection_lost(error) == []
    assert session.receive_data(encode_response(OK)) == []


# ---------------------------------------------------------------------- any server, any cuts

EVENT_TYPES = (
    ev.RequestFailed,
    ev.UnsolicitedError,
    type(ev.HEARTBEAT_EVENT),
    type(ev.START_TLS),
    ev.Ready,
    ev.SessionFailed,
    ev.Closed,
)
_ERROR_TEXTS = [
    b"E_FIN_FAILED FIN 1 failed ID not in flight",
    b"E_REQ_FAILED REQ 1 failed",
    b"E_TOUCH_FAILED TOUCH 1 failed",
    b"E_PUB_FAILED PUB failed",
    b"E_EXT_NOT_SUPPORT ext content not supported",
    b"E_FAILED_ON_NOT_LEADER ",
    b"E_TOPIC_NOT_EXIST ",
    b"E_INVALID cannot FIN in current state",
    b"E_SOMETHING_NEW unknown to this client",
]


def _message(detail: bool, *, whole: bool = False) -> st.SearchStrategy[bytes]:
    """A message frame in the layout with or without the queue block; cut short sometimes
    unless ``whole``."""
    return st.builds(
        lambda seq, body, cut: encode_message_frame(
            1, 1, youzan_message_id(seq), body, offset=seq * 10 if detail else None, raw_size=9
        )[: 30 if cut else None],
        st.integers(1, 2**40),
        st.binary(max_size=20),
        st.just(False) if whole else st.booleans(),
    )


def _any_frames(detail: bool) -> st.SearchStrategy[bytes]:
    """What a server must not send as well as what it may."""
    return st.one_of(
        st.just(encode_response(OK)),
        st.just(encode_response(HEARTBEAT)),
        st.just(encode_response(CLOSE_WAIT)),
        st.sampled_from(_ERROR_TEXTS).map(encode_error),
        _message(detail),
        _message(not detail),
        st.binary(max_size=12).map(encode_response),
        st.binary(min_size=1, max_size=12),  # not a frame at all
    )


class SessionMachine(RuleBasedStateMachine):
    """Any sequence of server frames, cut anywhere, against requests, a subscription, time
    and the end of the connection: only typed events come out (and answers, in order),
    every request is answered or failed once (all of them by the end), and every heartbeat
    gets its NOP."""

    @initialize(
        answer=st.sampled_from([YOUZAN_ANSWER, CLASSIC_ANSWER, encode_response(OK)]),
        interval=st.sampled_from([-1, 1000, 30_000]),
        kind=st.sampled_from([None, *SubscribeKind]),
        subscribed=st.booleans(),
    )
    def start(
        self, answer: bytes, interval: int, kind: SubscribeKind | None, subscribed: bool
    ) -> None:
        self.clock = Clock()
        self.session = _session(self.clock, heartbeat_interval=interval)
        self.session.initiate()
        self.sent: list[int] = []
        self.answered: set[int] = set()
        self.ended = False
        self.messages: list[MessageFrame] = []
        self.detail = kind not in (None, SubscribeKind.PLAIN)
        self.check(self.session.receive_data(answer))
        if kind is not None:
            _, token, _ = self.session.subscribe(
                SubscribeCommand(kind, "t", "c", 0),
                on_message=self.messages.append,
                message_class=MessageFrame,
            )
            self.sent.append(token)
            if subscribed:
                self.check(self.session.receive_data(encode_response(OK)))

    def check(self, events: list[ev.Event]) -> None:
        answers = [token for token, _ in self.session.take()]
        assert not answers or not self.ended, "answers after the end"
        assert answers == sorted(answers)  # paired in the order sent
        for token in answers:
            self.answer(token)
        heartbeats = 0
        for event in events:
            assert isinstance(event, EVENT_TYPES), event
            assert not self.ended, f"{event} after the end"
            if isinstance(event, ev.RequestFailed):
                self.answer(event.token)
            if isinstance(
                event, (ev.RequestFailed, ev.UnsolicitedError, ev.SessionFailed, ev.Closed)
            ):
                assert isinstance(event.error, e.NSQError)
            if isinstance(event, (ev.SessionFailed, ev.Closed)):
                self.ended = True
            heartbeats += event is ev.HEARTBEAT_EVENT
        assert self.session.data_to_send() == commands.NOP * heartbeats
        if self.ended:
            assert self.session.pending_count == 0
            assert set(self.sent) == self.answered

    def answer(self, token: int) -> None:
        assert token in self.sent
        assert token not in self.answered  # once
        self.answered.add(token)

    @rule()
    def request(self) -> None:
        if self.session.accepts_requests:
            token, _ = self.session.send_request("PUB")
            self.sent.append(token)
        else:
            with pytest.raises((e.ProtocolError, e.ConnectionClosedError)):
                self.session.send_request("PUB")

    @rule()
    def close_subscription(self) -> None:
        if self.session.state is State.SUBSCRIBED:
            token, _ = self.session.send_request("CLS")
            self.sent.append(token)

    @rule(data=st.data())
    def server_sends(self, data: st.DataObject) -> None:
        """What nsqd sends: answers to what waits, heartbeats, messages once subscribed,
        errors of FIN and REQ."""
        kinds = data.draw(
            st.lists(st.sampled_from(["answer", "heartbeat", "message", "error"]), max_size=8)
        )
        unanswered = self.session.pending_count
        subscribed = self.session.state in (State.SUBSCRIBED, State.CLOSING)
        frames = []
        for kind in kinds:
            if kind == "answer" and unanswered:
                unanswered -= 1
                frames.append(encode_response(OK))
            elif kind == "message" and subscribed:
                frames.append(data.draw(_message(self.detail, whole=True)))
            elif kind == "error":
                frames.append(encode_error(data.draw(st.sampled_from(_ERROR_TEXTS[:3]))))
            else:
                frames.append(encode_response(HEARTBEAT))
        self.feed(data, b"".join(frames))

    @rule(data=st.data())
    def server_misbehaves(self, data: st.DataObject) -> None:
        self.feed(data, b"".join(data.draw(st.lists(_any_frames(self.detail), max_size=4))))

    def feed(self, data: st.DataObject, blob: bytes) -> None:
        """``blob`` cut anywhere."""
        cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
        for start, end in zip([0, *cuts], [*cuts, len(blob)], strict=True):
            events = self.session.receive_data(blob[start:end])
            if self.ended:
                assert events == []
            self.check(events)

    @rule(seconds=st.floats(0, 100))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        deadline = self.session.next_deadline()
        events = self.session.expired(self.clock.now)
        if deadline is None or deadline > self.clock.now:
            assert events == []
        self.check(events)
        if not self.ended:
            following = self.session.next_deadline()
            assert following is None or following > self.clock.now

    @rule()
    def connection_lost(self) -> None:
        closed_before = self.session.state is State.CLOSED
        events = self.session.connection_lost(e.ConnectionClosedError("gone"))
        if closed_before:
            assert events == []
            return
        self.ended = False  # a failed session gets closed too
        self.check(events)
        assert self.ended
        assert self.session.state is State.CLOSED

    def teardown(self) -> None:
        if hasattr(self, "session"):
            self.ended = False
            self.check(self.session.connection_lost(e.ConnectionClosedError("gone")))
            assert set(self.sent) == self.answered  # nobody is left waiting


SessionMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
TestSession = SessionMachine.TestCase
