"""PartitionSequence: replays and order violations per ordered partition (pure)."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.flow.ordering import PartitionSequence


def test_a_replay_is_below_the_next_offset_and_not_newer() -> None:
    seq = PartitionSequence()
    assert not seq.is_replay(0, 0, 100)  # nothing finished yet
    seq.finished(0, 0, 40, 100)
    seq.finished(0, 40, 40, 200)
    assert seq.is_replay(0, 0, 100)
    assert seq.is_replay(0, 40, 200)
    assert not seq.is_replay(0, 80, 300)  # the next one
    assert not seq.is_replay(1, 0, 100)  # partitions are independent
    # a topic deleted and created again: offsets restart, messages are newer
    assert not seq.is_replay(0, 0, 500)


def test_finishing_out_of_order_keeps_the_furthest_point() -> None:
    seq = PartitionSequence()
    seq.finished(0, 40, 40, 200)
    seq.finished(0, 0, 40, 100)
    assert seq.is_replay(0, 40, 200)


def test_violations() -> None:
    seq = PartitionSequence()
    assert seq.violation(0, 10, 0) is None
    assert seq.violation(0, 10, 0) is None  # the same message again is a redelivery
    assert seq.violation(0, 11, 40) is None
    assert seq.violation(0, 9, 80) == "partition 0 went backwards: id 11 -> 9, offset 40 -> 80"
    assert seq.violation(1, 5, -1) is None  # no offsets: ids only
    assert seq.violation(1, 6, -1) is None
    assert seq.violation(1, 7, -2) == "partition 1 went backwards: id 6 -> 7, offset -1 -> -2"


def _full(
    seq: PartitionSequence, lane: object, delivery: tuple[int, int, int, int], skip: bool
) -> tuple[Any, ...]:
    """What the ledger decides of an ordered delivery with the three checks (replay, move,
    violation), as DeliveryLedger._receive_ordered does when next_in_line says no."""
    internal_id, offset, size, timestamp = delivery
    replay = skip and seq.is_replay(0, offset, timestamp)
    moved = seq.moved_from(0, lane, offset, replay)
    if moved is not None:
        seq.restart(0)
        replay = False
    if replay:
        return ("replay", None)
    return (moved, seq.violation(0, internal_id, offset, size, lane))


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.sampled_from(["deliver", "deliver", "deliver", "finish", "restart"]),
            st.integers(0, 1),  # the connection
            st.integers(-2, 3),  # steps back or on from the last delivery
            st.integers(0, 2),  # timestamp shift
        ),
        max_size=30,
    ),
    skip=st.booleans(),
)
def test_next_in_line_agrees_with_the_full_checks(
    events: list[tuple[str, int, int, int]], skip: bool
) -> None:
    """next_in_line says yes only where the three checks find nothing, and records the
    delivery as they would: the ledger may take it first and skip them."""
    lanes = [object(), object()]
    full, fast = PartitionSequence(), PartitionSequence()
    internal_id, offset, timestamp = 10, 0, 100
    delivered: list[tuple[int, int, int, int]] = []
    for kind, lane_index, step, shift in events:
        lane = lanes[lane_index]
        if kind == "restart":
            full.restart(0)
            fast.restart(0)
        elif kind == "finish" and delivered:
            _, done_offset, size, done_ts = delivered[-1]
            full.finished(0, done_offset, size, done_ts)
            fast.finished(0, done_offset, size, done_ts)
        elif kind == "deliver":
            internal_id = max(1, internal_id + step)
            offset = max(0, offset + 40 * step)
            timestamp += shift
            delivery = (internal_id, offset, 40, timestamp)
            delivered.append(delivery)
            expected = _full(full, lane, delivery, skip)
            if fast.next_in_line(0, lane, internal_id, offset, 40, timestamp):
                assert expected == (None, None)
            else:
                assert _full(fast, lane, delivery, skip) == expected
        assert fast._last_seen == full._last_seen
        assert fast._finished_upto == full._finished_upto
