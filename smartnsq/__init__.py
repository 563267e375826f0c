"""smartnsq: the smart asyncio client for NSQ (youzan HA partitions and classic nsqd)."""

from smartnsq.errors import *  # noqa: F403 - the exception tree is part of the public API
from smartnsq.errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = ["__version__", *_errors_all]
