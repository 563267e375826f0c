"""The publish flow's decisions (smartnsq.publishing.flow), with no socket, loop or clock:
scenarios told as tables of outcomes, then a Hypothesis state machine over any sequence of
publishes, answers, lost links, late deliveries, leader moves and time, holding the order
and deadline rules (tests/unit/flow_model.py is the model cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from smartnsq.errors import (
    BadMessageError,
    ConnectionClosedError,
    NSQTimeoutError,
    ProtocolError,
    PublishError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.flow.replays import ReplayFilter
from smartnsq.protocol.responses import OK
from smartnsq.publishing.flow import DONE, NO_STEPS, QUEUED, SENT, ZOMBIE, Batch, PublishFlow
from smartnsq.publishing.request import NO_KEY, PublishRequest, message_request, plain_request
from smartnsq.publishing.routes import Router
from smartnsq.publishing.wire import PublishCodec
from smartnsq.routing.sharding import Sharder
from tests.unit.flow_model import TOPIC, Fixed, Link, World


def _results(world: World) -> dict[int, Any]:
    return {id(p): p.results for p in world.done if p.results is not None}


def _only_link(world: World) -> Link:
    world.connect_all()
    assert len(world.links) == 1
    return world.links[0]


# --------------------------------------------------------------------------- the good case


def test_a_keyed_publish_goes_at_once_and_pipelines_behind_others() -> None:
    world = World()
    first = world.publish(0)
    assert world.connecting == [("127.0.0.1:4150", TOPIC, 0)]  # its leader's link, opened
    link = _only_link(world)
    second, third = world.publish(2), world.publish(4)  # the same partition
    assert [p for p, _ in world.sent] == [first, second, third]  # no answer waited for
    assert {each for _, each in world.sent} == {link}
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [first, second, third]
    assert all(p.state == DONE and p.results is not None for p in (first, second, third))
    assert [p.results[0].tries for p in (first, second, third)] == [1, 1, 1]  # type: ignore[index]


def test_stamps_number_a_partition_in_call_order_with_the_settled_floor() -> None:
    world = World()
    publishes = [world.publish(key) for key in (0, 1, 2, 3)]
    world.connect_all()
    world.roundtrip()
    stamps = {s.publish: s.stamp for s in world.stored}
    assert [stamps[p].seq for p in publishes] == [1, 1, 2, 2]  # type: ignore[union-attr]
    assert {stamps[p].producer for p in publishes} == {"p1"}  # type: ignore[union-attr]
    later = world.publish(0)
    world.roundtrip()
    last = world.stored[-1].stamp
    assert (later.seq, last.seq, last.floor) == (3, 3, 3)  # type: ignore[union-attr]


def test_a_plain_topic_carries_no_stamp() -> None:
    world = World(ext=False)
    world.publish(0)
    world.roundtrip()
    assert world.stored[0].stamp is None


# --------------------------------------------------------------------------- faults


def test_a_lost_link_sends_everything_again_in_order_one_at_a_time_first() -> None:
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b, c = world.publish(2), world.publish(4)
    world.kill(link, processed=1)  # nsqd stored a; nobody heard
    assert [p.state for p in (a, b, c)] == [QUEUED] * 3
    assert world.sent[-1][0] is c  # nothing sent again before the backoff
    d = world.publish(6)  # behind them, not before
    assert d.state == QUEUED
    world.advance(0.1)
    world.connect_all()
    assert [p for p, _ in world.sent[3:]] == [a]  # recovering: the first alone
    world.roundtrip()
    order = [s.publish for s in world.stored_in(0)]
    assert order == [a, a, b, c, d]  # a twice (its first try was stored), in call order
    assert [p.results[0].tries for p in (a, b, c, d)] == [2, 2, 2, 1]  # type: ignore[index]
    handled = _handled(world, 0)
    assert handled == [a, b, c, d]  # the stamps drop the copy


def test_a_stream_that_broke_the_protocol_is_a_lost_link() -> None:
    # a proxy or middlebox that corrupts a frame: the connection is closed and its tries are
    # sent again in order on a new one, not raised to the callers
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b = world.publish(2)
    world.kill(link, error=ProtocolError("frame size 4294967295 is too large"))
    assert [p.state for p in (a, b)] == [QUEUED] * 2
    world.advance(0.1)
    world.connect_all()
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [a, b]
    assert all(p.results is not None for p in (a, b))


def test_refused_all_the_way_sends_again_in_order() -> None:
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b = world.publish(2)
    world.move(0, "b")
    world.process(link, 2)  # both refused: not the leader
    world.deliver(link, 2)
    assert (a.state, b.state) == (QUEUED, QUEUED)
    assert world.lookups == [TOPIC]
    world.answer_lookups()  # nsqlookupd names b: no backoff to wait out
    world.connect_all()
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [a, b]
    assert world.links[-1].address.endswith("4152")  # the new leader


def test_a_refusal_overtaken_by_a_later_store_fails_rather_than_go_after_it() -> None:
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b = world.publish(2)
    world.process(link, 1, fail=True)  # E_PUB_FAILED for a (nothing stored)...
    world.process(link, 1)  # ...and b, right behind it, stored
    world.deliver(link, 2)
    assert b.results is not None
    assert a.state == DONE
    assert isinstance(a.error, PublishError)
    assert not a.error.outcome_unknown  # nsqd answered: a was not stored
    assert "not sent again" in str(a.error)
    assert [s.publish for s in world.stored_in(0)] == [b]


def test_a_refusal_followed_by_a_lost_try_fails_too() -> None:
    """b's outcome is unknown: it may be stored, so a cannot go after it."""
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b = world.publish(2)
    world.process(link, 1, fail=True)
    world.deliver(link, 1)
    world.kill(link, processed=1)  # b stored, its answer lost with the link
    assert a.state == DONE
    assert isinstance(a.error, PublishError)
    world.advance(0.2)
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [b, b]
    assert _handled(world, 0) == [b]


