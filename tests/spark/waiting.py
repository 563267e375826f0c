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
