"""The publish request and its argument conversions (smartnsq.publishing.request)."""

import json

import pytest

from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import MAX_DPUB_DELAY_MS
from smartnsq.publishing.request import (
    NO_KEY,
    PublishRequest,
    delay_to_ms,
    ext_with_trace_id,
    new_trace_ids,
)


def test_a_new_request_is_unbound_and_movable() -> None:
    request = PublishRequest("t", "PUB", [b"x"])
    assert request.key is NO_KEY
    assert request.partition is None
    assert request.pinned is None
    assert request.avoid == set()
    assert request.movable
    assert not request.batch


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
    by_partition = PublishRequest("t", "PUB", [b"x"])
    by_partition.partition = 0
    assert not by_partition.movable
    by_key = PublishRequest("t", "PUB", [b"x"])
    by_key.key = 0  # a falsy key is still a key
    assert not by_key.movable


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
