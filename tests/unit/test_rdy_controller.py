"""RdyController: distribution, low-RDY rotation, backoff and starvation, on a fake clock.

Every test drives the controller through :class:`Harness`, which applies each returned update
list to a model of what the consumer wrote and checks the invariants after every step.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from smartnsq.errors import ValidationError
from smartnsq.flow import BackoffPolicy, RdyController
from smartnsq.flow.rdy import Outcome

Updates = list[tuple[str, int]]


class FakeClock:
    """Monotonic seconds that only move when a test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    """A controller plus a model of the RDY counts written so far, checked after each call."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        backoff: BackoffPolicy | None = None,
        rand: Any = None,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
    ) -> None:
        self.clock = FakeClock()
        self.ctl: RdyController[str] = RdyController(
            max_in_flight,
            clock=self.clock,
            backoff=backoff,
            rand=rand,
            low_rdy_idle_timeout=low_rdy_idle_timeout,
            low_rdy_timeout=low_rdy_timeout,
        )
        self.sent: dict[str, int] = {}
        self.caps: dict[str, int] = {}
        self.in_flight: dict[str, int] = {}
        self.check([])

    # -- invariants

    def check(self, updates: Updates, before: int | None = None) -> Updates:
        budget = self.ctl.max_in_flight
        total = sum(self.sent.values()) if before is None else before
        ceiling = max(budget, total)
        increased = False
        for key, count in updates:
            assert key in self.caps, f"RDY for unknown connection {key!r}"
            old = self.sent[key]
            if count < old:
                assert not increased, f"decrease after an increase in {updates}"
            elif count > old:
                increased = True
            total += count - old
            assert total <= ceiling, f"budget exceeded while writing {updates}"
            self.sent[key] = count
        assert total <= budget
        assert self.ctl.total_rdy() == total
        assert self.ctl.keys() == list(self.caps)
        for key, cap in self.caps.items():
            assert 0 <= self.sent[key] <= cap
            assert self.ctl.rdy(key) == self.sent[key]
            assert self.ctl.in_flight(key) == self.in_flight[key]
        assert self.ctl.is_starved() == any(
            self.in_flight[k] > 0 and self.in_flight[k] >= self.sent[k] * 0.85 for k in self.caps
        )
        return updates

    # -- events

    def add(self, key: str, max_rdy_count: int = 2500, *, keeps_count: bool = False) -> Updates:
        self.caps[key] = max_rdy_count
        self.sent[key] = 0
        self.in_flight[key] = 0
        return self.check(self.ctl.add_connection(key, max_rdy_count, keeps_count=keeps_count))

    def remove(self, key: str) -> Updates:
        before = sum(self.sent.values()) - self.sent.get(key, 0)
        self.caps.pop(key, None)
        self.sent.pop(key, None)
        self.in_flight.pop(key, None)
        return self.check(self.ctl.remove_connection(key), before)

    def message(self, key: str) -> Updates:
        if key in self.in_flight:
            self.in_flight[key] += 1
        return self.check(self.ctl.on_message(key))

    def messages(self, key: str, count: int) -> Updates:
        out: Updates = []
        for _ in range(count):
            out += self.message(key)
        return out

    def done(self, key: str, outcome: Outcome = "success") -> Updates:
        if self.in_flight.get(key, 0) > 0:
            self.in_flight[key] -= 1
        return self.check(self.ctl.on_done(key, outcome))

    def process(self, key: str, outcome: Outcome = "success") -> Updates:
        """One message arrives on ``key`` and is answered."""
        return self.message(key) + self.done(key, outcome)

    def set_max(self, max_in_flight: int) -> Updates:
        before = sum(self.sent.values())
        return self.check(self.ctl.set_max_in_flight(max_in_flight), before)

    def tick(self) -> Updates:
        return self.check(self.ctl.tick())

    def advance(self, seconds: float) -> Updates:
        self.clock.advance(seconds)
        return self.tick()

    def to_deadline(self) -> Updates:
        deadline = self.ctl.next_deadline()
        assert deadline is not None
        self.clock.now = max(self.clock.now, deadline)  # a deadline may already be due
        return self.tick()

    def holders(self) -> list[str]:
        return [k for k, n in self.sent.items() if n > 0]


def settled(h: Harness, *keys: str) -> None:
    """One message on each key, so none is at its initial RDY 1 any more."""
    for key in keys:
        h.process(key)


# ------------------------------------------------------------------ distribution


def test_new_connection_starts_at_rdy_1_then_gets_its_share() -> None:
    h = Harness(10)
    assert h.add("a") == [("a", 1)]
    assert h.message("a") == [("a", 10)]
    assert h.done("a") == []
    assert h.process("a") == []


def test_even_spread_with_remainder_in_insertion_order() -> None:
    h = Harness(10)
    h.add("a")
    settled(h, "a")
    # Adding b: a gives its half back first, then b starts at 1.
    assert h.add("b") == [("a", 5), ("b", 1)]
    assert h.message("b") == [("b", 5)]
    assert h.add("c") == [("a", 4), ("b", 3), ("c", 1)]
    assert h.message("c") == [("c", 3)]
    assert h.sent == {"a": 4, "b": 3, "c": 3}
    h.add("d")
    h.add("e")
    h.add("f")
    settled(h, "d", "e", "f")
    assert h.sent == {"a": 2, "b": 2, "c": 2, "d": 2, "e": 1, "f": 1}


def test_initial_rdy_does_not_lend_its_share_to_others() -> None:
    h = Harness(9)
    h.add("a")
    settled(h, "a")
    h.add("b")
    h.add("c")
    assert h.sent == {"a": 3, "b": 1, "c": 1}
    assert h.ctl.total_rdy() == 5  # the rest is reserved for b and c's first message


def test_max_rdy_count_caps_and_leaves_the_rest_to_others() -> None:
    h = Harness(1000)
    h.add("a", max_rdy_count=100)
    h.add("b")
    h.add("c", max_rdy_count=50)
    settled(h, "a", "b", "c")
    assert h.sent == {"a": 100, "b": 850, "c": 50}


def test_budget_over_the_sum_of_caps() -> None:
    h = Harness(10_000)
    h.add("a")
    h.add("b", max_rdy_count=100)
    settled(h, "a", "b")
    assert h.sent == {"a": 2500, "b": 100}
    h.set_max(200)
    assert h.sent == {"a": 100, "b": 100}
    h.set_max(151)
    assert h.sent == {"a": 76, "b": 75}


def test_refresh_below_a_quarter_of_the_last_rdy() -> None:
    h = Harness(100)
    h.add("a")
    assert h.message("a") == [("a", 100)]  # remaining 100 again
    # The refresh comes when fewer than 25 remain: after the 76th message.
    assert h.messages("a", 75) == []
    assert h.message("a") == [("a", 100)]
    assert h.messages("a", 75) == []
    assert h.message("a") == [("a", 100)]


def test_refresh_at_rdy_1_every_message_but_never_at_rdy_0() -> None:
    h = Harness(1)
    h.add("a")
    assert h.message("a") == [("a", 1)]
    assert h.message("a") == [("a", 1)]
    h.set_max(0)
    assert h.messages("a", 5) == []  # late messages after RDY 0: nothing to refresh


def test_no_refresh_to_a_server_that_keeps_the_count() -> None:
    """nsqd since 0.2.29 (youzan's too) keeps the RDY count as sent: it is never sent again
    as messages arrive, at RDY 1 (an ordered partition's count) or at any other."""
    h = Harness(1)
    assert h.add("a", keeps_count=True) == [("a", 1)]
    assert h.messages("a", 5) == []
    h = Harness(100)
    assert h.add("a", keeps_count=True) == [("a", 1)]
    assert h.message("a") == [("a", 100)]  # its share after the first message, as always
    assert h.messages("a", 300) == []
    assert h.sent == {"a": 100}


def test_testing_the_waters_on_servers_that_keep_the_count() -> None:
    """The first message after a backoff window is the probe whether or not the server
    needs its count refreshed."""
    policy = BackoffPolicy(multiplier=1.0, max_delay=8.0)
    h = Harness(40, backoff=policy)
    for key in "abcd":
        h.add(key, keeps_count=True)
    settled(h, *"abcd")
    h.process("a", "failure")
    assert h.to_deadline() == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    assert h.message("c") == [("a", 0), ("b", 0), ("d", 0), ("c", 1)]
    assert h.message("c") == []  # the probe holds RDY 1: nothing to refresh
    assert h.done("c") == [("a", 10), ("b", 10), ("c", 10), ("d", 10)]


def test_pause_and_resume_with_set_max_in_flight() -> None:
    h = Harness(10)
    h.add("a")
    h.add("b")
    settled(h, "a", "b")
    assert h.set_max(0) == [("a", 0), ("b", 0)]
    assert h.ctl.total_rdy() == 0
    assert h.process("a") == []
    assert h.set_max(0) == []
    assert h.set_max(20) == [("a", 10), ("b", 10)]
    assert h.set_max(6) == [("a", 3), ("b", 3)]


def test_connections_added_while_paused_start_at_zero() -> None:
    h = Harness(0)
    assert h.add("a") == []
    assert h.set_max(4) == [("a", 1)]
    assert h.message("a") == [("a", 4)]


def test_removing_a_connection_redistributes() -> None:
    h = Harness(10)
    for key in "abc":
        h.add(key)
    settled(h, "a", "b", "c")
    assert h.sent == {"a": 4, "b": 3, "c": 3}
    assert h.remove("a") == [("b", 5), ("c", 5)]
    assert h.remove("c") == [("b", 10)]
    assert h.remove("b") == []
    assert h.ctl.total_rdy() == 0


def test_set_max_in_flight_decreases_before_increases() -> None:
    h = Harness(3)
    h.add("a", max_rdy_count=1)
    h.add("b")
    h.add("c")
    settled(h, "a", "b", "c")
    assert h.sent == {"a": 1, "b": 1, "c": 1}
    h.set_max(7)
    assert h.sent == {"a": 1, "b": 3, "c": 3}
    h.remove("c")
    assert h.sent == {"a": 1, "b": 6}
    assert h.add("d") == [("b", 3), ("d", 1)]


def test_unknown_keys_are_tolerated() -> None:
    h = Harness(4, backoff=BackoffPolicy())
    h.add("a")
    assert h.message("ghost") == []
    assert h.done("ghost", "failure") == []
    assert h.remove("ghost") == []
    h.message("a")
    h.remove("a")
    # The answer of a message from a closed connection: no crash, no backoff.
    assert h.done("a", "failure") == []
    assert not h.ctl.in_backoff()
    with pytest.raises(KeyError):
        h.ctl.rdy("a")
    with pytest.raises(KeyError):
        h.ctl.in_flight("a")


def test_extra_done_never_makes_in_flight_negative() -> None:
    h = Harness(4)
    h.add("a")
    h.ctl.on_done("a", "success")
    assert h.ctl.in_flight("a") == 0


# ------------------------------------------------------------------ is_starved


def test_is_starved_follows_the_guide() -> None:
    h = Harness(10)
    h.add("a")
    h.add("b")
    settled(h, "a", "b")
    assert h.sent == {"a": 5, "b": 5}
    assert not h.ctl.is_starved()
    h.messages("a", 4)  # 4 < 0.85 * 5
    assert not h.ctl.is_starved()
    h.message("a")  # 5 >= 4.25
    assert h.ctl.is_starved()
    h.done("a")
    assert not h.ctl.is_starved()
    h.message("a")
    assert h.ctl.is_starved()
    # A higher RDY (b leaves) un-starves a: 5 < 8.5
    h.remove("b")
    assert not h.ctl.is_starved()
    h.set_max(0)  # in flight with RDY 0: nothing more will come
    assert h.ctl.is_starved()
    for _ in range(5):
        h.done("a")
    assert not h.ctl.is_starved()


def test_is_starved_at_rdy_1_with_one_message() -> None:
    h = Harness(1)
    h.add("a")
    assert not h.ctl.is_starved()
    h.message("a")
    assert h.ctl.is_starved()
    h.done("a")
    assert not h.ctl.is_starved()


def test_removing_a_starved_connection_clears_starvation() -> None:
    h = Harness(1)
    h.add("a")
    h.message("a")
    assert h.ctl.is_starved()
    h.remove("a")
    assert not h.ctl.is_starved()


# ------------------------------------------------------------------ fewer units than connections


def test_low_rdy_new_connections_wait_in_line() -> None:
    h = Harness(2)
    assert h.add("a") == [("a", 1)]
    assert h.add("b") == [("b", 1)]
    assert h.add("c") == []
    assert h.add("d") == []
    assert h.holders() == ["a", "b"]
    assert h.message("a") == [("a", 1)]  # refresh only: one unit each


def test_low_rdy_idle_holder_hands_over_and_everyone_is_served() -> None:
    h = Harness(1)
    for key in "abcd":
        h.add(key)
    assert h.holders() == ["a"]
    assert h.ctl.next_deadline() == h.clock.now + 10.0
    assert h.advance(9.999) == []
    assert h.advance(0.001) == [("a", 0), ("b", 1)]
    served = ["a", "b"]
    for _ in range(3):
        deadline = h.ctl.next_deadline()
        assert deadline == h.clock.now + 10.0
        h.to_deadline()
        served += h.holders()
    assert served == ["a", "b", "c", "d", "a"]


def test_low_rdy_active_holder_keeps_its_slot_until_low_rdy_timeout() -> None:
    h = Harness(1)
    h.add("a")
    h.add("b")
    h.add("c")
    start = h.clock.now
    # a gets a message every 5 s: never idle, but it must hand over after 30 s.
    while h.clock.now < start + 25:
        assert h.advance(5) == []
        h.process("a")
        assert h.holders() == ["a"]
    assert h.ctl.next_deadline() == start + 30
    assert h.advance(4.5) == []
    assert h.advance(0.5) == [("a", 0), ("b", 1)]
    # b is busy too: it hands over to c (who waited longest), then c to a.
    for _ in range(6):
        h.advance(5)
        h.process("b")
    assert h.holders() == ["c"]
    h.to_deadline()
    assert h.holders() == ["a"]


def test_low_rdy_late_tick_rotates_every_expired_holder_at_once() -> None:
    h = Harness(2)
    for key in "abcde":
        h.add(key)
    assert h.holders() == ["a", "b"]
    h.clock.advance(500)
    assert h.tick() == [("a", 0), ("b", 0), ("c", 1), ("d", 1)]
    assert h.tick() == []  # repeated tick: nothing due
    h.clock.advance(500)
    # e waited longest, then a and b (same time: insertion order)
    assert h.tick() == [("c", 0), ("d", 0), ("a", 1), ("e", 1)]


def test_low_rdy_holder_without_anyone_waiting_keeps_its_slot() -> None:
    h = Harness(2)
    for key in "abc":
        h.add(key)
    h.clock.advance(10)
    # a and b both expire, only c waits: a (first in insertion order) hands over.
    assert h.tick() == [("a", 0), ("c", 1)]
    assert h.holders() == ["b", "c"]
    assert h.ctl.next_deadline() == h.clock.now + 10


def test_low_rdy_removing_a_holder_promotes_the_longest_waiting() -> None:
    h = Harness(1)
    for key in "abc":
        h.add(key)
    h.advance(10)
    assert h.holders() == ["b"]
    # Now c has waited since the start, a since the rotation.
    assert h.remove("b") == [("c", 1)]
    assert h.remove("a") == []
    assert h.ctl.next_deadline() is None  # budget >= connections: no rotation


def test_lowering_the_budget_keeps_the_most_recently_active() -> None:
    h = Harness(4)
    for key in "abcd":
        h.add(key)
    h.clock.advance(1)
    h.process("c")
    h.clock.advance(1)
    h.process("b")
    assert h.set_max(2) == [("a", 0), ("d", 0)]
    assert h.holders() == ["b", "c"]
    # Then the waiting ones come first when the budget grows again.
    assert h.set_max(3) == [("a", 1)]
    assert h.set_max(8) == [("b", 2), ("c", 2), ("d", 1)]


def test_low_rdy_resume_restarts_hold_times() -> None:
    h = Harness(1)
    h.add("a")
    h.add("b")
    h.set_max(0)
    assert h.ctl.next_deadline() is None
    h.clock.advance(100)
    assert h.set_max(1) == [("a", 1)]
    assert h.ctl.next_deadline() == h.clock.now + 10


def test_tick_is_harmless_when_nothing_is_due() -> None:
    h = Harness(4)
    assert h.tick() == []
    h.add("a")
    assert h.ctl.next_deadline() is None
    assert h.advance(1000) == []


# ------------------------------------------------------------------ backoff


def backoff_harness(
    keys: str = "ab",
    max_in_flight: int = 10,
    policy: BackoffPolicy | None = None,
    rand: Any = None,
) -> Harness:
    h = Harness(max_in_flight, backoff=policy or BackoffPolicy(), rand=rand)
    for key in keys:
        h.add(key)
    settled(h, *keys)
    return h


def window(h: Harness) -> float:
    """The length of the open backoff window."""
    deadline = h.ctl.next_deadline()
    assert deadline is not None
    return deadline - h.clock.now


def test_failure_stops_the_flow_and_opens_a_window() -> None:
    h = backoff_harness()
    h.message("a")
    assert h.done("a", "failure") == [("a", 0), ("b", 0)]
    assert h.ctl.in_backoff()
    assert h.ctl.backoff_level == 1
    assert h.ctl.backoff_window_open()
    assert window(h) == 1.0
    assert h.advance(0.999) == []
    # Test the waters on every connection: the first one to deliver gets the test.
    assert h.advance(0.001) == [("a", 1), ("b", 1)]
    assert not h.ctl.backoff_window_open()


@pytest.mark.parametrize("idle", ["a", "b"])
def test_an_idle_partition_does_not_delay_the_test(idle: str) -> None:
    """Issue 13: one failure, one partition idle: consumption resumes right after the
    window, on the busy partition, instead of after low_rdy_idle_timeout more."""
    h = backoff_harness()
    busy = "b" if idle == "a" else "a"
    h.process(busy, "failure")
    start = h.clock.now
    h.to_deadline()
    assert h.clock.now == start + 1.0
    assert h.sent == {"a": 1, "b": 1}
    # The busy partition delivers at once: it keeps the test, the idle one stops.
    assert h.message(busy) == [(idle, 0), (busy, 1)]
    assert h.done(busy, "success") == [("a", 5), ("b", 5)]  # full spread at level 0
    assert not h.ctl.in_backoff()
    assert h.ctl.next_deadline() is None
    assert h.clock.now == start + 1.0  # the backoff cost its window and nothing more


def test_the_first_message_after_the_window_is_the_only_probe() -> None:
    h = backoff_harness(keys="abcd", max_in_flight=40)
    h.process("a", "failure")
    assert h.to_deadline() == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    assert h.message("c") == [("a", 0), ("b", 0), ("d", 0), ("c", 1)]
    # b had sent one before its RDY 0 arrived: handled, but no new test starts.
    assert h.message("b") == []
    assert h.holders() == ["c"]
    assert h.ctl.in_flight("b") == 1


def test_a_failure_while_testing_opens_the_next_window() -> None:
    h = backoff_harness()
    h.process("a", "failure")
    h.to_deadline()
    h.message("b")
    h.message("a")  # already on its way when b won the test
    assert h.done("a", "failure") == [("b", 0)]
    assert h.ctl.backoff_level == 2
    assert window(h) == 2.0
    # The other test message is answered inside the new window: it does not count twice.
    assert h.done("b", "failure") == []
    assert h.ctl.backoff_level == 2
    assert window(h) == 2.0
    assert h.to_deadline() == [("a", 1), ("b", 1)]


def test_exponential_windows_with_the_fake_clock() -> None:
    h = backoff_harness(policy=BackoffPolicy(multiplier=1.0, max_delay=5.0))
    assert h.ctl.next_deadline() is None
    h.process("a", "failure")
    windows = []
    for i in range(5):
        windows.append(window(h))
        assert h.to_deadline() == [("a", 1), ("b", 1)]
        h.process("ab"[i % 2], "failure")
    assert windows == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert h.ctl.backoff_level == 3  # max_level: 8 s would exceed 5 s


def test_full_jitter_windows_use_the_injected_rand() -> None:
    draws = iter([0.5, 0.25, 1.0, 0.0])
    h = backoff_harness(policy=BackoffPolicy(strategy="full_jitter"), rand=lambda: next(draws))
    h.process("a", "failure")
    assert window(h) == 0.5  # 0.5 * 1 s
    h.to_deadline()
    h.process("a", "failure")
    assert window(h) == 0.5  # 0.25 * 2 s
    h.to_deadline()
    h.process("b", "failure")
    assert window(h) == 4.0  # 1.0 * 4 s
    h.to_deadline()
    h.process("a", "failure")
    assert window(h) == 0.0  # due at once
    assert h.tick() == [("a", 1), ("b", 1)]


def test_one_result_counts_per_window() -> None:
    h = backoff_harness()
    h.messages("a", 5)
    h.messages("b", 5)
    h.done("a", "failure")
    assert h.ctl.backoff_level == 1
    deadline = h.ctl.next_deadline()
    # Messages already in flight finish during the window: nothing counts.
    for _ in range(4):
        assert h.done("a", "failure") == []
    for _ in range(5):
        assert h.done("b", "success") == []
    assert h.ctl.backoff_level == 1
    assert h.ctl.next_deadline() == deadline
    assert h.ctl.total_rdy() == 0


def test_only_the_first_result_after_the_window_counts() -> None:
    h = backoff_harness()
    h.messages("a", 3)
    h.done("a", "failure")
    h.to_deadline()
    h.done("a", "failure")  # counts: level 2, new window
    assert h.ctl.backoff_level == 2
    assert h.done("a", "success") == []  # inside the new window: ignored
    assert h.ctl.backoff_level == 2


def test_the_level_decreases_one_success_at_a_time() -> None:
    h = backoff_harness(max_in_flight=10)
    h.process("a", "failure")
    for _ in range(2):
        h.to_deadline()
        h.process("b", "failure")
    h.to_deadline()
    assert h.ctl.backoff_level == 3
    levels = []
    windows = []
    updates: Updates = []
    for _ in range(3):
        assert h.sent == {"a": 1, "b": 1}
        h.message("a")
        h.message("b")  # both deliver before either RDY 0 lands
        updates = h.done("b", "success")
        levels.append(h.ctl.backoff_level)
        assert h.done("a", "success") == []  # the second test message: no double count
        assert h.ctl.backoff_level == levels[-1]
        if h.ctl.in_backoff():
            assert h.holders() == []  # a new, shorter window
            windows.append(window(h))
            h.to_deadline()
    assert levels == [2, 1, 0]
    assert windows == [2.0, 1.0]
    assert not h.ctl.in_backoff()
    assert updates == [("a", 5), ("b", 5)]  # full distribution restored
    assert h.ctl.next_deadline() is None


def test_success_without_backoff_and_neutral_change_nothing() -> None:
    h = backoff_harness()
    assert h.process("a", "success") == []
    assert h.process("a", "neutral") == []
    h.process("a", "failure")
    h.to_deadline()
    # A neutral answer (manual requeue, given up) is no verdict: the test opens again.
    assert h.message("a") == [("b", 0), ("a", 1)]
    assert h.done("a", "neutral") == [("b", 1)]
    assert h.ctl.backoff_level == 1
    assert h.holders() == ["a", "b"]
    h.process("b", "success")
    assert not h.ctl.in_backoff()


def test_a_neutral_answer_waits_for_the_probes_connection_to_drain() -> None:
    h = backoff_harness()
    h.message("a")  # in flight since before the failure
    h.process("b", "failure")
    h.to_deadline()
    h.message("a")
    assert h.done("a", "neutral") == []  # a still has a message in flight
    assert h.holders() == ["a"]
    assert h.done("a", "neutral") == [("b", 1)]


@pytest.mark.parametrize("policy", [None, BackoffPolicy(enabled=False)])
def test_failures_do_nothing_without_backoff(policy: BackoffPolicy | None) -> None:
    h = Harness(4, backoff=policy)
    h.add("a")
    settled(h, "a")
    for _ in range(10):
        h.message("a")
        assert h.done("a", "failure") == []
    assert not h.ctl.in_backoff()
    assert h.ctl.next_deadline() is None
    assert h.sent == {"a": 4}


def test_pause_during_backoff_keeps_zero_and_resume_does_not_leave_backoff() -> None:
    h = backoff_harness()
    h.process("a", "failure")
    assert h.set_max(0) == []
    h.to_deadline()  # the window ends while paused: nobody gets RDY 1
    assert h.holders() == []
    assert h.set_max(10) == [("a", 1), ("b", 1)]  # still testing the waters
    assert h.ctl.in_backoff()
    assert h.set_max(0) == [("a", 0), ("b", 0)]
    assert h.set_max(8) == [("a", 1), ("b", 1)]
    h.message("a")
    assert h.set_max(0) == [("a", 0)]  # paused with the probe in flight
    assert h.set_max(8) == [("a", 1)]  # the probe's connection alone
    h.done("a", "success")
    assert h.sent == {"a": 4, "b": 4}


def test_connections_added_during_backoff() -> None:
    h = backoff_harness()
    h.process("a", "failure")
    assert h.add("c") == []  # the window is open
    assert h.to_deadline() == [("a", 1), ("b", 1), ("c", 1)]
    assert h.add("d") == [("d", 1)]  # no probe yet: it may deliver first
    h.message("d")
    assert h.add("e") == []  # a probe is in flight
    assert h.holders() == ["d"]


def test_connection_added_while_testing_without_connections() -> None:
    h = backoff_harness(keys="a")
    h.process("a", "failure")
    h.to_deadline()
    assert h.sent == {"a": 1}
    assert h.remove("a") == []
    assert h.add("b") == [("b", 1)]
    assert h.add("c") == [("c", 1)]
    h.process("b", "success")
    assert not h.ctl.in_backoff()
    assert h.sent == {"b": 5, "c": 1}


def test_removing_the_probes_connection_opens_the_test_again() -> None:
    h = backoff_harness(keys="abc", max_in_flight=30)
    h.process("a", "failure")
    h.to_deadline()
    h.message("b")
    assert h.holders() == ["b"]
    assert h.remove("b") == [("a", 1), ("c", 1)]  # b's message goes back to nsqd
    assert h.remove("a") == []  # no probe: the others keep testing
    h.process("c", "failure")
    assert h.to_deadline() == [("c", 1)]


def test_window_ending_with_no_connection() -> None:
    h = backoff_harness(keys="a")
    h.process("a", "failure")
    h.remove("a")
    assert h.to_deadline() == []
    assert h.ctl.in_backoff()
    assert h.ctl.next_deadline() is None


def test_testing_the_waters_within_a_small_budget() -> None:
    """Fewer units than connections: the RDY 1 slots of the test rotate like the normal
    ones (every low_rdy_idle_timeout) until one delivers, and never exceed the budget."""
    h = backoff_harness(keys="abcd", max_in_flight=2)
    holders = h.holders()
    assert len(holders) == 2
    h.process(holders[0], "failure")
    assert h.holders() == []
    h.to_deadline()
    assert h.holders() == holders  # the slots stay with the same connections
    assert h.ctl.next_deadline() == h.clock.now + 10.0
    h.to_deadline()  # both stayed idle: the others get their turn
    waiting = [k for k in "abcd" if k not in holders]
    assert h.holders() == waiting
    assert h.ctl.in_backoff()
    h.clock.advance(3)
    h.message(waiting[1])
    assert h.holders() == [waiting[1]]
    # No rotation while the probe is in flight, only the probe's own timeout.
    assert h.ctl.next_deadline() == h.clock.now + 10.0
    h.done(waiting[1], "success")
    assert not h.ctl.in_backoff()
    assert len(h.holders()) == 2
    assert h.ctl.total_rdy() == 2


def test_leaving_backoff_in_the_low_rdy_regime() -> None:
    h = backoff_harness(keys="abc", max_in_flight=1)
    holder = h.holders()[0]
    h.process(holder, "failure")
    assert h.holders() == []
    h.to_deadline()
    (tester,) = h.holders()
    h.message(tester)
    # No count changes, yet the rotation's deadline is back: the count is re-sent, so the
    # consumer (which re-reads next_deadline() after updates) schedules it.
    assert h.done(tester, "success") == [(tester, 1)]
    assert not h.ctl.in_backoff()
    assert len(h.holders()) == 1
    assert h.ctl.next_deadline() == h.clock.now + 10  # the hold starts anew


def test_an_unanswered_probe_opens_the_test_again() -> None:
    """A handler that hangs on the probe must not stop the consumer for good: after
    low_rdy_idle_timeout the other connections may deliver the next probe (go-nsq's
    rotation does the same)."""
    h = backoff_harness(keys="abc", max_in_flight=30)
    h.process("a", "failure")
    h.to_deadline()
    h.clock.advance(4)
    h.message("a")
    assert h.ctl.next_deadline() == h.clock.now + 10.0
    assert h.advance(9.999) == []
    assert h.advance(0.001) == [("b", 1), ("c", 1)]  # a keeps its RDY 1, busy with the probe
    assert h.ctl.in_backoff()
    assert h.message("c") == [("a", 0), ("b", 0), ("c", 1)]
    # Whichever answers first counts; the other one does not count twice.
    h.done("a", "success")
    assert not h.ctl.in_backoff()
    assert h.done("c", "success") == []
    assert h.sent == {"a": 10, "b": 10, "c": 10}


def test_an_unanswered_probe_in_the_low_rdy_regime_hands_its_slot_over() -> None:
    h = backoff_harness(keys="ab", max_in_flight=1)
    (holder,) = h.holders()
    other = "b" if holder == "a" else "a"
    h.process(holder, "failure")
    h.to_deadline()
    h.message(holder)  # the probe; its handler hangs
    assert h.ctl.next_deadline() == h.clock.now + 10.0
    # One tick both gives the probe up and rotates its slot: nothing is due right after.
    assert h.to_deadline() == [(holder, 0), (other, 1)]
    assert h.ctl.next_deadline() == h.clock.now + 10.0


def test_the_test_timer_rearms_while_nothing_arrives() -> None:
    """With every connection at RDY 1 and no message, ticks only re-arm the timer, so that
    one is pending when a probe arrives (on_message does not announce its deadline)."""
    h = backoff_harness()
    h.process("a", "failure")
    h.to_deadline()
    start = h.clock.now
    assert h.ctl.next_deadline() == start + 10.0
    assert h.to_deadline() == []
    assert h.ctl.next_deadline() == start + 20.0
    h.clock.advance(5)
    h.message("b")
    assert h.ctl.next_deadline() == start + 25.0  # later than the pending one: never earlier
    assert h.sent == {"a": 0, "b": 1}


def test_a_single_connection_tester_has_no_deadline() -> None:
    h = backoff_harness("a")
    h.process("a", "failure")
    h.to_deadline()
    assert h.holders() == ["a"]
    assert h.ctl.next_deadline() is None


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("max_in_flight", {"max_in_flight": -1}),
        ("max_in_flight", {"max_in_flight": 1.0}),
        ("max_in_flight", {"max_in_flight": True}),
        ("clock", {"clock": 0.0}),
        ("backoff", {"backoff": "exponential"}),
        ("rand", {"rand": 0.5}),
        ("low_rdy_idle_timeout", {"low_rdy_idle_timeout": 0}),
        ("low_rdy_timeout", {"low_rdy_timeout": float("inf")}),
        ("low_rdy_timeout", {"low_rdy_timeout": "30"}),
    ],
)
def test_constructor_validation(field: str, kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"max_in_flight": 1, "clock": FakeClock()}
    args.update(kwargs)
    with pytest.raises(ValidationError) as info:
        RdyController(**args)
    assert info.value.field == field


