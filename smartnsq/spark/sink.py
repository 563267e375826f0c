"""The writers of the ``nsq`` data source: each Spark task publishes its rows through one
:class:`smartnsq.Producer`, by ``publish_many`` batches (one MPUB per partition).

Placement is the Producer's: a ``sharding_key`` row goes where ``publish(sharding_key=...)``
sends that key, a ``partition`` row to its partition, a row with neither round-robin one batch
at a time (as the Producer's auto-batching does). A DataFrame may have both columns; a row fills
one of them at most. Rows are published in windows of at most
``maxBatch`` rows (and ``max_body_size`` bytes), one window after the other, so rows of the same
key (or partition) keep their order within a task.

A failed publish fails the task. Spark may run a failed task again, which publishes its rows
again: the sink is at-least-once.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections import Counter
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage

from smartnsq.errors import ValidationError
from smartnsq.producer.producer import Producer, PublishResult
from smartnsq.spark.options import SinkOptions
from smartnsq.spark.schema import SinkColumns
from smartnsq.transport import loops

__all__ = ["Published", "publish_batches", "report_abort", "report_commit"]

log = logging.getLogger("smartnsq.spark")

_UINT64 = (1 << 64) - 1


@dataclass
class Published(WriterCommitMessage):
    """A task's commit message: the rows it published, per topic and partition (or nsqd
    address on classic)."""

    rows: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, topic: str, results: Sequence[PublishResult]) -> None:
        self.rows += len(results)
        per_target = self.counts.setdefault(topic, {})
        for (partition, address), count in Counter(map(_where, results)).items():
            target = address if partition is None else str(partition)
            per_target[target] = per_target.get(target, 0) + count


_where = operator.attrgetter("partition", "address")


def report_commit(messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> int:
    """The job's commit: log the total (and per partition), return the total."""
    total, counts = _sum(messages)
    where = "" if batch_id is None else f" (micro-batch {batch_id})"
    log.info("nsq sink published %d rows%s: %s", total, where, counts)
    return total


