"""The driver source's stream reader (``spark.readStream.format("nsq")`` on classic nsqd, or
with ``mode=hold`` / ``journal=<dir>``): at-least-once.

Built on the driver: Spark keeps one Python process per streaming source for the query's
life, and this reader holds the :class:`~smartnsq.spark.receiver.Receiver` (one Consumer)
there. Planning a micro-batch takes messages from it; the batch's rows travel to the
executors inside the input partitions (one per NSQ partition, as an Arrow record batch), where
``read`` only hands them over. Without queue offsets, partitions cannot be read on executors:
a message can only be finished on the connection that received it, and Spark tells the
driver, not the executors, when a batch is committed; executors holding messages across
batches cannot be kept alive either. The cost: one process receives the whole stream (see
docs/guides/spark.md). On youzan the offsets mode (``range_source.py``) reads on the
executors instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from smartnsq.errors import ValidationError
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.receiver import Receiver
from smartnsq.spark.rows import record_batches

__all__ = ["NsqStreamReader", "RowsPartition"]


class RowsPartition(InputPartition):
    """A micro-batch's rows of one NSQ partition, in queue order."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        super().__init__(batch.num_rows)
        self.batch = batch


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"seq": n}``: the first n messages this query took (see receiver.py)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._receiver: Receiver | None = None
        self._cutoff: bool = False

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on executors from a pickled reader: without the live consumer.
        state = self.__dict__.copy()
        state["_receiver"] = None
        return state

    def _started(self, *, committed: int, seen: int) -> Receiver:
        if self._receiver is None:
            self._receiver = Receiver(self.options, committed=committed, seen=seen)
            if self._cutoff:
                self._receiver.available_now()
        return self._receiver

    # ------------------------------------------------------------------ Spark's calls

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_messages_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._cutoff = True
        if self._receiver is not None:
            self._receiver.available_now()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        first = _seq(start, "start")
        receiver = self._started(committed=first, seen=first)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return {"seq": receiver.plan(first, max_rows)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = _seq(start, "start"), _seq(end, "end")
        if last <= first:
            return []
        rows = self._started(committed=first, seen=last).rows(first, last)
        if not rows:
            return []
        arrow = to_arrow_schema(self.schema, timezone="UTC")
        return [RowsPartition(b) for b in record_batches(self.options.topic, rows, arrow)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RowsPartition):
            raise ValidationError("partition", f"not an nsq input partition: {partition!r}")
        yield partition.batch

    def commit(self, end: dict[str, Any]) -> None:
        last = _seq(end, "end")
        self._started(committed=last, seen=last).commit(last)

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None


def _seq(offset: Any, name: str) -> int:
    """The sequence number of an offset Spark hands back (JSON: ``{"seq": n}``)."""
    value = offset.get("seq") if isinstance(offset, dict) else None
    if type(value) is not int or value < 0:
        raise ValidationError(name, f"not an nsq source offset: {offset!r}")
    return value