def test_event_validation() -> None:
    ctl: RdyController[str] = RdyController(4, clock=FakeClock())
    ctl.add_connection("a")
    for bad in (0, -5, 2.0):
        with pytest.raises(ValidationError) as info:
            ctl.add_connection("b", bad)  # type: ignore[arg-type]
        assert info.value.field == "max_rdy_count"
    with pytest.raises(ValidationError) as info:
        ctl.add_connection("a")
    assert info.value.field == "key"
    with pytest.raises(ValidationError) as info:
        ctl.set_max_in_flight(-1)
    assert info.value.field == "max_in_flight"
    ctl.on_message("a")
    with pytest.raises(ValidationError) as info:
        ctl.on_done("a", "fin")  # type: ignore[arg-type]
    assert info.value.field == "outcome"
    assert ctl.in_flight("a") == 1  # refused before any change
    assert ctl.keys() == ["a"]
    assert ctl.max_in_flight == 4


# ------------------------------------------------------------------ random sequences

NAMES = ["c0", "c1", "c2", "c3", "c4", "c5"]


class RdyMachine(RuleBasedStateMachine):
    """Random add/remove/message/done/set_max_in_flight/clock sequences."""

    h: Harness
    backoff_on: bool
    fresh: set[str]  # connections that have not received a message yet

    @initialize(backoff_on=st.booleans(), max_in_flight=st.integers(0, 12))
    def setup(self, backoff_on: bool, max_in_flight: int) -> None:
        self.backoff_on = backoff_on
        policy = BackoffPolicy(multiplier=1.0, max_delay=8.0) if backoff_on else None
        self.h = Harness(max_in_flight, backoff=policy)
        self.fresh = set()

    @rule(key=st.sampled_from(NAMES), cap=st.integers(1, 6), keeps_count=st.booleans())
    def add(self, key: str, cap: int, keeps_count: bool) -> None:
        if key not in self.h.caps:
            self.h.add(key, cap, keeps_count=keeps_count)
            self.fresh.add(key)

    @precondition(lambda self: bool(self.h.caps))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.h.caps)))
        self.h.remove(key)
        self.fresh.discard(key)

    @precondition(lambda self: bool(self.h.caps))
    @rule(data=st.data(), count=st.integers(1, 4))
    def message(self, data: st.DataObject, count: int) -> None:
        key = data.draw(st.sampled_from(sorted(self.h.caps)))
        self.h.messages(key, count)
        self.fresh.discard(key)

    @precondition(lambda self: any(n > 0 for n in self.h.in_flight.values()))
    @rule(data=st.data(), outcome=st.sampled_from(["success", "success", "failure", "neutral"]))
    def done(self, data: st.DataObject, outcome: Outcome) -> None:
        busy = sorted(k for k, n in self.h.in_flight.items() if n > 0)
        ctl = self.h.ctl
        level = ctl.backoff_level
        counts = self.backoff_on and level > 0 and not ctl.backoff_window_open()
        if outcome == "failure" and self.backoff_on and level == 0:
            counts = True
        self.h.done(data.draw(st.sampled_from(busy)), outcome)
        if counts and outcome == "failure":
            assert ctl.backoff_level == min(level + 1, 4)  # max_level for 1 s .. 8 s
            assert ctl.total_rdy() == 0
            assert ctl.next_deadline() == self.h.clock.now + 2.0 ** (ctl.backoff_level - 1)
        elif counts and outcome == "success":
            assert ctl.backoff_level == level - 1
        else:
            assert ctl.backoff_level == level  # neutral, or inside a window

    @rule(key=st.sampled_from(NAMES))
    def done_unknown(self, key: str) -> None:
        if key not in self.h.caps:
            self.h.done(key, "failure")

    @rule(max_in_flight=st.integers(0, 12))
    def set_max(self, max_in_flight: int) -> None:
        self.h.set_max(max_in_flight)

    @rule(seconds=st.floats(0.0, 40.0))
    def advance(self, seconds: float) -> None:
        self.h.advance(seconds)

    @precondition(lambda self: self.h.ctl.next_deadline() is not None)
    @rule()
    def to_deadline(self) -> None:
        self.h.to_deadline()
        deadline = self.h.ctl.next_deadline()
        assert deadline is None or deadline > self.h.clock.now

    @precondition(
        lambda self: not self.h.ctl.in_backoff() and 0 < self.h.ctl.max_in_flight < len(self.h.caps)
    )
    @rule()
    def rotate_until_everyone_is_served(self) -> None:
        served = set(self.h.holders())
        for _ in range(len(self.h.caps)):
            self.h.to_deadline()
            served.update(self.h.holders())
        assert served == set(self.h.caps)

    @invariant()
    def distribution(self) -> None:
        h = self.h
        budget = h.ctl.max_in_flight
        n = len(h.caps)
        counts = list(h.sent.values())
        if not self.backoff_on:
            assert not h.ctl.in_backoff()
        if h.ctl.in_backoff():
            if h.ctl.backoff_window_open():
                assert sum(counts) == 0
                return
            # Testing the waters: every connection the budget allows waits at RDY 1 for a
            # message, or the first one to deliver holds the only RDY 1.
            assert all(c <= 1 for c in counts)
            assert sum(counts) in (min(budget, n), 1 if budget and n else 0)
            if budget and n > 1:  # a timer always runs: a hung probe cannot stall for good
                assert h.ctl.next_deadline() is not None
            return
        if budget >= n:
            assert all(c > 0 for c in counts)  # every connection is served
            settled_keys = [k for k in h.caps if k not in self.fresh]
            for k in self.fresh:
                assert h.sent[k] == 1
            # Max-min fair: one connection below its cap has (nearly) the most.
            for k in settled_keys:
                if h.sent[k] < h.caps[k]:
                    assert all(h.sent[j] <= h.sent[k] + 1 for j in settled_keys)
            if not self.fresh:
                assert sum(counts) == min(budget, sum(h.caps.values()))
        elif budget == 0:
            assert sum(counts) == 0
            assert h.ctl.next_deadline() is None
        else:
            assert sorted(counts) == [0] * (n - budget) + [1] * budget
            assert h.ctl.next_deadline() is not None


RdyMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestRdyMachine = RdyMachine.TestCase
