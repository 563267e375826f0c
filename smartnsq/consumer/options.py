"""The Consumer's options: one frozen value, checked once when the Consumer is made (before
anything is sent) and passed down whole to its parts (the delivery ledger gets its share,
:class:`~smartnsq.flow.delivery.DeliveryOptions`, made here)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smartnsq.client.options import ClientOptions, set_derived
from smartnsq.consumer.handlers import Handler
from smartnsq.consumer.message import Message
from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.flow.delivery import DeliveryOptions
from smartnsq.flow.retry import Backoff
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.validation import check_partition

__all__ = [
    "ORDERED_REQUEUE_DELAY",
    "REQUEUE_DELAY",
    "ConsumerOptions",
    "ErrorHook",
    "GivingUp",
    "check_max_in_flight",
]

# Seconds a failed message waits before its redelivery, times its attempts (go-nsq's
# default_requeue_delay); ordered consumers retry sooner (the partition waits meanwhile).
REQUEUE_DELAY = 90.0
ORDERED_REQUEUE_DELAY = 0.1
# Short: after a leader failover or restart, the partition is consumed again within about
# two seconds of its leader taking writes (reconnecting to a node that is down costs one
# refused connection per try).
_RECONNECT_BACKOFF = Backoff(initial=0.1, maximum=1.5)

GivingUp = Callable[[Message], Any]
ErrorHook = Callable[[BaseException], Any]


@dataclass(frozen=True, kw_only=True)
class ConsumerOptions(ClientOptions):
    """Everything a :class:`~smartnsq.consumer.consumer.Consumer` is given but its topic and
    channel (its keyword arguments; see the Consumer for their meaning), checked.
    Resolved when made: ``requeue_delay`` and ``skip_replays`` given as None follow the mode
    (ordered or not), ``partitions`` becomes a frozenset and ``dead_letter_path`` a
    ``Path``; ``delivery`` is the delivery ledger's share."""

    handler: Handler | None = None
    max_in_flight: int | None = None
    ordered: bool = False
    partitions: Collection[int] | None = None
    max_attempts: int = 5
    requeue_delay: float | None = None
    max_requeue_delay: float = 900.0
    backoff: BackoffPolicy | bool = True
    on_giving_up: GivingUp | None = None
    on_error: ErrorHook | None = None
    dead_letter_path: str | os.PathLike[str] | None = None
    ordered_give_up: bool = False
    raise_on_order_violation: bool = False
    skip_replays: bool | None = None
    start: StartPosition | None = None
    desired_tag: str | None = None
    msg_timeout: float | None = None
    sample_rate: int = 0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    reconnect_backoff: Backoff | None = None
    handler_threads: int | None = None
    # derived: the delivery ledger's options
    delivery: DeliveryOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_in_flight is not None:
            check_max_in_flight(self.max_in_flight)
        ordered = self.ordered
        requeue_delay = self.requeue_delay
        if requeue_delay is None:
            # A failed ordered message blocks its partition while it waits: retry it soon.
            requeue_delay = ORDERED_REQUEUE_DELAY if ordered else REQUEUE_DELAY
        if self.skip_replays and not ordered:
            raise ValidationError(
                "skip_replays", "needs ordered=True (ordered deliveries carry queue offsets)"
            )
        set_derived(
            self,
            "delivery",
            DeliveryOptions(
                ordered=ordered,
                iterating=self.handler is None,
                max_attempts=self.max_attempts,
                ordered_give_up=self.ordered_give_up,
                skip_replays=ordered if self.skip_replays is None else self.skip_replays,
                halt_on_violation=self.raise_on_order_violation,
                requeue_delay=requeue_delay,
                max_requeue_delay=self.max_requeue_delay,
            ),
        )
        # The delivery options checked and resolved them: the same values here.
        for name in ("skip_replays", "requeue_delay", "max_requeue_delay"):
            set_derived(self, name, getattr(self.delivery, name))
        if self.handler is not None and not callable(self.handler):
            raise ValidationError("handler", "must be a coroutine function or a function")
        if self.on_error is not None and not callable(self.on_error):
            raise ValidationError("on_error", "must be a function or a coroutine function")
        if ordered and self.nsqd is not None:
            raise UnsupportedFeatureError(
                "ordered consumption subscribes to partitions found through nsqlookupd: use "
                "lookupd=[...] (classic nsqd has no SUB_ORDERED)"
            )
        if ordered and self.sample_rate:
            raise ValidationError("sample_rate", "ordered consumption needs sample_rate 0")
        if self.partitions is not None:
            partitions = frozenset(check_partition(p) for p in self.partitions)
            if not partitions:
                raise ValidationError("partitions", "must name at least one partition")
            set_derived(self, "partitions", partitions)
        if self.dead_letter_path is not None:
            set_derived(self, "dead_letter_path", Path(self.dead_letter_path))
        super().__post_init__()

    def _connection_specific(self) -> dict[str, Any]:
        return {"sample_rate": self.sample_rate, "msg_timeout": self.msg_timeout}

    @property
    def backoff_policy(self) -> BackoffPolicy | None:
        """How handler failures slow the flow: ``backoff`` as a policy (None: never)."""
        if isinstance(self.backoff, BackoffPolicy):
            return self.backoff
        return BackoffPolicy() if self.backoff else None

    @property
    def reconnect_delays(self) -> Backoff:
        """What spaces a subscription's reconnections: ``reconnect_backoff``, or the
        default."""
        return _RECONNECT_BACKOFF if self.reconnect_backoff is None else self.reconnect_backoff


def check_max_in_flight(value: int) -> int:
    """A consumer's in-flight budget: an int >= 0 (0 pauses)."""
    if type(value) is not int or value < 0:
        raise ValidationError("max_in_flight", "must be an int >= 0")
    return value
