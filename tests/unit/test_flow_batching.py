"""Auto-batching in the publish flow (``linger``), with no socket, loop or clock: what waits
for company and for how long, what one MPUB takes, what a failed batch does to the order of
its partition, and the unkeyed pool (tests/unit/flow_model.py is the model cluster)."""

from __future__ import annotations

import pytest

from smartnsq.errors import ConnectionClosedError, PublishError
from smartnsq.publishing.flow import DONE, QUEUED, SENT, Publish
from smartnsq.publishing.request import NO_KEY, PublishRequest
from tests.unit.flow_model import TOPIC, World


def _warm(world: World, keys: tuple[int, ...] = (0, 1)) -> None:
    """A link per partition of ``keys``, open and idle (the batches below go at once)."""
    for key in keys:
        world.publish(key)
    world.roundtrip()
    world.advance(world.flow._linger or 0.0)  # they lingered
    world.roundtrip()
    world.stored.clear()
    world.sent.clear()
    world.batches.clear()


def _traced(key: object = NO_KEY, trace_id: int = 7) -> PublishRequest:
    """An auto-traced publish (the producer's trace switch): it batches as MPUB_TRACE."""
    return PublishRequest(TOPIC, "PUB_TRACE", [b"t"], None, key, [trace_id], auto_trace=True)


def test_publishes_of_a_partition_linger_then_leave_as_one_batch() -> None:
    world = World(linger=0.05)
    _warm(world)
    publishes = [world.publish(0, body=b"%d" % i) for i in range(10)]
    assert world.sent == []  # waiting for company
    assert all(p.state == QUEUED for p in publishes)
    world.advance(0.04)
    assert world.sent == []
    world.advance(0.02)  # the first has lingered
    assert len(world.batches) == 1
    batch = world.batches[0]
    assert batch.command == "MPUB_EXT"  # stamped, on an ext topic
    assert batch.members == publishes
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == publishes
    assert [s.stamp.seq for s in world.stored_in(0)] == list(range(2, 12))  # type: ignore[union-attr]
    assert all(p.state == DONE and p.results is not None for p in publishes)
    assert world.flow.stats.publishes == 2 + 1  # the warm-up's two, and the batch


def test_max_batch_sends_a_full_batch_at_once() -> None:
    world = World(linger=2.0, max_batch=3)
    _warm(world)
    publishes = [world.publish(0) for _ in range(7)]
    assert [b.members for b in world.batches] == [publishes[0:3], publishes[3:6]]
    assert publishes[6].state == QUEUED  # lingers alone
    world.advance(2.0)
    assert len(world.batches) == 2  # one left: it goes alone, as a PUB
    assert world.sent[-1][0] is publishes[6]
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == publishes


def test_the_frame_bytes_split_batches() -> None:
    world = World(linger=2.0)
    world.flow._codec.max_body_size = 8 + 3 * (4 + 100)
    _warm(world)
    publishes = [world.publish(0, body=b"x" * 100) for _ in range(4)]
    world.advance(2.0)
    assert [len(b.members) for b in world.batches] == [3]
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == publishes


def test_what_cannot_join_a_batch_sends_the_batch_before_it() -> None:
    world = World(linger=2.0)
    _warm(world)
    plain = [world.publish(0) for _ in range(3)]
    traced = world.submit(_traced(0))
    assert [b.members for b in world.batches] == [plain]  # it went, not to be overtaken
    world.advance(2.0)
    assert world.sent[-1][0] is traced  # then the traced one, alone
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [*plain, traced]


def test_a_cancelled_publish_leaves_its_batch_before_it_goes() -> None:
    world = World(linger=0.05)
    _warm(world)
    a, b, c = (world.publish(0) for _ in range(3))
    world.act(world.flow.cancel(b, world.now))
    world.advance(0.05)
    assert world.batches[0].members == [a, c]
    world.roundtrip()
    assert [s.publish for s in world.stored] == [a, c]
    assert world.flow.pending == 0


def test_a_deadline_shorter_than_the_linger_ends_the_publish_on_time() -> None:
    world = World(linger=1.0)
    _warm(world)
    short = world.publish(0, timeout=0.2)
    other = world.publish(0)
    world.advance(0.2)
    assert isinstance(short.error, PublishError)
    assert not short.error.outcome_unknown
    world.advance(1.0)
    world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == [other]


def test_a_lost_batch_goes_again_in_order_and_batching_resumes() -> None:
    world = World(linger=0.05, ext=False)
    _warm(world)
    first = [world.publish(0) for _ in range(4)]
    world.advance(0.05)
    link = world.batches[0].link
    world.kill(link, processed=1)  # stored, its answer lost
    assert all(p.state != SENT for p in first)
    second = [world.publish(0) for _ in range(3)]
    for _ in range(10):
        world.advance(0.1)
        world.roundtrip()
    assert all(p.results is not None for p in first + second)
    assert [p.results[0].tries for p in first] == [2, 2, 2, 2]  # type: ignore[index]
    order = [s.publish for s in world.stored_in(0)]
    # the batch stored whole, then each again after it in order (no stamps: a copy stays)
    assert order[:4] == first
    firsts: list[Publish] = []
    for p in order:
        if p not in firsts:
            firsts.append(p)
    assert firsts == first + second
    assert world.flow.stats.resent_in_doubt == 4


def test_a_refused_batch_is_refused_whole_and_sent_again() -> None:
    world = World(linger=0.05)
    _warm(world)
    publishes = [world.publish(0) for _ in range(3)]
    world.advance(0.05)
    link = world.batches[0].link
    world.process(link, fail=True)
    world.deliver(link)
    assert world.stored == []
    for _ in range(10):
        world.advance(0.1)
        world.roundtrip()
    assert [s.publish for s in world.stored_in(0)] == publishes


