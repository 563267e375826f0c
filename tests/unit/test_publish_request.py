"""The publish request and its argument conversions (smartnsq.publishing.request)."""

import json

import pytest

from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.protocol.validation import MAX_DPUB_DELAY_MS
from smartnsq.publishing.request import (
    NO_KEY,
    PublishRequest,
    batch_extras,
    batch_request,
    delay_to_ms,
    ext_with_trace_id,
    message_request,
    new_trace_ids,
    plain_request,
)


def test_a_new_request_is_unbound_and_movable() -> None:
    request = PublishRequest("t", "PUB", [b"x"])
    assert request.key is NO_KEY
    assert request.partition is None
    assert request.movable
    assert not request.batch


def test_a_request_is_a_value() -> None:
    request = PublishRequest("t", "PUB", [b"x"], partition=1)
    assert request == PublishRequest("t", "PUB", [b"x"], partition=1)
    assert request != PublishRequest("t", "PUB", [b"x"], partition=2)
    assert "partition=1" in repr(request)
    with pytest.raises(AttributeError):
        request.pinned = 1  # type: ignore[attr-defined]  # no room for decisions
    with pytest.raises(AttributeError):
        request.topic = "y"  # type: ignore[misc]  # immutable at run time, not only typed so


def test_the_hot_path_makes_the_same_value() -> None:
    assert plain_request("t", b"x", 1) == PublishRequest("t", "PUB", [b"x"], partition=1)
    assert plain_request("t", b"x", None, "k") == PublishRequest("t", "PUB", [b"x"], key="k")
    assert type(plain_request("t", b"x")) is PublishRequest


@pytest.mark.parametrize(
    ("command", "batch"),
    [
        ("PUB", False),
        ("PUB_TRACE", False),
        ("PUB_EXT", False),
        ("DPUB", False),
        ("MPUB", True),
        ("MPUB_TRACE", True),
        ("MPUB_EXT", True),
    ],
)
def test_batch_follows_the_command(command: str, batch: bool) -> None:
    assert PublishRequest("t", command, [b"x"]).batch is batch


def test_a_partition_or_a_key_binds_a_request() -> None:
    assert not PublishRequest("t", "PUB", [b"x"], partition=0).movable
    assert not PublishRequest("t", "PUB", [b"x"], key=0).movable  # a falsy key is still a key


# --------------------------------------------------------------------------- message_request


def test_a_message_request_by_its_arguments() -> None:
    plain = message_request("t", b"x", partition=1)
    assert plain == PublishRequest("t", "PUB", [b"x"], partition=1)
    traced = message_request("t", b"x", trace_id=7)
    assert (traced.command, traced.trace_ids, traced.auto_trace) == ("PUB_TRACE", [7], False)
    ext = message_request("t", b"x", ext={"k": "v"})
    assert (ext.command, ext.exts, ext.trace_ids) == ("PUB_EXT", [b'{"k":"v"}'], None)
    both = message_request("t", b"x", trace_id=7, ext={"k": "v"})
    assert (both.command, both.trace_ids) == ("PUB_EXT", [7])
    assert both.exts is not None
    assert json.loads(both.exts[0] or b"") == {"k": "v", "##trace_id": "7"}
    deferred = message_request("t", b"x", delay=1.5)
    assert (deferred.command, deferred.delay_ms) == ("DPUB", 1500)


def test_the_trace_switch_traces_what_names_no_trace_and_has_no_delay() -> None:
    switched = message_request("t", b"x", switched_trace_id=lambda: 99)
    assert (switched.command, switched.trace_ids, switched.auto_trace) == ("PUB_TRACE", [99], True)
    explicit = message_request("t", b"x", trace_id=5, switched_trace_id=lambda: 99)
    assert (explicit.trace_ids, explicit.auto_trace) == ([5], False)
    deferred = message_request("t", b"x", delay=1, switched_trace_id=lambda: 99)
    assert (deferred.command, deferred.trace_ids) == ("DPUB", None)


