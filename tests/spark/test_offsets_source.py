"""The offsets mode against the embedded cluster (youzan): ranges of queue offsets planned on
the driver and read on the executors, exactly once into the file sink, the same rows when a
micro-batch runs again, a leader failover in the middle of a read, batch reads between two
offsets or from a timestamp, an ordered topic's order."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import smartnsq.sync
from smartnsq.admin import Admin
from smartnsq.protocol.commands import StartPosition
from tests.integration.threaded_cluster import ThreadedCluster
from tests.spark.conftest import Subscription
from tests.spark.waiting import (
    assert_every_body_once_in_queue_order,
    committed_batches,
    finish,
    rows_across_a_restart,
    wait_until,
)


def _publish(
    cluster: ThreadedCluster, topic: str, bodies: list[bytes], partition: int | None = None
) -> None:
    with smartnsq.sync.Producer(lookupd=[cluster.lookupd_url]) as producer:
        for start in range(0, len(bodies), 500):
            chunk = bodies[start : start + 500]
            if partition is None:
                producer.publish_many(topic, chunk)
            else:
                producer.publish_many(topic, chunk, partition=partition)


def _bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def _load(reader: Any, cluster: ThreadedCluster, topic: str, options: dict[str, Any]) -> Any:
    reader = reader.format("nsq").option("lookupd", cluster.lookupd_url)
    reader = reader.option("topic", topic).option("channel", "spark")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def _source(spark: Any, cluster: ThreadedCluster, topic: str, **options: Any) -> Any:
    return _load(spark.readStream, cluster, topic, options)


def _batch(spark: Any, cluster: ThreadedCluster, topic: str, **options: Any) -> Any:
    return _load(spark.read, cluster, topic, options)


def _read_what_is_there(
    spark: Any, cluster: ThreadedCluster, topic: str, name: str, **options: Any
) -> list[bytes]:
    """The bodies a first run with ``trigger(availableNow=True)`` reads, through the memory
    sink's table ``name``."""
    stream = _source(spark, cluster, topic, **options).writeStream.format("memory")
    finish(stream.queryName(name).trigger(availableNow=True).start())
    return [row.body for row in spark.table(name).collect()]


def _offsets(cluster: ThreadedCluster, topic: str) -> Any:
    async def read() -> Any:
        async with Admin([cluster.cluster.lookupd_url]) as admin:
            return await admin.offsets(topic, "spark")

    return cluster.run(read())


def _read_on_executors(subscriptions: list[Subscription], topic: str) -> None:
    """Every connection that read ``topic`` came from an executor: a process other than the
    driver's (this one and its Python source process), under an executor JVM."""
    readers = [s for s in subscriptions if s.topic == topic]
    assert readers, "nothing subscribed to the topic"
    for reader in readers:
        assert reader.pid != os.getpid()
        assert any("CoarseGrainedExecutorBackend" in line for line in reader.lineage), (
            f"pid {reader.pid} does not run under an executor: {reader.lineage}"
        )


def test_stream_stopped_and_restarted_gives_every_body_exactly_once(
    spark: Any, youzan: ThreadedCluster, subscriptions: list[Subscription], tmp_path: Path
) -> None:
    youzan.run(youzan.cluster.create_topic("events", 4, 2, channels=["spark"]))
    first = _bodies("a", 6000)
    _publish(youzan, "events", first)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        stream = _source(
            spark, youzan, "events", startingOffsets="earliest", maxMessagesPerTrigger=1000
        )
        writer = stream.writeStream.format("parquet").option("path", str(output))
        return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()

    query = start({"processingTime": "0 seconds"})
    try:
        wait_until(lambda: committed_batches(output) >= 2, "two micro-batches")
    finally:
        query.stop()
    later = _bodies("b", 1000)
    _publish(youzan, "events", later)

    query = start({"availableNow": True})
    finish(query)

    seen = Counter(row.body for row in spark.read.parquet(str(output)).select("body").collect())
    missing = set(first + later) - set(seen)
    assert not missing, f"{len(missing)} published messages are not in the output"
    assert sum(seen.values()) == len(first) + len(later), "duplicates in the output"
    _read_on_executors(subscriptions, "events")
    # The readers left the channel at the end of what they read: nsqd's lag is the truth.
    for partition in _offsets(youzan, "events"):
        assert partition.position == partition.end
        assert partition.lag == 0


