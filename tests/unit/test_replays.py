"""Sequence stamps (smartnsq.publishing.stamps), the consumer's filter of them
(smartnsq.flow.replays) and what the ordered delivery ledger does with it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ValidationError
from smartnsq.flow.delivery import (
    ANSWER,
    HOLD,
    RUN,
    Delivery,
    DeliveryLedger,
    DeliveryOptions,
    Lane,
)
from smartnsq.flow.rdy import RdyController
from smartnsq.flow.replays import ReplayFilter
from smartnsq.protocol import commands
from smartnsq.protocol.message import EXT_VERSION_JSON, youzan_message_id
from smartnsq.publishing.stamps import (
    STAMP_KEY,
    Stamp,
    parse_stamp,
    stamp_header,
    stamped_header,
)

# --------------------------------------------------------------------------- the format


def test_a_stamp_reads_back_from_its_header() -> None:
    header = stamp_header("00ff", 7, 3)
    assert header == b'{"smartnsq.seq":"00ff:7:3"}'
    assert json.loads(header) == {STAMP_KEY: "00ff:7:3"}
    assert parse_stamp(header) == Stamp("00ff", 7, 3)


def test_a_stamp_joins_a_callers_header_and_replaces_a_copied_one() -> None:
    merged = stamped_header(b'{"k":"v","smartnsq.seq":"old:1:1"}', "new", 5, 5)
    assert json.loads(merged) == {"k": "v", STAMP_KEY: "new:5:5"}
    assert parse_stamp(merged) == Stamp("new", 5, 5)
    assert stamped_header(b"{}", "p", 1, 1) == stamp_header("p", 1, 1)
    assert stamped_header(None, "p", 1, 1) == stamp_header("p", 1, 1)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b'{"k":"v"}',
        b'{"smartnsq.seq":7}',  # not a string
        b'{"smartnsq.seq":"p:x:1"}',
        b'{"smartnsq.seq":"p:3:4"}',  # a floor above its own number
        b'{"smartnsq.seq":"p:0:0"}',
        b'{"smartnsq.seq":":3:1"}',
        b'{"smartnsq.seq":"p:3"}',
        b"not json smartnsq.seq",
    ],
)
def test_what_is_no_stamp_is_handled_as_unstamped(raw: bytes | None) -> None:
    assert parse_stamp(raw) is None


def test_a_stamp_in_a_header_written_by_another_tool_is_found() -> None:
    assert parse_stamp(b'{ "a": 1, "smartnsq.seq" : "p:9:2" }') == Stamp("p", 9, 2)


@given(
    producer=st.text("0123456789abcdef", min_size=1, max_size=16),
    seq=st.integers(1, 2**63),
    back=st.integers(0, 1000),
)
def test_any_stamp_round_trips(producer: str, seq: int, back: int) -> None:
    floor = max(1, seq - back)
    assert parse_stamp(stamp_header(producer, seq, floor)) == Stamp(producer, seq, floor)


# --------------------------------------------------------------------------- the filter


def test_a_number_is_taken_once() -> None:
    replays = ReplayFilter()
    stamp = Stamp("p", 1, 1)
    assert replays.claim(0, stamp)
    assert not replays.claim(0, stamp)  # a copy while the first is with the handler
    replays.finish(0, stamp)
    assert not replays.claim(0, stamp)  # a copy after it was handled
    assert replays.claim(1, stamp)  # another partition is another sequence
    assert replays.claim(0, Stamp("q", 1, 1))  # another producer too


def test_a_released_number_is_news_again() -> None:
    replays = ReplayFilter()
    stamp = Stamp("p", 4, 1)
    assert replays.claim(0, stamp)
    replays.release(0, stamp)  # the handler failed: the message comes back
    assert replays.claim(0, stamp)


def test_below_the_floor_is_settled() -> None:
    replays = ReplayFilter()
    assert replays.claim(0, Stamp("p", 6, 6))  # the producer settled 1..5
    assert not replays.claim(0, Stamp("p", 5, 5))  # late: given up on, or a copy
    assert replays.claim(0, Stamp("p", 8, 6))  # a gap above the floor is fine


def test_a_seek_starts_the_partition_anew() -> None:
    replays = ReplayFilter()
    stamp = Stamp("p", 1, 1)
    replays.claim(0, stamp)
    replays.finish(0, stamp)
    replays.restart(0)
    assert replays.claim(0, stamp)  # replayed on purpose


def test_memory_is_bounded_by_producers_and_window() -> None:
    replays = ReplayFilter(producers=2, window=3)
    for producer in ("a", "b", "c"):
        assert replays.claim(0, Stamp(producer, 1, 1))
        replays.finish(0, Stamp(producer, 1, 1))
    assert set(replays.snapshot()["0"]) == {"b", "c"}  # "a", least recently seen, forgotten
    for seq in range(1, 6):
        replays.claim(1, Stamp("w", seq, 1))
        replays.finish(1, Stamp("w", seq, 1))
    floor, numbers = replays.snapshot()["1"]["w"]
    assert len(numbers) <= 3
    assert floor > 1


def test_a_snapshot_restores_what_was_finished_only() -> None:
    replays = ReplayFilter()
    done, taken = Stamp("p", 1, 1), Stamp("p", 2, 1)
    replays.claim(3, done)
    replays.finish(3, done)
    replays.claim(3, taken)  # with the handler when the consumer stopped
    snapshot = json.loads(json.dumps(replays.snapshot()))
    assert snapshot == {"3": {"p": [1, [1]]}}
    restored = ReplayFilter.restore(snapshot)
    assert not restored.claim(3, done)
    assert restored.claim(3, taken)  # handed back at close: it must be handled


def test_a_snapshot_that_is_none_is_refused() -> None:
    with pytest.raises(ValidationError, match="replay_filter"):
        ReplayFilter.restore({"0": {"p": "nonsense"}})
    with pytest.raises(ValidationError, match="window"):
        ReplayFilter(window=0)


# --------------------------------------------------------------------------- the ledger


class _Clock:
    def __call__(self) -> float:
        return 100.0


def _ordered() -> tuple[DeliveryLedger[Lane], Lane]:
    rdy: RdyController[Lane] = RdyController(10, clock=_Clock())
    ledger = DeliveryLedger(rdy, DeliveryOptions(ordered=True, skip_replays=True))
    lane = Lane(0)
    ledger.add_lane(lane, 2500)
    return ledger, lane


def _stamped(offset: int, seq: int, floor: int = 1, attempts: int = 1) -> Delivery:
    internal_id = offset + 1
    return Delivery(
        1_000 + offset,
        attempts,
        youzan_message_id(internal_id),
        internal_id,
        0,
        EXT_VERSION_JSON,
        stamp_header("p", seq, floor),
        offset * 40,
        40,
        b"body %d" % seq,
    )


def test_an_ordered_ledger_fins_a_stamped_copy_unhandled() -> None:
    ledger, lane = _ordered()
    first = _stamped(0, 1)
    assert ledger.receive(lane, first).verdict == RUN
    ledger.finish(first)
    ledger.handler_done(first)
    copy = _stamped(1, 1)  # stored twice: the next offset, the same number
    decision = ledger.receive(lane, copy)
    assert decision.verdict == ANSWER
    assert decision.send == ((lane, commands.fin(copy.id)),)
    assert ledger.counts.stamped_replays == 1
    assert ledger.counts.finished == 1  # the copy is counted apart
    following = _stamped(2, 2)
    assert ledger.receive(lane, following).verdict == RUN


def test_a_copy_behind_its_first_is_fined_at_its_turn_once_the_first_succeeded() -> None:
    ledger, lane = _ordered()
    first, copy = _stamped(0, 1), _stamped(1, 1)
    assert ledger.receive(lane, first).verdict == RUN
    assert ledger.receive(lane, copy).verdict == HOLD  # the first's handler may still fail
    ledger.finish(first)
    turn = ledger.handler_done(first)
    assert turn.run == ()
    assert turn.send == ((lane, commands.fin(copy.id)),)
    assert ledger.counts.stamped_replays == 1


def test_a_copy_behind_a_first_that_failed_runs() -> None:
    ledger, lane = _ordered()
    first, copy = _stamped(0, 1), _stamped(1, 1)
    ledger.receive(lane, first)
    ledger.receive(lane, copy)
    ledger.requeue(first, 0)  # the handler failed: REQ 0
    assert ledger.handler_done(first).run == (copy,)
    assert ledger.counts.stamped_replays == 0


def _moved(ledger: DeliveryLedger[Lane]) -> Lane:
    """The partition's leader moved: a lane to the new leader, beside the old one."""
    new = Lane(0)
    ledger.add_lane(new, 2500)
    return new


