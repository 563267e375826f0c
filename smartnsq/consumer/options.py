"""The Consumer's options: one frozen value, checked once when the Consumer is made (before
anything is sent) and passed down whole to its parts (the delivery ledger gets its share,
:class:`~smartnsq.flow.delivery.DeliveryOptions`, made here)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal

from smartnsq.client.options import ClientOptions, check_flag, set_derived
from smartnsq.consumer.deadletter import check_dead_letter_path
from smartnsq.consumer.handlers import Handler
from smartnsq.consumer.message import Message
from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.flow.backoff import BackoffPolicy, check_seconds
from smartnsq.flow.delivery import DeliveryOptions
from smartnsq.flow.replays import ReplayFilter
from smartnsq.flow.retry import Backoff, Delays, Wait, check_wait
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.identify import MAX_MSG_TIMEOUT_MS
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
    ``Path``; ``delivery`` is the delivery ledger's share, ``reconnect_delays``
    ``reconnect_backoff`` ready (a user's tenacity wait adapted)."""

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
    fail_fast: bool = False
    dead_letter_path: str | os.PathLike[str] | None = None
    ordered_give_up: bool = False
    raise_on_order_violation: bool = False
    skip_replays: bool | None = None
    start: StartPosition | Literal["earliest", "latest"] | None = None
    desired_tag: str | None = None
    msg_timeout: float | None = None
    sample_rate: int = 0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    reconnect_backoff: Backoff | Wait | None = None
    handler_threads: int | None = None
    replay_filter: ReplayFilter | None = None
    # derived: the delivery ledger's options; what spaces a subscription's reconnections
    # (reconnect_backoff, a user's tenacity wait adapted, or the default)
    delivery: DeliveryOptions = field(init=False, repr=False, compare=False)
    reconnect_delays: Delays = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_in_flight is not None:
            check_max_in_flight(self.max_in_flight)
        for flag in ("ordered", "ordered_give_up", "raise_on_order_violation", "fail_fast"):
            check_flag(flag, getattr(self, flag))
        if self.skip_replays is not None:
            check_flag("skip_replays", self.skip_replays)
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
        for hook in ("on_error", "on_giving_up"):
            if getattr(self, hook) is not None and not callable(getattr(self, hook)):
                raise ValidationError(hook, "must be a function or a coroutine function")
        if type(self.backoff) is not bool and not isinstance(self.backoff, BackoffPolicy):
            raise ValidationError(
                "backoff", f"must be True, False or a BackoffPolicy, not {self.backoff!r}"
            )
        set_derived(self, "start", _start_position(self.start))
        if self.msg_timeout is not None:
            seconds = check_seconds("msg_timeout", self.msg_timeout, positive=True)
            if not 1 <= seconds <= MAX_MSG_TIMEOUT_MS / 1000:
                raise ValidationError(
                    "msg_timeout",
                    f"must be 1..{MAX_MSG_TIMEOUT_MS // 1000} seconds, or None (nsqd's "
                    f"default), got {self.msg_timeout!r}",
                )
        for name in ("low_rdy_idle_timeout", "low_rdy_timeout"):
            check_seconds(name, getattr(self, name), positive=True)
        delays = check_wait("reconnect_backoff", self.reconnect_backoff, _RECONNECT_BACKOFF)
        set_derived(self, "reconnect_delays", delays)
        if self.replay_filter is not None and not isinstance(self.replay_filter, ReplayFilter):
            raise ValidationError("replay_filter", "must be a ReplayFilter, or None (a new one)")
        threads = self.handler_threads
        if threads is not None and (type(threads) is not int or threads < 1):
            raise ValidationError("handler_threads", "must be an int >= 1, or None (up to 32)")
        if ordered and self.nsqd is not None:
            raise UnsupportedFeatureError(
                "ordered consumption subscribes to partitions found through nsqlookupd: use "
                "lookupd=[...] (classic nsqd has no SUB_ORDERED)"
            )
        if ordered and self.sample_rate:
            raise ValidationError("sample_rate", "ordered consumption needs sample_rate 0")
        if self.partitions is not None:
            if not isinstance(self.partitions, Collection) or isinstance(self.partitions, str):
                raise ValidationError(
                    "partitions", f"must be a collection of partitions, not {self.partitions!r}"
                )
            partitions = frozenset(check_partition(p) for p in self.partitions)
            if not partitions:
                raise ValidationError("partitions", "must name at least one partition")
            set_derived(self, "partitions", partitions)
        if self.dead_letter_path is not None:
            set_derived(self, "dead_letter_path", check_dead_letter_path(self.dead_letter_path))
        super().__post_init__()
        # IDENTIFY's own rule for a tag (a str, not too long), before anything is sent
        self.connection_config.identify_request(extend_support=None, desired_tag=self.desired_tag)

    def _connection_specific(self) -> dict[str, Any]:
        return {"sample_rate": self.sample_rate, "msg_timeout": self.msg_timeout}

    @property
    def backoff_policy(self) -> BackoffPolicy | None:
        """How handler failures slow the flow: ``backoff`` as a policy (None: never)."""
        if isinstance(self.backoff, BackoffPolicy):
            return self.backoff
        return BackoffPolicy() if self.backoff else None

    @property
    def start_position(self) -> StartPosition | None:
        """``start`` as a :class:`StartPosition` (the named positions resolved)."""
        return self.start if isinstance(self.start, StartPosition) else None


def _start_position(start: object) -> StartPosition | None:
    """``start=``: a :class:`StartPosition`, or one of the two positions Kafka users name
    (``"earliest"``, ``"latest"``). Refused here, not when the subscription first tries it
    (it would retry forever in the background)."""
    if start is None or isinstance(start, StartPosition):
        return start
    if start == "earliest":
        return StartPosition.earliest()
    if start == "latest":
        return StartPosition.latest()
    raise ValidationError(
        "start",
        f"must be a StartPosition (StartPosition.earliest(), .latest(), .queue_offset(n), "
        f".message_count(n), .timestamp(t), or StartPosition.parse(text)), 'earliest' or "
        f"'latest', or None; got {start!r}",
    )


def check_max_in_flight(value: int) -> int:
    """A consumer's in-flight budget: an int >= 0 (0 pauses)."""
    if type(value) is not int or value < 0:
        raise ValidationError("max_in_flight", "must be an int >= 0")
    return value
