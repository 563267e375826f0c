"""Retry decisions shared by the clients: which failures are worth another try and which mean
the cluster layout is stale (each error says so itself, see :mod:`smartnsq.errors`), the
wait between tries and when a failing publish stops.

The wait is a :class:`Backoff` (the fast default, asked for ``delay(failures)``) or a
user's tenacity ``wait``; the stop, a user's tenacity ``stop``. A user's strategy is asked
with a ``tenacity.RetryCallState`` made for each decision (:func:`retry_state`): tenacity
is imported then, never by a client left with its defaults (start-up time). Strategies only
shape the tries: a publish still ends by ``publish_timeout`` whatever they say.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from smartnsq.errors import NSQError, ValidationError
from smartnsq.flow.backoff import exponential

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = [
    "Backoff",
    "Delays",
    "Stop",
    "Stops",
    "Wait",
    "check_stop",
    "check_wait",
    "is_retriable",
    "needs_lookup_refresh",
    "retry_state",
]

log = logging.getLogger("smartnsq.retry")

#: A tenacity ``wait``: seconds to wait before the next try, from a ``RetryCallState``.
Wait = Callable[["RetryCallState"], float]
#: A tenacity ``stop``: whether to try no more, from a ``RetryCallState``.
Stop = Callable[["RetryCallState"], bool]


def is_retriable(exc: BaseException) -> bool:
    """Whether trying again can succeed: the error's own ``retriable`` flag (leader changes,
    unwritable partitions, lost connections and timeouts pass; bad input and misconfiguration
    do not). Anything that is not an :class:`NSQError` is a bug, never retried."""
    return isinstance(exc, NSQError) and exc.retriable


def needs_lookup_refresh(exc: BaseException) -> bool:
    """Whether the failure says the client's view of the cluster is out of date (the error's
    ``refresh_lookup`` flag)."""
    return isinstance(exc, NSQError) and exc.refresh_lookup


class Delays(Protocol):
    """What spaces the tries of something failing: the wait after ``failures`` consecutive
    failures, the last one ``failure``, ``elapsed`` seconds after the first of them."""

    def delay(
        self, failures: int, failure: BaseException | None = None, elapsed: float = 0.0
    ) -> float: ...


class Stops(Protocol):
    """Whether something failing stops trying: after ``attempts`` tries, the last failing
    with ``failure``, ``elapsed`` seconds after it was asked for."""

    def stops(self, attempts: int, failure: BaseException | None, elapsed: float) -> bool: ...


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with proportional jitter: ``initial * multiplier**n`` capped at
    ``maximum``, each delay moved by up to ``jitter`` of itself. A tenacity ``wait`` too."""

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

    def delay(
        self, failures: int, failure: BaseException | None = None, elapsed: float = 0.0
    ) -> float:
        """The wait after ``failures`` consecutive failures (>= 1); what failed and when
        do not change it (they are there for a user's tenacity wait, see :class:`Delays`)."""
        base = exponential(failures, self.initial, self.maximum, self.multiplier)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.delay(retry_state.attempt_number)


def retry_state(attempt: int, failure: BaseException | None, elapsed: float) -> RetryCallState:
    """A ``tenacity.RetryCallState`` for one decision: the ``attempt``-th try (>= 1) failed
    with ``failure`` (its ``outcome``; None: none) ``elapsed`` seconds after the start
    (``seconds_since_start``; ``start_time`` on the monotonic clock, like tenacity's own).
    Nothing is wrapped: ``fn`` and ``retry_object`` are None."""
    from tenacity import Future, RetryCallState  # here: only a user's strategy needs it

    state = RetryCallState(cast(Any, None), None, (), {})
    state.attempt_number = max(attempt, 1)
    now = state.start_time
    state.start_time = now - max(elapsed, 0.0)
    state.outcome_timestamp = now
    if failure is not None:
        outcome = Future(state.attempt_number)
        outcome.set_exception(failure)
        state.outcome = outcome
    return state


def _is_tenacity(value: object, module: str, base: str) -> bool:
    """Whether ``value`` is one of tenacity's ``base`` strategies; read only when tenacity
    is loaded already (it is, for anything made with it)."""
    loaded = sys.modules.get(module)
    kind = getattr(loaded, base, None)
    return isinstance(kind, type) and isinstance(value, kind)


