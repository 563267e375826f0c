"""What the publish flow keeps (pure data, no decisions): a publish and its state, a batch of
publishes sent as one MPUB, a partition's lane, and the steps an event returns. The
decisions are :mod:`smartnsq.publishing.flow`'s."""

from __future__ import annotations

from collections import deque
from typing import Any

from smartnsq.flow.retry import Delays
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import Route

__all__ = [
    "BATCH_OVERHEAD",
    "DONE",
    "LOST",
    "NO_LAYOUT",
    "NO_STEPS",
    "PER_MESSAGE",
    "PER_TRACE_ID",
    "QUEUED",
    "REFUSED",
    "SENT",
    "ZOMBIE",
    "Batch",
    "Delays",
    "Key",
    "Lane",
    "Pool",
    "Publish",
    "Steps",
    "Waiters",
]

# The states of a publish.
QUEUED = 0  # in its lane (or waiting for a layout), not in flight
SENT = 1  # its try is in flight on ``link``
REFUSED = 2  # nsqd refused its try; waits for the tries sent behind it to be answered
LOST = 3  # its try ended unanswered (lost connection, timeout); waits for the others
ZOMBIE = 4  # over for its caller (deadline, cancelled), its try still in flight
DONE = 5  # over: ``results`` or ``error`` set, removed from its lane

_NONE_AVOIDED: frozenset[int] = frozenset()
#: An MPUB's bytes beyond its messages' (the count and the body size), and each message's
#: (its size; a trace id of MPUB_TRACE takes 8 more).
BATCH_OVERHEAD = 8
PER_MESSAGE = 4
PER_TRACE_ID = 8
Key = tuple[str, str, "int | None"]  # a link's pool key: (address, pool topic, partition)
NO_LAYOUT: Any = object()  # a lane not waiting for a layout


class Publish:
    """One publish as the flow keeps it: the request, its deadline, the driver's ``waiter``
    and telemetry ``span`` (opaque here), and its tries so far: how many, the partitions
    an unkeyed one failed on (``avoid``), the last try's route, link and trace ids, whether
    some try may have been stored (``maybe_stored``), the last failure; once over, its
    ``results`` or ``error``. ``seq``: its stamp number (0: not stamped). ``command`` and
    ``data``: its try to write, until the driver wrote it."""

    __slots__ = (
        "arrived",
        "avoid",
        "batch",
        "command",
        "data",
        "deadline",
        "error",
        "failure",
        "lane",
        "link",
        "maybe_stored",
        "overtaken",
        "request",
        "results",
        "route",
        "seq",
        "span",
        "state",
        "trace_ids",
        "tries",
        "waiter",
        "watched",
    )

    def __init__(
        self, request: PublishRequest, deadline: float, waiter: Any, span: Any, arrived: float = 0.0
    ) -> None:
        self.request = request
        self.deadline = deadline
        self.arrived = arrived  # when it was asked for (what an auto-batch lingers from)
        self.waiter = waiter
        self.span = span
        self.state = QUEUED
        self.tries = 0
        self.avoid: frozenset[int] = _NONE_AVOIDED
        self.route: Route | None = None
        self.link: Any = None
        self.command = ""
        self.data: bytes | None = None
        self.trace_ids: list[int] | None = None
        self.maybe_stored = False
        self.overtaken = False
        self.failure: BaseException | None = None
        self.lane: Lane | None = None
        self.seq = 0
        self.results: list[PublishResult] | None = None
        self.error: BaseException | None = None
        self.watched = False  # its deadline is in the flow's heap
        self.batch: Batch | None = None  # its last try went in this batch

    @property
    def done(self) -> bool:
        return self.state == DONE

    def __repr__(self) -> str:
        states = ("queued", "sent", "refused", "lost", "zombie", "done")
        return (
            f"<Publish {self.request.command} {self.request.topic} seq={self.seq} "
            f"tries={self.tries} {states[self.state]}>"
        )


class Batch:
    """Publishes sent as one MPUB (auto-batching, ``linger``): what the driver writes
    (``link``, ``command``, ``data``) and nsqd answers once, for all its ``members``, in
    order. ``lane``: the partition's lane they come from (None: unkeyed publishes)."""

    __slots__ = (
        "command",
        "data",
        "lane",
        "link",
        "members",
        "request",
        "results",
        "route",
        "trace_ids",
    )

    def __init__(
        self,
        members: list[Publish],
        request: PublishRequest,
        lane: Lane | None,
        route: Route,
        link: Any,
    ) -> None:
        self.members = members
        self.request = request  # the MPUB of their bodies
        self.lane = lane
        self.route = route
        self.link = link
        self.command = ""
        self.data: bytes | None = None
        self.trace_ids: list[int] | None = None
        self.results = None  # a batch's results are its members'

    def __repr__(self) -> str:
        return f"<Batch {self.command} {self.request.topic} of {len(self.members)}>"


class Pool:
    """Unkeyed plain publishes of one topic waiting for company (auto-batching,
    ``linger``): their bodies, trace ids (``traced``: the trace switch traced them; plain
    ones do not join them) and waiters, until they leave as one publish at ``linger_at``
    (or sooner: full, or a deadline before it). ``deadline``: the earliest of theirs."""

    __slots__ = (
        "bodies",
        "deadline",
        "linger_at",
        "retry_at",
        "size",
        "topic",
        "trace_ids",
        "traced",
        "waiters",
    )

    def __init__(self, topic: str, traced: bool, linger_at: float) -> None:
        self.topic = topic
        self.traced = traced
        self.bodies: list[bytes] = []
        self.trace_ids: list[int] = []
        self.waiters: list[Any] = []
        self.size = BATCH_OVERHEAD
        self.linger_at = linger_at
        self.deadline = float("inf")
        self.retry_at = 0.0  # a pool never backs off (a timer's entry reads it)

    def __repr__(self) -> str:
        return f"<Pool {self.topic} of {len(self.bodies)}>"


