"""The Consumer: subscribes to every partition (or a subset, or classic nsqd), keeps the
flow of messages within ``max_in_flight``, runs the handler, answers each message once, and
follows leader changes.

It is the lifecycle and the API over three parts: the
:class:`~smartnsq.consumer.subscriber.Subscriber` (which connections, kept alive), the
:class:`~smartnsq.consumer.dispatch.Dispatcher` (messages to the handler or the iterator and
their answers back, as the pure :class:`~smartnsq.flow.delivery.DeliveryLedger` decides) and
the :class:`~smartnsq.consumer.handlers.HandlerRunner` (coroutine handlers run eagerly as
tasks, plain functions in threads).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import warnings
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from smartnsq.client import moves
from smartnsq.client.options import expose_options, keyword_arguments
from smartnsq.client.telemetry import Telemetry
from smartnsq.consumer.dispatch import Dispatcher
from smartnsq.consumer.handlers import Handler, HandlerRunner, is_coroutine_function
from smartnsq.consumer.message import Message
from smartnsq.consumer.options import (
    ORDERED_REQUEUE_DELAY,
    REQUEUE_DELAY,
    ConsumerOptions,
    ErrorHook,
    GivingUp,
    check_max_in_flight,
)
from smartnsq.consumer.subscriber import Subscriber
from smartnsq.errors import (
    ClientClosedError,
    ConnectionClosedError,
    NSQError,
    ValidationError,
)
from smartnsq.flow.backoff import BackoffPolicy, check_seconds
from smartnsq.flow.replays import ReplayFilter
from smartnsq.flow.retry import Backoff, Wait
from smartnsq.protocol import commands
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.validation import check_channel, check_topic
from smartnsq.routing.addresses import AddressMapping
from smartnsq.transport.connection import Compression
from smartnsq.transport.lookup import LookupManager

__all__ = [
    "ORDERED_REQUEUE_DELAY",
    "REQUEUE_DELAY",
    "Consumer",
    "ConsumerStats",
    "is_coroutine_function",
]

log = logging.getLogger("smartnsq.consumer")

# The longest close() waits for nsqd's answers to CLS (within its timeout).
CLS_TIMEOUT = 2.0
# How long a consumer that stops without close() (a failed start) waits for handler threads.
HANDLER_THREADS_TIMEOUT = 5.0


@dataclass
class ConsumerStats:
    """Counters since start (``consumer.stats()`` returns a snapshot)."""

    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    touched: int = 0
    handler_errors: int = 0
    lost_answers: int = 0  # answers not sent because the connection had closed
    server_errors: int = 0  # non-fatal errors nsqd reported (E_FIN_FAILED...)
    # copies of a delivery in flight here (dropped: one answer covers both) or just answered
    # (the same answer again); never handled twice
    duplicates: int = 0
    # ordered mode: redeliveries of messages this consumer had finished, FINed unhandled
    replays_skipped: int = 0
    # ordered mode: messages whose producer's sequence stamp says they were taken already
    # (stored twice by a retried publish, or stored after the producer gave up on them;
    # youzan ext topics), FINed unhandled
    stamped_replays: int = 0
    order_violations: int = 0
    # ordered mode: the channel seen moved (a seek), its order then checked anew
    channel_moves: int = 0
    connects: int = 0
    reconnects: int = 0
    # connections closed soon after their SUB succeeded (within STABLE_AFTER, 10 s): counted
    # as failed subscribes, whose retries back off
    short_lived: int = 0
    in_flight: int = 0
    connections: int = 0
    per_partition: dict[int | None, int] = field(default_factory=dict)


@expose_options(ConsumerOptions)
class Consumer:
    """Consumes ``topic``/``channel`` from youzan partitions or classic nsqd.

    Give ``lookupd`` (nsqlookupd HTTP addresses) or ``nsqd`` (classic nsqd TCP addresses).
    With a ``handler`` (a coroutine function, or a plain function run in a thread), returning
    finishes the message and raising requeues it; without one, iterate the consumer.
    ``ordered=True`` subscribes with SUB_ORDERED: each partition's messages reach the handler
    one at a time, in queue order. ``reconnect_backoff`` (a :class:`Backoff` or a tenacity
    wait) spaces the subscribe attempts of a partition while they fail. Durations are in
    seconds.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        lookupd: Sequence[str] | None = None,
        nsqd: Sequence[str] | None = None,
        handler: Handler | None = None,
        max_in_flight: int | None = None,
        ordered: bool = False,
        partitions: Collection[int] | None = None,
        max_attempts: int = 5,
        requeue_delay: float | None = None,
        max_requeue_delay: float = 900.0,
        backoff: BackoffPolicy | bool = True,
        on_giving_up: GivingUp | None = None,
        on_error: ErrorHook | None = None,
        fail_fast: bool = False,
        dead_letter_path: str | os.PathLike[str] | None = None,
        ordered_give_up: bool = False,
        raise_on_order_violation: bool = False,
        skip_replays: bool | None = None,
        start: StartPosition | Literal["earliest", "latest"] | None = None,
        desired_tag: str | None = None,
        msg_timeout: float | None = None,
        heartbeat_interval: float = 30.0,
        connect_timeout: float = 5.0,
        tls: Any = False,
        compression: Compression = None,
        deflate_level: int = 6,
        auth_secret: str | bytes | None = None,
        sample_rate: int = 0,
        client_id: str | None = None,
        user_agent: str | None = None,
        lookupd_poll_interval: float = 60.0,
        low_rdy_idle_timeout: float = 10.0,
        low_rdy_timeout: float = 30.0,
        reconnect_backoff: Backoff | Wait | None = None,
        handler_threads: int | None = None,
        replay_filter: ReplayFilter | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        lookup_manager: LookupManager | None = None,
        address_map: AddressMapping | None = None,
    ) -> None:
        arguments = keyword_arguments(locals(), "topic", "channel")
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        # Checked here, once, before anything is sent; passed down whole.
        self.options = options = ConsumerOptions(**arguments)
        self._nsqd, self._lookup, self._owns_lookup = options.targets()
        self._state = "new"  # new -> starting -> started -> closing -> closed
        self._fatal: BaseException | None = None
        self._done: asyncio.Future[None] | None = None
        self._unlisten: Callable[[], None] | None = None  # moves announced in-process
        self._telemetry = Telemetry(
            "consumer",
            tracer_provider=options.tracer_provider,
            meter_provider=options.meter_provider,
        )
        self._metric_attributes = {
            "messaging.destination.name": self.topic,
            "messaging.consumer.group.name": self.channel,
        }
        runner = None
        if options.handler is not None:
            # Plain functions run in threads (started lazily): with max_in_flight None, one
            # per subscription up to 32; else as many as may be in flight, up to 32.
            threads = options.handler_threads or min(32, max(1, options.max_in_flight or 32))
            runner = HandlerRunner(
                options.handler,
                topic=self.topic,
                channel=self.channel,
                threads=threads,
                telemetry=self._telemetry,
                metric_attributes=self._metric_attributes,
            )
        self._dispatcher = Dispatcher(
            options,
            topic=self.topic,
            channel=self.channel,
            runner=runner,
            telemetry=self._telemetry,
            metric_attributes=self._metric_attributes,
            fail=self._fail,
        )
        self._subscriber = Subscriber(
            self._dispatcher,
            topic=self.topic,
            channel=self.channel,
            ordered=options.ordered,
            partitions=None if options.partitions is None else frozenset(options.partitions),
            start_position=options.start_position,
            desired_tag=options.desired_tag,
            connection_config=options.connection_config,
            reconnect_backoff=options.reconnect_delays,
            lookup=self._lookup,
            nsqd=self._nsqd,
            fail_fast=options.fail_fast,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Consumer:
        """Discover, connect and subscribe; return once the initial subscriptions are in
        place or failed. What failed for a reason a retry may fix (nothing listening yet, no
        lookupd answering) is retried in the background, with backoff, and said once at
        WARNING; with ``fail_fast=True`` start() raises it instead. What no retry can fix (a
        bad argument, a position or a subscription nsqd refuses, an address that is not an
        nsqd or nsqlookupd) raises here, or later from :meth:`join` after ``on_error``."""
        if self._state in ("closing", "closed"):
            raise ClientClosedError("this Consumer is closed; create a new one")
        if self._state != "new":
            return self
        self._set_state("starting")
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        dispatcher = self._dispatcher
        dispatcher.start(loop)
        self._telemetry.in_flight_gauge(dispatcher.outstanding, self._metric_attributes)

        def moved(partitions: Sequence[int | None]) -> None:  # from any thread
            if not loop.is_closed():
                loop.call_soon_threadsafe(dispatcher.channel_moved, partitions)

        self._unlisten = moves.listen(self.topic, self.channel, moved)
        subscriber = self._subscriber
        try:
            await subscriber.start()
        except BaseException:
            await self._shutdown_now()
            raise
        if self._fatal is None and self._nsqd and not subscriber.subs:
            error = subscriber.last_connect_error or ConnectionClosedError(
                "no nsqd accepted the subscription", ", ".join(self._nsqd)
            )
            if self.options.fail_fast:
                self._fatal = error
            else:
                # An orchestrator may start this service before nsqd: go on trying.
                log.warning(
                    "%s/%s: no nsqd accepted the subscription yet (%s); retrying in the "
                    "background with backoff (fail_fast=True makes start() raise instead)",
                    self.topic,
                    self.channel,
                    error,
                )
        fatal = self._fatal
        if fatal is not None:
            self._fatal = None  # raised here, not again by join()
            await self._shutdown_now()
            raise fatal
        self._set_state("started")
        subscriber.supervise()
        return self

    async def join(self) -> None:
        """Wait until the consumer is closed; raises the error that stopped it, if any."""
        if self._done is None:
            raise ClientClosedError("the consumer was not started")
        await asyncio.shield(self._done)

    async def close(self, timeout: float = 10.0) -> None:
        """Drain: stop new deliveries (RDY 0, CLS), let running handlers finish and answer,
        then close; ``timeout`` bounds it all (nsqd's answers to CLS, the handlers, plain
        functions' threads). Messages not answered by then are redelivered by nsqd to
        other consumers; a plain function still running finishes in its thread."""
        timeout = check_seconds("timeout", timeout, positive=False)
        if self._state in ("closing", "closed"):
            if self._done is not None and not self._done.done():
                await asyncio.wait([self._done])  # join() is where a failure is raised
            return
        if self._state == "new":
            self._set_state("closed")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def left() -> float:
            return max(0.0, deadline - loop.time())

        self._set_state("closing")
        self._subscriber.stop()
        self._dispatcher.close()
        await self._send_cls(min(CLS_TIMEOUT, left()))
        await self._dispatcher.wait_drained(left())
        await self._shutdown_now(left())

    async def _send_cls(self, timeout: float) -> None:
        """CLS on every open subscription; their answers awaited up to ``timeout`` (0: not
        sent: the connections close at once)."""
        if timeout <= 0:
            return
        futures = []
        for sub in list(self._subscriber.subs.values()):
            if sub.conn.is_open:
                try:
                    futures.append(sub.conn.request_future(commands.cls(), "CLS", timeout))
                except NSQError:
                    continue
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    async def _shutdown_now(self, handler_timeout: float = HANDLER_THREADS_TIMEOUT) -> None:
        self._set_state("closed")
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self._subscriber.stop()
        await self._dispatcher.shutdown(handler_timeout)
        await self._subscriber.close()
        if self._lookup is not None and self._owns_lookup:
            await self._lookup.close()
        if self._done is not None and not self._done.done():
            if self._fatal is not None:
                self._done.set_exception(self._fatal)
                self._done.exception()  # retrieved by join() if someone calls it
            else:
                self._done.set_result(None)

    def _set_state(self, state: str) -> None:
        self._state = state
        self._dispatcher.phase = state

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __del__(self) -> None:
        if getattr(self, "_state", "closed") in ("started", "starting"):
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=2)

    def __repr__(self) -> str:
        return f"<Consumer {self.topic}/{self.channel} {getattr(self, '_state', '?')}>"

    def _fail(self, error: BaseException) -> None:
        """A non-recoverable error (misconfiguration): stop and let join() raise it."""
        if self._fatal is not None or self._state in ("closing", "closed"):
            return
        self._fatal = error
        log.error("consumer %s/%s stops: %s", self.topic, self.channel, error)
        on_error = self.options.on_error
        if on_error is not None:
            self._call_hook(on_error, error, "on_error")
        if self._state == "started":
            self._dispatcher.spawn(self.close(timeout=5.0))

    def _call_hook(self, hook: ErrorHook, arg: BaseException, name: str) -> None:
        """A user callback, sync or async; what it raises is logged, never propagated."""
        try:
            result = hook(arg)
            if inspect.isawaitable(result):
                self._dispatcher.spawn(self._await_hook(result, name))
        except Exception:
            log.exception("%s: %s failed", self.topic, name)

    async def _await_hook(self, result: Awaitable[Any], name: str) -> None:
        try:
            await result
        except Exception:
            log.exception("%s: %s failed", self.topic, name)

    # ------------------------------------------------------------------ flow control

    def is_starved(self) -> bool:
        """True when some connection's in-flight messages reached 85 % of its RDY: nothing
        more arrives until messages are answered (batching handlers flush now)."""
        return self._dispatcher.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change the in-flight budget (from now on fixed, also when partitions come and
        go); 0 pauses consumption."""
        self._dispatcher.set_max_in_flight(check_max_in_flight(max_in_flight))

    @property
    def max_in_flight(self) -> int:
        """The in-flight budget now (with ``max_in_flight=None``: the subscriptions)."""
        return self._dispatcher.max_in_flight

    @property
    def replays(self) -> ReplayFilter:
        """The producers' sequence stamps this consumer took (ordered, on youzan ext
        topics): the ``replay_filter`` given, else its own. Its
        :meth:`~smartnsq.flow.replays.ReplayFilter.snapshot` is what a restarted consumer
        given it back (``replay_filter=ReplayFilter.restore(...)``) must not hand over
        again."""
        return self._dispatcher.replay_filter

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters since start (see :class:`ConsumerStats`); also after close."""
        dispatcher = self._dispatcher
        snapshot = ConsumerStats(
            connects=dispatcher.connects,
            reconnects=dispatcher.reconnects,
            handler_errors=dispatcher.handler_errors,
            touched=dispatcher.touched,
            server_errors=dispatcher.server_errors,
            short_lived=self._subscriber.short_lived,
            connections=self._subscriber.open_subscriptions(),
        )
        ledger = dispatcher.ledger
        if ledger is not None:
            counts = ledger.counts
            snapshot.received = counts.received
            snapshot.finished = counts.finished
            snapshot.requeued = counts.requeued
            snapshot.given_up = counts.given_up
            snapshot.lost_answers = counts.lost_answers
            snapshot.duplicates = counts.duplicates
            snapshot.replays_skipped = counts.replays_skipped
            snapshot.stamped_replays = counts.stamped_replays
            snapshot.order_violations = counts.order_violations
            snapshot.channel_moves = counts.channel_moves
            snapshot.in_flight = ledger.in_flight
            snapshot.per_partition = ledger.finished_per_partition()
        return snapshot

    # ------------------------------------------------------------------ answers

    def finish(self, message: Message) -> None:
        """FIN ``message`` (what ``await message.finish()`` does); raises
        :class:`NSQError` if it was answered already."""
        self._dispatcher.finish(message)

    def requeue(
        self, message: Message, delay: float | None = None, *, backoff: bool = True
    ) -> None:
        """REQ ``message``; ``delay`` None applies the requeue policy (requeue_delay x
        attempts, capped). On ordered channels nsqd ignores REQ delays, so the client waits
        the delay itself (touching the message) and then sends ``REQ 0``."""
        self._dispatcher.requeue(message, delay, backoff=backoff)

    def touch(self, message: Message) -> None:
        """TOUCH ``message``: nsqd resets its timeout."""
        self._dispatcher.touch(message)

    # ------------------------------------------------------------------ iteration

    async def getmany(self, max_messages: int = 100, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages at once, for consumers without a handler: what
        has arrived, at once; if nothing has, the first ones to arrive within ``timeout``
        seconds (None: wait for them). An empty list means the timeout passed, or the
        consumer was closed; if it stopped by an error, that error is raised. Answer each
        message (``finish``, ``requeue``, or ``async with message``)."""
        if type(max_messages) is not int or max_messages < 1:
            raise ValidationError("max_messages", "must be an int >= 1")
        if timeout is not None:
            timeout = check_seconds("timeout", timeout, positive=False)
        self._check_iterable()
        if self._state == "new":
            await self.start()
        dispatcher = self._dispatcher
        if not dispatcher.inbox and self._state in ("started", "starting"):
            try:
                await asyncio.wait_for(asyncio.shield(dispatcher.arrival()), timeout)
            except TimeoutError:
                return []
        inbox = dispatcher.inbox
        if not inbox and self._fatal is not None:
            raise self._fatal
        return [inbox.popleft() for _ in range(min(max_messages, len(inbox)))]

    def _check_iterable(self) -> None:
        if self.options.handler is not None:
            raise ValidationError("handler", "a consumer with a handler cannot be iterated")

    def __aiter__(self) -> Consumer:
        self._check_iterable()
        return self

    async def __anext__(self) -> Message:
        if self._state == "new":
            await self.start()
        dispatcher = self._dispatcher
        while True:
            if dispatcher.inbox:
                return dispatcher.inbox.popleft()
            if self._state not in ("started", "starting"):
                if self._fatal is not None:
                    raise self._fatal
                raise StopAsyncIteration
            await dispatcher.arrival()
