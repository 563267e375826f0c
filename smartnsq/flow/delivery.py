"""The consumer's delivery ledger (pure: no asyncio, no sockets).

:class:`DeliveryLedger` knows every message a consumer received and has not answered yet,
and decides what each event means: a delivery arrives (run it now, let it wait for its
ordered partition's turn, drop a copy of one in flight, answer it at once without running
it, give up on it), a message is answered (the ``FIN``/``REQ`` bytes, once), a handler is
over (the partition's next message may run), a subscription retires or is lost, the
consumer closes (what is held goes back to nsqd). Like :class:`~smartnsq.flow.rdy.RdyController`,
which it drives, it performs nothing: every event returns a :class:`Decision` (bytes to send
on which subscription, ``RDY`` counts, the deliveries whose turn has come), and the caller
acts on it, in order.

The rules it keeps:

* every delivery is answered at most once by the consumer; a copy of a delivery that is in
  flight here is dropped (the one answer covers both), and a copy of one already answered
  (youzan sends the first message of a channel's first ``SUB_ORDERED`` twice, and the
  second copy may become in flight only after the first was answered) gets the same answer
  again, never the handler;
* an ordered partition runs one message at a time, in the order nsqd delivers them;
* what a consumer finished is not handled again when a new leader replays it
  (:class:`~smartnsq.flow.ordering.PartitionSequence`);
* every delivery is answered, handed back (``REQ 0``) or dropped with its lost connection
  by the time the consumer is closed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

from smartnsq.errors import ValidationError
from smartnsq.flow.backoff import check_seconds, requeue_delay
from smartnsq.flow.ordering import PartitionSequence
from smartnsq.flow.rdy import Outcome, RdyController
from smartnsq.flow.replays import ReplayFilter
from smartnsq.protocol import commands
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.validation import MAX_REQ_DELAY_MS
from smartnsq.publishing.stamps import Stamp, parse_stamp

__all__ = [
    "ANSWER",
    "DROP",
    "GIVE_UP",
    "GIVE_UP_NOW",
    "HOLD",
    "NOTHING",
    "RUN",
    "RUN_NOW",
    "Answer",
    "Decision",
    "Delivery",
    "DeliveryCounts",
    "DeliveryLedger",
    "DeliveryOptions",
    "Lane",
    "check_requeue_delay",
]

# What became of a delivery just received (Decision.verdict of DeliveryLedger.receive), or
# of a failure (DeliveryLedger.failed).
NOTHING = 0  # nothing to say about one delivery (answers, flow changes)
RUN = 1  # hand it to the handler (or the iterator) now
HOLD = 2  # ordered: it waits for its partition's turn, and comes back in a Decision.run
DROP = 3  # a copy of a delivery in flight here: the one answer covers both
ANSWER = 4  # answered at once, unhandled (Decision.send): a repeat, a replay, a hand-back
GIVE_UP = 5  # give up on it (dead letter, hook), then DeliveryLedger.given_up

_FIN = 0x46  # the first byte of "FIN ..."


class Lane:
    """One subscription as the ledger sees it: the deliveries in flight on it and, on an
    ordered partition, whose turn it is. Subclassed by the client's subscription, which
    adds its connection; the ledger never looks at that."""

    __slots__ = (
        "closing",
        "current",
        "finished",
        "in_flight",
        "last",
        "lost",
        "partition",
        "pending",
        "queue",
        "repeats",
    )

    def __init__(self, partition: int | None) -> None:
        self.partition = partition
        self.pending: set[bytes] = set()  # ids delivered here and not answered yet
        self.in_flight = 0
        self.closing = False  # retiring: what arrives goes back; closed once drained
        self.lost = False  # its connection closed: nothing on it can be answered
        # ordered: the delivery whose turn it is (until its handler is over), and those
        # waiting behind it
        self.current: Delivery | None = None
        self.queue: deque[Delivery] | None = None  # made by the first to wait (600 bytes)
        # ordered: (id, attempts, answer) of the last delivery answered here; a copy of it
        # may follow, and gets the same answer again
        self.last: tuple[bytes, int, bytes] | None = None
        self.repeats = 0  # answers sent again, which nsqd may refuse (E_FIN_FAILED)
        self.finished = 0


class Delivery(MessageFrame):
    """A message frame as a consumer tracks it: the :class:`Lane` it came by, whether it
    has been answered, whether an ordered requeue is waiting out its delay, and (ordered)
    the producer's sequence stamp it was taken with."""

    __slots__ = ("_stamp", "lane", "responded", "waiting")

    lane: Lane
    responded: bool
    waiting: bool
    _stamp: Stamp | None  # the ledger's own: not a field of the message


