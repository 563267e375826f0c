"""The nsq sink against the embedded cluster: placement equal to Producer.publish's, order per
key within a task, bad schemas refused before any task runs, classic nsqd."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from pyspark.errors import AnalysisException

import smartnsq.sync
from tests.integration.threaded_cluster import ThreadedCluster

ROWS = 10_000
TASKS = 2


def _publish_picks(cluster: ThreadedCluster, topic: str, keys: list[Any]) -> dict[Any, int | None]:
    """The partition Producer.publish chooses for each key (one probe message per key)."""
    with smartnsq.sync.Producer(lookupd=[cluster.lookupd_url]) as producer:
        return {k: producer.publish(topic, b"probe", sharding_key=k).partition for k in keys}


def _logged(cluster: ThreadedCluster, topic: str) -> dict[int, list[bytes]]:
    def read() -> dict[int, list[bytes]]:
        return {p: [r.body for r in cluster.cluster.messages(topic, p)] for p in range(4)}

    return cluster.call(read)


@pytest.mark.parametrize(
    ("key_sql", "key_of"),
    [
        # longs: negative, zero and beyond 32 bits
        ("(id % 97 - 48) * 4294967311", lambda i: (i % 97 - 48) * 4294967311),
        # strings, ASCII and not
        (
            "concat('kunde-', cast(id % 89 as string), if(id % 2 = 0, 'ü', ''))",
            lambda i: f"kunde-{i % 89}{'ü' if i % 2 == 0 else ''}",
        ),
    ],
    ids=["long-keys", "string-keys"],
)
def test_rows_land_where_publish_puts_their_key(
    spark: Any, youzan: ThreadedCluster, key_sql: str, key_of: Any
) -> None:
    youzan.run(youzan.cluster.create_topic("orders", 4, 1, channels=["billing"]))
    youzan.run(youzan.cluster.create_topic("probe", 4, 1, channels=["billing"]))
    df = spark.range(0, ROWS, 1, TASKS).selectExpr(
        "concat(cast(id as string), ':') as body", f"{key_sql} as sharding_key"
    )
    df.write.format("nsq").mode("append").option("lookupd", youzan.lookupd_url).option(
        "topic", "orders"
    ).option("maxBatch", "1000").save()

    keys = [key_of(i) for i in range(ROWS)]
    picks = _publish_picks(youzan, "probe", sorted(set(keys), key=str))
    logged = _logged(youzan, "orders")
    seen = Counter(body for bodies in logged.values() for body in bodies)
    assert len(seen) == ROWS, "a row was lost"
    assert set(seen.values()) == {1}, "a row was duplicated"
    per_key: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for partition, bodies in logged.items():
        for body in bodies:
            index = int(body.split(b":")[0])
            key = keys[index]
            assert partition == picks[key], f"row {index} (key {key!r}) on partition {partition}"
            per_key[(key, index * TASKS // ROWS)].append(index)  # spark.range: contiguous tasks
    for (key, task), indexes in per_key.items():
        assert indexes == sorted(indexes), f"key {key!r} lost its order in task {task}"


def test_partition_and_sharding_key_columns_one_per_row(
    spark: Any, youzan: ThreadedCluster
) -> None:
    youzan.run(youzan.cluster.create_topic("orders", 4, 1, channels=["billing"]))
    youzan.run(youzan.cluster.create_topic("probe", 4, 1, channels=["billing"]))
    # a third of the rows by partition, a third by key, a third with neither
    df = spark.range(0, 2000, 1, TASKS).selectExpr(
        "unhex(lpad(hex(id), 8, '0')) as body",
        "if(id % 3 = 1, cast(id % 4 as int), cast(null as int)) as partition",
        "if(id % 3 = 2, cast(id % 7 as string), cast(null as string)) as sharding_key",
    )
    df.write.format("nsq").mode("append").option("lookupd", youzan.lookupd_url).option(
        "topic", "orders"
    ).save()
    picks = _publish_picks(youzan, "probe", [str(key) for key in range(7)])
    logged = _logged(youzan, "orders")
    assert sum(map(len, logged.values())) == 2000
    for partition, bodies in logged.items():
        for body in bodies:
            index = int.from_bytes(body, "big")
            if index % 3 == 1:
                assert partition == index % 4
            elif index % 3 == 2:
                assert partition == picks[str(index % 7)], f"row {index} on {partition}"
    # unkeyed rows are spread one batch at a time: more than one partition got some
    unkeyed = {
        p for p, bodies in logged.items() for b in bodies if int.from_bytes(b, "big") % 3 == 0
    }
    assert unkeyed
    # a row that fills both fails the write, before its batch is published
    both = spark.range(0, 10, 1, 1).selectExpr(
        "unhex(lpad(hex(id + 5000), 8, '0')) as body",
        "cast(id % 4 as int) as partition",
        "if(id = 7, 'k', cast(null as string)) as sharding_key",
    )
    writer = both.write.format("nsq").mode("append").option("lookupd", youzan.lookupd_url)
    with pytest.raises(Exception, match=r"a row sets both partition \(3\) and sharding_key"):
        writer.option("topic", "orders").save()
    assert sum(map(len, _logged(youzan, "orders").values())) == 2000


@pytest.mark.parametrize(
    ("select", "column", "options"),
    [
        (["cast(id as string) as payload"], "body", {}),
        (["cast(id as double) as body"], "body", {}),
        (["cast(id as string) as body", "cast(id as double) as sharding_key"], "sharding_key", {}),
        (["cast(id as string) as body", "id as shardingkey"], "shardingkey", {}),
        (["cast(id as string) as body", "id as trace_id"], "trace_id", {"nsqd": "127.0.0.1:1"}),
        (["cast(id as string) as body"], "topic", {"topic": None}),
        (["cast(id as string) as body"], "sharding", {"sharding": "crc32"}),
    ],
    ids=[
        "no-body",
        "body-type",
        "key-type",
        "unknown",
        "classic-trace",
        "no-topic",
        "bad-option",
    ],
)
def test_bad_schema_fails_before_any_task(
    spark: Any, select: list[str], column: str, options: dict[str, str | None]
) -> None:
    settings: dict[str, str | None] = {"lookupd": "http://127.0.0.1:1", "topic": "orders"}
    settings.update(options)
    if "nsqd" in options:
        settings.pop("lookupd")
    writer = spark.range(3).selectExpr(*select).write.format("nsq").mode("append")
    for name, value in settings.items():
        if value is not None:
            writer = writer.option(name, value)
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("bad-schema", "must not run")
    try:
        with pytest.raises(AnalysisException) as raised:
            writer.save()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert f"ValidationError: {column}:" in str(raised.value)
    assert tracker.getJobIdsForGroup("bad-schema") == []


def test_classic_nsqd_with_keys_and_delays(spark: Any, classic: ThreadedCluster) -> None:
    address = classic.nsqd_addresses[0]
    df = spark.range(0, 500, 1, TASKS).selectExpr(
        "concat('e', cast(id as string)) as body",
        "cast(id % 7 as string) as sharding_key",
        "if(id < 2, 60000, null) as delay_ms",
    )
    df.write.format("nsq").mode("append").option("nsqd", address).option("topic", "events").save()
    bodies = classic.call(lambda: [r.body for r in classic.cluster.messages("events")])
    assert sorted(bodies) == sorted(f"e{i}".encode() for i in range(500))
