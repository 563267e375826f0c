"""The driver source (hold and journal modes) against the embedded cluster: a query stopped
mid-way and restarted from its checkpoint loses nothing (duplicates within the documented
bound) and leaves nothing in flight; an ordered topic keeps each partition's queue order within
and across batches (journal mode); classic nsqd in both directions. The offsets mode, the
default on youzan, is test_offsets_source.py's."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import smartnsq.sync
from tests.integration.threaded_cluster import ThreadedCluster
from tests.spark.waiting import (
    WAIT,
    assert_every_body_once_in_queue_order,
    committed_batches,
    finish,
    rows_across_a_restart,
    wait_until,
)


def _publish(cluster: ThreadedCluster, topic: str, count: int, **routing: Any) -> list[bytes]:
    bodies = [f"{topic}-{i}".encode() for i in range(count)]
    with smartnsq.sync.Producer(lookupd=[cluster.lookupd_url]) as producer:
        for start in range(0, count, 100):
            chunk = bodies[start : start + 100]
            if routing.get("partitions"):
                partition = (start // 100) % routing["partitions"]
                producer.publish_many(topic, chunk, partition=partition)
            else:
                producer.publish_many(topic, chunk)
    return bodies


def _reader(spark: Any, cluster: ThreadedCluster, topic: str, channel: str, **options: Any) -> Any:
    reader = spark.readStream.format("nsq").option("lookupd", cluster.lookupd_url)
    reader = reader.option("topic", topic).option("channel", channel)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def test_restart_from_checkpoint_loses_nothing(
    spark: Any, youzan: ThreadedCluster, tmp_path: Path
) -> None:
    per_trigger = 1000
    youzan.run(youzan.cluster.create_topic("events", 4, 1, channels=["spark"]))
    bodies = _publish(youzan, "events", 5000)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        stream = _reader(
            spark,
            youzan,
            "events",
            "spark",
            mode="hold",
            maxMessagesPerTrigger=per_trigger,
            maxInFlight=8000,
        )
        writer = stream.writeStream.format("parquet").option("path", str(output))
        return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()

    def finished_some() -> bool:
        # A batch's messages are finished on nsqd once Spark commits the batch to the
        # source, which can come after the sink has it: the sink's count alone races.
        unfinished = youzan.call(lambda: youzan.cluster.unfinished("events", "spark"))
        return committed_batches(output) >= 2 and unfinished < len(bodies)

    first = start({"processingTime": "0 seconds"})
    try:
        wait_until(finished_some, "two micro-batches, the first finished on nsqd")
    finally:
        first.stop()
    # The source's process is gone: nsqd took back what it held (the last batches).
    youzan.wait_for(lambda: youzan.cluster.in_flight("events", "spark") == 0, WAIT)
    assert youzan.call(lambda: youzan.cluster.unfinished("events", "spark")) < len(bodies)

    second = start({"availableNow": True})
    finish(second)

    seen = Counter(row.body for row in spark.read.parquet(str(output)).select("body").collect())
    missing = set(bodies) - set(seen)
    assert not missing, f"{len(missing)} published messages are not in the output"
    duplicates = sum(seen.values()) - len(seen)
    # Documented bound: the last batch before each stop (committed by Spark, not yet
    # finished on nsqd) is delivered again, at most maxMessagesPerTrigger messages.
    assert duplicates <= per_trigger
    youzan.wait_for(lambda: youzan.cluster.in_flight("events", "spark") == 0, WAIT)
    # Left unfinished: at most the last batch of the second run, for the next run.
    assert youzan.call(lambda: youzan.cluster.unfinished("events", "spark")) <= per_trigger


def test_ordered_topic_keeps_queue_order_across_batches_and_restarts(
    spark: Any, youzan: ThreadedCluster, tmp_path: Path
) -> None:
    youzan.run(youzan.cluster.create_topic("ledger", 4, 1, ordered=True, channels=["spark"]))
    bodies = _publish(youzan, "ledger", 2000, partitions=4)
    rows = rows_across_a_restart(
        lambda: _reader(
            spark,
            youzan,
            "ledger",
            "spark",
            ordered="true",
            journal=tmp_path / "journal",
            maxMessagesPerTrigger=300,
        ),
        tmp_path / "cp",
    )
    # The journal replays exactly what Spark had not committed, and a message nsqd delivers
    # again because its FIN was lost with the first run is recognised: no loss, no duplicate.
    assert_every_body_once_in_queue_order(rows, bodies, partitions=4)
    # Journal mode finishes each message once it is journaled: nothing left on nsqd.
    youzan.wait_for(lambda: youzan.cluster.unfinished("ledger", "spark") == 0, WAIT)


def test_classic_nsqd_both_directions(spark: Any, classic: ThreadedCluster) -> None:
    address = classic.nsqd_addresses[0]
    frame = spark.range(0, 300, 1, 2).selectExpr(
        "concat('c', cast(id as string)) as body",
        "if(id < 3, 3600000, null) as delay_ms",  # deferred for an hour: not read below
    )
    frame.write.format("nsq").mode("append").option("nsqd", address).option(
        "topic", "events"
    ).save()
    stream = (
        spark.readStream.format("nsq")
        .option("nsqd", address)
        .option("topic", "events")
        .option("channel", "spark")
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("classic_events")
        .trigger(availableNow=True)
        .start()
    )
    finish(query)
    rows = spark.table("classic_events").collect()
    assert sorted(r.body for r in rows) == sorted(f"c{i}".encode() for i in range(3, 300))
    for row in rows:
        assert row.topic == "events"
        assert row.partition is None
        assert row.trace_id is None
        assert row.queue_offset is None
        assert row.attempts == 1
        assert re.fullmatch(r"[0-9a-f]{16}", row.message_id)


def test_ordered_needs_a_journal(spark: Any, youzan: ThreadedCluster) -> None:
    youzan.run(youzan.cluster.create_topic("ledger", 1, 1, ordered=True, channels=["spark"]))
    query = (
        _reader(spark, youzan, "ledger", "spark", mode="hold", ordered="true")
        .writeStream.format("memory")
        .queryName("no_journal")
        .start()
    )
    with pytest.raises(Exception, match="journal: ordered=true needs a journal"):
        query.awaitTermination(WAIT)
