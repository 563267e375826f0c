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
import functools
import logging
import random
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

from smartnsq.client.options import ClientOptions
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
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.protocol.validation import (
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    check_bodies,
    check_body,
    check_partition,
    check_topic,
    check_trace_id,
    encode_ext,
)
from smartnsq.publishing.request import (
    NO_KEY,
    PublishRequest,
    delay_to_ms,
    ext_with_trace_id,
    new_trace_ids,
)
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import ANY_TOPIC, Route, Router
from smartnsq.publishing.stats import ProducerStats
from smartnsq.publishing.wire import PublishCodec
from smartnsq.routing.addresses import AddressMapping
from smartnsq.routing.sharding import Sharder, ShardingStrategy
from smartnsq.transport.connection import Compression, Connection
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.pool import ConnectionPool

__all__ = ["DEFAULT_PUBLISH_TIMEOUT", "Producer", "ProducerStats", "PublishResult"]

log = logging.getLogger("smartnsq.producer")

T = TypeVar("T")

#: The default ``publish_timeout``: longer than every failover measured on real youzan nsq
#: (docs/guides/durable-channels.md), the slowest being about 112 s, as Kafka's producer
#: waits up to 120 s (delivery.timeout.ms) by default.
DEFAULT_PUBLISH_TIMEOUT = 120.0
# A publish still failing after this long is worth a warning (a leader move takes less).
_WARN_AFTER = 5.0

