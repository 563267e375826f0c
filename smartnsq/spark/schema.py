"""The columns of the ``nsq`` data source: what the stream reader produces and what the writer
accepts (checked when the query is planned, each error naming the column)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from smartnsq.errors import ValidationError
from smartnsq.spark.options import SinkOptions

__all__ = ["SOURCE_SCHEMA", "SinkColumns", "check_sink_schema"]

SOURCE_SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("message_id", StringType()),
        StructField("trace_id", LongType()),
        StructField("queue_offset", LongType()),
        StructField("raw_size", IntegerType()),
        StructField("attempts", IntegerType()),
        StructField("timestamp", TimestampType()),
        StructField("ext", MapType(StringType(), StringType())),
    ]
)

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_SINK_COLUMNS = ("body", "topic", "sharding_key", "partition", "trace_id", "ext", "delay_ms")


@dataclass(frozen=True)
class SinkColumns:
    """Which optional columns a DataFrame to publish has, and how to read them."""

    names: tuple[str, ...]
    body_is_text: bool
    topic: bool
    sharding_key: bool
    partition: bool
    trace_id: bool
    ext: bool
    delay_ms: bool


def check_sink_schema(schema: StructType, options: SinkOptions) -> SinkColumns:
    """The columns of ``schema`` as the writer will read them, or ValidationError naming
    the offending column (missing body, unknown column, wrong type, conflicting columns)."""
    types = {field.name: field.dataType for field in schema.fields}
    body = types.get("body")
    if body is None:
        raise ValidationError("body", "the nsq sink needs a body column (binary or string)")
    for name in types:
        if name not in _SINK_COLUMNS:
            raise ValidationError(
                name,
                f"unknown column: the nsq sink reads {', '.join(_SINK_COLUMNS)} (select the "
                "columns to publish)",
            )
    _expect("body", body, (BinaryType, StringType), "binary or string")
    key = types.get("sharding_key")
    if key is not None:
        if options.sharding == "murmur3":
            _expect(
                "sharding_key", key, (StringType, BinaryType, *_INTEGRAL), "string, long or binary"
            )
        else:
            _expect("sharding_key", key, (StringType, *_INTEGRAL), "string or long")
    if "partition" in types:
        # Both columns may exist: each row fills one of them at most (checked per row).
        _expect("partition", types["partition"], _INTEGRAL, "int")
    if "topic" in types:
        _expect("topic", types["topic"], (StringType,), "string")
    elif options.topic is None:
        raise ValidationError("topic", "set the topic option or give the rows a topic column")
    if "trace_id" in types:
        _expect("trace_id", types["trace_id"], _INTEGRAL, "long")
    if "ext" in types:
        ext = types["ext"]
        if not (
            isinstance(ext, MapType)
            and isinstance(ext.keyType, StringType)
            and isinstance(ext.valueType, StringType)
        ):
            raise ValidationError("ext", f"must be map<string,string>, not {ext.simpleString()}")
    if "delay_ms" in types:
        _expect("delay_ms", types["delay_ms"], _INTEGRAL, "int")
    if options.connect.nsqd is not None:
        for name in ("partition", "trace_id", "ext"):
            if name in types:
                raise ValidationError(
                    name,
                    "classic nsqd (the nsqd option) has no partitions, trace ids or ext headers",
                )
    return SinkColumns(
        names=tuple(types),
        body_is_text=isinstance(body, StringType),
        topic="topic" in types,
        sharding_key=key is not None,
        partition="partition" in types,
        trace_id="trace_id" in types,
        ext="ext" in types,
        delay_ms="delay_ms" in types,
    )


def _expect(
    column: str, actual: DataType, allowed: tuple[type[DataType], ...], wanted: str
) -> None:
    if not isinstance(actual, allowed):
        raise ValidationError(column, f"must be {wanted}, not {actual.simpleString()}")
