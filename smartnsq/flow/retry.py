"""Retry decisions shared by the clients: which failures are worth another try and which mean
the cluster layout is stale (each error says so itself, see :mod:`smartnsq.errors`), and the
backoff between tries (a tenacity ``wait``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smartnsq.errors import NSQError, ValidationError
from smartnsq.flow.backoff import exponential

if TYPE_CHECKING:
    from tenacity import RetryCallState  # only named: a Backoff is a tenacity wait

__all__ = ["Backoff", "is_retriable", "needs_lookup_refresh"]


def is_retriable(exc: BaseException) -> bool:
    """Whether trying again can succeed: the error's own ``retriable`` flag (leader changes,
    unwritable partitions, lost connections and timeouts pass; bad input and misconfiguration
    do not). Anything that is not an :class:`NSQError` is a bug, never retried."""
    return isinstance(exc, NSQError) and exc.retriable


def needs_lookup_refresh(exc: BaseException) -> bool:
    """Whether the failure says the client's view of the cluster is out of date (the error's
    ``refresh_lookup`` flag)."""
    return isinstance(exc, NSQError) and exc.refresh_lookup


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with proportional jitter: ``initial * multiplier**n`` capped at
    ``maximum``, each delay moved by up to ``jitter`` of itself. A tenacity ``wait``."""

    initial: float = 0.05
    maximum: float = 1.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValidationError("backoff", "need 0 < initial <= maximum")
        if self.multiplier < 1:
            raise ValidationError("backoff", "multiplier must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValidationError("backoff", "jitter must be in [0, 1)")

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (>= 1)."""
        base = exponential(failures, self.initial, self.maximum, self.multiplier)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.delay(retry_state.attempt_number)
