"""Where a publish goes (pure, no I/O): an explicit partition, a sharding key's partition, or
round-robin over the writable partitions; on classic nsqd, one of the nsqd nodes.

Given a topic's layout (or, in direct mode, the nsqd addresses), a sharder and the
round-robin counters, :class:`Router` returns a :class:`Route`: the address, the partition and
the key of the pooled connection to publish on. It decides and stores nothing about a publish:
what the tries so far mean for the next (the partitions that failed, the partition a keyed
publish is pinned to) comes in as arguments. What a server cannot take is the codec's to
refuse (:mod:`smartnsq.publishing.wire`), once it is known where a publish goes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from smartnsq.errors import NoWritablePartitionError, NSQError, ValidationError
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.publishing.request import NO_KEY, PublishRequest
from smartnsq.routing.sharding import Sharder

__all__ = ["ANY_TOPIC", "Route", "RouteTable", "Router", "classic_routes"]

# Classic connections carry every topic; youzan ones are per (topic, partition).
ANY_TOPIC = "*"


@dataclass(frozen=True, slots=True)
class Route:
    """Where one attempt goes: the nsqd, the partition (None on classic), whether it is a
    youzan nsqd and the topic an ext topic, and the topic the pooled connection is kept
    under (:data:`ANY_TOPIC` on classic). ``key``: the pooled connection's key, (address,
    pool topic, partition), made once."""

    address: str
    partition: int | None
    youzan: bool
    ext_topic: bool
    pool_topic: str
    key: tuple[str, str, int | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.address, self.pool_topic, self.partition))


def classic_routes(addresses: Iterable[str]) -> list[Route]:
    return [Route(address, None, False, False, ANY_TOPIC) for address in addresses]


class RouteTable:
    """The routes of one (immutable) layout, computed once."""

    __slots__ = (
        "by_partition",
        "classic",
        "classic_routes",
        "ext_topic",
        "layout",
        "partition_num",
        "unkeyed",
    )

    def __init__(self, layout: TopicLayout, topic: str) -> None:
        self.layout = layout
        self.classic = layout.is_classic
        self.classic_routes = classic_routes(node.tcp_address for node in layout.classic_nodes)
        self.ext_topic = layout.extend_support
        self.partition_num = layout.partition_num
        self.by_partition = {
            partition: Route(leader.tcp_address, partition, True, self.ext_topic, topic)
            for partition, leader in layout.partitions.items()
        }
        self.unkeyed = list(self.by_partition.values())


def _random_start() -> int:
    # A random start spreads many producers' first messages over the partitions.
    return random.randrange(1 << 16)


class Router:
    """The routing decisions of one producer: its sharder, a round-robin counter per topic
    and the route tables of the layouts it has seen. ``nsqd`` are the addresses of direct
    mode (``Producer(nsqd=...)``); ``start`` gives each topic's first round-robin turn."""

    __slots__ = ("_counters", "_start", "_tables", "direct_routes", "sharder")

    def __init__(
        self,
        sharder: Sharder,
        nsqd: Iterable[str] = (),
        *,
        start: Callable[[], int] = _random_start,
    ) -> None:
        self.sharder = sharder
        self.direct_routes = classic_routes(nsqd)
        self._start = start
        self._counters: dict[str, itertools.count[int]] = {}
        self._tables: dict[str, RouteTable] = {}

    def table(self, topic: str, layout: TopicLayout) -> RouteTable:
        table = self._tables.get(topic)
        if table is None or table.layout is not layout:
            # A layout is immutable: its routes are computed once, not per publish.
            table = self._tables[topic] = RouteTable(layout, topic)
        return table

    def route(
        self,
        request: PublishRequest,
        layout: TopicLayout,
        avoid: AbstractSet[int] = frozenset(),
        pinned: int | None = None,
    ) -> Route:
        """The route of ``request`` in ``layout`` (fetched for writing). An unkeyed publish
        goes round-robin over the writable partitions, skipping those in ``avoid`` (they
        failed it) while another is writable; a keyed or explicit-partition one goes to the
        partition it is ``pinned`` to (see :meth:`pin`; computed here when None)."""
        table = self._tables.get(request.topic)
        if table is None or table.layout is not layout:
            table = self._tables[request.topic] = RouteTable(layout, request.topic)
        if table.classic:
            return self.route_classic(request, table.classic_routes)
        return self._route_youzan(request, table, avoid, pinned)

    def route_movable(self, request: PublishRequest, layout: TopicLayout) -> Route:
        """:meth:`route` of a publish neither a partition nor a key binds, on its first
        try (nothing to avoid): the hot path, without the branches of the others. What has
        nowhere to go raises :class:`NoWritablePartitionError`."""
        topic = request.topic
        table = self._tables.get(topic)
        if table is None or table.layout is not layout:
            table = self._tables[topic] = RouteTable(layout, topic)
        if table.classic:
            return self.route_classic(request, table.classic_routes)
        unkeyed = table.unkeyed
        if not unkeyed:
            raise NoWritablePartitionError(f"topic {topic!r} has no writable partition")
        counter = self._counters.get(topic)
        if counter is None:
            counter = self._counter(topic)
        return unkeyed[next(counter) % len(unkeyed)]

    def route_classic(self, request: PublishRequest, routes: Sequence[Route]) -> Route:
        """One of the classic nsqd ``routes``: the batch's own, the key's, or round-robin."""
        if not routes:
            raise NoWritablePartitionError(f"no nsqd publishes topic {request.topic!r} yet")
        if request.address is not None:
            return Route(request.address, request.partition, False, False, ANY_TOPIC)
        if request.key is not NO_KEY:
            index = self.sharder.partition_for(request.key, len(routes))
        else:
            counter = self._counters.get(request.topic)
            if counter is None:
                counter = self._counter(request.topic)
            index = next(counter) % len(routes)
        route = routes[index]
        if request.partition is not None:  # refused by the codec, with the nsqd's address
            return Route(route.address, request.partition, False, False, ANY_TOPIC)
        return route

    def _route_youzan(
        self,
        request: PublishRequest,
        table: RouteTable,
        avoid: AbstractSet[int],
        pinned: int | None,
    ) -> Route:
        unkeyed = table.unkeyed
        if request.partition is None and request.key is NO_KEY:
            if avoid:
                unkeyed = [r for r in unkeyed if r.partition not in avoid] or unkeyed
            if not unkeyed:
                raise NoWritablePartitionError(f"topic {request.topic!r} has no writable partition")
            return unkeyed[next(self._counter(request.topic)) % len(unkeyed)]
        partition = self._pin(request, table) if pinned is None else pinned
        route = table.by_partition.get(partition)
        if route is None:
            raise NoWritablePartitionError(
                f"partition {partition} of {request.topic!r} has no writable leader now"
            )
        return route

    def pin(self, request: PublishRequest, layout: TopicLayout) -> int | None:
        """The partition a keyed or explicit-partition publish is bound to for all its tries,
        fixed at its first routing (it needs the partition count only, not a writable leader);
        None for an unkeyed publish and on classic nsqd, where nothing is pinned."""
        if request.movable:
            return None
        table = self.table(request.topic, layout)
        return None if table.classic else self._pin(request, table)

    def _pin(self, request: PublishRequest, table: RouteTable) -> int:
        partition_num = table.partition_num
        if request.partition is not None:
            if partition_num and request.partition >= partition_num:
                raise ValidationError(
                    "partition",
                    f"topic {request.topic!r} has {partition_num} partitions, "
                    f"got {request.partition}",
                )
            return request.partition
        if partition_num <= 0:
            raise NoWritablePartitionError(f"topic {request.topic!r}: partition count unknown")
        return self.sharder.partition_for(request.key, partition_num)

    def target(self, request: PublishRequest, layout: TopicLayout | None) -> int | str:
        """Where a keyed or explicit-partition publish goes, known without a writable leader:
        its partition (youzan) or its nsqd (classic; ``layout`` None in direct mode). The
        producer's batches are grouped by it."""
        if layout is None:
            return self.route_classic(request, self.direct_routes).address
        table = self.table(request.topic, layout)
        if table.classic:
            return self.route_classic(request, table.classic_routes).address
        return self._pin(request, table)

    def routable(
        self, request: PublishRequest, layout: TopicLayout | None, pinned: int | None = None
    ) -> bool:
        """Whether ``layout`` has somewhere for ``request`` to go now: a writable leader of its
        partition (keyed or explicit; ``pinned`` as for :meth:`route`), any writable partition
        (unkeyed), any nsqd (classic). A publish that routing refuses for another reason (bad
        input) counts as routable: its next try raises that. No round-robin turn is taken."""
        if layout is None:
            return bool(self.direct_routes)
        table = self.table(request.topic, layout)
        if table.classic:
            return bool(table.classic_routes)
        if request.partition is None and request.key is NO_KEY:  # movable (no property call)
            return bool(table.unkeyed)
        try:
            partition = self._pin(request, table) if pinned is None else pinned
        except NoWritablePartitionError:
            return False
        except NSQError:
            return True
        return partition in table.by_partition

    def _counter(self, topic: str) -> itertools.count[int]:
        counter = self._counters.get(topic)
        if counter is None:
            counter = self._counters[topic] = itertools.count(self._start())
        return counter

    def key_targets(
        self, topic: str, keys: Sequence[Any], layout: TopicLayout | None
    ) -> list[int | str]:
        """Where each key publishes, by the rules of :meth:`route`: a partition (youzan) or
        an nsqd address (classic; ``layout`` None in direct mode). Bad keys raise, naming
        their index."""
        routes: Sequence[Route]
        if layout is None:
            routes = self.direct_routes
        else:
            table = self.table(topic, layout)
            if not table.classic:
                count = table.partition_num
                if count <= 0:
                    raise NoWritablePartitionError(f"topic {topic!r}: partition count unknown")
                return list(self.sharder.partitions_for(keys, count))
            routes = table.classic_routes
        if not routes:
            raise NoWritablePartitionError(f"no nsqd publishes topic {topic!r} yet")
        return [routes[i].address for i in self.sharder.partitions_for(keys, len(routes))]
