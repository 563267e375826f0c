"""The offsets mode's executor side: one Spark task reads one partition's range of queue
offsets (:class:`~smartnsq.transport.ranges.RangeReader`) and hands Spark its rows as Arrow
record batches, in queue order.

The reader runs on a private event loop (:class:`~smartnsq.transport.loopthread.LoopThread`)
created in the task's process (Spark's Python workers are forked: nothing loop-bound may
come from the parent). While Spark turns one batch into rows, the loop goes on receiving the
next messages.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pyarrow as pa

from smartnsq.errors import NSQError
from smartnsq.flow.ranges import OffsetRange
from smartnsq.protocol.message import MessageFrame
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.rows import frames_batch
from smartnsq.transport.connection import ConnectionConfig
from smartnsq.transport.httpclient import new_http_client
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.loopthread import GRACE, LoopThread
from smartnsq.transport.ranges import RangeReader

__all__ = ["ROWS_PER_BATCH", "read_range"]

# Rows per record batch handed to Spark.
ROWS_PER_BATCH = 10_000
_HTTP_TIMEOUT = 10.0


def read_range(
    options: SourceOptions,
    span: OffsetRange,
    start_is_boundary: bool,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``span`` (one partition of ``options.topic``), in queue order."""
    runner = LoopThread("smartnsq-spark-range")
    session: _Session | None = None
    try:
        session = runner.run(_Session.open(options, span, start_is_boundary), GRACE, "nsq read")
        while True:
            frames = runner.run(session.next_frames(), None, "nsq read")
            if not frames:
                return
            yield frames_batch(options.topic, span.partition, frames, schema)
    finally:
        if session is not None:
            with contextlib.suppress(NSQError):
                runner.run(session.close(), GRACE, "nsq read")
        runner.stop(GRACE)


class _Session:
    """One range read on the loop: its lookup manager, HTTP client and reader."""

    def __init__(self, lookup: LookupManager, http: httpx.AsyncClient, reader: RangeReader) -> None:
        self.lookup = lookup
        self.http = http
        self.reader = reader
        self.frames: AsyncIterator[list[MessageFrame]] = reader.read()

    @classmethod
    async def open(
        cls, options: SourceOptions, span: OffsetRange, start_is_boundary: bool
    ) -> _Session:
        connect = options.connect
        lookup = LookupManager(list(connect.lookupd or ()), timeout=_HTTP_TIMEOUT)
        http = new_http_client(_HTTP_TIMEOUT)
        config = ConnectionConfig(
            tls=connect.client_arguments()["tls"],
            compression=connect.compression,
            auth_secret=connect.auth_secret,
            connect_timeout=connect.connect_timeout,
        )
        reader = RangeReader(
            lookup,
            http,
            config,
            options.topic,
            options.channel,
            span,
            start_is_boundary=start_is_boundary,
            fail_on_data_loss=options.fail_on_data_loss,
        )
        return cls(lookup, http, reader)

    async def next_frames(self) -> list[MessageFrame]:
        """Up to about ROWS_PER_BATCH frames, in queue order ([] once the range is read)."""
        out: list[MessageFrame] = []
        while len(out) < ROWS_PER_BATCH:
            try:
                frames = await anext(self.frames)
            except StopAsyncIteration:
                break
            out.extend(frames)
        return out

    async def close(self) -> None:
        closing: Any = self.frames
        with contextlib.suppress(NSQError):
            await closing.aclose()
        await self.http.aclose()
        await self.lookup.close()