L = TypeVar("L", bound=Lane)


class Decision(Generic[L]):
    """What follows from one event, for the caller to carry out in this order: ``send`` the
    answers (bytes, each on its lane), write the ``rdy`` counts (decreases come first), close
    the ``closed`` lanes (retiring, with nothing in flight any more), then run ``run`` (the
    deliveries whose ordered turn has come). ``verdict`` says what became of a delivery
    just received; ``violation`` describes an ordered partition going backwards; ``moved``
    is ``(expected offset, offset)`` when a delivery shows its channel was moved; ``wait``
    is an ordered requeue's delay, which the caller waits out before
    :meth:`DeliveryLedger.requeue_now`."""

    __slots__ = ("closed", "moved", "rdy", "run", "send", "verdict", "violation", "wait")

    def __init__(
        self,
        verdict: int = NOTHING,
        send: tuple[tuple[L, bytes], ...] = (),
        rdy: Sequence[tuple[L, int]] = (),
        closed: tuple[L, ...] = (),
    ) -> None:
        self.verdict = verdict
        self.send = send
        self.rdy = rdy
        self.closed = closed
        self.run: tuple[Delivery, ...] = ()
        self.violation: str | None = None
        self.moved: tuple[int, int] | None = None
        self.wait = 0.0

    def __repr__(self) -> str:
        parts = [f"verdict={self.verdict}"]
        for name in ("send", "rdy", "closed", "run", "violation", "moved", "wait"):
            value = getattr(self, name)
            if value:
                parts.append(f"{name}={value!r}")
        return f"Decision({', '.join(parts)})"


# What an answer comes to: the bytes alone when sending them on the delivery's lane is all
# there is to do (most answers), else a Decision.
Answer = Union[bytes, "Decision[L]"]

# Decisions that carry nothing but a verdict are shared: no allocation per message. Never
# modify them.
RUN_NOW: Decision[Any] = Decision(RUN)  # the common verdict: run it, nothing else to do
_HOLD: Decision[Any] = Decision(HOLD)
_DROP: Decision[Any] = Decision(DROP)
GIVE_UP_NOW: Decision[Any] = Decision(GIVE_UP)
_NOTHING: Decision[Any] = Decision(NOTHING)


class DeliveryCounts:
    """What the ledger counted since it was made."""

    __slots__ = (
        "channel_moves",
        "duplicates",
        "finished",
        "given_up",
        "lost_answers",
        "order_violations",
        "received",
        "replays_skipped",
        "requeued",
        "retired_finished",
        "stamped_replays",
    )

    def __init__(self) -> None:
        self.received = 0
        self.finished = 0  # FINs sent (handled, given up on)
        self.requeued = 0  # REQs sent (failures, hand-backs)
        self.given_up = 0
        self.lost_answers = 0  # answers not sent: their connection had closed
        self.duplicates = 0  # copies of a delivery in flight here, or just answered
        self.replays_skipped = 0  # ordered: redeliveries of finished messages, FINed unhandled
        # ordered: messages a producer's stamp says were taken already (stored twice, or
        # stored after the producer gave up on them), FINed unhandled
        self.stamped_replays = 0
        self.order_violations = 0
        self.channel_moves = 0  # ordered: a channel seen moved (a seek), order checked anew
        # FINs per partition of the lanes that are gone (live lanes count their own)
        self.retired_finished: dict[int | None, int] = {}


