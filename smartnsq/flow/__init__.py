"""Consumer flow control (pure: no asyncio, no sockets): the RDY controller and the backoff
and requeue-delay policies."""

from smartnsq.flow.backoff import BackoffPolicy, BackoffStrategy, requeue_delay
from smartnsq.flow.rdy import Outcome, RdyController

__all__ = ["BackoffPolicy", "BackoffStrategy", "Outcome", "RdyController", "requeue_delay"]
