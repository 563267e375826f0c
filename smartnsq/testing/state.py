"""The emulated cluster's data: topics, partitions (a log shared by the replicas, as the
replication in a real youzan cluster achieves), channels and their delivery state.

Pure data structures with no networking: sessions (``testing.nsqd``) subscribe to channels
and receive messages through the :class:`Subscriber` interface.
"""

from __future__ import annotations

import heapq
import itertools
import random
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from smartnsq.protocol.message import EXT_VERSION_NONE, PARTITION_ID_SHIFT, youzan_message_id
from smartnsq.protocol.server_session import Peer

__all__ = [
    "Channel",
    "ChannelCopy",
    "ChannelRecord",
    "Delivery",
    "Partition",
    "PartitionLog",
    "Record",
    "Subscriber",
    "Topic",
]

# On-disk size of a youzan message: 4-byte length + 26-byte header (+ ext block) + body.
_DISK_HEADER = 4 + 26
# Messages a client takes per turn when several clients share a channel.
_TURN = 64
# A lone client takes all its room in one turn (turns only matter between clients).
_WHOLE_TURN = 1 << 30
_pack_ids = struct.Struct(">QQ").pack  # youzan_message_id without the call, for MPUB
# Messages the tag dispatcher sets aside per pump before waiting for clients to free up.
_MAX_PARKED = 1000


class Record:
    """One message stored in a partition log."""

    __slots__ = (
        "body",
        "ext_raw",
        "ext_version",
        "id",
        "index",
        "internal_id",
        "not_before",
        "offset",
        "raw_size",
        "tag",
        "timestamp",
        "trace_id",
    )

    def __init__(
        self,
        index: int,
        message_id: bytes,
        internal_id: int,
        trace_id: int,
        timestamp: int,
        body: bytes,
        ext_version: int | None,
        ext_raw: bytes,
        offset: int,
        raw_size: int,
        tag: str | None,
    ) -> None:
        self.index = index
        self.id = message_id
        self.internal_id = internal_id
        self.trace_id = trace_id
        self.timestamp = timestamp
        self.body = body
        self.ext_version = ext_version
        self.ext_raw = ext_raw
        self.offset = offset
        self.raw_size = raw_size
        self.tag = tag
        self.not_before = 0.0  # classic DPUB: not delivered before this monotonic time


class Subscriber(Protocol):
    """What a channel needs from a subscribed client session."""

    rdy: int
    in_flight: int
    peer: Peer  # what its IDENTIFY set: msg_timeout, desired_tag, sample_rate
    label: str

    def deliver_many(self, deliveries: list[Delivery]) -> None: ...


class Delivery:
    """A message of a channel that has been delivered at least once and is not finished."""

    __slots__ = ("attempts", "client", "deadline", "echo_pending", "record")

    def __init__(self, record: Record) -> None:
        self.record = record
        self.attempts = 0
        self.deadline = 0.0
        self.client: Subscriber | None = None
        # sent twice, its second copy not in flight yet (Channel.late_echo)
        self.echo_pending = False


@dataclass
class ChannelRecord:
    """What a channel did, for tests: deliveries and FINs as (partition, internal id, ...)."""

    deliveries: list[tuple[int | None, int, int, str]] = field(default_factory=list)
    finished: list[tuple[int | None, int]] = field(default_factory=list)
    requeued: list[tuple[int | None, int]] = field(default_factory=list)
    timed_out: list[tuple[int | None, int]] = field(default_factory=list)

    def duplicates_finished(self) -> list[tuple[int | None, int]]:
        """Messages finished more than once (must be empty)."""
        seen: set[tuple[int | None, int]] = set()
        dupes = []
        for key in self.finished:
            if key in seen:
                dupes.append(key)
            seen.add(key)
        return dupes


