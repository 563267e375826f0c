"""Queue positions in the pure floor: StartPosition's text forms, and the offsets read from
nsqd's /stats (the recorded answer, nsqd_stats_ptest.v1.json)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from smartnsq.errors import ProtocolError, ValidationError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.offsets import (
    PartitionOffsets,
    landed_offset,
    lies_past_end,
    parse_partition_offsets,
    setoffset_body,
    setoffset_params,
    stats_params,
    v1_error_message,
)

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "nsqd_http"
# The last unix second whose nanoseconds fit nsqd's int64 (2262-04-11).
MAX_SECONDS = (2**63 - 1) // 10**9


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        ("earliest", "virtual_queue:0"),
        ("latest", "special:-1"),
        (" latest ", "special:-1"),
        ("offset:1960", "virtual_queue:1960"),
        ("message:50", "msgcount:50"),
        ("timestamp:1795235396", "timestamp:1795235396"),
        ("timestamp:2026-11-24T10:00:00Z", "timestamp:1795514400"),
        ("timestamp:2026-11-24T11:00:00.9+01:00", "timestamp:1795514400"),
        ("timestamp:1795765880.5", "timestamp:1795765880"),  # nsqd works in whole seconds
        ("timestamp:1795765880.", "timestamp:1795765880"),
        ("virtual_queue:5", "virtual_queue:5"),
        ("msgcount:1", "msgcount:1"),
        ("special:-1", "special:-1"),
    ],
)
def test_parse(text: str, wire: str) -> None:
    position = StartPosition.parse(text)
    assert str(position) == wire
    assert StartPosition.parse(str(position)) == position
    assert setoffset_body(position) == wire.encode()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "first",
        "offset",
        "offset:",
        "offset:-1",
        "offset:1.5",
        "message:x",
        "special:0",
        "timestamp:2026-11-24T10:00:00",  # no UTC offset
        "timestamp:yesterday",
        "offset:9223372036854775808",
        "timestamp:-1.5",
        "timestamp:1.2.3",
        "timestamp:.",
    ],
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValidationError):
        StartPosition.parse(text)


@pytest.mark.parametrize("text", ["message:0", "msgcount:0", " message:00 "])
def test_message_counts_start_at_1(text: str) -> None:
    with pytest.raises(ValidationError, match="count from 1"):
        StartPosition.parse(text)
    with pytest.raises(ValidationError, match="start at 1"):
        StartPosition.message_count(0)
    # The wire form as is stays possible (nsqd reads it as the first message).
    assert str(StartPosition("msgcount", 0)) == "msgcount:0"


def test_a_timestamp_takes_a_float_and_drops_the_fraction() -> None:
    assert StartPosition.timestamp(1795765880.9) == StartPosition.timestamp(1795765880)
    now = time.time()
    assert StartPosition.timestamp(now).value == math.floor(now)
    assert str(StartPosition.timestamp(0.5)) == "timestamp:0"
    for bad in (float("nan"), float("inf"), -0.5, "1795765880", True, None):
        with pytest.raises(ValidationError, match="timestamp"):
            StartPosition.timestamp(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "unit"),
    [
        (time.time() * 1000 - 60_000, "milliseconds"),  # Kafka's unit, and Spark's option's
        (int(time.time() * 1000), "milliseconds"),
        (time.time_ns() // 1000, "microseconds"),
        (time.time_ns(), "nanoseconds"),
        (MAX_SECONDS + 1, "milliseconds"),
    ],
    ids=["ms-float", "ms", "us", "ns", "max+1"],
)
def test_a_timestamp_nsqd_cannot_represent_is_refused(value: float, unit: str) -> None:
    """nsqd multiplies the second by 10^9 in an int64: a second past 2262 wraps round and
    moves the channel somewhere nobody asked for (a millisecond value: to the end)."""
    with pytest.raises(ValidationError, match=f"in {unit}\\? divide by") as caught:
        StartPosition.timestamp(value)
    assert caught.value.field == "start.value"
    with pytest.raises(ValidationError, match=f"in {unit}\\?") as caught:
        StartPosition.parse(f"timestamp:{value}")
    assert caught.value.field == "position"
    with pytest.raises(ValidationError, match="nsqd can take"):
        StartPosition("timestamp", int(value))
    with pytest.raises(ValidationError, match="after the last second nsqd can take"):
        StartPosition.parse("timestamp:2262-04-12T00:00:00Z")
    assert StartPosition.timestamp(MAX_SECONDS).value == MAX_SECONDS == 9_223_372_036
    assert StartPosition.parse("timestamp:2262-04-11T00:00:00Z").value <= MAX_SECONDS


@pytest.mark.parametrize(
    ("position", "text"),
    [
        (StartPosition.earliest(), "earliest"),
        (StartPosition.latest(), "latest"),
        (StartPosition.queue_offset(1960), "offset:1960"),
        (StartPosition.message_count(51), "message:51"),
        (StartPosition.timestamp(1795235396), "timestamp:1795235396"),
    ],
)
def test_text_is_the_documented_form(position: StartPosition, text: str) -> None:
    assert position.text() == text
    assert StartPosition.parse(text) == position


def test_the_named_positions() -> None:
    assert StartPosition.earliest() == StartPosition.queue_offset(0)
    assert StartPosition.latest() == StartPosition.end() == StartPosition("special", -1)


def test_request_arguments_are_checked() -> None:
    assert setoffset_params("t", 2, "c") == {"topic": "t", "partition": "2", "channel": "c"}
    assert stats_params("t", 0, "c")["format"] == "json"
    with pytest.raises(ValidationError):
        setoffset_params("t", -1, "c")
    with pytest.raises(ValidationError):
        setoffset_body("earliest")  # type: ignore[arg-type]


def test_offsets_from_the_recorded_stats() -> None:
    payload = json.loads((RECORDED / "nsqd_stats_ptest.v1.json").read_text())
    offsets = parse_partition_offsets(payload, "ptest", 0, "init", "nsqd2:4151")
    # ten 38-byte messages, channel "init" at the start
    assert offsets == PartitionOffsets(0, "nsqd2:4151", 0, 380, position=0, depth=10, messages=10)
    assert offsets.lag == 380
    missing = parse_partition_offsets(payload, "ptest", 0, "other", "nsqd2:4151")
    assert (missing.end, missing.position, missing.depth, missing.lag) == (380, None, None, None)
    assert missing.messages == 10
    with pytest.raises(ProtocolError, match="does not list partition ptest-1"):
        parse_partition_offsets(payload, "ptest", 1, "init", "nsqd2:4151")


@pytest.mark.parametrize(
    ("position", "past_end", "landed"),
    [
        # a queue of 10 messages from 100 (older ones deleted) to 480, the channel at 300
        (StartPosition.queue_offset(481), True, 480),
        (StartPosition.queue_offset(480), False, 300),  # the end itself: /stats says where
        (StartPosition.message_count(12), True, 480),
        (StartPosition.message_count(11), False, 300),
        (StartPosition.latest(), False, 480),
        (StartPosition.earliest(), False, 100),
        (StartPosition.queue_offset(50), False, 100),
        (StartPosition.timestamp(1795765880), False, 300),
    ],
)
def test_where_a_seek_landed(position: StartPosition, past_end: bool, landed: int) -> None:
    queue = PartitionOffsets(0, "h:1", 100, 480, position=300, depth=5, messages=10)
    assert lies_past_end(position, queue) is past_end
    assert landed_offset(position, queue) == landed
    unknown = PartitionOffsets(0, "h:1", 100, 480, position=300, depth=5)  # no message_count
    assert not lies_past_end(StartPosition.message_count(999), unknown)


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {"topics": None},
        {"topics": [{"topic_name": "t", "topic_partition": "0", "backend_start": "0"}]},
        {"topics": [{"topic_name": "t", "topic_partition": "0", "backend_start": 0}]},
        {
            "topics": [
                {
                    "topic_name": "t",
                    "topic_partition": "0",
                    "backend_start": 0,
                    "backend_depth": 10,
                    "channels": [{"channel_name": "c", "depth": True, "depth_size": 0}],
                }
            ]
        },
    ],
)
def test_stats_of_the_wrong_shape(payload: object) -> None:
    with pytest.raises(ProtocolError):
        parse_partition_offsets(payload, "t", 0, "c", "n:1")


def test_v1_error_bodies_that_are_not_json() -> None:
    body = b'{"message":"strconv.ParseInt: parsing "x": invalid syntax"}'
    assert v1_error_message(body) == 'strconv.ParseInt: parsing "x": invalid syntax'
    assert v1_error_message(b"<html>") is None
