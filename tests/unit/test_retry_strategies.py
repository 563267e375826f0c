"""A user's tenacity strategies space a producer's retries and a consumer's reconnections, and
end a failing publish (issue 34: tenacity was required and never used). Real tenacity
objects, asked through the pure publish flow's model; ``Backoff`` stays the default."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import tenacity

from smartnsq import Consumer, Producer
from smartnsq.errors import PubFailedError, PublishError, ValidationError
from smartnsq.flow.retry import Backoff, Delays, check_stop, check_wait, retry_state
from tests.unit.flow_model import World

NSQD = ["127.0.0.1:4150"]
DEFAULT = Backoff()


class Recording:
    """A tenacity wait or stop that notes what each RetryCallState said."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.states: list[tuple[int, type[BaseException] | None, float | None]] = []

    def __call__(self, state: tenacity.RetryCallState) -> Any:
        failure = state.outcome.exception() if state.outcome is not None else None
        self.states.append(
            (state.attempt_number, type(failure) if failure else None, state.seconds_since_start)
        )
        return self.strategy(state)


def _wait(strategy: Any) -> Delays:
    return check_wait("retry_backoff", strategy, DEFAULT)


def _fail_once(world: World) -> None:
    """The one link's nsqd refuses what it holds (E_PUB_FAILED: the link stays)."""
    link = world.links[0]
    world.process(link, fail=True)
    world.deliver(link)


# --------------------------------------------------------------------------- the adapters


