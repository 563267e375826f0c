"""Consumer flow control (pure: no asyncio, no sockets): the RDY controller and the backoff
and requeue-delay policies."""

from smartnsq.flow.backoff import BackoffPolicy, BackoffStrategy, requeue_delay

__all__ = ["BackoffPolicy", "BackoffStrategy", "requeue_delay"]
