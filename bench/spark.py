"""smartnsq.spark benchmark: rows/s through the nsq sink and source beside the plain Producer
and Consumer, measured in the same run on fresh embedded clusters.

Each measurement gets a fresh ``smartnsq cluster`` pinned to core 0 (youzan, one topic of 4
partitions). The direct clients run in this process, pinned to ``--client-cpu`` (core 1), as in
bench/producer.py and bench/consumer.py. The Spark session (``local[2]``: the JVM and its Python
workers inherit the affinity it starts with) gets ``--spark-cpus``: by default both cores,
shared with the cluster, as Spark would run on this machine; ``--spark-cpus 1`` confines it
to the direct clients' single core.

* sink: ``df.write.format("nsq")`` of ``--rows`` rows (100-byte bodies, a long
  ``sharding_key``, 2 tasks) against ``Producer.publish_many(..., sharding_keys=...)`` of the
  same rows in batches of ``--max-batch`` (what the sink does without Spark), and the classic
  ``publish_many`` of 100 unkeyed messages;
* source: ``spark.readStream.format("nsq")`` with ``trigger(availableNow=True)`` into the
  ``noop`` sink, from a topic pre-filled with ``--messages`` messages by raw MPUB: in the
  offsets mode (``startingOffsets=earliest``: the executors read the partitions' ranges,
  one micro-batch; also the rate within its micro-batch, without the query's start), in
  hold mode (``maxInFlight`` ``--hold-in-flight``: batches of up to half
  of it) and in journal mode (fsync'ed, batches of ``--per-trigger``), against
  ``Consumer(handler=async fn, max_in_flight=2500)`` on another channel of the same topic.

Targets: sink >= 0.5x the direct Producer, source >= 0.3x the direct Consumer (issue 14),
offsets mode >= 0.6x (issue 22).

Usage: python bench/spark.py [--rows N] [--messages N] [--rounds R] [--json out.json]
       python bench/spark.py --only source --messages 1000000   # the start amortised
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from _common import BODY, Cluster, exit_on_sigterm, log, prefill, spawn_cluster

import smartnsq

TOPIC = "bench"
WARM = "warmup"
PARTITIONS = 4
TARGETS = {"sink": 0.5, "source": 0.3, "offsets": 0.6}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per sink run")
    parser.add_argument("--messages", type=int, default=300_000, help="messages per source run")
    parser.add_argument("--max-batch", type=int, default=5000, help="sink maxBatch")
    parser.add_argument("--hold-in-flight", type=int, default=80_000, help="source, hold mode")
    parser.add_argument("--max-in-flight", type=int, default=10_000, help="source, journal")
    parser.add_argument("--per-trigger", type=int, default=100_000, help="source, journal")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cluster-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1, help="the direct clients")
    parser.add_argument("--spark-cpus", default="0,1", help="comma list: the Spark session")
    parser.add_argument("--only", help="sink or source")
    parser.add_argument("--json", type=Path, help="write the runs and medians here")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    spark = _spark_session({int(c) for c in args.spark_cpus.split(",")})
    _pin({args.client_cpu})
    runs: dict[str, list[float]] = {}
    try:
        for round_ in range(1, args.rounds + 1):
            if args.only in (None, "sink"):
                _sink_round(spark, args, runs, round_)
            if args.only in (None, "source"):
                _source_round(spark, args, runs, round_)
    finally:
        spark.stop()
    _report(runs, args)
    return 0


def _pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity") and max(cpus) < (os.cpu_count() or 1):
        os.sched_setaffinity(0, cpus)


def _spark_session(cpus: set[int]) -> Any:
    _pin(cpus)  # inherited by the JVM, then by its Python workers
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import smartnsq.spark

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("smartnsq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    smartnsq.spark.register(spark)
    log(f"Spark session ready in {time.perf_counter() - started:.1f} s")
    return spark


def _record(runs: dict[str, list[float]], name: str, rate: float, round_: int) -> None:
    runs.setdefault(name, []).append(rate)
    log(f"round {round_}: {name:<24} {rate:>10,.0f} rows/s")


def _timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- sink


def _fresh(args: Any, channels: Sequence[str] = ("bench",)) -> Any:
    return spawn_cluster(
        topics=[f"{TOPIC}:{PARTITIONS}:1", f"{WARM}:{PARTITIONS}:1"],
        channels=[f"{TOPIC}:{c}" for c in channels] + [f"{WARM}:{WARM}"],
        cpu=args.cluster_cpu,
    )


def _sink_round(spark: Any, args: Any, runs: dict[str, list[float]], round_: int) -> None:
    rows = args.rows
    keys = [(i * 7919) % 100_003 for i in range(rows)]
    with _fresh(args) as cluster:
        seconds = asyncio.run(_publish_keyed(cluster, keys, args.max_batch))
        _record(runs, "producer publish_many keyed", rows / seconds, round_)
    with _fresh(args) as cluster:
        seconds = asyncio.run(_publish_batches(cluster, rows, 100))
        _record(runs, "producer publish_many 100", rows / seconds, round_)
    with _fresh(args) as cluster:
        frame = spark.range(0, rows, 1, 2).selectExpr(
            f"concat(repeat('x', {len(BODY) - 8}), lpad(cast(id as string), 8, '0')) as body",
            "(id * 7919) % 100003 as sharding_key",
        )

        def write(count: int) -> None:
            frame.limit(count).write.format("nsq").mode("append").option(
                "lookupd", cluster.lookupd[0]
            ).option("topic", TOPIC).option("maxBatch", str(args.max_batch)).save()

        write(20_000)  # warm-up: Python workers, code paths
        seconds = _timed(lambda: write(rows))
        _record(runs, "spark sink", rows / seconds, round_)


async def _publish_keyed(cluster: Cluster, keys: list[int], batch: int) -> float:
    async with smartnsq.Producer(lookupd=cluster.lookupd) as producer:
        await producer.publish_many(TOPIC, [BODY] * 100, sharding_keys=keys[:100])
        started = time.perf_counter()
        for start in range(0, len(keys), batch):
            chunk = keys[start : start + batch]
            await producer.publish_many(TOPIC, [BODY] * len(chunk), sharding_keys=chunk)
        return time.perf_counter() - started


async def _publish_batches(cluster: Cluster, rows: int, batch: int) -> float:
    async with smartnsq.Producer(lookupd=cluster.lookupd) as producer:
        await producer.publish_many(TOPIC, [BODY] * batch)
        started = time.perf_counter()
        for _ in range(rows // batch):
            await producer.publish_many(TOPIC, [BODY] * batch)
        return time.perf_counter() - started


# --------------------------------------------------------------------------- source


def _source_round(spark: Any, args: Any, runs: dict[str, list[float]], round_: int) -> None:
    messages = args.messages
    with _fresh(args, ("bench", "hold", "journal", "offsets")) as cluster:
        asyncio.run(prefill(cluster.info, TOPIC, messages))
        asyncio.run(prefill(cluster.info, WARM, 2000))
        seconds = asyncio.run(_consume(cluster, messages))
        _record(runs, "consumer", messages / seconds, round_)
        with tempfile.TemporaryDirectory(prefix="smartnsq-bench-spark-") as tmp:
            # warm-up: the first streaming reads start the Python workers (one per task slot
            # and one planning the tasks' reads), which then serve the measured queries
            warm = Path(tmp) / "warm"
            _stream(spark, cluster, WARM, {"mode": "hold"}, 2000, warm / "hold", topic=WARM)
            earliest = {"startingOffsets": "earliest"}
            for again in range(2):
                _stream(spark, cluster, WARM, earliest, 2000, warm / f"offsets{again}", topic=WARM)
            timed = _stream(spark, cluster, "offsets", earliest, messages, Path(tmp) / "offsets")
            _record(runs, "spark source (offsets)", messages / timed.seconds, round_)
            _record(runs, "  in its micro-batches", messages / timed.in_batches, round_)
            hold = {"mode": "hold", "maxInFlight": args.hold_in_flight}
            seconds = _stream(spark, cluster, "hold", hold, messages, Path(tmp) / "hold").seconds
            _record(runs, "spark source (hold)", messages / seconds, round_)
            journal = {
                "journal": str(Path(tmp) / "journal"),
                "maxMessagesPerTrigger": args.per_trigger,
                "maxInFlight": args.max_in_flight,
            }
            seconds = _stream(spark, cluster, "journal", journal, messages, Path(tmp) / "j").seconds
            _record(runs, "spark source (journal)", messages / seconds, round_)


async def _consume(cluster: Cluster, expected: int) -> float:
    done = asyncio.get_running_loop().create_future()
    received = 0

    async def handler(message: smartnsq.Message) -> None:
        nonlocal received
        received += 1
        if received == expected:
            done.set_result(None)

    started = time.perf_counter()
    consumer = smartnsq.Consumer(
        TOPIC, "bench", lookupd=cluster.lookupd, handler=handler, max_in_flight=2500
    )
    async with consumer:
        await asyncio.wait_for(done, 600)
        return time.perf_counter() - started


def _stream(
    spark: Any,
    cluster: Cluster,
    channel: str,
    options: dict[str, Any],
    expected: int,
    tmp: Path,
    topic: str = TOPIC,
) -> Timed:
    reader = spark.readStream.format("nsq").option("lookupd", cluster.lookupd[0])
    reader = reader.option("topic", topic).option("channel", channel)
    if options.get("mode") == "hold" or "journal" in options:
        reader = reader.option("availableNowIdle", "0.3")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(900)
    seconds = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    if rows < expected:
        raise RuntimeError(f"the {channel} query read {rows} of {expected} messages")
    batches = [p["durationMs"]["triggerExecution"] for p in progress if p["numInputRows"]]
    return Timed(seconds, sum(batches) / 1000)


class Timed(NamedTuple):
    """A query's wall time, and the part of it spent in micro-batches that read something
    (Spark's triggerExecution): the query without its start (Spark starts a Python process
    for a streaming source, about a second here), i.e. what a running stream sustains."""

    seconds: float
    in_batches: float


# --------------------------------------------------------------------------- report


def _report(runs: dict[str, list[float]], args: Any) -> None:
    medians = {name: statistics.median(rates) for name, rates in runs.items()}
    print(
        f"smartnsq.spark, youzan {PARTITIONS} partitions; cluster on core {args.cluster_cpu}, "
        f"direct clients on core {args.client_cpu}, Spark local[2] on cores {args.spark_cpus}; "
        f"medians of {args.rounds} round(s)"
    )
    for name, rate in medians.items():
        print(f"  {name:<28}{rate:>12,.0f} rows/s")
    producer = max(
        medians.get("producer publish_many keyed", 0), medians.get("producer publish_many 100", 0)
    )
    ratios = {}
    if producer and "spark sink" in medians:
        ratios["sink"] = medians["spark sink"] / producer
    consumer = medians.get("consumer")
    for mode in ("offsets", "hold", "journal"):
        name = f"spark source ({mode})"
        if consumer and name in medians:
            ratios[f"source ({mode})"] = medians[name] / consumer
    if consumer and "  in its micro-batches" in medians:
        ratios["source (offsets), in its micro-batches"] = (
            medians["  in its micro-batches"] / consumer
        )
    for name, ratio in ratios.items():
        target = TARGETS["offsets"] if "offsets" in name else TARGETS[name.split()[0]]
        state = "MET " if ratio >= target else "MISS"
        print(f"  [{state}] {name}: {ratio:.2f}x the direct client (target {target}x)")
    if args.json:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        data = {"options": options, "rates": runs, "medians": medians, "ratios": ratios}
        args.json.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