def check_requeue_delay(field: str, delay: object) -> float:
    """A requeue delay in seconds: 0 up to what nsqd takes in a REQ (youzan's
    ``max_req_timeout``, 3 days; classic nsqd caps it at its own, 1 h by default)."""
    seconds = check_seconds(field, delay, positive=False)
    if seconds > MAX_REQ_DELAY_MS / 1000:
        raise ValidationError(
            field, f"must be 0..{MAX_REQ_DELAY_MS // 1000} seconds (3 days), got {delay!r}"
        )
    return seconds


@dataclass(frozen=True, kw_only=True)
class DeliveryOptions:
    """The delivery policy of one consumer, checked once when made.

    ``ordered``: one message at a time per lane, with replay and order checks;
    ``iterating``: no handler, so an ordered turn ends when the message is answered rather
    than when its handler is over; ``max_attempts``: a delivery whose handler failed at its
    last allowed attempt is given up at once (ordered: when ``ordered_give_up``), and one
    that arrives past it (unordered) is given up without running;
    ``skip_replays``: FIN, unhandled, what an ordered consumer finished before;
    ``halt_on_violation``: a delivery that breaks the order goes back instead of running
    (the consumer stops); ``requeue_delay`` and ``max_requeue_delay``: a failed message
    waits ``requeue_delay`` seconds times its attempts, capped.
    """

    ordered: bool = False
    iterating: bool = False
    max_attempts: int = 5
    ordered_give_up: bool = False
    skip_replays: bool = False
    halt_on_violation: bool = False
    requeue_delay: float = 90.0
    max_requeue_delay: float = 900.0

    def __post_init__(self) -> None:
        if type(self.max_attempts) is not int or self.max_attempts < 1:
            raise ValidationError("max_attempts", "must be an int >= 1")
        object.__setattr__(
            self,
            "requeue_delay",
            check_seconds("requeue_delay", self.requeue_delay, positive=False),
        )
        # the cap of every policy delay: one nsqd takes, or a failed handler's REQ would fail
        object.__setattr__(
            self,
            "max_requeue_delay",
            check_requeue_delay("max_requeue_delay", self.max_requeue_delay),
        )


