"""Every error code nsqd sends (internal/protocol/errors.go, both servers) maps to a typed
exception with the right flags."""

from typing import Any

import pytest

from smartnsq import errors as e
from smartnsq.protocol.errors import ERROR_CLASSES, error_code, error_from_frame, is_fatal
from tests.fixtures import wire

# code -> (class, fatal after a publish, fatal after SUB/FIN, retriable, refresh_lookup)
TABLE: dict[str, tuple[type[e.ServerError], bool, bool, bool, bool]] = {
    "E_INVALID": (e.InvalidCommandError, True, True, False, False),
    "E_BAD_TOPIC": (e.BadTopicError, True, True, False, False),
    "E_BAD_CHANNEL": (e.BadChannelError, True, True, False, False),
    "E_BAD_PARTITION": (e.BadPartitionError, True, True, False, False),
    "E_BAD_BODY": (e.BadBodyError, True, True, False, False),
    "E_BAD_MESSAGE": (e.BadMessageError, True, True, False, False),
    "E_TOPIC_NOT_EXIST": (e.TopicNotExistError, True, True, True, True),
    "E_FAILED_ON_NOT_LEADER": (e.NotLeaderError, False, True, True, True),
    "E_FAILED_ON_NOT_WRITABLE": (e.NotWritableError, False, True, True, True),
    "E_PUB_FAILED": (e.PubFailedError, False, False, True, True),
    "E_MPUB_FAILED": (e.MPubFailedError, False, False, True, True),
    "E_PUB_TOO_MUCH_WAITING": (e.PubTooMuchWaitingError, True, True, True, False),
    "E_EXT_NOT_SUPPORT": (e.ExtNotSupportedError, False, False, False, False),
    "E_INVALID_JSON_HEADER": (e.InvalidJsonHeaderError, False, False, False, False),
    "INVALID_TRACE_ID": (e.InvalidTraceIdError, False, False, False, False),
    "E_BAD_TAG": (e.BadTagError, False, False, False, False),
    "E_TAG_NOT_SUPPORT": (e.TagNotSupportedError, False, False, False, False),
    "E_SUB_ORDER_IS_MUST": (e.OrderedSubscribeRequiredError, True, True, False, False),
    "E_SUB_EXTEND_NEED": (e.ExtendSupportRequiredError, True, True, True, True),
    "E_SUB_EXTEND_FORBIDDON": (e.ExtendSupportForbiddenError, True, True, True, True),
    "E_SUB_CHANNEL_NOT_REGISTERED": (e.ChannelNotRegisteredError, True, True, False, False),
    "E_FIN_FAILED": (e.FinFailedError, False, False, False, False),
    "E_REQ_FAILED": (e.ReqFailedError, False, False, False, False),
    "E_TOUCH_FAILED": (e.TouchFailedError, False, False, False, False),
    "E_IDENTIFY_FAILED": (e.IdentifyFailedError, True, True, False, False),
    "E_AUTH_FIRST": (e.AuthFirstError, True, True, False, False),
    "E_AUTH_FAILED": (e.AuthFailedError, True, True, False, False),
    "E_UNAUTHORIZED": (e.UnauthorizedError, True, True, False, False),
    "E_AUTH_DISABLED": (e.AuthDisabledError, True, True, False, False),
    # nsqd answers it with a non-fatal ClientErr (protocol_v2.go internalCreateTopic)
    "E_CREATE_TOPIC_FAILED": (e.CreateTopicFailedError, False, False, False, False),
    "E_BAD_EXT": (e.BadExtError, True, True, False, False),
    "E_BAD_PROTOCOL": (e.BadProtocolError, True, True, False, False),
    "E_DPUB_FAILED": (e.DPubFailedError, True, True, True, False),
}


def test_registry_covers_every_documented_code() -> None:
    assert set(ERROR_CLASSES) == set(TABLE)


@pytest.mark.parametrize("code", sorted(TABLE))
def test_classification(code: str) -> None:
    cls, fatal_pub, fatal_sub, retriable, refresh = TABLE[code]
    # Real servers append a space even with no description.
    for text in (f"{code} ", f"{code} some description"):
        err = error_from_frame(text.encode(), "PUB", "127.0.0.1:4150")
        assert type(err) is cls
        assert isinstance(err, e.ServerError)
        assert isinstance(err, e.NSQError)
        assert err.code == code
        assert err.message == text
        assert err.fatal is fatal_pub
        assert err.retriable is retriable
        assert err.refresh_lookup is refresh
        assert err.address == "127.0.0.1:4150"
        assert error_from_frame(text, "SUB").fatal is fatal_sub
        assert error_from_frame(text, "FIN").fatal is fatal_sub
        assert is_fatal(code, "MPUB_TRACE") is fatal_pub


def test_unknown_code_is_generic_and_fatal() -> None:
    err = error_from_frame(b"E_SOMETHING_NEW what is this", "PUB")
    assert type(err) is e.UnknownServerError
    assert err.code == "E_SOMETHING_NEW"
    assert err.fatal
    assert err.retriable


def test_garbage_never_crashes() -> None:
    for payload in (b"", b" ", b"\xff\xfe", b"\n"):
        err = error_from_frame(payload, None)
        assert isinstance(err, e.ServerError)


def test_bad_protocol_magic_is_typed_and_says_what_to_check() -> None:
    # nsqd's frame after a bad magic is the bare code: no description, no space
    err = error_from_frame(b"E_BAD_PROTOCOL", "IDENTIFY", "127.0.0.1:4151")
    assert type(err) is e.BadProtocolError
    assert (err.code, err.message, err.fatal, err.retriable) == (
        "E_BAD_PROTOCOL",
        "E_BAD_PROTOCOL",
        True,
        False,
    )
    assert "nsqd TCP address" in str(err)
    assert "127.0.0.1:4151" in str(err)


def test_auth_disabled_is_typed_and_fatal() -> None:
    err = error_from_frame(b"E_AUTH_DISABLED AUTH Disabled", "AUTH")
    assert type(err) is e.AuthDisabledError
    assert isinstance(err, e.AuthError)
    assert err.fatal
    assert not err.retriable


def test_too_many_connections() -> None:
    err = error_from_frame(b"too much client connections", None)
    assert type(err) is e.TooManyConnectionsError
    assert err.retriable


def test_ordered_subscribe_error_tells_what_to_do() -> None:
    err = error_from_frame(
        b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub", "SUB"
    )
    assert "ordered=True" in str(err)


@pytest.mark.parametrize("case", wire()["errors"], ids=lambda c: f"{c['command']}:{c['text'][:30]}")
def test_captured_error_frames(case: dict[str, Any]) -> None:
    observed = wire()["observed_connection_closed_after"]
    err = error_from_frame(bytes.fromhex(case["hex"])[8:], case["command"])
    assert err.code == error_code(case["text"])
    assert err.code in ERROR_CLASSES
    key = err.code
    if key == "E_FAILED_ON_NOT_LEADER":
        key += " after SUB" if case["command"] == "SUB" else " after PUB/MPUB"
    if key in observed:
        assert err.fatal is observed[key]


def test_server_error_str_names_address() -> None:
    err = error_from_frame(b"E_BAD_TOPIC nope", "PUB", "10.0.0.1:4150")
    assert str(err) == "E_BAD_TOPIC nope (from 10.0.0.1:4150)"
