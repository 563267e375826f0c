"""The Producer's options: one frozen value, checked once when the Producer is made (before
anything is sent) and read by its parts from there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smartnsq.client.options import ClientOptions, check_flag, set_derived
from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import check_seconds
from smartnsq.flow.retry import Backoff, Delays, Stop, Stops, Wait, check_stop, check_wait
from smartnsq.protocol.validation import MAX_BODY_SIZE, MAX_MSG_SIZE
from smartnsq.publishing.arguments import check_publish_timeout
from smartnsq.routing.sharding import Sharder, ShardingStrategy

__all__ = ["DEFAULT_PUBLISH_TIMEOUT", "ProducerOptions", "check_publish_timeout"]

#: The default ``publish_timeout``: longer than every failover measured on real youzan nsq
#: (docs/guides/durable-channels.md), the slowest being about 112 s, as Kafka's producer
#: waits up to 120 s (delivery.timeout.ms) by default.
DEFAULT_PUBLISH_TIMEOUT = 120.0
_DEFAULT_RETRY_BACKOFF = Backoff()


@dataclass(frozen=True, kw_only=True)
class ProducerOptions(ClientOptions):
    """Everything a :class:`~smartnsq.producer.producer.Producer` is given (its keyword
    arguments; see the Producer for their meaning), checked; ``sharder`` is made from
    ``sharding``, ``retry_delays`` and ``retry_stops`` from ``retry_backoff`` and
    ``retry_stop`` (a user's tenacity strategies adapted, see :mod:`smartnsq.flow.retry`)."""

    sharding: ShardingStrategy = "java"
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT
    max_retries: int | None = None
    retry_backoff: Backoff | Wait | None = None
    retry_stop: Stop | None = None
    connections_per_partition: int = 1
    request_timeout: float = 10.0
    max_msg_size: int = MAX_MSG_SIZE
    max_body_size: int = MAX_BODY_SIZE
    trace: bool = False
    trace_key_hash: bool = False
    stamps: bool = True
    linger: float | None = None
    max_batch: int = 100
    # derived: the sharding strategy, ready; what spaces a publish's tries (retry_backoff,
    # or the default) and what else ends it (retry_stop), a user's tenacity ones adapted
    sharder: Sharder = field(init=False, repr=False, compare=False)
    retry_delays: Delays = field(init=False, repr=False, compare=False)
    retry_stops: Stops | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_derived(
            self, "publish_timeout", check_publish_timeout("publish_timeout", self.publish_timeout)
        )
        max_retries = self.max_retries
        if max_retries is not None and (type(max_retries) is not int or max_retries < 0):
            raise ValidationError(
                "max_retries", "must be an int >= 0, or None (bounded by publish_timeout only)"
            )
        delays = check_wait("retry_backoff", self.retry_backoff, _DEFAULT_RETRY_BACKOFF)
        set_derived(self, "retry_delays", delays)
        set_derived(self, "retry_stops", check_stop("retry_stop", self.retry_stop))
        per_partition = self.connections_per_partition
        if type(per_partition) is not int or per_partition < 1:
            raise ValidationError("connections_per_partition", "must be an int >= 1")
        set_derived(self, "sharder", Sharder(self.sharding))
        check_seconds("request_timeout", self.request_timeout, positive=True)
        super().__post_init__()
        for name in ("max_msg_size", "max_body_size"):
            size = getattr(self, name)
            if type(size) is not int or size < 1:
                raise ValidationError(name, f"must be an int >= 1 (bytes), got {size!r}")
        check_flag("trace", self.trace)
        check_flag("trace_key_hash", self.trace_key_hash)
        check_flag("stamps", self.stamps)
        if self.linger is not None:
            check_seconds("linger", self.linger, positive=False)
        if type(self.max_batch) is not int or self.max_batch < 1:
            raise ValidationError("max_batch", "must be an int >= 1")

    def _connection_specific(self) -> dict[str, Any]:
        return {"request_timeout": self.request_timeout}
