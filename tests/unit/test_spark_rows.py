"""Rows of the nsq stream reader (from decoded message frames), their journal encoding, the
Arrow record batches handed to Spark, and the sink's windows and commit messages. No Spark
session: pure code."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from smartnsq.consumer.message import Message
from smartnsq.errors import ValidationError
from smartnsq.producer.producer import PublishResult
from smartnsq.protocol.message import (
    EXT_VERSION_JSON,
    MessageLayout,
    decode_message,
    encode_message_frame,
    youzan_message_id,
)
from smartnsq.spark.options import SinkOptions
from smartnsq.spark.rows import Row, decode_row, encode_row, record_batches, row_of
from smartnsq.spark.schema import SOURCE_SCHEMA, check_sink_schema
from smartnsq.spark.sink import Published, _publish_window, _Rows, report_commit

ARROW = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")


def _message(frame: bytes, layout: MessageLayout, partition: int | None) -> Message:
    message = decode_message(frame[8:], layout, Message)  # past the size and frame type
    message.lane = SimpleNamespace(  # type: ignore[assignment]
        topic="orders", channel="c", partition=partition, address="127.0.0.1:4150"
    )
    return message


def test_youzan_message_with_ext_and_queue_position() -> None:
    now = time.time_ns()
    trace_id = (1 << 64) - 5  # beyond a signed long: two's complement
    frame = encode_message_frame(
        now,
        3,
        youzan_message_id(0x0102, trace_id),
        b"payload",
        ext_version=EXT_VERSION_JSON,
        ext_raw=b'{"k":"v","n":7}',
        offset=4096,
        raw_size=57,
    )
    row = row_of(_message(frame, MessageLayout(True, True, True), 2))
    assert row == Row(
        b"payload",
        2,
        youzan_message_id(0x0102, trace_id).hex(),
        -5,
        4096,
        57,
        3,
        now // 1000,
        (("k", "v"), ("n", "7")),
    )
    assert decode_row(encode_row(row)) == row


def test_classic_message() -> None:
    frame = encode_message_frame(time.time_ns(), 1, b"0a1b2c3d4e5f6789", b"x")
    row = row_of(_message(frame, MessageLayout(False, False, False), None))
    assert row.message_id == "0a1b2c3d4e5f6789"
    assert (row.partition, row.trace_id, row.queue_offset, row.raw_size, row.ext) == (None,) * 5
    assert decode_row(encode_row(row)) == row


def test_record_batches_match_spark_arrow_schema_one_per_partition() -> None:
    rows = [
        Row(b"a", 0, "00", 1, 10, 20, 1, 1_700_000_000_000_000, None),
        Row(b"b", 1, "01", 2, None, None, 2, 1_700_000_000_000_001, (("k", "v"),)),
        Row(b"c", 0, "02", 3, 11, 21, 1, 1_700_000_000_000_002, None),
    ]
    batches = record_batches("orders", rows, ARROW)
    assert [b.schema.equals(ARROW) for b in batches] == [True, True]
    first, second = batches
    assert first.column("body").to_pylist() == [b"a", b"c"]  # queue order kept
    assert first.column("queue_offset").to_pylist() == [10, 11]
    assert first.column("topic").to_pylist() == ["orders", "orders"]
    assert first.column("ext").to_pylist() == [None, None]
    assert second.column("ext").to_pylist() == [[("k", "v")]]
    assert second.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_000_001]


def _rows(bodies: list[bytes], max_batch: int, **extra: list[object]) -> list[range]:
    fields = [StructField("body", StringType())]
    data: dict[str, list[object]] = {"body": [b.decode() for b in bodies]}
    for name, values in extra.items():
        fields.append(StructField(name, LongType()))
        data[name] = values
    options = SinkOptions.parse({"lookupd": "http://h:1", "topic": "t"})
    columns = check_sink_schema(StructType(fields), options)
    return list(_Rows(pa.RecordBatch.from_pydict(data), columns, "t").windows(max_batch, 64))


def test_windows_respect_rows_bytes_and_kinds() -> None:
    assert _rows([b"x"] * 5, 2) == [range(2), range(2, 4), range(4, 5)]
    # 64 bytes on the wire: 4 + (4 + 20) * 2 = 52 fits, a third row does not
    assert _rows([b"y" * 20] * 3, 10) == [range(2), range(2, 3)]
    # rows with and without a trace id are published by different commands
    traced = _rows([b"z"] * 4, 10, trace_id=[1, 2, None, 3])
    assert traced == [range(2), range(2, 3), range(3, 4)]


class _Producer:
    """publish_many's calls, answered as if published."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[bytes], list[object] | None, int | None]] = []

    async def publish_many(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        sharding_keys: list[object] | None = None,
        partition: int | None = None,
    ) -> list[PublishResult]:
        self.calls.append((list(bodies), sharding_keys, partition))
        return [PublishResult(topic, partition, "a:1") for _ in bodies]


def _keyed_and_partitioned(keys: list[str | None], partitions: list[int | None]) -> _Rows:
    schema = StructType(
        [
            StructField("body", StringType()),
            StructField("sharding_key", StringType()),
            StructField("partition", IntegerType()),
        ]
    )
    options = SinkOptions.parse({"lookupd": "http://h:1", "topic": "t"})
    columns = check_sink_schema(schema, options)
    bodies = [f"row {i}" for i in range(len(keys))]
    data = {"body": bodies, "sharding_key": keys, "partition": partitions}
    return _Rows(pa.RecordBatch.from_pydict(data), columns, "t")


def test_each_row_goes_by_its_key_or_its_partition() -> None:
    rows = _keyed_and_partitioned(["a", None, None, "b"], [None, 2, None, None])
    producer = _Producer()
    asyncio.run(_publish_window(producer, rows, range(4)))  # type: ignore[arg-type]
    assert sorted(producer.calls, key=str) == sorted(
        [
            ([b"row 0", b"row 3"], ["a", "b"], None),
            ([b"row 1"], None, 2),
            ([b"row 2"], None, None),
        ],
        key=str,
    )


def test_a_row_with_both_key_and_partition_is_refused() -> None:
    with pytest.raises(ValidationError) as raised:
        _keyed_and_partitioned(["a", "b"], [None, 3])
    assert raised.value.field == "partition"
    assert "a row sets both partition (3) and sharding_key ('b')" in str(raised.value)


def test_commit_messages_add_up() -> None:
    one = Published()
    one.add("t", [PublishResult("t", 0, "a:1")] * 3 + [PublishResult("t", 1, "a:1")])
    two = Published()
    two.add("t", [PublishResult("t", 0, "a:1")])
    two.add("c", [PublishResult("c", None, "n:2")] * 2)
    assert one.counts == {"t": {"0": 3, "1": 1}}
    assert report_commit([one, two, None], 7) == 7


@pytest.mark.parametrize("module", ["pyspark", "pyarrow"])
def test_import_smartnsq_does_not_import(module: str) -> None:
    code = (
        f"import smartnsq, smartnsq.sync, smartnsq.testing, sys; print({module!r} in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
