"""The offsets mode (youzan): ``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``
read ranges of queue offsets on the executors, as Spark's Kafka source reads ranges of Kafka
offsets.

* Offsets are ``{"<topic>": {"<partition>": <queue offset>}}`` (:mod:`smartnsq.spark.offsets`).
* Planning, on the driver (:class:`~smartnsq.spark.planner.Planner`): ``latestOffset`` reads
  each partition leader's queue end, capped by ``maxMessagesPerTrigger`` /
  ``maxOffsetsPerTrigger``; ``partitions(start, end)`` gives one input partition per NSQ
  partition with something to read.
* Reading, on the executors (:mod:`smartnsq.spark.range_read`): each task reads its range
  exactly, in queue order; a task that runs again reads the same rows.
* ``commit(end)`` moves the channel to ``end`` on every partition, so that nsqd's depth and
  lag (and ``smartnsq channel lag``) count from there. The checkpoint stays the truth.

With an idempotent sink (the file sink, Delta, ``foreachBatch`` keyed by the batch id) a
query is exactly-once: a micro-batch run again after a failure reads the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from smartnsq.errors import DataLossError, ValidationError
from smartnsq.flow.ranges import OffsetRange
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.offsets import PartitionOffsets
from smartnsq.spark.offsets import (
    CHANNEL,
    EARLIEST,
    LATEST,
    Position,
    cap_messages,
    offsets_from_spark,
    offsets_to_spark,
    rate_limit,
)
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.planner import Planner
from smartnsq.spark.range_read import read_range

__all__ = ["NsqRangeBatchReader", "NsqRangeStreamReader", "RangePartition"]

log = logging.getLogger("smartnsq.spark")


class RangePartition(InputPartition):
    """One NSQ partition's range ``[start, end)``; ``start_is_boundary``: the driver saw a
    message end at ``start`` (a queue end), so the reader need not prove it."""

    def __init__(self, partition: int, start: int, end: int, start_is_boundary: bool) -> None:
        super().__init__(partition)
        self.partition = partition
        self.start = start
        self.end = end
        self.start_is_boundary = start_is_boundary


class _Ranges:
    """What the stream and batch readers share: the planner (driver only, not pickled to
    the executors), resolving positions, and reading a range."""

    options: SourceOptions
    schema: StructType
    _planner: Planner | None
    # Per partition, offsets known to be message boundaries (queue starts and ends seen).
    _boundaries: dict[int, set[int]]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_planner"] = None
        state["_boundaries"] = {}
        return state

    def _planned(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    def _queues(self) -> dict[int, PartitionOffsets]:
        queues = self._planned().queues()
        for partition, queue in queues.items():
            known = self._boundaries.setdefault(partition, set())
            known.update((queue.start, queue.end))
        return queues

    def _resolve(
        self, position: Position, queues: Mapping[int, PartitionOffsets], name: str
    ) -> dict[int, int]:
        """Per partition, the queue offset of ``position``."""
        named = set(position.offsets) - set(queues)
        if named:
            raise ValidationError(
                name, f"names partitions {sorted(named)} that are not read ({sorted(queues)})"
            )
        resolved = {}
        for partition, queue in queues.items():
            if position.kind == "timestamp":
                seconds = (position.timestamp_ms or 0) // 1000
                offset = self._planned().locate(partition, StartPosition.timestamp(seconds))
                self._boundaries.setdefault(partition, set()).add(offset)
            elif position.kind == "channel":
                # Where the channel is; without one yet, where nsqd puts a channel that a
                # SUB creates: at the queue's end (youzan creates it on the leader).
                offset = queue.end if queue.position is None else queue.position
            else:
                at = position.at(partition)
                if at is None:
                    raise ValidationError(
                        name, f"gives no offset for partition {partition} (name every one)"
                    )
                offset = queue.start if at == EARLIEST else queue.end if at == LATEST else at
            resolved[partition] = offset
        return resolved

    def _partitions(self, start: Mapping[int, int], end: Mapping[int, int]) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for partition in sorted(end):
            last = end[partition]
            first = start.get(partition, last)
            if last > first:
                known = first in self._boundaries.get(partition, ())
                parts.append(RangePartition(partition, first, last, known))
        return parts

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            raise ValidationError("partition", f"not an nsq input partition: {partition!r}")
        span = OffsetRange(partition.partition, partition.start, partition.end)
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        yield from read_range(self.options, span, partition.start_is_boundary, arrow)

    def _close_planner(self) -> None:
        if self._planner is not None:
            self._planner.close()
            self._planner = None


class NsqRangeStreamReader(_Ranges, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")`` on youzan (offsets mode)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        if options.ending is not None:
            raise ValidationError("endingOffsets", "applies to batch reads (spark.read) only")
        self.options = options
        self.schema = schema
        self._planner = None  # made on first use: Spark makes readers that never plan
        self._boundaries = {}
        self._available_now = False
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow: where it stops
        self._initial: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks only when the checkpoint has no offset yet: a first run. Resolved once:
        # Spark may ask again, and `latest` must not move meanwhile.
        if self._initial is None:
            queues = self._queues()
            position = self.options.starting or CHANNEL
            starts = self._resolve(position, queues, "startingOffsets")
            log.info(
                "nsq source: a first run on %s/%s starts %s: %s",
                self.options.topic,
                self.options.channel,
                _starting_from(position),
                _where(starts, queues, position),
            )
            # The channel starts where the query does, so nsqd's lag counts from there.
            self._planned().seek(starts)
            self._initial = offsets_to_spark(self.options.topic, starts)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        topic = self.options.topic
        first = offsets_from_spark(start, topic, "start")
        queues = self._queues()
        ends = {partition: queue.end for partition, queue in queues.items()}
        if self._available_now:
            if self._target is None:
                self._target = dict(ends)
            ends = {p: min(end, self._target.get(p, end)) for p, end in ends.items()}
        for partition, queue in queues.items():
            # A partition the topic gained since the query started is read from its start.
            first.setdefault(partition, queue.start)
            if ends[partition] < first[partition]:
                # The queue lost messages the stream had planned past (an unreplicated leader
                # failed, say); going on, the stream reads from the queue's end (as Kafka's).
                self._data_loss(
                    f"partition {partition} of {topic!r} ends at {ends[partition]}, before the "
                    f"stream's offset {first[partition]}: messages were lost"
                )
        if isinstance(limit, ReadMaxRows):
            sizes = self._message_sizes(first, queues)
            ends = cap_messages(limit.max_rows, first, ends, sizes)
        if self.options.max_offsets_per_trigger is not None:
            ends = rate_limit(self.options.max_offsets_per_trigger, first, ends)
        # Partitions no longer read keep their offset (Spark compares whole offsets).
        for partition, offset in first.items():
            ends.setdefault(partition, offset)
        return offsets_to_spark(topic, ends)

    def _data_loss(self, message: str) -> None:
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{message} (failOnDataLoss=false reads on)")
        log.warning("%s: reading on", message)

    def _message_sizes(
        self, first: Mapping[int, int], queues: Mapping[int, PartitionOffsets]
    ) -> dict[int, float]:
        """Average message size per partition, from the channel's depth: what lies between
        the channel's position and the queue's end. The channel sits at the batch's start
        (the last batch's readers and commit put it there); one with nothing left to count
        (after a restart, say) is moved to the start first."""
        misplaced = {
            p: first[p] for p, queue in queues.items() if not queue.depth and queue.end > first[p]
        }
        if misplaced:
            self._planned().seek(misplaced)
            queues = {**queues, **{p: q for p, q in self._queues().items() if p in misplaced}}
        sizes = {}
        for partition, queue in queues.items():
            lag, depth = queue.lag, queue.depth
            if lag and depth:
                sizes[partition] = lag / depth
        return sizes

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        topic = self.options.topic
        return self._partitions(
            offsets_from_spark(start, topic, "start"), offsets_from_spark(end, topic, "end")
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._planned().seek(offsets_from_spark(end, self.options.topic, "end"))

    def stop(self) -> None:
        self._close_planner()


def _starting_from(position: Position) -> str:
    if position.kind == "channel":
        return "at the channel's position (no startingOffsets)"
    if position.kind == "timestamp":
        return f"at startingTimestamp {position.timestamp_ms}"
    if position.kind == "offsets":
        return "at startingOffsets"
    return f"at {position.kind} (startingOffsets)"


def _where(
    starts: Mapping[int, int], queues: Mapping[int, PartitionOffsets], position: Position
) -> str:
    """Per partition, the offset a stream starts at and what it is in its queue."""
    parts = []
    for partition in sorted(starts):
        offset, queue = starts[partition], queues[partition]
        note = f"queue {queue.start}..{queue.end}"
        if position.kind == "channel" and queue.position is None:
            note += ", no channel yet: the queue's end"
        parts.append(f"partition {partition} at {offset} ({note})")
    return "; ".join(parts)


class NsqRangeBatchReader(_Ranges, DataSourceReader):
    """``spark.read.format("nsq")``: the range from ``startingOffsets`` (default earliest)
    to ``endingOffsets`` (default latest), read once."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        starting = options.starting
        if starting is not None and starting.kind == "latest":
            raise ValidationError("startingOffsets", "latest would read nothing in a batch read")
        self.options = options
        self.schema = schema
        self._planner = None
        self._boundaries = {}

    def partitions(self) -> list[InputPartition]:
        try:
            queues = self._queues()
            starts = self._resolve(
                self.options.starting or Position("earliest"), queues, "startingOffsets"
            )
            ends = self._resolve(self.options.ending or Position("latest"), queues, "endingOffsets")
        finally:
            self._close_planner()
        for partition, end in ends.items():
            if end < starts[partition]:
                raise ValidationError(
                    "endingOffsets",
                    f"partition {partition} ends at {end}, before its start {starts[partition]}",
                )
        return self._partitions(starts, ends)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if type(partition) is InputPartition and partition.value is None:
            # Nothing to read (an empty topic, every partition at its end): Spark plans one
            # task all the same, with this placeholder (pyspark 4's
            # sql/worker/plan_data_source_read.py, when partitions() is empty).
            return iter(())
        return self._read(partition)
