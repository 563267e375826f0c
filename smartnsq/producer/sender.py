"""The asyncio driver of a producer's publish flow (aiokafka's ``Sender``).

The flow (:class:`~smartnsq.publishing.flow.PublishFlow`) decides; the Sender carries out
what it returns, on the producer's event loop: it writes each try on its connection (with no
future per try: answers come back through :class:`~smartnsq.transport.connection.Receiver`),
opens connections, follows the lookups of the topics whose publishes wait for a layout, keeps
one timer at the flow's next deadline, answers each publish's waiter, and logs what the flow
says to log. The blocking publisher (:mod:`smartnsq.producer.blocking`) drives the same flow
from other threads: once it does (:meth:`share`), every call into the flow holds
:attr:`lock`, and what such a thread decides for the loop it hands over with
:meth:`act_soon`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from smartnsq.client.telemetry import Telemetry, end_send_span, error_type
from smartnsq.client.tracelog import log_publish
from smartnsq.errors import (
    ClientClosedError,
    NSQError,
    NSQTimeoutError,
    PublishError,
    ServerError,
)
from smartnsq.publishing.flow import NO_STEPS, WARN_AFTER, Batch, Publish, PublishFlow, Steps
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.stats import ProducerStats
from smartnsq.transport.connection import Connection
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.pool import ConnectionPool, PoolKey

__all__ = ["Sender"]

log = logging.getLogger("smartnsq.producer")


class Sender:
    """Carries out a :class:`PublishFlow`'s steps on one event loop (bound at
    :meth:`bind`). ``publish_timeout`` bounds a publish that names no ``timeout``;
    ``request_timeout`` is each try's connection-level bound (an answer later than that means
    the link is dead); ``write_timeout``: a connection whose server reads nothing for that
    long is closed."""

    def __init__(
        self,
        flow: PublishFlow,
        pool: ConnectionPool,
        lookup: LookupManager | None,
        *,
        publish_timeout: float,
        request_timeout: float,
        write_timeout: float,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.flow = flow
        #: Held for every call into the flow once other threads drive it too (the blocking
        #: publisher: :meth:`share`); None until then (taking a lock is 2,000 instructions,
        #: twice per publish).
        self.lock: threading.Lock | None = None
        self._guard: AbstractContextManager[Any] = _NOT_SHARED
        self._pool = pool
        self._lookup = lookup
        self.publish_timeout = publish_timeout
        self._request_timeout = request_timeout
        self._write_timeout = write_timeout
        self._telemetry = telemetry
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = time.monotonic
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._resume: asyncio.Handle | None = None
        self._following: dict[str, asyncio.Task[None]] = {}
        # Callers of layout(): per topic, (their future, the layout they found useless).
        self._layout_waiters: dict[str, list[tuple[asyncio.Future[Any], Any]]] = {}
        self._opening: dict[asyncio.Task[Any], None] = {}  # in the order they started
        self._stuck: dict[Connection, asyncio.TimerHandle] = {}
        self._keys: dict[Connection, PoolKey] = {}
        self._closed = False
        self._drained: asyncio.Future[None] | None = None  # flush() waits for it

    # ------------------------------------------------------------------ lifecycle

    def share(self) -> threading.Lock:
        """Other threads will drive the flow too: every call into it takes this lock from
        now on (call it before they start)."""
        if self.lock is None:
            self.lock = threading.Lock()
            self._guard = self.lock
        return self.lock

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Work on ``loop`` from now on (the producer's, when it starts)."""
        self._loop = loop
        self._clock = _clock_of(loop)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def now(self) -> float:
        """The loop's time (deadlines are in it)."""
        return self._clock()

    async def close(self, error: BaseException) -> None:
        """Every publish not over ends with ``error``; the lookups followed stop; the
        connections close."""
        self._closed = True
        with self._guard:
            steps = self.flow.close(error)
        self._act(steps)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        for handle in self._stuck.values():
            handle.cancel()
        self._stuck.clear()
        tasks = [*self._following.values(), *self._opening]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._following.clear()
        await self._pool.close()

    async def flush(self, timeout: float) -> bool:
        """What waits for company (auto-batching) leaves now; wait up to ``timeout`` for
        every publish to be over. False if some are not."""
        with self._guard:
            steps = self.flow.flush(self._clock())
        self._act(steps)
        deadline = self._clock() + timeout
        while self.flow.pending:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return False
            # Checked after every event that may end a publish (_act); the bounded wait
            # covers those a blocking thread ends.
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._drained), min(remaining, 0.1))
            except TimeoutError:
                pass
            finally:
                self._drained = None
        return True

    # ------------------------------------------------------------------ publishing

    def publish(self, request: PublishRequest, timeout: float | None, span: Any = None) -> Publish:
        """Start publishing ``request`` (within ``timeout``, else ``publish_timeout``); its
        ``waiter`` (a future) gets the results or the error."""
        loop = self._loop
        if loop is None:  # pragma: no cover - the producer binds before its first publish
            raise ClientClosedError("the producer is not started")
        clock = self._clock  # self._clock() would be an unspecialized method lookup
        now = clock()
        deadline = now + (self.publish_timeout if timeout is None else timeout)
        waiter = loop.create_future()
        lock = self.lock
        if lock is None:
            p, steps = self.flow.submit(request, now, deadline, waiter, span)
        else:
            lock.acquire()  # not a with statement: half its cost, on a path taken per publish
            try:
                p, steps = self.flow.submit(request, now, deadline, waiter, span)
            finally:
                lock.release()
        if steps is not NO_STEPS and steps.busy:
            self._act(steps)
        if p.data is not None:
            self._write(p)  # its own try, after what the steps sent
        if self.flow.wake_changed:
            self._arm()
        return p

    def pool(
        self, topic: str, body: bytes, trace_id: int | None, timeout: float | None
    ) -> asyncio.Future[Any]:
        """Start an unkeyed plain publish that waits for company (``linger``; a trace id:
        the trace switch's): the future gets a list of its one result, or the error."""
        loop = self._loop
        if loop is None:  # pragma: no cover - the producer binds before its first publish
            raise ClientClosedError("the producer is not started")
        clock = self._clock  # self._clock() would be an unspecialized method lookup
        now = clock()
        deadline = now + (self.publish_timeout if timeout is None else timeout)
        waiter = loop.create_future()
        lock = self.lock
        if lock is None:
            steps = self.flow.pool(topic, body, trace_id, now, deadline, waiter)
        else:
            with lock:
                steps = self.flow.pool(topic, body, trace_id, now, deadline, waiter)
        if steps is not NO_STEPS and steps.busy:
            self._act(steps)
        if self.flow.wake_changed:
            self._arm()
        return waiter

    def unpool(self, topic: str, waiter: asyncio.Future[Any]) -> None:
        """A pooled publish's caller stopped waiting (cancelled)."""
        with self._guard:
            self.flow.unpool(topic, waiter)

    def cancel(self, p: Publish) -> None:
        """``p``'s caller stopped waiting (cancelled)."""
        with self._guard:
            steps = self.flow.cancel(p, self._clock())
        self._act(steps)

    # ------------------------------------------------------------------ answers (Receiver)

    def answered(self, target: Any, data: bytes) -> None:
        lock = self.lock
        clock = self._clock  # self._clock() would be an unspecialized method lookup
        if lock is None:
            steps = self.flow.answered(target, data, clock())
        else:
            lock.acquire()
            try:
                steps = self.flow.answered(target, data, clock())
            finally:
                lock.release()
        results = target.results  # None for a batch: its members are in steps.done
        if results is not None:
            p: Publish = target
            if p.span is None and results[0].internal_id is None:
                # The common answer (untraced, no receipt): what _complete does, inline;
                # one method lookup on the future, not two (a caller that was cancelled
                # has its future done already).
                try:
                    p.waiter.set_result(results)
                except asyncio.InvalidStateError:
                    pass
            else:
                self._complete(p)
        if steps is not NO_STEPS and steps.busy:
            self._act(steps)
        elif self._drained is not None:
            self._check_drained()

    def failed(self, target: Any, error: BaseException) -> None:
        p: Publish | Batch = target
        now = self._clock()
        link = p.link
        with self._guard:
            if isinstance(link, Connection) and link.closed:
                self.flow.link_down(link)  # before anything is sent again
            if isinstance(error, ServerError):
                steps = self.flow.refused(p, error, now)
            else:
                steps = self.flow.lost(p, error, now)
        self._act(steps)

    def paused(self, conn: Connection) -> None:
        with self._guard:
            self.flow.link_paused(conn)
        if self._loop is not None and conn not in self._stuck:
            self._stuck[conn] = self._loop.call_later(self._write_timeout, self._write_stuck, conn)

    def resumed(self, conn: Connection) -> None:
        handle = self._stuck.pop(conn, None)
        if handle is not None:
            handle.cancel()
        with self._guard:
            steps = self.flow.link_resumed(conn, self._clock())
        self._act(steps)

    def _write_stuck(self, conn: Connection) -> None:
        self._stuck.pop(conn, None)
        conn.abort(NSQTimeoutError(f"write to {conn.address} blocked for {self._write_timeout} s"))

    # ------------------------------------------------------------------ carrying out

    def act_soon(self, steps: Steps) -> None:
        """Carry out ``steps`` on the loop (from another thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._act_resumed, steps)

    def _act_resumed(self, steps: Steps) -> None:
        if steps.busy:
            self._act(steps)
        self._resumed()

    def _act(self, steps: Steps) -> None:
        """Carry out what the flow decided, in its order."""
        for p in steps.sends:
            self._write(p)
        for key in steps.connect:
            self._open(key)
        for topic in steps.lookup:
            self._follow(topic)
        if steps.retrying and self._telemetry is not None and self._telemetry.enabled:
            self._traced_retries(steps.retrying)
        for p in steps.done:
            self._complete(p)
        for level, message, args in steps.notes:
            log.log(level, message, *args)
        if self._drained is not None:
            self._check_drained()
        if steps.more and self._resume is None and self._loop is not None:
            self._resume = self._loop.call_soon(self._resumed)
        if self.flow.wake_changed:
            self._arm()

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is not None and not self.flow.pending and not drained.done():
            drained.set_result(None)

    def _write(self, p: Publish | Batch) -> None:
        """Write ``p``'s try on its link: its answer comes back through :meth:`answered` or
        :meth:`failed`."""
        data, p.data = p.data, None
        link = p.link
        try:
            link.request_for(p, data, p.command, self._request_timeout)
        except NSQError as exc:  # closed since the flow chose it: nothing was written
            with self._guard:
                self.flow.link_down(link)
                steps = self.flow.lost(p, exc, self._clock(), written=False)
            self._act(steps)

    def _resumed(self) -> None:
        self._resume = None
        with self._guard:
            steps = self.flow.resume(self._clock())
        self._act(steps)

    def _traced_retries(self, retrying: list[tuple[Publish, BaseException, int | None]]) -> None:
        """Each publish tried again: a ``retries`` count, and an event on its span."""
        telemetry = self._telemetry
        if telemetry is None:  # pragma: no cover - checked by the caller
            return
        for p, failure, partition in retrying:
            telemetry.count("retries", 1, {"messaging.destination.name": p.request.topic})
            if p.span is not None:
                p.span.add_event(
                    "retry",
                    {
                        "error.type": error_type(failure),
                        "messaging.destination.partition.id": str(partition),
                    },
                )

    def _complete(self, p: Publish) -> None:
        """Answer ``p``'s waiter (a future of this loop, or a thread's)."""
        waiter = p.waiter
        results = p.results
        span = p.span
        if results is not None:
            if results[0].internal_id is not None:
                for result in results:
                    log_publish(result)
            if span is not None:
                end_send_span(span, results)
            if waiter is not None and not waiter.done():
                waiter.set_result(results)
            return
        error = p.error
        if span is not None and error is not None:
            Telemetry.fail(span, error)
            span.end()
        if waiter is not None and not waiter.done() and error is not None:
            waiter.set_exception(error)
            if isinstance(waiter, asyncio.Future):
                waiter.exception()  # retrieved: its caller may have gone

    # ------------------------------------------------------------------ time

    def _arm(self) -> None:
        with self._guard:
            self.flow.wake_changed = False
            at = self.flow.next_deadline()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None and self._loop is not None and not self._closed:
            self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        with self._guard:
            steps = self.flow.tick(self._clock())
            self.flow.wake_changed = True
        self._act(steps)

    # ------------------------------------------------------------------ connections

    def _open(self, key: PoolKey) -> None:
        if self._loop is None or self._closed:
            return
        task = self._loop.create_task(self._opened(key), name=f"smartnsq-connect-{key[0]}")
        self._opening[task] = None
        task.add_done_callback(self._opened_done)

    def _opened_done(self, task: asyncio.Task[Any]) -> None:
        self._opening.pop(task, None)

    async def connect(self, key: PoolKey) -> None:
        """Open a connection for ``key`` now (a direct-mode producer's start), raising what
        connecting raised."""
        error = await self._opened(key)
        if error is not None:
            raise error

    async def _opened(self, key: PoolKey) -> BaseException | None:
        """Open a connection for ``key`` (within ``connect_timeout``) and tell the flow."""
        try:
            conn = await self._pool.open(key)
        except NSQError as exc:
            with self._guard:
                steps = self.flow.link_failed(key, exc, self._clock())
            self._act(steps)
            return exc
        conn.receiver = self
        self._keys[conn] = key
        conn.set_close_callback(self._closed_link)
        with self._guard:
            steps = self.flow.link_up(key, conn, conn.youzan, self._clock())
        self._act(steps)
        return None

    def _closed_link(self, conn: Connection, error: BaseException | None) -> None:
        key = self._keys.pop(conn, None)
        if key is not None:
            self._pool.forget(key, conn)
        handle = self._stuck.pop(conn, None)
        if handle is not None:
            handle.cancel()
        with self._guard:
            self.flow.link_down(conn)

    def open_connections(self) -> int:
        return self._pool.open_connections()

    def stats(self) -> ProducerStats:
        """A snapshot of the flow's counters, with the open connections counted now."""
        with self._guard:
            flow = self.flow
            if flow.alone:
                flow.count_alone()  # what blocking threads answered without the lock
            return flow.stats.snapshot(self._pool.open_connections())

    # ------------------------------------------------------------------ lookups

    async def layout(self, topic: str, deadline: float, stale: Any = None) -> Any:
        """The write layout of ``topic`` other than ``stale`` (looked up while there is
        none), or :class:`PublishError` once ``deadline`` passes; None in direct mode. What
        nsqlookupd answers that no retry fixes (a topic it does not know) raises at once."""
        lookup = self._lookup
        if lookup is None:
            return None
        layout = lookup.cached(topic, "w")
        if layout is not None and layout is not stale:
            return layout
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        timer = loop.call_at(deadline, _time_up, waiter, topic)
        entry = (waiter, stale)
        self._layout_waiters.setdefault(topic, []).append(entry)
        self._follow(topic)
        try:
            return await waiter
        finally:
            timer.cancel()
            waiters = self._layout_waiters.get(topic)
            if waiters is not None and entry in waiters:
                waiters.remove(entry)
                if not waiters:
                    del self._layout_waiters[topic]

    def _follow(self, topic: str) -> None:
        """Keep looking ``topic`` up while something waits for its layout."""
        if self._lookup is None or self._loop is None or self._closed:
            return
        task = self._following.get(topic)
        if task is None or task.done():
            self._following[topic] = self._loop.create_task(
                self._lookups(topic, self._lookup), name=f"smartnsq-publish-lookup-{topic}"
            )

    def _wanted(self, topic: str) -> bool:
        with self._guard:
            if self.flow.wants_layout(topic):
                return True
        return bool(self._layout_waiters.get(topic))

    async def _lookups(self, topic: str, lookup: LookupManager) -> None:
        """Rounds of lookups of ``topic``, each answer told to the flow and to the callers
        of :meth:`layout`, until nothing waits for one: the first layout through
        ``lookup`` (which raises what nsqlookupd answered instead), a new one through
        ``wait_until``, in rounds shared with every other waiter of the topic."""
        flow, lock = self.flow, self._guard
        failures = 0
        while self._wanted(topic):
            if lookup.cached(topic, "w") is None:
                try:
                    await lookup.lookup(topic, "w")
                except NSQError as exc:
                    with lock:
                        steps = flow.layout_failed(topic, exc, self._clock())
                    self._act(steps)
                    if not exc.retriable:
                        for waiter, _ in self._layout_waiters.get(topic, ()):
                            if not waiter.done():
                                waiter.set_exception(exc)
                    failures += 1
                    await asyncio.sleep(min(0.05 * 2**failures, 1.0))
                    continue
            else:

                def useful(layout: Any) -> bool:
                    if any(stale is not layout for _, stale in self._layout_waiters.get(topic, ())):
                        return True
                    with lock:
                        return flow.useful(topic, layout)

                await lookup.wait_until(topic, "w", useful, WARN_AFTER)
            failures = 0
            layout = lookup.cached(topic, "w")
            for waiter, stale in self._layout_waiters.get(topic, ()):
                if layout is not None and layout is not stale and not waiter.done():
                    waiter.set_result(layout)
            with lock:
                steps = flow.layout_changed(topic, self._clock())
            self._act(steps)


def _time_up(waiter: asyncio.Future[Any], topic: str) -> None:
    if not waiter.done():
        waiter.set_exception(
            PublishError(
                f"publish to {topic!r} failed: timed out waiting for nsqlookupd to name a "
                "partition for it",
                topic=topic,
            )
        )


class _NotShared:
    """The guard of a flow no other thread drives: nothing to take."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NOT_SHARED = _NotShared()


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock; for asyncio's own loops, the function behind it (a call less on a
    path taken per publish)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic  # what BaseEventLoop.time() returns
    return loop.time