class PartitionLog:
    """The append-only message log of one partition (or of one classic nsqd topic)."""

    def __init__(
        self, partition: int | None, *, ext: bool, classic: bool, topic_name: str = ""
    ) -> None:
        self.partition = partition
        self.ext = ext
        self.classic = classic
        self.topic_name = topic_name
        self.had_channel = False
        self.records: list[Record] = []
        self.end_offset = 0
        # A fresh youzan partition numbers its first message 2
        # (docs/protocol.md#first-message-id).
        self._sequence = itertools.count(1 if classic else 2)
        self.channels: dict[str, Channel] = {}

    def append(
        self,
        body: bytes,
        *,
        trace_id: int = 0,
        ext_version: int | None = None,
        ext_raw: bytes = b"",
        tag: str | None = None,
        timestamp: int | None = None,
    ) -> Record:
        record = self._append(body, trace_id, ext_version, ext_raw, tag, timestamp)
        for channel in self.channels.values():
            channel.schedule_pump()
        return record

    def _append(
        self,
        body: bytes,
        trace_id: int,
        ext_version: int | None,
        ext_raw: bytes,
        tag: str | None,
        timestamp: int | None,
    ) -> Record:
        sequence = next(self._sequence)
        if self.classic:
            internal_id = (int(time.time() * 1000) << 22) | (sequence & 0x3FFFFF)
            message_id = b"%016x" % (internal_id & 0xFFFFFFFFFFFFFFFF)
        else:
            internal_id = ((self.partition or 0) << PARTITION_ID_SHIFT) | sequence
            message_id = youzan_message_id(internal_id, trace_id)
        if self.ext:
            ext_version = EXT_VERSION_NONE if ext_version is None else ext_version
            ext_size = 1 + (2 + len(ext_raw) if ext_version != EXT_VERSION_NONE else 0)
        else:
            ext_version = None
            ext_size = 0
        raw_size = _DISK_HEADER + ext_size + len(body)
        record = Record(
            len(self.records),
            message_id,
            internal_id,
            trace_id,
            time.time_ns() if timestamp is None else timestamp,
            body,
            ext_version,
            ext_raw,
            self.end_offset,
            raw_size,
            tag,
        )
        self.records.append(record)
        self.end_offset += raw_size
        return record

    def extend(self, bodies: list[bytes]) -> None:
        """Append plain messages (MPUB: no trace id, ext header or tag), like :meth:`append`
        for each body, with one wake-up of the channels for the batch."""
        if self.ext:
            for body in bodies:
                self._append(body, 0, None, b"", None, None)
        else:
            # _append inlined for the plain layouts (MPUB is the hot path of producers).
            records = self.records
            index = len(records)
            offset = self.end_offset
            sequence = self._sequence
            classic = self.classic
            high = (self.partition or 0) << PARTITION_ID_SHIFT
            # one clock reading per batch: nsqd stamps an MPUB's messages within microseconds
            now_ns = time.time_ns()
            millis = (now_ns // 1_000_000) << 22
            append = records.append
            for body in bodies:
                if classic:
                    internal_id = millis | (next(sequence) & 0x3FFFFF)
                    message_id = b"%016x" % (internal_id & 0xFFFFFFFFFFFFFFFF)
                else:
                    internal_id = high | next(sequence)
                    message_id = _pack_ids(internal_id, 0)
                raw_size = _DISK_HEADER + len(body)
                append(
                    Record(
                        index,
                        message_id,
                        internal_id,
                        0,
                        now_ns,
                        body,
                        None,
                        b"",
                        offset,
                        raw_size,
                        None,
                    )
                )
                index += 1
                offset += raw_size
            self.end_offset = offset
        for channel in self.channels.values():
            channel.schedule_pump()

    def index_for_offset(self, offset: int) -> int:
        """Index of the first record at or after a queue offset."""
        lo, hi = 0, len(self.records)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.records[mid].offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def index_for_timestamp(self, nanoseconds: int) -> int:
        """The first message published at or after ``nanoseconds`` since the epoch."""
        for record in self.records:
            if record.timestamp >= nanoseconds:
                return record.index
        return len(self.records)


class Channel:
    """Delivery state of one channel on one partition log, as the node serving it holds it.

    Unordered: messages go to subscribed clients while each has in-flight < RDY; requeued
    messages are redelivered before new ones. Ordered (after SUB_ORDERED): exactly one message
    in flight, strictly in queue order; REQ delays are ignored.

    youzan: when a channel turns ordered for the first time while a message waits for
    delivery, that message goes out twice, same id and attempts. (``Channel.SetOrdered``,
    nsqd/channel.go, resets the channel's reader to the confirmed position while the message
    already read waits for a client: it is sent, then read and sent again. A channel with
    nothing to deliver at that moment sends each message once:
    docs/protocol.md#first-ordered-delivery.) Only one copy is in flight: the second FIN of
    its id fails.

    With ``late_echo`` (a fault, ``Cluster.set_ordered_echo_late``), nsqd puts the second copy
    in flight only after the client's first answer to that id arrived, as youzan sometimes
    does (about 3 fresh channels in 20: docs/protocol.md#a-fin-before-the-second-copy): that
    first FIN (REQ, TOUCH) fails as not in flight, and the message is then in flight, holding
    the partition until it is answered again or its msg_timeout passes.
    """

    def __init__(
        self,
        name: str,
        log: PartitionLog,
        *,
        start_index: int,
        schedule: Callable[[Callable[[], None]], object],
        clock: Callable[[], float],
        record: ChannelRecord | None,
    ) -> None:
        self.name = name
        self.log = log
        self.start_index = start_index  # its first message (classic) or the queue's end
        self.next_index = start_index
        self.ordered = False
        self.paused = False
        self.clients: list[Subscriber] = []
        self.in_flight: dict[bytes, Delivery] = {}
        self.requeue: deque[Delivery] = deque()
        self.deferred: list[tuple[float, int, Delivery]] = []
        self._deferred_seq = itertools.count()
        self._schedule = schedule
        self._clock = clock
        self._pump_scheduled = False
        self._rr = 0
        self.record = record
        self.next_deadline = float("inf")
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.finish_count = 0
        self.serving = True  # False while the partition has no leader to serve it
        self.youzan = not log.classic
        self._echo_next = False  # the next ordered delivery goes out twice (see above)
        self.late_echo = False  # the fault described above
        # youzan: called on a FIN while the replicas do not follow this channel yet (the
        # leader syncs a channel's consume offset to its replicas when messages are confirmed)
        self.on_confirm: Callable[[Channel], None] | None = None
        self.replicated = False

    # ------------------------------------------------------------------ queries

    @property
    def depth(self) -> int:
        """Messages waiting to be delivered (not counting in-flight ones)."""
        return len(self.log.records) - self.next_index + len(self.requeue) + len(self.deferred)

    def has_client_tags(self) -> bool:
        return any(c.peer.desired_tag for c in self.clients)

    def confirmed_index(self) -> int:
        """The log index below which every message is finished: where the channel resumes
        after a restart, or on a replica that becomes the leader (its confirmed offset)."""
        low = self.next_index
        for delivery in self.iter_unfinished():
            if delivery.record.index < low:
                low = delivery.record.index
        return low

    def make_ordered(self) -> None:
        """SUB_ORDERED: the channel becomes ordered (for good); the first time, on youzan,
        a message already waiting is sent twice (see the class doc)."""
        if not self.ordered:
            self.ordered = True
            self._echo_next = self.youzan and self._has_pending()

    # ------------------------------------------------------------------ clients

    def add_client(self, client: Subscriber) -> None:
        self.clients.append(client)
        self.schedule_pump()

    def remove_client(self, client: Subscriber) -> None:
        """The client left. youzan puts its in-flight messages back in the queue at once
        (attempts kept); classic nsqd leaves them in flight until their msg_timeout, so a
        client that leaves without answering holds them up to a minute."""
        if client in self.clients:
            self.clients.remove(client)
        if self.youzan:
            self._take_back([d for d in self.in_flight.values() if d.client is client])

    def _take_back(self, deliveries: list[Delivery]) -> None:
        """In-flight messages back to the front of the queue, in log order."""
        if not deliveries:
            return
        for delivery in deliveries:
            del self.in_flight[delivery.record.id]
            if delivery.client is not None:
                delivery.client.in_flight -= 1
            delivery.client = None
        deliveries.sort(key=lambda d: d.record.index)
        self.requeue.extendleft(reversed(deliveries))
        self.schedule_pump()

    # ------------------------------------------------------------------ delivery

    def schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self._schedule(self.pump)

    def _next_delivery(self) -> Delivery | None:
        if self.requeue:
            return self.requeue.popleft()
        records = self.log.records
        while self.next_index < len(records):
            record = records[self.next_index]
            self.next_index += 1
            if record.not_before and record.not_before > self._clock():
                entry = (record.not_before, next(self._deferred_seq), Delivery(record))
                heapq.heappush(self.deferred, entry)
                continue
            return Delivery(record)
        return None

    def _has_pending(self) -> bool:
        return bool(self.requeue) or self.next_index < len(self.log.records)

    def pump(self) -> None:
        """Deliver to every client with room (each client takes a turn of a few messages)."""
        self._pump_scheduled = False
        if self.paused or not self.serving or not self.clients:
            return
        if self.ordered:
            self._pump_ordered()
        elif self.has_client_tags():
            self._pump_tagged()
        else:
            self._pump_unordered()

    def _pump_unordered(self) -> None:
        clients = self.clients
        turn = _TURN if len(clients) > 1 else _WHOLE_TURN
        records = self.log.records
        requeue = self.requeue
        in_flight = self.in_flight
        now = self._clock()
        while True:
            sent = False
            for client in clients:
                room = min(client.rdy - client.in_flight, turn)
                if room <= 0:
                    continue
                # Same deadline for the batch: they leave in the same write.
                deadline = now + client.peer.msg_timeout
                rate = client.peer.sample_rate
                batch: list[Delivery] = []
                exhausted = False
                while room > 0:
                    if requeue:
                        delivery = requeue.popleft()
                    else:
                        index = self.next_index
                        if index >= len(records):
                            exhausted = True
                            break
                        record = records[index]
                        self.next_index = index + 1
                        if record.not_before and record.not_before > self._clock():
                            heapq.heappush(
                                self.deferred,
                                (record.not_before, next(self._deferred_seq), Delivery(record)),
                            )
                            continue
                        delivery = Delivery(record)
                    if rate and _sampled_out(rate):
                        self._finish(delivery, sampled=True)
                        continue
                    delivery.attempts += 1
                    delivery.client = client
                    delivery.deadline = deadline
                    in_flight[delivery.record.id] = delivery
                    batch.append(delivery)
                    room -= 1
                if batch:
                    self._sent(batch, client, deadline)
                    sent = True
                if exhausted:
                    return
            if not sent:
                return

    def _sent(self, batch: list[Delivery], client: Subscriber, deadline: float) -> None:
        """Bookkeeping of a batch already in flight, then hand it to the client."""
        count = len(batch)
        client.in_flight += count
        self.message_count += count
        if deadline < self.next_deadline:
            self.next_deadline = deadline
        if self.record is not None:
            partition = self.log.partition
            label = client.label
            self.record.deliveries.extend(
                (partition, d.record.internal_id, d.attempts, label) for d in batch
            )
        client.deliver_many(batch)

    def _pump_tagged(self) -> None:
        """Tag dispatch (youzan ext topics): a tagged message goes to a client that wants its
        tag, or to an untagged client when no client wants it; untagged clients get untagged
        messages. Messages nobody can take now stay queued, in order."""
        parked: list[Delivery] = []
        while len(parked) < _MAX_PARKED:
            if not any(c.in_flight < c.rdy for c in self.clients):
                break
            delivery = self._next_delivery()
            if delivery is None:
                break
            tag = delivery.record.tag or ""
            wanting = [c for c in self.clients if c.peer.desired_tag == tag]
            if not wanting and tag:
                wanting = [c for c in self.clients if not c.peer.desired_tag]
            target = next((c for c in wanting if c.in_flight < c.rdy), None)
            if target is None:
                parked.append(delivery)
            else:
                self._send(delivery, target)
        self.requeue.extendleft(reversed(parked))

    def _pump_ordered(self) -> None:
        """One message in flight, whatever the clients' RDY: youzan's channel pump stops
        reading once it has handed out a message of an ordered channel, until that message's
        confirmation wakes it (youzan/nsq 0.3.7-HA.1.13.0, nsqd/channel.go,
        ``Channel.messagePump`` waiting on ``tryReadBackend``, which the FIN's
        ``ContinueConsumeForOrder`` signals); the FIN schedules the next pump."""
        if self.in_flight:
            return
        ready = [c for c in self.clients if c.rdy > 0 and c.in_flight < c.rdy]
        if not ready:
            return
        delivery = self._next_delivery()
        if delivery is None:
            return
        self._rr = (self._rr + 1) % len(ready)
        self._send(delivery, ready[self._rr])

    def _send(self, delivery: Delivery, client: Subscriber) -> None:
        delivery.attempts += 1
        delivery.client = client
        deadline = self._clock() + client.peer.msg_timeout
        delivery.deadline = deadline
        self.in_flight[delivery.record.id] = delivery
        self._sent([delivery], client, deadline)
        if self._echo_next and self.ordered:
            self._echo_next = False
            delivery.echo_pending = self.late_echo
            # The same frame again; in flight once (its second FIN fails).
            record = self.record
            if record is not None:
                internal_id = delivery.record.internal_id
                entry = (self.log.partition, internal_id, delivery.attempts, client.label)
                record.deliveries.append(entry)
            client.deliver_many([delivery])

    # ------------------------------------------------------------------ answers

    def _echo_lands(self, delivery: Delivery, client: Subscriber) -> bool:
        """An answer to a message whose second copy is not in flight yet (``late_echo``):
        the answer fails, and the copy is in flight from now on."""
        if not delivery.echo_pending:
            return False
        delivery.echo_pending = False
        delivery.deadline = self._clock() + client.peer.msg_timeout
        return True

    def take(self, message_id: bytes, client: Subscriber) -> Delivery | None:
        """Remove an in-flight message owned by ``client`` (None if not in flight)."""
        delivery = self.in_flight.get(message_id)
        if delivery is None or delivery.client is not client:
            return None
        if self._echo_lands(delivery, client):
            return None
        del self.in_flight[message_id]
        client.in_flight -= 1
        delivery.client = None
        return delivery

    def finish(self, message_id: bytes, client: Subscriber) -> bool:
        return not self.finish_many([message_id], client)

    def finish_many(self, message_ids: list[bytes], client: Subscriber) -> list[bytes]:
        """:meth:`finish` each id in turn; returns the ids that were not in flight for
        ``client`` (each one a FIN error), in order."""
        in_flight = self.in_flight
        failed: list[bytes] = []
        finished: list[Delivery] = []
        for message_id in message_ids:
            delivery = in_flight.get(message_id)
            if delivery is None or delivery.client is not client:
                failed.append(message_id)
                continue
            if delivery.echo_pending and self._echo_lands(delivery, client):
                failed.append(message_id)
                continue
            del in_flight[message_id]
            delivery.client = None
            finished.append(delivery)
        if finished:
            count = len(finished)
            client.in_flight -= count
            self.finish_count += count
            if self.record is not None:
                partition = self.log.partition
                self.record.finished.extend((partition, d.record.internal_id) for d in finished)
            if not self.replicated and self.on_confirm is not None:
                self.on_confirm(self)
            self.schedule_pump()
        return failed

    def _finish(self, delivery: Delivery, *, sampled: bool = False) -> None:
        self.finish_count += 1
        if self.record is not None and not sampled:
            self.record.finished.append((self.log.partition, delivery.record.internal_id))

    def requeue_message(self, message_id: bytes, client: Subscriber, delay: float) -> bool:
        if self.ordered and delay > 0:
            # youzan ignores REQ delays on ordered channels: the message stays in flight
            # until its timeout.
            return message_id in self.in_flight and self.in_flight[message_id].client is client
        delivery = self.take(message_id, client)
        if delivery is None:
            return False
        self.requeue_count += 1
        if self.record is not None:
            self.record.requeued.append((self.log.partition, delivery.record.internal_id))
        if delay > 0:
            heapq.heappush(
                self.deferred, (self._clock() + delay, next(self._deferred_seq), delivery)
            )
        elif self.ordered:
            self.requeue.appendleft(delivery)
        else:
            self.requeue.append(delivery)
        self.schedule_pump()
        return True

    def touch(self, message_id: bytes, client: Subscriber) -> bool:
        delivery = self.in_flight.get(message_id)
        if delivery is None or delivery.client is not client:
            return False
        if self._echo_lands(delivery, client):
            return False
        delivery.deadline = self._clock() + client.peer.msg_timeout
        return True

    # ------------------------------------------------------------------ timers

    def sweep(self, now: float) -> None:
        """Redeliver timed-out messages and release deferred ones whose time came."""
        if self.deferred and self.deferred[0][0] <= now:
            while self.deferred and self.deferred[0][0] <= now:
                _, _, delivery = heapq.heappop(self.deferred)
                self.requeue.append(delivery)
            self.schedule_pump()
        if now < self.next_deadline:
            return
        expired = [d for d in self.in_flight.values() if d.deadline <= now]
        self.timeout_count += len(expired)
        if self.record is not None:
            partition = self.log.partition
            self.record.timed_out.extend((partition, d.record.internal_id) for d in expired)
        self._take_back(expired)
        self.next_deadline = min(
            (d.deadline for d in self.in_flight.values()), default=float("inf")
        )

    def reset_for_new_leader(self) -> None:
        """Leadership moved: every unfinished message will be redelivered by the new leader,
        same id, attempts counted afresh (the new leader keeps no attempt counters)."""
        self._take_back(list(self.in_flight.values()))
        self.requeue = deque(sorted(self.requeue, key=lambda d: d.record.index))
        for delivery in self.requeue:
            delivery.attempts = 0
        for _, _, delivery in self.deferred:
            delivery.attempts = 0
        self.next_deadline = float("inf")
        self.schedule_pump()

    def move_reader(self, index: int, reread: list[int] | None = None) -> None:
        """The consume position moves to log index ``index`` (a seek, or a SUB_ADVANCED
        start): what youzan's reader reset does (drainChannelWaiting, nsqd/channel.go). The
        messages in flight are forgotten, their owners' in-flight counts released (a later
        FIN of one fails unless it is delivered again); requeued and deferred ones are
        dropped. ``reread``: the log indexes from ``index`` on that go out first, in that
        order (the rule choosing it lives in ``testing.offsets``)."""
        for delivery in self.in_flight.values():
            if delivery.client is not None:
                delivery.client.in_flight -= 1
                delivery.client = None
        self.in_flight.clear()
        self.requeue.clear()
        self.deferred.clear()
        self.next_deadline = float("inf")
        self._echo_next = False
        records = self.log.records
        first = reread or []
        self.requeue.extend(Delivery(records[i]) for i in first)
        self.next_index = index + len(first)
        self.schedule_pump()

    def iter_unfinished(self) -> Iterator[Delivery]:
        yield from self.in_flight.values()
        yield from self.requeue
        for _, _, delivery in self.deferred:
            yield delivery


class ChannelCopy:
    """A channel as a youzan replica holds it (not serving): where consumption would resume
    if this node became the leader. While the replica receives the leader's consume-offset
    syncs it ``follows`` the leader's live channel; otherwise ``start`` is the index it last
    received."""

    __slots__ = ("follows", "name", "start")

    def __init__(self, name: str, start: int, follows: Channel | None = None) -> None:
        self.name = name
        self.start = start
        self.follows = follows

    def position(self) -> int:
        follows = self.follows
        return follows.confirmed_index() if follows is not None else self.start

    def freeze(self) -> None:
        """The replica stops receiving syncs (it stopped, or the leader changed)."""
        if self.follows is not None:
            self.start = self.follows.confirmed_index()
            self.follows = None


def _sampled_out(rate: int) -> bool:
    return random.randint(0, 99) >= rate


@dataclass
class Partition:
    """One partition of a youzan topic: its replicas, leader and shared log.

    The log's ``channels`` are the leader's (live, serving); ``copies`` are the other
    replicas' channels, per node: a channel a SUB creates exists on the leader only until the
    leader syncs its consume offset (on a FIN), and a registered one on every replica.

    ``writable``: the leader takes writes. That needs ``in_sync`` (a live leader and a
    majority of in-sync replicas, which FINs on ordered channels need too) and, for a topic
    created through nsqlookupd, its first topic check (``awaiting_check`` until then)."""

    topic: Topic
    id: int
    replicas: list[int]
    leader: int | None
    log: PartitionLog
    writable: bool = True
    in_sync: bool = True
    forced_unwritable: bool = False
    awaiting_check: bool = False
    copies: dict[int, dict[str, ChannelCopy]] = field(default_factory=dict)

    def copies_on(self, node: int) -> dict[str, ChannelCopy]:
        return self.copies.setdefault(node, {})


@dataclass
class Topic:
    name: str
    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False
    partitions: dict[int, Partition] = field(default_factory=dict)
    channel_names: list[str] = field(default_factory=list)  # every channel, in creation order
    registered_channels: list[str] = field(default_factory=list)  # through nsqlookupd

    def meta(self) -> dict[str, object]:
        return {
            "disable_channel_auto_create": self.disable_channel_auto_create,
            "extend_support": self.ext,
            "multi_part": self.multi_part,
            "ordered": self.ordered,
            "partition_num": self.partition_num,
            "replica": self.replica,
        }