# publish_many(sharding_keys=...) checks each body first and each partition's batch later.
_UNBOUNDED = 1 << 62


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
        if (
            isinstance(publish_timeout, bool)
            or not isinstance(publish_timeout, (int, float))
            or not publish_timeout > 0
        ):
            raise ValidationError("publish_timeout", "must be > 0 seconds")
        if max_retries is not None and (type(max_retries) is not int or max_retries < 0):
            raise ValidationError(
                "max_retries", "must be an int >= 0, or None (bounded by publish_timeout only)"
            )
        self.publish_timeout = float(publish_timeout)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff or Backoff()
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.sharder = Sharder(sharding)
        self.options = ClientOptions(
            lookupd=lookupd,
            nsqd=nsqd,
            connect_timeout=connect_timeout,
            heartbeat_interval=heartbeat_interval,
            tls=tls,
            compression=compression,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            client_id=client_id,
            user_agent=user_agent,
            lookupd_poll_interval=lookupd_poll_interval,
            lookup_manager=lookup_manager,
            address_map=address_map,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        self.connection_config = self.options.connection_config(request_timeout=request_timeout)
        self._nsqd, self._lookup, self._owns_lookup = self.options.targets()
        self._pool = ConnectionPool(
            self.connection_config, connections_per_key=connections_per_partition
        )
        self._router = Router(self.sharder, self._nsqd)
        self._codec = PublishCodec(
            max_msg_size=max_msg_size, max_body_size=max_body_size, inject=Telemetry.inject
        )
        # Bound once: the hot path calls these per publish, with no lookup through the parts.
        self._direct_routes = self._router.direct_routes
        self._route_layout = self._router.route
        self._route_classic = self._router.route_classic
        self._fit = self._codec.fit
        self._prepare = self._codec.prepare
        self._results = self._codec.results
        self._trace_default = bool(trace)
        self._trace_topics: dict[str, bool] = {}
        self.trace_key_hash = trace_key_hash
        self._telemetry = Telemetry(
            "producer",
            tracer_provider=self.options.tracer_provider,
            meter_provider=self.options.meter_provider,
        )
        if linger is not None and (not isinstance(linger, (int, float)) or linger < 0):
            raise ValidationError("linger", "must be >= 0 seconds, or None (no batching)")
        if type(max_batch) is not int or max_batch < 1:
            raise ValidationError("max_batch", "must be an int >= 1")
        self._batcher = (
            Batcher(self._flush_batch, linger=linger, max_batch=max_batch, max_bytes=max_body_size)
            if linger is not None
            else None
        )
        self._stats = ProducerStats()
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
            timeout = self.connection_config.connect_timeout
            try:
                await asyncio.wait_for(self._warm_up(), timeout)
            except TimeoutError:
                self._state = "new"
                raise NSQTimeoutError(
                    f"the producer could not start within {timeout} s: {self._awaited()}"
                ) from None
            except BaseException:
                self._state = "new"
                raise
            self._state = "started"
        return self

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
            await self._batcher.flush(self.publish_timeout)
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
        (seconds) uses DPUB (classic nsqd only). Bad input raises before anything is sent;
        a failed publish raises :class:`PublishError` (retries exhausted) or the server's
        typed error (not retriable).
        """
        check_topic(topic)
        data = check_body(body, self.max_msg_size)
        if self._closing:
            raise _closing_error()
        batcher = self._batcher
        if (
            batcher is not None
            and partition is None
            and sharding_key is None
            and trace_id is None
            and ext is None
            and delay is None
            and timeout is None
            and self._state == "started"
            and not self.tracing(topic)
        ):
            # The common auto-batched publish, without the per-request bookkeeping: the
            # batch is the request (see _batched for every other case).
            result: PublishResult = await batcher.add((topic, "any"), data, None, ordered=False)
            return result
        request = PublishRequest(topic, "PUB", [data])
        self._common_args(request, partition, sharding_key)
        if trace_id is not None:
            request.trace_ids = [check_trace_id(trace_id)]
            request.command = "PUB_TRACE"
        elif delay is None and self.tracing(topic):
            request.trace_ids = [self._new_trace_id(request.key)]
            request.command = "PUB_TRACE"
            request.auto_trace = True
        if ext is not None:
            encoded = encode_ext(ext)
            if request.trace_ids is not None:
                # PUB_EXT carries a trace id in its header (and is answered with a receipt)
                encoded, trace = ext_with_trace_id(
                    encoded, request.trace_ids[0], request.auto_trace
                )
                request.trace_ids = [trace]
            request.exts = [encoded]
            request.command = "PUB_EXT"
        if delay is not None:
            if trace_id is not None or ext is not None:
                raise UnsupportedFeatureError("delay cannot be combined with trace_id or ext")
            request.delay_ms = delay_to_ms(delay)
            request.command = "DPUB"
        if (
            self._batcher is not None
            and timeout is None
            and request.exts is None
            and request.delay_ms is None
            and (request.command == "PUB" or request.auto_trace)
        ):
            return await self._batched(request)
        if self._state == "started" and not self._telemetry.enabled:
            # Fast path: layout cached and connection open -> one await, no coroutine chain.
            # Whatever fails here (routing included) goes to the retry loop, as in _run.
            route: Route | None = None
            try:
                route = self._route_now(request)
                if route is not None:
                    limit = self.publish_timeout if timeout is None else float(timeout)
                    request.last_partition = route.partition
                    # Connect on the route chosen here: routing again would skip partitions.
                    conn = self._pool.get_nowait(route.address, route.pool_topic, route.partition)
                    if conn is None:
                        conn = await self._pool.get(
                            route.address, route.pool_topic, route.partition
                        )
                    frame = await self._send(request, route, conn, limit)
            except Exception as exc:
                if not is_retriable(exc):
                    self._stats.failed(1)
                    raise
                results = await self._run(request, timeout, first_failure=exc)
                return results[0]
            if route is not None:
                results = self._results(request, route, frame, 1)
                self._stats.acknowledged(request.bodies, results)
                if results[0].internal_id is not None:
                    log_publish(results[0])
                return results[0]
        results = await self._run(request, timeout)
        return results[0]

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
        if sharding_keys is not None:
            if partition is not None or sharding_key is not None:
                raise ValidationError(
                    "sharding_keys", "give sharding_keys, or a partition or a sharding_key"
                )
            return await self._publish_keyed(
                topic, bodies, sharding_keys, trace, trace_ids, exts, timeout
            )
        data = check_bodies(list(bodies), self.max_msg_size, self.max_body_size)
        if self._closing:
            raise _closing_error()
        request = PublishRequest(topic, "MPUB", data)
        self._common_args(request, partition, sharding_key)
        auto = not trace and trace_ids is None and exts is None and self.tracing(topic)
        if trace or trace_ids is not None or auto:
            ids = list(trace_ids) if trace_ids is not None else new_trace_ids(len(data))
            request.auto_trace = auto
            if len(ids) != len(data):
                raise ValidationError("trace_ids", f"{len(ids)} trace ids for {len(data)} bodies")
            request.trace_ids = [check_trace_id(t) for t in ids]
            request.command = "MPUB_TRACE"
        if exts is not None:
            if request.trace_ids is not None:
                raise UnsupportedFeatureError("MPUB cannot carry both trace ids and ext headers")
            if len(exts) != len(data):
                raise ValidationError("exts", f"{len(exts)} ext headers for {len(data)} bodies")
            request.exts = [None if e is None else encode_ext(e) for e in exts]
            request.command = "MPUB_EXT"
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
        data = check_bodies(list(bodies), self.max_msg_size, _UNBOUNDED)
        count = len(data)
        if isinstance(keys, (str, bytes)) or len(keys) != count:
            raise ValidationError("sharding_keys", f"give one key per body ({count} bodies)")
        if None in keys:
            index = next(i for i, key in enumerate(keys) if key is None)
            raise ValidationError(f"sharding_keys[{index}]", "a key is required")
        ids: list[int] | None = None
        if trace_ids is not None:
            if len(trace_ids) != count:
                raise ValidationError("trace_ids", f"{len(trace_ids)} trace ids for {count} bodies")
            ids = [check_trace_id(t) for t in trace_ids]
        encoded: list[bytes | None] | None = None
        if exts is not None:
            if ids is not None or trace:
                raise UnsupportedFeatureError("MPUB cannot carry both trace ids and ext headers")
            if len(exts) != count:
                raise ValidationError("exts", f"{len(exts)} ext headers for {count} bodies")
            encoded = [None if e is None else encode_ext(e) for e in exts]
        if self._closing:
            raise _closing_error()
        if self._state != "started":
            await self.start()
        targets = await self._key_targets(topic, keys)
        groups: dict[int | str, list[int]] = {}
        for target in set(targets):
            groups[target] = []
        appenders = {target: group.append for target, group in groups.items()}
        for index, target in enumerate(targets):
            appenders[target](index)
        auto = not trace and ids is None and encoded is None and self.tracing(topic)
        if (trace or auto) and ids is None:
            ids = new_trace_ids(count)
        requests = []
        for target, indexes in groups.items():
            batch = [data[i] for i in indexes] if len(groups) > 1 else data
            size = 4 + 4 * len(batch) + sum(map(len, batch))
            if size > self.max_body_size:
                raise ValidationError(
                    "bodies",
                    f"the batch for {_describe_target(target)} is {size} bytes on the wire, "
                    f"over the maximum of {self.max_body_size}",
                )
            request = PublishRequest(topic, "MPUB", batch)
            request.key = keys[indexes[0]]  # keyed: never moves off its target
            if isinstance(target, int):
                request.pinned = target
            else:
                request.address = target
            if ids is not None:
                request.trace_ids = [ids[i] for i in indexes]
                request.command = "MPUB_TRACE"
                request.auto_trace = auto
            if encoded is not None:
                request.exts = [encoded[i] for i in indexes]
                request.command = "MPUB_EXT"
            requests.append((indexes, request))
        outcomes = await asyncio.gather(
            *(self._run(request, timeout) for _, request in requests), return_exceptions=True
        )
        results: list[PublishResult | None] = [None] * count
        place = results.__setitem__
        for (indexes, _), outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            collections.deque(map(place, indexes, outcome), maxlen=0)
        return cast("list[PublishResult]", results)  # every index is in exactly one group

    async def _key_targets(self, topic: str, keys: Sequence[Any]) -> list[int | str]:
        """Where each key publishes: a partition (youzan) or an nsqd address (classic)."""
        layout = None if self._lookup is None else await self._lookup.lookup(topic, "w")
        return self._router.key_targets(topic, keys, layout)

    def _common_args(self, request: PublishRequest, partition: int | None, key: Any) -> None:
        if partition is not None and key is not None:
            raise ValidationError("partition", "give a partition or a sharding_key, not both")
        if partition is not None:
            request.partition = check_partition(partition)
        if key is not None:
            self.sharder.partition_for(key, 1)  # validates the key type now, before routing
            request.key = key

    # ------------------------------------------------------------------ sending

    async def _batched(self, request: PublishRequest) -> PublishResult:
        """Hand the message to the batcher, in the lane of its partition (keyed or explicit
        publishes) or the topic's shared lane (unkeyed)."""
        if self._state != "started":
            await self.start()
        if self._batcher is None:  # pragma: no cover - only called with a batcher
            raise ValidationError("linger", "batching is off")
        lane: tuple[Any, ...]
        ordered = request.partition is not None or request.key is not NO_KEY
        if not ordered:
            lane = (request.topic, "any")
        else:
            # The lane is the partition (or classic nsqd), known without a writable leader:
            # a publish waiting for a failover waits in the lane, within the retry loop.
            target = self._target_now(request)
            if target is None:
                target = await self._target_retrying(request)
            lane = (request.topic, "pinned", isinstance(target, int), target)
        trace_id = request.trace_ids[0] if request.trace_ids else None
        result: PublishResult = await self._batcher.add(
            lane, request.bodies[0], trace_id, ordered=ordered
        )
        return result

    async def _flush_batch(
        self, lane: Any, bodies: list[bytes], trace_ids: list[int] | None
    ) -> list[PublishResult]:
        request = PublishRequest(lane[0], "MPUB", bodies)
        if trace_ids is not None:
            request.command = "MPUB_TRACE"
            request.trace_ids = trace_ids
            request.auto_trace = True
        if lane[1] == "pinned":
            if lane[2]:
                request.partition = request.pinned = lane[3]
            else:
                request.address = lane[3]
        return await self._run(request, None)

    def _new_trace_id(self, key: Any) -> int:
        if key is not NO_KEY and self.trace_key_hash:
            # youzan go-nsq traces a keyed publish with the key's hash
            hashed = self.sharder.hash32(key)
            if hashed is not None:
                return hashed & 0xFFFFFFFF
        return random.getrandbits(64)

    async def _run(
        self,
        request: PublishRequest,
        timeout: float | None,
        first_failure: BaseException | None = None,
    ) -> list[PublishResult]:
        if self._state != "started":
            await self.start()
        try:
            if self._telemetry.enabled:
                results = await self._run_in_span(request, timeout, first_failure)
            else:
                results = await self._run_retrying(request, timeout, first_failure)
        except Exception:
            self._stats.failed(len(request.bodies))
            raise
        self._stats.acknowledged(request.bodies, results)
        if results[0].internal_id is not None:
            for result in results:
                log_publish(result)
        return results

    async def _run_in_span(
        self, request: PublishRequest, timeout: float | None, first_failure: BaseException | None
    ) -> list[PublishResult]:
        """_run_retrying inside a ``send {topic}`` span, counted in the metrics."""
        telemetry = self._telemetry
        request.span = telemetry.start_send(request.topic, len(request.bodies))
        attributes = {"messaging.destination.name": request.topic}
        try:
            results = await self._run_retrying(request, timeout, first_failure)
        except BaseException as exc:
            telemetry.count("publish_errors", 1, {**attributes, "error.type": error_type(exc)})
            if request.span is not None:
                Telemetry.fail(request.span, exc)
                request.span.end()
            raise
        telemetry.count("published", len(results), attributes)
        span = request.span
        if span is not None:
            end_send_span(span, results)
        return results

    async def _run_retrying(
        self,
        request: PublishRequest,
        timeout: float | None,
        first_failure: BaseException | None = None,
    ) -> list[PublishResult]:
        limit = self.publish_timeout if timeout is None else float(timeout)
        deadline = asyncio.get_running_loop().time() + limit
        if first_failure is None:
            try:
                return await self._attempt(request, 1, limit)
            except NSQError as exc:
                first_failure = exc
        return await self._retry(
            request, deadline, first_failure, functools.partial(self._attempt, request)
        )

    async def _retry(
        self,
        request: PublishRequest,
        deadline: float,
        failure: BaseException,
        attempt: Callable[[int, float], Awaitable[T]],
    ) -> T:
        """Try ``attempt(tries, remaining)`` again after ``failure`` until it succeeds, a
        failure is not retriable (raised as it is), or ``deadline`` (``publish_timeout``) or
        ``max_retries`` ends it: then :class:`PublishError`, caused by the last failure."""
        loop = asyncio.get_running_loop()
        failing_since = loop.time()
        warned = False
        tries = 1
        while True:
            if not is_retriable(failure):
                raise failure
            if self.max_retries is not None and tries > self.max_retries:
                raise self._given_up(
                    request, tries, f"max_retries={self.max_retries}", failure
                ) from failure
            self._note_failure(request, failure, tries)
            failing_for = loop.time() - failing_since
            if not warned and failing_for >= _WARN_AFTER:
                warned = True
                self._warn_failing(request, failure, tries, failing_for)
            await self._pause(request, failure, tries, deadline - loop.time())
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._given_up(request, tries, "publish_timeout", failure) from failure
            tries += 1
            self._stats.retries += 1
            try:
                return await asyncio.wait_for(attempt(tries, remaining), remaining)
            except NSQError as exc:
                failure = exc
            except TimeoutError:  # the deadline passed during the try (wait_for's own)
                raise self._given_up(request, tries, "publish_timeout", failure) from failure

    def _given_up(
        self, request: PublishRequest, tries: int, bound: str, last: BaseException
    ) -> PublishError:
        cause = "timed out" if bound == "publish_timeout" else f"reached {bound}"
        partition = request.partition if request.partition is not None else request.pinned
        where = "" if partition is None else f" partition {partition}"
        return PublishError(
            f"publish to {request.topic!r}{where} failed after {tries} tries ({cause}): {last}",
            topic=request.topic,
            partition=partition,
            tries=tries,
        )

    def _note_failure(self, request: PublishRequest, exc: BaseException, tries: int) -> None:
        """A retriable failure of try number ``tries``, to be retried."""
        if request.movable and request.last_partition is not None:
            request.avoid.add(request.last_partition)
        self._telemetry.count("retries", 1, {"messaging.destination.name": request.topic})
        if request.span is not None:
            request.span.add_event(
                "retry",
                {
                    "error.type": error_type(exc),
                    "messaging.destination.partition.id": str(request.last_partition),
                },
            )
        # Expected in a failover or a leader move: a debug record per try. What a user needs
        # to see is logged when a leader moves (_pause) or when it lasts (_warn_failing).
        log.debug(
            "publish to %s (partition %s) failed on try %d (%s); retrying",
            request.topic,
            request.last_partition,
            tries,
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

    async def _pause(
        self, request: PublishRequest, failure: BaseException, tries: int, remaining: float
    ) -> None:
        """Wait before try ``tries + 1``. A failure that says the layout is stale waits for
        nsqlookupd to name somewhere else to go (woken as soon as a lookup does), at most the
        backoff; a publish that had nowhere to go at all waits for that alone (in rounds of
        ``_WARN_AFTER``)."""
        if remaining <= 0:
            return
        if request.movable and request.avoid and tries <= 1:
            delay = 0.0  # an unkeyed publish moves to another writable partition at once
        else:
            delay = self.retry_backoff.delay(tries)
        lookup = self._lookup
        if lookup is None or not needs_lookup_refresh(failure):
            await asyncio.sleep(min(delay, remaining))
            return
        if isinstance(failure, NoWritablePartitionError):
            # Only a new layout can help: no try before it comes, but a look every
            # _WARN_AFTER seconds at how long this lasts (a try that routes nowhere is free).
            delay = max(delay, _WARN_AFTER)
        stale = request.layout
        routable = self._router.routable

        def recovered(layout: TopicLayout) -> bool:
            return layout != stale and routable(request, layout)

        layout = await lookup.wait_until(request.topic, "w", recovered, min(delay, remaining))
        if layout is not None and stale is not None:
            self._log_leader_move(request, stale, layout)

    def _log_leader_move(
        self, request: PublishRequest, stale: TopicLayout, layout: TopicLayout
    ) -> None:
        partition = request.last_partition
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

    async def _attempt(
        self, request: PublishRequest, tries: int, timeout: float
    ) -> list[PublishResult]:
        route = await self._route(request)
        request.last_partition = route.partition
        conn = self._pool.get_nowait(route.address, route.pool_topic, route.partition)
        if conn is None:
            conn = await self._pool.get(route.address, route.pool_topic, route.partition)
        frame = await self._send(request, route, conn, timeout)
        return self._results(request, route, frame, tries)

    def _send(
        self, request: PublishRequest, route: Route, conn: Connection, timeout: float
    ) -> asyncio.Future[bytes]:
        """Check, encode and queue one attempt; the future gets nsqd's answer."""
        self._fit(request, route, route.youzan or conn.youzan)
        command, data = self._prepare(request, route)
        return conn.request_future(
            data, command, timeout=min(timeout, self.connection_config.request_timeout)
        )

    # ------------------------------------------------------------------ routing

    def _route_now(self, request: PublishRequest) -> Route | None:
        """The route from what is cached (None when the layout must be fetched first)."""
        if self._lookup is None:
            return self._route_classic(request, self._direct_routes)
        layout = self._lookup.cached(request.topic, "w")
        if layout is None:
            return None
        request.layout = layout
        return self._route_layout(request, layout)

    async def _route(self, request: PublishRequest) -> Route:
        if self._lookup is None:
            return self._route_classic(request, self._direct_routes)
        layout = request.layout = await self._lookup.lookup(request.topic, "w")
        return self._route_layout(request, layout)

    def _target_now(self, request: PublishRequest) -> int | str | None:
        """The batch lane's target from what is cached (None: it must be looked up)."""
        if self._lookup is None:
            return self._router.target(request, None)
        layout = self._lookup.cached(request.topic, "w")
        if layout is None:
            return None
        request.layout = layout
        try:
            return self._router.target(request, layout)
        except NoWritablePartitionError:
            return None

    async def _target_retrying(self, request: PublishRequest) -> int | str:
        """The batch lane's target, looked up within the retry loop (``publish_timeout``)."""

        async def target(tries: int, remaining: float) -> int | str:
            layout = None
            if self._lookup is not None:
                layout = request.layout = await self._lookup.lookup(request.topic, "w")
            return self._router.target(request, layout)

        deadline = asyncio.get_running_loop().time() + self.publish_timeout
        try:
            return await target(1, self.publish_timeout)
        except NSQError as exc:
            failure: NSQError = exc
        try:
            return await self._retry(request, deadline, failure, target)
        except Exception:
            self._stats.failed(1)
            raise


def _describe_target(target: int | str) -> str:
    return f"partition {target}" if isinstance(target, int) else f"nsqd {target}"


def _closing_error() -> ClientClosedError:
    return ClientClosedError("this Producer is closed or closing; create a new one")
