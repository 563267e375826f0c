"""smartnsq: the smart asyncio client for NSQ (youzan HA partitions and classic nsqd).

The clients are imported on first use (PEP 562), so ``import smartnsq`` (and the pytest
plugin, which every pytest run loads) stays cheap: only the exception tree is eager.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from smartnsq._version import __version__
from smartnsq.errors import *  # noqa: F403 - the exception tree is part of the public API
from smartnsq.errors import __all__ as _errors_all

if TYPE_CHECKING:
    from smartnsq.admin import Admin as Admin
    from smartnsq.consumer.consumer import Consumer as Consumer
    from smartnsq.consumer.consumer import ConsumerStats as ConsumerStats
    from smartnsq.consumer.message import Message as Message
    from smartnsq.flow.backoff import BackoffPolicy as BackoffPolicy
    from smartnsq.flow.replays import ReplayFilter as ReplayFilter
    from smartnsq.flow.retry import Backoff as Backoff
    from smartnsq.producer.producer import Producer as Producer
    from smartnsq.producer.producer import ProducerStats as ProducerStats
    from smartnsq.protocol.commands import StartPosition as StartPosition
    from smartnsq.publishing.result import PublishResult as PublishResult
    from smartnsq.routing.addresses import AddressMap as AddressMap
    from smartnsq.routing.sharding import Sharder as Sharder
    from smartnsq.service import serve as serve

_LAZY = {
    "AddressMap": "smartnsq.routing.addresses",
    "Admin": "smartnsq.admin",
    "Backoff": "smartnsq.flow.retry",
    "BackoffPolicy": "smartnsq.flow.backoff",
    "ReplayFilter": "smartnsq.flow.replays",
    "Consumer": "smartnsq.consumer.consumer",
    "ConsumerStats": "smartnsq.consumer.consumer",
    "Message": "smartnsq.consumer.message",
    "Producer": "smartnsq.producer.producer",
    "ProducerStats": "smartnsq.producer.producer",
    "PublishResult": "smartnsq.publishing.result",
    "Sharder": "smartnsq.routing.sharding",
    "serve": "smartnsq.service",
    "StartPosition": "smartnsq.protocol.commands",
}

__all__ = [*sorted(_LAZY), "__version__", *_errors_all]


def __getattr__(name: str) -> Any:
    if name == "sync":  # the blocking facade, a submodule: smartnsq.sync.Producer(...)
        return importlib.import_module("smartnsq.sync")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'smartnsq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
