"""PartitionSequence: replays and order violations per ordered partition (pure)."""

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
