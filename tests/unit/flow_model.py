"""A model of nsqd as the publish flow's unit tests need it: links that carry a producer's
tries in order, nodes that lead partitions, a store per partition, and a driver that carries
out the flow's steps, with no socket, loop or clock (the test moves the time)."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from smartnsq.errors import ConnectionClosedError, NotLeaderError, NSQError, PubFailedError
from smartnsq.flow.retry import Delays, Stops
from smartnsq.protocol.lookupd import Node, TopicLayout, TopicMeta
from smartnsq.protocol.responses import OK
from smartnsq.publishing.flow import Batch, Publish, PublishFlow, Steps
from smartnsq.publishing.request import NO_KEY, PublishRequest, plain_request
from smartnsq.publishing.routes import Router
from smartnsq.publishing.stamps import Stamp, parse_stamp
from smartnsq.publishing.wire import PublishCodec
from smartnsq.routing.sharding import Sharder

TOPIC = "t"


class Fixed:
    """A backoff without jitter: ``step`` seconds after every failure."""

    def __init__(self, step: float = 0.1) -> None:
        self.step = step

    def delay(
        self, failures: int, failure: BaseException | None = None, elapsed: float = 0.0
    ) -> float:
        return self.step


def node(name: str) -> Node:
    port = 4150 + 2 * (ord(name) - ord("a"))
    return Node("127.0.0.1", port, port + 1, "0.3.7-HA.1.13.0")


def layout(leaders: Mapping[int, str | None], *, ext: bool = True) -> TopicLayout:
    """A write layout: partition -> its leader's name (None: not writable now)."""
    return TopicLayout(
        TOPIC,
        "w",
        partitions={p: node(n) for p, n in leaders.items() if n is not None},
        meta=TopicMeta(partition_num=len(leaders), replica=2, extend_support=ext),
        youzan=True,
    )


@dataclass(eq=False)
class Link:
    """One connection: the tries written on it and not yet read by nsqd, and nsqd's answers
    not yet read by the client."""

    key: tuple[str, str, int | None]
    number: int
    requests: deque[tuple[Publish | Batch, bytes]] = field(default_factory=deque)
    answers: deque[tuple[Publish | Batch, bytes | NSQError]] = field(default_factory=deque)
    alive: bool = True

    @property
    def address(self) -> str:
        return self.key[0]

    def __repr__(self) -> str:
        return f"<Link {self.number} {self.address} p{self.key[2]}>"


