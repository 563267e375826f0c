"""The blocking driver of a producer's publish flow: ``smartnsq.sync.Producer`` publishes
from its callers' threads without a hop to its loop thread and back when it can.

The flow (:class:`~smartnsq.publishing.flow.PublishFlow`) is the asyncio producer's: a
publish is submitted to it from the calling thread (holding the Sender's lock), in call
order with every other publish of its partition. When its partition's lane is idle the flow
lets the calling thread carry the try (the publish is in flight on ``HERE``): over a
:class:`~smartnsq.transport.blocking.BlockingConnection` (the same protocol session as the
loop's connections, over a plain socket) taken from a pool that keeps one per thread
publishing to a destination at once. Everything else (a lane with publishes before it, no
layout cached, a retry, a lookup, the deadline) is the loop's: the steps are handed to the
Sender (:meth:`~smartnsq.producer.sender.Sender.act_soon`) and the thread waits for the
publish's waiter. One implementation of the decisions; this module only moves one try's
bytes in another thread.
"""

from __future__ import annotations

import concurrent.futures
import time

from smartnsq.errors import ConnectionClosedError, NSQError, NSQTimeoutError, ServerError
from smartnsq.producer.sender import Sender
from smartnsq.publishing.flow import SENT, Publish, Steps
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.result import PublishResult
from smartnsq.transport.blocking import BlockingConnection, BlockingPool
from smartnsq.transport.config import ConnectionConfig

__all__ = ["HERE", "BlockingPublisher"]

#: The link of a try carried by its calling thread, as the flow sees it: one at a time per
#: lane, so one name serves every thread.
HERE = object()
# How long past its deadline a thread waits for the loop to end a publish (the loop's timer
# ends it at the deadline; this only bounds a loop that stopped).
_GRACE = 5.0