def test_a_try_in_flight_at_its_deadline_is_a_zombie_that_holds_its_lane() -> None:
    world = World()
    a = world.publish(0, timeout=1.0)
    link = _only_link(world)
    b = world.publish(2, timeout=30.0)
    world.advance(1.0)
    assert a.state == ZOMBIE
    assert isinstance(a.error, PublishError)
    assert a.error.outcome_unknown
    assert isinstance(a.error.__cause__, NSQTimeoutError)
    c = world.publish(4, timeout=30.0)
    assert world.sent[-1][0] is c  # same link: pipelined behind the zombie
    held = world.kill(link)  # nothing answered; the link held a, b and c
    world.advance(0.1)
    world.connect_all()
    world.roundtrip()
    world.late(link, held)  # a proxy delivers them after all
    assert [s.publish for s in world.stored_in(0)] == [b, c, a, b, c]
    assert _handled(world, 0) == [b, c]  # a came after its floor: dropped, as promised


def test_a_deadline_cuts_the_wait_for_a_connection() -> None:
    world = World()
    p = world.publish(0, timeout=0.5)
    world.advance(0.5)  # the connect never finished
    assert isinstance(p.error, PublishError)
    assert not p.error.outcome_unknown
    assert isinstance(p.error.__cause__, NSQTimeoutError)
    assert "waiting for a connection" in str(p.error.__cause__)
    assert p.error.tries == 1


def test_a_refused_connection_is_tried_again_after_the_backoff() -> None:
    world = World()
    p = world.publish(0)
    world.connect(ok=False)
    assert p.state == QUEUED
    assert world.connecting == []
    world.advance(0.1)
    assert len(world.connecting) == 1
    world.roundtrip()
    assert p.results is not None
    assert p.results[0].tries == 2


def test_publishes_wait_for_a_first_layout_in_call_order() -> None:
    world = World()
    del world.layouts[TOPIC]
    publishes = [world.publish(key) for key in (0, 2, NO_KEY, 4)]
    assert world.lookups == [TOPIC]  # one lookup for them all
    assert all(p.state == QUEUED for p in publishes)
    world.move(0, "a")  # the layout arrives
    world.roundtrip()
    keyed = [publishes[0], publishes[1], publishes[3]]
    assert [s.publish for s in world.stored_in(0) if s.publish in keyed] == keyed
    assert all(p.results is not None for p in publishes)


def test_a_topic_nsqlookupd_does_not_know_ends_what_waits_for_it() -> None:
    world = World()
    del world.layouts[TOPIC]
    p = world.publish(0)
    from smartnsq.errors import TopicNotFoundError

    world.act(world.flow.layout_failed(TOPIC, TopicNotFoundError(TOPIC), world.now))
    assert isinstance(p.error, TopicNotFoundError)
    assert not world.flow.wants_layout(TOPIC)


def test_an_unkeyed_publish_moves_to_another_partition_at_once() -> None:
    world = World()
    p = world.publish()  # round-robin: partition 0 first
    world.connect_all()
    link = world.links[0]
    assert link.key[2] == 0
    world.move(0, "c")
    world.process(link)
    world.deliver(link)  # refused: not the leader
    world.advance(0.0)
    world.roundtrip()
    assert p.results is not None
    assert p.results[0].partition == 1
    assert p.results[0].tries == 2


