"""Consumer arguments are checked when the Consumer is created, not when first used."""

import math
from pathlib import Path
from typing import Any

import pytest

from smartnsq import Consumer
from smartnsq.errors import ValidationError
from smartnsq.protocol.commands import StartPosition

NSQD = ["127.0.0.1:4150"]


@pytest.mark.parametrize("field", ["requeue_delay", "max_requeue_delay"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1, "5", True])
def test_bad_requeue_delays_raise_at_construction(field: str, value: object) -> None:
    # Caught later, the check would raise inside the failure path of a handler, leaving the
    # failed message unanswered.
    with pytest.raises(ValidationError) as info:
        Consumer("t", "c", nsqd=NSQD, **{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_requeue_delays_are_stored_as_float_seconds() -> None:
    consumer = Consumer("t", "c", nsqd=NSQD, requeue_delay=0, max_requeue_delay=2.5)
    assert consumer.requeue_delay == 0.0
    assert isinstance(consumer.requeue_delay, float)
    assert consumer.max_requeue_delay == 2.5


@pytest.mark.parametrize("value", [-1, 1.0, True, None])
def test_bad_max_in_flight_raises_at_construction_and_when_changed(value: object) -> None:
    if value is not None:  # None is the default: one per subscription
        with pytest.raises(ValidationError, match="max_in_flight"):
            Consumer("t", "c", nsqd=NSQD, max_in_flight=value)  # type: ignore[arg-type]
    consumer = Consumer("t", "c", nsqd=NSQD, max_in_flight=3)
    with pytest.raises(ValidationError, match="max_in_flight"):
        consumer.set_max_in_flight(value)  # type: ignore[arg-type]
    assert consumer.max_in_flight == 3


def test_defaults_follow_the_mode() -> None:
    """Ordered consumers retry a failed message soon (it holds its partition meanwhile)
    and skip replays; max_in_flight follows the subscriptions until it is set."""
    plain = Consumer("t", "c", lookupd=["127.0.0.1:4161"])
    ordered = Consumer("t", "c", lookupd=["127.0.0.1:4161"], ordered=True)
    assert (plain.requeue_delay, ordered.requeue_delay) == (90.0, 0.1)
    assert (plain.skip_replays, ordered.skip_replays) == (False, True)
    assert plain.max_in_flight == 1  # one per subscription: none yet
    plain.set_max_in_flight(7)
    assert plain.max_in_flight == 7


# Arguments that were accepted, then failed in the background (the subscription retried
# forever) or deep inside with a TypeError; each is refused when the Consumer is made.
UNCHECKED: list[tuple[str, object]] = [
    ("start", "bogus"),
    ("start", 5),
    ("start", "offset:5"),  # StartPosition.parse reads it; start= takes positions, not text
    ("msg_timeout", 0),
    ("msg_timeout", 0.5),
    ("msg_timeout", -1),
    ("msg_timeout", "5"),
    ("msg_timeout", math.nan),
    ("msg_timeout", True),
    ("backoff", "yes"),
    ("backoff", 1),
    ("backoff", None),
    ("ordered", "yes"),
    ("ordered", 1),
    ("ordered_give_up", "yes"),
    ("raise_on_order_violation", "yes"),
    ("skip_replays", "yes"),
    ("partitions", 5),
    ("partitions", "01"),
    ("on_giving_up", 5),
    ("dead_letter_path", 5),
    ("desired_tag", 5),
    ("desired_tag", "x" * 200),
    ("heartbeat_interval", "5"),
    ("heartbeat_interval", math.nan),
    ("connect_timeout", math.nan),
    ("connect_timeout", math.inf),
    ("low_rdy_idle_timeout", 0),
    ("low_rdy_idle_timeout", math.nan),
    ("low_rdy_timeout", -1),
    ("low_rdy_timeout", "5"),
    ("reconnect_backoff", 5),
    ("handler_threads", 0),
    ("handler_threads", 1.5),
    ("handler_threads", True),
    ("lookup_manager", 5),
    ("tls", "yes"),
    ("auth_secret", 5),
    ("client_id", 5),
    ("user_agent", 5),
    ("tracer_provider", 5),
    ("meter_provider", 5),
]


@pytest.mark.parametrize(
    ("field", "value"), UNCHECKED, ids=[f"{f}={v!r}"[:40] for f, v in UNCHECKED]
)
def test_every_argument_is_checked_when_the_consumer_is_made(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Consumer("t", "c", lookupd=["127.0.0.1:4161"], **{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_a_bad_start_names_start_position() -> None:
    with pytest.raises(ValidationError, match=r"StartPosition\.earliest\(\)"):
        Consumer("t", "c", lookupd=["127.0.0.1:4161"], start="first")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "position"),
    [
        ("earliest", StartPosition.earliest()),
        ("latest", StartPosition.latest()),
        (StartPosition.message_count(3), StartPosition.message_count(3)),
        (None, None),
    ],
)
def test_the_named_positions_are_start_positions(start: Any, position: object) -> None:
    consumer = Consumer("t", "c", lookupd=["127.0.0.1:4161"], start=start)
    assert consumer.options.start == position
    assert consumer.options.start_position == position


def test_a_msg_timeout_in_range_is_kept() -> None:
    consumer = Consumer("t", "c", lookupd=["127.0.0.1:4161"], msg_timeout=30)
    assert consumer.options.connection_config.msg_timeout == 30


def test_a_dead_letter_path_that_can_never_be_written_is_refused(tmp_path: Path) -> None:
    """Accepted, it failed only when a message was given up: the line was never written."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused = {
        a_file / "dead.jsonl": "is a file, not a directory",
        a_file / "deeper" / "dead.jsonl": "is a file, not a directory",
        tmp_path / "missing" / "dead.jsonl": "does not exist",
        tmp_path: "is a directory",
    }
    for path, reason in refused.items():
        for given in (path, str(path)):
            with pytest.raises(ValidationError, match=reason) as info:
                Consumer("t", "c", nsqd=NSQD, dead_letter_path=given)
            assert info.value.field == "dead_letter_path"
    fine = tmp_path / "dead.jsonl"
    assert Consumer("t", "c", nsqd=NSQD, dead_letter_path=str(fine)).dead_letter_path == fine
    assert not fine.exists()  # made by the first dead letter, not by the check