def test_a_micro_batch_run_again_reads_the_same_rows(
    spark: Any, youzan: ThreadedCluster, tmp_path: Path
) -> None:
    youzan.run(youzan.cluster.create_topic("events", 2, 1, channels=["spark"]))
    _publish(youzan, "events", _bodies("a", 3000))
    checkpoint = tmp_path / "checkpoint"
    batches: dict[int, list[list[Any]]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        rows = frame.orderBy("partition", "queue_offset").collect()
        batches.setdefault(batch_id, []).append([tuple(row) for row in rows])

    def run() -> None:
        stream = _source(
            spark, youzan, "events", startingOffsets="earliest", maxMessagesPerTrigger=1000
        )
        query = (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        finish(query)

    run()
    last = max(batches)
    assert last >= 2
    # As after a crash between running batch `last` and recording it: Spark runs it again.
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    _publish(youzan, "events", _bodies("b", 500))  # not part of that batch
    run()
    first_run, second_run = batches[last][0], batches[last][1]
    assert first_run, "the batch read nothing"
    assert second_run == first_run


class _MoveAfter(list):  # type: ignore[type-arg]
    """A channel record's list of deliveries that moves the partition's leader once it
    holds ``count`` of them: in the middle of a read, on the cluster's loop, as it happens."""

    def __init__(self, count: int, move: Callable[[], None]) -> None:
        super().__init__()
        self.count = count
        self.move: Callable[[], None] | None = move

    def append(self, item: Any) -> None:
        super().append(item)
        self._check()

    def extend(self, items: Any) -> None:
        super().extend(items)
        self._check()

    def _check(self) -> None:
        if self.move is not None and len(self) >= self.count:
            move, self.move = self.move, None
            asyncio.get_running_loop().call_soon(move)


def test_leader_failover_during_a_read(
    spark: Any, youzan: ThreadedCluster, subscriptions: list[Subscription]
) -> None:
    youzan.call(lambda: setattr(youzan.cluster, "record_deliveries", True))
    youzan.run(youzan.cluster.create_topic("events", 1, 2, channels=["spark"]))
    bodies = _bodies("f", 30_000)
    _publish(youzan, "events", bodies, partition=0)
    leader = youzan.call(lambda: youzan.cluster.leader("events", 0))
    moves = _MoveAfter(2000, lambda: youzan.cluster.move_leader_now("events", 0, 1 - leader))
    record = youzan.call(lambda: youzan.cluster.channel_record("events", "spark"))
    youzan.call(lambda: setattr(record, "deliveries", moves))

    rows = _batch(spark, youzan, "events").select("body", "queue_offset").collect()
    assert moves.move is None, "the leader did not move"
    assert [r.body for r in rows] == bodies  # every message once, in queue order
    nodes = {s.node for s in subscriptions if s.topic == "events"}
    assert nodes == {leader, 1 - leader}, "the read did not go on on the new leader"


def test_batch_read_between_two_offsets(spark: Any, youzan: ThreadedCluster) -> None:
    youzan.run(youzan.cluster.create_topic("events", 2, 1, channels=["spark"]))
    _publish(youzan, "events", _bodies("p0", 200), partition=0)
    _publish(youzan, "events", _bodies("p1", 200), partition=1)
    logged = youzan.call(lambda: youzan.cluster.messages("events", 0))
    # From inside message 20 (a position inside a message starts at the next one, as
    # nsqd's seek does) to message 150; all of partition 1.
    start, end = logged[20].offset + 3, logged[150].offset
    starting = json.dumps({"events": {"0": start, "1": -2}})
    ending = json.dumps({"events": {"0": end, "1": -1}})
    frame = _batch(spark, youzan, "events", startingOffsets=starting, endingOffsets=ending)
    rows = frame.select("partition", "queue_offset", "body").collect()
    p0 = [(r.queue_offset, r.body) for r in rows if r.partition == 0]
    assert p0 == [(m.offset, m.body) for m in logged[21:150]]
    assert sorted(r.body for r in rows if r.partition == 1) == sorted(_bodies("p1", 200))
    # Defaults: earliest to latest.
    assert _batch(spark, youzan, "events").count() == 400


def test_a_batch_read_with_nothing_to_read_has_no_rows(spark: Any, youzan: ThreadedCluster) -> None:
    """A periodic batch job meets this whenever nothing new arrived: 0 rows, not an error
    (Spark runs one task even when the source plans none)."""
    youzan.run(youzan.cluster.create_topic("quiet", 2, 1, channels=["spark"]))
    empty = _batch(spark, youzan, "quiet")
    assert (empty.count(), empty.collect()) == (0, [])
    _publish(youzan, "quiet", _bodies("p0", 20), partition=0)
    _publish(youzan, "quiet", _bodies("p1", 20), partition=1)
    ends = {
        str(p): m.offset + m.raw_size
        for p in (0, 1)
        for m in youzan.call(lambda p=p: youzan.cluster.messages("quiet", p))[-1:]
    }
    caught_up = _batch(spark, youzan, "quiet", startingOffsets=json.dumps({"quiet": ends}))
    assert caught_up.collect() == []
    assert _batch(spark, youzan, "quiet").count() == 40


def test_a_first_run_reads_the_channels_backlog_by_default(
    spark: Any, youzan: ThreadedCluster
) -> None:
    # A registered channel holds a backlog: all of partition 1, partition 0 from message 40
    # on (the first 40 were consumed before). No startingOffsets, no checkpoint.
    youzan.run(youzan.cluster.create_topic("backlog", 2, 1, channels=["spark"]))
    _publish(youzan, "backlog", _bodies("p0", 100), partition=0)
    _publish(youzan, "backlog", _bodies("p1", 100), partition=1)
    logged = youzan.call(lambda: youzan.cluster.messages("backlog", 0))

    async def consume_forty() -> None:
        async with Admin([youzan.cluster.lookupd_url]) as admin:
            position = StartPosition.queue_offset(logged[40].offset)
            await admin.seek("backlog", "spark", position, partitions=[0])

    youzan.run(consume_forty())
    bodies = _read_what_is_there(spark, youzan, "backlog", "channel_backlog")
    assert sorted(bodies) == sorted(_bodies("p0", 100)[40:] + _bodies("p1", 100))
    for partition in _offsets(youzan, "backlog"):
        assert partition.lag == 0


def test_starting_timestamp(spark: Any, youzan: ThreadedCluster) -> None:
    youzan.run(youzan.cluster.create_topic("events", 2, 1, channels=["spark"]))
    _publish(youzan, "events", _bodies("old", 100))
    # nsqd finds timestamps to the second: the new messages start in a later second.
    second = int(time.time()) + 1
    wait_until(lambda: time.time() >= second, "the next second", 2.0)
    newer = _bodies("new", 100)
    _publish(youzan, "events", newer)
    bodies = _read_what_is_there(
        spark, youzan, "events", "from_timestamp", startingTimestamp=second * 1000
    )
    assert sorted(bodies) == sorted(newer)


def test_ordered_topic_keeps_each_partition_in_queue_order(
    spark: Any, youzan: ThreadedCluster, tmp_path: Path
) -> None:
    youzan.run(youzan.cluster.create_topic("ledger", 4, 1, ordered=True, channels=["spark"]))
    bodies = [f"ledger-{i}".encode() for i in range(2000)]
    with smartnsq.sync.Producer(lookupd=[youzan.lookupd_url]) as producer:
        for start in range(0, len(bodies), 100):
            partition = (start // 100) % 4
            producer.publish_many("ledger", bodies[start : start + 100], partition=partition)
    rows = rows_across_a_restart(
        lambda: _source(
            spark, youzan, "ledger", startingOffsets="earliest", maxMessagesPerTrigger=300
        ),
        tmp_path / "cp",
    )
    assert_every_body_once_in_queue_order(rows, bodies, partitions=4)