class _UserWait:
    """A user's tenacity wait as :class:`Delays`. A wait that raises or answers what is not
    a number of seconds (finite, >= 0) is a bug of the caller's: said once at ERROR, then
    ``fallback`` decides (a retry loop must not die of it)."""

    __slots__ = ("_said", "argument", "fallback", "wait")

    def __init__(self, wait: Wait, argument: str, fallback: Backoff) -> None:
        self.wait = wait
        self.argument = argument
        self.fallback = fallback
        self._said = False

    def delay(
        self, failures: int, failure: BaseException | None = None, elapsed: float = 0.0
    ) -> float:
        try:
            seconds: object = self.wait(retry_state(failures, failure, elapsed))
        except Exception:  # noqa: BLE001 - the user's bug, logged by _broken with its traceback
            self._broken("raised", exc_info=True)
            return self.fallback.delay(failures)
        if (
            not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
            or not 0 <= seconds < math.inf
        ):
            self._broken(f"answered {seconds!r}, not a number of seconds >= 0")
            return self.fallback.delay(failures)
        return float(seconds)

    def _broken(self, what: str, exc_info: bool = False) -> None:
        if not self._said:
            self._said = True
            log.error(
                "%s=%r %s; the default backoff spaces the tries instead (said once)",
                self.argument,
                self.wait,
                what,
                exc_info=exc_info,
            )


class _UserStop:
    """A user's tenacity stop as :class:`Stops`. A stop that raises is said once at ERROR and
    taken as "go on" (the deadline still bounds the tries)."""

    __slots__ = ("_said", "argument", "stop")

    def __init__(self, stop: Stop, argument: str) -> None:
        self.stop = stop
        self.argument = argument
        self._said = False

    def stops(self, attempts: int, failure: BaseException | None, elapsed: float) -> bool:
        try:
            return bool(self.stop(retry_state(attempts, failure, elapsed)))
        except Exception:  # the user's code: any error it raises is its own bug
            if not self._said:
                self._said = True
                log.error(
                    "%s=%r raised; tries go on until the deadline (said once)",
                    self.argument,
                    self.stop,
                    exc_info=True,
                )
            return False


def check_wait(argument: str, value: object, fallback: Backoff) -> Delays:
    """``argument`` (a retry or reconnect wait) as :class:`Delays`: None is ``fallback``, a
    :class:`Backoff` is asked directly, any other callable is taken for a tenacity wait."""
    if value is None:
        return fallback
    if isinstance(value, Backoff):
        return value
    if not callable(value):
        raise ValidationError(
            argument,
            f"must be a Backoff or a tenacity wait (a callable taking a RetryCallState, such "
            f"as tenacity.wait_exponential()), or None; got {value!r}",
        )
    _not_a_class(argument, value)
    if _is_tenacity(value, "tenacity.stop", "stop_base"):
        raise ValidationError(argument, f"{value!r} is a tenacity stop, not a wait")
    return _UserWait(cast(Wait, value), argument, fallback)


def check_stop(argument: str, value: object) -> Stops | None:
    """``argument`` (a retry stop) as :class:`Stops`: a tenacity stop (any callable taking a
    ``RetryCallState``), or None (no stop but the deadline)."""
    if value is None:
        return None
    if isinstance(value, Backoff) or _is_tenacity(value, "tenacity.wait", "wait_base"):
        raise ValidationError(argument, f"{value!r} is a wait, not a tenacity stop")
    if not callable(value):
        raise ValidationError(
            argument,
            f"must be a tenacity stop (a callable taking a RetryCallState, such as "
            f"tenacity.stop_after_attempt(3)), or None; got {value!r}",
        )
    _not_a_class(argument, value)
    return _UserStop(cast(Stop, value), argument)


def _not_a_class(argument: str, value: object) -> None:
    """A strategy's class given for the strategy (``tenacity.wait_exponential`` without its
    parentheses) is callable too, and would answer a strategy, not seconds: refused."""
    if isinstance(value, type):
        raise ValidationError(
            argument, f"{value.__name__} is a class: give an instance, such as {value.__name__}()"
        )
