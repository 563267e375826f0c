"""The Spark source's receiver without Spark, against the embedded cluster: what Spark's
calls (plan, rows, commit) do to the messages on nsqd, in hold and journal mode."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import smartnsq.sync
from smartnsq.protocol.message import youzan_message_id
from smartnsq.spark.journal import Journal
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.receiver import Receiver
from smartnsq.spark.rows import Row, encode_row

from .threaded_cluster import ThreadedCluster


@pytest.fixture
def cluster() -> Iterator[ThreadedCluster]:
    with ThreadedCluster(nodes=1, msg_timeout=2.0) as threaded:
        threaded.run(threaded.cluster.create_topic("events", 2, 1, channels=["spark"]))
        yield threaded


def _publish(cluster: ThreadedCluster, count: int) -> None:
    with smartnsq.sync.Producer(lookupd=[cluster.lookupd_url]) as producer:
        producer.publish_many("events", [f"e{i}".encode() for i in range(count)], partition=0)


def _receiver(cluster: ThreadedCluster, committed: int = 0, **options: str) -> Receiver:
    parsed = SourceOptions.parse(
        {
            "lookupd": cluster.lookupd_url,
            "topic": "events",
            "channel": "spark",
            "availableNowIdle": "0.5",
            **options,
        }
    )
    return Receiver(parsed, committed=committed, seen=committed)


def _wait_pending(receiver: Receiver, start: int, count: int) -> int:
    """Plan the next batch as Trigger.AvailableNow does: once ``count`` messages are there,
    or nothing more has arrived for availableNowIdle."""
    receiver.available_now()
    end = receiver.plan(start, None)
    assert end - start == count
    return end


def test_hold_mode_finishes_only_at_commit_and_touches_meanwhile(cluster: ThreadedCluster) -> None:
    _publish(cluster, 10)
    receiver = _receiver(cluster, msgTimeout="1")  # TOUCH every 1/3 s; nsqd would wait 1 s
    try:
        end = _wait_pending(receiver, 0, 10)
        rows = receiver.rows(0, end)
        assert sorted(r.body for r in rows) == sorted(f"e{i}".encode() for i in range(10))
        assert cluster.call(lambda: cluster.cluster.in_flight("events", "spark")) == 10
        # held for longer than the msg_timeout this client asked for (1 s) and the cluster's
        # (2 s): kept alive, not redelivered
        time.sleep(2.5)
        record = cluster.call(lambda: cluster.cluster.channel_record("events", "spark"))
        assert record.timed_out == []
        assert receiver.plan(0, None) == 10  # asked again: the same batch
        receiver.commit(end)
        cluster.wait_for(lambda: cluster.cluster.unfinished("events", "spark") == 0)
    finally:
        receiver.close()


def test_hold_mode_batches_leave_room_for_the_next_one(cluster: ThreadedCluster) -> None:
    _publish(cluster, 100)
    receiver = _receiver(cluster, maxInFlight="40")  # 2 partitions: 20 each, 10 per batch
    try:
        first = _wait_pending(receiver, 0, 10)
        _wait_pending(receiver, first, 10)  # received while the first is held
        receiver.commit(first)  # the first batch is finished...
        cluster.wait_for(
            lambda: len(cluster.cluster.channel_record("events", "spark").finished) == 10
        )
    finally:
        receiver.close()
    # the process's connection is gone: what was held (the second batch) goes back to nsqd
    cluster.wait_for(lambda: cluster.cluster.in_flight("events", "spark") == 0)
    assert cluster.call(lambda: cluster.cluster.unfinished("events", "spark")) == 90


def test_journal_mode_replays_and_recognises_a_redelivery(
    cluster: ThreadedCluster, tmp_path: Path
) -> None:
    _publish(cluster, 3)
    records = cluster.call(lambda: cluster.cluster.messages("events", 0))
    first = records[0]
    # A journal left by a run that died right after journaling the first message, before
    # its FIN left: nsqd still has it.
    row = Row(
        first.body,
        0,
        youzan_message_id(first.internal_id, first.trace_id).hex(),
        0,
        None,
        None,
        1,
        0,
        None,
    )
    with Journal(tmp_path / "journal") as journal:
        journal.open()
        journal.append(1, [encode_row(row)])
    receiver = _receiver(cluster, journal=str(tmp_path / "journal"))
    try:
        end = _wait_pending(receiver, 0, 3)
        bodies = [r.body for r in receiver.rows(0, end)]
        assert sorted(bodies) == [b"e0", b"e1", b"e2"]  # e0 once: from the journal
        # journal mode finishes as soon as the journal holds a message
        cluster.wait_for(lambda: cluster.cluster.unfinished("events", "spark") == 0)
        receiver.commit(end)
    finally:
        receiver.close()
    with Journal(tmp_path / "journal") as journal:
        assert journal.open() == []  # trimmed once committed


def test_journal_mode_resumes_nsqd_after_backpressure(
    cluster: ThreadedCluster, tmp_path: Path
) -> None:
    """A trigger may ask for more than maxBufferedMessages: nsqd is paused at that bound,
    the batch takes what is buffered, and nsqd resumes at once (AvailableNow does not take
    the pause for the end of the channel)."""
    _publish(cluster, 300)
    receiver = _receiver(
        cluster,
        journal=str(tmp_path / "journal"),
        maxBufferedMessages="50",
        maxInFlight="20",
        availableNowIdle="2",
    )
    try:
        receiver.available_now()
        start, bodies, waits = 0, [], []
        while len(bodies) < 300:
            began = time.monotonic()
            end = receiver.plan(start, 200)
            waits.append(time.monotonic() - began)
            assert end > start, f"AvailableNow stopped after {len(bodies)} of 300"
            assert end - start <= 60  # the bound (50), plus what was on its way
            bodies.extend(r.body for r in receiver.rows(start, end))
            receiver.commit(end)
            start = end
        # Only the last batch may wait out availableNowIdle (the channel's end): the
        # others never take the pause for it.
        assert max(waits[:-1]) < 1.5, waits
        assert sorted(bodies) == sorted(f"e{i}".encode() for i in range(300))
    finally:
        receiver.close()


def test_receiver_refuses_calls_from_a_forked_child_and_from_its_own_loop(
    cluster: ThreadedCluster,
) -> None:
    """The receiver runs on the blocking facade's loop thread, with its guards: a forked
    child (Spark's Python daemon forks its workers) gets ForkedClientError at once instead of
    waiting for a loop thread it does not have, and a call from the loop itself raises
    instead of deadlocking."""
    import asyncio
    import multiprocessing

    from smartnsq.errors import ForkedClientError

    receiver = _receiver(cluster)
    try:
        context = multiprocessing.get_context("fork")
        answers = context.Queue()

        def child() -> None:
            try:
                receiver.plan(0, None)
            except ForkedClientError:
                answers.put("ForkedClientError")
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answers.put(repr(exc))
            else:
                answers.put("no error")
            receiver.close()  # a forked copy: does nothing to the parent's loop

        process = context.Process(target=child)
        process.start()
        process.join(15)
        assert process.exitcode == 0, "the forked child hung on the parent's loop"
        assert answers.get(timeout=1) == "ForkedClientError"

        async def from_the_loop() -> None:
            receiver.commit(0)

        loop = receiver._runner.loop  # the loop the receiver's own callbacks run on
        future = asyncio.run_coroutine_threadsafe(from_the_loop(), loop)
        with pytest.raises(RuntimeError, match="deadlock"):
            future.result(5)
        assert receiver.plan(0, None) == 0  # the parent's receiver still works
    finally:
        receiver.close()
