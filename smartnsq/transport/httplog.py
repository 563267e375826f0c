"""httpx logs every request at INFO ("HTTP Request: GET ..."). A lookup poll every minute
per client, and a lookup every second or so while a partition is failing over, would fill
an application's INFO log with lines it never asked for: smartnsq's own requests are
dropped from the ``httpx`` logger, the application's own httpx requests are not."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

__all__ = ["quiet"]

_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("smartnsq_quiet_http", default=False)


class _DropQuiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _QUIET.get()


_FILTER = _DropQuiet()
logging.getLogger("httpx").addFilter(_FILTER)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """httpx logs nothing for the requests made inside (in this task)."""
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)
