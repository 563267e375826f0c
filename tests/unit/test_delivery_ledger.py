"""DeliveryLedger: the consumer's delivery decisions, without sockets or a loop.

Example tests for each rule, then a Hypothesis state machine that drives random deliveries,
copies, handler results, retirements, lost connections and closes, and checks that no
message is answered twice, that an ordered partition never runs two handlers at once, and
that every delivery is answered, handed back or dropped with its connection at close.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.flow.delivery import (
    ANSWER,
    DROP,
    GIVE_UP,
    GIVE_UP_NOW,
    HOLD,
    NOTHING,
    RUN,
    Answer,
    Decision,
    Delivery,
    DeliveryLedger,
    DeliveryOptions,
    Lane,
)
from smartnsq.flow.rdy import RdyController
from smartnsq.protocol import commands
from smartnsq.protocol.message import youzan_message_id


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ledger(**options: Any) -> DeliveryLedger[Lane]:
    backoff = options.pop("backoff", None)
    budget = options.pop("max_in_flight", 10)
    rdy: RdyController[Lane] = RdyController(budget, clock=Clock(), backoff=backoff)
    return DeliveryLedger(rdy, DeliveryOptions(**options))


def _delivery(
    seq: int,
    *,
    attempts: int = 1,
    partition: int = 0,
    offset: int | None = None,
    size: int = 40,
    timestamp: int | None = None,
) -> Delivery:
    internal_id = (partition << 50) | seq
    return Delivery(
        timestamp if timestamp is not None else 1_000 + seq,
        attempts,
        youzan_message_id(internal_id),
        internal_id,
        0,
        0,
        None,
        seq * size if offset is None else offset,
        size,
        b"body %d" % seq,
    )


def _copy(delivery: Delivery) -> Delivery:
    return Delivery(
        delivery.timestamp,
        delivery.attempts,
        delivery.id,
        delivery.internal_id,
        delivery.trace_id,
        delivery.ext_version,
        delivery.ext_raw,
        delivery.offset,
        delivery.raw_size,
        delivery.body,
    )


def _lane(ledger: DeliveryLedger[Lane], partition: int = 0) -> Lane:
    lane = Lane(partition)
    ledger.add_lane(lane, 2500)
    return lane


# ------------------------------------------------------------------ intake


def test_a_delivery_runs_and_its_fin_comes_from_the_encoder() -> None:
    ledger = _ledger()
    lane = _lane(ledger)
    message = _delivery(1)
    assert ledger.receive(lane, message).verdict == RUN
    assert (ledger.in_flight, lane.in_flight, message.lane, message.responded) == (
        1,
        1,
        lane,
        False,
    )
    # the bytes alone: sending them on the delivery's lane is all there is to do
    assert ledger.finish(message) == commands.fin(message.id)
    assert (ledger.in_flight, message.responded) == (0, True)
    assert ledger.finish(message) is None  # answered once
    counts = ledger.counts
    assert (counts.received, counts.finished) == (1, 1)
    assert ledger.finished_per_partition() == {0: 1}


def test_a_copy_of_a_delivery_in_flight_is_dropped_unanswered() -> None:
    ledger = _ledger()
    lane = _lane(ledger)
    message = _delivery(1)
    ledger.receive(lane, message)
    assert ledger.receive(lane, _copy(message)).verdict == DROP
    assert ledger.in_flight == 1
    assert ledger.counts.duplicates == 1


def test_ordered_a_copy_of_an_answered_delivery_gets_the_same_answer_again() -> None:
    """youzan may put the copy in flight only after the first FIN reached it: dropping the
    copy would hold the partition until msg_timeout."""
    ledger = _ledger(ordered=True)
    lane = _lane(ledger)
    message = _delivery(1)
    ledger.receive(lane, message)
    ledger.finish(message)
    decision = ledger.receive(lane, _copy(message))
    assert decision.verdict == ANSWER
    assert decision.send == ((lane, commands.fin(message.id)),)
    assert ledger.in_flight == 0
    assert (ledger.counts.duplicates, ledger.counts.finished) == (1, 1)
    assert ledger.expected_refusal(lane)  # nsqd may refuse one of the two: expected
    assert not ledger.expected_refusal(lane)
    failed = _delivery(2)  # a requeued one's copy gets the REQ again
    ledger.receive(lane, failed)
    ledger.handler_done(message)
    ledger.requeue(failed, 0.0)
    assert ledger.receive(lane, _copy(failed)).send == ((lane, commands.req(failed.id, 0)),)


def test_unordered_attempts_over_the_limit_are_given_up() -> None:
    ledger = _ledger(max_attempts=3)
    lane = _lane(ledger)
    message = _delivery(1, attempts=4)
    assert ledger.receive(lane, message).verdict == GIVE_UP
    assert ledger.given_up(message) == commands.fin(message.id)
    assert (ledger.counts.given_up, ledger.counts.finished) == (1, 1)


def test_ordered_turns_one_at_a_time_in_arrival_order() -> None:
    ledger = _ledger(ordered=True)
    lane = _lane(ledger)
    first, second, third = _delivery(1), _delivery(2), _delivery(3)
    assert ledger.receive(lane, first).verdict == RUN
    assert ledger.receive(lane, second).verdict == HOLD
    assert ledger.receive(lane, third).verdict == HOLD
    ledger.finish(first)
    assert ledger.handler_done(first).run == (second,)
    assert ledger.handler_done(first).run == ()  # its turn was over already
    ledger.finish(second)
    assert ledger.handler_done(second).run == (third,)


def test_ordered_iteration_ends_the_turn_with_the_answer() -> None:
    ledger = _ledger(ordered=True, iterating=True)
    lane = _lane(ledger)
    first, second = _delivery(1), _delivery(2)
    ledger.receive(lane, first)
    ledger.receive(lane, second)
    decision = ledger.finish(first)
    assert decision is not None
    assert decision.run == (second,)


def test_ordered_replays_are_finished_unhandled_and_counted_apart() -> None:
    ledger = _ledger(ordered=True, skip_replays=True)
    lane = _lane(ledger)
    first, second = _delivery(0), _delivery(1)
    for message in (first, second):
        ledger.receive(lane, message)
        ledger.finish(message)
        ledger.handler_done(message)
    again = Lane(0)  # a new leader of partition 0 replays from its stale position
    ledger.add_lane(again, 2500)
    replay = _delivery(0, attempts=2)
    decision = ledger.receive(again, replay)
    assert decision.verdict == ANSWER
    assert decision.send == ((again, commands.fin(replay.id)),)
    assert (ledger.counts.replays_skipped, ledger.counts.finished) == (1, 2)
    assert ledger.receive(again, _delivery(2)).verdict == RUN  # the next one runs


def test_ordered_violation_is_reported_and_can_hand_the_message_back() -> None:
    for halt in (False, True):
        ledger = _ledger(ordered=True, halt_on_violation=halt)
        lane = _lane(ledger)
        later = _delivery(5)
        ledger.receive(lane, later)
        ledger.finish(later)
        ledger.handler_done(later)
        # the next message in the queue, but an older id: the sequence broke
        earlier = _delivery(3, offset=later.offset + later.raw_size)
        decision = ledger.receive(lane, earlier)
        assert decision.violation is not None
        assert "backwards" in decision.violation
        assert ledger.counts.order_violations == 1
        if halt:
            assert decision.verdict == ANSWER
            assert decision.send == ((lane, commands.req(earlier.id, 0)),)
        else:
            assert decision.verdict == RUN


def _consumed(ledger: DeliveryLedger[Lane], lane: Lane, *seqs: int) -> None:
    for seq in seqs:
        message = _delivery(seq)
        ledger.receive(lane, message)
        ledger.finish(message)
        ledger.handler_done(message)


def test_ordered_a_jump_on_the_same_connection_is_a_move_not_a_replay() -> None:
    """A seek backwards (nsqd reads on from the new position on the same connection): the
    replayed messages run again, with no violation, and the order starts anew there."""
    ledger = _ledger(ordered=True, skip_replays=True)
    lane = _lane(ledger)
    _consumed(ledger, lane, 0, 1, 2, 3)
    again = _delivery(1)
    decision = ledger.receive(lane, again)
    assert decision.verdict == RUN
    assert decision.moved == (4 * 40, 40)  # expected offset, offset seen
    assert decision.violation is None
    counts = ledger.counts
    assert (counts.channel_moves, counts.replays_skipped, counts.order_violations) == (1, 0, 0)
    ledger.finish(again)
    ledger.handler_done(again)
    assert ledger.receive(lane, _delivery(2)).verdict == RUN  # in order again, no move
    assert ledger.counts.channel_moves == 1


def test_ordered_a_jump_forward_on_the_same_connection_is_a_move() -> None:
    ledger = _ledger(ordered=True)
    lane = _lane(ledger)
    _consumed(ledger, lane, 0, 1)
    decision = ledger.receive(lane, _delivery(7))
    assert (decision.verdict, decision.moved) == (RUN, (80, 280))


def test_ordered_a_new_connection_further_back_is_a_move_unless_a_replay() -> None:
    for skip in (True, False):
        ledger = _ledger(ordered=True, skip_replays=skip)
        lane = _lane(ledger)
        _consumed(ledger, lane, 0, 1, 2)
        fresh = Lane(0)
        ledger.add_lane(fresh, 2500)
        decision = ledger.receive(fresh, _delivery(1, attempts=2))
        if skip:  # a new leader replays what was finished: skipped, as before
            assert decision.verdict == ANSWER
            assert ledger.counts.channel_moves == 0
        else:  # handed to the handler: the channel is read from there, no violation
            assert (decision.verdict, decision.violation) == (RUN, None)
            assert ledger.counts.channel_moves == 1
        assert ledger.counts.order_violations == 0


def test_ordered_a_move_announced_in_process_restarts_the_sequence() -> None:
    ledger = _ledger(ordered=True, skip_replays=True)
    lane = _lane(ledger)
    _consumed(ledger, lane, 0, 1, 2)
    ledger.channel_moved(0)  # Admin.seek in this process
    fresh = Lane(0)  # the seek's replay may come on another connection too
    ledger.add_lane(fresh, 2500)
    assert ledger.receive(fresh, _delivery(0, attempts=2)).verdict == RUN
    assert (ledger.counts.channel_moves, ledger.counts.replays_skipped) == (1, 0)


# ------------------------------------------------------------------ answers


def test_requeue_uses_the_policy_and_counts_a_failure_for_the_flow() -> None:
    policy = BackoffPolicy(multiplier=1.0, max_delay=8.0)
    ledger = _ledger(backoff=policy, requeue_delay=2.0, max_requeue_delay=5.0)
    lane = _lane(ledger)
    message = _delivery(1, attempts=2)
    ledger.receive(lane, message)
    decision = ledger.failed(message)
    assert decision is not None
    assert decision.send == ((lane, commands.req(message.id, 4000)),)
    assert decision.rdy == [(lane, 0)]  # the backoff window opened
    assert ledger.counts.requeued == 1


def test_requeue_checks_its_delay() -> None:
    ledger = _ledger()
    lane = _lane(ledger)
    message = _delivery(1)
    ledger.receive(lane, message)
    with pytest.raises(ValidationError, match="delay"):
        ledger.requeue(message, -1.0)
    assert not message.responded


@pytest.mark.parametrize("delay", [4 * 24 * 3600, 1e12, -0.5, math.nan, math.inf, "5", True])
def test_a_requeue_delay_is_refused_in_seconds(delay: object) -> None:
    """message.requeue(delay=) takes seconds: its errors said milliseconds (REQ's), and a
    string or a bool failed with a TypeError."""
    ledger = _ledger()
    lane = _lane(ledger)
    message = _delivery(1)
    ledger.receive(lane, message)
    with pytest.raises(ValidationError) as raised:
        ledger.requeue(message, delay)  # type: ignore[arg-type]
    assert raised.value.field == "delay"
    assert "ms" not in str(raised.value)
    assert not message.responded
    assert ledger.requeue(message, 3 * 24 * 3600) == commands.req(message.id, 259_200_000)


def test_the_requeue_delay_cap_is_one_nsqd_takes() -> None:
    """A cap past youzan's max_req_timeout (3 days) made a failed handler's REQ fail."""
    with pytest.raises(ValidationError) as raised:
        DeliveryOptions(max_requeue_delay=4 * 24 * 3600)
    assert raised.value.field == "max_requeue_delay"
    assert "seconds" in str(raised.value)
    assert DeliveryOptions(max_requeue_delay=3 * 24 * 3600).max_requeue_delay == 259_200.0


def test_ordered_requeue_waits_on_the_client_keeping_the_turn() -> None:
    ledger = _ledger(ordered=True, requeue_delay=0.5)
    lane = _lane(ledger)
    message, following = _delivery(1, attempts=3), _delivery(2)
    ledger.receive(lane, message)
    ledger.receive(lane, following)
    decision = ledger.failed(message)
    assert decision is not None
    assert decision.wait == 1.5
    assert decision.send == ()
    assert ledger.handler_done(message).run == ()  # the partition waits meanwhile
    assert ledger.touch(message) == commands.touch(message.id)
    after = ledger.requeue_now(message)
    assert after.send == ((lane, commands.req(message.id, 0)),)
    assert after.run == (following,)


def test_ordered_give_up_at_max_attempts_only_with_the_policy() -> None:
    for give_up, expected in ((True, GIVE_UP), (False, NOTHING)):
        ledger = _ledger(ordered=True, ordered_give_up=give_up, max_attempts=2)
        lane = _lane(ledger)
        message = _delivery(1, attempts=2)
        ledger.receive(lane, message)
        decision = ledger.failed(message)
        assert decision is not None
        assert decision.verdict == expected


def test_nothing_more_once_a_handler_answered_itself() -> None:
    ledger = _ledger()
    lane = _lane(ledger)
    message = _delivery(1)
    ledger.receive(lane, message)
    ledger.requeue(message, 0.0)
    assert ledger.failed(message) is None
    assert ledger.finish(message) is None
    assert ledger.hand_back(message) is None
    assert ledger.touch(message) is None


# ------------------------------------------------------------------ lanes and close


def test_close_hands_back_what_waits_and_what_arrives_later() -> None:
    ledger = _ledger(ordered=True)
    lane = _lane(ledger)
    running, waiting = _delivery(1), _delivery(2)
    ledger.receive(lane, running)
    ledger.receive(lane, waiting)
    decision = ledger.close()
    assert decision.send == ((lane, commands.req(waiting.id, 0)),)
    assert (lane, 0) in decision.rdy
    late = _delivery(3)
    decision = ledger.receive(lane, late)
    assert decision.verdict == ANSWER
    assert decision.send == ((lane, commands.req(late.id, 0)),)
    assert ledger.in_flight == 1  # the running handler still answers
    ledger.finish(running)
    assert ledger.in_flight == 0


def test_a_retired_lane_hands_back_and_closes_once_drained() -> None:
    ledger = _ledger()
    lane, other = _lane(ledger, 0), _lane(ledger, 1)
    message = _delivery(1)
    ledger.receive(lane, message)
    decision = ledger.retire(lane)
    assert decision.closed == ()
    assert all(key is other for key, _ in decision.rdy)  # the budget moves to the other
    late = _delivery(2)
    assert ledger.receive(lane, late).send == ((lane, commands.req(late.id, 0)),)
    finished = ledger.finish(message)
    assert finished is not None
    assert finished.closed == (lane,)


def test_a_lost_lane_drops_what_waits_and_counts_late_answers_as_lost() -> None:
    ledger = _ledger(ordered=True)
    lane = _lane(ledger)
    running, waiting = _delivery(1), _delivery(2)
    ledger.receive(lane, running)
    ledger.receive(lane, waiting)
    ledger.lose(lane)
    assert ledger.in_flight == 1
    assert lane not in ledger.lanes
    decision = ledger.finish(running)
    assert decision is not None
    assert decision.send == ()
    assert ledger.counts.lost_answers == 1
    assert ledger.in_flight == 0
    assert ledger.touch(running) is None


def test_finished_per_partition_keeps_lanes_that_are_gone() -> None:
    ledger = _ledger()
    first = _lane(ledger, 3)
    message = _delivery(1, partition=3)
    ledger.receive(first, message)
    ledger.finish(message)
    ledger.lose(first)
    second = _lane(ledger, 3)
    message = _delivery(2, partition=3)
    ledger.receive(second, message)
    ledger.finish(message)
    assert ledger.finished_per_partition() == {3: 2}


def test_bad_options_raise() -> None:
    with pytest.raises(ValidationError, match="max_attempts"):
        _ledger(max_attempts=0)
    with pytest.raises(ValidationError, match="requeue_delay"):
        _ledger(requeue_delay=-1)


# ------------------------------------------------------------------ random sequences


class LedgerMachine(RuleBasedStateMachine):
    """Random deliveries, copies and outcomes over three lanes; the model follows what a
    consumer would do with each decision."""

    ledger: DeliveryLedger[Lane]

    @initialize(ordered=st.booleans(), iterating=st.booleans(), give_up=st.booleans())
    def setup(self, ordered: bool, iterating: bool, give_up: bool) -> None:
        self.ledger = _ledger(
            ordered=ordered,
            iterating=iterating,
            ordered_give_up=give_up,
            skip_replays=ordered,
            max_attempts=3,
            requeue_delay=0.0,
            max_in_flight=6,
        )
        self.lanes: list[Lane] = []
        self.seq = 0
        self.release_seq = 0
        self.running: dict[int, Delivery] = {}  # released to a handler (or the iterator)
        self.waiting: dict[int, Delivery] = {}  # ordered requeues waiting out their delay
        self.received: list[Delivery] = []
        self.sent: Counter[bytes] = Counter()  # answers sent, per message id
        self.copies_after_answer: Counter[bytes] = Counter()
        self.closed = False

    def _apply(self, decision: Answer[Lane] | None, message: Delivery | None = None) -> None:
        """Carry out what the ledger decided (bytes alone: on ``message``'s lane)."""
        if decision is None:
            return
        if isinstance(decision, bytes):
            assert message is not None
            assert not message.lane.lost
            self.sent[decision[4:20]] += 1
            return
        for lane, data in decision.send:
            assert not lane.lost
            if data[:3] in (b"FIN", b"REQ"):
                self.sent[data[4:20]] += 1
        for following in decision.run:
            self._release(following)

    def _release(self, message: Delivery) -> None:
        assert not message.responded
        if self.ledger.ordered:
            busy = [m for m in self.running.values() if m.lane is message.lane]
            assert not busy, "an ordered lane runs two handlers at once"
        self.release_seq += 1
        self.running[self.release_seq] = message

    @rule()
    def add_lane(self) -> None:
        if len(self.ledger.lanes) < 3 and not self.closed:
            lane = Lane(len(self.lanes))
            self.lanes.append(lane)
            self._apply(self.ledger.add_lane(lane, 2500))

    @precondition(lambda self: bool(self.ledger.lanes))
    @rule(data=st.data(), attempts=st.lists(st.integers(1, 5), min_size=1, max_size=4))
    def deliver(self, data: st.DataObject, attempts: list[int]) -> None:
        """A read of one or more deliveries on one lane."""
        lane = data.draw(st.sampled_from(list(self.ledger.lanes)))
        for tries in attempts:
            self.seq += 1
            message = _delivery(self.seq, attempts=tries, partition=lane.partition or 0)
            self._receive(lane, message)

    @precondition(lambda self: bool(self.received))
    @rule(data=st.data())
    def deliver_copy(self, data: st.DataObject) -> None:
        """nsqd sends a delivery again on the same connection (youzan's first ordered one,
        or a redelivery racing an answer)."""
        original = data.draw(st.sampled_from(self.received))
        if original.lane.lost:
            return
        if original.responded:
            self.copies_after_answer[original.id] += 1
        self._receive(original.lane, _copy(original))

    def _receive(self, lane: Lane, message: Delivery) -> None:
        decision = self.ledger.receive(lane, message)
        if getattr(message, "lane", None) is lane:  # taken (not a copy dropped or repeated)
            self.received.append(message)
        self._apply(decision)
        if decision.verdict == RUN:
            self._release(message)
        elif decision.verdict == GIVE_UP:
            self._apply(self.ledger.given_up(message), message)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), outcome=st.sampled_from(["return", "raise", "answer", "hand back"]))
    def handler_over(self, data: st.DataObject, outcome: str) -> None:
        ledger = self.ledger
        key = data.draw(st.sampled_from(sorted(self.running)))
        message = self.running.pop(key)
        if ledger.options.iterating:
            # the iterator's user answers; the turn ends with the answer
            if outcome == "hand back":
                self._apply(ledger.hand_back(message), message)
            else:
                self._apply(ledger.finish(message), message)
            return
        if outcome == "answer":
            self._apply(ledger.requeue(message, 0.0, backoff=False), message)
        if outcome in ("return", "answer"):
            self._apply(ledger.finish(message), message)
        elif outcome == "raise":
            answer = ledger.failed(message)
            if answer is GIVE_UP_NOW:
                self._apply(ledger.given_up(message), message)
            elif isinstance(answer, Decision) and answer.wait:
                self.waiting[key] = message
            else:
                self._apply(answer, message)
        else:
            self._apply(ledger.hand_back(message), message)
        self._apply(ledger.handler_done(message))
        self._apply(ledger.handler_done(message))  # again: its turn is over already

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def delay_over(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.waiting)))
        message = self.waiting.pop(key)
        self._apply(self.ledger.requeue_now(message), message)

    @precondition(lambda self: bool(self.ledger.lanes))
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        self._apply(self.ledger.retire(data.draw(st.sampled_from(list(self.ledger.lanes)))))

    @precondition(lambda self: bool(self.ledger.lanes))
    @rule(data=st.data())
    def lose(self, data: st.DataObject) -> None:
        lane = data.draw(st.sampled_from(list(self.ledger.lanes)))
        self._apply(self.ledger.lose(lane))
        if self.ledger.options.iterating:  # released to the iterator, never taken: dropped too
            unclaimed = [k for k, m in self.running.items() if m.lane is lane]
            self.ledger.drop_unclaimed(self.running.pop(k) for k in unclaimed)

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        self.closed = True
        self._apply(self.ledger.close())

    @invariant()
    def answered_at_most_once(self) -> None:
        for message_id, count in self.sent.items():
            assert count <= 1 + self.copies_after_answer[message_id], message_id.hex()

    @invariant()
    def in_flight_adds_up(self) -> None:
        ledger = self.ledger
        unanswered = [m for m in self.received if not m.responded]
        assert ledger.in_flight == len(unanswered)
        assert ledger.in_flight == sum(lane.in_flight for lane in self.lanes)
        assert ledger.in_flight >= 0

    @invariant()
    def closed_and_handlers_over_means_nothing_outstanding(self) -> None:
        if not self.closed or self.running or self.waiting:
            return
        assert all(m.responded for m in self.received)
        assert self.ledger.in_flight == 0


LedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestLedger = LedgerMachine.TestCase
