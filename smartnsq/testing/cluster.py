"""The embedded NSQ cluster: youzan HA (lookupds, nsqd nodes, partitions, replicas, leaders)
or classic (nsqd + nsqlookupd), serving real TCP and HTTP on 127.0.0.1.

It is an emulator for tests, demos and local development, not a production broker: data
lives in memory, replication is a log shared in-process, and leadership changes happen when
you call the fault-injection methods (or after ``failover_delay`` when a node stops).

:class:`Cluster` owns the servers (:mod:`~smartnsq.testing.nsqd` with its HTTP API,
:mod:`~smartnsq.testing.lookupd`) and the floor they stand on: the
:mod:`~smartnsq.testing.directory` of servers, the :mod:`~smartnsq.testing.topology` and
:mod:`~smartnsq.testing.changes`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, overload

from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import MAX_BODY_SIZE, MAX_MSG_SIZE
from smartnsq.testing.changes import Changes
from smartnsq.testing.checks import TopicChecks
from smartnsq.testing.directory import Directory
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.http import ApiError, HttpServer
from smartnsq.testing.lookupd import LookupdNode
from smartnsq.testing.nsqd import NodeSettings, NsqdNode
from smartnsq.testing.nsqd_http import NsqdHttpApi
from smartnsq.testing.state import Channel, ChannelRecord, Partition, PartitionLog, Record, Topic
from smartnsq.testing.topology import TopicExists, TopicRefused, Topology

__all__ = ["Cluster", "ClusterError"]

log = logging.getLogger("smartnsq.testing")


T = TypeVar("T")


class _Forwarded(Generic[T]):
    """An attribute of the cluster that is one of its parts' (the directory's or the
    topology's), of the same name: read there, and written there when ``writable``. A unit
    test (test_forwarding) holds each to its part, so a rename cannot leave it behind."""

    def __init__(self, part: str, doc: str, *, writable: bool = False) -> None:
        self.part = part
        self.writable = writable
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, cluster: None, owner: type) -> _Forwarded[T]: ...

    @overload
    def __get__(self, cluster: Cluster, owner: type) -> T: ...

    def __get__(self, cluster: Cluster | None, owner: type) -> T | _Forwarded[T]:
        if cluster is None:
            return self
        value: T = getattr(getattr(cluster, self.part), self.name)
        return value

    def __set__(self, cluster: Cluster, value: T) -> None:
        if not self.writable:
            raise AttributeError(f"Cluster.{self.name} cannot be set")
        setattr(getattr(cluster, self.part), self.name, value)


class Cluster:
    """An in-process NSQ cluster on 127.0.0.1 with OS-chosen ports.

    ``Cluster(nodes=3)`` emulates a youzan HA cluster (nodes are numbered from 0; 3 by
    default); ``Cluster(classic=True)`` a classic nsqd (1 by default) with a classic
    nsqlookupd.

    Addresses: everything listens on ``host`` (``"0.0.0.0"`` for every interface, e.g. in a
    container). ``lookupd_port`` fixes the HTTP port of nsqlookupd 0 (lookupd ``i`` gets
    ``lookupd_port + i``) and ``nsqd_port`` the TCP port of nsqd 0 (nsqd ``i``: TCP
    ``nsqd_port + 2i``, HTTP the port after; by default right after the lookupd ports when
    ``lookupd_port`` is given, else chosen by the OS). ``broadcast_address`` is what the
    nsqlookupds announce for every nsqd and for themselves (``/listlookup``), like nsqd's
    ``--broadcast-address``: by default the address clients on this machine use.
    ``lookupd_url`` and ``nsqd_addresses`` are always the local ones.

    Topics: :meth:`create_topic` makes a topic that takes writes at once. One created through
    nsqlookupd's ``/topic/create`` (``smartnsq.admin.Admin``, ``smartnsq topic create``)
    takes writes after nsqlookupd's next topic check, with the real timing by default: one
    runs as the cluster starts, then every ``topic_check_interval`` seconds, and a post of
    ``/topic/create`` asks for one ``topic_check_delay`` later, dropped within a tenth of the
    interval of the last (:mod:`~smartnsq.testing.checks`). Tests that create many topics
    through nsqlookupd may shorten the interval.
    """

    def __init__(
        self,
        nodes: int | None = None,
        *,
        classic: bool = False,
        lookupds: int = 1,
        failover_delay: float = 0.0,
        allow_write_with_no_channels: bool = False,
        msg_timeout: float = 60.0,
        heartbeat_interval: float = 30.0,
        max_msg_size: int = MAX_MSG_SIZE,
        max_body_size: int = MAX_BODY_SIZE,
        tls_context: ssl.SSLContext | None = None,
        tls_required: bool = False,
        auth_secrets: dict[str, str] | None = None,
        allow_ext_compatible: bool = False,
        record_deliveries: bool = True,
        host: str = "127.0.0.1",
        sweep_interval: float = 0.02,
        broadcast_address: str | None = None,
        lookupd_port: int = 0,
        nsqd_port: int = 0,
        topic_check_interval: float = 60.0,
        topic_check_delay: float = 0.9,
    ) -> None:
        if nodes is None:
            nodes = 1 if classic else 3
        if nodes < 1:
            raise ValidationError("nodes", "must be >= 1")
        if lookupds < 1:
            raise ValidationError("lookupds", "must be >= 1")
        if classic and lookupds != 1:
            raise ValidationError("lookupds", "a classic cluster has exactly one nsqlookupd")
        if not topic_check_interval > 0:
            raise ValidationError("topic_check_interval", "must be > 0 seconds")
        if not topic_check_delay >= 0:
            raise ValidationError("topic_check_delay", "must be >= 0 seconds")
        self._directory = Directory(
            nodes=nodes,
            lookupds=lookupds,
            host=host,
            broadcast_address=broadcast_address,
            lookupd_port=lookupd_port,
            nsqd_port=nsqd_port,
            allow_write_with_no_channels=allow_write_with_no_channels,
        )
        self._changes = Changes()
        self._topology = Topology(
            self._directory,
            self._changes,
            classic=classic,
            failover_delay=failover_delay,
            record_deliveries=record_deliveries,
            detach_consumers=self._detach_consumers,
        )
        self.sweep_interval = sweep_interval
        self.settings = NodeSettings(
            youzan=not classic,
            max_msg_size=max_msg_size,
            max_body_size=max_body_size,
            msg_timeout=msg_timeout,
            heartbeat_interval=heartbeat_interval,
            max_req_timeout=3600.0 if classic else 3 * 24 * 3600.0,
            tls_context=tls_context,
            tls_required=tls_required,
            auth_secrets=dict(auth_secrets or {}),
            allow_ext_compatible=allow_ext_compatible,
        )
        self.nodes = [
            NsqdNode(i, self.settings, self._directory, self._topology, self._changes, self.track)
            for i in range(nodes)
        ]
        self._node_http = [
            HttpServer(NsqdHttpApi(node).handle, host, self.planned_port(node.index, "http"))
            for node in self.nodes
        ]
        self._checks = TopicChecks(
            interval=topic_check_interval,
            delay=topic_check_delay,
            run_check=self._topology.run_topic_check,
            changed=self._changes.changed,
        )
        self.lookupds = [
            LookupdNode(i, self._directory, self._topology, self._checks) for i in range(lookupds)
        ]
        self._tasks: dict[asyncio.Task[Any], None] = {}  # in the order they started
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False

    def planned_port(self, index: int, kind: str) -> int:
        """The fixed port of lookupd ``index`` (kind "lookupd") or of nsqd ``index`` ("tcp",
        "http"); 0 (the OS chooses) without ``lookupd_port``/``nsqd_port``."""
        return self._directory.planned_port(index, kind)

    # ------------------------------------------------------------------ settings and state

    # Attributes of the cluster's parts, of the same names (see _Forwarded).
    classic = _Forwarded[bool]("_topology", "A classic nsqd cluster (else youzan HA).")
    host = _Forwarded[str]("_directory", "Where every server listens.")
    local_host = _Forwarded[str](
        "_directory", "Where clients on this machine connect: ``host``, or loopback for a wildcard."
    )
    broadcast_address = _Forwarded[str](
        "_directory", "What the nsqlookupds announce for every nsqd and for themselves."
    )
    hostname = _Forwarded[str]("_directory", "The machine's name, as nsqd's ``/info`` reports it.")
    registrations = _Forwarded[int](
        "_directory",
        "How many times an nsqd registered with the nsqlookupds (each start counts).",
    )
    failover_delay = _Forwarded[float](
        "_topology",
        "Seconds before a live replica takes over the partitions of a stopped leader.",
        writable=True,
    )
    allow_write_with_no_channels = _Forwarded[bool](
        "_directory", "Write lookups also name partitions without channels.", writable=True
    )
    write_disabled = _Forwarded[str](
        "_directory",
        'nsqlookupd\'s ``/disable/write`` state: "all", "ordered" or "" (see '
        ":meth:`disable_write`).",
        writable=True,
    )
    record_deliveries = _Forwarded[bool](
        "_topology",
        "Channels created from now on keep a :class:`ChannelRecord`.",
        writable=True,
    )
    topics = _Forwarded[dict[str, Topic]]("_topology", "Every youzan topic, by name.")

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Cluster:
        """Start every nsqlookupd and nsqd (what ``async with Cluster(...)`` does)."""
        if self._started:
            raise ClusterError("cluster already started")
        self._started = True
        loop = self._loop = asyncio.get_running_loop()
        self._changes.start()
        self._topology.start(loop)
        for lookupd in self.lookupds:
            await lookupd.start()
        for index in range(len(self.nodes)):
            await self._start_node_servers(index)
        if not self.classic:
            self._checks.start(loop)  # the nodes joined: nsqlookupd's first topic check
        self._sweeper = loop.create_task(self._sweep_loop())
        log.info("cluster started: lookupd %s, nsqd %s", self.lookupd_urls, self.nsqd_addresses)
        return self

    async def _start_node_servers(self, index: int) -> None:
        """A node's TCP and HTTP servers (the same ports again on a restart)."""
        node, http = self.nodes[index], self._node_http[index]
        await node.start()
        await http.start()
        self._directory.nsqds[index].http_port = http.port

    async def stop(self) -> None:
        """Stop every server and task; safe to call twice."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        self._topology.stop()
        self._checks.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for node, http in zip(self.nodes, self._node_http, strict=True):
            await node.stop()
            await http.stop()
        for lookupd in self.lookupds:
            await lookupd.stop()
            lookupd.release()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        # let transports finish closing
        await asyncio.sleep(0)

    async def __aenter__(self) -> Cluster:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @overload
    def call_from_thread(self, work: Coroutine[Any, Any, T], *, timeout: float = ...) -> T: ...

    @overload
    def call_from_thread(self, work: Callable[[], T], *, timeout: float = ...) -> T: ...

    def call_from_thread(
        self, work: Coroutine[Any, Any, T] | Callable[[], T], *, timeout: float = 30.0
    ) -> T:
        """Run ``work`` on the cluster's event loop from another thread and return its
        result: a coroutine (``cluster.call_from_thread(cluster.create_topic("orders", 2,
        1))``) or a function of no argument (``lambda: cluster.messages("orders")``). How
        blocking code calls a cluster whose loop runs in a thread of its own, as the
        ``nsq_cluster`` fixture's does for a plain ``def test_...``. Within ``timeout``
        seconds (TimeoutError, and ``work`` is cancelled); ClusterError when the cluster is
        not running, and on the cluster's own loop, where ``await`` (or a plain call) is the
        way: waiting there would block the loop for ever."""
        loop = self._loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        on_loop = loop is not None and running is loop
        if loop is None or self._stopped or on_loop:
            if inspect.iscoroutine(work):
                work.close()  # never to run: no "never awaited" warning
            if on_loop:
                raise ClusterError(
                    "call_from_thread was called on the cluster's own event loop, which it "
                    "would block for ever: call the method there directly (await it if it is "
                    "async)"
                )
            raise ClusterError("the cluster is not running (start it first)")

        async def run() -> T:
            if not callable(work):
                return await work
            result = work()
            if inspect.isawaitable(result):
                return cast(T, await result)
            return result

        future = asyncio.run_coroutine_threadsafe(run(), loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background task of the emulator referenced until done; cancelled by stop()."""
        self._tasks[task] = None
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            now = time.monotonic()
            for channel in self._topology.all_channels():
                channel.sweep(now)

    def _detach_consumers(self, node: int, log_: PartitionLog) -> None:
        """The topology's request: ``node`` no longer serves ``log_``."""
        self.nodes[node].detach_consumers(log_)

    # ------------------------------------------------------------------ addresses

    @property
    def lookupd_url(self) -> str:
        """HTTP URL of the (leader) nsqlookupd, e.g. ``http://127.0.0.1:4161``."""
        leader = self.lookupd_leader() or self.lookupds[0]
        return leader.url

    @property
    def lookupd_urls(self) -> list[str]:
        """HTTP URL of every nsqlookupd, by index."""
        return [lk.url for lk in self.lookupds]

    @property
    def nsqd_addresses(self) -> list[str]:
        """TCP ``host:port`` of every nsqd, indexed by node number."""
        return [node.tcp_address for node in self.nodes]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        """HTTP ``host:port`` of every nsqd, indexed by node number."""
        return [node.http_address for node in self.nodes]

    def lookupd_leader(self) -> LookupdNode | None:
        """The nsqlookupd that leads (the first running one), or None when all are stopped."""
        leader = self._directory.lookupd_leader()
        return self.lookupds[leader.index] if leader is not None else None

    # ------------------------------------------------------------------ change notification

    def changed(self) -> None:
        """Something observable changed (messages, deliveries, topology): wake waiters."""
        self._changes.changed()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` is true, re-checking on every cluster change.

        Raises ``TimeoutError`` (``asyncio.TimeoutError``) if it does not become true in time.
        """
        await self._changes.wait_for(predicate, timeout)

    # ------------------------------------------------------------------ topology

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        ordered: bool = False,
        ext: bool = False,
        *,
        channels: Sequence[str] = (),
        disable_channel_auto_create: bool | None = None,
        multi_part: bool = False,
        placement: Mapping[int, Sequence[int]] | None = None,
    ) -> Topic:
        """Create a youzan topic, as ``smartnsq.admin.Admin.create_topic`` does through the
        nsqlookupd leader (``/topic/create``, then ``/channel/create`` for each channel).

        ``channels`` are registered: durable, on every replica, and producers can publish at
        once (a write lookup refuses topics without channels). Registering needs
        ``disable_channel_auto_create``, True by default when channels are given: consumers
        may then subscribe to registered channels only. Without channels, a consumer's SUB
        creates its channel, at the topic's end and on the partition leader only.
        ``placement`` maps partition -> nodes holding it, leader first. By default they are
        placed as nsqlookupd places them (:mod:`~smartnsq.testing.placement`): a plain
        topic's partitions on nodes of their own, led by the least loaded live nodes (so
        leadership spreads as topics are created); an ordered or multi-part one, or a plain
        one bigger than the cluster (which a real nsqlookupd refuses; this API allows it for
        small test clusters), round the live nodes from a start its name's hash picks.
        A topic that exists is returned when it has these settings; with others,
        ClusterError says both.
        """
        topic = self.create_topic_now(
            name,
            partitions=partitions,
            replicas=replicas,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            channels=channels,
            disable_channel_auto_create=disable_channel_auto_create,
            placement=placement,
        )
        await asyncio.sleep(0)
        return topic

    def create_topic_now(
        self,
        name: str,
        *,
        partitions: int = 1,
        replicas: int = 1,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
        channels: Sequence[str] = (),
        disable_channel_auto_create: bool | None = None,
        strict_placement: bool = False,
        placement: Mapping[int, Sequence[int]] | None = None,
    ) -> Topic:
        """:meth:`create_topic` without awaiting (and what nsqlookupd ``/topic/create``
        runs: with ``strict_placement``, partitions x replicas may not exceed the live
        nodes unless several partitions may share a node, as the real lookupd checks).
        A topic that exists with other settings raises ClusterError saying both (nsqlookupd
        answers that "No node is available for topic"); what else nsqlookupd refuses raises
        its answer, an ``ApiError`` (400)."""
        try:
            return self._topology.create_topic(
                name,
                partitions=partitions,
                replicas=replicas,
                ordered=ordered,
                ext=ext,
                multi_part=multi_part,
                channels=channels,
                disable_channel_auto_create=disable_channel_auto_create,
                strict_placement=strict_placement,
                placement=placement,
            )
        except TopicExists as exc:
            raise ClusterError(
                f"topic {name!r} exists with other settings ({exc.existing}); asked for "
                f"{exc.wanted}"
            ) from None
        except TopicRefused as exc:
            raise ApiError(400, str(exc)) from None

    async def create_channel(self, topic: str, channel: str) -> None:
        """Register a channel of ``topic``, as ``smartnsq.admin.Admin.create_channel`` does
        through the nsqlookupd leader: it exists on every replica of every partition, so it
        survives a leader failover. youzan registers channels only on topics created with
        ``disable_channel_auto_create``."""
        self.register_channel_now(topic, channel)
        await asyncio.sleep(0)

    def register_channel_now(self, topic_name: str, channel_name: str) -> None:
        """:meth:`create_channel` without awaiting (nsqlookupd ``/channel/create`` runs it)."""
        self._topology.register_channel(topic_name, channel_name)

    async def create_channel_on_leaders(self, topic: str, channel: str) -> None:
        """Create a channel the way a consumer's SUB (or nsqd's HTTP ``/channel/create`` on
        each partition leader) does, on a topic that lets SUB create channels: it starts at
        the topic's end, on each partition's leader only, and reaches the replicas once a
        consumer finishes a message; a leader failover before that loses it."""
        self._topology.create_channel_on_leaders(topic, channel)
        await asyncio.sleep(0)

    def ensure_channel(self, log_: PartitionLog, name: str) -> Channel:
        """The live channel ``name`` of a log, created if needed: what a SUB (or nsqd's HTTP
        ``/channel/create``) does. youzan starts a new channel at the queue's end, on the
        partition leader only; classic nsqd hands the topic's backlog to its first channel."""
        return self._topology.ensure_channel(log_, name)

    def client_left(self, channel: Channel) -> None:
        """A client left ``channel``: an ephemeral channel without clients is deleted."""
        self._topology.client_left(channel)

    def classic_topic(self, node: NsqdNode, name: str) -> PartitionLog:
        """A classic nsqd's topic, created on first use (as PUB or SUB do)."""
        return self._topology.classic_topic(node.index, name)

    def delete_classic_topic(self, node: NsqdNode, name: str) -> None:
        """Classic nsqd ``/topic/delete``: its consumers are disconnected, the topic's
        channels and messages are gone."""
        self._topology.delete_classic_topic(node.index, name)

    def partition_of(self, log_: PartitionLog) -> Partition | None:
        """The youzan partition a log belongs to (None for a classic topic)."""
        return self._topology.partition_of(log_)

    def topology(self, topic: str) -> dict[int, dict[str, Any]]:
        """partition -> leader, replicas and writability, for tests and the CLI."""
        return self._topology.layout(topic)

    def leader(self, topic: str, partition: int) -> int | None:
        """The node number leading ``partition`` (None while it has no leader)."""
        return self._topology.partition(topic, partition).leader

    def is_stable(self) -> bool:
        """Every partition has a live leader taking writes and no failover is pending."""
        return self._topology.is_stable()

    # ------------------------------------------------------------------ fault injection

    async def move_leader(self, topic: str, partition: int, to_node: int) -> None:
        """Move a partition's leadership to ``to_node`` (added as a replica if it is not one).
        The old leader keeps the partition as a replica: its producer connections stay open
        and answer E_FAILED_ON_NOT_LEADER; its consumer connections are closed; unfinished
        messages are redelivered by the new leader (same id, attempts from 1). Moving to the
        current leader does nothing. Same implementation as nsqlookupd
        ``/topic/partition/move?move_leader=true``."""
        self.move_leader_now(topic, partition, to_node)
        await asyncio.sleep(0)

    def move_leader_now(self, topic: str, partition: int, to_node: int) -> None:
        """:meth:`move_leader` without awaiting."""
        self._topology.move_leader(topic, partition, to_node)

    def move_partition_now(
        self,
        topic: str,
        partition: int,
        *,
        move_leader: bool,
        from_node: int | None = None,
        to_node: int | None = None,
    ) -> int:
        """nsqlookupd ``/topic/partition/move``: move the leadership (``move_leader``) or a
        replica's data from ``from_node`` to ``to_node``, checked like the real lookupd (its
        error strings). Returns the destination node.

        ``from_node`` defaults to the leader when moving the leadership; ``to_node`` to the
        next live replica after the leader (else a live node not holding the partition).
        Node numbers that are not live nodes count as unknown to the cluster."""
        return self._topology.move_partition(
            topic, partition, move_leader=move_leader, from_node=from_node, to_node=to_node
        )

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and all its partitions (nsqlookupd ``/topic/delete?partition=**``).
        Consumers are disconnected; later publishes get E_TOPIC_NOT_EXIST."""
        self.delete_topic_now(name)
        await asyncio.sleep(0)

    def delete_topic_now(self, name: str) -> None:
        """:meth:`delete_topic` without awaiting."""
        self._topology.delete_topic(name)

    async def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Make a partition refuse writes (E_FAILED_ON_NOT_WRITABLE) or take them again."""
        self._topology.set_writable(topic, partition, writable)
        await asyncio.sleep(0)

    def set_ordered_echo_late(self, topic: str, channel: str, late: bool = True) -> None:
        """youzan sends a channel's first ordered message twice (its first ``SUB_ORDERED``,
        while a message waits). With this fault, as real youzan sometimes does, the second
        copy is put in flight only once the client's first answer to that id (FIN, REQ or
        TOUCH) has arrived: that answer fails, non-fatal, as not in flight
        (``E_FIN_FAILED FIN [...] failed ErrType:7 ErrCode:0 : Message ID not in flight``),
        and the message is in flight from then on, holding the ordered partition until it
        is answered again or its msg_timeout passes. Applies to ``channel`` of every
        partition of ``topic`` that turns ordered from now on; ``late=False`` ends it."""
        self._topology.set_ordered_echo_late(topic, channel, late)

    async def stop_node(self, index: int) -> None:
        """Stop a node like a crash. Partitions it led fail over to a live replica after
        ``failover_delay`` seconds (writable only with a majority of replicas alive)."""
        node = self._node(index)
        if not node.running:
            return
        self._topology.node_stopping(index)
        await node.stop()
        await self._node_http[index].stop()
        self._topology.node_stopped(index)

    async def start_node(self, index: int) -> None:
        """Restart a stopped node on the same ports. It rejoins its partitions as a replica
        (and leads those that had no live replica)."""
        node = self._node(index)
        if node.running:
            return
        await self._start_node_servers(index)
        self._topology.node_started(index)

    async def drop_connections(
        self, index: int, *, producers: bool = True, consumers: bool = True
    ) -> int:
        """Reset a node's client connections (the node stays up). Returns how many."""
        dropped = self._node(index).drop_sessions(producers=producers, consumers=consumers)
        await asyncio.sleep(0)
        return dropped

    def suspend_heartbeats(self, index: int) -> None:
        """The node stops sending heartbeats (clients should notice and reconnect)."""
        self._node(index).heartbeats_enabled = False

    def resume_heartbeats(self, index: int) -> None:
        """The node sends heartbeats again (see :meth:`suspend_heartbeats`)."""
        self._node(index).heartbeats_enabled = True

    def set_latency(self, index: int, seconds: float) -> None:
        """Delay everything the node writes to its clients by ``seconds``."""
        if seconds < 0:
            raise ValidationError("seconds", "must be >= 0")
        self._node(index).latency = seconds

    def blackhole(self, index: int) -> None:
        """Node ``index`` drops off the network, silently, as in a partition: its TCP and
        HTTP servers stop answering. Open connections go silent (no FIN, no RST, no
        heartbeats; what the clients send waits unread, what the node writes is held), new
        connections are accepted and never answered. A session whose read deadline (its
        heartbeat interval x 3 on youzan, x 2 on classic) passes meanwhile leaves its
        channel, as nsqd closes it, and is closed on :meth:`heal`. The topology does not
        change: the lookupds keep announcing the node and no failover starts (use
        :meth:`stop_node` for that). Lasts across a restart of the node."""
        self._node(index).blackhole()
        self._node_http[self._node(index).index].blackhole()

    def heal(self, index: int) -> None:
        """Node ``index`` is reachable again (see :meth:`blackhole`): what waited is read,
        what was held is delivered, sessions nsqd gave up on are closed."""
        self._node(index).heal()
        self._node_http[self._node(index).index].heal()

    def blackhole_lookupd(self, index: int) -> None:
        """nsqlookupd ``index`` stops answering, silently (as :meth:`blackhole` does to a
        node's HTTP server) until :meth:`heal_lookupd`."""
        self._lookupd(index).http.blackhole()

    def heal_lookupd(self, index: int) -> None:
        """nsqlookupd ``index`` answers again; held answers are delivered."""
        self._lookupd(index).http.heal()

    async def stop_lookupd(self, index: int) -> None:
        """Stop an nsqlookupd (its port stays reserved for a restart)."""
        await self._lookupd(index).stop()

    async def start_lookupd(self, index: int) -> None:
        """Start a stopped nsqlookupd again, on the same port."""
        await self._lookupd(index).start()

    def freeze_lookupd(self, index: int, topics: Sequence[str]) -> None:
        """Make a lookupd keep answering lookups of ``topics`` as they are now (stale)."""
        self._lookupd(index).snapshot(list(topics))

    def thaw_lookupd(self, index: int) -> None:
        """The lookupd answers from the live state again (see :meth:`freeze_lookupd`)."""
        self._lookupd(index).frozen = None

    async def disable_write(self, kind: str = "all") -> None:
        """nsqlookupd ``/disable/write``: "all", "ordered", or "" to re-enable."""
        self.write_disabled = kind if kind in ("all", "ordered") else ""
        await asyncio.sleep(0)

    def _node(self, index: int) -> NsqdNode:
        return self.nodes[self._directory.nsqd(index).index]

    def _lookupd(self, index: int) -> LookupdNode:
        """nsqlookupd ``index``; ClusterError if the cluster has no such lookupd (a negative
        index too, which a list would take from the end)."""
        if type(index) is not int or not 0 <= index < len(self.lookupds):
            raise ClusterError(
                f"no nsqlookupd {index!r} (lookupds are 0..{len(self.lookupds) - 1})"
            )
        return self.lookupds[index]

    # ------------------------------------------------------------------ introspection

    def messages(self, topic: str, partition: int | None = None) -> list[Record]:
        """Every message accepted for the topic (or one partition), in log order."""
        return [r for log_ in self._topology.logs(topic, partition) for r in log_.records]

    def depth(self, topic: str, channel: str | None = None, partition: int | None = None) -> int:
        """Messages not yet delivered: of a channel, or of the topic's logs."""
        if channel is None:
            return sum(len(log_.records) for log_ in self._topology.logs(topic, partition))
        return sum(c.depth for c in self._topology.channels(topic, channel, partition))

    def in_flight(self, topic: str, channel: str, partition: int | None = None) -> int:
        """Messages of the channel (or of one partition of it) delivered and not answered yet."""
        return sum(len(c.in_flight) for c in self._topology.channels(topic, channel, partition))

    def subscriber_rdy(self, topic: str, channel: str, partition: int | None = None) -> list[int]:
        """The RDY count of each client subscribed to the channel (or to one partition of
        it): [] when nobody listens, all zeros when every subscriber is paused."""
        channels = self._topology.channels(topic, channel, partition)
        return [client.rdy for c in channels for client in c.clients]

    def channel_record(self, topic: str, channel: str) -> ChannelRecord:
        """Deliveries, FINs, requeues and timeouts of a channel (all partitions)."""
        return self._topology.channel_record(topic, channel)

    def unfinished(self, topic: str, channel: str) -> int:
        """Messages of the channel not finished yet (waiting, deferred or in flight)."""
        return sum(c.depth + len(c.in_flight) for c in self._topology.channels(topic, channel))

    def clients(self, index: int) -> int:
        """How many client connections a node has (producers and consumers)."""
        return len(self._node(index).sessions)
