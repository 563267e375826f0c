"""BackoffPolicy delays, the one exponential formula, and the requeue-delay rule (pure
functions, no clock)."""

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ValidationError
from smartnsq.flow import BackoffPolicy, requeue_delay
from smartnsq.flow.backoff import exponential
from smartnsq.flow.retry import Backoff


def test_defaults_follow_go_nsq() -> None:
    policy = BackoffPolicy()
    assert policy.multiplier == 1.0
    assert policy.max_delay == 120.0  # max_backoff_duration: 2 min
    assert policy.strategy == "exponential"
    assert policy.enabled is True


def test_exponential_doubles_from_the_multiplier() -> None:
    policy = BackoffPolicy()
    assert [policy.delay(level) for level in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]


def test_exponential_is_capped_at_max_delay() -> None:
    policy = BackoffPolicy(multiplier=0.5, max_delay=10.0)
    assert [policy.delay(level) for level in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert policy.delay(10_000) == 10.0  # no overflow far past the cap


@pytest.mark.parametrize(
    ("multiplier", "max_delay", "max_level"),
    [
        (1.0, 120.0, 7),  # 64 s <= 120 s < 128 s
        (1.0, 128.0, 8),  # exactly on the cap still counts
        (1.0, 1.0, 1),
        (2.0, 3.0, 1),
        (0.25, 4.0, 5),
    ],
)
def test_max_level(multiplier: float, max_delay: float, max_level: int) -> None:
    policy = BackoffPolicy(multiplier=multiplier, max_delay=max_delay)
    assert policy.max_level == max_level
    assert policy.delay(max_level) <= max_delay
    assert multiplier * 2**max_level > max_delay  # the next level would be capped


def test_full_jitter_scales_the_capped_exponential_by_rand() -> None:
    policy = BackoffPolicy(multiplier=1.0, max_delay=5.0, strategy="full_jitter")
    assert policy.delay(3, lambda: 0.5) == 2.0
    assert policy.delay(3, lambda: 0.0) == 0.0
    assert policy.delay(10, lambda: 0.5) == 2.5  # half of the capped 5 s
    assert 0.0 <= policy.delay(3) <= 4.0  # random.random by default


def test_exponential_ignores_rand() -> None:
    calls: list[int] = []

    def rand() -> float:
        calls.append(1)
        return 0.1

    assert BackoffPolicy().delay(2, rand) == 2.0
    assert calls == []


@given(
    multiplier=st.floats(0.001, 10.0),
    extra=st.floats(0.0, 1000.0),
    level=st.integers(1, 2000),
    fraction=st.floats(0.0, 1.0),
)
def test_delays_stay_within_bounds(
    multiplier: float, extra: float, level: int, fraction: float
) -> None:
    policy = BackoffPolicy(multiplier=multiplier, max_delay=multiplier + extra)
    delay = policy.delay(level)
    assert multiplier <= delay <= policy.max_delay
    jittered = BackoffPolicy(
        multiplier=multiplier, max_delay=multiplier + extra, strategy="full_jitter"
    ).delay(level, lambda: fraction)
    assert 0.0 <= jittered <= delay
    assert policy.delay(policy.max_level) == multiplier * 2 ** (policy.max_level - 1)


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("multiplier", {"multiplier": 0}),
        ("multiplier", {"multiplier": -1.0}),
        ("multiplier", {"multiplier": math.nan}),
        ("multiplier", {"multiplier": "1"}),
        ("multiplier", {"multiplier": True}),
        ("multiplier", {"multiplier": 200.0}),  # over max_delay
        ("max_delay", {"max_delay": 0.0}),
        ("max_delay", {"max_delay": math.inf}),
        ("strategy", {"strategy": "linear"}),
        ("enabled", {"enabled": 1}),
    ],
)
def test_policy_validation(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        BackoffPolicy(**kwargs)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


def test_delay_validation() -> None:
    policy = BackoffPolicy(strategy="full_jitter")
    for level in (0, -1, 1.5, True):
        with pytest.raises(ValidationError) as info:
            policy.delay(level)  # type: ignore[arg-type]
        assert info.value.field == "level"
    with pytest.raises(ValidationError) as info:
        policy.delay(1, lambda: 1.5)
    assert info.value.field == "rand"


def test_policy_is_frozen() -> None:
    policy = BackoffPolicy()
    with pytest.raises(AttributeError):
        policy.multiplier = 2.0  # type: ignore[misc]


# ------------------------------------------------------------------ requeue delay


@pytest.mark.parametrize(
    ("attempts", "base", "maximum", "expected"),
    [
        (1, 90.0, 900.0, 90.0),  # go-nsq defaults: 90 s, 15 min
        (3, 90.0, 900.0, 270.0),
        (10, 90.0, 900.0, 900.0),
        (50, 90.0, 900.0, 900.0),
        (0, 90.0, 900.0, 0.0),
        (4, 0, 10, 0.0),
        (2, 1.5, 60, 3.0),
    ],
)
def test_requeue_delay(attempts: int, base: float, maximum: float, expected: float) -> None:
    assert requeue_delay(attempts, base, maximum) == expected
    assert isinstance(requeue_delay(attempts, base, maximum), float)


@pytest.mark.parametrize(
    ("field", "args"),
    [
        ("attempts", (-1, 1.0, 10.0)),
        ("attempts", (1.0, 1.0, 10.0)),
        ("attempts", (True, 1.0, 10.0)),
        ("base", (1, -1.0, 10.0)),
        ("base", (1, math.inf, 10.0)),
        ("base", (1, "1", 10.0)),
        ("maximum", (1, 1.0, -0.5)),
        ("maximum", (1, 1.0, math.nan)),
    ],
)
def test_requeue_delay_validation(field: str, args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(ValidationError) as info:
        requeue_delay(*args)
    assert info.value.field == field


def test_one_exponential_formula_for_every_wait() -> None:
    """The consumer's backoff windows, the retry/reconnect backoff and the lookup's
    down-ranking all wait exponential(attempt, first, maximum, multiplier)."""
    assert [exponential(n, 0.5, 3.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert exponential(10_000, 1.0, 120.0) == 120.0  # no overflow far past the cap
    assert exponential(3, 1.0, 100.0, multiplier=3.0) == 9.0
    policy = BackoffPolicy(multiplier=0.5, max_delay=3.0)
    assert [policy.delay(n) for n in (1, 3, 5)] == [exponential(n, 0.5, 3.0) for n in (1, 3, 5)]
    steady = Backoff(initial=0.5, maximum=3.0, jitter=0.0)
    assert [steady.delay(n) for n in (1, 3, 5)] == [exponential(n, 0.5, 3.0) for n in (1, 3, 5)]
