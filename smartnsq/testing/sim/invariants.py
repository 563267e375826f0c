"""The rules every simulated run must keep, checked on its :class:`History`.

* **Nothing acknowledged is lost**: every body of an acknowledged publish reached the
  handler (or was given up on, after ``max_attempts``) by the end of the drain.
* **Order**: on an ordered consumer, each key's messages reach the handler in the order
  ``publish()`` was called. On an ext topic (sequence stamps) each exactly once; on a
  plain topic the first copy of each, copies allowed after it, and a publish that failed in
  doubt (``outcome_unknown``) may arrive anywhere. The one exception is the order nsqd
  itself breaks and no client can tell (a refusal followed on its connection by a store,
  both answers lost with the connection: :attr:`History.inversions`).
* **Deadlines**: every publish ends by its deadline; a failure is a ``PublishError``, whose
  ``outcome_unknown`` is True when its message was stored after all.
* **A keyed publish never changes partition.**
* **No stall**: once the last fault has ended, the consumer handles an acknowledged message
  it had not handled at least every :data:`STALL_BOUND` seconds until it has handled them
  all (a backoff slows it; nothing may stop it).
* **Nothing is answered twice**: the consumer never sends a FIN or REQ for a delivery it
  has already answered on that connection.
* **RDY never exceeds** ``max_in_flight`` (or one per partition, ordered with none given).
* **No reconnect storm**: a partition is never subscribed more than
  :data:`STORM_SUBSCRIBES` times within :data:`STORM_WINDOW` seconds (a reconnect that ignores
  its backoff).
* **Nothing leaks**: connections, tasks and timers are back to what they were before the
  clients started, once they are closed.
* **No exception escapes to the loop.**
"""

from __future__ import annotations

from collections import defaultdict

from smartnsq.errors import PublishError
from smartnsq.testing.sim.history import UNKEYED, History

__all__ = ["STALL_BOUND", "check"]

#: The longest the consumer may go without handling a new acknowledged message once the
#: faults are over: the consumer's detection bound (2 x heartbeat_interval + 1 s, heartbeats
#: of 5 s), a failover's lookups and reconnect backoff, and a message's timeout and
#: redelivery, with room.
STALL_BOUND = 45.0
STORM_WINDOW = 1.0
STORM_SUBSCRIBES = 12


def check(history: History, sharding: object) -> list[str]:
    """Every rule ``history`` breaks, one line each (empty: none). ``sharding``: the
    workload's ``partition_for(key, count)`` (where a key must go)."""
    problems: list[str] = []
    problems += _losses(history)
    problems += _order(history)
    problems += _deadlines(history)
    problems += _partitions(history, sharding)
    problems += history.rdy_overruns[:3]
    problems += history.answered_twice[:3]
    problems += _storms(history)
    problems += history.leaks
    problems += [
        f"an exception reached the loop: {error.get('message')} {error.get('exception')!r}"
        for error in history.loop_errors[:3]
    ]
    return problems


def _losses(history: History) -> list[str]:
    handled = {h.body for h in history.handled}
    lost = [
        body
        for p in history.published
        if p.acknowledged
        for body in p.bodies
        if body not in handled
    ]
    if not lost:
        return []
    drained = (
        f"the consumer stalled for {STALL_BOUND:g} s"
        if history.drained_at is None
        else f"drained at {history.drained_at}"
    )
    return [f"{len(lost)} acknowledged message(s) never handled ({drained}): {lost[:5]}"]


def _order(history: History) -> list[str]:
    if not history.ordered:
        return []
    published = history.by_body()
    per_key: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for handled in history.handled:
        if handled.key != UNKEYED:
            per_key[handled.key].append((handled.number, handled.body))
    problems = []
    inversions = history.inversions
    for key, calls in per_key.items():
        if history.ext:
            seen: set[bytes] = set()
            for _, body in calls:
                if body in seen:
                    problems.append(f"key {key}: {body!r} handed to the handler twice")
                    break
                seen.add(body)
            kept = calls
        else:
            kept, seen = [], set()
            for number, body in calls:
                publish = published.get(body)
                if body in seen or (publish is not None and publish.in_doubt):
                    continue
                seen.add(body)
                kept.append((number, body))
        highest: tuple[int, bytes] | None = None
        for number, body in kept:
            if highest is not None and number < highest[0] and (body, highest[1]) not in inversions:
                problems.append(
                    f"key {key}: {body!r} handled after {highest[1]!r}, called after it"
                )
                break
            if highest is None or number > highest[0]:
                highest = (number, body)
    return problems


def _deadlines(history: History) -> list[str]:
    problems = []
    for p in history.published:
        if p.ended is None:
            problems.append(f"publish {p.index} ({p.bodies[0]!r}) never ended")
            continue
        if p.ended > p.bound + 1e-6:
            problems.append(
                f"publish {p.index} ({p.bodies[0]!r}) ended at {p.ended:.6f}, past its "
                f"bound {p.bound:.6f}"
            )
        error = p.error
        if error is None:
            continue
        if not isinstance(error, PublishError):
            problems.append(f"publish {p.index} raised {error!r}, not a PublishError")
            continue
        stored = [body for body in p.bodies if history.stored.get(body)]
        if stored and not error.outcome_unknown:
            problems.append(
                f"publish {p.index} failed saying nothing was stored, but {stored[0]!r} was"
                f": {error}"
            )
    return problems[:5]


def _partitions(history: History, sharding: object) -> list[str]:
    partition_for = getattr(sharding, "partition_for", None)
    if partition_for is None:
        return []
    problems = []
    for p in history.published:
        if p.key == UNKEYED or p.partition is None:
            continue
        wanted = partition_for(p.key, history.partitions)
        if p.partition != wanted:
            problems.append(f"publish {p.index} of key {p.key} went to {p.partition}, not {wanted}")
    return problems[:3]


def _storms(history: History) -> list[str]:
    problems = []
    for where, times in history.subscribes.items():
        times = sorted(times)
        for first in range(len(times)):
            last = first + STORM_SUBSCRIBES
            if last < len(times) and times[last] - times[first] < STORM_WINDOW:
                problems.append(
                    f"node {where[0]} partition {where[1]}: {STORM_SUBSCRIBES + 1} subscribes "
                    f"within {STORM_WINDOW} s from {times[first]:.3f} s (a reconnect storm)"
                )
                break
    return problems
