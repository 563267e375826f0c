"""A received message as a row of the stream reader's schema, its journal encoding, and the
Arrow record batches handed to Spark (and, in the offsets mode, message frames as a record
batch). Pure code (pyarrow, no Spark session, no I/O)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from smartnsq.consumer.message import Message
from smartnsq.protocol.message import EXT_VERSION_JSON, MessageFrame

__all__ = ["Row", "decode_row", "encode_row", "frames_batch", "record_batches", "row_of"]

_INT64_SIGN = 1 << 63


class Row(NamedTuple):
    """One message, as the reader's columns (``topic`` is the reader's)."""

    body: bytes
    partition: int | None
    message_id: str
    trace_id: int | None  # signed int64 (the uint64 id, two's complement)
    queue_offset: int | None
    raw_size: int | None
    attempts: int
    timestamp_us: int
    ext: tuple[tuple[str, str], ...] | None


def row_of(message: Message) -> Row:
    internal_id = message.internal_id
    if internal_id is None:  # classic nsqd: the id is 16 hex digits already
        message_id = message.id.decode("ascii", "replace")
        trace_id = None
    else:
        message_id = message.id.hex()
        trace_id = _signed(message.trace_id or 0)
    # .ext parses the JSON header: only when there is one (most topics have none).
    ext = message.ext if message.ext_raw else None
    return Row(
        bytes(message.body),
        message.partition,
        message_id,
        trace_id,
        message.offset,
        message.raw_size,
        message.attempts,
        message.timestamp // 1000,
        None if ext is None else tuple((str(k), _text(v)) for k, v in ext.items()),
    )


def _signed(value: int) -> int:
    return value - (1 << 64) if value & _INT64_SIGN else value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


# --------------------------------------------------------------------------- journal records

# flags, partition, trace_id, queue_offset, raw_size, attempts, timestamp_us, then the lengths
# of the message id, the ext JSON and the body, which follow in that order.
_HEAD = struct.Struct("<BiqqiIqBII")
_PARTITION, _TRACE, _OFFSET, _RAW_SIZE, _EXT = 1, 2, 4, 8, 16


def encode_row(row: Row) -> bytes:
    partition, trace_id, offset, raw_size, ext = (
        row.partition,
        row.trace_id,
        row.queue_offset,
        row.raw_size,
        row.ext,
    )
    flags = (
        (partition is not None and _PARTITION)
        | (trace_id is not None and _TRACE)
        | (offset is not None and _OFFSET)
        | (raw_size is not None and _RAW_SIZE)
        | (ext is not None and _EXT)
    )
    message_id = row.message_id.encode("ascii", "replace")
    ext_json = b"" if ext is None else json.dumps(dict(ext)).encode()
    body = row.body
    head = _HEAD.pack(
        flags,
        partition or 0,
        trace_id or 0,
        offset or 0,
        raw_size or 0,
        row.attempts,
        row.timestamp_us,
        len(message_id),
        len(ext_json),
        len(body),
    )
    return b"".join((head, message_id, ext_json, body))


def decode_row(data: bytes) -> Row:
    (flags, partition, trace_id, offset, raw_size, attempts, timestamp, id_len, ext_len, _) = (
        _HEAD.unpack_from(data)
    )
    position = _HEAD.size
    message_id = data[position : position + id_len].decode("ascii")
    position += id_len
    ext = None
    if flags & _EXT:
        ext = tuple(json.loads(data[position : position + ext_len]).items())
    position += ext_len
    return Row(
        data[position:],
        partition if flags & _PARTITION else None,
        message_id,
        trace_id if flags & _TRACE else None,
        offset if flags & _OFFSET else None,
        raw_size if flags & _RAW_SIZE else None,
        attempts,
        timestamp,
        ext,
    )


# --------------------------------------------------------------------------- Arrow


def record_batches(topic: str, rows: Sequence[Row], schema: pa.Schema) -> list[pa.RecordBatch]:
    """One record batch per partition (queue order kept within each), in the reader's
    column order; ``schema`` is Spark's Arrow form of the reader's schema."""
    by_partition: dict[int | None, list[Row]] = {}
    for row in rows:
        group = by_partition.get(row.partition)
        if group is None:
            by_partition[row.partition] = [row]
        else:
            group.append(row)
    return [_batch(topic, group, schema) for group in by_partition.values()]


def _batch(topic: str, rows: list[Row], schema: pa.Schema) -> pa.RecordBatch:
    count = len(rows)
    (body, partition, message_id, trace_id, offset, raw_size, attempts, timestamp, ext) = zip(
        *rows, strict=True
    )
    types = {field.name: field.type for field in schema}

    def column(name: str, values: tuple[Any, ...]) -> pa.Array:
        first = values[0]
        if first is None and values.count(None) == count:
            return pa.nulls(count, types[name])
        return pa.array(values, types[name])

    columns = {
        "body": pa.array(body, types["body"]),
        "topic": pa.repeat(pa.scalar(topic, types["topic"]), count),
        # one partition per batch (record_batches groups by it)
        "partition": pa.repeat(pa.scalar(partition[0], types["partition"]), count),
        "message_id": pa.array(message_id, types["message_id"]),
        "trace_id": column("trace_id", trace_id),
        "queue_offset": column("queue_offset", offset),
        "raw_size": column("raw_size", raw_size),
        "attempts": pa.array(attempts, types["attempts"]),
        "timestamp": pa.array(timestamp, pa.int64()).cast(types["timestamp"]),
        "ext": column("ext", tuple(None if e is None else list(e) for e in ext))
        if ext.count(None) != count
        else pa.nulls(count, types["ext"]),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


# --------------------------------------------------------------------------- offsets mode


def frames_batch(
    topic: str, partition: int, frames: Sequence[MessageFrame], schema: pa.Schema
) -> pa.RecordBatch:
    """The rows of message frames read from one youzan partition (SUB_ADVANCED: every frame
    has its queue offset and size), as a record batch in ``schema``'s column order."""
    count = len(frames)
    types = {field.name: field.type for field in schema}
    ext: list[list[tuple[str, str]] | None] = []
    has_ext = False
    for frame in frames:
        parsed = _frame_ext(frame)
        if parsed is not None:
            has_ext = True
        ext.append(parsed)
    columns = {
        "body": pa.array([f.body for f in frames], types["body"]),
        "topic": pa.repeat(pa.scalar(topic, types["topic"]), count),
        "partition": pa.repeat(pa.scalar(partition, types["partition"]), count),
        "message_id": pa.array([f.id.hex() for f in frames], types["message_id"]),
        "trace_id": pa.array([_signed(f.trace_id or 0) for f in frames], types["trace_id"]),
        "queue_offset": pa.array([f.offset for f in frames], types["queue_offset"]),
        "raw_size": pa.array([f.raw_size for f in frames], types["raw_size"]),
        "attempts": pa.array([f.attempts for f in frames], types["attempts"]),
        "timestamp": pa.array([f.timestamp // 1000 for f in frames], pa.int64()).cast(
            types["timestamp"]
        ),
        "ext": pa.array(ext, types["ext"]) if has_ext else pa.nulls(count, types["ext"]),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)


def _frame_ext(frame: MessageFrame) -> list[tuple[str, str]] | None:
    """The JSON ext header's entries (non-string values as JSON text), as Message.ext reads
    it: None without a JSON header or when it is not an object."""
    raw = frame.ext_raw
    if not raw or frame.ext_version != EXT_VERSION_JSON:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return [(str(k), _text(v)) for k, v in parsed.items()]
