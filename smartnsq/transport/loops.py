"""The event loops smartnsq itself creates: uvloop's when it is installed, else asyncio's.

Only loops that smartnsq owns (the CLI's, the demo's, a background loop thread) are made
here; a loop the application runs is the application's choice. Nothing here sets a global
event-loop policy. ``pip install 'smartnsq[uvloop]'`` installs uvloop;
``SMARTNSQ_UVLOOP=0`` in the environment keeps asyncio's loop even then.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["UVLOOP_ENV", "loop_name", "new_event_loop", "run"]

log = logging.getLogger("smartnsq.loops")

UVLOOP_ENV = "SMARTNSQ_UVLOOP"

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed and not turned off (``SMARTNSQ_UVLOOP=0``),
    else asyncio's. The choice is logged at debug level."""
    loop: asyncio.AbstractEventLoop
    if os.environ.get(UVLOOP_ENV, "1").strip().lower() not in ("0", "false", "no", "off"):
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop = uvloop.new_event_loop()
            log.debug("event loop: uvloop %s", getattr(uvloop, "__version__", "?"))
            return loop
    loop = asyncio.new_event_loop()
    log.debug("event loop: asyncio (%s)", type(loop).__name__)
    return loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: which implementation ``loop`` is."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], *, debug: bool | None = None) -> T:
    """``asyncio.run(main)`` on a loop from :func:`new_event_loop`."""
    with asyncio.Runner(debug=debug, loop_factory=new_event_loop) as runner:
        return runner.run(main)