def test_a_keyed_publish_never_changes_partition() -> None:
    world = World()
    p = world.publish(1)
    world.move(1, None)  # no writable leader: nowhere to go but wait
    world.connect_all()
    world.kill(world.links[0])
    world.advance(4.0)
    assert p.state == QUEUED
    world.move(1, "a")
    world.answer_lookups()
    world.roundtrip()
    assert p.results is not None
    assert p.results[0].partition == 1
    assert {s.partition for s in world.stored} == {1}


def test_max_retries_ends_a_publish_that_keeps_failing() -> None:
    world = World(max_retries=1)
    p = world.publish(0)
    link = _only_link(world)
    for _ in range(3):
        world.process(link, fail=True)
        world.deliver(link)
        world.advance(0.1)
    assert isinstance(p.error, PublishError)
    assert "max_retries=1" in str(p.error)
    assert p.error.tries == 2


def test_a_server_that_cannot_take_the_command_refuses_before_anything_is_sent() -> None:
    world = World()
    request = message_request(TOPIC, b"x", partition=0, delay=1.0)  # DPUB on youzan
    p = world.submit(request)
    world.connect_all()
    assert isinstance(p.error, UnsupportedFeatureError)
    assert world.sent == []
    assert world.flow.stats.failures == 0  # refused before it was sent: no failure counted


def test_a_partition_the_topic_does_not_have_is_refused_before_sending() -> None:
    world = World()
    p = world.submit(PublishRequest(TOPIC, "PUB", [b"x"], partition=7))
    assert isinstance(p.error, ValidationError)


def test_a_fatal_refusal_is_raised_as_it_is_and_the_rest_goes_on() -> None:
    world = World()
    a = world.publish(0)
    link = _only_link(world)
    b = world.publish(2)
    world.act(world.flow.refused(a, BadMessageError("E_BAD_MESSAGE too big"), world.now))
    assert isinstance(a.error, BadMessageError)
    world.process(link, 2)
    world.deliver(link, 2)
    assert b.results is not None


def test_a_cancelled_publish_never_sent_is_taken_out() -> None:
    world = World()
    a = world.publish(0)
    b = world.publish(2)
    world.act(world.flow.cancel(b, world.now))
    world.roundtrip()
    assert [s.publish for s in world.stored] == [a]
    assert world.flow.pending == 0


def test_many_released_at_once_leave_over_several_turns() -> None:
    world = World(per_turn=10)
    first = world.publish(0)
    link = _only_link(world)
    world.kill(link)
    rest = [world.publish(0) for _ in range(35)]
    world.advance(0.1)
    world.connect_all()
    world.roundtrip()  # the first alone, then the rest
    assert all(p.results is not None for p in [first, *rest])
    assert [s.publish for s in world.stored_in(0)] == [first, *rest]


def test_the_lane_depth_bounds_what_is_in_doubt() -> None:
    world = World(lane_depth=4)
    publishes = [world.publish(0) for _ in range(10)]
    world.connect_all()
    assert len(world.links[0].requests) == 4
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == publishes


def test_close_ends_everything_with_the_error() -> None:
    world = World()
    p = world.publish(0)
    world.connect_all()
    q = world.publish(1)
    error = ConnectionClosedError("closed")
    world.act(world.flow.close(error))
    assert p.error is error
    assert q.error is error
    later = world.publish(0)
    assert later.error is error


def _direct_flow() -> PublishFlow:
    return PublishFlow(
        Router(Sharder(lambda key, count: 0), ["127.0.0.1:4150"]),
        PublishCodec(),
        layouts=None,
        delays=Fixed(),
    )


def test_an_unbound_try_answered_in_its_thread_is_counted_at_the_next_count() -> None:
    flow = _direct_flow()
    here = object()
    p, steps = flow.submit(plain_request(TOPIC, b"m"), 0.0, 5.0, None, None, here)
    assert steps is NO_STEPS
    assert (p.link, p.state, p.tries) == (here, SENT, 1)
    command, data = flow.encode_here(p, False)
    assert command == "PUB"
    assert data.endswith(b"m")
    results = flow.answered_alone(p, OK)
    assert results is not None
    assert p.results is results
    assert p.state == DONE
    # over for its caller and for flush(); not in the counters until the lock holder counts
    assert flow.pending == 0
    assert flow.alone_answered == 1
    assert flow.stats.published == 0
    flow.count_alone()
    assert (flow.stats.published, flow.stats.publishes, flow.pending) == (1, 1, 0)
    assert flow.alone_answered == 1
    assert not flow.alone