def report_abort(messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> None:
    """The job failed: what tasks that succeeded had already published stays published."""
    total, counts = _sum(messages)
    where = "" if batch_id is None else f" (micro-batch {batch_id})"
    log.error(
        "nsq sink job failed%s; tasks that succeeded had published %d rows, which stay "
        "published (at-least-once: a rerun publishes them again): %s",
        where,
        total,
        counts,
    )


def _sum(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, dict[str, dict[str, int]]]:
    total = 0
    counts: dict[str, dict[str, int]] = {}
    for message in messages:
        if isinstance(message, Published):
            total += message.rows
            for topic, per_target in message.counts.items():
                merged = counts.setdefault(topic, {})
                for target, count in per_target.items():
                    merged[target] = merged.get(target, 0) + count
    return total, counts


# --------------------------------------------------------------------------- one task


def publish_batches(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, columns: SinkColumns
) -> Published:
    """Publish every row of a task (Arrow record batches) and return its commit message."""
    return loops.run(_publish_task(batches, options, columns))  # uvloop's when installed


async def _publish_task(
    batches: Iterator[pa.RecordBatch], options: SinkOptions, columns: SinkColumns
) -> Published:
    published = Published()
    loop = asyncio.get_running_loop()
    async with Producer(**options.producer_arguments()) as producer:
        limit = producer.options.max_body_size
        # Read the next batch from Spark in a thread while this one is published.
        upcoming = loop.run_in_executor(None, next, batches, None)
        while True:
            batch = await upcoming
            if batch is None:
                break
            upcoming = loop.run_in_executor(None, next, batches, None)
            rows = _Rows(batch, columns, options.topic)
            for window in rows.windows(options.max_batch, limit):
                for topic, results in await _publish_window(producer, rows, window):
                    published.add(topic, results)
    return published


class _Rows:
    """One Arrow record batch as Python lists, one per column present."""

    def __init__(self, batch: pa.RecordBatch, columns: SinkColumns, topic: str | None) -> None:
        self.count = batch.num_rows
        body = batch.column("body")
        if body.null_count:
            raise ValidationError("body", "a row has a null body")
        if columns.body_is_text:
            body = pc.cast(body, pa.binary())
        self.bodies: list[bytes] = body.to_pylist()
        self.topics: list[str | None] | None = None
        if columns.topic:
            self.topics = batch.column("topic").to_pylist()
            if topic is None and batch.column("topic").null_count:
                raise ValidationError("topic", "a row has a null topic and no topic option is set")
        self.topic = topic
        self.keys = _optional(batch, "sharding_key", columns.sharding_key)
        self.partitions = _optional(batch, "partition", columns.partition)
        if self.keys is not None and self.partitions is not None:
            _one_of_key_or_partition(self.keys, self.partitions)
        trace_ids = _optional(batch, "trace_id", columns.trace_id)
        self.trace_ids = (
            None if trace_ids is None else [None if t is None else t & _UINT64 for t in trace_ids]
        )
        exts = _optional(batch, "ext", columns.ext)
        self.exts = None if exts is None else [None if e is None else dict(e) for e in exts]
        self.delays = _optional(batch, "delay_ms", columns.delay_ms)

    def kind(self, index: int) -> tuple[Any, ...]:
        """Rows of one kind can share a publish_many call (same topic, same command)."""
        return (
            self.topic_of(index),
            self.trace_ids is not None and self.trace_ids[index] is not None,
            self.exts is not None and self.exts[index] is not None,
            self.delays is not None and self.delays[index] is not None,
        )

    def topic_of(self, index: int) -> str:
        if self.topics is not None and self.topics[index] is not None:
            return self.topics[index]  # type: ignore[return-value] # checked just above
        return self.topic  # type: ignore[return-value] # a topic option or a topic per row

    def windows(self, max_rows: int, max_bytes: int) -> Iterator[range]:
        """Consecutive rows of one kind, at most ``max_rows`` and (on the wire, as one MPUB)
        ``max_bytes``: each becomes one round of publishes."""
        uniform = self.topics is None and all(
            values is None or _all_or_none(values)
            for values in (self.trace_ids, self.exts, self.delays)
        )
        sizes = list(map(len, self.bodies))
        if uniform and sizes and 4 + max_rows * (4 + max(sizes)) <= max_bytes:
            for first in range(0, self.count, max_rows):
                yield range(first, min(first + max_rows, self.count))
            return
        start = 0
        used = 4
        kind = None if uniform else self.kind(0)
        for index, size in enumerate(sizes):
            if not uniform and index > start:
                current = self.kind(index)
                if current != kind:
                    yield range(start, index)
                    start, used, kind = index, 4, current
            if index > start and (index - start >= max_rows or used + 4 + size > max_bytes):
                yield range(start, index)
                start, used = index, 4
            used += 4 + size
        if start < self.count:
            yield range(start, self.count)


def _optional(batch: pa.RecordBatch, name: str, present: bool) -> list[Any] | None:
    return batch.column(name).to_pylist() if present else None


def _one_of_key_or_partition(keys: list[Any], partitions: list[Any]) -> None:
    """ValidationError for the first row that fills both sharding_key and partition: a row
    goes where one of them says, as Producer.publish takes one of the two."""
    for key, partition in zip(keys, partitions, strict=True):
        if key is not None and partition is not None:
            raise ValidationError(
                "partition",
                f"a row sets both partition ({partition}) and sharding_key ({key!r}): fill "
                "one of the two per row (or neither, for round-robin)",
            )


def _all_or_none(values: list[Any]) -> bool:
    nulls = values.count(None)
    return nulls in (0, len(values))


async def _publish_window(
    producer: Producer, rows: _Rows, window: range
) -> list[tuple[str, list[PublishResult]]]:
    """One round: the window's rows by lane (keyed, per partition, unkeyed), the lanes in
    parallel; rows that cannot be batched (delay_ms, or trace_id with ext) one by one."""
    first = window.start
    topic, traced, has_ext, delayed = rows.kind(first)
    if delayed or (traced and has_ext):
        return [(topic, [await _publish_one(producer, rows, topic, i) for i in window])]
    keyed: list[int] = []
    by_partition: dict[int, list[int]] = {}
    unkeyed: list[int] = []
    keys, partitions = rows.keys, rows.partitions
    if keys is not None and None not in keys[first : window.stop]:
        keyed = list(window)
    else:
        for index in window:
            if keys is not None and keys[index] is not None:
                keyed.append(index)
            elif partitions is not None and partitions[index] is not None:
                by_partition.setdefault(partitions[index], []).append(index)
            else:
                unkeyed.append(index)
    lanes: list[tuple[list[int], Awaitable[list[PublishResult]]]] = []

    def extras(indexes: list[int]) -> dict[str, Any]:
        if traced and rows.trace_ids is not None:
            return {"trace_ids": [rows.trace_ids[i] for i in indexes]}
        if has_ext and rows.exts is not None:
            return {"exts": [rows.exts[i] for i in indexes]}
        return {}

    bodies = rows.bodies
    if keyed and keys is not None:
        whole = len(keyed) == len(window)
        lanes.append(
            (
                keyed,
                producer.publish_many(
                    topic,
                    bodies[first : window.stop] if whole else [bodies[i] for i in keyed],
                    sharding_keys=keys[first : window.stop] if whole else [keys[i] for i in keyed],
                    **extras(keyed),
                ),
            )
        )
    for partition, indexes in by_partition.items():
        lanes.append(
            (
                indexes,
                producer.publish_many(
                    topic, [bodies[i] for i in indexes], partition=partition, **extras(indexes)
                ),
            )
        )
    if unkeyed:
        lanes.append(
            (unkeyed, producer.publish_many(topic, [bodies[i] for i in unkeyed], **extras(unkeyed)))
        )
    outcomes = await asyncio.gather(*(lane for _, lane in lanes), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return [(topic, results) for results in outcomes if not isinstance(results, BaseException)]


async def _publish_one(producer: Producer, rows: _Rows, topic: str, index: int) -> PublishResult:
    key = rows.keys[index] if rows.keys is not None else None
    partition = rows.partitions[index] if rows.partitions is not None else None
    delay = rows.delays[index] if rows.delays is not None else None
    return await producer.publish(
        topic,
        rows.bodies[index],
        sharding_key=key,
        partition=partition,
        trace_id=rows.trace_ids[index] if rows.trace_ids is not None else None,
        ext=rows.exts[index] if rows.exts is not None else None,
        delay=None if delay is None else delay / 1000,
    )