class DeliveryLedger(Generic[L]):
    """The delivery bookkeeping of one consumer, by its :class:`DeliveryOptions`. ``rdy``
    (keyed by lanes) is driven by the ledger's events; its RDY counts come back in the
    decisions."""

    def __init__(
        self,
        rdy: RdyController[L],
        options: DeliveryOptions = DeliveryOptions(),
        replays: ReplayFilter | None = None,
    ) -> None:
        self.rdy = rdy
        self.options = options
        # read per message
        self.ordered = options.ordered
        self.max_attempts = options.max_attempts
        self.counts = DeliveryCounts()
        self.in_flight = 0  # received, not answered, not dropped with a lost lane
        self.accepting = True  # False once closing: what arrives goes back to nsqd
        self.lanes: dict[L, None] = {}  # lanes not lost, in the order they came
        self._sequence = PartitionSequence()
        # ordered, per partition: the lane whose delivery has the turn (its handler runs),
        # and the lanes whose deliveries wait for it. A partition's leader moves while a
        # handler runs on the old leader's lane: the new lane's deliveries wait for it to
        # end, so that they are handled after it, and a copy of it is known for one only
        # once it succeeded (a copy of a message whose handler failed must run).
        self._turns: dict[int, L] = {}
        self._waiting: dict[int, deque[L]] = {}
        #: Ordered: the producers' sequence stamps taken, per partition (restored from a
        #: snapshot by a consumer that keeps it across restarts).
        self.replays = replays if replays is not None else ReplayFilter()
        # an iterated ordered lane's turn ends with the answer (no handler to return)
        self._turn_ends_with_answer = options.iterating and options.ordered
        self._rdy_on_message = rdy.on_message  # bound once: called per message
        self._rdy_on_done = rdy.on_done

    # ------------------------------------------------------------------ lanes

    def add_lane(self, lane: L, max_rdy_count: int, *, keeps_count: bool = False) -> Decision[L]:
        """``lane`` is subscribed: it gets its share of the flow (``keeps_count``: its server
        keeps the RDY count as sent, see :meth:`RdyController.add_connection`)."""
        self.lanes[lane] = None
        return self._flow(self.rdy.add_connection(lane, max_rdy_count, keeps_count=keeps_count))

    def retire(self, lane: L) -> Decision[L]:
        """``lane`` leaves (its partition's leader moved): it gets no more flow (send it
        ``RDY 0``), what waits for its turn goes back, and it is ``closed`` once nothing
        is in flight on it."""
        if lane.closing or lane.lost:
            return _NOTHING
        lane.closing = True
        send, rdy = self._hand_back_queue(lane)
        rdy.extend(self.rdy.remove_connection(lane))
        decision: Decision[L] = Decision(NOTHING, send, rdy)
        if lane.in_flight == 0:
            decision.closed = (lane,)
        return decision

    def lose(self, lane: L) -> Decision[L]:
        """``lane``'s connection closed: nothing on it can be answered any more (nsqd
        redelivers it). What waited for its turn is dropped; deliveries still with a
        handler count as lost answers when they are answered."""
        if lane.lost:
            return _NOTHING
        lane.lost = True
        self.lanes.pop(lane, None)
        if lane.finished:
            retired = self.counts.retired_finished
            retired[lane.partition] = retired.get(lane.partition, 0) + lane.finished
            lane.finished = 0
        if lane.queue:
            self.drop_unclaimed(lane.queue)
            lane.queue.clear()
        return self._flow(self.rdy.remove_connection(lane))

    def drop_unclaimed(self, deliveries: Iterable[Delivery]) -> None:
        """Deliveries of a lost lane that were never handed out (behind an ordered turn,
        or not taken from an iterator): nobody can answer them now; nsqd redelivers them."""
        for delivery in deliveries:
            if not delivery.responded:
                delivery.responded = True
                delivery.lane.in_flight -= 1
                self.in_flight -= 1

    def close(self) -> Decision[L]:
        """The consumer closes: no more flow, what waits for an ordered turn goes back
        (``REQ 0``), and from now on what arrives goes back too."""
        self.accepting = False
        send: tuple[tuple[L, bytes], ...] = ()
        rdy: list[tuple[L, int]] = []
        for lane in self.lanes:
            held, updates = self._hand_back_queue(lane)
            send += held
            rdy.extend(updates)
        rdy.extend(self.rdy.set_max_in_flight(0))
        return Decision(NOTHING, send, rdy)

    def _hand_back_queue(self, lane: L) -> tuple[tuple[tuple[L, bytes], ...], list[tuple[L, int]]]:
        """``REQ 0`` for what waits behind ``lane``'s ordered turn: (answers, RDY counts)."""
        held = list(lane.queue or ())
        if lane.queue:
            lane.queue.clear()
        send = []
        rdy: list[tuple[L, int]] = []
        for delivery in held:
            answer = self._answer(delivery, commands.req(delivery.id, 0))
            if answer is not None:
                send.append(answer)
            rdy.extend(self.rdy.on_done(lane, "neutral"))
        return tuple(send), rdy

    # ------------------------------------------------------------------ flow

    def set_max_in_flight(self, max_in_flight: int) -> Decision[L]:
        """The flow's budget changed (0 pauses)."""
        return self._flow(self.rdy.set_max_in_flight(max_in_flight))

    def tick(self) -> Decision[L]:
        """The flow's deadline came (``rdy.next_deadline()``)."""
        return self._flow(self.rdy.tick())

    @staticmethod
    def _flow(updates: list[tuple[L, int]]) -> Decision[L]:
        return Decision(NOTHING, (), updates) if updates else _NOTHING

    # ------------------------------------------------------------------ intake

    def receive(self, lane: L, delivery: Delivery) -> Decision[L]:
        """A delivery arrived on ``lane``. The verdict says what to do with it."""
        message_id = delivery.id
        pending = lane.pending
        if message_id in pending:
            self.counts.duplicates += 1
            return _DROP
        last = lane.last  # only ordered lanes keep it
        if last is not None and last[0] == message_id and last[1] == delivery.attempts:
            # The same delivery again, after it was answered (youzan: the first message of a
            # channel's first SUB_ORDERED, whose copy nsqd may put in flight only once the
            # first answer reached it): it gets that answer again, never the handler.
            self.counts.duplicates += 1
            lane.repeats += 1
            return Decision(ANSWER, ((lane, last[2]),))
        pending.add(message_id)
        delivery.lane = lane
        delivery.responded = False
        delivery._stamp = None
        self.counts.received += 1
        self.in_flight += 1
        lane.in_flight += 1
        # Read, then called: self._rdy_on_message(...) would be a method lookup that
        # CPython 3.11 cannot specialize (an instance attribute, not a method).
        on_message = self._rdy_on_message
        rdy = on_message(lane)
        if not self.accepting or lane.closing:
            # Nobody takes it here (closing, or the lane retires): back to nsqd at once,
            # rather than held until the connection closes.
            return self._answered(ANSWER, delivery, commands.req(message_id, 0), "neutral", rdy)
        if self.ordered:
            delivery.waiting = False
            return self._receive_ordered(lane, delivery, rdy)
        if delivery.attempts > self.max_attempts:
            return Decision(GIVE_UP, (), rdy) if rdy else GIVE_UP_NOW
        return Decision(RUN, (), rdy) if rdy else RUN_NOW

    def _receive_ordered(
        self, lane: L, delivery: Delivery, rdy: list[tuple[L, int]]
    ) -> Decision[L]:
        sequence = self._sequence
        offset = delivery.offset
        partition = lane.partition
        internal_id = delivery.internal_id
        moved_from = violation = None
        if (
            offset is None
            or internal_id is None
            or not sequence.next_in_line(
                partition, lane, internal_id, offset, delivery.raw_size or 0, delivery.timestamp
            )
        ):
            # Not simply the next message on this connection: a move, a replay, a violation?
            replay = None
            if offset is not None:
                replay = self.options.skip_replays and sequence.is_replay(
                    partition, offset, delivery.timestamp
                )
                moved_from = sequence.moved_from(partition, lane, offset, replay)
                if moved_from is not None:  # a seek: what follows is the user's new start
                    sequence.restart(partition)
                    self.replays.restart(partition)
                    self.counts.channel_moves += 1
                    replay = False
            if replay:
                self.counts.replays_skipped += 1
                command = commands.fin(delivery.id)
                return self._answered(ANSWER, delivery, command, "neutral", rdy, tally=False)
            if internal_id is not None:
                violation = sequence.violation(
                    partition,
                    internal_id,
                    offset if offset is not None else -1,
                    delivery.raw_size or 0,
                    lane,
                )
                if violation is not None:
                    self.counts.order_violations += 1
                    if self.options.halt_on_violation:
                        command = commands.req(delivery.id, 0)
                        decision = self._answered(ANSWER, delivery, command, "neutral", rdy)
                        decision.violation = violation
                        return decision
        holder = self._turns.get(partition) if partition is not None else None
        if lane.current is not None or (holder is not None and holder is not lane):
            # its stamp is looked at when its turn comes: the one running may fail
            queue = lane.queue
            if queue is None:
                queue = lane.queue = deque()
            queue.append(delivery)
            if lane.current is None:
                self._wait_for_turn(partition, lane)
            verdict, shared = HOLD, _HOLD
        elif self._stamped_replay(partition, delivery):
            self.counts.stamped_replays += 1
            command = commands.fin(delivery.id)
            return self._answered(ANSWER, delivery, command, "neutral", rdy, tally=False)
        else:
            lane.current = delivery
            if partition is not None:
                self._turns[partition] = lane
            verdict, shared = RUN, RUN_NOW
        if not rdy and violation is None and moved_from is None:
            return shared
        decision = Decision(verdict, (), rdy)
        decision.violation = violation
        if moved_from is not None and offset is not None:
            decision.moved = (moved_from, offset)
        return decision

    def channel_moved(self, partition: int | None) -> None:
        """The channel was moved on ``partition`` (this process's ``Admin.seek`` said so):
        ordered, its sequence starts anew with the next delivery, replays included."""
        if self.ordered:
            self._sequence.restart(partition)
            self.replays.restart(partition)
            self.counts.channel_moves += 1

    # ------------------------------------------------------------------ answers

    def finish(self, delivery: Delivery, *, success: bool = True) -> Answer[L] | None:
        """FIN ``delivery``: ``success`` when it was handled, else no verdict for the
        backoff. None when it was answered already."""
        if delivery.responded:
            return None
        lane: L = delivery.lane  # type: ignore[assignment]  # the lane it was received on
        if not success or lane.closing or lane.lost or self._turn_ends_with_answer:
            outcome: Outcome = "success" if success else "neutral"
            return self._settle(delivery, commands.fin(delivery.id), outcome)
        # A handled message of an open lane: what _settle does, inline (per message).
        delivery.responded = True
        message_id = delivery.id
        lane.pending.discard(message_id)
        lane.in_flight -= 1
        self.in_flight -= 1
        self.counts.finished += 1
        lane.finished += 1
        command = commands.fin(message_id)
        if self.ordered:
            self._ordered_answer(lane, delivery, command, True)
        on_done = self._rdy_on_done  # read, then called: see receive()
        done = on_done(lane, "success")
        if done:
            return Decision(NOTHING, ((lane, command),), done)
        return command

    def requeue(
        self, delivery: Delivery, delay: float | None = None, *, backoff: bool = True
    ) -> Answer[L] | None:
        """REQ ``delivery`` after ``delay`` seconds (None: the requeue policy). ``backoff``:
        it counts as a failure for the flow, on an unordered consumer (an ordered failure
        holds its own partition, which is its backoff). nsqd ignores REQ delays on ordered
        channels: there a positive delay comes back as ``Decision.wait``, to be waited out
        by the caller (touching the message) before :meth:`requeue_now`, while the message
        keeps its partition's turn. None when it was answered already."""
        if delivery.responded:
            return None
        if delay is None:
            options = self.options
            delay = requeue_delay(
                delivery.attempts, options.requeue_delay, options.max_requeue_delay
            )
        else:
            delay = check_requeue_delay("delay", delay)
        if self.ordered and delay > 0:
            delivery.waiting = True
            decision: Decision[L] = Decision()
            decision.wait = delay
            return decision
        outcome: Outcome = "failure" if backoff and not self.ordered else "neutral"
        return self._settle(delivery, commands.req(delivery.id, round(delay * 1000)), outcome)

    def requeue_now(self, delivery: Delivery) -> Answer[L]:
        """An ordered requeue's delay is over: ``REQ 0`` (unless it was answered meanwhile),
        and its partition's turn moves on."""
        delivery.waiting = False
        if delivery.responded:
            return self.handler_done(delivery)
        return self._with_turn_over(
            delivery, self._settle(delivery, commands.req(delivery.id, 0), "neutral")
        )

    def hand_back(self, delivery: Delivery) -> Answer[L] | None:
        """``REQ 0``, not a failure: another consumer (or this one later) gets it at once.
        None when it was answered already."""
        if delivery.responded:
            return None
        return self._settle(delivery, commands.req(delivery.id, 0), "neutral")

    def touch(self, delivery: Delivery) -> bytes | None:
        """The ``TOUCH`` for ``delivery``; None when it is answered or its lane is lost."""
        if delivery.responded or delivery.lane.lost:
            return None
        return commands.touch(delivery.id)

    def failed(self, delivery: Delivery) -> Answer[L] | None:
        """``delivery``'s handler raised: requeue it with the policy's delay (a failure for
        the flow), or, at its last allowed attempt (``max_attempts``; ordered only with
        ``ordered_give_up``), the verdict :data:`GIVE_UP`: given up right away, not requeued
        once more only to be given up when it comes back. None when the handler had answered
        it before raising."""
        if delivery.responded:
            return None
        if delivery.attempts >= self.max_attempts and (
            not self.ordered or self.options.ordered_give_up
        ):
            return GIVE_UP_NOW
        return self.requeue(delivery, None, backoff=True)

    def given_up(self, delivery: Delivery) -> Answer[L]:
        """The consumer gave up on ``delivery``: FIN it (no verdict for the backoff) and, on
        an ordered partition, let the next message go."""
        answer = self.finish(delivery, success=False)
        self.counts.given_up += 1
        if answer is None:
            answer = _NOTHING
        return self._with_turn_over(delivery, answer) if self.ordered else answer

    def handler_done(self, delivery: Delivery) -> Decision[L]:
        """``delivery``'s handler is over, whatever it answered: on an ordered lane its turn
        ends and the next delivery of its partition may run (on its lane, or on a lane that
        waited for the turn). Does nothing when called again, or while its requeue delay
        runs."""
        lane: L = delivery.lane  # type: ignore[assignment]  # the lane it was received on
        if lane.current is not delivery or delivery.waiting:
            return _NOTHING
        lane.current = None
        partition = lane.partition
        if partition is not None and self._turns.get(partition) is lane:
            del self._turns[partition]
        return self._next_turn(lane)

    def _next_turn(self, lane: L) -> Decision[L]:
        """The turn ``lane``'s partition has free: to the next delivery behind it on
        ``lane``, else on the lanes that waited; stamped copies of what was handled are
        FINed on the way."""
        partition = lane.partition
        waiting = self._waiting.get(partition) if partition is not None else None
        decision: Decision[L] | None = None
        send: list[tuple[L, bytes]] = []
        rdy: list[tuple[L, int]] = []
        closed: list[L] = []
        candidate: L | None = lane
        while candidate is not None:
            queue = candidate.queue
            while queue and self.accepting and not candidate.closing and not candidate.lost:
                following = queue.popleft()
                if self._stamped_replay(partition, following):
                    self.counts.stamped_replays += 1
                    answer = self._answer(following, commands.fin(following.id), tally=False)
                    if answer is not None:
                        send.append(answer)
                    rdy.extend(self._rdy_on_done(candidate, "neutral"))
                    if candidate.closing and candidate.in_flight == 0:
                        closed.append(candidate)
                    continue
                candidate.current = following
                if partition is not None:
                    self._turns[partition] = candidate
                decision = Decision()
                decision.run = (following,)
                break
            if decision is not None or not waiting:
                break
            candidate = waiting.popleft()
        if waiting is not None and not waiting:
            del self._waiting[partition]  # type: ignore[arg-type]
        if decision is None:
            if not send and not rdy:
                return _NOTHING
            decision = Decision()
        if send:
            decision.send = tuple(send)
        if rdy:
            decision.rdy = rdy
        if closed:
            decision.closed = tuple(closed)
        return decision

    def _wait_for_turn(self, partition: int | None, lane: L) -> None:
        if partition is None:
            return
        waiting = self._waiting.get(partition)
        if waiting is None:
            waiting = self._waiting[partition] = deque()
        if lane not in waiting:
            waiting.append(lane)

    def _stamped_replay(self, partition: int | None, delivery: Delivery) -> bool:
        """Whether ``delivery``'s producer stamp says it was taken already (a copy stored
        twice, or one its producer gave up on, delivered late: FINed, never handed over
        twice); a news stamp is claimed for it."""
        if not delivery.ext_raw:
            return False
        stamp = parse_stamp(delivery.ext_raw)
        if stamp is None:
            return False
        if not self.replays.claim(partition, stamp):
            return True
        delivery._stamp = stamp
        return False

    def _with_turn_over(self, delivery: Delivery, answer: Answer[L]) -> Decision[L]:
        """``answer`` plus the end of ``delivery``'s ordered turn."""
        turn = self.handler_done(delivery)
        if isinstance(answer, bytes):
            decision: Decision[L] = Decision(NOTHING, ((delivery.lane, answer),))  # type: ignore[arg-type]
        elif answer is _NOTHING or answer is GIVE_UP_NOW:
            decision = Decision()
        else:
            decision = answer
        return _merged(decision, turn)

    def _answer(
        self, delivery: Delivery, command: bytes, tally: bool = True
    ) -> tuple[L, bytes] | None:
        """Record ``command`` as ``delivery``'s answer: what to send, or None (lost lane).
        ``tally``: counted as finished or requeued (a skipped replay is counted apart)."""
        delivery.responded = True
        lane: L = delivery.lane  # type: ignore[assignment]  # the lane it was received on
        lane.pending.discard(delivery.id)
        lane.in_flight -= 1
        self.in_flight -= 1
        is_fin = command[0] == _FIN
        if self.ordered:
            self._ordered_answer(lane, delivery, command, is_fin)
        counts = self.counts
        if lane.lost:
            counts.lost_answers += 1
            return None
        if not tally:
            pass
        elif is_fin:
            counts.finished += 1
            lane.finished += 1
        else:
            counts.requeued += 1
        return (lane, command)

    def _ordered_answer(self, lane: L, delivery: Delivery, command: bytes, is_fin: bool) -> None:
        """An ordered lane's answer: kept as its last (a copy of that delivery gets it again),
        and a FIN moves the partition's finished position on."""
        lane.last = (delivery.id, delivery.attempts, command)
        offset, size = delivery.offset, delivery.raw_size
        if is_fin and offset is not None and size is not None:
            self._sequence.finished(lane.partition, offset, size, delivery.timestamp)
        stamp = delivery._stamp
        if stamp is not None:
            if is_fin:
                self.replays.finish(lane.partition, stamp)
            else:
                self.replays.release(lane.partition, stamp)  # it comes back: news again

    def _settle(self, delivery: Delivery, command: bytes, outcome: Outcome) -> Answer[L]:
        """``command`` answers ``delivery``: the bytes alone when sending them on its lane is
        all there is to do (the common case), else a Decision."""
        answer = self._answer(delivery, command)
        lane: L = delivery.lane  # type: ignore[assignment]  # the lane it was received on
        done = self._rdy_on_done(lane, outcome)
        if done or answer is None or lane.closing or self._turn_ends_with_answer:
            return self._decide(answer, lane, done, delivery, NOTHING)
        return command

    def _answered(
        self,
        verdict: int,
        delivery: Delivery,
        command: bytes,
        outcome: Outcome,
        rdy: Sequence[tuple[L, int]],
        *,
        tally: bool = True,
    ) -> Decision[L]:
        """A delivery answered on arrival (``verdict`` ANSWER): always a Decision."""
        answer = self._answer(delivery, command, tally)
        lane: L = delivery.lane  # type: ignore[assignment]
        done = self._rdy_on_done(lane, outcome)
        return self._decide(answer, lane, [*rdy, *done] if done else rdy, delivery, verdict)

    def _decide(
        self,
        answer: tuple[L, bytes] | None,
        lane: L,
        rdy: Sequence[tuple[L, int]],
        delivery: Delivery,
        verdict: int,
    ) -> Decision[L]:
        decision = Decision(verdict, () if answer is None else (answer,), rdy)
        if lane.closing and lane.in_flight == 0:
            decision.closed = (lane,)
        if self._turn_ends_with_answer:
            return _merged(decision, self.handler_done(delivery))
        return decision

    # ------------------------------------------------------------------ reading

    def expected_refusal(self, lane: L) -> bool:
        """nsqd refused an answer on ``lane`` (E_FIN_FAILED...): whether it was one the
        ledger sent again knowingly (nsqd had taken the first already)."""
        if lane.repeats > 0:
            lane.repeats -= 1
            return True
        return False

    def finished_per_partition(self) -> dict[int | None, int]:
        """FINs sent per partition, lanes gone included."""
        totals = dict(self.counts.retired_finished)
        for lane in self.lanes:
            if lane.finished:
                totals[lane.partition] = totals.get(lane.partition, 0) + lane.finished
        return totals


def _merged(decision: Decision[L], turn: Decision[L]) -> Decision[L]:
    """``decision`` (a fresh one) with what an ordered turn's end adds after it."""
    if turn is _NOTHING:
        return decision
    if turn.send:
        decision.send = (*decision.send, *turn.send)
    if turn.rdy:
        decision.rdy = [*decision.rdy, *turn.rdy]
    if turn.closed:
        decision.closed = (*decision.closed, *turn.closed)
    if turn.run:
        decision.run = turn.run
    return decision
