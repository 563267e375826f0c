"""The Producer: publishes to youzan partitions (explicit, sharding key or round-robin) or to
classic nsqd, with trace receipts, ext headers and retry on leader changes.

It composes the floors below: the lookup manager says where partitions live, the router
(``smartnsq.publishing.routes``) which partition or nsqd a publish goes to, the pool holds a
connection per (nsqd, topic, partition), the codec (``smartnsq.publishing.wire``) turns a
request into bytes and nsqd's answer into results, and the retry policy
(``smartnsq.flow.retry``) decides what to try again. What stays here is the lifecycle, the API,
the batching glue, the retries and the telemetry spans.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

from smartnsq.client.options import expose_options, keyword_arguments
from smartnsq.client.telemetry import Telemetry, end_send_span, error_type
from smartnsq.client.tracelog import log_publish
from smartnsq.errors import (
    ClientClosedError,
    NoWritablePartitionError,
    NSQError,
    NSQTimeoutError,
    PublishError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.flow.logthrottle import LogThrottle
from smartnsq.flow.retry import Backoff, is_retriable, needs_lookup_refresh
from smartnsq.producer.batching import Batcher
from smartnsq.producer.gate import RetryGate
from smartnsq.producer.options import (
    DEFAULT_PUBLISH_TIMEOUT,
    ProducerOptions,
    check_publish_timeout,
)
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.protocol.validation import (
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    check_bodies,
    check_body,
    check_partition,
    check_topic,
)
from smartnsq.publishing.request import (
    NO_KEY,
    PublishRequest,
    batch_extras,
    batch_request,
    message_request,
)
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import ANY_TOPIC, Route, Router
from smartnsq.publishing.stats import ProducerStats
from smartnsq.publishing.tries import PublishTries
from smartnsq.publishing.wire import PublishCodec
from smartnsq.routing.addresses import AddressMapping
from smartnsq.routing.sharding import ShardingStrategy
from smartnsq.transport.connection import Compression, Connection
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.pool import ConnectionPool

__all__ = ["DEFAULT_PUBLISH_TIMEOUT", "Producer", "ProducerStats", "PublishResult"]

log = logging.getLogger("smartnsq.producer")

T = TypeVar("T")

# A publish still failing after this long is worth a warning (a leader move takes less).
_WARN_AFTER = 5.0

# publish_many(sharding_keys=...) checks each body first and each partition's batch later.
_UNBOUNDED = 1 << 62


@expose_options(ProducerOptions)
class Producer:
    """Publishes to NSQ. Give exactly one of ``lookupd`` (nsqlookupd HTTP addresses; youzan
    or classic) or ``nsqd`` (classic nsqd TCP addresses). Durations are in seconds.

    ``publish_timeout`` is the one bound of a publish, retries included: a publish returns or
    raises :class:`PublishError` within it. A failover on real youzan keeps a partition from
    taking writes for 21-29 s with 3 replicas, and for 95-112 s with 2 (nsqlookupd offers a
    partition for writes again only once a majority of its replicas are in sync); the default
    (120 s) rides out both. ``max_retries`` (None: no count, only the time bound) stops
    earlier after that many retries.
    """

    def __init__(
        self,
        *,
        lookupd: Sequence[str] | None = None,
        nsqd: Sequence[str] | None = None,
        sharding: ShardingStrategy = "java",
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
        max_retries: int | None = None,
        retry_backoff: Backoff | None = None,
        connections_per_partition: int = 1,
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        heartbeat_interval: float = 30.0,
        tls: Any = False,
        compression: Compression = None,
        deflate_level: int = 6,
        auth_secret: str | bytes | None = None,
        client_id: str | None = None,
        user_agent: str | None = None,
        lookupd_poll_interval: float = 60.0,
        max_msg_size: int = MAX_MSG_SIZE,
        max_body_size: int = MAX_BODY_SIZE,
        trace: bool = False,
        trace_key_hash: bool = False,
        linger: float | None = None,
        max_batch: int = 100,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        lookup_manager: LookupManager | None = None,
        address_map: AddressMapping | None = None,
    ) -> None:
        # Checked here, once, before anything is sent; read from here by every part.
        self.options = options = ProducerOptions(**keyword_arguments(locals()))
        self._nsqd, self._lookup, self._owns_lookup = options.targets()
        self._pool = ConnectionPool(
            options.connection_config, connections_per_key=options.connections_per_partition
        )
        self._router = Router(options.sharder, self._nsqd)
        self._codec = PublishCodec(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            inject=Telemetry.inject,
        )
        # Bound once: the hot path calls these per publish, with no lookup through the parts.
        self._direct_routes = self._router.direct_routes
        self._route_layout = self._router.route
        self._route_classic = self._router.route_classic
        self._pin = self._router.pin
        self._prepare = self._codec.prepare
        self._results = self._codec.results
        self._max_msg_size = options.max_msg_size
        self._request_timeout = options.connection_config.request_timeout
        # The event loop's clock (deadlines are in its time), bound when the producer starts.
        self._clock: Callable[[], float] = time.monotonic
        self._trace_default = bool(options.trace)
        self._trace_topics: dict[str, bool] = {}
        self._telemetry = Telemetry(
            "producer",
            tracer_provider=options.tracer_provider,
            meter_provider=options.meter_provider,
        )
        self._batcher = (
            Batcher(
                self._flush_batch,
                linger=options.linger,
                max_batch=options.max_batch,
                max_bytes=options.max_body_size,
            )
            if options.linger is not None
            else None
        )
        self._stats = ProducerStats()
        self._gate = RetryGate()
        self._log_throttle = LogThrottle()
        self._state = "new"  # new -> starting -> started -> closed
        # Set when close() begins: new publishes are refused while the batches already
        # accepted are flushed (the state stays "started" so that their retries still run).
        self._closing = False
        self._start_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Producer:
        """Return once publishing can succeed: a lookupd answers, or (direct mode) at least
        one nsqd accepted a connection. Raises after ``connect_timeout`` otherwise."""
        if self._state == "closed":
            raise _closing_error()
        if self._state == "started":
            return self
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._state == "started":
                return self
            self._state = "starting"
            timeout = self.options.connect_timeout
            try:
                await asyncio.wait_for(self._warm_up(), timeout)
            except TimeoutError:
                self._failed_start()
                raise NSQTimeoutError(
                    f"the producer could not start within {timeout} s: {self._awaited()}"
                ) from None
            except BaseException:
                self._failed_start()
                raise
            self._begin()
        return self

    def _begin(self) -> None:
        """What a publish needs before its first try: the loop's clock. No warm-up: its
        tries look up and connect themselves, and what fails there (an nsqd refusing
        connections, a lookupd down) is retried within the publish's deadline like any
        other failure, in direct mode as through nsqlookupd."""
        if self._state == "closed":
            raise _closing_error()
        self._clock = _clock_of(asyncio.get_running_loop())
        self._state = "started"

    def _failed_start(self) -> None:
        if self._state == "starting":  # not begun by a publish meanwhile
            self._state = "new"

    def _awaited(self) -> str:
        """What start() waits for, to say what did not answer."""
        if self._lookup is not None:
            return "no nsqlookupd answered at " + ", ".join(self._lookup.lookupd_addresses)
        return (
            "no nsqd completed the NSQ handshake at "
            + ", ".join(self._nsqd)
            + " (nsqd TCP ports, default 4150?)"
        )

    async def _warm_up(self) -> None:
        if self._lookup is not None:
            await self._lookup.discover()
            return
        results = await asyncio.gather(
            *(self._pool.get(address, ANY_TOPIC, None) for address in self._nsqd),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if len(errors) == len(results):
            raise errors[0]
        for address, result in zip(self._nsqd, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("nsqd %s is not reachable yet: %s", address, result)

    async def close(self) -> None:
        """Refuse new publishes, send the auto-batched ones already accepted (waiting up to
        ``publish_timeout`` for their answers), then close every connection; publishes
        still in flight fail with :class:`ClientClosedError`. Not reusable afterwards."""
        if self._state == "closed":
            return
        self._closing = True
        if self._batcher is not None:
            await self._batcher.flush(self.options.publish_timeout)
            self._batcher.close(
                ClientClosedError(
                    "the Producer was closed before this publish was answered "
                    "(nsqd may or may not have stored it)"
                )
            )
        self._state = "closed"
        await self._pool.close()
        if self._lookup is not None and self._owns_lookup:
            await self._lookup.close()

    async def __aenter__(self) -> Producer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __del__(self) -> None:
        if getattr(self, "_state", "closed") == "started":
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=2)

    def __repr__(self) -> str:
        if self._lookup is not None:
            target = "lookupd=" + ",".join(self._lookup.lookupd_addresses)
        else:
            target = "nsqd=" + ",".join(self._nsqd)
        return f"<Producer {target} {self._state}>"

    def stats(self) -> ProducerStats:
        """A snapshot of the counters (see :class:`ProducerStats`); also after close."""
        return self._stats.snapshot(self._pool.open_connections())

    # ------------------------------------------------------------------ tracing switch

    def set_trace(self, enabled: bool, topic: str | None = None) -> None:
        """Turn message tracing (PUB_TRACE with a generated trace id) on or off, for every
        topic or for one; takes effect for the next publish."""
        if topic is None:
            self._trace_default = bool(enabled)
            self._trace_topics.clear()
        else:
            self._trace_topics[check_topic(topic)] = bool(enabled)

    def tracing(self, topic: str) -> bool:
        """Whether publishes to ``topic`` are traced by default."""
        return self._trace_topics.get(topic, self._trace_default)

    # ------------------------------------------------------------------ API

    async def publish(
        self,
        topic: str,
        body: bytes | str,
        *,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
        delay: float | None = None,
        timeout: float | None = None,
    ) -> PublishResult:
        """Publish one message; return what nsqd accepted or raise.

        ``partition`` and ``sharding_key`` are exclusive; ``trace_id`` uses PUB_TRACE (the
        result carries the receipt); ``ext`` uses PUB_EXT (ext topics only); ``delay``
        (seconds) uses DPUB (classic nsqd only); ``timeout`` (seconds) bounds this publish
        instead of ``publish_timeout``. Bad input raises before anything is sent; a failed
        publish raises :class:`PublishError` (retries exhausted) or the server's typed error
        (not retriable).
        """
        batcher = self._batcher
        if (
            batcher is not None
            and timeout is None
            and trace_id is None
            and ext is None
            and delay is None
        ):
            if (
                partition is None
                and sharding_key is None
                and self._state == "started"
                and not self.tracing(topic)
            ):
                # The common auto-batched publish: the topic's unkeyed lane, nothing to
                # decide (the batch is the request; see _batched for every other case).
                check_topic(topic)
                data = check_body(body, self._max_msg_size)
                if self._closing:
                    raise _closing_error()
                result: PublishResult = await batcher.add((topic, "any"), data, None, ordered=False)
                return result
            request, _ = self._request(topic, body, partition, sharding_key, None, None, None, None)
            return await self._batched(request)
        request, timeout = self._request(
            topic, body, partition, sharding_key, trace_id, ext, delay, timeout
        )
        results = await self._run(request, timeout)
        return results[0]

    def _request(
        self,
        topic: str,
        body: bytes | str,
        partition: int | None,
        sharding_key: Any,
        trace_id: int | None,
        ext: Mapping[str, Any] | None,
        delay: float | None,
        timeout: float | None,
    ) -> tuple[PublishRequest, float | None]:
        """:meth:`publish`'s arguments checked (bad input raises here, before anything is
        sent): its request, and its own time bound (None: ``publish_timeout``)."""
        check_topic(topic)
        data = check_body(body, self._max_msg_size)
        if timeout is not None:
            timeout = check_publish_timeout("timeout", timeout)
        if self._closing:
            raise _closing_error()
        if partition is None and sharding_key is None:
            key = NO_KEY
        else:
            partition, key = self._binding(partition, sharding_key)
        if (
            trace_id is None
            and ext is None
            and delay is None
            and not self._trace_topics.get(topic, self._trace_default)  # tracing(topic)
        ):
            return PublishRequest(topic, "PUB", [data], partition, key), timeout
        request = message_request(
            topic,
            data,
            partition=partition,
            key=key,
            trace_id=trace_id,
            ext=ext,
            delay=delay,
            switched_trace_id=self._switched_trace_id(topic, key),
        )
        return request, timeout

    async def publish_many(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        *,
        partition: int | None = None,
        sharding_key: Any = None,
        sharding_keys: Sequence[Any] | None = None,
        trace: bool = False,
        trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any] | None] | None = None,
        timeout: float | None = None,
    ) -> list[PublishResult]:
        """Publish a batch atomically to one partition (MPUB; MPUB_TRACE with ``trace`` or
        ``trace_ids``; MPUB_EXT with ``exts``). One result per message.

        ``sharding_keys`` (one key per body, exclusive with ``partition`` and
        ``sharding_key``) routes each message as ``publish(sharding_key=...)`` would: the
        messages are grouped into one MPUB per partition (per nsqd on classic), each keeping
        the input order, sent concurrently; the results come back in input order. Each
        batch is atomic, the call as a whole is not: if one batch fails, the error is raised
        once the others are answered, and those may have been stored.
        """
        check_topic(topic)
        if timeout is not None:
            timeout = check_publish_timeout("timeout", timeout)
        if sharding_keys is not None:
            if partition is not None or sharding_key is not None:
                raise ValidationError(
                    "sharding_keys", "give sharding_keys, or a partition or a sharding_key"
                )
            return await self._publish_keyed(
                topic, bodies, sharding_keys, trace, trace_ids, exts, timeout
            )
        data = check_bodies(list(bodies), self._max_msg_size, self.options.max_body_size)
        if self._closing:
            raise _closing_error()
        partition, key = self._binding(partition, sharding_key)
        ids, encoded, auto = batch_extras(
            len(data), trace=trace, trace_ids=trace_ids, exts=exts, switched=self.tracing(topic)
        )
        request = batch_request(
            topic, data, partition=partition, key=key, trace_ids=ids, exts=encoded, auto_trace=auto
        )
        return await self._run(request, timeout)

    async def _publish_keyed(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        keys: Sequence[Any],
        trace: bool,
        trace_ids: Sequence[int] | None,
        exts: Sequence[Mapping[str, Any] | None] | None,
        timeout: float | None,
    ) -> list[PublishResult]:
        """publish_many with a sharding key per message: one MPUB per target, in parallel."""
        # Each batch is checked against max_body_size below, once grouped: not the total.
        data = check_bodies(list(bodies), self._max_msg_size, _UNBOUNDED)
        count = len(data)
        if isinstance(keys, (str, bytes)) or len(keys) != count:
            raise ValidationError("sharding_keys", f"give one key per body ({count} bodies)")
        if None in keys:
            index = next(i for i, key in enumerate(keys) if key is None)
            raise ValidationError(f"sharding_keys[{index}]", "a key is required")
        ids, encoded, auto = batch_extras(
            count, trace=trace, trace_ids=trace_ids, exts=exts, switched=self.tracing(topic)
        )
        if self._closing:
            raise _closing_error()
        if self._state != "started":
            self._begin()
        limit = self.options.publish_timeout if timeout is None else timeout
        deadline = self._clock() + limit
        targets = await self._looked_up(
            PublishRequest(topic, "MPUB", data),
            deadline,
            lambda layout: self._router.key_targets(topic, keys, layout),
        )
        groups: dict[int | str, list[int]] = {}
        for target in set(targets):
            groups[target] = []
        appenders = {target: group.append for target, group in groups.items()}
        for index, target in enumerate(targets):
            appenders[target](index)
        requests = []
        for target, indexes in groups.items():
            batch = [data[i] for i in indexes] if len(groups) > 1 else data
            size = 4 + 4 * len(batch) + sum(map(len, batch))
            if size > self.options.max_body_size:
                raise ValidationError(
                    "bodies",
                    f"the batch for {_describe_target(target)} is {size} bytes on the wire, "
                    f"over the maximum of {self.options.max_body_size}",
                )
            # Keyed: each batch goes to its key's target for all its tries.
            request = batch_request(
                topic,
                batch,
                partition=target if isinstance(target, int) else None,
                address=target if isinstance(target, str) else None,
                trace_ids=None if ids is None else [ids[i] for i in indexes],
                exts=None if encoded is None else [encoded[i] for i in indexes],
                auto_trace=auto,
            )
            requests.append((indexes, request))
        remaining = max(deadline - self._clock(), 1e-3)  # the one deadline, for every batch
        outcomes = await asyncio.gather(
            *(self._run(request, remaining) for _, request in requests), return_exceptions=True
        )
        results: list[PublishResult | None] = [None] * count
        place = results.__setitem__
        for (indexes, _), outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            collections.deque(map(place, indexes, outcome), maxlen=0)
        return cast("list[PublishResult]", results)  # every index is in exactly one group

    def _binding(self, partition: int | None, key: Any) -> tuple[int | None, Any]:
        """A publish's explicit partition or sharding key, checked (``NO_KEY``: none)."""
        if partition is not None and key is not None:
            raise ValidationError("partition", "give a partition or a sharding_key, not both")
        if partition is not None:
            return check_partition(partition), NO_KEY
        if key is not None:
            self.options.sharder.partition_for(key, 1)  # the key's type is checked now
            return None, key
        return None, NO_KEY

    def _switched_trace_id(self, topic: str, key: Any) -> Callable[[], int] | None:
        """The trace switch for ``topic``: what gives a publish its trace id when it is on."""
        return functools.partial(self._new_trace_id, key) if self.tracing(topic) else None

    def _new_trace_id(self, key: Any) -> int:
        if key is not NO_KEY and self.options.trace_key_hash:
            # youzan go-nsq traces a keyed publish with the key's hash
            hashed = self.options.sharder.hash32(key)
            if hashed is not None:
                return hashed & 0xFFFFFFFF
        return random.getrandbits(64)

    # ------------------------------------------------------------------ batching

    async def _batched(self, request: PublishRequest) -> PublishResult:
        """Hand the message to the batcher, in the lane of its partition (keyed or explicit
        publishes) or the topic's shared lane (unkeyed)."""
        if self._state != "started":
            self._begin()
        if self._batcher is None:  # pragma: no cover - only called with a batcher
            raise ValidationError("linger", "batching is off")
        lane: tuple[Any, ...]
        ordered = not request.movable
        if not ordered:
            lane = (request.topic, "any")
        else:
            # The lane is the partition (or classic nsqd), known without a writable leader:
            # a publish waiting for a failover waits in the lane, within the retry loop.
            target = self._target_now(request)
            if target is None:
                deadline = self._clock() + self.options.publish_timeout
                target = await self._looked_up(
                    request, deadline, lambda layout: self._router.target(request, layout)
                )
            lane = (request.topic, "pinned", isinstance(target, int), target)
        trace_id = request.trace_ids[0] if request.trace_ids else None
        result: PublishResult = await self._batcher.add(
            lane, request.bodies[0], trace_id, ordered=ordered
        )
        return result

    async def _flush_batch(
        self, lane: Any, bodies: list[bytes], trace_ids: list[int] | None
    ) -> list[PublishResult]:
        """Send one batch of a lane (the batcher's flush): an MPUB request like any other."""
        pinned = lane[1] == "pinned"
        request = batch_request(
            lane[0],
            bodies,
            partition=lane[3] if pinned and lane[2] else None,
            address=lane[3] if pinned and not lane[2] else None,
            trace_ids=trace_ids,
            auto_trace=trace_ids is not None,
        )
        return await self._run(request, None)

    def _target_now(self, request: PublishRequest) -> int | str | None:
        """The batch lane's target from what is cached (None: it must be looked up)."""
        if self._lookup is None:
            return self._router.target(request, None)
        layout = self._lookup.cached(request.topic, "w")
        if layout is None:
            return None
        try:
            return self._router.target(request, layout)
        except NoWritablePartitionError:
            return None

    async def _looked_up(
        self,
        request: PublishRequest,
        deadline: float,
        decide: Callable[[TopicLayout | None], T],
    ) -> T:
        """``decide(layout)`` on the topic's layout (None on classic nsqd in direct mode),
        looked up and decided again within the retry loop until ``deadline``: where an
        auto-batched keyed publish or the batches of ``publish_many(sharding_keys=...)`` go."""
        tries = PublishTries()
        lookup = self._lookup

        async def attempt(now: float = 0.0) -> T:
            layout = None
            if lookup is not None:
                lookup_done = lookup.lookup(request.topic, "w")
                layout = tries.layout = await _by_deadline(lookup_done, deadline, "the lookup")
            return decide(layout)

        try:
            try:
                return await attempt()
            except NSQError as exc:
                return await self._retry(request, tries, deadline, exc, attempt)
        except Exception as exc:
            if not _refused(exc, tries):
                self._stats.failed(len(request.bodies) or 1)
            raise

    # ------------------------------------------------------------------ one publish

    async def _run(
        self,
        request: PublishRequest,
        timeout: float | None,
        tries: PublishTries | None = None,
        failure: BaseException | None = None,
    ) -> list[PublishResult]:
        """Publish ``request`` (every publish that is not auto-batched, and every batch the
        batcher sends): its first try and its retries take the one path of a try
        (:meth:`_try`), all by one deadline (``timeout``, else ``publish_timeout``); the
        outcome is counted and, with OpenTelemetry, traced. A first try made elsewhere (a
        blocking publish's, by its calling thread: ``tries``) that failed with ``failure``
        goes on here, from its retries."""
        if self._state != "started":
            self._begin()
        telemetry = self._telemetry
        metered = telemetry.enabled
        span = telemetry.start_send(request.topic, len(request.bodies)) if metered else None
        if tries is None:
            tries = PublishTries(span)
        now = self._clock()
        deadline = now + (self.options.publish_timeout if timeout is None else timeout)
        try:
            try:
                if failure is not None:
                    raise failure
                frame = await self._try(request, tries, deadline, now)
            except NSQError as exc:
                frame = await self._retry(request, tries, deadline, exc)
            results = self._results(request, tries.route, frame, tries.count, tries.trace_ids)
        except BaseException as exc:
            if metered:
                self._meter_failure(request, span, exc)
            if isinstance(exc, Exception) and not _refused(exc, tries):
                self._stats.failed(len(request.bodies))
            raise
        self._stats.acknowledged(request.bodies, results)
        if results[0].internal_id is not None:
            for result in results:
                log_publish(result)
        if metered:
            telemetry.count(
                "published", len(results), {"messaging.destination.name": request.topic}
            )
            if span is not None:
                end_send_span(span, results)
        return results

    def _meter_failure(self, request: PublishRequest, span: Any, exc: BaseException) -> None:
        attributes = {"messaging.destination.name": request.topic, "error.type": error_type(exc)}
        self._telemetry.count("publish_errors", 1, attributes)
        if span is not None:
            Telemetry.fail(span, exc)
            span.end()

    def _try(
        self, request: PublishRequest, tries: PublishTries, deadline: float, now: float
    ) -> Awaitable[bytes]:
        """One try of ``request`` (``now``: the loop's time): route it, take its connection,
        send it. The awaitable gets nsqd's answer, and ends by ``deadline``. When the layout
        is cached and the connection open (the common case) it is the request's own future:
        every wait of a try is already satisfied, and nothing else is awaited."""
        lookup = self._lookup
        if lookup is None:
            route = self._route_in(request, tries, None)
        else:
            layout = lookup.cached(request.topic, "w")
            if layout is None:
                return self._try_waiting(request, tries, deadline, None)
            route = self._route_in(request, tries, layout)
        conn = self._pool.get_nowait(route.address, route.pool_topic, route.partition)
        if conn is None or conn.writing_paused:
            return self._try_waiting(request, tries, deadline, route)
        return self._send(request, tries, route, conn, deadline, now)

    async def _try_waiting(
        self, request: PublishRequest, tries: PublishTries, deadline: float, route: Route | None
    ) -> bytes:
        """:meth:`_try` when it has to wait: for the layout (``route`` None), then for the
        connection (made, or being made), and for nsqd to read what waits in the socket's
        buffer; every wait ends by ``deadline``."""
        scope = asyncio.timeout_at(deadline)
        waiting_for = "a lookup"
        try:
            async with scope:
                if route is None:
                    layout = None
                    if self._lookup is not None:
                        layout = await self._lookup.lookup(request.topic, "w")
                    route = self._route_in(request, tries, layout)
                waiting_for = f"a connection to {route.address}"
                conn = await self._pool.get(route.address, route.pool_topic, route.partition)
                if conn.writing_paused:
                    # nsqd reads slower than publishes come: wait for it, not in its buffer
                    # (drain() closes a connection blocked for write_timeout).
                    waiting_for = f"{route.address} to read what was sent before"
                    await conn.drain()
                waiting_for = f"the answer of {route.address}"
                return await self._send(request, tries, route, conn, deadline, self._clock())
        except TimeoutError:
            if not scope.expired():
                raise  # a timeout of its own (an NSQTimeoutError), not the deadline's
            raise NSQTimeoutError(
                f"the publish ran out of time waiting for {waiting_for} (try {tries.count})"
            ) from None

    def _send(
        self,
        request: PublishRequest,
        tries: PublishTries,
        route: Route,
        conn: Connection,
        deadline: float,
        now: float,
    ) -> Awaitable[bytes]:
        """Encode the try (what the server refuses raises here, before anything is sent) and
        queue it on ``conn``; the awaitable gets nsqd's answer, by ``deadline``."""
        remaining = deadline - now
        command, data = self._encode(request, tries, route, route.youzan or conn.youzan, remaining)
        # request_timeout is the connection's: an answer later than that means the link is
        # dead, and the connection closes. A publish whose deadline comes first stops waiting
        # then, and leaves the connection (and the publishes sharing it) alone.
        answer = conn.request_future(data, command, self._request_timeout)
        tries.sent = True
        if remaining >= self._request_timeout:
            return answer
        return _by_deadline(answer, deadline, f"{command} to {route.address}")

    def _encode(
        self,
        request: PublishRequest,
        tries: PublishTries,
        route: Route,
        youzan: bool,
        remaining: float,
    ) -> tuple[str, bytes]:
        """The command and bytes of this try for its server (``youzan``: a youzan nsqd),
        noting the trace ids it sends in ``tries``; what the server refuses raises here, and
        so does a try left no time (``remaining`` seconds), before anything is sent."""
        command, data, tries.trace_ids = self._prepare(request, route, youzan, tries.span)
        if remaining <= 0:
            raise NSQTimeoutError(f"the publish ran out of time before try {tries.count} was sent")
        return command, data

    def _route_in(
        self, request: PublishRequest, tries: PublishTries, layout: TopicLayout | None
    ) -> Route:
        """This try's route (the router decides, from the tries so far), noted in ``tries``;
        a keyed or explicit-partition publish is pinned at its first routing."""
        if layout is None:
            route = self._route_classic(request, self._direct_routes)
        else:
            tries.layout = layout
            pinned = tries.pinned
            if pinned is not None or (request.partition is None and request.key is NO_KEY):
                route = self._route_layout(request, layout, tries.avoid, pinned)
            else:
                route = self._pinning_route(request, tries, layout)
        tries.route = route
        return route

    def _pinning_route(
        self, request: PublishRequest, tries: PublishTries, layout: TopicLayout
    ) -> Route:
        """The first route of a keyed or explicit-partition publish, which pins it to its
        partition: the route's, or the one it has even without a writable leader now."""
        try:
            route = self._route_layout(request, layout, tries.avoid, None)
        except NoWritablePartitionError:
            with contextlib.suppress(NSQError):  # no partition count yet: nothing to pin
                tries.pinned = self._pin(request, layout)
            raise
        if route.youzan:  # classic nsqd has no partitions to pin to
            tries.pinned = route.partition
        return route

    # ------------------------------------------------------------------ retries

    async def _retry(
        self,
        request: PublishRequest,
        tries: PublishTries,
        deadline: float,
        failure: BaseException,
        attempt: Callable[[float], Awaitable[T]] | None = None,
    ) -> T:
        """Try again after ``failure`` (``attempt(now)``, by default the publish's next try)
        until it succeeds, a failure is not retriable (raised as it is), or ``deadline``
        (``publish_timeout``) or ``max_retries`` ends it: then :class:`PublishError`, caused
        by the last failure. ``tries`` counts the tries; each ends by the deadline itself.
        What waits here is what a publish is while it waits (thousands during a long
        failover): no more coroutines, closures or timers than the wait needs."""
        clock = self._clock
        failing_since = clock()
        warned = False
        while True:
            tries.ended(failure)
            if not is_retriable(failure):
                raise failure
            max_retries = self.options.max_retries
            if max_retries is not None and tries.count > max_retries:
                raise self._given_up(
                    request, tries, f"max_retries={max_retries}", failure
                ) from failure
            self._note_failure(request, tries, failure)
            failing_for = clock() - failing_since
            if not warned and failing_for >= _WARN_AFTER:
                warned = True
                self._warn_failing(request, failure, tries.count, failing_for)
            stale = tries.layout
            pause = self._pause(request, tries, failure, deadline)
            if pause is not None:
                layout = await pause
                if layout is not None and stale is not None:
                    self._log_leader_move(request, tries, stale, layout)
            await self._gate.enter()  # a storm of retries goes over several turns of the loop
            now = clock()
            if deadline - now <= 0:
                raise self._given_up(request, tries, "publish_timeout", failure) from failure
            tries.count += 1
            self._stats.retries += 1
            try:
                if attempt is None:
                    return await self._try(request, tries, deadline, now)  # type: ignore[return-value]
                return await attempt(now)
            except NSQError as exc:
                failure = exc

    def _given_up(
        self, request: PublishRequest, tries: PublishTries, bound: str, last: BaseException
    ) -> PublishError:
        cause = "timed out" if bound == "publish_timeout" else f"reached {bound}"
        partition = request.partition if request.partition is not None else tries.pinned
        where = "" if partition is None else f" partition {partition}"
        unknown = tries.unanswered
        outcome = "; a try was sent and not answered: nsqd may have stored it" if unknown else ""
        return PublishError(
            f"publish to {request.topic!r}{where} failed after {tries.count} tries ({cause}"
            f"{outcome}): {last}",
            topic=request.topic,
            partition=partition,
            tries=tries.count,
            outcome_unknown=unknown,
        )

    def _note_failure(
        self, request: PublishRequest, tries: PublishTries, exc: BaseException
    ) -> None:
        """A retriable failure of the last try, to be retried."""
        tries.failed(request)
        self._telemetry.count("retries", 1, {"messaging.destination.name": request.topic})
        if tries.span is not None:
            tries.span.add_event(
                "retry",
                {
                    "error.type": error_type(exc),
                    "messaging.destination.partition.id": str(tries.last_partition),
                },
            )
        # Expected in a failover or a leader move: a debug record per try. What a user needs
        # to see is logged when a leader moves (_pause) or when it lasts (_warn_failing).
        log.debug(
            "publish to %s (partition %s) failed on try %d (%s); retrying",
            request.topic,
            tries.last_partition,
            tries.count,
            exc,
        )

    def _warn_failing(
        self, request: PublishRequest, exc: BaseException, tries: int, seconds: float
    ) -> None:
        held = self._log_throttle.allow(("failing", request.topic))
        if held is None:
            return
        log.warning(
            "publishes to %s have been failing for %.1f s (%d tries; last: %s); still "
            "retrying, within publish_timeout%s",
            request.topic,
            seconds,
            tries,
            exc,
            LogThrottle.note(held, self._log_throttle.interval),
        )

    def _pause(
        self, request: PublishRequest, tries: PublishTries, failure: BaseException, deadline: float
    ) -> Awaitable[TopicLayout | None] | None:
        """What to wait for before the next try (None: nothing). A failure that says the
        layout is stale waits for nsqlookupd to name somewhere else to go (woken as soon as a
        lookup does: the awaitable gives that layout), at most the backoff; a publish that had
        nowhere to go at all waits for that alone (in rounds of ``_WARN_AFTER``). Never past
        ``deadline``."""
        remaining = deadline - self._clock()
        if remaining <= 0:
            return None
        if request.movable and tries.avoid and tries.count <= 1:
            delay = 0.0  # an unkeyed publish moves to another writable partition at once
        else:
            delay = self.options.retry_delays.delay(tries.count)
        lookup = self._lookup
        if lookup is None or not needs_lookup_refresh(failure):
            return _sleeping(min(delay, remaining))
        if isinstance(failure, NoWritablePartitionError):
            # Only a new layout can help: no try before it comes, but a look every
            # _WARN_AFTER seconds at how long this lasts (a try that routes nowhere is free).
            delay = max(delay, _WARN_AFTER)
        stale, pinned = tries.layout, tries.pinned
        routable = self._router.routable

        def recovered(layout: TopicLayout) -> bool:
            return layout != stale and routable(request, layout, pinned)

        return lookup.wait_until(request.topic, "w", recovered, min(delay, remaining))

    def _log_leader_move(
        self, request: PublishRequest, tries: PublishTries, stale: TopicLayout, layout: TopicLayout
    ) -> None:
        partition = tries.last_partition
        if partition is None:
            return
        before, after = stale.partitions.get(partition), layout.partitions.get(partition)
        if before is None or after is None or before.tcp_address == after.tcp_address:
            return
        held = self._log_throttle.allow(("moved", request.topic, partition))
        if held is not None:
            log.info(
                "%s partition %d: the leader moved from %s to %s; publishing there%s",
                request.topic,
                partition,
                before.tcp_address,
                after.tcp_address,
                LogThrottle.note(held, self._log_throttle.interval),
            )


