"""smartnsq: the smart asyncio client for NSQ (youzan HA partitions and classic nsqd)."""

from smartnsq._version import __version__
from smartnsq.errors import *  # noqa: F403 - the exception tree is part of the public API
from smartnsq.errors import __all__ as _errors_all
from smartnsq.producer import Producer, PublishResult
from smartnsq.retry import Backoff
from smartnsq.routing.sharding import Sharder

__all__ = ["Backoff", "Producer", "PublishResult", "Sharder", "__version__", *_errors_all]
