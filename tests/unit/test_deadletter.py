"""The dead-letter record: every field of the given-up message, bodies that are not UTF-8
kept as escapes, and a file that cannot be written reported, not raised."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, cast

import pytest

from smartnsq.consumer.deadletter import dead_letter_record, write_dead_letter
from smartnsq.consumer.message import Message
from smartnsq.consumer.subscription import Subscription
from smartnsq.protocol.message import EXT_VERSION_JSON, EXT_VERSION_NONE


def _message(body: bytes, ext: bytes | None = None) -> Message:
    sub = Subscription(cast(Any, None), "orders", "audit", ("127.0.0.1:4150", 3), cast(Any, None))
    message = Message(
        1_700_000_000_000_000_000,
        5,
        bytes(range(16)),
        42,
        7,
        EXT_VERSION_JSON if ext else EXT_VERSION_NONE,
        ext,
        None,
        None,
        body,
    )
    message.lane = sub
    return message


def test_record_keeps_every_field() -> None:
    message = _message(b"hello", b'{"k":"v"}')
    record = dead_letter_record(message, given_up_at=12.5)
    assert record == {
        "topic": "orders",
        "channel": "audit",
        "partition": 3,
        "id": bytes(range(16)).hex(),
        "internal_id": 42,
        "trace_id": 7,
        "attempts": 5,
        "attempts_run": 5,
        "timestamp": 1_700_000_000_000_000_000,
        "ext": {"k": "v"},
        "body": "hello",
        "given_up_at": 12.5,
    }


def test_binary_body_is_escaped_not_lost(tmp_path: Path) -> None:
    path = tmp_path / "dead.jsonl"
    assert write_dead_letter(_message(b"\xff\x00ok"), path)
    assert write_dead_letter(_message(b"second"), path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["body"] for line in lines] == ["\\xff\x00ok", "second"]


def test_unwritable_file_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "missing-dir" / "dead.jsonl"
    with caplog.at_level(logging.ERROR, logger="smartnsq.consumer"):
        assert not write_dead_letter(_message(b"x"), path)
    assert "cannot write the dead-letter file" in caplog.text
    assert not path.exists()