def _refused(exc: Exception, tries: PublishTries) -> bool:
    """Whether a publish was refused before anything of it was sent: its arguments (a
    partition the topic does not have) or what its server cannot take (``delay=`` on youzan),
    on its first try. Such a publish is no failure in the stats (the reference counts the
    publishes that raised once sent)."""
    return tries.count == 1 and isinstance(exc, (ValidationError, UnsupportedFeatureError))


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock; for asyncio's own loops, the function behind it (a call less on a
    path taken per publish)."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic  # what BaseEventLoop.time() returns
    return loop.time


def _sleeping(delay: float) -> asyncio.Future[None]:
    """A future done in ``delay`` seconds: what ``asyncio.sleep`` does, without a coroutine
    of its own (a publish waiting to retry holds one less)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    loop.call_later(delay, _wake, future)
    return future


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled wait: nothing to do
        future.set_result(None)


async def _by_deadline(awaitable: Awaitable[T], deadline: float, what: str) -> T:
    """``awaitable``'s outcome, or :class:`NSQTimeoutError` (retriable) once ``deadline``
    (the loop's time) passes first."""
    scope = asyncio.timeout_at(deadline)
    try:
        async with scope:
            return await awaitable
    except TimeoutError:
        if not scope.expired():
            raise  # a timeout of its own (an NSQTimeoutError), not the deadline's
        raise NSQTimeoutError(f"{what}: the publish ran out of time") from None


def _describe_target(target: int | str) -> str:
    return f"partition {target}" if isinstance(target, int) else f"nsqd {target}"


def _closing_error() -> ClientClosedError:
    return ClientClosedError("this Producer is closed or closing; create a new one")
