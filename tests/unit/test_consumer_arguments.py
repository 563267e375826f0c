"""Consumer arguments are checked when the Consumer is created, not when first used."""

import math

import pytest

from smartnsq import Consumer
from smartnsq.errors import ValidationError

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