def test_a_try_of_a_lane_is_not_answered_without_the_lock() -> None:
    world = World()
    here = object()
    p, _ = world.flow.submit(message_request(TOPIC, b"m", partition=0), 0.0, 5.0, None, None, here)
    assert (p.state, p.link) == (SENT, here)
    assert world.flow.answered_alone(p, OK) is None  # its lane is the lock holder's
    assert p.state == SENT


# --------------------------------------------------------------------------- the filter


def _handled(world: World, partition: int) -> list[Any]:
    """What an ordered consumer hands to its handler, reading the partition in order."""
    replays = ReplayFilter()
    handled = []
    for stored in world.stored_in(partition):
        if stored.stamp is None:
            handled.append(stored.publish)
            continue
        if replays.claim(partition, stored.stamp):
            replays.finish(partition, stored.stamp)
            handled.append(stored.publish)
    return handled


# --------------------------------------------------------------------------- any schedule


KEYS = st.integers(min_value=0, max_value=5)


class Schedules(RuleBasedStateMachine):
    """Any interleaving of publishes (keyed and not), nsqd reading and answering, links
    lost (with what they held delivered late, or never), refusals, leader moves, lookups
    and time. After each step: no publish outlives its deadline, a keyed publish goes only
    to its key's partition; at the end of any schedule, once everything settled: the stamped
    messages of each partition, as an ordered consumer takes them, are in call order and
    include every acknowledged publish; ``outcome_unknown`` is True exactly when a try may
    have been stored."""

    @initialize(
        ext=st.booleans(),
        depth=st.sampled_from([1, 3, 256]),
        retries=st.sampled_from([None, 3]),
        linger=st.sampled_from([None, None, 0.05, 0.3]),
        max_batch=st.sampled_from([2, 3, 100]),
    )
    def start(
        self, ext: bool, depth: int, retries: int | None, linger: float | None, max_batch: int
    ) -> None:
        self.world = World(
            3,
            ext=ext,
            lane_depth=depth,
            max_retries=retries,
            per_turn=5,
            linger=linger,
            max_batch=max_batch,
        )
        self.held: list[tuple[Link, list[Any]]] = []

    @rule(key=KEYS, timeout=st.sampled_from([0.3, 1.0, 5.0]))
    def publish(self, key: int, timeout: float) -> None:
        self.world.publish(key, timeout=timeout)

    @rule(timeout=st.sampled_from([0.3, 5.0]))
    def publish_unkeyed(self, timeout: float) -> None:
        self.world.publish(timeout=timeout)

    @precondition(lambda self: self.world.flow._linger is not None)
    @rule(timeout=st.sampled_from([0.03, 1.0, 5.0]), count=st.integers(1, 4))
    def pool(self, timeout: float, count: int) -> None:
        """Unkeyed plain publishes that wait for company (auto-batching)."""
        for _ in range(count):
            self.world.pool(timeout=timeout)

    @rule(keys=st.lists(st.one_of(KEYS, st.none()), min_size=2, max_size=6))
    def burst(self, keys: list[int | None]) -> None:
        """Publishes called together (what auto-batching joins); None: unkeyed."""
        for key in keys:
            self.world.publish(NO_KEY if key is None else key)

    @precondition(lambda self: self.world.connecting)
    @rule(ok=st.booleans(), data=st.data())
    def connect(self, ok: bool, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.world.connecting) - 1))
        self.world.connect(index, ok=ok)

    @precondition(lambda self: any(link.alive and link.requests for link in self.world.links))
    @rule(data=st.data(), count=st.integers(1, 4), fail=st.booleans())
    def process(self, data: st.DataObject, count: int, fail: bool) -> None:
        busy = [link for link in self.world.links if link.alive and link.requests]
        link = data.draw(st.sampled_from(busy))
        self.world.process(link, count, fail=fail and data.draw(st.booleans()))

    @precondition(lambda self: any(link.alive and link.answers for link in self.world.links))
    @rule(data=st.data(), count=st.integers(1, 4))
    def deliver(self, data: st.DataObject, count: int) -> None:
        answering = [link for link in self.world.links if link.alive and link.answers]
        self.world.deliver(data.draw(st.sampled_from(answering)), count)

    @precondition(lambda self: any(link.alive for link in self.world.links))
    @rule(data=st.data(), processed=st.integers(0, 3), late=st.booleans())
    def kill(self, data: st.DataObject, processed: int, late: bool) -> None:
        alive = [link for link in self.world.links if link.alive]
        link = data.draw(st.sampled_from(alive))
        held = self.world.kill(link, processed=processed)
        if late:
            self.held.append((link, held))

    @precondition(lambda self: self.held)
    @rule()
    def late(self) -> None:
        link, held = self.held.pop(0)
        self.world.late(link, held)

    @rule(partition=st.integers(0, 2), leader=st.sampled_from(["a", "b", "c", None]))
    def move(self, partition: int, leader: str | None) -> None:
        self.world.move(partition, leader)

    @precondition(lambda self: self.world.lookups)
    @rule()
    def lookup(self) -> None:
        self.world.answer_lookups()

    @rule()
    def poll(self) -> None:
        self.world.look_up()

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.5, 2.0]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @rule()
    def resume(self) -> None:
        self.world.resume()

    @invariant()
    def nothing_outlives_its_deadline(self) -> None:
        world = self.world
        for p in world.calls:
            if p.deadline <= world.now:
                assert p.state in (DONE, ZOMBIE), p
                assert (p.results is None) != (p.error is None), p
        for waiter in world.pooled:
            if waiter.deadline <= world.now:
                assert waiter.done(), "a pooled publish outlived its deadline"

    @invariant()
    def a_keyed_publish_goes_to_its_partition_only(self) -> None:
        world = self.world
        for sent, link in world.sent:
            for p in sent.members if isinstance(sent, Batch) else [sent]:
                key = p.request.key
                if key is not NO_KEY:
                    assert link.key[2] == world.partition_of(key)

    def teardown(self) -> None:
        world = getattr(self, "world", None)
        if world is None:
            return
        # The cluster heals: every leader back, everything answered, the time runs out.
        for partition in range(world.partitions):
            world.move(partition, "abc"[partition])
        world.look_up()
        world.answer_lookups()
        for _ in range(40):
            world.roundtrip()
            world.advance(1.0)
        assert world.flow.pending == 0
        assert all(waiter.done() for waiter in world.pooled)
        acknowledged = {id(p) for p in world.calls if p.results is not None}
        for partition in range(world.partitions):
            if world.ext:
                # As an ordered consumer takes them: each once, in call order, and every
                # acknowledged one among them.
                handled = [p for p in _handled(world, partition) if p.seq]
                _in_call_order(world, handled, partition)
                assert len(set(handled)) == len(handled), "a stamped message handled twice"
                expected = [
                    p
                    for p in world.calls
                    if id(p) in acknowledged
                    and p.request.key is not NO_KEY
                    and world.partition_of(p.request.key) == partition
                ]
                assert set(expected) <= set(handled), "an acknowledged publish was dropped"
            else:
                # No stamps: copies stay, and a publish given up on in doubt may be stored
                # late; the first copies of the others are in call order.
                first: list[Any] = []
                for stored in world.stored_in(partition):
                    p = stored.publish
                    doubtful = isinstance(p.error, PublishError) and p.error.outcome_unknown
                    if p.seq and p not in first and not doubtful:
                        first.append(p)
                _in_call_order(world, first, partition)
        stored = {id(s.publish) for s in world.stored}
        for p in world.calls:
            if not isinstance(p.error, PublishError):
                continue
            # outcome_unknown exactly when a try may have been stored: a try written and
            # never answered (lost with its link, or in flight at the deadline)
            in_doubt = bool(world.unanswered.get(id(p))) or id(p) in world.zombies
            assert p.error.outcome_unknown == in_doubt, p
            if id(p) in stored:
                assert p.error.outcome_unknown, f"{p} was stored, said not to be"


def _in_call_order(world: World, handled: list[Any], partition: int) -> None:
    """Each publish handled after every publish called before it, but where nsqd broke the
    order itself and the client could not know (``World.inversions``)."""
    calls = {id(p): index for index, p in enumerate(world.calls)}
    for later_index, later in enumerate(handled):
        for earlier in handled[:later_index]:
            if calls[id(earlier)] > calls[id(later)]:
                assert (id(later), id(earlier)) in world.inversions, (
                    f"partition {partition}: {earlier} handled before {later}, called after it"
                )


Schedules.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSchedules = Schedules.TestCase


@pytest.mark.parametrize("depth", [1, 256])
def test_order_holds_with_unstamped_topics_too(depth: int) -> None:
    """Without stamps a copy is stored twice, but the order of first copies holds."""
    world = World(ext=False, lane_depth=depth)
    publishes = [world.publish(0) for _ in range(5)]
    link = _only_link(world)
    world.kill(link, processed=2)
    world.advance(0.1)
    world.roundtrip()
    first_seen: list[Any] = []
    for stored in world.stored_in(0):
        if stored.publish not in first_seen:
            first_seen.append(stored.publish)
    assert first_seen == publishes
