"""The consume side: the :class:`Consumer` and the parts it is made of.

``consumer.py`` (options, lifecycle, iteration, stats) composes the ``Subscriber``
(``subscriber.py``: which connections, kept alive), the ``Dispatcher`` (``dispatch.py``:
carries out the delivery ledger's decisions) and the ``HandlerRunner`` (``handlers.py``,
with ``eager.py`` running coroutine handlers as tasks). A delivered :class:`Message`
(``message.py``) is answered through its ``Subscription`` (``subscription.py``); a message
given up on is recorded by ``deadletter.py``. The decisions themselves are pure code in
:mod:`smartnsq.flow`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.consumer.consumer import Consumer as Consumer
    from smartnsq.consumer.consumer import ConsumerStats as ConsumerStats
    from smartnsq.consumer.message import Message as Message

# Loaded on first use (PEP 562): importing one part of the package loads only what it needs.
_LAZY = {
    "Consumer": "smartnsq.consumer.consumer",
    "ConsumerStats": "smartnsq.consumer.consumer",
    "Message": "smartnsq.consumer.message",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