class Waiters:
    """The waiters of the messages of one pooled publish, answered together as a waiter
    is: each with a list of its own result, or with the publish's error (a waiter already
    done, its caller gone, is passed over)."""

    __slots__ = ("answered", "waiters")

    def __init__(self, waiters: list[Any]) -> None:
        self.waiters = waiters
        self.answered = False

    def done(self) -> bool:
        return self.answered

    def set_result(self, results: list[PublishResult]) -> None:
        self.answered = True
        for waiter, result in zip(self.waiters, results, strict=True):
            if not waiter.done():
                waiter.set_result([result])

    def set_exception(self, error: BaseException) -> None:
        self.answered = True
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_exception(error)


class Lane:
    """The publishes of one partition (``target``: its number, or the classic nsqd's
    address), in call order: ``queue[:sending]`` were written on ``link`` and are not
    settled (in flight, refused, lost, zombies), the rest wait their turn. An unkeyed
    publish that has to wait gets a lane of its own (``movable``)."""

    __slots__ = (
        "failing_since",
        "failures",
        "in_flight",
        "linger_at",
        "link",
        "movable",
        "next_seq",
        "queue",
        "recovering",
        "retry_at",
        "route",
        "sending",
        "stale",
        "target",
        "topic",
        "waiting_key",
    )

    def __init__(self, topic: str, target: int | str | None, movable: bool = False) -> None:
        self.topic = topic
        self.target = target
        self.movable = movable
        self.queue: deque[Publish] = deque()
        self.sending = 0
        self.in_flight = 0
        self.link: Any = None
        self.route: Route | None = None
        self.recovering = False
        self.failures = 0
        self.failing_since: float | None = None
        self.retry_at = 0.0  # no send before (a backoff)
        self.linger_at = 0.0  # an auto-batch waits for company until then
        self.stale: Any = NO_LAYOUT  # waits (until retry_at) for a layout other than this
        self.waiting_key: Key | None = None  # waits for a link of this key
        self.next_seq = 1

    @property
    def idle(self) -> bool:
        return not self.queue and not self.in_flight

    def __repr__(self) -> str:
        return (
            f"<Lane {self.topic}/{self.target} queued={len(self.queue)} "
            f"sending={self.sending} in_flight={self.in_flight}>"
        )


class Steps:
    """What the driver does after an event, in this order: write each of ``sends`` (a
    publish whose ``link``, ``command`` and ``data`` say what and where; the driver clears
    ``data`` once written); open a link for each of ``connect``; look up each of ``lookup``;
    count each of ``retrying`` (publish, its last failure, its partition) as tried again;
    answer the waiter of each of ``done`` (``results`` or ``error``); log ``notes``
    ((level, message, args)). ``more``: call :meth:`PublishFlow.resume` on the driver's loop
    soon (sends held for the next turn, or decided in another thread).

    Each list is made when something goes in it (an event that decides little allocates
    little); until then it reads as an empty tuple, the class's (no ``__slots__``: a Steps
    is made per event, and most events set nothing)."""

    sends: list[Publish | Batch] | tuple[()] = ()
    done: list[Publish] | tuple[()] = ()
    connect: list[Key] | tuple[()] = ()
    lookup: list[str] | tuple[()] = ()
    notes: list[tuple[int, str, tuple[Any, ...]]] | tuple[()] = ()
    retrying: list[tuple[Publish, BaseException, int | None]] | tuple[()] = ()
    more = False
    #: Something to do (any of the above): what a driver looks at first.
    busy = False

    def send(self, p: Publish | Batch) -> None:
        self.busy = True
        if self.sends:
            self.sends.append(p)
        else:
            self.sends = [p]

    def over(self, p: Publish) -> None:
        self.busy = True
        if self.done:
            self.done.append(p)
        else:
            self.done = [p]

    def open(self, key: Key) -> None:
        self.busy = True
        self.connect = [*self.connect, key]

    def look_up(self, topic: str) -> None:
        self.busy = True
        self.lookup = [*self.lookup, topic]

    def note(self, level: int, message: str, args: tuple[Any, ...]) -> None:
        self.busy = True
        self.notes = [*self.notes, (level, message, args)]

    def retry(self, p: Publish, failure: BaseException, partition: int | None) -> None:
        self.busy = True
        self.retrying = [*self.retrying, (p, failure, partition)]

    def absorb(self, other: Steps) -> None:
        """``other``'s steps too, after these."""
        if other.busy:
            self.busy = True
            for name in ("sends", "done", "connect", "lookup", "notes", "retrying"):
                theirs = getattr(other, name)
                if theirs:
                    setattr(self, name, [*getattr(self, name), *theirs])
            self.more = self.more or other.more

    def later(self) -> None:
        """Ask for :meth:`PublishFlow.resume` on the driver's loop."""
        self.busy = True
        self.more = True


#: What an event that decided nothing returns (never changed).
NO_STEPS = Steps()
