"""Carries a consumer's messages from its subscriptions to the handler (or the iterator),
and their answers back, as the delivery ledger decides.

:class:`Dispatcher` is what the :class:`~smartnsq.consumer.subscriber.Subscriber` reports to
(a :class:`~smartnsq.consumer.subscriber.SubscriptionListener`) and what a message's
``finish()``, ``requeue()`` and ``touch()`` end in (an
:class:`~smartnsq.consumer.subscription.Answerer`). For each event it asks the pure
:class:`~smartnsq.flow.delivery.DeliveryLedger` and carries out its decision: answers and
``RDY`` counts written to the connections, retired connections closed, deliveries released
to the handler (:class:`~smartnsq.consumer.handlers.HandlerRunner`) or to the iterator's
inbox. What the ledger cannot do without a clock or a disk is done here: the flow's timer,
the delay an ordered requeue waits out on the client, giving up on a message (the
dead-letter file, ``on_giving_up``), telemetry and the logs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable
from pathlib import Path
from typing import Any, cast

from smartnsq.client.telemetry import Telemetry
from smartnsq.client.tracelog import TRACE_LOGGER, log_consume
from smartnsq.consumer.deadletter import write_dead_letter
from smartnsq.consumer.handlers import HandlerRunner
from smartnsq.consumer.message import Message
from smartnsq.consumer.options import ConsumerOptions
from smartnsq.consumer.subscription import Answerer, Subscription
from smartnsq.errors import NSQError, OrderViolationError, ServerError
from smartnsq.flow.delivery import (
    GIVE_UP,
    GIVE_UP_NOW,
    HOLD,
    RUN,
    RUN_NOW,
    Answer,
    Decision,
    Delivery,
    DeliveryLedger,
)
from smartnsq.flow.logthrottle import LogThrottle
from smartnsq.flow.rdy import RdyController
from smartnsq.flow.replays import ReplayFilter
from smartnsq.protocol import commands
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.payload import MARKER, decompress_payload
from smartnsq.transport.connection import Connection
from smartnsq.transport.waiting import wait_event

__all__ = ["LOG_INTERVAL", "Dispatcher"]

log = logging.getLogger("smartnsq.consumer")

# Repeated warnings (handler failures of one exception type, a node that keeps refusing)
# are logged at most once per this many seconds, with the count of those not shown.
LOG_INTERVAL = 10.0

# How often (in messages) the consumer looks whether the smartnsq.trace log is on.
TRACE_CHECK = 256
_ACTIVE = ("starting", "started")


class Dispatcher:
    """The message flow of one consumer (see the module). ``runner`` None: messages go to
    the iterator's ``inbox``. ``fail`` stops the consumer with a non-recoverable error.
    The consumer sets ``phase`` as it starts and closes."""

    def __init__(
        self,
        options: ConsumerOptions,
        *,
        topic: str,
        channel: str,
        runner: HandlerRunner | None,
        telemetry: Telemetry,
        metric_attributes: dict[str, str],
        fail: Callable[[BaseException], None],
    ) -> None:
        self.options = options
        self.topic = topic
        self.channel = channel
        self.ordered = options.ordered  # read per handled message
        self.runner = runner
        self.telemetry = telemetry
        self.metric_attributes = metric_attributes
        self.fail = fail
        self._phase = "new"
        self._closing = False  # phase "closing": every answer may be the last awaited
        # None: one message in flight per subscription (each partition, or each classic
        # nsqd, serves the handler one at a time; ordered partitions do anyway)
        self.auto_budget = options.max_in_flight is None
        self.max_in_flight = 1 if options.max_in_flight is None else options.max_in_flight
        self.ledger: DeliveryLedger[Subscription] | None = None
        #: The sequence stamps an ordered consumer took: the one given, else a new one.
        self.replay_filter = options.replay_filter or ReplayFilter()
        self.inbox: deque[Message] = deque()  # released to the iterator, not taken yet
        self._inbox_waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._throttle = LogThrottle(LOG_INTERVAL)
        self._warned_low_rdy = False
        self.wanted_subscriptions = 0  # what the subscriber wants (for the low-RDY warning)
        # counted here (the rest is the ledger's)
        self.connects = 0
        self.reconnects = 0
        self.handler_errors = 0
        self.touched = 0
        self.server_errors = 0
        self._metered = (0, 0)  # the ledger's (finished, requeued) last sent to the metrics
        self._trace_countdown = 0
        self._tracing = False
        self._observing = telemetry.metering  # _tracing or metering
        self._run: Callable[[Message], None] = self._to_inbox  # the handler's, once started

    @property
    def phase(self) -> str:
        """The consumer's: new -> starting -> started -> closing -> closed."""
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self._phase = phase
        self._closing = phase == "closing"

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._drained = asyncio.Event()
        options = self.options
        rdy: RdyController[Subscription] = RdyController(
            self.max_in_flight,
            clock=_clock_of(loop),
            backoff=options.backoff_policy,
            low_rdy_idle_timeout=options.low_rdy_idle_timeout,
            low_rdy_timeout=options.low_rdy_timeout,
        )
        ledger = self.ledger = DeliveryLedger(rdy, options.delivery, self.replay_filter)
        self._receive = ledger.receive  # bound once: called per message
        if self.runner is not None:
            self.runner.start(loop)
            self._run = self.runner.starter(self._handled)

    # ------------------------------------------------------------------ SubscriptionListener

    @property
    def running(self) -> bool:
        return self.phase == "started"

    @property
    def stopping(self) -> bool:
        return self.phase in ("closing", "closed")

    @property
    def answerer(self) -> Answerer:
        return self

    def fatal(self, error: BaseException) -> None:
        self.fail(error)

    def warn(self, key: Hashable, text: str, *args: object) -> None:
        """A warning that repeats (a node refusing every reconnection): rate-limited."""
        held = self._throttle.allow(key)
        if held is not None:
            log.warning(text + LogThrottle.note(held, self._throttle.interval), *args)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as one of the consumer's tasks: kept referenced until done,
        cancelled and awaited by :meth:`shutdown`."""
        task = asyncio.ensure_future(coro)
        tasks = self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def wants(self, subscriptions: int) -> None:
        """The subscriber wants this many subscriptions (the low-RDY warning counts them)."""
        self.wanted_subscriptions = subscriptions

    def subscribed(self, sub: Subscription) -> None:
        """A new subscription gets its share of the flow."""
        self.connects += 1
        if self.ledger is None:
            return
        conn = sub.conn
        self._apply(self.ledger.add_lane(sub, conn.max_rdy_count, keeps_count=conn.keeps_rdy_count))
        self._fit_budget()
        self._schedule_tick()
        subscriptions = max(self.wanted_subscriptions, len(self.ledger.lanes))
        low = not self.auto_budget and subscriptions > self.max_in_flight > 0
        if low and not self._warned_low_rdy:
            self._warned_low_rdy = True
            log.warning(
                "%s/%s: max_in_flight=%d is below the %d partitions/nodes to consume: they "
                "take turns (every low_rdy_idle_timeout); raise max_in_flight (or leave it "
                "None: one per partition) to consume them all at once",
                self.topic,
                self.channel,
                self.max_in_flight,
                subscriptions,
            )

    def retired(self, sub: Subscription) -> None:
        """``sub``'s partition moved: no more flow on it, its connection closes once what is
        in flight on it is answered."""
        if sub.conn.is_open:
            sub.conn.send(commands.rdy(0))
        if self.ledger is None:
            return
        self._apply(self.ledger.retire(sub))
        self._fit_budget()
        self._schedule_tick()

    def lost(self, sub: Subscription) -> None:
        """``sub``'s connection closed: nothing on it can be answered any more (nsqd
        redelivers it)."""
        ledger = self.ledger
        if ledger is None:
            return
        self._apply(ledger.lose(sub))
        if self.inbox:
            # never handed out: nsqd redelivers them, nobody can answer them now
            kept = deque(m for m in self.inbox if m.lane is not sub)
            ledger.drop_unclaimed(m for m in self.inbox if m.lane is sub)
            self.inbox = kept
        self._fit_budget()
        self._schedule_tick()  # the tested connection may be the one leaving
        if self.phase != "started" or sub.closing:
            self._check_drained()
        else:
            self.reconnects += 1

    def on_server_error(self, sub: Subscription, conn: Connection, error: ServerError) -> None:
        """E_FIN_FAILED & co: the message timed out or was answered already; nsqd will
        redeliver it if need be. Never fatal."""
        self.server_errors += 1
        if self.ledger is not None and self.ledger.expected_refusal(sub):
            # an answer sent again to a copy of an answered delivery: nsqd had the first
            log.debug("%s: %s (a repeated answer)", conn.label, error)
            return
        self.warn(("server error", conn.address, error.code), "%s: %s", conn.label, error)

    # ------------------------------------------------------------------ intake

    def on_message(self, sub: Subscription, conn: Connection, frame: MessageFrame) -> None:
        # Bound methods kept as attributes are read, then called: self._receive(...) would
        # be a method lookup CPython 3.11 cannot specialize.
        receive = self._receive
        decision = receive(sub, frame)  # type: ignore[arg-type]  # a Message (Delivery)
        if decision is RUN_NOW:  # the common case, with nothing else to do
            countdown = self._trace_countdown - 1
            if countdown > 0 and frame.ext_raw is None and not self._observing:
                self._trace_countdown = countdown  # what _observed() does, inline
                run = self._run
                run(frame)  # type: ignore[arg-type]
                return
            if frame.ext_raw is not None or self._observed():
                self._accepted(frame, conn)  # type: ignore[arg-type]
            self._run(frame)  # type: ignore[arg-type]
            return
        message = cast(Message, frame)  # decoded with message_class=Message
        if decision.send or decision.rdy or decision.violation or decision.moved:
            self._apply(decision)
            if decision.moved is not None:
                self._channel_moved(message.partition, *decision.moved)
            if decision.violation is not None:
                self._order_violation(decision.violation)
        verdict = decision.verdict
        if verdict == RUN:
            self._accepted(message, conn)
            self._run(message)
        elif verdict == HOLD:
            self._accepted(message, conn)
        elif verdict == GIVE_UP:
            self._accepted(message, conn)
            self._give_up(message, attempts_run=message.attempts - 1)  # past max_attempts
        # DROP, ANSWER: a copy, a replay or a hand-back, answered (or not) by the ledger

    def _observed(self) -> bool:
        """Whether accepted messages are logged or metered. The trace log's level is read
        again every TRACE_CHECK messages, not for each (a logger lookup per message)."""
        self._trace_countdown -= 1
        if self._trace_countdown <= 0:
            self._trace_countdown = TRACE_CHECK
            self._tracing = TRACE_LOGGER.isEnabledFor(logging.INFO)
            self._observing = self._tracing or self.telemetry.metering
        return self._observing

    def _accepted(self, message: Message, conn: Connection) -> None:
        """A delivery taken for the handler (now or in its turn)."""
        if message.ext_raw is not None and MARKER in message.ext_raw:
            self._decompress(message)
        if TRACE_LOGGER.isEnabledFor(logging.INFO):  # log_consume picks INFO or DEBUG
            log_consume(message, conn.local_address)
        if self.telemetry.metering:
            self.telemetry.count("consumed", 1, self.metric_attributes)

    def _decompress(self, message: Message) -> None:
        ext = message.ext
        if ext is None:
            return
        try:
            message.body = decompress_payload(message.body, ext)
        except NSQError as exc:
            log.error("%s: cannot decompress message %s: %s", self.topic, message.id.hex(), exc)

    def _channel_moved(self, partition: int | None, expected: int, offset: int) -> None:
        """A delivery showed that the channel was moved (a seek): said once, not an order
        violation; the ledger checks the order anew from there."""
        log.info(
            "%s/%s: partition %s: the channel was moved (the next message was at offset %d, "
            "this one is at %d: a seek); order is checked anew from here",
            self.topic,
            self.channel,
            partition,
            expected,
            offset,
        )

    def channel_moved(self, partitions: Iterable[int | None]) -> None:
        """This process moved the channel on ``partitions`` (``Admin.seek``): the ordered
        sequence of each starts anew with its next delivery."""
        ledger = self.ledger
        if ledger is None:
            return
        for partition in partitions:
            ledger.channel_moved(partition)
            log.info(
                "%s/%s: partition %s: the channel was moved by a seek in this process; "
                "order is checked anew from its next message",
                self.topic,
                self.channel,
                partition,
            )

    def _order_violation(self, violation: str) -> None:
        """An ordered partition went backwards: logged and, with ``halt_on_violation``, the
        consumer stops (the ledger handed the message back)."""
        error = OrderViolationError(violation)
        log.error("%s: %s", self.topic, error)
        if self.options.raise_on_order_violation:
            self.fail(error)

    def _release(self, message: Message) -> None:
        """Hand ``message`` to the handler, or to the iterator."""
        self._run(message)

    def _to_inbox(self, message: Message) -> None:
        self.inbox.append(message)
        waiter = self._inbox_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def arrival(self) -> asyncio.Future[None]:
        """A future done when a message reaches the inbox (or the consumer closes)."""
        waiter = self._inbox_waiter
        if waiter is None or waiter.done():
            waiter = self._inbox_waiter = asyncio.get_running_loop().create_future()
        return waiter

    # ------------------------------------------------------------------ handler results

    def _handled(self, message: Message, exc: BaseException | None) -> None:
        """The handler returned (``exc`` None) or raised."""
        ledger: DeliveryLedger[Subscription] = self.ledger  # type: ignore[assignment]  # started
        if exc is None:
            if not message.responded:
                answer = ledger.finish(message)
                if type(answer) is bytes:  # _carry_out's common case, inline (per message)
                    message.lane.conn.send(answer)
                    if self._closing or self.telemetry.metering:
                        self._answers_sent()
                elif answer is not None:
                    self._apply(answer)  # type: ignore[arg-type]  # not bytes: a Decision
        elif isinstance(exc, asyncio.CancelledError):
            pass  # the consumer is closing: unanswered, nsqd redelivers it
        elif not isinstance(exc, Exception):
            # SystemExit, KeyboardInterrupt: they go on up; the message goes back to nsqd at
            # once, not counted as a failure.
            self.hand_back(message)
        else:
            self.handler_errors += 1
            self.log_failure(message, exc)
            self.failed(message)
        if self.ordered:
            turn = ledger.handler_done(message)
            if turn.run or turn.send:  # the partition's next delivery waited for this one
                self._apply(turn)

    def failed(self, message: Message) -> None:
        """``message``'s handler (or ``async with`` block) raised: requeue it with the
        backoff, or give up on it (the ledger's policy)."""
        decision = self._ledger().failed(message)
        if decision is None:
            return
        if decision is GIVE_UP_NOW:
            self._give_up(message, attempts_run=message.attempts)
            return
        if self.ordered and message.attempts >= self.options.max_attempts:
            log.error(
                "%s: ordered partition %s is blocked: message %s failed %d times "
                "(policy: keep retrying; set ordered_give_up=True to dead-letter it)",
                self.topic,
                message.partition,
                message.id.hex(),
                message.attempts,
            )
        self._requeued(message, decision)

    def log_failure(self, message: Message, exc: BaseException) -> None:
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

    def _give_up(self, message: Message, attempts_run: int) -> None:
        """Give up on ``message``, whose handler ran ``attempts_run`` times (counted by
        nsqd's attempts: the delivery that arrives past max_attempts does not run)."""
        path = self.options.dead_letter_path
        if path is not None and not write_dead_letter(message, Path(path), attempts_run):
            # Finishing it unrecorded would lose it (the error is logged): back to nsqd with
            # the requeue policy's delay, to be given up again (and written, once the file
            # takes it) when it comes back. on_giving_up is for messages given up for good.
            answer = self._ledger().requeue(message, None, backoff=False)
            if answer is not None:
                self._requeued(message, answer)
            return
        self.telemetry.count("given_up", 1, self.metric_attributes)
        log.warning(
            "%s: giving up on message %s after %d attempts",
            self.topic,
            message.id.hex(),
            attempts_run,
        )
        callback = self.options.on_giving_up
        if callback is not None:
            try:
                result = callback(message)
                if inspect.isawaitable(result):
                    self.spawn(self._given_up_after(message, result))
                    return
            except Exception:
                log.exception("%s: on_giving_up failed", self.topic)
        self._carry_out(message, self._ledger().given_up(message))

    async def _given_up_after(self, message: Message, result: Awaitable[Any]) -> None:
        """``on_giving_up`` returned an awaitable: FIN once it is over."""
        try:
            await result
        except Exception:
            log.exception("%s: on_giving_up failed", self.topic)
        self._carry_out(message, self._ledger().given_up(message))

    # ------------------------------------------------------------------ Answerer

    def finish(self, message: Delivery) -> None:
        """FIN ``message`` (what ``await message.finish()`` does)."""
        answer = self._ledger().finish(message)
        if answer is None:
            raise NSQError(f"message {message.id.hex()} was already answered")
        self._carry_out(message, answer)

    def requeue(
        self, message: Delivery, delay: float | None = None, *, backoff: bool = True
    ) -> None:
        """REQ ``message`` (see :meth:`smartnsq.consumer.consumer.consumer.Consumer.requeue`)."""
        if message.responded:
            raise NSQError(f"message {message.id.hex()} was already answered")
        answer = self._ledger().requeue(message, delay, backoff=backoff)
        if answer is not None:
            self._requeued(message, answer)

    def touch(self, message: Delivery) -> None:
        """TOUCH ``message``: nsqd resets its timeout."""
        if message.responded:
            raise NSQError(f"message {message.id.hex()} was already answered")
        data = self._ledger().touch(message)
        sub: Subscription = message.lane  # type: ignore[assignment]  # a consumer's lane
        conn = sub.conn
        if data is not None and conn.is_open:
            conn.send(data)
            self.touched += 1

    def exit_context(self, message: Delivery, exc: BaseException | None) -> bool:
        """``async with message:`` is over: finish it, or, after an exception, requeue it
        like a failed handler (the exception is logged and swallowed). Cancellation,
        SystemExit and KeyboardInterrupt hand the message back and go on up."""
        if message.responded:
            return False
        if exc is None:
            self.finish(message)
            return False
        if not isinstance(exc, Exception):
            self.hand_back(message)
            return False
        self.handler_errors += 1
        self.log_failure(cast(Message, message), exc)
        self.failed(cast(Message, message))
        return True

    def hand_back(self, message: Delivery) -> None:
        """REQ 0, not a failure: another consumer (or this one later) gets it at once."""
        answer = self._ledger().hand_back(message)
        if answer is not None:
            self._carry_out(message, answer)

    def _requeued(self, message: Delivery, answer: Answer[Subscription]) -> None:
        if isinstance(answer, Decision) and answer.wait:
            self.spawn(self._requeue_ordered(cast(Message, message), answer.wait))
        else:
            self._carry_out(message, answer)

    async def _requeue_ordered(self, message: Message, delay: float) -> None:
        """nsqd ignores REQ delays on ordered channels: wait here, touching the message so
        it stays ours, then ``REQ 0``; the partition moves on after that."""
        conn = message.lane.conn
        identify = conn.identify
        msg_timeout = identify.msg_timeout / 1000 if identify is not None else 60.0
        loop = asyncio.get_running_loop()
        until = loop.time() + delay
        ledger = self._ledger()
        try:
            while (remaining := until - loop.time()) > 0:
                await asyncio.sleep(min(remaining, msg_timeout / 2))
                data = ledger.touch(message)
                if loop.time() < until and data is not None and conn.is_open:
                    conn.send(data)
        finally:
            if self.phase in ("started", "closing"):
                self._carry_out(message, ledger.requeue_now(message))
            else:
                message.waiting = False

    def _ledger(self) -> DeliveryLedger[Subscription]:
        ledger = self.ledger
        if ledger is None:
            raise NSQError("the consumer was not started")
        return ledger

    # ------------------------------------------------------------------ decisions

    def _carry_out(self, message: Delivery, answer: Answer[Subscription]) -> None:
        """Send an answer: the bytes alone go on the message's own subscription (whose
        connection is open: the ledger decides otherwise for a lost one)."""
        if type(answer) is bytes:
            sub: Subscription = message.lane  # type: ignore[assignment]  # a consumer's lane
            sub.conn.send(answer)
            if self._closing or self.telemetry.metering:
                self._answers_sent()
        else:
            self._apply(answer)  # type: ignore[arg-type]  # not bytes: a Decision

    def _apply(self, decision: Decision[Subscription]) -> None:
        """Carry out ``decision``, in the ledger's order."""
        for sub, data in decision.send:
            conn = sub.conn
            # A connection closes (and its lane is lost, answers counted as lost) in one
            # step: an open lane's connection is open.
            if conn.is_open:
                conn.send(data)
        rdy = decision.rdy
        if rdy:
            for sub, count in rdy:
                conn = sub.conn
                if conn.is_open and not sub.closing:
                    conn.send(commands.rdy(min(count, conn.max_rdy_count)))
            self._schedule_tick()
        for sub in decision.closed:
            self.spawn(sub.conn.close())
        for message in decision.run:
            self._release(cast(Message, message))
        if self._closing or self.telemetry.metering:
            self._answers_sent()

    def _answers_sent(self) -> None:
        """While closing, the last answer awaited ends the drain; the metrics count them."""
        if self._closing:
            self._check_drained()
        if self.telemetry.metering:
            self._meter_answers()

    def _meter_answers(self) -> None:
        """The ledger's FIN and REQ counts since the last call, to the metrics."""
        counts = self._ledger().counts
        finished = counts.finished - self._metered[0]
        requeued = counts.requeued - self._metered[1]
        self._metered = (counts.finished, counts.requeued)
        if finished:
            self.telemetry.count("finished", finished, self.metric_attributes)
        if requeued:
            self.telemetry.count("requeued", requeued, self.metric_attributes)

    # ------------------------------------------------------------------ flow

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """A fixed budget from now on (also when subscriptions come and go)."""
        self.max_in_flight = max_in_flight
        self.auto_budget = False
        if self.ledger is not None and self.phase in _ACTIVE:
            self._apply(self.ledger.set_max_in_flight(max_in_flight))
            self._schedule_tick()

    def is_starved(self) -> bool:
        return self.ledger.rdy.is_starved() if self.ledger is not None else False

    def _fit_budget(self) -> None:
        """``max_in_flight=None``: the budget follows the number of live subscriptions."""
        ledger = self.ledger
        if not self.auto_budget or ledger is None or self.phase not in _ACTIVE:
            return
        budget = max(1, sum(1 for sub in ledger.lanes if not sub.closing))
        if budget != self.max_in_flight:
            self.max_in_flight = budget
            self._apply(ledger.set_max_in_flight(budget))

    def _schedule_tick(self) -> None:
        ledger, loop = self.ledger, self._loop
        if ledger is None or loop is None:
            return
        deadline = ledger.rdy.next_deadline()
        handle = self._tick_handle
        if handle is not None:
            if deadline is not None and handle.when() <= deadline:
                return
            handle.cancel()
            self._tick_handle = None
        if deadline is not None:
            self._tick_handle = loop.call_at(max(deadline, loop.time()), self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        if self.ledger is None or self.phase == "closed":
            return
        self._apply(self.ledger.tick())
        self._schedule_tick()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """The consumer closes: no more flow (RDY 0), and what was never handed out (behind
        an ordered partition's running handler, or not taken from the iterator) goes back
        to nsqd now."""
        ledger = self.ledger
        if ledger is None:
            return
        self._apply(ledger.close())
        unclaimed, self.inbox = list(self.inbox), deque()
        for message in unclaimed:
            self.hand_back(message)

    def outstanding(self) -> int:
        """Messages handed out (to handlers, or taken from the iterator) and not answered."""
        return (self.ledger.in_flight if self.ledger is not None else 0) - len(self.inbox)

    async def wait_drained(self, timeout: float) -> None:
        """Wait (up to ``timeout``) until every message handed out is answered."""
        if self._drained is None or self.outstanding() <= 0:
            return
        self._drained.clear()
        if not await wait_event(self._drained, timeout):
            log.warning(
                "%s: %d messages still unanswered after %.1f s; nsqd will redeliver them",
                self.topic,
                self.outstanding(),
                timeout,
            )

    def _check_drained(self) -> None:
        if self._drained is not None and self.outstanding() <= 0:
            self._drained.set()

    async def shutdown(self, handler_timeout: float = 5.0) -> None:
        """Cancel and await the dispatcher's tasks (never the one running this), stop the
        timer, wake the iterator, and let handler threads finish (waiting up to
        ``handler_timeout`` for them)."""
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self.ledger is not None:
            self.ledger.accepting = False  # what still arrives goes back to nsqd
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if not t.done() and t is not current]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.runner is not None and not await self.runner.close(handler_timeout):
            log.warning("%s: handler threads still running after close", self.topic)
        waiter = self._inbox_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _clock_of(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """The loop's clock for the RDY controller, which reads it per message: asyncio's
    ``loop.time()`` is ``time.monotonic()`` behind a method call, so that is read directly;
    other loops (uvloop caches its clock) keep their own."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time