def test_a_new_leaders_deliveries_wait_for_the_old_leaders_handler() -> None:
    ledger, old = _ordered()
    running = _stamped(0, 1)
    assert ledger.receive(old, running).verdict == RUN
    new = _moved(ledger)
    following = _stamped(1, 2)
    assert ledger.receive(new, following).verdict == HOLD  # not before the handler is over
    ledger.finish(running)
    assert ledger.handler_done(running).run == (following,)
    assert ledger.receive(new, _stamped(2, 3)).verdict == HOLD  # behind it, on its lane


def test_a_new_leaders_copy_of_a_message_whose_handler_fails_on_the_old_one_runs() -> None:
    ledger, old = _ordered()
    running = _stamped(0, 1)
    ledger.receive(old, running)
    new = _moved(ledger)
    copy = _stamped(0, 1)  # the new leader resumes from before it
    assert ledger.receive(new, copy).verdict == HOLD
    ledger.lose(old)  # the old leader's connection goes; the handler goes on
    ledger.requeue(running, 0)  # and fails: its REQ cannot reach nsqd
    assert ledger.handler_done(running).run == (copy,)  # not FINed unhandled: not lost


def test_a_new_leaders_copy_of_a_message_handled_on_the_old_one_is_fined() -> None:
    ledger, old = _ordered()
    running = _stamped(0, 1)
    ledger.receive(old, running)
    new = _moved(ledger)
    copy, following = _stamped(0, 1), _stamped(1, 2)
    ledger.receive(new, copy)
    ledger.receive(new, following)
    ledger.finish(running)
    turn = ledger.handler_done(running)
    assert turn.send == ((new, commands.fin(copy.id)),)
    assert turn.run == (following,)


def test_a_failed_stamped_message_is_handled_again_when_it_comes_back() -> None:
    ledger, lane = _ordered()
    message = _stamped(0, 1)
    assert ledger.receive(lane, message).verdict == RUN
    ledger.requeue(message, 0)  # the handler failed
    ledger.handler_done(message)
    again = _stamped(0, 1, attempts=2)
    assert ledger.receive(lane, again).verdict == RUN


def test_a_seek_lets_stamped_messages_be_handled_again() -> None:
    ledger, lane = _ordered()
    message = _stamped(0, 1)
    ledger.receive(lane, message)
    ledger.finish(message)
    ledger.handler_done(message)
    ledger.channel_moved(0)
    replayed = _stamped(0, 1, attempts=2)  # read again from the queue after the seek
    assert ledger.receive(lane, replayed).verdict == RUN