class Waiter:
    """A pooled publish's waiter, as the driver's future is: done once set."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.results: list[Any] | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.results is not None or self.error is not None

    def set_result(self, results: list[Any]) -> None:
        assert not self.done(), "answered twice"
        self.results = results

    def set_exception(self, error: BaseException) -> None:
        assert not self.done(), "answered twice"
        self.error = error


@dataclass
class Stored:
    """A message nsqd stored: which publish, its stamp, in which partition."""

    publish: Publish
    stamp: Stamp | None
    partition: int


class World:
    """The flow, its driver and the model cluster."""

    def __init__(
        self,
        partitions: int = 2,
        *,
        ext: bool = True,
        max_retries: int | None = None,
        step: float = 0.1,
        lane_depth: int = 256,
        per_turn: int = 256,
        sharder: Callable[[Any, int], int] | None = None,
        linger: float | None = None,
        max_batch: int = 100,
        delays: Delays | None = None,
        stop: Stops | None = None,
    ) -> None:
        self.now = 0.0
        self.leaders: dict[int, str | None] = {p: "abc"[p % 3] for p in range(partitions)}
        self.ext = ext
        # What nsqlookupd says (truth) and what the client has cached from it (layouts).
        self.truth: dict[str, TopicLayout] = {TOPIC: layout(self.leaders, ext=ext)}
        self.layouts: dict[str, TopicLayout] = dict(self.truth)
        self.writable: dict[int, bool] = {p: True for p in range(partitions)}
        self.partitions = partitions
        self.router = Router(Sharder(sharder or _modulo), start=lambda: 0)
        self.flow = PublishFlow(
            self.router,
            PublishCodec(),
            layouts=self.layouts.get,
            delays=Fixed(step) if delays is None else delays,
            max_retries=max_retries,
            stop=stop,
            request_timeout=10.0,
            producer_id="p1",
            lane_depth=lane_depth,
            per_turn=per_turn,
            linger=linger,
            max_batch=max_batch,
        )
        self.links: list[Link] = []
        self.connecting: list[tuple[str, str, int | None]] = []
        self.lookups: list[str] = []
        self.stored: list[Stored] = []
        self.sent: list[tuple[Publish | Batch, Link]] = []
        self.batches: list[Batch] = []  # every batch written
        self.unanswered: dict[int, list[Link]] = {}  # per publish: its tries never answered
        self.zombies: set[int] = set()  # publishes seen in flight past their deadline
        # (a, b): nsqd refused a and stored b right after it on one link, and the client
        # never read the refusal (the link died first): an order nsqd itself broke, which
        # no client can tell from a lost try
        self.inversions: set[tuple[int, int]] = set()
        self.refused_unread: dict[Link, list[Publish]] = {}  # per dead link
        self.done: list[Publish] = []
        self.calls: list[Publish] = []
        self.pooled: list[Waiter] = []
        self.more = False
        self.notes: list[tuple[int, str, tuple[Any, ...]]] = []

    # ------------------------------------------------------------------ the driver

    def act(self, steps: Steps, own: Publish | None = None) -> Steps:
        """Carry out ``steps``; ``own``: the publish just submitted, written after them."""
        for p in steps.sends:
            self.write(p)
        if own is not None and own.data is not None:
            self.write(own)
        self.connecting.extend(key for key in steps.connect if key not in self.connecting)
        self.lookups.extend(steps.lookup)
        self.done.extend(steps.done)
        for p in steps.done:
            _complete(p)
        self.notes.extend(steps.notes)
        self.more = self.more or steps.more
        return steps

    def write(self, p: Publish | Batch) -> None:
        """The driver writes ``p``'s try (or a batch of tries) on its link."""
        link, data = p.link, p.data
        p.data = None
        if not link.alive:  # pragma: no cover - the flow never picks a dead link
            raise AssertionError(f"{p} sent on a dead link")
        assert data is not None
        link.requests.append((p, data))
        self.sent.append((p, link))
        if isinstance(p, Batch):
            self.batches.append(p)
        for member in _members(p):
            self.unanswered.setdefault(id(member), []).append(link)

    def publish(
        self, key: Any = NO_KEY, *, timeout: float = 5.0, body: bytes = b"x", partition=None
    ) -> Publish:
        request = plain_request(TOPIC, body, partition, key)
        p, steps = self.flow.submit(request, self.now, self.now + timeout, waiter=object())
        self.calls.append(p)
        self.act(steps, own=p)
        return p

    def pool(self, *, timeout: float = 5.0, body: bytes = b"x") -> Waiter:
        """An unkeyed plain publish that waits for company (auto-batching)."""
        waiter = Waiter(self.now + timeout)
        self.act(self.flow.pool(TOPIC, body, None, self.now, waiter.deadline, waiter))
        self.pooled.append(waiter)
        return waiter

    def submit(self, request: PublishRequest, timeout: float = 5.0) -> Publish:
        p, steps = self.flow.submit(request, self.now, self.now + timeout, waiter=object())
        self.calls.append(p)
        self.act(steps, own=p)
        return p

    def connect(self, index: int = 0, *, ok: bool = True) -> Link | None:
        """Finish the ``index``-th connect asked for: open, or refused."""
        key = self.connecting.pop(index)
        if not ok:
            error = ConnectionClosedError("cannot connect: refused", key[0])
            self.act(self.flow.link_failed(key, error, self.now))
            return None
        link = Link(key, len(self.links))
        self.links.append(link)
        self.act(self.flow.link_up(key, link, True, self.now))
        return link

    def connect_all(self) -> None:
        while self.connecting:
            self.connect()

    def answer_lookups(self) -> None:
        """nsqlookupd answers the lookups asked for: the client caches what it says."""
        while self.lookups:
            topic = self.lookups.pop(0)
            if topic in self.truth:
                self.layouts[topic] = self.truth[topic]
            self.act(self.flow.layout_changed(topic, self.now))

    def look_up(self) -> None:
        """A lookup of the topic answers (the periodic poll, or a round for those that
        wait): the client caches what nsqlookupd says."""
        self.layouts[TOPIC] = self.truth[TOPIC]
        self.act(self.flow.layout_changed(TOPIC, self.now))

    def resume(self) -> None:
        while self.more:
            self.more = False
            self.act(self.flow.resume(self.now))

    def advance(self, seconds: float) -> None:
        """Move the time by ``seconds``, telling the flow at each of its deadlines."""
        until = self.now + seconds
        while True:
            at = self.flow.next_deadline()
            if at is None or at > until:
                break
            self.now = max(self.now, at)
            self.act(self.flow.tick(self.now))
            self.zombies.update(id(p) for p in self.calls if p.state == 4)  # ZOMBIE
            self.resume()
        self.now = until

    # ------------------------------------------------------------------ the model nsqd

    def process(self, link: Link, count: int = 1, *, fail: bool = False) -> int:
        """nsqd reads ``count`` tries of ``link`` (in order) and answers each: stored, or
        refused (not the leader, not writable, or ``fail``: E_PUB_FAILED)."""
        done = 0
        while link.requests and done < count:
            p, data = link.requests.popleft()
            link.answers.append((p, self._handle(link, p, data, fail)))
            done += 1
        return done

    def _handle(self, link: Link, p: Publish | Batch, data: bytes, fail: bool) -> bytes | NSQError:
        partition = link.key[2]
        assert partition is not None
        if self.leaders.get(partition) is None or node(self.leaders[partition]).tcp_address != (
            link.address
        ):
            return NotLeaderError("E_FAILED_ON_NOT_LEADER ", fatal=False)
        if not self.writable[partition] or fail:
            return PubFailedError("E_PUB_FAILED write failed", fatal=False)
        if isinstance(p, Batch):  # stored whole, in order
            stamps = _batch_stamps(data, len(p.members))
            self.stored.extend(
                Stored(m, stamp, partition) for m, stamp in zip(p.members, stamps, strict=True)
            )
            return OK
        self.stored.append(Stored(p, _stamp_of(data), partition))
        return OK

    def deliver(self, link: Link, count: int = 1) -> None:
        """The client reads ``count`` of ``link``'s answers."""
        for _ in range(count):
            if not link.answers or not link.alive:
                return
            p, outcome = link.answers.popleft()
            for member in _members(p):
                self.unanswered[id(member)].remove(link)
            if isinstance(outcome, NSQError):
                self.act(self.flow.refused(p, outcome, self.now))
            else:
                steps = self.flow.answered(p, outcome, self.now)
                if isinstance(p, Publish) and p.results is not None:
                    self.done.append(p)  # the driver answers the publish answered
                    _complete(p)
                self.act(steps)

    def roundtrip(self, link: Link | None = None) -> None:
        """Every link (or ``link``) processes and answers everything, connects and lookups
        finish: a healthy cluster, until nothing is left to do."""
        for _ in range(1000):
            busy = bool(self.connecting or self.lookups or self.more)
            self.connect_all()
            self.answer_lookups()
            self.resume()
            for each in list(self.links) if link is None else [link]:
                if each.alive and (each.requests or each.answers):
                    busy = True
                    self.process(each, len(each.requests))
                    self.deliver(each, len(each.answers))
            if not busy:
                return
        raise AssertionError("the flow never settled")  # pragma: no cover

    def kill(
        self, link: Link, *, processed: int = 0, error: NSQError | None = None
    ) -> list[tuple[Publish | Batch, bytes]]:
        """``link`` dies: nsqd had read ``processed`` more of its tries (stored or refused,
        never answered); the client loses every try in flight on it, in order. Returns the
        tries still held (a proxy may deliver them later: :meth:`late`)."""
        self.process(link, processed)
        unread = list(link.answers)
        self.refused_unread[link] = [
            m for a, outcome in unread if isinstance(outcome, NSQError) for m in _members(a)
        ]
        for index, (a, outcome) in enumerate(unread):
            if isinstance(outcome, NSQError):
                for b, later in unread[index + 1 :]:
                    if not isinstance(later, NSQError):
                        self.inversions.update(
                            (id(x), id(y)) for x in _members(a) for y in _members(b)
                        )
        link.answers.clear()
        held = list(link.requests)
        link.requests.clear()
        link.alive = False
        self.flow.link_down(link)
        error = error or ConnectionClosedError("connection lost", link.address)
        for p, _ in [*self.in_flight(link)]:
            self.act(self.flow.lost(p, error, self.now))
        return held

    def in_flight(self, link: Link) -> list[tuple[Publish | Batch, Link]]:
        """The tries the flow still has in flight on ``link`` (in the order sent)."""
        return [
            (p, each)
            for p, each in self.sent
            if each is link
            and any(
                m.link is link
                and m.state in (1, 4)  # SENT, ZOMBIE
                and (m.batch is p if isinstance(p, Batch) else m.batch is None)
                for m in _members(p)
            )
        ]

    def late(self, link: Link, held: list[tuple[Publish | Batch, bytes]]) -> None:
        """What a dead link held reaches nsqd after all (a proxy that delivered it late)."""
        for p, data in held:
            if not isinstance(self._handle(link, p, data, False), NSQError):
                # stored after what nsqd refused on that link, unknown to the client
                self.inversions.update(
                    (id(a), id(b)) for a in self.refused_unread.get(link, ()) for b in _members(p)
                )

    def move(self, partition: int, leader: str | None) -> None:
        """The partition's leader changes (None: no writable leader for now); nsqlookupd
        says so at the next lookup."""
        self.leaders[partition] = leader
        self.truth[TOPIC] = layout(self.leaders, ext=self.ext)

    # ------------------------------------------------------------------ what nsqd holds

    def partition_of(self, key: Any) -> int:
        return self.router.sharder.partition_for(key, self.partitions)

    def stored_in(self, partition: int) -> list[Stored]:
        return [s for s in self.stored if s.partition == partition]


