"""The ``nsq`` Python data source: ``smartnsq.spark.register(spark)``, then
``df.write.format("nsq")``, ``df.writeStream.format("nsq")``, ``spark.readStream.format("nsq")``
and ``spark.read.format("nsq")``.

Which reader a read gets: on youzan, the offsets mode (:mod:`smartnsq.spark.range_source`:
ranges of queue offsets read on the executors, exactly-once into an idempotent sink); on
classic nsqd, or with ``mode=hold`` / ``journal=<dir>``, the driver's consumer
(:mod:`smartnsq.spark.source`, at-least-once). Batch reads need the offsets mode."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from smartnsq.errors import ValidationError
from smartnsq.spark.options import SinkOptions, SourceOptions
from smartnsq.spark.planner import Planner
from smartnsq.spark.range_source import NsqRangeBatchReader, NsqRangeStreamReader
from smartnsq.spark.schema import SOURCE_SCHEMA, SinkColumns, check_sink_schema
from smartnsq.spark.sink import Published, publish_batches, report_abort, report_commit
from smartnsq.spark.source import NsqStreamReader

__all__ = ["NsqDataSource", "NsqStreamWriter", "NsqWriter", "register"]


def register(spark: Any) -> None:
    """Register the data source with a SparkSession under the name ``nsq``."""
    spark.dataSource.register(NsqDataSource)


class NsqDataSource(DataSource):
    """NSQ topics as a Spark sink (batch and streaming) and source (streaming, and batch on
    youzan). Options and columns: docs/guides/spark.md. Every option and the DataFrame's
    columns are checked when the query is planned."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> NsqWriter:
        options, columns = _sink(self.options, schema, overwrite)
        return NsqWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> NsqStreamWriter:
        options, columns = _sink(self.options, schema, overwrite)
        return NsqStreamWriter(options, columns)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = _source(self.options, schema)
        if options.connect.nsqd is not None or options.mode in ("hold", "journal"):
            return NsqStreamReader(options, schema)
        if options.reading_mode(_is_youzan(options)) == "offsets":
            return NsqRangeStreamReader(options, schema)
        return NsqStreamReader(options, schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = _source(self.options, schema)
        if options.connect.nsqd is not None or options.mode in ("hold", "journal"):
            raise ValidationError(
                "mode",
                "batch reads (spark.read) read ranges of youzan queue offsets: classic nsqd "
                "and the hold and journal modes only stream (spark.readStream)",
            )
        if options.reading_mode(_is_youzan(options)) != "offsets":
            raise ValidationError(
                "lookupd", "batch reads need youzan queue offsets (a classic nsqlookupd?)"
            )
        return NsqRangeBatchReader(options, schema)


def _is_youzan(options: SourceOptions) -> bool:
    """Whether the cluster behind ``lookupd`` is youzan (has queue offsets). Spark makes a
    reader in more than one process (the streaming source's, the planner of the tasks'
    reads), so this asks the lookupds once and keeps nothing open."""
    if options.mode == "offsets":
        return True
    planner = Planner(options)
    try:
        return planner.is_youzan()
    finally:
        planner.close()


def _source(options: Any, schema: StructType) -> SourceOptions:
    if schema != SOURCE_SCHEMA:
        raise ValidationError(
            "schema",
            f"the nsq source has a fixed schema ({SOURCE_SCHEMA.simpleString()}); do not "
            "pass another one",
        )
    return SourceOptions.parse(options)


def _sink(options: Any, schema: StructType, overwrite: bool) -> tuple[SinkOptions, SinkColumns]:
    if overwrite:
        raise ValidationError("mode", "an NSQ topic can only be appended to: use mode('append')")
    parsed = SinkOptions.parse(options)
    return parsed, check_sink_schema(schema, parsed)


class NsqWriter(DataSourceArrowWriter):
    """``df.write.format("nsq").mode("append")``: each task publishes its rows."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_batches(iterator, self.options, self.columns)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        report_commit(messages, None)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        report_abort(messages, None)


class NsqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: each micro-batch's tasks publish their rows."""

    def __init__(self, options: SinkOptions, columns: SinkColumns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        return publish_batches(iterator, self.options, self.columns)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        report_commit(messages, batchId)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        report_abort(messages, batchId)
