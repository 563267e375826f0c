"""A blocking publish's first try, made by the calling thread: ``smartnsq.sync.Producer``
publishes without a hop to its loop thread and back when it can.

The try is the async producer's (:meth:`Producer._try <smartnsq.producer.producer.Producer>`)
with its waits satisfied here: the route from the producer's router in the layout its
lookup manager has cached, the bytes from its codec, and nsqd's answer read over a
:class:`~smartnsq.transport.blocking.BlockingConnection` (the same protocol session as the
loop's connections, over a plain socket) taken from a pool that keeps one per thread
publishing to a destination at once. Whatever is not the plain success of that try (no
cached layout, a connection that cannot be made, an error frame, a lost connection, the
deadline) hands the publish over to the producer's loop (:class:`Handover`): there it goes
on as the async publish does after its first try failed (``Producer._run``), with its retries,
lookups and failover, by the same deadline. So there is one implementation of the protocol,
the routing and the retries; this module only carries out one try in another thread.

What the calling thread touches of the async producer is safe there: the cached layouts
(immutable values, read), the router (its round-robin counter is an ``itertools.count``,
whose ``next`` is atomic, and its tables a cache), the codec (caches of immutable values)
and the trace switch (read). Its own counters are under a lock, and added to the producer's
in ``stats()``.
"""

from __future__ import annotations

import threading
import time
from typing import NamedTuple

from smartnsq.client.tracelog import log_publish
from smartnsq.errors import NSQError, NSQTimeoutError
from smartnsq.producer.producer import Producer
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.stats import ProducerStats
from smartnsq.publishing.tries import PublishTries
from smartnsq.transport.blocking import BlockingPool

__all__ = ["BlockingPublisher", "Handover"]


class Handover(NamedTuple):
    """A blocking publish that the producer's loop goes on with, within ``remaining``
    seconds: from its start (``tries`` None: no try was made, for want of a cached layout),
    or from the retries of the try in ``tries``, which failed with ``failure``."""

    tries: PublishTries | None
    failure: BaseException | None
    remaining: float


class BlockingPublisher:
    """The first tries of a producer's blocking publishes, in their calling threads."""

    def __init__(self, producer: Producer) -> None:
        self._lookup = producer._lookup
        self._route_in = producer._route_in
        self._encode = producer._encode
        self._results = producer._results
        self._publish_timeout = producer.options.publish_timeout
        self._pool = BlockingPool(producer.options.connection_config)
        self._lock = threading.Lock()
        self._stats = ProducerStats()
        #: A sharding key may be routed here: the sharder is no callable of the user's,
        #: which runs on the producer's loop.
        self.shards_here = isinstance(producer.options.sharder.strategy, str)

    @staticmethod
    def serves(producer: Producer) -> bool:
        """Whether the publishes of ``producer`` may make their first try in their calling
        thread: not when they are auto-batched (the batches are the loop's) or traced with
        OpenTelemetry (their spans are)."""
        return producer._batcher is None and not producer._telemetry.enabled

    def publish(
        self, request: PublishRequest, timeout: float | None
    ) -> list[PublishResult] | Handover:
        """The first try of ``request`` (checked by ``Producer._request``), within ``timeout``
        (None: ``publish_timeout``): its results, or the publish handed over."""
        now = time.monotonic()
        remaining = self._publish_timeout if timeout is None else timeout
        deadline = now + remaining
        layout = None
        lookup = self._lookup
        if lookup is not None:
            layout = lookup.cached(request.topic, "w")
            if layout is None:
                return Handover(None, None, remaining)
        tries = PublishTries()
        conn = None
        command = ""
        try:
            route = self._route_in(request, tries, layout)
            key = (route.address, route.pool_topic, route.partition)
            pool = self._pool
            conn = pool.take(key, now) or pool.connect(key, deadline)
            try:
                command, data = self._encode(
                    request, tries, route, route.youzan or conn.youzan, deadline - now
                )
                try:
                    frame = conn.request(data, command, deadline, now)
                finally:
                    tries.sent = conn.written
            finally:
                pool.give_back(key, conn)
            results = self._results(request, route, frame, 1, tries.trace_ids)
        except NSQError as exc:
            return Handover(tries, exc, deadline - time.monotonic())
        except TimeoutError:
            # The publish's deadline ended a wait: said as the loop's try says it.
            address = tries.route.address
            if tries.sent:
                what = f"{command} to {address}: the publish ran out of time"
            else:
                waited = (
                    f"a connection to {address}"
                    if conn is None
                    else f"{address} to read what was sent before"
                )
                what = f"the publish ran out of time waiting for {waited} (try 1)"
            return Handover(tries, NSQTimeoutError(what), deadline - time.monotonic())
        except Exception as exc:  # noqa: BLE001 - the loop's _run raises and counts it
            return Handover(tries, exc, deadline - time.monotonic())
        with self._lock:
            self._stats.acknowledged(request.bodies, results)
        if results[0].internal_id is not None:
            for result in results:
                log_publish(result)
        return results

    def stats(self, loop_stats: ProducerStats) -> ProducerStats:
        """The producer's counters (a snapshot, ``loop_stats``) with this thread's."""
        with self._lock:
            return loop_stats.merged(self._stats, self._pool.open_connections())

    def close(self) -> None:
        """Close the connections: those in use end their tries (handed over, they fail as
        the producer is closed)."""
        self._pool.close()