def _modulo(key: Any, partition_num: int) -> int:
    return int(key) % partition_num


def _complete(p: Publish) -> None:
    """What the driver does for a publish over: answer its waiter (the model's own)."""
    waiter = p.waiter
    if not hasattr(waiter, "set_result") or waiter.done():
        return
    if p.results is not None:
        waiter.set_result(p.results)
    elif p.error is not None:
        waiter.set_exception(p.error)


def _members(p: Publish | Batch) -> list[Publish]:
    return p.members if isinstance(p, Batch) else [p]


_STAMPED = re.compile(rb'\{[^{}]*"smartnsq\.seq":"[^"]*"[^{}]*\}')


def _batch_stamps(data: bytes, count: int) -> list[Stamp | None]:
    """The stamps in an MPUB_EXT's headers, in order (None for each of a plain MPUB)."""
    if not data.startswith(b"MPUB_EXT"):
        return [None] * count
    stamps = [parse_stamp(header) for header in _STAMPED.findall(data)]
    assert len(stamps) == count
    return stamps


def _stamp_of(data: bytes) -> Stamp | None:
    """The stamp in a PUB_EXT's header (None for a plain PUB)."""
    if not data.startswith(b"PUB_EXT"):
        return None
    start = data.index(b"\n") + 1 + 4
    length = int.from_bytes(data[start : start + 2], "big")
    header = data[start + 2 : start + 2 + length]
    json.loads(header)  # it is JSON
    return parse_stamp(header)
