"""Backoff and requeue-delay policies (pure: no clock, no I/O).

:class:`BackoffPolicy` says how long a consumer stays at ``RDY 0`` after handler failures
(go-nsq's ``backoff_strategy``, ``backoff_multiplier`` and ``max_backoff_duration``);
:func:`requeue_delay` says how long a failed message waits before nsqd redelivers it
(go-nsq's ``default_requeue_delay`` and ``max_requeue_delay``, pynsq's ``requeue_delay``).
All durations are in seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from smartnsq.errors import ValidationError

__all__ = ["BackoffPolicy", "BackoffStrategy", "exponential", "requeue_delay"]

BackoffStrategy = Literal["exponential", "full_jitter"]
_STRATEGIES = ("exponential", "full_jitter")


def exponential(attempt: int, first: float, maximum: float, multiplier: float = 2.0) -> float:
    """The one exponential formula of the client's waits: ``first * multiplier ** (attempt -
    1)`` seconds for the ``attempt``-th (>= 1), capped at ``maximum``. Used by the consumer's
    backoff windows (:class:`BackoffPolicy`), the retry and reconnect backoff
    (``smartnsq.flow.retry.Backoff``) and the lookup's down-ranking of a failing nsqlookupd."""
    # Past a few hundred attempts only the cap matters: keep the power finite.
    return min(first * multiplier ** min(max(attempt - 1, 0), 1023), maximum)


def check_seconds(field: str, value: object, *, positive: bool) -> float:
    """A duration argument: an int or float (not bool), finite, >= 0 (> 0 if ``positive``)."""
    if type(value) is not float and type(value) is not int:
        raise ValidationError(field, f"must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValidationError(field, f"must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValidationError(field, f"must be > 0 seconds, got {value!r}")
    if value < 0:
        raise ValidationError(field, f"must be >= 0 seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class BackoffPolicy:
    """How long to stop the flow (``RDY 0``) after handler failures.

    The level is the number of unforgiven failures. ``exponential`` waits
    ``multiplier * 2 ** (level - 1)`` seconds (1, 2, 4... with the default multiplier),
    capped at ``max_delay``; ``full_jitter`` waits a uniform random fraction of that.
    ``enabled=False`` keeps the flow running whatever the handler does.
    """

    multiplier: float = 1.0
    max_delay: float = 120.0
    strategy: BackoffStrategy = "exponential"
    enabled: bool = True

    def __post_init__(self) -> None:
        check_seconds("multiplier", self.multiplier, positive=True)
        check_seconds("max_delay", self.max_delay, positive=True)
        if self.multiplier > self.max_delay:
            raise ValidationError(
                "multiplier",
                f"{self.multiplier!r} s is over max_delay ({self.max_delay!r} s): "
                "the first backoff would already be capped",
            )
        if self.strategy not in _STRATEGIES:
            raise ValidationError(
                "strategy", f"must be one of {', '.join(_STRATEGIES)}, got {self.strategy!r}"
            )
        if type(self.enabled) is not bool:
            raise ValidationError("enabled", f"must be a bool, not {type(self.enabled).__name__}")

    @property
    def max_level(self) -> int:
        """The highest level whose exponential delay does not exceed ``max_delay`` (>= 1).

        Failures beyond it do not raise the level (go-nsq stops its counter there), so as many
        successes as levels bring the consumer back to full speed.
        """
        level = 1
        while self.multiplier * 2.0**level <= self.max_delay:
            level += 1
        return level

    def delay(self, level: int, rand: Callable[[], float] | None = None) -> float:
        """Seconds to stay at ``RDY 0`` at ``level`` (>= 1).

        ``rand`` (``random.random`` by default) returns a float in [0, 1]; only
        ``full_jitter`` calls it.
        """
        if type(level) is not int:
            raise ValidationError("level", f"must be an int, not {type(level).__name__}")
        if level < 1:
            raise ValidationError("level", f"must be >= 1, got {level}")
        delay = exponential(level, self.multiplier, self.max_delay)
        if self.strategy == "exponential":
            return delay
        fraction = (rand or random.random)()
        if not 0.0 <= fraction <= 1.0:
            raise ValidationError("rand", f"must return a float in [0, 1], got {fraction!r}")
        return fraction * delay


def requeue_delay(attempts: int, base: float, maximum: float) -> float:
    """Seconds a failed message waits before redelivery: ``base * attempts``, capped.

    ``attempts`` is the message's delivery count (1 on the first delivery), as in go-nsq
    (``default_requeue_delay * attempts`` capped at ``max_requeue_delay``) and pynsq.
    """
    if type(attempts) is not int:
        raise ValidationError("attempts", f"must be an int, not {type(attempts).__name__}")
    if attempts < 0:
        raise ValidationError("attempts", f"must be >= 0, got {attempts}")
    base = check_seconds("base", base, positive=False)
    maximum = check_seconds("maximum", maximum, positive=False)
    return min(base * attempts, maximum)