def test_real_tenacity_waits_give_their_own_delays() -> None:
    exponential = _wait(tenacity.wait_exponential(multiplier=0.01, max=0.1))
    assert [exponential.delay(n) for n in range(1, 7)] == pytest.approx(
        [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    )
    assert _wait(tenacity.wait_fixed(0.3)).delay(5) == pytest.approx(0.3)
    jittered = _wait(tenacity.wait_random_exponential(multiplier=0.01, max=0.1))
    assert all(0 <= jittered.delay(n) <= 0.1 for n in range(1, 50))
    chained = _wait(tenacity.wait_fixed(0.2) + tenacity.wait_incrementing(0.1, 0.1))
    assert chained.delay(3) == pytest.approx(0.2 + 0.3)


def test_a_wait_hears_the_attempt_the_failure_and_the_time() -> None:
    recording = Recording(tenacity.wait_fixed(0.5))
    failure = PubFailedError("E_PUB_FAILED", fatal=False)
    assert _wait(recording).delay(4, failure, 2.5) == pytest.approx(0.5)
    (attempt, kind, since) = recording.states[0]
    assert (attempt, kind) == (4, PubFailedError)
    assert since == pytest.approx(2.5)


def test_real_tenacity_stops_decide_from_the_tries_and_the_time() -> None:
    failure = PubFailedError("E_PUB_FAILED", fatal=False)
    by_count = check_stop("retry_stop", tenacity.stop_after_attempt(3))
    assert by_count is not None
    assert [by_count.stops(n, failure, 0.0) for n in (1, 2, 3)] == [False, False, True]
    by_time = check_stop("retry_stop", tenacity.stop_after_delay(1.0))
    assert by_time is not None
    assert not by_time.stops(9, failure, 0.9)
    assert by_time.stops(1, failure, 1.0)
    either = check_stop(
        "retry_stop", tenacity.stop_after_attempt(5) | tenacity.stop_after_delay(1.0)
    )
    assert either is not None
    assert (either.stops(5, failure, 0.0), either.stops(1, failure, 2.0)) == (True, True)
    assert not either.stops(4, failure, 0.5)


def test_a_backoff_is_asked_directly_and_none_is_the_default() -> None:
    mine = Backoff(initial=0.2, maximum=0.4)
    assert check_wait("retry_backoff", mine, DEFAULT) is mine
    assert check_wait("retry_backoff", None, DEFAULT) is DEFAULT
    assert check_stop("retry_stop", None) is None
    # and a Backoff is a tenacity wait, for tenacity's own Retrying
    assert Backoff(initial=0.1, maximum=0.1, jitter=0)(retry_state(3, None, 0.0)) == 0.1


def test_the_state_is_a_real_retry_call_state() -> None:
    failure = PubFailedError("E_PUB_FAILED", fatal=False)
    state = retry_state(2, failure, 1.5)
    assert isinstance(state, tenacity.RetryCallState)
    assert state.outcome is not None
    assert state.outcome.failed
    assert state.outcome.exception() is failure
    assert state.seconds_since_start == pytest.approx(1.5)
    assert retry_state(1, None, 0.0).outcome is None


@pytest.mark.parametrize(
    "answer",
    [ZeroDivisionError, "soon", -1.0, math.nan, math.inf, None, True],
    ids=["raises", "str", "negative", "nan", "inf", "None", "bool"],
)
def test_a_broken_wait_falls_back_to_the_default_and_is_said_once(
    answer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(state: tenacity.RetryCallState) -> Any:
        if answer is ZeroDivisionError:
            raise ZeroDivisionError("the user's bug")
        return answer

    delays = check_wait("retry_backoff", broken, Backoff(initial=0.3, maximum=0.3, jitter=0))
    with caplog.at_level(logging.ERROR, logger="smartnsq.retry"):
        assert [delays.delay(n) for n in (1, 2, 3)] == [0.3, 0.3, 0.3]
    said = [r for r in caplog.records if "retry_backoff" in r.getMessage()]
    assert len(said) == 1


def test_a_stop_that_raises_lets_the_tries_go_on(caplog: pytest.LogCaptureFixture) -> None:
    def broken(state: tenacity.RetryCallState) -> bool:
        raise KeyError("the user's bug")

    stop = check_stop("retry_stop", broken)
    assert stop is not None
    with caplog.at_level(logging.ERROR, logger="smartnsq.retry"):
        assert not stop.stops(1, None, 0.0)
        assert not stop.stops(2, None, 0.0)
    assert len([r for r in caplog.records if "retry_stop" in r.getMessage()]) == 1


# --------------------------------------------------------------------------- arguments

BAD: list[tuple[str, object]] = [
    ("retry_backoff", 0.5),
    ("retry_backoff", "exponential"),
    ("retry_backoff", tenacity.stop_after_attempt(3)),  # a stop given as the wait
    ("retry_stop", 3),
    ("retry_stop", tenacity.wait_fixed(1)),  # a wait given as the stop
    ("retry_stop", Backoff()),
    ("retry_backoff", tenacity.wait_exponential),  # the class, not a wait
    ("retry_backoff", Backoff),
    ("retry_stop", tenacity.stop_after_attempt),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_a_bad_strategy_is_refused_when_the_producer_is_made(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Producer(nsqd=NSQD, **{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("value", [1.5, "fast", tenacity.stop_after_delay(5)])
def test_a_bad_reconnect_wait_is_refused_when_the_consumer_is_made(value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Consumer("t", "c", nsqd=NSQD, reconnect_backoff=value)  # type: ignore[arg-type]
    assert info.value.field == "reconnect_backoff"


def test_the_options_keep_what_was_given_and_use_it_adapted() -> None:
    wait = tenacity.wait_fixed(0.25)
    stop = tenacity.stop_after_attempt(2)
    producer = Producer(nsqd=NSQD, retry_backoff=wait, retry_stop=stop)
    assert (producer.options.retry_backoff, producer.options.retry_stop) == (wait, stop)
    assert producer.options.retry_delays.delay(7) == pytest.approx(0.25)
    consumer = Consumer("t", "c", nsqd=NSQD, reconnect_backoff=wait)
    assert consumer.options.reconnect_backoff is wait
    assert consumer.options.reconnect_delays.delay(3) == pytest.approx(0.25)
    default = Consumer("t", "c", nsqd=NSQD)
    assert isinstance(default.options.reconnect_delays, Backoff)


# --------------------------------------------------------------------------- the publish flow


def test_a_tenacity_wait_spaces_a_partitions_retries() -> None:
    recording = Recording(tenacity.wait_exponential(multiplier=0.1, max=0.4))
    world = World(delays=_wait(recording))
    p = world.publish(0)
    world.connect_all()
    expected = [0.1, 0.2, 0.4]
    for delay in expected:
        sent = len(world.sent)
        _fail_once(world)
        world.advance(delay - 0.01)
        assert len(world.sent) == sent  # not before the wait said
        world.advance(0.02)
        assert len(world.sent) == sent + 1
    world.roundtrip()
    assert p.results is not None
    assert p.results[0].tries == 4
    assert [(attempt, kind) for attempt, kind, _ in recording.states] == [
        (1, PubFailedError),
        (2, PubFailedError),
        (3, PubFailedError),
    ]
    # seconds since the partition started failing: the waits in between
    since = [s for _, _, s in recording.states]
    assert since[0] == pytest.approx(0.0)
    assert since[1:] == pytest.approx([0.11, 0.32], abs=0.011)


def test_a_tenacity_stop_ends_a_publish_before_its_deadline() -> None:
    world = World(stop=check_stop("retry_stop", tenacity.stop_after_attempt(3)))
    p = world.publish(0, timeout=60.0)
    world.connect_all()
    for _ in range(3):
        _fail_once(world)
        world.advance(0.1)
    assert isinstance(p.error, PublishError)
    assert p.error.tries == 3
    assert "retry_stop" in str(p.error)
    assert world.now < 1.0


def test_a_stop_after_delay_counts_from_the_publish_call() -> None:
    world = World(stop=check_stop("retry_stop", tenacity.stop_after_delay(0.5)))
    world.advance(3.0)  # the flow's clock is not the publish's
    p = world.publish(0, timeout=60.0)
    world.connect_all()
    while p.error is None:
        _fail_once(world)
        world.advance(0.1)
    assert isinstance(p.error, PublishError)
    assert "retry_stop" in str(p.error)
    assert 3.5 <= world.now <= 3.7


def test_the_deadline_ends_a_publish_whatever_the_strategies_say() -> None:
    world = World(
        delays=_wait(tenacity.wait_fixed(1000)),
        stop=check_stop("retry_stop", tenacity.stop_never),
    )
    p = world.publish(0, timeout=2.0)
    world.connect_all()
    _fail_once(world)
    world.advance(2.0)
    assert isinstance(p.error, PublishError)
    assert "timed out" in str(p.error)


def test_max_retries_and_a_stop_both_bound_a_publish() -> None:
    world = World(max_retries=1, stop=check_stop("retry_stop", tenacity.stop_after_attempt(5)))
    p = world.publish(0, timeout=60.0)
    world.connect_all()
    for _ in range(2):
        _fail_once(world)
        world.advance(0.1)
    assert isinstance(p.error, PublishError)
    assert "max_retries=1" in str(p.error)


def test_the_wait_is_asked_between_tries_only() -> None:
    """Not after the try the stop ended: nothing is left to space (a connection refused
    was the last to ask it anyway)."""
    wait = Recording(tenacity.wait_fixed(0.1))
    world = World(delays=_wait(wait), stop=check_stop("retry_stop", tenacity.stop_after_attempt(2)))
    p = world.publish(0, timeout=60.0)
    world.connect(ok=False)
    world.advance(0.1)
    world.connect(ok=False)
    assert isinstance(p.error, PublishError)
    assert p.error.tries == 2
    assert [attempt for attempt, _, _ in wait.states] == [1]
