"""LogThrottle: one record per key per interval, and how many were held back."""

from smartnsq.flow.logthrottle import LogThrottle


def test_one_per_key_per_interval_with_the_count_held_back() -> None:
    now = [0.0]
    throttle = LogThrottle(10.0, clock=lambda: now[0])
    assert throttle.allow("a") == 0
    assert throttle.allow("a") is None
    assert throttle.allow("b") == 0  # keys are independent
    now[0] = 9.9
    assert throttle.allow("a") is None
    now[0] = 10.0
    assert throttle.allow("a") == 2  # two held back since the last one shown
    assert throttle.allow("a") is None
    now[0] = 25.0
    assert throttle.allow("a") == 1


def test_note() -> None:
    assert LogThrottle.note(0, 10) == ""
    assert LogThrottle.note(1, 10) == " (1 similar record in the last 10 s not shown)"
    assert LogThrottle.note(3, 2.5) == " (3 similar records in the last 2.5 s not shown)"
