"""The Consumer: subscribes to every partition (or a subset, or classic nsqd), keeps the
flow of messages within ``max_in_flight``, runs the handler, answers each message once, and
follows leader changes.

Floors used: the lookup manager (where partitions live, watched for changes), one
:class:`Connection` per (nsqd, partition), the pure :class:`RdyController` (RDY counts,
backoff), and eager handler execution (no task per message unless a handler really waits).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
import os
import time
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from smartnsq._eager import run_eager
from smartnsq.deadletter import write_dead_letter
from smartnsq.errors import (
    ClientClosedError,
    ConnectionClosedError,
    NSQError,
    OrderViolationError,
    ServerError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.flow.backoff import BackoffPolicy, check_seconds, requeue_delay
from smartnsq.flow.ordering import PartitionSequence
from smartnsq.flow.rdy import Outcome, RdyController
from smartnsq.logthrottle import LogThrottle
from smartnsq.message import Message, Subscription
from smartnsq.payload import MARKER, decompress_payload
from smartnsq.protocol import commands
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.validation import check_channel, check_partition, check_topic
from smartnsq.retry import Backoff
from smartnsq.routing.addresses import AddressMapping
from smartnsq.subscriber import Subscriber
from smartnsq.telemetry import Telemetry, server_attributes
from smartnsq.tracelog import TRACE_LOGGER, log_consume
from smartnsq.transport.connection import Compression, Connection, ConnectionConfig
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.targets import resolve_targets

__all__ = ["ORDERED_REQUEUE_DELAY", "REQUEUE_DELAY", "Consumer", "ConsumerStats"]

log = logging.getLogger("smartnsq.consumer")

# Repeated warnings (handler failures of one exception type, a node that keeps refusing)
# are logged at most once per this many seconds, with the count of those not shown.
LOG_INTERVAL = 10.0
# Seconds a failed message waits before its redelivery, times its attempts (go-nsq's
# default_requeue_delay); ordered consumers retry sooner (the partition waits meanwhile).
REQUEUE_DELAY = 90.0
ORDERED_REQUEUE_DELAY = 0.1

Handler = Callable[[Message], Any]
GivingUp = Callable[[Message], Any]
ErrorHook = Callable[[BaseException], Any]
# Called once a handler is over: (message, None) when it returned, (message, exc) if it raised.
_Done = Callable[[Message, "BaseException | None"], None]


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
    # deliveries of a message already in flight on the same connection: dropped unanswered
    duplicates: int = 0
    # ordered mode: redeliveries of messages this consumer had finished, FINed unhandled
    replays_skipped: int = 0
    order_violations: int = 0
    connects: int = 0
    reconnects: int = 0
    in_flight: int = 0
    connections: int = 0
    per_partition: dict[int | None, int] = field(default_factory=dict)


class Consumer:
    """Consumes ``topic``/``channel`` from youzan partitions or classic nsqd.

    Give ``lookupd`` (nsqlookupd HTTP addresses) or ``nsqd`` (classic nsqd TCP addresses).
    With a ``handler`` (a coroutine function, or a plain function run in a thread), returning
    finishes the message and raising requeues it; without one, iterate the consumer.
    ``ordered=True`` subscribes with SUB_ORDERED: each partition's messages reach the handler
    one at a time, in queue order. Durations are in seconds.
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
        partitions: Sequence[int] | None = None,
        max_attempts: int = 5,
        requeue_delay: float | None = None,
        max_requeue_delay: float = 900.0,
        backoff: BackoffPolicy | bool = True,
        on_giving_up: GivingUp | None = None,
        on_error: ErrorHook | None = None,
        dead_letter_path: str | os.PathLike[str] | None = None,
        ordered_give_up: bool = False,
        raise_on_order_violation: bool = False,
        skip_replays: bool | None = None,
        start: StartPosition | None = None,
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
        reconnect_backoff: Backoff | None = None,
        handler_threads: int | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        lookup_manager: LookupManager | None = None,
        address_map: AddressMapping | None = None,
    ) -> None:
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        if max_in_flight is not None:
            _check_max_in_flight(max_in_flight)
        if type(max_attempts) is not int or max_attempts < 1:
            raise ValidationError("max_attempts", "must be an int >= 1")
        # Checked here, not only when a failed message computes its delay (too late then).
        if requeue_delay is None:
            # A failed ordered message blocks its partition while it waits: retry it soon.
            requeue_delay = ORDERED_REQUEUE_DELAY if ordered else REQUEUE_DELAY
        self.requeue_delay = check_seconds("requeue_delay", requeue_delay, positive=False)
        self.max_requeue_delay = check_seconds(
            "max_requeue_delay", max_requeue_delay, positive=False
        )
        if handler is not None and not callable(handler):
            raise ValidationError("handler", "must be a coroutine function or a function")
        if on_error is not None and not callable(on_error):
            raise ValidationError("on_error", "must be a function or a coroutine function")
        if ordered and nsqd is not None:
            raise UnsupportedFeatureError(
                "ordered consumption subscribes to partitions found through nsqlookupd: use "
                "lookupd=[...] (classic nsqd has no SUB_ORDERED)"
            )
        if ordered and start is not None:
            raise ValidationError("start", "a start position needs SUB_ADVANCED, not ordered mode")
        if ordered and sample_rate:
            raise ValidationError("sample_rate", "ordered consumption needs sample_rate 0")
        if skip_replays and not ordered:
            raise ValidationError(
                "skip_replays", "needs ordered=True (ordered deliveries carry queue offsets)"
            )
        self.partitions = (
            None if partitions is None else frozenset(check_partition(p) for p in partitions)
        )
        if self.partitions is not None and not self.partitions:
            raise ValidationError("partitions", "must name at least one partition")
        self.handler = handler
        self.ordered = ordered
        self.max_attempts = max_attempts
        self.ordered_give_up = ordered_give_up
        self.raise_on_order_violation = raise_on_order_violation
        self.skip_replays = ordered if skip_replays is None else skip_replays
        self.start_position = start
        self.desired_tag = desired_tag
        self.on_giving_up = on_giving_up
        self.on_error = on_error
        self.dead_letter_path = Path(dead_letter_path) if dead_letter_path is not None else None
        if isinstance(backoff, BackoffPolicy):
            self.backoff: BackoffPolicy | None = backoff
        else:
            self.backoff = BackoffPolicy() if backoff else None
        # Short: after a leader failover or restart, the partition is consumed again within
        # about two seconds of its leader taking writes (reconnecting to a node that is down
        # costs one refused connection per try).
        self.reconnect_backoff = reconnect_backoff or Backoff(initial=0.1, maximum=1.5)
        self.connection_config = ConnectionConfig.build(
            client_id=client_id,
            user_agent=user_agent,
            heartbeat_interval=heartbeat_interval,
            tls=tls,
            compression=compression,
            deflate_level=deflate_level,
            auth_secret=auth_secret,
            connect_timeout=connect_timeout,
            sample_rate=sample_rate,
            msg_timeout=msg_timeout,
        )
        self._nsqd, self._lookup, self._owns_lookup = resolve_targets(
            lookupd=lookupd,
            nsqd=nsqd,
            lookup_manager=lookup_manager,
            poll_interval=lookupd_poll_interval,
            address_map=address_map,
        )
        # None: one message in flight per subscription (each partition, or each classic
        # nsqd, serves the handler one message at a time; ordered partitions do anyway)
        self._auto_budget = max_in_flight is None
        self._max_in_flight = 1 if max_in_flight is None else max_in_flight
        self._low_rdy = (low_rdy_idle_timeout, low_rdy_timeout)
        self._handler_threads = handler_threads
        self._is_coroutine = handler is not None and is_coroutine_function(handler)
        self._stats = ConsumerStats()
        self._subscriber = Subscriber(
            self,
            topic=self.topic,
            channel=self.channel,
            ordered=ordered,
            partitions=self.partitions,
            start_position=start,
            desired_tag=desired_tag,
            connection_config=self.connection_config,
            reconnect_backoff=self.reconnect_backoff,
            lookup=self._lookup,
            nsqd=self._nsqd,
        )
        self._sequence = PartitionSequence()  # ordered mode: replays, order violations
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inbox: deque[Message] = deque()
        self._inbox_waiter: asyncio.Future[None] | None = None
        self._state = "new"  # new -> starting -> started -> closing -> closed
        self._fatal: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._controller: RdyController[Subscription] | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[None] | None = None
        self._drained: asyncio.Event | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._warned_low_rdy = False
        self._throttle = LogThrottle(LOG_INTERVAL)
        self._telemetry = Telemetry(
            "consumer", tracer_provider=tracer_provider, meter_provider=meter_provider
        )
        self._metric_attributes = {
            "messaging.destination.name": self.topic,
            "messaging.consumer.group.name": self.channel,
        }

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Consumer:
        """Discover, connect and subscribe; return once the initial subscriptions are in
        place (or failed: they are retried in the background). With ``nsqd=[...]``, raises
        when no nsqd accepted; with ``lookupd``, when no lookupd answers."""
        if self._state in ("closing", "closed"):
            raise ClientClosedError("this Consumer is closed; create a new one")
        if self._state != "new":
            return self
        self._state = "starting"
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._done = loop.create_future()
        self._drained = asyncio.Event()
        self._controller = RdyController(
            self._max_in_flight,
            clock=loop.time,
            backoff=self.backoff,
            low_rdy_idle_timeout=self._low_rdy[0],
            low_rdy_timeout=self._low_rdy[1],
        )
        self._telemetry.in_flight_gauge(lambda: self._stats.in_flight, self._metric_attributes)
        if self.handler is not None and not self._is_coroutine:
            budget = 32 if self._auto_budget else self._max_in_flight  # threads start lazily
            workers = self._handler_threads or min(32, max(1, budget))
            self._executor = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix=f"smartnsq-{self.topic}"
            )
        subscriber = self._subscriber
        try:
            await subscriber.start()
        except BaseException:
            await self._shutdown_now()
            raise
        if self._fatal is None and self._nsqd and not subscriber.subs:
            # Direct mode, like the Producer: at least one nsqd must accept before start()
            # returns; later losses are retried in the background.
            self._fatal = subscriber.last_connect_error or ConnectionClosedError(
                "no nsqd accepted the subscription", ", ".join(self._nsqd)
            )
        if self._fatal is not None:
            error = self._fatal
            self._fatal = None  # raised here, not again by join()
            await self._shutdown_now()
            raise error
        self._state = "started"
        subscriber.supervise()
        return self

    async def join(self) -> None:
        """Wait until the consumer is closed; raises the error that stopped it, if any."""
        if self._done is None:
            raise ClientClosedError("the consumer was not started")
        await asyncio.shield(self._done)

    async def close(self, timeout: float = 10.0) -> None:
        """Drain: stop new deliveries (RDY 0, CLS), let running handlers finish and answer
        (up to ``timeout``), then close. Messages not answered by then are redelivered by
        nsqd to other consumers."""
        if self._state in ("closing", "closed"):
            if self._done is not None and not self._done.done():
                await asyncio.wait([self._done])  # join() is where a failure is raised
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closing"
        self._subscriber.stop()
        if self._controller is not None:
            self._apply(self._controller.set_max_in_flight(0))
        self._hand_back_waiting()
        await self._send_cls()
        await self._wait_drained(timeout)
        await self._shutdown_now()

    def _hand_back(self, message: Message) -> None:
        """REQ 0, not a failure: another consumer (or this one later) gets it at once."""
        self._answer(message, commands.req(message.id, 0), "neutral", "requeued")

    def _hand_back_waiting(self) -> None:
        """Closing: messages never handed out (behind an ordered partition's running
        handler, or not yet taken from the iterator) go back to nsqd now."""
        subs = self._subscriber.subs.values()
        waiting = [m for sub in subs for m in sub.queue]
        waiting.extend(self._inbox)
        for sub in subs:
            sub.queue.clear()
        self._inbox.clear()
        for message in waiting:
            self._hand_back(message)

    async def _send_cls(self) -> None:
        futures = []
        for sub in list(self._subscriber.subs.values()):
            if sub.conn.is_open:
                try:
                    futures.append(sub.conn.request_future(commands.cls(), "CLS", timeout=2.0))
                except NSQError:
                    continue
        if futures:
            await asyncio.gather(*futures, return_exceptions=True)

    async def _wait_drained(self, timeout: float) -> None:
        # Messages still in the iterator's inbox were never handed out: they are not waited
        # for (closing the connection makes nsqd redeliver them).
        if self._drained is None:
            return
        if self._outstanding() > 0:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except asyncio.TimeoutError:
                log.warning(
                    "%s: %d messages still unanswered after %.1f s; nsqd will redeliver them",
                    self.topic,
                    self._outstanding(),
                    timeout,
                )

    def _outstanding(self) -> int:
        return self._stats.in_flight - len(self._inbox)

    async def _shutdown_now(self) -> None:
        self._state = "closed"
        subscriber = self._subscriber
        subscriber.stop()
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        # The task running this shutdown may be one of ours (_fail's close): never cancel
        # and await it from itself.
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if not t.done() and t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await subscriber.close()
        if self._lookup is not None and self._owns_lookup:
            await self._lookup.close()
        if self._executor is not None:
            # Handlers still running in threads finish (bounded) without blocking the loop.
            shutdown = functools.partial(self._executor.shutdown, wait=True, cancel_futures=True)
            try:
                await asyncio.wait_for(
                    asyncio.get_running_loop().run_in_executor(None, shutdown), 5.0
                )
            except asyncio.TimeoutError:
                log.warning("%s: handler threads still running after close", self.topic)
        waiter = self._inbox_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._done is not None and not self._done.done():
            if self._fatal is not None:
                self._done.set_exception(self._fatal)
                self._done.exception()  # retrieved by join() if someone calls it
            else:
                self._done.set_result(None)

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
        if self.on_error is not None:
            self._call_hook(self.on_error, error, "on_error")
        if self._state == "started" and self._loop is not None:
            self._spawn(self.close(timeout=5.0))

    def _call_hook(self, hook: Callable[[Any], Any], arg: Any, name: str) -> None:
        """A user callback, sync or async; what it raises is logged, never propagated."""
        try:
            result = hook(arg)
            if inspect.isawaitable(result):
                self._spawn(self._await_hook(result, name))
        except Exception:
            log.exception("%s: %s failed", self.topic, name)

    async def _await_hook(self, result: Awaitable[Any], name: str) -> None:
        try:
            await result
        except Exception:
            log.exception("%s: %s failed", self.topic, name)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as one of the consumer's tasks: kept referenced until done, cancelled
        and awaited by the shutdown. (_dispatch registers a suspended handler's task
        inline, the same way: that is per message.)"""
        task = asyncio.ensure_future(coro)
        tasks = self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    # ------------------------------------------------------------------ flow control API

    def is_starved(self) -> bool:
        """True when some connection's in-flight messages reached 85 % of its RDY: nothing
        more arrives until messages are answered (batching handlers flush now)."""
        return self._controller.is_starved() if self._controller is not None else False

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change the in-flight budget (from now on fixed, also when partitions come and
        go); 0 pauses consumption."""
        self._max_in_flight = _check_max_in_flight(max_in_flight)
        self._auto_budget = False
        if self._controller is not None and self._state in ("started", "starting"):
            self._apply(self._controller.set_max_in_flight(max_in_flight))
            self._schedule_tick()

    @property
    def max_in_flight(self) -> int:
        """The in-flight budget now (with ``max_in_flight=None``: the subscriptions)."""
        return self._max_in_flight

    def _fit_budget(self) -> None:
        """``max_in_flight=None``: the budget follows the number of live subscriptions."""
        if not self._auto_budget or self._controller is None:
            return
        if self._state not in ("started", "starting"):
            return
        budget = max(1, sum(1 for sub in self._subscriber.subs.values() if not sub.closing))
        if budget != self._max_in_flight:
            self._max_in_flight = budget
            self._apply(self._controller.set_max_in_flight(budget))

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters since start (see :class:`ConsumerStats`); also after close."""
        snapshot = ConsumerStats(**self._stats.__dict__)
        snapshot.per_partition = dict(self._stats.per_partition)
        snapshot.connections = self._subscriber.open_subscriptions()
        return snapshot

    def _apply(self, updates: list[tuple[Subscription, int]]) -> None:
        for sub, count in updates:
            conn = sub.conn
            if conn.is_open and not sub.closing:
                conn.send(commands.rdy(min(count, conn.max_rdy_count)))

    def _schedule_tick(self) -> None:
        controller, loop = self._controller, self._loop
        if controller is None or loop is None:
            return
        deadline = controller.next_deadline()
        if self._tick_handle is not None:
            if deadline is not None and self._tick_handle.when() <= deadline:
                return
            self._tick_handle.cancel()
            self._tick_handle = None
        if deadline is not None:
            self._tick_handle = loop.call_at(max(deadline, loop.time()), self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        if self._controller is None or self._state in ("closed",):
            return
        self._apply(self._controller.tick())
        self._schedule_tick()

    # ------------------------------------------------------------------ subscriptions

    @property
    def _running(self) -> bool:
        return self._state == "started"

    @property
    def _stopping(self) -> bool:
        return self._state in ("closing", "closed")

    def _attach(self, sub: Subscription) -> None:
        """A new subscription gets its share of the flow."""
        self._stats.connects += 1
        if self._controller is not None:
            self._apply(self._controller.add_connection(sub, sub.conn.max_rdy_count))
            self._fit_budget()
            self._schedule_tick()
        subscriptions = max(len(self._subscriber.wanted), len(self._subscriber.subs))
        low = not self._auto_budget and subscriptions > self._max_in_flight > 0
        if low and not self._warned_low_rdy:
            self._warned_low_rdy = True
            log.warning(
                "%s/%s: max_in_flight=%d is below the %d partitions/nodes to consume: they "
                "take turns (every low_rdy_idle_timeout); raise max_in_flight (or leave it "
                "None: one per partition) to consume them all at once",
                self.topic,
                self.channel,
                self._max_in_flight,
                subscriptions,
            )

    def _detach(self, sub: Subscription, *, lost: bool) -> None:
        """``sub`` leaves the flow: retired (its in-flight messages are still answered) or
        closed (nothing on it can be answered any more: nsqd redelivers)."""
        if self._controller is not None:
            self._apply(self._controller.remove_connection(sub))
            self._fit_budget()
            self._schedule_tick()  # the tested connection may be the one leaving
        if not lost:
            return
        if sub.queue:
            # ordered mode: messages waiting behind a running handler will be redelivered
            self._stats.in_flight -= len(sub.queue)
            sub.queue.clear()
        if self._inbox:
            # never handed out: nsqd redelivers them, nobody can answer them now
            kept = deque(m for m in self._inbox if m._sub is not sub)
            self._stats.in_flight -= len(self._inbox) - len(kept)
            self._inbox = kept
        if self._state != "started" or sub.closing:
            self._check_drained()
        else:
            self._stats.reconnects += 1

    def _on_server_error(self, conn: Connection, error: ServerError) -> None:
        # E_FIN_FAILED & co: the message timed out or was already answered; nsqd will
        # redeliver it if needed. Never fatal.
        self._stats.server_errors += 1
        log.warning("%s: %s", conn.label, error)

    # ------------------------------------------------------------------ messages

    def _on_message(self, sub: Subscription, conn: Connection, frame: MessageFrame) -> None:
        message = cast(Message, frame)  # decoded with message_class=Message
        stats = self._stats
        pending = sub.pending
        message_id = message.id
        if message_id in pending or (self.ordered and sub.last == (message_id, message.attempts)):
            # nsqd sent a message again that is in flight here, or (ordered) again right
            # after itself, the same delivery (youzan: the first one of a channel's first
            # SUB_ORDERED), possibly answered already: the first copy gets the one answer.
            stats.duplicates += 1
            log.debug("%s: duplicate delivery of %s dropped", conn.label, message_id.hex())
            return
        pending.add(message_id)
        if self.ordered:
            sub.last = (message_id, message.attempts)
        message._sub = sub
        message.responded = False
        message.waiting = False
        stats.received += 1
        stats.in_flight += 1
        sub.in_flight += 1
        controller = self._controller
        if controller is not None:
            updates = controller.on_message(sub)
            if updates:
                self._apply(updates)
        if (self._state != "started" and self._state != "starting") or sub.closing:
            # Closing (or this subscription retires): nobody takes it here, hand it back now
            # rather than hold it until the connection closes.
            self._hand_back(message)
            return
        if message.ext_raw is not None and MARKER in message.ext_raw:
            self._decompress(message)
        if TRACE_LOGGER.isEnabledFor(logging.INFO):  # log_consume picks INFO or DEBUG
            log_consume(message, conn.local_address)
        if self._telemetry.metering:
            self._telemetry.count("consumed", 1, self._metric_attributes)
        if self.ordered:
            if self.skip_replays and self._is_replay(sub, message):
                return
            if not self._check_order(sub, message):
                return
            if sub.current is not None:
                sub.queue.append(message)
                return
            sub.current = message
        elif message.attempts > self.max_attempts:
            self._give_up(message)
            return
        self._dispatch(message)

    def _decompress(self, message: Message) -> None:
        ext = message.ext
        if ext is None:
            return
        try:
            message.body = decompress_payload(message.body, ext)
        except NSQError as exc:
            log.error("%s: cannot decompress message %s: %s", self.topic, message.id.hex(), exc)

    def _is_replay(self, sub: Subscription, message: Message) -> bool:
        """A message this consumer already finished, delivered again: FIN it, unhandled
        (see :class:`PartitionSequence`)."""
        offset = message.offset
        if offset is None or not self._sequence.is_replay(sub.partition, offset, message.timestamp):
            return False
        self._answer(message, commands.fin(message.id), "neutral", "replays_skipped")
        log.debug(
            "%s: partition %s offset %d was finished before: replay skipped",
            self.topic,
            sub.partition,
            offset,
        )
        return True

    def _record_finished(self, sub: Subscription, message: Message) -> None:
        """Ordered mode: where the partition's next message starts (see _is_replay)."""
        offset, size = message.offset, message.raw_size
        if offset is not None and size is not None:
            self._sequence.finished(sub.partition, offset, size, message.timestamp)

    def _check_order(self, sub: Subscription, message: Message) -> bool:
        """Per partition, internal id and queue offset never go backwards; a violation is
        counted, logged and, with raise_on_order_violation, stops the consumer."""
        internal_id = message.internal_id
        if internal_id is None:
            return True
        offset = message.offset if message.offset is not None else -1
        violation = self._sequence.violation(sub.partition, internal_id, offset)
        if violation is None:
            return True
        self._stats.order_violations += 1
        error = OrderViolationError(violation)
        log.error("%s: %s", self.topic, error)
        if self.raise_on_order_violation:
            self._fail(error)
            return False
        return True

    def _dispatch(self, message: Message) -> None:
        handler = self.handler
        if handler is None:
            self._inbox.append(message)
            waiter = self._inbox_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        observed = self._telemetry.enabled
        if observed:
            done, token = self._observe(message)
        else:
            done, token = self._handled, None
        try:
            if self._is_coroutine:
                try:
                    coro = handler(message)
                except Exception as exc:  # noqa: BLE001 - creating the coroutine is the handler's failure
                    done(message, exc)
                    return
                task = run_eager(coro, done, message)
                if task is not None:  # it suspended: what _spawn does, without a call
                    tasks = self._tasks
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            elif self._executor is not None and self._loop is not None:
                if observed:  # the handler's thread sees the process span as current too
                    run = contextvars.copy_context().run
                    future = self._loop.run_in_executor(self._executor, run, handler, message)
                else:
                    future = self._loop.run_in_executor(self._executor, handler, message)
                future.add_done_callback(functools.partial(_thread_done, done, message))
        finally:
            if token is not None:
                Telemetry.detach(token)

    def _observe(self, message: Message) -> tuple[_Done, object | None]:
        """Telemetry for _dispatch: start the ``process`` span (continuing the producer's
        trace on ext topics) and make it current; returns what to call instead of _handled
        (it also records the handler duration and ends the span) and the token to detach
        once the handler has started."""
        telemetry = self._telemetry
        sub = message._sub
        started = time.perf_counter()
        opened = telemetry.start_process(self.topic, self.channel, message.ext)
        if opened is None:
            span, token = None, None
        else:
            span, token = opened
            if sub.partition is not None:
                span.set_attribute("messaging.destination.partition.id", str(sub.partition))
            span.set_attribute("messaging.message.id", message.id.hex())
            span.set_attribute("messaging.nsq.attempts", message.attempts)
            for key, value in server_attributes(sub.address).items():
                span.set_attribute(key, value)

        def done(message: Message, exc: BaseException | None) -> None:
            telemetry.handler_duration(time.perf_counter() - started, self._metric_attributes)
            if span is not None:
                if exc is not None and not isinstance(exc, asyncio.CancelledError):
                    Telemetry.fail(span, exc)
                span.end()
            self._handled(message, exc)

        return done, token

    def _handled(self, message: Message, exc: BaseException | None) -> None:
        """The handler returned (exc None) or raised."""
        sub = message._sub
        if exc is None:
            if not message.responded:
                self._finish_success(message, sub)
        elif isinstance(exc, asyncio.CancelledError):
            pass  # the consumer is closing: unanswered, nsqd redelivers it
        elif not isinstance(exc, Exception):
            # SystemExit, KeyboardInterrupt: they go on up (run_eager, _thread_done raise
            # them); the message goes back to nsqd at once, not counted as a failure.
            if not message.responded:
                self._hand_back(message)
        else:
            self._stats.handler_errors += 1
            self._log_failure(message, exc)
            if not message.responded:
                self._failed(message)
        if self.ordered:
            self._next_ordered(sub, message)

    def _log_failure(self, message: Message, exc: BaseException) -> None:
        """A handler failure, with its traceback; at most one per exception type every
        LOG_INTERVAL seconds (a handler failing on every message would flood the log)."""
        held = self._throttle.allow(("handler", type(exc)))
        if held is None:
            return
        log.warning(
            "%s: handler failed for message %s (attempt %d): %r%s",
            self.topic,
            message.id.hex(),
            message.attempts,
            exc,
            LogThrottle.note(held, self._throttle.interval),
            exc_info=exc,
        )

    def _warn(self, key: Hashable, text: str, *args: object) -> None:
        """A warning that repeats (a node refusing every reconnection): rate-limited."""
        held = self._throttle.allow(key)
        if held is not None:
            log.warning(text + LogThrottle.note(held, self._throttle.interval), *args)

    def _next_ordered(self, sub: Subscription, message: Message) -> None:
        """``message``'s turn is over (it was handled, or answered from the iterator): the
        partition's next message may go. Calling it again for the same message does nothing."""
        if message.waiting or sub.current is not message:
            return  # its REQ 0 is still to come, or its turn was released already
        sub.current = None
        if sub.queue and not sub.closing and self._state == "started":
            nxt = sub.queue.popleft()
            sub.current = nxt
            self._dispatch(nxt)

    def _failed(self, message: Message) -> None:
        if self.ordered:
            if message.attempts >= self.max_attempts and self.ordered_give_up:
                self._give_up(message)
                return
            if message.attempts >= self.max_attempts:
                log.error(
                    "%s: ordered partition %s is blocked: message %s failed %d times "
                    "(policy: keep retrying; set ordered_give_up=True to dead-letter it)",
                    self.topic,
                    message.partition,
                    message.id.hex(),
                    message.attempts,
                )
        self.requeue(message, None, backoff=True)

    def _give_up(self, message: Message) -> None:
        self._stats.given_up += 1
        self._telemetry.count("given_up", 1, self._metric_attributes)
        log.warning(
            "%s: giving up on message %s after %d attempts",
            self.topic,
            message.id.hex(),
            message.attempts,
        )
        path = self.dead_letter_path
        if path is not None:
            write_dead_letter(message, path)
        callback = self.on_giving_up
        if callback is not None:
            try:
                result = callback(message)
                if inspect.isawaitable(result):
                    self._spawn(self._given_up_after(message, result))
                    return
            except Exception:
                log.exception("%s: on_giving_up failed", self.topic)
        self._given_up(message)

    async def _given_up_after(self, message: Message, result: Awaitable[Any]) -> None:
        """``on_giving_up`` returned an awaitable: FIN once it is over."""
        try:
            await result
        except Exception:
            log.exception("%s: on_giving_up failed", self.topic)
        self._given_up(message)

    def _given_up(self, message: Message) -> None:
        """FIN a message given up on (neutral for the backoff) and, in ordered mode, let
        its partition move on."""
        self._answer(message, commands.fin(message.id), "neutral", "finished")
        if self.ordered:
            self._next_ordered(message._sub, message)

    # ------------------------------------------------------------------ answers

    def _answer(self, message: Message, command: bytes, outcome: Outcome, counter: str) -> bool:
        if message.responded:
            return False
        message.responded = True
        sub = message._sub
        sub.pending.discard(message.id)
        if self.ordered and command[:3] == b"FIN":
            self._record_finished(sub, message)
        stats = self._stats
        stats.in_flight -= 1
        sub.in_flight -= 1
        if sub.conn.is_open:
            sub.conn.send(command)
            setattr(stats, counter, getattr(stats, counter) + 1)
            if self._telemetry.metering:
                self._telemetry.count(counter, 1, self._metric_attributes)
            if counter == "finished":
                partition = sub.partition
                stats.per_partition[partition] = stats.per_partition.get(partition, 0) + 1
        else:
            stats.lost_answers += 1
            log.debug(
                "%s: connection closed; message %s will be redelivered",
                sub.address,
                message.id.hex(),
            )
        controller = self._controller
        if controller is not None:
            updates = controller.on_done(sub, outcome)
            if updates:
                self._apply(updates)
            if updates or outcome == "failure":
                self._schedule_tick()  # a backoff window opened or ended: new deadline
        if self.ordered and self.handler is None:
            # Iterating: answering is the end of the message's turn (a handler's turn ends
            # when the handler returns, whatever it answered meanwhile).
            self._next_ordered(sub, message)
        self._after_answer(sub)
        return True

    def _finish_success(self, message: Message, sub: Subscription) -> None:
        """_answer for the common case (a handler returned): FIN, counted, no detour."""
        message.responded = True
        sub.pending.discard(message.id)
        if self.ordered:
            self._record_finished(sub, message)
        stats = self._stats
        stats.in_flight -= 1
        sub.in_flight -= 1
        conn = sub.conn
        if conn.is_open:
            # The id comes from a decoded frame: always 16 bytes, no need to re-validate.
            conn.send(b"FIN " + message.id + b"\n")
            stats.finished += 1
            per_partition = stats.per_partition
            partition = sub.partition
            per_partition[partition] = per_partition.get(partition, 0) + 1
            if self._telemetry.metering:
                self._telemetry.count("finished", 1, self._metric_attributes)
        else:
            stats.lost_answers += 1
        controller = self._controller
        if controller is not None:
            updates = controller.on_done(sub, "success")
            if updates:  # rare: the success counted for the backoff
                self._apply(updates)
                self._schedule_tick()
        if (sub.closing and sub.in_flight == 0) or self._state == "closing":
            self._after_answer(sub)

    def _after_answer(self, sub: Subscription) -> None:
        self._subscriber.close_if_drained(sub)
        if self._state == "closing":
            self._check_drained()

    def _check_drained(self) -> None:
        if self._drained is not None and self._outstanding() <= 0:
            self._drained.set()

    def finish(self, message: Message) -> None:
        """FIN ``message`` (what ``await message.finish()`` does)."""
        if message.responded:
            raise NSQError(f"message {message.id.hex()} was already answered")
        self._answer(message, commands.fin(message.id), "success", "finished")

    def requeue(
        self, message: Message, delay: float | None = None, *, backoff: bool = True
    ) -> None:
        """REQ ``message``; ``delay`` None applies the requeue policy (requeue_delay x
        attempts, capped). On ordered channels nsqd ignores REQ delays, so the client waits
        the delay itself (touching the message) and then sends ``REQ 0``."""
        if message.responded:
            raise NSQError(f"message {message.id.hex()} was already answered")
        if delay is None:
            delay = requeue_delay(message.attempts, self.requeue_delay, self.max_requeue_delay)
        elif delay < 0:
            raise ValidationError("delay", "must be >= 0 seconds")
        # Ordered: the failed message holds its partition while it waits, which is the
        # backoff of that partition alone; the consumer-wide RDY backoff would stall the
        # others (nsqd serves each partition one message at a time anyway).
        outcome: Outcome = "failure" if backoff and not self.ordered else "neutral"
        if self.ordered and delay > 0:
            message.waiting = True
            self._spawn(self._requeue_ordered(message, delay, outcome))
            return
        self._answer(message, commands.req(message.id, round(delay * 1000)), outcome, "requeued")

    async def _requeue_ordered(self, message: Message, delay: float, outcome: Outcome) -> None:
        conn = message._sub.conn
        identify = conn.identify
        msg_timeout = identify.msg_timeout / 1000 if identify is not None else 60.0
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        try:
            while (remaining := until - loop.time()) > 0:
                await asyncio.sleep(min(remaining, msg_timeout / 2))
                if loop.time() < until and conn.is_open and not message.responded:
                    conn.send(commands.touch(message.id))  # keep it ours while we wait
        finally:
            message.waiting = False
            if not message.responded and self._state in ("started", "closing"):
                self._answer(message, commands.req(message.id, 0), outcome, "requeued")
            self._next_ordered(message._sub, message)

    def touch(self, message: Message) -> None:
        """TOUCH ``message``: nsqd resets its timeout."""
        if message.responded:
            raise NSQError(f"message {message.id.hex()} was already answered")
        conn = message._sub.conn
        if conn.is_open:
            conn.send(commands.touch(message.id))
            self._stats.touched += 1

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
        if not self._inbox and self._state in ("started", "starting"):
            try:
                await asyncio.wait_for(asyncio.shield(self._arrival()), timeout)
            except asyncio.TimeoutError:
                return []
        if not self._inbox and self._fatal is not None:
            raise self._fatal
        inbox = self._inbox
        return [inbox.popleft() for _ in range(min(max_messages, len(inbox)))]

    def _arrival(self) -> asyncio.Future[None]:
        """A future done when a message reaches the iterator's inbox (or it closes)."""
        waiter = self._inbox_waiter
        if waiter is None or waiter.done():
            waiter = self._inbox_waiter = asyncio.get_running_loop().create_future()
        return waiter

    def _check_iterable(self) -> None:
        if self.handler is not None:
            raise ValidationError("handler", "a consumer with a handler cannot be iterated")

    def _context_exit(self, message: Message, exc: BaseException | None) -> bool:
        """``async with message:`` is over: finish it, or, after an exception, requeue it
        like a failed handler (the exception is logged and swallowed). Cancellation,
        SystemExit and KeyboardInterrupt hand the message back and go on up."""
        if message.responded:
            return False
        if exc is None:
            self.finish(message)
            return False
        if not isinstance(exc, Exception):
            self._hand_back(message)
            return False
        self._stats.handler_errors += 1
        self._log_failure(message, exc)
        self._failed(message)
        return True

    def __aiter__(self) -> Consumer:
        self._check_iterable()
        return self

    async def __anext__(self) -> Message:
        if self._state == "new":
            await self.start()
        while True:
            if self._inbox:
                return self._inbox.popleft()
            if self._state not in ("started", "starting"):
                if self._fatal is not None:
                    raise self._fatal
                raise StopAsyncIteration
            await self._arrival()


def _thread_done(done: _Done, message: Message, future: asyncio.Future[Any]) -> None:
    """A handler run in a thread is over: ``done(message, exc)``. SystemExit and
    KeyboardInterrupt raised by the handler are raised again, on the loop."""
    exc = asyncio.CancelledError() if future.cancelled() else future.exception()
    done(message, exc)
    if exc is not None and not isinstance(exc, (Exception, asyncio.CancelledError)):
        raise exc


def _check_max_in_flight(value: int) -> int:
    if type(value) is not int or value < 0:
        raise ValidationError("max_in_flight", "must be an int >= 0")
    return value


def is_coroutine_function(handler: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