def test_unkeyed_publishes_pool_per_topic_and_leave_as_one_mpub() -> None:
    world = World(linger=0.05, partitions=2)
    _warm(world)
    waiters = [world.pool(body=b"%d" % i) for i in range(5)]
    assert world.sent == []
    assert world.flow.pending == 5
    world.advance(0.05)
    ((sent, _link),) = world.sent
    assert isinstance(sent, Publish)
    assert sent.request.command == "MPUB"
    world.roundtrip()
    results = [w.results for w in waiters]
    assert all(r is not None and len(r) == 1 for r in results)
    assert len({r[0].partition for r in results}) == 1  # type: ignore[index]
    assert [s.publish for s in world.stored] == [sent]  # one MPUB
    assert world.flow.pending == 0


def test_a_pool_leaves_once_full_and_a_single_message_goes_as_asked() -> None:
    world = World(linger=2.0, max_batch=3)
    _warm(world)
    waiters = [world.pool() for _ in range(4)]
    assert [p.request.command for p, _ in world.sent] == ["MPUB"]
    world.advance(2.0)
    assert [p.request.command for p, _ in world.sent] == ["MPUB", "PUB"]
    world.roundtrip()
    assert all(w.results is not None for w in waiters)


def test_a_pooled_publish_with_a_short_deadline_sends_its_pool_at_once() -> None:
    world = World(linger=2.0)
    _warm(world)
    first = world.pool()
    short = world.pool(timeout=1.0)
    ((sent, _),) = world.sent
    assert isinstance(sent, Publish)
    assert sent.deadline == short.deadline  # the batch ends by the earliest deadline
    world.roundtrip()
    assert first.results is not None
    assert short.results is not None


def test_a_cancelled_pooled_publish_leaves_its_pool() -> None:
    world = World(linger=0.05)
    _warm(world)
    a, b = world.pool(body=b"a"), world.pool(body=b"b")
    world.flow.unpool(TOPIC, b)
    assert world.flow.pending == 1
    world.advance(0.05)
    ((sent, _),) = world.sent
    assert sent.request.bodies == [b"a"]
    world.roundtrip()
    assert a.results is not None
    assert b.results is None


def test_an_unkeyed_pool_with_no_open_link_waits_for_one() -> None:
    world = World(linger=0.05)
    waiters = [world.pool() for _ in range(3)]
    world.advance(0.05)
    assert world.sent == []
    assert len(world.connecting) == 1
    world.roundtrip()
    assert [p.request.command for p, _ in world.sent] == ["MPUB"]
    assert all(w.results is not None for w in waiters)


def test_a_lost_pooled_batch_goes_whole_to_another_partition() -> None:
    world = World(linger=0.05, partitions=2)
    _warm(world)
    waiters = [world.pool() for _ in range(3)]
    world.advance(0.05)
    ((_batch, link),) = world.sent
    failed_on = link.key[2]
    world.kill(link)
    world.advance(0.0)
    world.roundtrip()
    assert all(w.results is not None for w in waiters)
    assert {w.results[0].partition for w in waiters} == {1 - failed_on}  # type: ignore[index, operator]
    assert {w.results[0].tries for w in waiters} == {2}  # type: ignore[index]


def test_a_pooled_batch_that_fails_gives_each_caller_its_error() -> None:
    world = World(linger=0.05, partitions=1, max_retries=0)
    _warm(world, keys=(0,))
    waiters = [world.pool() for _ in range(3)]
    world.advance(0.05)
    ((_batch, link),) = world.sent
    world.process(link, fail=True)
    world.deliver(link)
    errors = [w.error for w in waiters]
    assert all(isinstance(e, PublishError) for e in errors)
    assert len({id(e) for e in errors}) == 1


def test_flush_sends_what_lingers_at_once_and_nothing_lingers_after() -> None:
    world = World(linger=2.0)
    _warm(world)
    keyed = [world.publish(0) for _ in range(2)]
    unkeyed = [world.pool() for _ in range(2)]
    world.act(world.flow.flush(world.now))
    assert [len(b.members) for b in world.batches] == [2]
    assert [p.command for p, _ in world.sent] == ["MPUB", "MPUB_EXT"]
    late = world.publish(1)
    assert world.sent[-1][0] is late  # no linger
    also = world.pool()
    assert world.sent[-1][0].request.bodies == [b"x"]  # no linger
    world.roundtrip()
    assert all(p.results is not None for p in [*keyed, late])
    assert all(w.results is not None for w in [*unkeyed, also])


def test_close_ends_what_lingers() -> None:
    world = World(linger=2.0)
    _warm(world)
    keyed = world.publish(0)
    unkeyed = world.pool()
    error = ConnectionClosedError("closed")
    world.act(world.flow.close(error))
    assert keyed.error is error
    assert unkeyed.error is error
    assert world.flow.pending == 0


@pytest.mark.parametrize("ext", [True, False])
def test_a_batch_keeps_each_members_tries_in_its_result(ext: bool) -> None:
    world = World(linger=0.05, ext=ext)
    _warm(world)
    a = world.publish(0)
    world.advance(0.05)
    world.kill(world.links[0])  # a alone, lost: sent again after the backoff
    b = world.publish(0)
    for _ in range(10):
        world.advance(0.1)
        world.roundtrip()
    assert a.results is not None
    assert b.results is not None
    assert (a.results[0].tries, b.results[0].tries) == (2, 1)
