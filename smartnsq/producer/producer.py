"""The Producer: publishes to youzan partitions (explicit, sharding key or round-robin) or to
classic nsqd, with trace receipts, ext headers and retry on leader changes.

The API over the floors below, as aiokafka splits its producer: the arguments are checked
into a request (:mod:`smartnsq.publishing.arguments`); the publish flow
(:mod:`smartnsq.publishing.flow`) decides everything about it (its partition's lane, where
each try goes, what to wait for, when to try again or give up); the Sender
(:mod:`smartnsq.producer.sender`) carries that out on the event loop (auto-batching too: the
flow joins a partition's waiting publishes into MPUBs). What stays here is the lifecycle,
the API and the telemetry spans.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, cast

from smartnsq.client.options import expose_options, keyword_arguments
from smartnsq.client.telemetry import Telemetry, end_send_span, error_type
from smartnsq.errors import (
    ClientClosedError,
    NoWritablePartitionError,
    NSQTimeoutError,
    ValidationError,
)
from smartnsq.flow.retry import Backoff, Stop, Wait
from smartnsq.producer.options import DEFAULT_PUBLISH_TIMEOUT, ProducerOptions
from smartnsq.producer.sender import Sender
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.protocol.validation import (
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    check_bodies,
    check_body,
    check_topic,
)
from smartnsq.publishing.arguments import PublishArguments, TraceSwitch, check_publish_timeout
from smartnsq.publishing.flow import Publish, PublishFlow
from smartnsq.publishing.request import PublishRequest, batch_extras, batch_request
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import ANY_TOPIC, Router
from smartnsq.publishing.stats import ProducerStats
from smartnsq.publishing.wire import PublishCodec
from smartnsq.routing.addresses import AddressMapping
from smartnsq.routing.sharding import ShardingStrategy
from smartnsq.transport.connection import Compression
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.pool import ConnectionPool

__all__ = ["DEFAULT_PUBLISH_TIMEOUT", "Producer", "ProducerStats", "PublishResult"]

log = logging.getLogger("smartnsq.producer")

T = TypeVar("T")

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
    earlier after that many retries, and so does ``retry_stop`` (a tenacity stop) when it
    says so; ``retry_backoff`` (a :class:`Backoff` or a tenacity wait) spaces the tries.

    Publishes bound to a partition (a ``sharding_key``, an explicit ``partition``) are
    stored in the order ``publish()`` was called, through every retry
    (docs/guides/ordered-processing.md); on youzan ext topics each carries a sequence stamp
    (``stamps``) that lets an ordered consumer drop a message stored twice.
    """

    def __init__(
        self,
        *,
        lookupd: Sequence[str] | None = None,
        nsqd: Sequence[str] | None = None,
        sharding: ShardingStrategy = "java",
        publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
        max_retries: int | None = None,
        retry_backoff: Backoff | Wait | None = None,
        retry_stop: Stop | None = None,
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
        stamps: bool = True,
        linger: float | None = None,
        max_batch: int = 100,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        lookup_manager: LookupManager | None = None,
        address_map: AddressMapping | None = None,
    ) -> None:
        # Checked here, once, before anything is sent; read from here by every part.
        self.options = options = ProducerOptions(**keyword_arguments(locals()))
        nsqd_addresses, self._lookup, self._owns_lookup = options.targets()
        self._nsqd = nsqd_addresses
        self._router = Router(options.sharder, nsqd_addresses)
        self._switch = TraceSwitch(bool(options.trace))
        #: What publish() and publish_many() are asked, checked (shared with the blocking
        #: producer).
        self.arguments = PublishArguments(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            sharder=options.sharder,
            trace_key_hash=options.trace_key_hash,
            switch=self._switch,
        )
        self._telemetry = Telemetry(
            "producer",
            tracer_provider=options.tracer_provider,
            meter_provider=options.meter_provider,
        )
        lookup = self._lookup
        config = options.connection_config
        flow = PublishFlow(
            self._router,
            PublishCodec(
                max_msg_size=options.max_msg_size,
                max_body_size=options.max_body_size,
                inject=Telemetry.inject,
            ),
            layouts=None if lookup is None else lookup.cached_getter("w"),
            delays=options.retry_delays,
            max_retries=options.max_retries,
            stop=options.retry_stops,
            request_timeout=config.request_timeout,
            producer_id=f"{random.getrandbits(64):016x}" if options.stamps else None,
            links_per_key=options.connections_per_partition,
            verbose=log.isEnabledFor(logging.DEBUG),
            linger=options.linger,
            max_batch=options.max_batch,
        )
        #: The asyncio driver of the publish flow (the blocking producer drives the same
        #: flow through it).
        self.sender = Sender(
            flow,
            ConnectionPool(config),
            lookup,
            publish_timeout=options.publish_timeout,
            request_timeout=config.request_timeout,
            write_timeout=config.write_timeout,
            telemetry=self._telemetry,
        )
        self._pools = options.linger is not None  # unkeyed plain publishes wait for company
        self._state = "new"  # new -> starting -> started -> closed
        # Set when close() begins: new publishes are refused while those auto-batched are
        # flushed (the state stays "started" so that their retries still run).
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
        """What a publish needs before its first try: the loop. No warm-up: its tries look
        up and connect themselves, and what fails there (an nsqd refusing connections, a
        lookupd down) is retried within the publish's deadline like any other failure."""
        if self._state == "closed":
            raise _closing_error()
        self.sender.bind(asyncio.get_running_loop())
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
        # Direct mode: one nsqd that completes the handshake is enough (the others are
        # retried by the publishes that need them); the connections made are kept.
        self.sender.bind(asyncio.get_running_loop())
        results = await asyncio.gather(
            *(self.sender.connect((address, ANY_TOPIC, None)) for address in self._nsqd),
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
        closed = ClientClosedError(
            "the Producer was closed before this publish was answered "
            "(nsqd may or may not have stored it)"
        )
        if self.options.linger is not None and self._state == "started":
            await self.sender.flush(self.options.publish_timeout)
        self._state = "closed"
        await self.sender.close(closed)
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

    @property
    def instrumented(self) -> bool:
        """Whether publishes are traced or metered with OpenTelemetry (its providers given,
        or set globally)."""
        return self._telemetry.enabled

    def stats(self) -> ProducerStats:
        """A snapshot of the counters (see :class:`ProducerStats`); also after close."""
        return self.sender.stats()

    # ------------------------------------------------------------------ tracing switch

    def set_trace(self, enabled: bool, topic: str | None = None) -> None:
        """Turn message tracing (PUB_TRACE with a generated trace id) on or off, for every
        topic or for one; takes effect for the next publish."""
        self._switch.set(enabled, topic)

    def tracing(self, topic: str) -> bool:
        """Whether publishes to ``topic`` are traced by default."""
        return self._switch.on(topic)

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
        if (
            self._pools
            and partition is None
            and sharding_key is None
            and trace_id is None
            and ext is None
            and delay is None
            and self._state == "started"
        ):
            switch = self._switch
            if self._telemetry.enabled or switch.topics.get(topic, switch.default):
                return await self._pooled(topic, body, timeout)
            # Auto-batched with the others of its topic, naming nothing but its body: no
            # request of its own (its batch is the request). What arguments.body() and
            # switch.on() do, inline: two calls less per message.
            check_topic(topic)
            data = check_body(body, self.arguments.max_msg_size)
            if timeout is not None:
                timeout = check_publish_timeout("timeout", timeout)
            if self._closing:
                raise _closing_error()
            waiter = self.sender.pool(topic, data, None, timeout)
            try:
                pooled: list[PublishResult] = await waiter
            except asyncio.CancelledError:
                self.sender.unpool(topic, waiter)
                raise
            return pooled[0]
        request, timeout = self.arguments.message(
            topic, body, partition, sharding_key, trace_id, ext, delay, timeout
        )
        if self._closing:
            raise _closing_error()
        if self._state == "started" and not self._telemetry.enabled:
            # What _run does, with nothing to trace: one coroutine per publish, not two.
            p = self.sender.publish(request, timeout)
            try:
                results: list[PublishResult] = await p.waiter
            except asyncio.CancelledError:
                self.sender.cancel(p)
                raise
            return results[0]
        return (await self._run(request, timeout))[0]

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
        request = self.arguments.batch(
            topic, bodies, partition, sharding_key, trace, trace_ids, exts
        )
        if self._closing:
            raise _closing_error()
        if self._state == "started" and not self._telemetry.enabled:
            # What _run does, with nothing to trace: one coroutine per call, not three.
            p = self.sender.publish(request, timeout)
            try:
                results: list[PublishResult] = await p.waiter
            except asyncio.CancelledError:
                self.sender.cancel(p)
                raise
            return results
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
        data = check_bodies(list(bodies), self.options.max_msg_size, _UNBOUNDED)
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
        deadline = self.sender.now() + limit
        targets = await self._decided(
            topic, deadline, lambda layout: self._router.key_targets(topic, keys, layout)
        )
        groups: dict[int | str, list[int]] = {}
        for index, target in enumerate(targets):
            groups.setdefault(target, []).append(index)
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
        remaining = max(deadline - self.sender.now(), 1e-3)  # the one deadline, for all
        # Submitted here, together: each joins its partition's lane now, in call order with
        # the publishes called after this one.
        started = [(self._start(request, remaining), request) for _, request in requests]
        outcomes = await asyncio.gather(
            *(self._outcome(p, request) for p, request in started), return_exceptions=True
        )
        results: list[PublishResult | None] = [None] * count
        place = results.__setitem__
        for (indexes, _), outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            collections.deque(map(place, indexes, outcome), maxlen=0)
        return cast("list[PublishResult]", results)  # every index is in exactly one group

    # ------------------------------------------------------------------ one publish

    async def _run(self, request: PublishRequest, timeout: float | None) -> list[PublishResult]:
        """Publish ``request`` through the flow within ``timeout`` (None:
        ``publish_timeout``), with an OpenTelemetry span when tracing is on."""
        return await self._outcome(self._start(request, timeout), request)

    def _start(self, request: PublishRequest, timeout: float | None) -> Publish:
        """Submit ``request`` to the flow (its span begins)."""
        if self._state != "started":
            self._begin()
        telemetry = self._telemetry
        span = None
        if telemetry.enabled:
            span = telemetry.start_send(request.topic, len(request.bodies))
        return self.sender.publish(request, timeout, span)

    async def _pooled(self, topic: str, body: bytes | str, timeout: float | None) -> PublishResult:
        """An unkeyed plain publish, auto-batched with the others of its topic, traced by
        the trace switch or with a span (which ends with its batch's answer)."""
        request, timeout = self.arguments.message(topic, body, timeout=timeout)
        if self._closing:
            raise _closing_error()
        telemetry = self._telemetry
        span = telemetry.start_send(topic, 1) if telemetry.enabled else None
        trace_id = request.trace_ids[0] if request.trace_ids else None
        waiter = self.sender.pool(topic, request.bodies[0], trace_id, timeout)
        try:
            results: list[PublishResult] = await waiter
        except asyncio.CancelledError:
            self.sender.unpool(request.topic, waiter)
            raise
        except BaseException as exc:
            if span is not None:
                Telemetry.fail(span, exc)
                span.end()
                self._meter_failure(request, exc)
            raise
        if span is not None:
            end_send_span(span, results)
            telemetry.count("published", 1, {"messaging.destination.name": request.topic})
        return results[0]

    async def _outcome(self, p: Publish, request: PublishRequest) -> list[PublishResult]:
        """``p``'s results, or its error raised (metered)."""
        telemetry = self._telemetry
        try:
            results: list[PublishResult] = await p.waiter
        except asyncio.CancelledError:
            self.sender.cancel(p)
            raise
        except BaseException as exc:
            if telemetry.enabled:
                self._meter_failure(request, exc)
            raise
        if telemetry.enabled:
            telemetry.count(
                "published", len(results), {"messaging.destination.name": request.topic}
            )
        return results

    def _meter_failure(self, request: PublishRequest, exc: BaseException) -> None:
        attributes = {"messaging.destination.name": request.topic, "error.type": error_type(exc)}
        self._telemetry.count("publish_errors", 1, attributes)

    async def _decided(
        self, topic: str, deadline: float, decide: Callable[[TopicLayout | None], T]
    ) -> T:
        """``decide(layout)`` on the topic's layout (None in direct mode), looked up again
        while it has nowhere to go, until ``deadline``: where an auto-batched keyed publish
        or the batches of ``publish_many(sharding_keys=...)`` go."""
        stale: TopicLayout | None = None
        while True:
            layout = await self.sender.layout(topic, deadline, stale)
            try:
                return decide(layout)
            except NoWritablePartitionError:
                if layout is None:
                    raise
                stale = layout


def _describe_target(target: int | str) -> str:
    return f"partition {target}" if isinstance(target, int) else f"nsqd {target}"


def _closing_error() -> ClientClosedError:
    return ClientClosedError("this Producer is closed or closing; create a new one")
