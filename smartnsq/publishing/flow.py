"""The publish flow: every decision about a producer's publishes, in one place, returned and
never performed (pure: no asyncio, no sockets, no clock; the time comes in with each event).

A driver (the asyncio :class:`~smartnsq.producer.sender.Sender`, the blocking publisher of
``smartnsq.sync``) tells the flow what happened (a publish asked for, a try written, nsqd's
answer, a lost connection, a new layout, the time) and carries out the :class:`Steps` it
returns: the bytes to write on which link, the publishes that are over (with their results
or error), the connections to open, the topics to look up, what to log. httpx's
``auth_flow`` (one generator driven by its sync and its async client) and aiokafka's split of
the API class, its ``Sender`` and its accumulator are the models.

**Order.** Every publish bound to a partition (a sharding key, an explicit partition; on
classic nsqd, the nsqd its key maps to) joins that partition's :class:`Lane` in the order
``publish()`` was called, and the lane sends in that order:

* in the good case it pipelines: each publish is written as soon as it is asked for, on the
  lane's one link (nsqd handles one connection's commands in order), up to
  :data:`LANE_DEPTH` unanswered;
* when a try fails (a lost connection, a timeout, a refusal), nothing behind it is sent
  until the tries in flight are settled; then the failed ones go again, in call order, one
  at a time until one is acknowledged (a lane *recovering*), and the lane pipelines again;
* a publish nsqd refused (an error answer: nothing stored) is sent again only if nothing
  sent after it on its link was stored or may have been: if something was, it fails
  (:class:`~smartnsq.errors.PublishError`) rather than being stored after a later publish.
  nsqd refuses without closing the connection and may take the next command (a partition
  turning writable between two commands); a client cannot undo that, only not make it worse;
* a try the deadline ended while in flight stays in its lane as a *zombie* until its link
  answers or fails: nothing behind it goes on another link before then.

Unkeyed publishes have no order to keep: each goes alone, round-robin over the writable
partitions, and a failed one tries another partition first.

**Deadlines.** Every publish ends by its deadline, whatever it waits for (a lookup, a
connection, its turn, an answer): :meth:`PublishFlow.next_deadline` is when the flow must be
told the time (:meth:`PublishFlow.tick`).

**Stamps.** With a producer id, every message of a lane on a youzan ext topic carries its
sequence number (:mod:`smartnsq.publishing.stamps`), the same on every try, with the floor
below which the lane has settled everything: what lets an ordered consumer drop a message
stored twice, or stored after the producer gave up on it.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from smartnsq.errors import (
    NoWritablePartitionError,
    NSQError,
    NSQTimeoutError,
    PublishError,
    ServerError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.flow.logthrottle import LogThrottle
from smartnsq.flow.retry import Stops
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.publishing.lanes import (
    BATCH_OVERHEAD,
    DONE,
    LOST,
    NO_LAYOUT,
    NO_STEPS,
    PER_MESSAGE,
    PER_TRACE_ID,
    QUEUED,
    REFUSED,
    SENT,
    ZOMBIE,
    Batch,
    Delays,
    Key,
    Lane,
    Pool,
    Publish,
    Steps,
    Waiters,
)
from smartnsq.publishing.request import NO_KEY, PublishRequest, batch_request, single_request
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import ANY_TOPIC, Route, Router, classic_routes
from smartnsq.publishing.stamps import Stamp
from smartnsq.publishing.stats import ProducerStats
from smartnsq.publishing.wire import PublishCodec

__all__ = [
    "DONE",
    "LANE_DEPTH",
    "NO_STEPS",
    "PER_TURN",
    "QUEUED",
    "SENT",
    "WARN_AFTER",
    "ZOMBIE",
    "Batch",
    "Delays",
    "Lane",
    "Pool",
    "Publish",
    "PublishFlow",
    "Steps",
]

#: Tries of one lane written and not answered at most: a link that goes silent holds no
#: more than this many in doubt (the rest wait in memory, where they cost less and cannot
#: be stored twice).
LANE_DEPTH = 256
#: Publishes sent per turn of the driver's loop by anything but ``submit`` (a heal, a new
#: layout, a timer): thousands released at once leave over several turns, so the loop keeps
#: answering everything else (a try is routed, encoded and written in 10-30 µs).
PER_TURN = 256
#: A publish failing for this long is worth a warning; a publish with nowhere to go looks
#: again this often (a leader move takes less).
WARN_AFTER = 5.0
# What auto-batching joins into one MPUB: plain PUBs, and PUB_TRACEs traced by the trace
# switch (their receipts are the batch's); never the two together.
_ALONE, _PLAIN, _TRACED = 0, 1, 2


class _LinkInfo:
    __slots__ = ("key", "paused", "youzan")

    def __init__(self, key: Key, youzan: bool) -> None:
        self.key = key
        self.youzan = youzan
        self.paused = False


class PublishFlow:
    """The decisions of one producer's publishes (see the module's text).

    ``layouts(topic)``: the cached write layout of a topic (None when unknown); None in
    direct mode (``Producer(nsqd=...)``), where the router's direct routes are all there
    is. ``delays``: the backoff between a lane's tries; ``max_retries``: a publish's tries
    after its first, at most (None: its deadline only); ``stop``: what else ends a publish
    after a failed try (a user's tenacity stop; None: nothing). ``producer_id``: stamps on ext
    topics (None: none). ``links_per_key``: how many links an unkeyed publish spreads over
    (``connections_per_partition``). ``verbose``: a debug note per retry. ``linger``
    (auto-batching; None: off): how long a plain publish waits for others of its partition
    (or, unkeyed, of its topic) to leave with as one MPUB of at most ``max_batch``.
    """

    def __init__(
        self,
        router: Router,
        codec: PublishCodec,
        *,
        layouts: Callable[[str], TopicLayout | None] | None,
        delays: Delays,
        max_retries: int | None = None,
        stop: Stops | None = None,
        request_timeout: float = 10.0,
        producer_id: str | None = None,
        links_per_key: int = 1,
        verbose: bool = False,
        lane_depth: int = LANE_DEPTH,
        per_turn: int = PER_TURN,
        linger: float | None = None,
        max_batch: int = 100,
    ) -> None:
        self._router = router
        self._codec = codec
        self._layouts = layouts
        self._delays = delays
        self._max_retries = max_retries
        self._stop = stop
        self._request_timeout = request_timeout
        self.producer_id = producer_id
        self._links_per_key = links_per_key
        self.verbose = verbose
        self._depth = lane_depth
        self._per_turn = per_turn
        self._budget = per_turn
        self._linger = linger
        self._max_batch = max_batch
        self._pools: dict[str, Pool] = {}  # unkeyed publishes waiting for company, per topic
        self._pooled = 0  # the messages in them
        self._flushing = False  # the producer closes: nothing lingers any more
        self.stats = ProducerStats()
        self._now = 0.0
        self._throttle = LogThrottle(clock=lambda: self._now)
        self._lanes: dict[tuple[str, int | str], Lane] = {}
        self._unplaced: dict[str, deque[Publish]] = {}  # bound publishes waiting for a layout
        self._layout_waiters: dict[str, dict[Lane, None]] = {}
        self._topic_errors: dict[str, BaseException] = {}  # why a topic has no layout yet
        self._links: dict[Key, list[Any]] = {}
        self._link_info: dict[Any, _LinkInfo] = {}
        self._connecting: set[Key] = set()
        self._link_waiters: dict[Key, dict[Lane, None]] = {}
        self._spread: dict[Key, int] = {}  # round-robin over a key's links (unkeyed)
        self._deadlines: list[tuple[float, int, Publish]] = []
        self._timers: list[tuple[float, int, Lane | Pool]] = []
        self._order = itertools.count()
        self._pending = 0  # publishes not over, whose deadline the heap may hold
        self._dirty: dict[Lane, None] = {}  # lanes to pump on the driver's loop
        self._closed: BaseException | None = None
        #: Unbound publishes answered in a driver's thread without its lock
        #: (:meth:`answered_alone`), to be counted by :meth:`count_alone` under it: an
        #: append to a deque is thread-safe, an update of the counters is not.
        self.alone: deque[Publish] = deque()
        self._alone_counted = 0
        #: Set when :meth:`next_deadline` may have changed (the driver re-arms its timer
        #: and clears it).
        self.wake_changed = False

    # ------------------------------------------------------------------ events

    def submit(
        self,
        request: PublishRequest,
        now: float,
        deadline: float,
        waiter: Any = None,
        span: Any = None,
        via: Any = None,
    ) -> tuple[Publish, Steps]:
        """A publish asked for, to end by ``deadline``. When its own try leaves at once (the
        common case), it is set on it (``p.link``, ``p.command``, ``p.data``): the driver
        writes ``steps.sends``, then it. ``via``: the calling thread's own link (the blocking
        driver), which the publish may take when its lane is idle: then ``p.link`` is ``via``
        and ``p`` is in flight, the calling thread's to write (see :meth:`encode_here`)."""
        self._now = now
        p = Publish(request, deadline, waiter, span, now)
        self._pending += 1
        # Read once: a named tuple's field read by name is a lookup CPython 3.11 does not
        # specialize.
        movable = request.partition is None and request.key is NO_KEY
        layouts = self._layouts
        if layouts is None and movable and self._closed is None and deadline > now:
            if via is not None:
                routes = self._router.direct_routes
                if len(routes) == 1 and request.address is None:
                    # The blocking driver's common case: what _start_movable and
                    # _send_here decide for it, inline (a call costs as much as this).
                    p.tries = 1
                    p.state = SENT
                    p.route = routes[0]
                    p.link = via
                    return p, NO_STEPS
            return p, self._start_movable(p, now, via)  # direct mode, unkeyed
        steps = Steps()
        if self._closed is not None:
            self._finish(p, self._closed, steps)
            return p, steps
        if deadline <= now:
            self._watch(p)
            self._expire(p, steps)
            return p, steps
        layout = None
        if layouts is not None:
            topic = request.topic
            if self._unplaced.get(topic) or (layout := layouts(topic)) is None:
                self._wait_for_placing(p, topic, steps)  # in call order
                return p, steps
        if movable:  # unbound
            return p, self._start_movable(p, now, via, layout)
        lane = self._place(p, now, steps)
        if lane is None:
            return p, steps
        if via is not None:
            if lane.queue[0] is p and not lane.in_flight and lane.retry_at <= now:
                route = self._lane_route(lane, now, steps)
                if route is not None and lane.queue and lane.queue[0] is p:
                    self._send_here(p, lane, route, via)
                    return p, steps
            self._watch(p)
            self._defer(lane, steps)
            return p, steps
        # Alone in an idle lane (the common case), it leaves now; behind a backlog, the
        # turn's budget applies (a heal must not leave all at once).
        alone = lane.sending == len(lane.queue) - 1 and lane not in self._dirty
        self._pump(lane, now, steps, budgeted=not alone, own=p)
        if p.state == QUEUED:
            self._watch(p)
        return p, steps

    def encode_here(self, p: Publish, youzan: bool) -> tuple[str, bytes]:
        """The bytes of the try a ``via`` submit left to the calling thread, for its link
        (``youzan``: its server is a youzan nsqd). What the server cannot take raises here,
        before anything is sent: then :meth:`unsent`. It reads and writes only ``p``
        (which the calling thread alone holds until it reports the try), its lane's first
        publish (``p`` itself, or one before it that nothing can take out meanwhile) and
        the codec's caches: a driver may call it without taking its lock."""
        route = p.route
        if route is None:  # pragma: no cover - set by submit
            raise ValidationError("route", "the publish was not routed")
        command, data, trace_ids = self._codec.prepare(
            p.request, route, route.youzan or youzan, p.span, self._stamp(p) if p.seq else None
        )
        p.trace_ids = trace_ids
        return command, data

    def answered(self, p: Publish | Batch, frame: bytes, now: float, pump: bool = True) -> Steps:
        """nsqd answered ``p``'s try with ``frame`` (OK, or a trace receipt): it is stored,
        and ``p`` is over with ``p.results`` (its waiter is the driver's to answer: it is
        not in ``steps.done``; a batch's members are). ``pump`` False: called off the
        driver's loop (a blocking thread), whose lanes the loop pumps (``steps.more``)."""
        if isinstance(p, Batch):
            return self._batch_answered(p, frame, now, pump)
        state = p.state
        if state == SENT:
            results = self._codec.results(p.request, p.route, frame, p.tries, p.trace_ids)  # type: ignore[arg-type]
            self.stats.acknowledged(p.request.bodies, results)
            p.results = results
            p.state = DONE
            self._pending -= 1
            lane = p.lane
            if lane is None:
                return NO_STEPS  # an unkeyed publish's first try: nothing else follows
            lane.failures = 0
            lane.failing_since = None
        elif state == ZOMBIE:
            p.state = DONE  # stored after its caller was told it may have been
            lane = p.lane
            if lane is None:
                return NO_STEPS
        else:
            return NO_STEPS
        self._now = now
        steps = Steps()
        lane.in_flight -= 1
        self._unlink(lane, p, stored=True)
        self._after_answer(lane, now, steps, pump)
        return steps

    def answered_alone(self, p: Publish, frame: bytes) -> list[PublishResult] | None:
        """nsqd answered the try of ``p``, an unbound publish a ``via`` submit left to the
        calling thread (no lane: nothing else in the flow waits for it or can end it), with
        ``frame``: its results, set on it. A driver may call it without taking its lock: it
        writes only ``p``, which the calling thread alone holds, the codec's caches, and a
        deque (thread-safe appends) from which the next :meth:`count_alone` counts it.
        None: ``p`` has a lane, or is not in flight (:meth:`answered` decides then)."""
        if p.lane is not None or p.state != SENT:
            return None
        results = self._codec.results(p.request, p.route, frame, p.tries, p.trace_ids)  # type: ignore[arg-type]
        p.results = results
        p.state = DONE
        self.alone.append(p)
        return results

    def count_alone(self) -> None:
        """Count what :meth:`answered_alone` answered since the last call (under the
        driver's lock, before anything reads the counters)."""
        alone = self.alone
        stats = self.stats
        while alone:
            p = alone.popleft()
            self._pending -= 1
            self._alone_counted += 1
            stats.acknowledged(p.request.bodies, p.results)  # type: ignore[arg-type]

    def _batch_answered(self, batch: Batch, frame: bytes, now: float, pump: bool) -> Steps:
        """nsqd stored ``batch``: each member still in it is over with its result."""
        self._now = now
        steps = Steps()
        results = self._codec.results(batch.request, batch.route, frame, 1, batch.trace_ids)
        lane = batch.lane
        bodies: list[bytes] = []
        stored: list[Any] = []
        for member, result in zip(batch.members, results, strict=True):
            if member.batch is not batch:
                continue
            if member.state == SENT:
                if member.tries != 1:
                    result = dataclasses.replace(result, tries=member.tries)
                member.results = [result]
                member.state = DONE
                self._pending -= 1
                steps.over(member)
                bodies.append(member.request.bodies[0])
                stored.append(result)
            elif member.state == ZOMBIE:
                member.state = DONE  # stored after its caller was told it may have been
            else:
                continue
            if lane is not None:
                lane.in_flight -= 1
                self._unlink(lane, member, stored=True)
        if stored:
            self.stats.acknowledged(bodies, stored)
        if lane is not None:
            lane.failures = 0
            lane.failing_since = None
            self._after_answer(lane, now, steps, pump)
        return steps

    def refused(
        self, p: Publish | Batch, error: BaseException, now: float, pump: bool = True
    ) -> Steps:
        """nsqd answered ``p``'s try with ``error`` (an error frame): nothing was stored
        (of a batch: none of it)."""
        self._now = now
        steps = Steps()
        if isinstance(p, Batch):
            for member in p.members:
                if member.batch is p:
                    self._refuse(member, error, now, steps, pump)
        else:
            self._refuse(p, error, now, steps, pump)
        return steps

    def _refuse(
        self, p: Publish, error: BaseException, now: float, steps: Steps, pump: bool
    ) -> None:
        state = p.state
        if state != SENT and state != ZOMBIE:
            return
        lane = p.lane
        p.failure = error
        if lane is not None:
            lane.in_flight -= 1
        self._try_failed(p, state, REFUSED, error, now, steps, pump)

    def lost(
        self,
        p: Publish | Batch,
        error: BaseException,
        now: float,
        written: bool = True,
        pump: bool = True,
    ) -> Steps:
        """``p``'s try ended without an answer (its connection closed, its link timed
        out, or it could not be written: ``written`` False, when nothing of it left)."""
        self._now = now
        steps = Steps()
        if isinstance(p, Batch):
            for member in p.members:
                if member.batch is p:
                    self._lose(member, error, now, written, steps, pump)
        else:
            self._lose(p, error, now, written, steps, pump)
        return steps

    def _lose(
        self,
        p: Publish,
        error: BaseException,
        now: float,
        written: bool,
        steps: Steps,
        pump: bool,
    ) -> None:
        state = p.state
        if state != SENT and state != ZOMBIE:
            return
        lane = p.lane
        if written:
            p.maybe_stored = True
        p.failure = error
        if lane is not None:
            lane.in_flight -= 1
            if written:
                for other in lane.queue:
                    if other is p:
                        break
                    if other.state == REFUSED:
                        other.overtaken = True  # p may have been stored after it
        self._try_failed(p, state, LOST, error, now, steps, pump)

    def _try_failed(
        self,
        p: Publish,
        state: int,
        failed: int,
        error: BaseException,
        now: float,
        steps: Steps,
        pump: bool,
    ) -> None:
        """A try of ``p`` (in ``state``, SENT or ZOMBIE) ended with ``error``: a zombie is
        over, a fatal error ends ``p``, an unkeyed publish moves on, and a lane's try is
        marked ``failed`` (REFUSED or LOST) to go again in order once nothing is in flight."""
        lane = p.lane
        if self._closed is not None:
            error = self._closed  # nothing is tried again
        if state == ZOMBIE:
            p.state = DONE
            if lane is not None:
                self._unlink(lane, p)
        elif not _retriable(error):
            if lane is not None:
                self._unlink(lane, p)
            self._finish(p, error, steps)
        elif lane is None:
            self._retry_movable(p, now, steps)
            return
        else:
            p.state = failed
            lane.recovering = True
        if lane is not None:
            self._after_answer(lane, now, steps, pump)

    def unsent(self, p: Publish, error: BaseException, now: float, pump: bool = True) -> Steps:
        """A ``via`` try was refused before anything was sent (:meth:`encode_here`
        raised what its server cannot take): the publish is over, with that error."""
        self._now = now
        steps = Steps()
        if p.state != SENT:
            return steps
        p.tries -= 1  # no try was made
        lane = p.lane
        if lane is not None:
            lane.in_flight -= 1
            self._unlink(lane, p)
        self._finish(p, error, steps)
        if lane is not None:
            self._after_answer(lane, now, steps, pump)
        return steps

    def cancel(self, p: Publish, now: float) -> Steps:
        """The caller stopped waiting for ``p`` (its task was cancelled). A publish never
        sent is taken out (it is as if never asked for); one in flight goes on as a
        zombie (its link still carries it); one waiting to be sent again is dropped."""
        self._now = now
        steps = Steps()
        state = p.state
        if state in (DONE, ZOMBIE):
            return steps
        p.waiter = None
        lane = p.lane
        if state == SENT:
            p.state = ZOMBIE
            self._pending -= 1
            return steps
        self._done(p, steps)
        if lane is not None:
            self._unlink(lane, p)
            self._pump(lane, now, steps, budgeted=True)
            self._forget_if_empty(lane)
        else:
            self._unplace(p)
        return steps

    def pool(
        self,
        topic: str,
        body: bytes,
        trace_id: int | None,
        now: float,
        deadline: float,
        waiter: Any,
    ) -> Steps:
        """An unkeyed plain publish with ``linger`` (a PUB; with ``trace_id``, a PUB_TRACE
        the trace switch traced): it waits in its topic's pool for others, and they leave as
        one publish (an MPUB) once the pool is full (``max_batch``, the frame's bytes), when
        the first has lingered, or at once for one whose deadline would come first. Its
        ``waiter`` gets a list of its one result, or the error of the publish it went in
        (which ends by the earliest deadline of its messages)."""
        self._now = now
        pools = self._pools
        pool = pools.get(topic)
        traced = trace_id is not None
        needed = PER_MESSAGE + len(body) + (PER_TRACE_ID if traced else 0)
        steps = NO_STEPS
        if pool is not None and (
            pool.traced is not traced or pool.size + needed > self._codec.max_body_size
        ):
            steps = Steps()
            self._flush_pool(pool, now, steps)  # plain and traced do not mix; or it is full
            pool = None
        if pool is None:
            pool = pools[topic] = Pool(topic, traced, now + self._linger)  # type: ignore[operator]
            heapq.heappush(self._timers, (pool.linger_at, next(self._order), pool))
            self.wake_changed = True
        bodies = pool.bodies
        bodies.append(body)
        pool.waiters.append(waiter)
        if traced:
            pool.trace_ids.append(trace_id)  # type: ignore[arg-type]
        pool.size += needed
        self._pooled += 1
        if deadline < pool.deadline:
            pool.deadline = deadline
        if len(bodies) >= self._max_batch or deadline <= pool.linger_at or self._flushing:
            if steps is NO_STEPS:
                steps = Steps()
            self._flush_pool(pool, now, steps)
        return steps

    def unpool(self, topic: str, waiter: Any) -> None:
        """The caller of a pooled publish stopped waiting (its task was cancelled): if its
        pool has not left, its message is taken out."""
        pool = self._pools.get(topic)
        if pool is None:
            return
        for index, each in enumerate(pool.waiters):
            if each is waiter:
                body = pool.bodies.pop(index)
                del pool.waiters[index]
                pool.size -= PER_MESSAGE + len(body)
                if pool.traced:
                    del pool.trace_ids[index]
                    pool.size -= PER_TRACE_ID
                self._pooled -= 1
                if not pool.bodies:
                    del self._pools[topic]
                    pool.linger_at = -1.0  # its timer is stale
                return

    def tick(self, now: float) -> Steps:
        """The time is ``now`` (at or after :meth:`next_deadline`): publishes whose deadline
        passed end, lanes whose backoff is over go on."""
        self._now = now
        steps = Steps()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            p = heapq.heappop(deadlines)[2]
            p.watched = False
            if p.state != DONE and p.state != ZOMBIE:
                self._expire(p, steps)
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, timed = heapq.heappop(timers)
            if isinstance(timed, Pool):
                if timed.linger_at == at:
                    self._flush_pool(timed, now, steps)
                continue
            lane = timed
            if lane.retry_at == at:
                lane.retry_at = 0.0
                self._stop_waiting_layout(lane)
                self._pump(lane, now, steps, budgeted=True)
            elif lane.linger_at == at:
                lane.linger_at = 0.0
                self._pump(lane, now, steps, budgeted=True)
            # else: rescheduled since
        return steps

    def flush(self, now: float) -> Steps:
        """The producer closes: what waits for company (auto-batching) leaves now, and
        nothing lingers from now on."""
        self._now = now
        self._flushing = True
        steps = Steps()
        for pool in list(self._pools.values()):
            self._flush_pool(pool, now, steps)
        for lane in list(self._lanes.values()):
            if lane.linger_at:
                lane.linger_at = 0.0
                self._pump(lane, now, steps, budgeted=False)
        return steps

    def resume(self, now: float) -> Steps:
        """A new turn of the driver's loop: the lanes held back (the turn's budget ran out,
        or another thread settled them) go on."""
        self._now = now
        self._budget = self._per_turn
        steps = Steps()
        dirty, self._dirty = self._dirty, {}
        for lane in dirty:
            self._pump(lane, now, steps, budgeted=True)
        return steps

    def layout_changed(self, topic: str, now: float) -> Steps:
        """A lookup of ``topic`` answered (its layout, through ``layouts``, may be new): the
        publishes that waited for one are placed, and the lanes that waited for a new one go
        on where it names somewhere to go."""
        self._now = now
        steps = Steps()
        self._topic_errors.pop(topic, None)
        layout = self._layouts(topic) if self._layouts is not None else None
        unplaced = self._unplaced.pop(topic, None)
        if unplaced and layout is not None:
            touched: dict[Lane, None] = {}
            while unplaced:
                p = unplaced.popleft()
                if p.state == DONE:
                    continue
                if p.request.movable:
                    started = self._start_movable(p, now, None)
                    if p.data is not None:
                        steps.send(p)  # its own try, not a submit's: the driver's to write
                    steps.absorb(started)
                    continue
                lane = self._place(p, now, steps)
                if lane is not None:
                    touched[lane] = None
                elif p.state != DONE:
                    # Still no partition for it: it waits on, and those after it behind it.
                    self._unplaced[topic].extend(unplaced)
                    break
            for lane in touched:
                self._pump(lane, now, steps, budgeted=True)
        elif unplaced:
            self._unplaced[topic] = unplaced
        waiters = self._layout_waiters.get(topic)
        if waiters and layout is not None:
            for lane in list(waiters):
                if lane.stale is not layout and self._routable(lane, layout):
                    self._stop_waiting_layout(lane)
                    lane.retry_at = 0.0
                    self._pump(lane, now, steps, budgeted=True)
        return steps

    def layout_failed(self, topic: str, error: BaseException, now: float) -> Steps:
        """A lookup of ``topic`` failed with ``error``. What cannot be retried (a topic
        nsqlookupd does not know, an address that is no nsqlookupd) ends the publishes that
        never had a layout; anything else is the cause they give if their time runs out."""
        self._now = now
        steps = Steps()
        self._topic_errors[topic] = error
        if _retriable(error):
            return steps
        unplaced = self._unplaced.pop(topic, None)
        while unplaced:
            self._finish(unplaced.popleft(), error, steps)
        return steps

    def link_up(self, key: Key, link: Any, youzan: bool, now: float) -> Steps:
        """A link (a connection) for ``key`` is open; ``youzan``: its server is a youzan
        nsqd. The lanes that waited for it go on."""
        self._now = now
        steps = Steps()
        self._connecting.discard(key)
        self._link_info[link] = _LinkInfo(key, youzan)
        self._links.setdefault(key, []).append(link)
        for lane in self._link_waiters.pop(key, {}):
            lane.waiting_key = None
            self._pump(lane, now, steps, budgeted=True)
        return steps

    def link_failed(self, key: Key, error: BaseException, now: float) -> Steps:
        """Opening a link for ``key`` failed with ``error``: for each lane that waited for
        it, its first publish's try failed before anything was sent."""
        self._now = now
        steps = Steps()
        self._connecting.discard(key)
        for lane in self._link_waiters.pop(key, {}):
            lane.waiting_key = None
            if not lane.queue:
                continue
            head = lane.queue[0]
            self._tried(head)
            head.failure = error
            route = lane.route
            if lane.movable and route is not None and route.partition is not None:
                head.avoid = head.avoid | {route.partition}
            if not _retriable(error):
                # What no retry fixes (authentication, an address that is no nsqd) ends
                # every publish waiting for that link.
                while lane.queue:
                    self._finish(lane.queue.popleft(), error, steps)
                lane.sending = 0
                continue
            bound = self._stopped(head)
            if bound is not None:
                lane.queue.popleft()
                self._give_up(head, bound, steps)
            else:
                steps.retry(head, error, _partition(head))
            lane.recovering = True
            if lane.queue:  # the wait spaces tries: none is left after a give-up
                self._schedule(lane, error, now, steps)
        return steps

    def link_down(self, link: Any) -> None:
        """A link closed: the tries in flight on it end through :meth:`lost`."""
        info = self._link_info.pop(link, None)
        if info is not None:
            links = self._links.get(info.key)
            if links is not None and link in links:
                links.remove(link)
                if not links:
                    del self._links[info.key]

    def link_paused(self, link: Any) -> None:
        """``link``'s server reads slower than the lanes write: they wait for it."""
        info = self._link_info.get(link)
        if info is not None:
            info.paused = True

    def link_resumed(self, link: Any, now: float) -> Steps:
        """``link`` takes writes again."""
        self._now = now
        steps = Steps()
        info = self._link_info.get(link)
        if info is not None:
            info.paused = False
            for lane in self._link_waiters.pop(info.key, {}):
                lane.waiting_key = None
                self._pump(lane, now, steps, budgeted=True)
        return steps

    def close(self, error: BaseException) -> Steps:
        """The producer closes: every publish not over ends with ``error`` (whatever nsqd
        did with those in flight)."""
        steps = Steps()
        self._closed = error
        self._flushing = True
        for lane in self._lanes.values():
            self._close_lane(lane, error, steps)
        for waiters in self._layout_waiters.values():
            for lane in waiters:
                if lane.movable:
                    self._close_lane(lane, error, steps)
        for queue in self._unplaced.values():
            while queue:
                self._finish(queue.popleft(), error, steps)
        for pool in list(self._pools.values()):
            self._flush_pool(pool, 0.0, steps)  # made a publish, ended with the error
        for _, _, p in self._deadlines:
            if p.state != DONE and p.state != ZOMBIE:
                self._finish(p, error, steps)
        self._unplaced.clear()
        self._layout_waiters.clear()
        self._link_waiters.clear()
        self._deadlines.clear()
        self._timers.clear()
        return steps

    # ------------------------------------------------------------------ questions

    def next_deadline(self) -> float | None:
        """When the flow must next be told the time (:meth:`tick`); None: never."""
        deadlines, timers = self._deadlines, self._timers
        while deadlines and deadlines[0][2].state in (DONE, ZOMBIE):
            heapq.heappop(deadlines)[2].watched = False
        while timers and timers[0][0] not in (timers[0][2].retry_at, timers[0][2].linger_at):
            heapq.heappop(timers)  # rescheduled, or sent since
        first = deadlines[0][0] if deadlines else None
        if timers and (first is None or timers[0][0] < first):
            return timers[0][0]
        return first

    def wants_layout(self, topic: str) -> bool:
        """Whether publishes of ``topic`` wait for a (new) layout: keep looking it up."""
        return bool(self._unplaced.get(topic)) or bool(self._layout_waiters.get(topic))

    def useful(self, topic: str, layout: TopicLayout) -> bool:
        """Whether ``layout`` would move something waiting for ``topic`` (a lookup's
        answer worth stopping a wait for)."""
        if self._unplaced.get(topic):
            return True
        return any(
            lane.stale is not layout and self._routable(lane, layout)
            for lane in self._layout_waiters.get(topic, ())
        )

    @property
    def pending(self) -> int:
        """Publishes not over (each message waiting in a pool counted as one)."""
        return self._pending + self._pooled - len(self.alone)

    @property
    def alone_answered(self) -> int:
        """Publishes :meth:`answered_alone` answered so far."""
        return self._alone_counted + len(self.alone)

    def lanes(self) -> list[Lane]:
        """The partitions' lanes (for tests and stats)."""
        return list(self._lanes.values())

    # ------------------------------------------------------------------ placing

    def _place(self, p: Publish, now: float, steps: Steps) -> Lane | None:
        """The lane of a bound publish (its number drawn), or None: it waits for a layout
        that gives its partition (queued in call order), or it was refused (over, in
        ``steps.done``)."""
        request = p.request
        topic = request.topic
        layout = self._layouts(topic) if self._layouts is not None else None
        try:
            target = self._router.target(request, layout)
        except NoWritablePartitionError as exc:
            p.failure = exc
            self._wait_for_placing(p, topic, steps)
            return None
        except NSQError as exc:
            self._finish(p, exc, steps)
            return None
        key = (topic, target)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(topic, target)
        p.lane = lane
        p.seq = lane.next_seq
        lane.next_seq += len(request.bodies)
        lane.queue.append(p)
        return lane

    def _wait_for_placing(self, p: Publish, topic: str, steps: Steps) -> None:
        queue = self._unplaced.get(topic)
        if queue is None:
            queue = self._unplaced[topic] = deque()
            steps.look_up(topic)
        queue.append(p)
        self._watch(p)

    def _unplace(self, p: Publish) -> None:
        queue = self._unplaced.get(p.request.topic)
        if queue is not None and p in queue:
            queue.remove(p)

    # ------------------------------------------------------------------ sending

    def _pump(
        self, lane: Lane, now: float, steps: Steps, *, budgeted: bool, own: Publish | None = None
    ) -> None:
        """Send what ``lane`` may send now, in order (``own``: see :meth:`_send`)."""
        queue = lane.queue
        if lane.sending >= len(queue) or lane.retry_at > now or lane.waiting_key is not None:
            return
        if lane.recovering and lane.in_flight:
            return
        if budgeted and self._budget <= 0:
            self._defer(lane, steps)
            return
        route = self._lane_route(lane, now, steps)
        if route is None:
            return
        link = self._link_for(lane, route, steps)
        if link is None:
            return
        if lane.in_flight and lane.link is not link:
            return  # the tries in flight on the old link settle first
        youzan = route.youzan or self._link_info[link].youzan
        lane.link = link
        limit = (1 if lane.recovering else self._depth) - lane.in_flight
        batching = self._linger is not None and not lane.recovering
        while lane.sending < len(queue) and limit > 0:
            if budgeted:
                if self._budget <= 0:
                    self._defer(lane, steps)
                    return
                self._budget -= 1
            p = queue[lane.sending]
            if batching:
                kind = _kind(p.request)
                if kind != _ALONE:
                    start = lane.sending
                    end = self._run_end(queue, start, kind, limit)
                    if (
                        end == len(queue)
                        and end - start < self._max_batch
                        and not self._flushing
                        and p.arrived + self._linger > now  # type: ignore[operator]
                    ):
                        self._linger_lane(lane, p.arrived + self._linger)  # type: ignore[operator]
                        break  # it waits for company
                    if end - start > 1:
                        members = list(itertools.islice(queue, start, end))
                        if self._send_batch(members, lane, route, link, youzan, steps):
                            lane.sending = end
                            lane.in_flight += end - start
                            limit -= end - start
                            continue
            if self._send(p, lane, route, link, youzan, steps, p is own):
                lane.sending += 1
                lane.in_flight += 1
                limit -= 1
        self._forget_if_empty(lane)

    def _run_end(self, queue: deque[Publish], start: int, kind: int, limit: int) -> int:
        """Where the run of publishes from ``start`` that one batch may take ends: of the
        same ``kind``, at most ``max_batch`` and ``limit`` of them, within the frame's
        bytes."""
        size = BATCH_OVERHEAD
        budget = self._codec.max_body_size
        stop = min(len(queue), start + self._max_batch, start + limit)
        traced = kind == _TRACED
        end = start
        while end < stop:
            request = queue[end].request
            if _kind(request) != kind:
                break
            size += _size(request, traced)
            if size > budget:
                break
            end += 1
        return max(end, start + 1)

    def _linger_lane(self, lane: Lane, at: float) -> None:
        if lane.linger_at != at:
            lane.linger_at = at
            heapq.heappush(self._timers, (at, next(self._order), lane))
            self.wake_changed = True

    def _send_batch(
        self,
        members: list[Publish],
        lane: Lane | None,
        route: Route,
        link: Any,
        youzan: bool,
        steps: Steps,
    ) -> bool:
        """``members`` (plain or auto-traced PUBs, in order) go as one MPUB on ``link``
        (False, nothing changed: what the server cannot take as one; they go alone)."""
        first = members[0].request
        traced = first.command == "PUB_TRACE"
        request = batch_request(
            first.topic,
            [m.request.bodies[0] for m in members],
            trace_ids=[m.request.trace_ids[0] for m in members] if traced else None,  # type: ignore[index]
            auto_trace=traced,
        )
        stamp = seqs = None
        if self.producer_id is not None and lane is not None and members[0].seq:
            stamp = Stamp(self.producer_id, members[0].seq, lane.queue[0].seq)
            seqs = [m.seq for m in members]
        try:
            command, data, trace_ids = self._codec.prepare(
                request, route, youzan, None, stamp, seqs
            )
        except (UnsupportedFeatureError, ValidationError, ServerError):
            return False
        batch = Batch(members, request, lane, route, link)
        batch.command = command
        batch.data = data
        batch.trace_ids = trace_ids
        stats = self.stats
        soon = self._now + self._request_timeout
        for p in members:
            if p.tries:
                stats.retries += 1
                if p.maybe_stored:
                    stats.resent_in_doubt += 1
            p.tries += 1
            p.state = SENT
            p.route = route
            p.link = link
            p.batch = batch
            p.trace_ids = None
            if p.deadline < soon:
                self._watch(p)  # its link's own timeout would end it too late
        if lane is not None:
            lane.linger_at = 0.0
        steps.send(batch)
        return True

    def _send(
        self,
        p: Publish,
        lane: Lane | None,
        route: Route,
        link: Any,
        youzan: bool,
        steps: Steps,
        own: bool = False,
    ) -> bool:
        """Encode ``p``'s next try and hand it to ``steps.sends`` (``own``: the publish
        being submitted, whose try the driver writes after them: no list for it); False when
        its server cannot take it (it is over, refused before sending, and out of its
        lane)."""
        refused = self._encode(p, route, link, youzan)
        if refused is not None:
            if lane is not None:
                lane.queue.remove(p)
            self._finish(p, refused, steps)
            return False
        if not own:
            steps.send(p)
        return True

    def _encode(self, p: Publish, route: Route, link: Any, youzan: bool) -> NSQError | None:
        """``p``'s next try on ``route``'s ``link``, set on it (the command and its bytes);
        what its server cannot take is returned (nothing changed then)."""
        try:
            command, data, trace_ids = self._codec.prepare(
                p.request, route, youzan, p.span, self._stamp(p) if p.seq else None
            )
        except (UnsupportedFeatureError, ValidationError, ServerError) as exc:
            return exc
        if p.tries:
            self.stats.retries += 1
            if p.maybe_stored:
                self.stats.resent_in_doubt += len(p.request.bodies)
        p.tries += 1
        p.trace_ids = trace_ids
        p.state = SENT
        p.route = route
        p.link = link
        p.command = command
        p.data = data
        p.batch = None
        if p.deadline - self._now < self._request_timeout:
            self._watch(p)  # its link's own timeout would end it too late
        return None

    def _send_here(self, p: Publish, lane: Lane | None, route: Route, via: Any) -> None:
        """``p`` goes on the calling thread's link ``via`` (encoded and written by it)."""
        if p.tries:
            self.stats.retries += 1
        p.tries += 1
        p.state = SENT
        p.route = route
        p.link = via
        if lane is not None:
            lane.link = via
            lane.sending = 1
            lane.in_flight = 1

    def _stamp(self, p: Publish) -> Stamp | None:
        lane = p.lane
        if self.producer_id is None or not p.seq or lane is None or not lane.queue:
            return None
        return Stamp(self.producer_id, p.seq, lane.queue[0].seq)

    def _lane_route(self, lane: Lane, now: float, steps: Steps) -> Route | None:
        """Where ``lane`` sends now, or None: it waits for a layout (a try that had nowhere
        to go, counted as its first publish's)."""
        head = lane.queue[lane.sending] if lane.sending < len(lane.queue) else lane.queue[0]
        if lane.movable and not head.tries and lane.route is not None:
            return lane.route  # routed when it came, not yet tried
        request = head.request
        try:
            if self._layouts is None:
                if lane.movable:
                    route = self._router.route_classic(request, self._router.direct_routes)
                else:
                    route = classic_routes([lane.target])[0]  # type: ignore[list-item]
            else:
                layout = self._layouts(lane.topic)
                if layout is None:
                    raise NoWritablePartitionError(f"no layout of topic {lane.topic!r} yet")
                if lane.movable:
                    route = self._router.route(request, layout, head.avoid)
                elif isinstance(lane.target, str):
                    route = Route(lane.target, None, False, False, ANY_TOPIC)
                else:
                    route = self._router.route(request, layout, frozenset(), lane.target)
        except NSQError as exc:
            self._unroutable(lane, exc, now, steps)
            return None
        previous = lane.route
        if (
            previous is not None
            and previous.address != route.address
            and route.partition is not None
            and not lane.movable
        ):
            self._note_move(lane, previous, route, steps)
        lane.route = route
        return route

    def _link_for(self, lane: Lane, route: Route, steps: Steps) -> Any:
        """An open, writable link for ``route`` (the lane's own while it has one), or
        None: the lane waits for one (opened, or taking writes again)."""
        key = route.key
        links = self._links.get(key)
        if links:
            if lane.link in links:
                link = lane.link
            elif lane.movable and len(links) > 1:
                turn = self._spread.get(key, 0)
                self._spread[key] = turn + 1
                link = links[turn % len(links)]
            else:
                link = links[0]
            if not self._link_info[link].paused:
                if lane.movable and len(links) < self._links_per_key:
                    self._connect(key, steps)
                return link
        else:
            self._connect(key, steps)
        lane.waiting_key = key
        self._link_waiters.setdefault(key, {})[lane] = None
        return None

    def _connect(self, key: Key, steps: Steps) -> None:
        if key not in self._connecting:
            self._connecting.add(key)
            steps.open(key)

    # ------------------------------------------------------------------ unkeyed

    def _start_movable(
        self, p: Publish, now: float, via: Any, layout: TopicLayout | None = None
    ) -> Steps:
        """An unkeyed publish: sent at once where it can go (:data:`NO_STEPS`: its own
        try, set on it, is all there is to write), else given a lane of its own to wait
        in. ``layout``: its topic's, when the caller has it (else looked up here)."""
        if self._layouts is None:
            routes = self._router.direct_routes
            if not routes:  # pragma: no cover - direct mode has an address at least
                raise ValidationError("nsqd", "no nsqd address")
            if len(routes) == 1 and p.request.address is None:
                # One nsqd, and the publish names neither partition nor key (submit checked):
                # the round-robin can only pick it (a named tuple's field reads and the
                # counter less per publish).
                route = routes[0]
            else:
                route = self._router.route_classic(p.request, routes)
        else:
            if layout is None:
                layout = self._layouts(p.request.topic)
                if layout is None:
                    steps = Steps()
                    self._wait_for_placing(p, p.request.topic, steps)
                    return steps
            try:
                route = self._router.route_movable(p.request, layout)
            except NoWritablePartitionError:
                # No writable partition now (what routable() would have said, asked
                # apart): a try with nowhere to go, counted.
                steps = Steps()
                self._wait_movable(p, now, steps)
                return steps
            except NSQError as exc:
                steps = Steps()
                self._finish(p, exc, steps)
                return steps
        if via is not None:
            self._send_here(p, None, route, via)
            return NO_STEPS
        key = route.key
        links = self._links.get(key)
        if links and len(links) >= self._links_per_key:
            if len(links) == 1:
                link = links[0]
            else:
                turn = self._spread.get(key, 0)
                self._spread[key] = turn + 1
                link = links[turn % len(links)]
            info = self._link_info[link]
            if not info.paused:
                refused = self._encode(p, route, link, route.youzan or info.youzan)
                if refused is None:
                    return NO_STEPS
                steps = Steps()
                self._finish(p, refused, steps)
                return steps
        steps = Steps()
        self._wait_movable(p, now, steps, route)
        return steps

    def _flush_pool(self, pool: Pool, now: float, steps: Steps) -> None:
        """``pool`` leaves: one publish of its messages (an MPUB; one message: as it was
        asked), unkeyed like each of them, ending by the earliest of their deadlines."""
        if self._pools.get(pool.topic) is pool:
            del self._pools[pool.topic]
        pool.linger_at = -1.0  # its timer is stale
        bodies = pool.bodies
        if not bodies:
            return
        self._pooled -= len(bodies)
        trace_ids = pool.trace_ids if pool.traced else None
        if len(bodies) == 1:
            request = single_request(pool.topic, bodies[0], trace_ids)
            waiter = pool.waiters[0]
        else:
            request = batch_request(pool.topic, bodies, trace_ids=trace_ids, auto_trace=pool.traced)
            waiter = Waiters(pool.waiters)
        p = Publish(request, pool.deadline, waiter, None, now)
        self._pending += 1
        if self._closed is not None:
            self._finish(p, self._closed, steps)
            return
        if p.deadline <= now:
            self._watch(p)
            self._expire(p, steps)
            return
        started = self._start_movable(p, now, None)
        if p.data is not None and p.state == SENT:
            steps.send(p)  # its own try, not a submit's: the driver's to write
        steps.absorb(started)

    def _wait_movable(
        self, p: Publish, now: float, steps: Steps, route: Route | None = None
    ) -> None:
        """An unkeyed publish that cannot go at once waits in a lane of its own (for its
        ``route``'s link: routed once, its round-robin turn taken)."""
        lane = Lane(p.request.topic, None, movable=True)
        lane.route = route
        p.lane = lane
        lane.queue.append(p)
        self._watch(p)
        self._pump(lane, now, steps, budgeted=False, own=p)

    def _retry_movable(self, p: Publish, now: float, steps: Steps) -> None:
        """An unkeyed publish's try failed (``p.failure``): it avoids that partition and
        waits in a lane of its own."""
        route = p.route
        if route is not None and route.partition is not None:
            p.avoid = p.avoid | {route.partition}
        p.state = QUEUED
        lane = Lane(p.request.topic, None, movable=True)
        p.lane = lane
        lane.queue.append(p)
        self._watch(p)
        bound = self._stopped(p)
        if bound is not None:
            lane.queue.clear()
            self._give_up(p, bound, steps)
            return
        lane.recovering = True
        steps.retry(p, p.failure, _partition(p))  # type: ignore[arg-type]
        self._schedule(lane, p.failure, now, steps)  # type: ignore[arg-type]

    def _forget_if_empty(self, lane: Lane) -> None:
        """An empty lane waits for nothing (a lookup kept going for it would never end); an
        unkeyed publish's lane is dropped."""
        if lane.queue:
            return
        self._stop_waiting_layout(lane)
        if lane.waiting_key is not None:
            waiters = self._link_waiters.get(lane.waiting_key)
            if waiters is not None:
                waiters.pop(lane, None)
                if not waiters:
                    del self._link_waiters[lane.waiting_key]
            lane.waiting_key = None
        self._dirty.pop(lane, None)

    # ------------------------------------------------------------------ settling

    def _after_answer(self, lane: Lane, now: float, steps: Steps, pump: bool) -> None:
        """A try of ``lane`` was answered or ended: settle the lane once nothing of it is in
        flight any more, then send what may go."""
        if not lane.in_flight and lane.sending:
            self._settle(lane, now, steps)
        elif lane.recovering and not lane.in_flight and not lane.sending:
            lane.recovering = False
        if lane.movable:
            self._forget_if_empty(lane)
            if lane.queue and pump:
                self._pump(lane, now, steps, budgeted=True)
            return
        if pump:
            self._pump(lane, now, steps, budgeted=True)
        elif lane.sending < len(lane.queue):
            self._defer(lane, steps)  # what waits is the loop's to send

    def _settle(self, lane: Lane, now: float, steps: Steps) -> None:
        """Nothing of ``lane`` is in flight: what was refused or lost goes again, in order,
        after a pause; a refused one that something sent after it may have overtaken ends."""
        prefix = list(itertools.islice(lane.queue, 0, lane.sending))
        lane.sending = 0
        first: Publish | None = None
        for p in prefix:
            if p.state == REFUSED and p.overtaken:
                lane.queue.remove(p)
                self._give_up(p, "overtaken", steps)
                continue
            p.state = QUEUED
            self._watch(p)
            route = p.route
            if lane.movable and route is not None and route.partition is not None:
                p.avoid = p.avoid | {route.partition}  # an unkeyed one tries elsewhere first
            bound = self._stopped(p)
            if bound is not None:
                lane.queue.remove(p)
                self._give_up(p, bound, steps)
                continue
            if p.failure is not None:
                steps.retry(p, p.failure, _partition(p))
            if first is None:
                first = p
        if first is None:
            lane.recovering = False
            return
        lane.recovering = True
        self._schedule(lane, first.failure, now, steps)  # type: ignore[arg-type]

    def _schedule(self, lane: Lane, failure: BaseException, now: float, steps: Steps) -> None:
        """``lane`` tries again after ``failure``: at once (an unkeyed publish moving to
        another partition), after the backoff, or when nsqlookupd names somewhere else to
        go (at most the backoff; at least :data:`WARN_AFTER` when there was nowhere)."""
        lane.failures += 1
        if lane.failing_since is None:
            lane.failing_since = now
        head = lane.queue[0] if lane.queue else None
        if lane.movable and head is not None and head.avoid and lane.failures <= 1:
            delay = 0.0
        else:
            delay = self._delays.delay(lane.failures, failure, now - lane.failing_since)
        if self._layouts is not None and _refreshes(failure):
            if isinstance(failure, NoWritablePartitionError):
                delay = max(delay, WARN_AFTER)
            lane.stale = self._layouts(lane.topic)
            waiters = self._layout_waiters.get(lane.topic)
            if waiters is None:
                waiters = self._layout_waiters[lane.topic] = {}
                steps.look_up(lane.topic)
            waiters[lane] = None
        lane.retry_at = now + delay
        heapq.heappush(self._timers, (lane.retry_at, next(self._order), lane))
        self.wake_changed = True
        self._note_failure(lane, failure, head, now, steps)

    def _unroutable(self, lane: Lane, exc: NSQError, now: float, steps: Steps) -> None:
        """The lane had nowhere to go (no writable leader, bad input): a try of its first
        publish that failed before anything was sent."""
        head = lane.queue[lane.sending] if lane.sending < len(lane.queue) else lane.queue[0]
        if not _retriable(exc):
            lane.queue.remove(head)
            self._finish(head, exc, steps)
            self._pump(lane, now, steps, budgeted=True)
            return
        self._tried(head)
        head.failure = exc
        bound = self._stopped(head)
        if bound is not None:
            lane.queue.remove(head)
            self._give_up(head, bound, steps)
        else:
            steps.retry(head, exc, _partition(head))
        if lane.queue:
            self._schedule(lane, exc, now, steps)

    def _stop_waiting_layout(self, lane: Lane) -> None:
        if lane.stale is NO_LAYOUT:
            return
        lane.stale = NO_LAYOUT
        waiters = self._layout_waiters.get(lane.topic)
        if waiters is not None:
            waiters.pop(lane, None)
            if not waiters:
                del self._layout_waiters[lane.topic]

    def _routable(self, lane: Lane, layout: TopicLayout) -> bool:
        if not lane.queue:
            return False
        request = lane.queue[0].request
        if lane.movable:
            return self._router.routable(request, layout)
        if isinstance(lane.target, str):
            return True
        return self._router.routable(request, layout, lane.target)

    def _defer(self, lane: Lane, steps: Steps) -> None:
        self._dirty[lane] = None
        steps.later()

    def _unlink(self, lane: Lane, p: Publish, stored: bool = False) -> None:
        """Take ``p`` out of ``lane``'s settling prefix; ``stored``: its try was stored, so
        the refused ones before it were overtaken."""
        queue = lane.queue
        if queue and queue[0] is p:
            queue.popleft()
            lane.sending -= 1
            return
        for index, other in enumerate(queue):
            if other is p:
                del queue[index]
                if index < lane.sending:
                    lane.sending -= 1
                return
            if stored and other.state == REFUSED:
                other.overtaken = True

    # ------------------------------------------------------------------ ending

    def _watch(self, p: Publish) -> None:
        """Keep ``p``'s deadline in the heap (a publish that waits, or whose link would end
        it too late); the heap is compacted when most of it is over."""
        if p.watched:
            return
        p.watched = True
        self.wake_changed = True
        deadlines = self._deadlines
        if len(deadlines) > 64 and len(deadlines) > 2 * self._pending:
            live = [entry for entry in deadlines if entry[2].state not in (DONE, ZOMBIE)]
            heapq.heapify(live)
            for entry in deadlines:
                if entry[2].state in (DONE, ZOMBIE):
                    entry[2].watched = False
            self._deadlines = deadlines = live
        heapq.heappush(deadlines, (p.deadline, next(self._order), p))

    def _expire(self, p: Publish, steps: Steps) -> None:
        """``p``'s deadline passed."""
        lane = p.lane
        if p.state == SENT:
            p.maybe_stored = True
            where = p.route.address if p.route is not None else "nsqd"
            p.failure = NSQTimeoutError(
                f"{p.request.command} to {where}: the publish ran out of time"
            )
            self._give_up(p, "publish_timeout", steps, keep=True)
            p.state = ZOMBIE  # its link still carries the try
            return
        waited = None
        if lane is None:
            waited = "a lookup"
        elif lane.queue and lane.queue[0] is p and lane.waiting_key is not None:
            waited = f"a connection to {lane.waiting_key[0]}"
            p.tries = max(p.tries, 1)  # connecting is part of its try
        if waited is not None:
            p.failure = NSQTimeoutError(
                f"the publish ran out of time waiting for {waited} (try {max(p.tries, 1)})"
            )
        if lane is not None:
            queue = lane.queue
            index = next((i for i, other in enumerate(queue) if other is p), None)
            if index is not None:
                del queue[index]
                if index < lane.sending:
                    lane.sending -= 1
            self._forget_if_empty(lane)
        else:
            self._unplace(p)
        self._give_up(p, "publish_timeout", steps)
        if lane is not None and not lane.movable and lane.queue and not lane.in_flight:
            if lane.sending:
                self._settle(lane, self._now, steps)
            self._pump(lane, self._now, steps, budgeted=True)

    def _tried(self, p: Publish) -> None:
        """One more try of ``p`` (sent, or failed before anything was sent)."""
        if p.tries:
            self.stats.retries += 1
        p.tries += 1

    def _stopped(self, p: Publish) -> str | None:
        """What ends ``p`` after its failed try (``max_retries``, ``retry_stop``), or None:
        it goes on (until its deadline at most, whatever the stop says)."""
        if self._max_retries is not None and p.tries > self._max_retries:
            return f"max_retries={self._max_retries}"
        if self._stop is not None and self._stop.stops(p.tries, p.failure, self._now - p.arrived):
            return "retry_stop"
        return None

    def _give_up(self, p: Publish, bound: str, steps: Steps, keep: bool = False) -> None:
        """``p`` ends with a :class:`PublishError` (``bound``: what ended it)."""
        request = p.request
        lane = p.lane
        partition = request.partition
        if partition is None and lane is not None and isinstance(lane.target, int):
            partition = lane.target
        last = p.failure
        if last is None and lane is not None and lane.queue and lane.queue[0] is not p:
            last = lane.queue[0].failure  # what held the publishes before it
        if bound == "overtaken":
            cause = (
                "nsqd refused it, and a publish sent after it to the same partition was "
                "stored or may have been: not sent again, so that it is not stored after it"
            )
        elif bound == "publish_timeout":
            cause = "timed out"
            if p.tries == 0 and lane is not None and lane.queue and lane.queue[0] is not p:
                cause += ", waiting behind earlier publishes of its partition"
        else:
            cause = f"reached {bound}"
        unknown = p.maybe_stored
        outcome = "; a try was sent and not answered: nsqd may have stored it" if unknown else ""
        where = "" if partition is None else f" partition {partition}"
        error = PublishError(
            f"publish to {request.topic!r}{where} failed after {p.tries} tries ({cause}"
            f"{outcome})" + (f": {last}" if last is not None else ""),
            topic=request.topic,
            partition=partition,
            tries=p.tries,
            outcome_unknown=unknown,
        )
        error.__cause__ = last
        self._finish(p, error, steps, keep=keep)

    def _finish(self, p: Publish, error: BaseException, steps: Steps, keep: bool = False) -> None:
        """``p`` ends with ``error`` (counted unless it was refused before it was sent);
        ``keep``: its try is still in flight (it becomes a zombie, not over)."""
        if not (p.tries == 0 and isinstance(error, (ValidationError, UnsupportedFeatureError))):
            self.stats.failed(len(p.request.bodies))
        p.error = error
        if keep:
            self._pending -= 1
            p.state = ZOMBIE
        else:
            self._done(p, steps)
        steps.over(p)

    def _done(self, p: Publish, steps: Steps) -> None:
        if p.state != ZOMBIE:
            self._pending -= 1
        p.state = DONE

    def _close_lane(self, lane: Lane, error: BaseException, steps: Steps) -> None:
        while lane.queue:
            p = lane.queue.popleft()
            if p.state != DONE and p.state != ZOMBIE:
                self._finish(p, error, steps)
        lane.sending = lane.in_flight = 0

    # ------------------------------------------------------------------ notes

    def _note_failure(
        self,
        lane: Lane,
        failure: BaseException,
        head: Publish | None,
        now: float,
        steps: Steps,
    ) -> None:
        if self.verbose:
            steps.note(
                logging.DEBUG,
                "publish to %s (partition %s) failed on try %d (%s); retrying",
                (lane.topic, lane.target, head.tries if head else 0, failure),
            )
        since = lane.failing_since
        if since is None or now - since < WARN_AFTER:
            return
        held = self._throttle.allow(("failing", lane.topic))
        if held is None:
            return
        steps.note(
            logging.WARNING,
            "publishes to %s have been failing for %.1f s (%d tries; last: %s); still "
            "retrying, within publish_timeout%s",
            (
                lane.topic,
                now - since,
                head.tries if head else 0,
                failure,
                LogThrottle.note(held, self._throttle.interval),
            ),
        )

    def _note_move(self, lane: Lane, before: Route, after: Route, steps: Steps) -> None:
        held = self._throttle.allow(("moved", lane.topic, after.partition))
        if held is not None:
            steps.note(
                logging.INFO,
                "%s partition %d: the leader moved from %s to %s; publishing there%s",
                (
                    lane.topic,
                    after.partition,
                    before.address,
                    after.address,
                    LogThrottle.note(held, self._throttle.interval),
                ),
            )


def _kind(request: PublishRequest) -> int:
    """What an auto-batch of ``request`` would be (:data:`_ALONE`: none)."""
    command = request.command
    if command == "PUB":
        return _PLAIN
    if command == "PUB_TRACE" and request.auto_trace:
        return _TRACED
    return _ALONE


def _size(request: PublishRequest, traced: bool) -> int:
    """The bytes a single-message ``request`` takes in an MPUB."""
    return PER_MESSAGE + len(request.bodies[0]) + (PER_TRACE_ID if traced else 0)


def _partition(p: Publish) -> int | None:
    """The partition ``p``'s last try went to (None: classic, or none yet)."""
    return p.route.partition if p.route is not None else None


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, NSQError) and exc.retriable


def _refreshes(exc: BaseException) -> bool:
    return isinstance(exc, NSQError) and exc.refresh_lookup


def lane_key(lane: Lane) -> Hashable:
    """A lane's identity in tests and logs."""
    return (lane.topic, lane.target)