def test_a_delay_goes_alone() -> None:
    for extra in ({"trace_id": 1}, {"ext": {"k": "v"}}):
        with pytest.raises(UnsupportedFeatureError, match="delay cannot be combined"):
            message_request("t", b"x", delay=1, **extra)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- batches


def test_batch_requests_by_their_extras() -> None:
    assert batch_request("t", [b"a"]).command == "MPUB"
    assert batch_request("t", [b"a"], trace_ids=[1]).command == "MPUB_TRACE"
    assert batch_request("t", [b"a"], exts=[None]).command == "MPUB_EXT"
    assert batch_request("t", [b"a"], address="h:1").address == "h:1"


def test_batch_extras() -> None:
    assert batch_extras(2) == (None, None, False)
    ids, exts, auto = batch_extras(2, trace=True)
    assert ids is not None
    assert len(ids) == 2
    assert (exts, auto) == (None, False)
    assert batch_extras(2, trace_ids=[1, 2]) == ([1, 2], None, False)
    ids, _, auto = batch_extras(2, switched=True)
    assert ids is not None
    assert len(ids) == 2
    assert auto
    assert batch_extras(2, trace_ids=[1, 2], switched=True) == ([1, 2], None, False)
    assert batch_extras(2, exts=[{"k": "v"}, None], switched=True) == (
        None,
        [b'{"k":"v"}', None],
        False,
    )


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"trace_ids": [1]}, ValidationError, "1 trace ids for 2 bodies"),
        ({"trace_ids": [1, -1]}, ValidationError, "trace_id"),
        ({"exts": [None]}, ValidationError, "1 ext headers for 2 bodies"),
        ({"trace": True, "exts": [None, None]}, UnsupportedFeatureError, "both"),
        ({"trace_ids": [1, 2], "exts": [None, None]}, UnsupportedFeatureError, "both"),
    ],
)
def test_batch_extras_refusals(arguments: dict[str, object], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        batch_extras(2, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seconds", "ms"),
    [(0, 0), (1, 1000), (0.0015, 2), (2.5, 2500), (MAX_DPUB_DELAY_MS / 1000, MAX_DPUB_DELAY_MS)],
)
def test_delay_to_ms(seconds: float, ms: int) -> None:
    assert delay_to_ms(seconds) == ms


@pytest.mark.parametrize("delay", [-1, -0.001, True, "1", None, MAX_DPUB_DELAY_MS / 1000 + 1])
def test_delay_to_ms_refuses(delay: object) -> None:
    with pytest.raises(ValidationError) as info:
        delay_to_ms(delay)  # type: ignore[arg-type]
    assert info.value.field == "delay"


def test_ext_with_trace_id_adds_the_id_as_a_string() -> None:
    ext, trace_id = ext_with_trace_id(b'{"k":"v"}', 12345, generated=False)
    assert trace_id == 12345
    assert json.loads(ext) == {"k": "v", "##trace_id": "12345"}
    assert b" " not in ext  # compact, as encode_ext writes headers


def test_ext_with_trace_id_keeps_non_ascii_text() -> None:
    ext, _ = ext_with_trace_id('{"name":"café"}'.encode(), 1, generated=True)
    assert "café".encode() in ext


def test_a_header_trace_id_wins_over_a_generated_one() -> None:
    original = b'{"##trace_id":"777","k":"v"}'
    ext, trace_id = ext_with_trace_id(original, 12345, generated=True)
    assert (ext, trace_id) == (original, 777)


def test_a_header_trace_id_must_agree_with_an_explicit_one() -> None:
    original = b'{"##trace_id":"777"}'
    assert ext_with_trace_id(original, 777, generated=False) == (original, 777)
    with pytest.raises(ValidationError) as info:
        ext_with_trace_id(original, 778, generated=False)
    assert info.value.field == "ext"


def test_new_trace_ids_are_random_uint64() -> None:
    ids = new_trace_ids(64)
    assert len(ids) == 64
    assert all(0 <= i < 1 << 64 for i in ids)
    assert len(set(ids)) > 1
    assert new_trace_ids(0) == []
