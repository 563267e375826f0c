"""The consumer's RDY flow controller (pure: no asyncio, no sockets, injectable clock).

nsqd pushes messages on a connection while the number of unanswered messages on it is below
the last ``RDY n`` the client sent. :class:`RdyController` decides which ``RDY n`` to send on
which connection so that, consumer-wide (see "RDY State" and "Backoff" in NSQ's *Building
Client Libraries* guide):

* the sum of the RDY counts never exceeds ``max_in_flight`` and no connection exceeds its
  ``max_rdy_count``;
* the budget is spread evenly; a new connection starts at ``RDY 1`` and gets its share after
  its first message;
* a count is sent again as it runs low (below a quarter of it: after every message at
  ``RDY 1``) only to a server that takes one off per message sent (nsqd before 0.2.29);
  one that keeps the count as sent (``keeps_count``) gets it once;
* with fewer budget units than connections, the ``RDY 1`` slots rotate so that every
  connection is eventually served;
* after handler failures the flow stops (``RDY 0``) for a backoff window, then the consumer
  "tests the waters": every connection the budget allows gets ``RDY 1``, and the first one
  to deliver keeps it while the others go back to ``RDY 0``, so one message probes the
  handler and an idle partition never delays the test. The first result after the window
  counts: a failure opens the next, longer window; a success lowers the level, ending the
  backoff at level 0 or opening the next, shorter window. Answers arriving while a window
  is open do not count. A probe left unanswered for ``low_rdy_idle_timeout`` (a handler
  that hangs) opens the test to the other connections again, as go-nsq's rotation would.

The consumer reports events (``add_connection``, ``on_message``, ``on_done``...) and writes the
``(key, count)`` pairs each call returns, in order: decreases always come before increases,
so the budget holds while they are written. It calls :meth:`RdyController.tick` once
``clock() >= next_deadline()``, and reads ``next_deadline()`` again after ``tick``,
``add_connection``, ``remove_connection``, ``set_max_in_flight`` and every ``on_done`` that
returns updates: an ``on_done`` that changes the backoff state returns at least one update
(re-sending an unchanged count if need be) unless no connection may receive messages, and
``on_message`` never brings the deadline closer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Generic, Literal, TypeVar, cast

from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.protocol.validation import MAX_RDY_COUNT

__all__ = ["Outcome", "RdyController"]

K = TypeVar("K", bound=Hashable)
Outcome = Literal["success", "failure", "neutral"]

# is_starved(): anticipate starvation rather than wait for it (the guide's constant).
_STARVED_RATIO = 0.85
_OTHER_OUTCOMES = frozenset(("failure", "neutral"))


class _Conn(Generic[K]):
    """Per-connection state. ``rdy`` is the last count sent; ``share`` what the connection
    should have once past its initial ``RDY 1``."""

    __slots__ = (
        "holder",
        "in_flight",
        "initial",
        "keeps_count",
        "key",
        "last_message",
        "max_rdy",
        "order",
        "rdy",
        "remaining",
        "share",
        "since",
        "starve_at",
        "starved",
    )

    def __init__(self, key: K, max_rdy: int, order: int, now: float, keeps_count: bool) -> None:
        self.key = key
        self.max_rdy = max_rdy
        self.keeps_count = keeps_count  # the server keeps the count: never refreshed
        self.order = order  # insertion rank: the deterministic tie-breaker
        self.rdy = 0
        self.share = 0
        self.remaining = 0  # last RDY sent minus messages received since
        self.in_flight = 0
        self.initial = True  # no message yet: hold RDY 1 at most
        self.last_message = now
        # Low-RDY rotation: whether the connection holds (or may hold) an RDY slot, and
        # since when it has held it, or waited for one.
        self.holder = False
        self.since = now
        self.starve_at = 0.0  # rdy * 0.85
        self.starved = False

    def idle_since(self) -> float:
        return self.last_message if self.last_message > self.since else self.since

    def slot_expiry(self, idle: float, busy: float) -> float:
        """When a holder's RDY slot goes to a waiting connection: ``busy`` seconds after it
        got the slot, or ``idle`` seconds without a message, whichever comes first."""
        return min(self.since + busy, self.idle_since() + idle)


class RdyController(Generic[K]):
    """Decides the ``RDY`` count of every connection of one consumer.

    ``clock`` returns monotonic seconds; ``backoff=None`` (or a disabled policy) means
    failures never slow the flow; ``low_rdy_idle_timeout`` and ``low_rdy_timeout`` drive the
    rotation of ``RDY 1`` slots when ``max_in_flight`` is below the number of connections
    (go-nsq's knobs, same defaults); ``rand`` feeds the ``full_jitter`` backoff strategy.

    Every event method returns the ``RDY`` commands to send, as ``(key, count)`` pairs in
    order, decreases first.
    """

    __slots__ = (
        "_backoff",
        "_clock",
        "_conns",
        "_level",
        "_low_rdy_idle_timeout",
        "_low_rdy_timeout",
        "_max_in_flight",
        "_max_level",
        "_next_order",
        "_probe",
        "_rand",
        "_starved",
        "_test_since",
        "_testing",
        "_total_rdy",
        "_window_end",
    )

    def __init__(
        self,
        max_in_flight: int,
        *,
        clock: Callable[[], float],
        backoff: BackoffPolicy | None = None,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        rand: Callable[[], float] | None = None,
    ) -> None:
        self._max_in_flight = _check_max_in_flight(max_in_flight)
        if not callable(clock):
            raise ValidationError("clock", "must be a callable returning monotonic seconds")
        if backoff is not None and not isinstance(backoff, BackoffPolicy):
            raise ValidationError(
                "backoff", f"must be a BackoffPolicy or None, not {type(backoff).__name__}"
            )
        if rand is not None and not callable(rand):
            raise ValidationError("rand", "must be a callable returning a float in [0, 1]")
        self._low_rdy_idle_timeout = _check_timeout("low_rdy_idle_timeout", low_rdy_idle_timeout)
        self._low_rdy_timeout = _check_timeout("low_rdy_timeout", low_rdy_timeout)
        self._clock = clock
        self._backoff = backoff if backoff is not None and backoff.enabled else None
        self._max_level = self._backoff.max_level if self._backoff is not None else 0
        self._rand = rand
        self._conns: dict[K, _Conn[K]] = {}
        self._next_order = 0
        self._total_rdy = 0
        self._starved = 0  # connections for which is_starved() holds
        # Backoff: level > 0 means backing off. While a window is open (_window_end set)
        # every connection is at RDY 0 and outcomes do not count; once it has ended
        # (_testing), the connections wait at RDY 1 until one delivers (_probe), which alone
        # keeps its RDY 1; the next success or failure counts.
        self._level = 0
        self._window_end: float | None = None
        self._testing = False
        self._probe: _Conn[K] | None = None
        self._test_since = 0.0  # when the test (re)opened or the probe arrived

    # ------------------------------------------------------------------ introspection

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def backoff_level(self) -> int:
        return self._level

    def in_backoff(self) -> bool:
        return self._level > 0

    def backoff_window_open(self) -> bool:
        """In backoff with every connection at RDY 0 (outcomes do not count); False while
        the consumer tests the waters."""
        return self._window_end is not None

    def keys(self) -> list[K]:
        """The connections' keys, in the order they were added."""
        return list(self._conns)

    def rdy(self, key: K) -> int:
        """The last RDY count sent (or to be sent) on ``key``. ``KeyError`` if unknown."""
        return self._conns[key].rdy

    def in_flight(self, key: K) -> int:
        """Messages received on ``key`` and not answered yet. ``KeyError`` if unknown."""
        return self._conns[key].in_flight

    def total_rdy(self) -> int:
        return self._total_rdy

    def is_starved(self) -> bool:
        """Whether some connection has messages in flight and ``in_flight >= 0.85 * rdy``.

        A batching handler processes its batch when this turns true: no more messages will
        come until some are answered.
        """
        return self._starved > 0

    def next_deadline(self) -> float | None:
        """When :meth:`tick` has work to do (a ``clock()`` value), or ``None``."""
        if self._window_end is not None:
            return self._window_end
        if self._probe_can_expire():
            return self._test_since + self._low_rdy_idle_timeout
        if self._probe is not None or not self._low_rdy_regime():
            return None
        idle = self._low_rdy_idle_timeout
        busy = self._low_rdy_timeout
        deadline = math.inf
        for conn in self._conns.values():
            if conn.holder:
                deadline = min(deadline, conn.slot_expiry(idle, busy))
        return None if deadline == math.inf else deadline

    # ------------------------------------------------------------------ events

    def add_connection(
        self, key: K, max_rdy_count: int = MAX_RDY_COUNT, *, keeps_count: bool = False
    ) -> list[tuple[K, int]]:
        """Register a subscribed connection; ``max_rdy_count`` comes from IDENTIFY, and
        ``keeps_count`` says that its server keeps the RDY count as sent (no refresh)."""
        if type(max_rdy_count) is not int:
            raise ValidationError(
                "max_rdy_count", f"must be an int, not {type(max_rdy_count).__name__}"
            )
        if max_rdy_count < 1:
            raise ValidationError("max_rdy_count", f"must be >= 1, got {max_rdy_count}")
        if key in self._conns:
            raise ValidationError("key", f"connection {key!r} is already registered")
        now = self._clock()
        self._conns[key] = _Conn(key, max_rdy_count, self._next_order, now, keeps_count)
        self._next_order += 1
        return self._rebalance(now)

    def remove_connection(self, key: K) -> list[tuple[K, int]]:
        """Forget a closed connection and give its budget to the others. Unknown keys: no-op."""
        conn = self._conns.pop(key, None)
        if conn is None:
            return []
        self._total_rdy -= conn.rdy
        if conn.starved:
            self._starved -= 1
        now = self._clock()
        if self._probe is conn:  # its message comes back from nsqd: test again everywhere
            self._probe = None
            self._test_since = now
        return self._rebalance(now)

    def on_message(self, key: K) -> list[tuple[K, int]]:
        """A message arrived on ``key``. Unknown keys: no-op."""
        conn = self._conns.get(key)
        if conn is None:
            return []
        in_flight = conn.in_flight + 1
        conn.in_flight = in_flight
        if not conn.starved and in_flight >= conn.starve_at:
            conn.starved = True
            self._starved += 1
        clock = self._clock  # self._clock() would be an unspecialized method lookup (3.11)
        conn.last_message = clock()
        remaining = conn.remaining - 1
        conn.remaining = remaining
        rdy = conn.rdy
        if conn.initial:
            conn.initial = False
            share = conn.share
            if share > rdy:  # its share is reserved in the budget already
                self._send(conn, share)
                return [(key, share)]
        if rdy and remaining * 4 < rdy:
            # Below 25 % of the last count: re-send it to a server that decrements it.
            # Every message at RDY 1 comes here, so the test of the waters costs nothing more.
            conn.remaining = rdy
            if self._testing and self._probe is None:
                return self._probe_arrived(conn)
            if not conn.keeps_count:
                return [(key, rdy)]
        return []

    def on_done(self, key: K, outcome: Outcome) -> list[tuple[K, int]]:
        """A message of ``key`` was answered.

        ``success`` (FIN) and ``failure`` (REQ after a handler error) drive the backoff;
        ``neutral`` (manual requeue, message given up...) never does. Unknown keys: no-op.
        """
        if outcome != "success" and outcome not in _OTHER_OUTCOMES:
            raise ValidationError("outcome", _bad_outcome(outcome))
        conn = self._conns.get(key)
        if conn is None:
            return []
        in_flight = conn.in_flight - 1
        if in_flight < 0:
            in_flight = 0
        conn.in_flight = in_flight
        if conn.starved and (in_flight == 0 or in_flight < conn.starve_at):
            conn.starved = False
            self._starved -= 1
        if outcome == "success":
            if not self._testing:  # not backing off, or a window is open: does not count
                return []
            self._level -= 1
            if self._level == 0:
                self._testing = False
                self._probe = None
                return self._announce(self._rebalance(self._clock()))
            return self._open_window()
        if outcome == "failure":
            if self._backoff is None or self._window_end is not None:
                return []
            if self._level < self._max_level:
                self._level += 1
            return self._open_window()
        # neutral: no verdict. Once the probe's connection has nothing left in flight, the
        # test is open to every connection again.
        if self._probe is conn and in_flight == 0:
            now = self._clock()
            self._probe = None
            self._test_since = now
            return self._announce(self._rebalance(now))
        return []

    def set_max_in_flight(self, max_in_flight: int) -> list[tuple[K, int]]:
        """Change the budget; 0 pauses the flow (RDY 0 everywhere), backoff state is kept."""
        self._max_in_flight = _check_max_in_flight(max_in_flight)
        return self._rebalance(self._clock())

    def tick(self) -> list[tuple[K, int]]:
        """Run what is due: the end of a backoff window, the low-RDY rotation.

        Harmless when nothing is due, so calling it early, late or twice is fine.
        """
        now = self._clock()
        window_end = self._window_end
        if window_end is not None:
            if now < window_end:
                return []
            self._window_end = None
            self._testing = True
            self._test_since = now
            return self._rebalance(now)
        if self._probe_can_expire():
            if now < self._test_since + self._low_rdy_idle_timeout:
                return []
            # The probe is unanswered (or, before any message, the timer re-arms: it must run
            # before a probe's deadline, which on_message does not announce).
            self._probe = None
            self._test_since = now
            if not self._low_rdy_regime():
                return self._rebalance(now)
            # The probe held a rotating RDY 1 slot, idle for as long: rotate it now.
        # Testing the waters with fewer units than connections rotates the RDY 1 slots as
        # usual until one delivers; a probe in flight stops the rotation.
        if self._probe is not None or not self._low_rdy_regime():
            return []
        idle = self._low_rdy_idle_timeout
        busy = self._low_rdy_timeout
        expired: list[tuple[float, int, _Conn[K]]] = []
        waiting: list[tuple[float, int, _Conn[K]]] = []
        for conn in self._conns.values():
            if conn.holder:
                due = conn.slot_expiry(idle, busy)
                if now >= due:
                    expired.append((due, conn.order, conn))
            else:
                waiting.append((conn.since, conn.order, conn))
        if not expired:
            return []
        expired.sort()
        waiting.sort()
        for i, (_, _, holder) in enumerate(expired):
            holder.since = now
            if i < len(waiting):  # otherwise nobody else waits: keep the slot
                holder.holder = False
                newcomer = waiting[i][2]
                newcomer.holder = True
                newcomer.since = now
        return self._rebalance(now)

    # ------------------------------------------------------------------ internals

    def _low_rdy_regime(self) -> bool:
        return 0 < self._max_in_flight < len(self._conns)

    def _probe_can_expire(self) -> bool:
        """Testing the waters with another connection to turn to, and either a probe in
        flight or every connection at RDY 1 (otherwise the low-RDY rotation runs)."""
        if not self._testing:
            return False
        n = len(self._conns)
        budget = self._max_in_flight
        return n > 1 and budget > 0 and (self._probe is not None or budget >= n)

    def _send(self, conn: _Conn[K], count: int) -> None:
        self._total_rdy += count - conn.rdy
        conn.rdy = count
        conn.remaining = count
        starve_at = count * _STARVED_RATIO
        conn.starve_at = starve_at
        in_flight = conn.in_flight
        starved = in_flight > 0 and in_flight >= starve_at
        if starved != conn.starved:
            conn.starved = starved
            self._starved += 1 if starved else -1

    def _open_window(self) -> list[tuple[K, int]]:
        # Only a failure counted under a policy raises the level, so a policy is set here.
        policy = cast(BackoffPolicy, self._backoff)
        now = self._clock()
        self._window_end = now + policy.delay(self._level, self._rand)
        self._testing = False
        self._probe = None
        return self._rebalance(now)

    def _probe_arrived(self, conn: _Conn[K]) -> list[tuple[K, int]]:
        """The first message since the window ended: ``conn`` keeps its ``RDY 1`` (re-sent,
        as for any message at RDY 1) and the other connections stop, so this message alone
        tests the handler. Messages the others had already sent still arrive and are handled;
        only the first answer counts."""
        now = self._clock()
        self._probe = conn
        self._test_since = now
        updates = self._rebalance(now)
        updates.append((conn.key, conn.rdy))
        return updates

    def _announce(self, updates: list[tuple[K, int]]) -> list[tuple[K, int]]:
        """After a change of backoff state that moved no count: re-send the counts (harmless
        on the wire), so that the caller, seeing updates, reads ``next_deadline()`` again."""
        if updates:
            return updates
        for conn in self._conns.values():
            if conn.rdy:
                updates.append((conn.key, conn.rdy))
                conn.remaining = conn.rdy
        return updates

    def _assign_shares(self, now: float) -> None:
        conns = self._conns
        budget = self._max_in_flight
        n = len(conns)
        level = self._level
        if budget == 0 or n == 0 or (level and not self._testing):
            for conn in conns.values():
                conn.share = 0
            return
        if level:
            probe = self._probe
            if probe is not None:
                for conn in conns.values():
                    conn.share = 1 if conn is probe else 0
                return
        if budget >= n:
            if level:  # testing the waters: RDY 1 everywhere, the first to deliver wins
                for conn in conns.values():
                    conn.share = 1
            else:
                self._spread(budget)
            for conn in conns.values():
                if not conn.holder:
                    conn.holder = True
                    conn.since = now
            return
        # Fewer units than connections: `budget` holders get RDY 1, the others wait.
        holders = [c for c in conns.values() if c.holder]
        if len(holders) > budget:
            # Keep the most recently active holders; the others join the queue.
            holders.sort(key=lambda c: (-c.idle_since(), c.order))
            for conn in holders[budget:]:
                conn.holder = False
                conn.since = now
        elif len(holders) < budget:
            waiting = sorted(
                (c for c in conns.values() if not c.holder), key=lambda c: (c.since, c.order)
            )
            for conn in waiting[: budget - len(holders)]:
                conn.holder = True
                conn.since = now
        for conn in conns.values():
            if conn.holder:
                if conn.rdy == 0:  # (re)gets its slot now: its hold starts now
                    conn.since = now
                conn.share = 1
            else:
                conn.share = 0

    def _spread(self, budget: int) -> None:
        """Max-min fair split of ``budget`` (>= number of connections) over the connections.

        Connections whose ``max_rdy_count`` is below the even share get their cap and leave
        the rest to the others; the remainder units go to the first connections in insertion
        order.
        """
        pending = list(self._conns.values())
        while True:
            share = budget // len(pending)
            capped = [c for c in pending if c.max_rdy <= share]
            if not capped:
                break
            for conn in capped:
                conn.share = conn.max_rdy
                budget -= conn.max_rdy
            pending = [c for c in pending if c.max_rdy > share]
            if not pending:
                return
        extra = budget - share * len(pending)
        for i, conn in enumerate(pending):
            conn.share = share + 1 if i < extra else share

    def _rebalance(self, now: float) -> list[tuple[K, int]]:
        """Recompute every connection's count and return the changes, decreases first."""
        self._assign_shares(now)
        decreases: list[tuple[K, int]] = []
        increases: list[tuple[K, int]] = []
        for conn in self._conns.values():
            share = conn.share
            target = 1 if conn.initial and share > 1 else share
            if target < conn.rdy:
                self._send(conn, target)
                decreases.append((conn.key, target))
            elif target > conn.rdy:
                increases.append((conn.key, target))
        for key, target in increases:
            self._send(self._conns[key], target)
        decreases.extend(increases)
        return decreases


def _check_max_in_flight(value: object) -> int:
    if type(value) is not int:
        raise ValidationError("max_in_flight", f"must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValidationError("max_in_flight", f"must be >= 0, got {value}")
    return value


def _check_timeout(field: str, value: object) -> float:
    if type(value) is not float and type(value) is not int:
        raise ValidationError(field, f"must be a number of seconds, not {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValidationError(field, f"must be finite and > 0 seconds, got {value!r}")
    return float(value)


def _bad_outcome(outcome: object) -> str:
    return f"must be 'success', 'failure' or 'neutral', got {outcome!r}"
