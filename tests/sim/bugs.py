"""Known bugs, put back one at a time (a test-only switch): the simulation must find each
(tests/sim/test_finds_bugs.py, and the table in docs/guides/testing.md).

Each is a context manager that patches the client while it is open."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

from smartnsq.consumer.subscriber import Subscriber
from smartnsq.flow.delivery import DeliveryLedger
from smartnsq.flow.rdy import RdyController
from smartnsq.protocol import commands
from smartnsq.publishing import flow as publish_flow


@contextlib.contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    real = getattr(owner, name)
    setattr(owner, name, make(real))
    try:
        yield
    finally:
        setattr(owner, name, real)


def resubscribe_dropped() -> contextlib.AbstractContextManager[None]:
    """A subscription whose connection is lost is never made again (the resubscribe lost
    while the supervisor looked at the keys)."""

    def make(real: Any) -> Any:
        def on_close(self: Subscriber, sub: Any, conn: Any, exc: BaseException | None) -> None:
            real(self, sub, conn, exc)
            if exc is not None and self.listener.running and not sub.closing:
                self._retry_at[sub.key] = math.inf

        return on_close

    return _patched(Subscriber, "_on_close", make)


def deadline_not_cut() -> contextlib.AbstractContextManager[None]:
    """A publish's deadline fires 5 s late: what it waits for (a connection, a lookup, a
    retry's backoff) is not cut at ``publish_timeout``."""

    def make(real: Any) -> Any:
        def watch(self: publish_flow.PublishFlow, p: Any) -> None:
            p.deadline += 5.0
            real(self, p)
            p.deadline -= 5.0

        return watch

    return _patched(publish_flow.PublishFlow, "_watch", make)


def retry_overtakes() -> contextlib.AbstractContextManager[None]:
    """A failed try goes to the back of its partition's queue: the publishes behind it go
    first."""

    def make(real: Any) -> Any:
        def settle(self: publish_flow.PublishFlow, lane: Any, now: float, steps: Any) -> None:
            if lane.sending and len(lane.queue) > lane.sending:
                first = lane.queue.popleft()
                lane.sending -= 1
                first.state = publish_flow.QUEUED
                lane.queue.append(first)
            real(self, lane, now, steps)

        return settle

    return _patched(publish_flow.PublishFlow, "_settle", make)


def rdy_over_max_in_flight() -> contextlib.AbstractContextManager[None]:
    """The first connection gets one more RDY than its share."""

    def make(real: Any) -> Any:
        def assign(self: RdyController[Any], now: float) -> None:
            real(self, now)
            for conn in self._conns.values():
                if conn.share:
                    conn.share += 1
                break

        return assign

    return _patched(RdyController, "_assign_shares", make)


def fin_twice() -> contextlib.AbstractContextManager[None]:
    """One FIN in 40 is written twice."""
    count = [0]

    def make(real: Any) -> Any:
        def fin(message_id: bytes) -> bytes:
            count[0] += 1
            once = real(message_id)
            return once * 2 if count[0] % 40 == 0 else once

        return fin

    return _patched(commands, "fin", make)


def turn_per_connection() -> contextlib.AbstractContextManager[None]:
    """An ordered partition's turn is its connection's alone (before 1ea9a52): a new
    leader's deliveries run beside a handler still running on the old one's."""

    class Forgetful(dict[Any, Any]):
        def __setitem__(self, key: Any, value: Any) -> None:
            return None

    def make(real: Any) -> Any:
        def init(self: DeliveryLedger[Any], *args: Any, **kwargs: Any) -> None:
            real(self, *args, **kwargs)
            self._turns = Forgetful()

        return init

    return _patched(DeliveryLedger, "__init__", make)


BUGS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "resubscribe dropped": resubscribe_dropped,
    "publish wait not cut at the deadline": deadline_not_cut,
    "retry overtakes an earlier publish": retry_overtakes,
    "RDY above max_in_flight": rdy_over_max_in_flight,
    "FIN sent twice": fin_twice,
    "ordered turn per connection": turn_per_connection,
}
