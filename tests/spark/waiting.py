"""Waiting on what a running Spark query does, for the source tests: a condition polled with
a bound (Spark tells a test nothing), and the micro-batches its file sink has committed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WAIT = 120.0


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def committed_batches(output: Path) -> int:
    """Micro-batches the file sink has committed (its metadata log: one file per batch)."""
    log = output / "_spark_metadata"
    if not log.exists():
        return 0
    return sum(1 for p in log.iterdir() if p.name.isdigit())


def finish(query: Any, timeout: float = WAIT) -> None:
    """Wait for a query that ends by itself (``availableNow``) and check it ended well. One
    still running after ``timeout`` is stopped before the test fails: left running, it would
    keep the executors busy and fail the tests after it."""
    try:
        ended = query.awaitTermination(timeout)
    finally:
        if query.isActive:
            query.stop()
    if not ended:
        raise AssertionError(f"the query was still running after {timeout:.0f} s")
    if query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")


def rows_across_a_restart(
    make_stream: Callable[[], Any], checkpoint: Path
) -> list[tuple[int, int, bytes]]:
    """(partition, queue_offset, body) of every row a query's micro-batches saw, in batch
    order: the query runs until two micro-batches ran, is stopped, then runs again from its
    checkpoint until nothing is left (a batch Spark runs again replaces its first run)."""
    batches: dict[int, list[tuple[int, int, bytes]]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        rows = frame.select("partition", "queue_offset", "body").collect()
        batches[batch_id] = [(r.partition, r.queue_offset, r.body) for r in rows]

    def start(trigger: dict[str, Any]) -> Any:
        writer = make_stream().writeStream.foreachBatch(collect)
        return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()

    query = start({"processingTime": "0 seconds"})
    try:
        wait_until(lambda: len(batches) >= 2, "two micro-batches")
    finally:
        query.stop()
    finish(start({"availableNow": True}))
    return [row for batch_id in sorted(batches) for row in batches[batch_id]]


def assert_every_body_once_in_queue_order(
    rows: list[tuple[int, int, bytes]], bodies: list[bytes], partitions: int
) -> None:
    """Every body exactly once, and each partition's rows in queue order."""
    assert sorted(body for _, _, body in rows) == sorted(bodies)
    for partition in range(partitions):
        offsets = [offset for p, offset, _ in rows if p == partition]
        assert offsets == sorted(offsets), f"partition {partition} out of queue order"
        assert len(offsets) == len(set(offsets))
