"""RangeChain: exactly the messages of [start, end), from deliveries in any order (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ValidationError
from smartnsq.flow.ranges import OffsetRange, Placement, RangeChain

# The capture's queue (channel_setoffset.txt): a0..a9 and b0..b9 32 bytes each, a10..a49 and
# b10..b49 33 (b0 at 1640, b10 at 1960, b49 at 3247).
QUEUE = ([32] * 10 + [33] * 40) * 2


def _messages(sizes: list[int]) -> list[tuple[int, int]]:
    """(offset, raw size) of a queue whose messages have these sizes."""
    out, offset = [], 0
    for size in sizes:
        out.append((offset, size))
        offset += size
    return out


def test_in_order_delivery_from_the_start() -> None:
    messages = _messages(QUEUE)
    chain: RangeChain[int] = RangeChain(1960, 2125)  # b10 .. b14
    for offset, size in messages[60:70]:
        placement = chain.offer(offset, size, offset)
        assert placement is (Placement.KEPT if offset < 2125 else Placement.AFTER)
    assert chain.anchor == 1960
    assert chain.take() == [1960, 1993, 2026, 2059, 2092]
    assert chain.complete
    assert chain.frontier == 2125


def test_out_of_order_copies_and_strays() -> None:
    messages = _messages(QUEUE)
    start, end = messages[60][0], messages[65][0]
    chain: RangeChain[int] = RangeChain(start, end)
    order = [62, 61, 70, 63, 61, 60, 64, 55, 62]  # b12 b11 (past) b13 (copy) b10 ...
    seen = []
    for index in order:
        offset, size = messages[index]
        seen.append(chain.offer(offset, size, index))
        if index == 62 and len(seen) == 1:
            assert chain.take() == []  # b10 missing: nothing can be handed out
    assert seen == [
        Placement.KEPT,
        Placement.KEPT,
        Placement.AFTER,
        Placement.KEPT,
        Placement.DUPLICATE,
        Placement.KEPT,
        Placement.KEPT,
        Placement.BEFORE,
        Placement.DUPLICATE,  # a copy of one already handed out
    ]
    assert chain.take() == [60, 61, 62, 63, 64]
    assert chain.complete
    assert (chain.kept, chain.duplicates, chain.outside) == (5, 2, 2)


def test_a_start_inside_a_message_begins_at_the_next_one_once_proven() -> None:
    messages = _messages(QUEUE)
    # 1965 lies inside b10 (1960..1993): as nsqd's seek, the range begins at b11
    chain: RangeChain[int] = RangeChain(1965, 2059)
    assert chain.seek_position() == 0  # 4096 bytes before the start: the queue's start
    for index in (61, 62):  # b11, b12: the start is not proven yet
        offset, size = messages[index]
        assert chain.offer(offset, size, index) is Placement.KEPT
    assert chain.anchor is None
    assert not chain.complete
    assert chain.take() == []
    offset, size = messages[60]  # b10 straddles 1965: the range begins where it ends
    assert chain.offer(offset, size, 60) is Placement.BEFORE
    assert chain.anchor == 1993
    assert chain.take() == [61, 62]
    assert chain.complete


def test_a_message_ending_at_the_start_proves_it() -> None:
    messages = _messages(QUEUE)
    chain: RangeChain[int] = RangeChain(messages[3][0], messages[5][0])
    offset, size = messages[2]
    chain.offer(offset, size, 2)
    assert chain.anchor == messages[3][0]


def test_known_boundaries_and_empty_ranges() -> None:
    chain: RangeChain[int] = RangeChain(100, 100, known_boundaries=[0, 100])
    assert chain.complete  # nothing to read
    assert chain.seek_position() == 100
    chain = RangeChain(64, 200, known_boundaries=[64])
    assert chain.anchor == 64
    assert chain.seek_position() == 64
    # A range inside one message: proven empty by that message
    chain = RangeChain(5, 7)
    assert chain.offer(0, 10, "m") is Placement.BEFORE
    assert chain.complete
    assert chain.take() == []


def test_look_behind_is_bounded_by_the_queue_start_and_widens() -> None:
    chain: RangeChain[int] = RangeChain(10_000, 20_000, look_behind=1000)
    assert chain.seek_position() == 9000
    assert chain.seek_position(queue_start=9500) == 9500
    chain.widen()
    assert chain.seek_position() == 2000
    chain.widen()
    assert chain.seek_position() == 0


def test_limit_end_drops_what_the_queue_no_longer_has() -> None:
    messages = _messages([10] * 10)
    chain: RangeChain[int] = RangeChain(0, 100, known_boundaries=[0])
    for offset, size in messages[5:]:
        chain.offer(offset, size, offset)
    chain.limit_end(70)
    for offset, size in messages[:5]:
        chain.offer(offset, size, offset)
    assert chain.take() == [0, 10, 20, 30, 40, 50, 60]
    assert chain.complete


@pytest.mark.parametrize(("start", "end"), [(-1, 5), (5, 4), (0, 1.5)])
def test_bad_ranges(start: int, end: int) -> None:
    with pytest.raises(ValidationError):
        OffsetRange(0, start, end)
    with pytest.raises(ValidationError):
        RangeChain(start, end)


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int, list[int]]:
    """A queue, a range in it (anywhere: boundaries or not), and what nsqd delivers after a
    seek before the start: every message from the landing point on, shuffled, with copies
    (and a few strays from before the seek point)."""
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=60))
    messages = _messages(sizes)
    total = messages[-1][0] + messages[-1][1]
    start = draw(st.integers(0, total))
    end = draw(st.integers(start, total))
    seek = draw(st.integers(0, start))
    landing = [i for i, (offset, _) in enumerate(messages) if offset >= seek]
    strays = draw(st.lists(st.sampled_from(range(len(messages))), max_size=5))
    copies = draw(st.lists(st.sampled_from(landing), max_size=10)) if landing else []
    order = draw(st.permutations(landing + strays + copies))
    return messages, start, end, list(order)


@settings(max_examples=400, deadline=None)
@given(_deliveries())
def test_exactly_the_range_in_order_whatever_the_delivery(
    case: tuple[list[tuple[int, int]], int, int, list[int]],
) -> None:
    messages, start, end, order = case
    wanted = [i for i, (offset, _) in enumerate(messages) if start <= offset < end]
    chain: RangeChain[int] = RangeChain(start, end)
    taken: list[int] = []
    arrived: set[int] = set()
    for index in order:
        offset, size = messages[index]
        chain.offer(offset, size, index)
        arrived.add(index)
        taken.extend(chain.take())
        # never complete while a message of the range is still missing
        if chain.complete:
            assert set(wanted) <= arrived
        # what is handed out is always a prefix of the range, in order
        assert taken == wanted[: len(taken)]
    proven = chain.anchor is not None
    if proven:
        assert chain.complete
        assert taken == wanted
    else:
        # unproven only when nothing before the seek point reached the start: a message at
        # the start, or one ending at or straddling it, was never delivered
        assert not any(o <= start <= o + s for i, (o, s) in enumerate(messages) if i in arrived)
