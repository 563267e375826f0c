"""smartnsq: the smart asyncio client for NSQ (youzan HA partitions and classic nsqd)."""

from smartnsq._version import __version__
from smartnsq.consumer import Consumer, ConsumerStats
from smartnsq.errors import *  # noqa: F403 - the exception tree is part of the public API
from smartnsq.errors import __all__ as _errors_all
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.message import Message
from smartnsq.producer import Producer, PublishResult
from smartnsq.protocol.commands import StartPosition
from smartnsq.retry import Backoff
from smartnsq.routing.sharding import Sharder

__all__ = [
    "Backoff",
    "BackoffPolicy",
    "Consumer",
    "ConsumerStats",
    "Message",
    "Producer",
    "PublishResult",
    "Sharder",
    "StartPosition",
    "__version__",
    *_errors_all,
]