class BlockingPublisher:
    """The tries of a producer's blocking publishes made in their calling threads, and the
    waits for those the loop carries on."""

    def __init__(self, sender: Sender, config: ConnectionConfig) -> None:
        self._sender = sender
        self._flow = sender.flow
        self._lock = sender.share()
        self._pool = BlockingPool(config)
        self._answered_bound = 0  # those of a lane, answered here

    @property
    def answered_here(self) -> int:
        """Publishes answered in their calling threads (their first try, made there)."""
        return self._answered_bound + self._flow.alone_answered

    def publish(self, request: PublishRequest, timeout: float | None) -> list[PublishResult]:
        """Publish ``request`` (checked already) within ``timeout`` (None:
        ``publish_timeout``): its results, or its error raised."""
        now = time.monotonic()
        deadline = now + (self._sender.publish_timeout if timeout is None else timeout)
        lock = self._lock
        flow = self._flow
        lock.acquire()  # not a with statement: half its cost, on a path taken per publish
        try:
            if flow.alone:
                flow.count_alone()  # what threads answered since, without this lock
            p, steps = flow.submit(request, now, deadline, None, None, HERE)  # no keyword: cheaper
            here = p.link is HERE and p.state == SENT
            if not here and not p.done:
                p.waiter = _Waiter()  # the loop ends it
        finally:
            lock.release()
        if here:
            if steps.busy or self._flow.wake_changed:
                self._sender.act_soon(steps)
            results = self._try_here(p, deadline, now)
            if results is not None:
                return results
        else:
            self._hand_over(steps)
        return _outcome(p, deadline)

    def _try_here(self, p: Publish, deadline: float, now: float) -> list[PublishResult] | None:
        """``p``'s try over this thread's connection: its results, or None when the loop
        carries it on or it ended (:func:`_outcome` says how)."""
        route = p.route
        if route is None:  # pragma: no cover - set by submit
            raise ConnectionClosedError("the publish was not routed")
        key = route.key
        pool = self._pool
        conn: BlockingConnection | None = None
        try:
            conn = pool.take(key, now) or pool.connect(key, deadline)
        except (NSQError, TimeoutError) as exc:
            self._ended(p, "lost", _typed(exc, "a connection to " + route.address), False)
            return None
        try:
            try:
                # No lock: it touches only this publish, which only this thread holds now,
                # and the codec's caches.
                command, data = self._flow.encode_here(p, conn.youzan)
            except NSQError as exc:  # what its server cannot take: refused before sending
                self._ended(p, "unsent", exc, False)
                return None
            try:
                frame = conn.request(data, command, deadline, now)
            except ServerError as exc:
                self._ended(p, "refused", exc, False)
                return None
            except (NSQError, TimeoutError) as exc:
                written = conn.written
                if conn.is_open:
                    conn.close()  # its answer can no longer be told from the next one's
                self._ended(p, "lost", _typed(exc, f"{command} to {route.address}"), written)
                return None
            except BaseException:
                # Cut short (Ctrl-C): the try may be in the socket; its caller is gone.
                if conn.is_open:
                    conn.close()
                error = ConnectionClosedError("interrupted", route.address)
                with self._lock:
                    steps = self._flow.lost(p, error, time.monotonic(), pump=False)
                    more = self._flow.cancel(p, time.monotonic())
                self._hand_over(steps)
                self._hand_over(more)
                raise
        finally:
            pool.give_back(key, conn)
        flow = self._flow
        results = flow.answered_alone(p, frame)
        if results is not None:
            return results  # unbound: recorded without the lock (no second critical section)
        lock = self._lock
        lock.acquire()
        try:
            steps = flow.answered(p, frame, time.monotonic(), pump=False)
            self._answered_bound += 1
        finally:
            lock.release()
        if steps.busy or flow.wake_changed:
            self._sender.act_soon(steps)  # what it released is the loop's
        return p.results  # answered here: not the loop's to answer

    def _ended(self, p: Publish, how: str, error: NSQError, written: bool) -> None:
        """``p``'s try here ended without results (``how``: lost, refused, or not sent):
        the flow decides what follows, which the loop carries out."""
        flow = self._flow
        now = time.monotonic()
        with self._lock:
            p.waiter = _Waiter()
            if how == "lost":
                steps = flow.lost(p, error, now, written=written, pump=False)
            elif how == "refused":
                steps = flow.refused(p, error, now, pump=False)
            else:
                steps = flow.unsent(p, error, now, pump=False)
        self._hand_over(steps)

    def _hand_over(self, steps: Steps) -> None:
        """What the flow decided for the loop, carried out there (the lanes this thread's
        event released are pumped there)."""
        if steps.busy or self._flow.wake_changed:
            self._sender.act_soon(steps)

    def open_connections(self) -> int:
        return self._pool.open_connections()

    def close(self) -> None:
        """Close the connections: those in use end their tries (the loop carries those
        publishes on, and fails them as the producer closes)."""
        self._pool.close()


class _Waiter(concurrent.futures.Future[list[PublishResult]]):
    """A blocking publish's waiter, ended by the loop (thread-safe)."""


def _outcome(p: Publish, deadline: float) -> list[PublishResult]:
    """``p``'s results, or its error raised, once the loop (or the flow, at once) ended
    it; waiting past its deadline only if the loop is late."""
    if p.done or p.error is not None:
        if p.error is not None:
            raise p.error
        return p.results  # type: ignore[return-value]
    waiter = p.waiter
    if waiter is None:  # pragma: no cover - set whenever the loop carries a publish on
        raise ConnectionClosedError("the publish was handed over without a waiter")
    return waiter.result(max(0.0, deadline - time.monotonic()) + _GRACE)  # type: ignore[no-any-return]


def _typed(exc: BaseException, what: str) -> NSQError:
    """A try's failure as the flow takes it: a deadline's ``TimeoutError`` as the
    retriable :class:`NSQTimeoutError`."""
    if isinstance(exc, NSQError):
        return exc
    return NSQTimeoutError(f"{what}: the publish ran out of time")
