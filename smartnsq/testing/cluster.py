"""The embedded NSQ cluster: youzan HA (lookupds, nsqd nodes, partitions, replicas, leaders)
or classic (nsqd + nsqlookupd), serving real TCP and HTTP on 127.0.0.1.

It is an emulator for tests, demos and local development, not a production broker: data
lives in memory, replication is a log shared in-process, and leadership changes happen when
you call the fault-injection methods (or after ``failover_delay`` when a node stops).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import MAX_BODY_SIZE, MAX_MSG_SIZE, check_channel, check_topic
from smartnsq.testing.http import HttpServer
from smartnsq.testing.lookupd import LookupdNode
from smartnsq.testing.nsqd import NodeSettings, NsqdNode
from smartnsq.testing.nsqd_http import NsqdHttpApi
from smartnsq.testing.state import (
    Channel,
    ChannelCopy,
    ChannelRecord,
    Partition,
    PartitionLog,
    Record,
    Topic,
)

__all__ = ["Cluster", "ClusterError"]

log = logging.getLogger("smartnsq.testing")


class ClusterError(RuntimeError):
    """A fault-injection or topology request the emulated cluster cannot honour."""


_LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}
_MAX_PORT = 65535


def _check_broadcast(address: str | None, default: str) -> str:
    """nsqd's rule: the address it registers must name a host (not empty, not a wildcard)."""
    if address is None:
        return default
    if not isinstance(address, str) or not address or address in _LOOPBACK:
        raise ValidationError("broadcast_address", f"must name a host, not {address!r}")
    if any(c.isspace() for c in address) or "/" in address:
        raise ValidationError("broadcast_address", f"must name a host, not {address!r}")
    return address


def _port_plan(lookupd_port: int, nsqd_port: int, lookupds: int, nodes: int) -> tuple[int, int]:
    """(first lookupd HTTP port, first nsqd TCP port), 0 when the OS chooses.

    lookupd ``i`` serves HTTP on ``lookupd_port + i``; nsqd ``i`` TCP on ``nsqd_port + 2i`` and
    HTTP on the port after it. ``nsqd_port`` defaults to the port after the last lookupd."""
    for name, value in (("lookupd_port", lookupd_port), ("nsqd_port", nsqd_port)):
        if type(value) is not int or not 0 <= value <= _MAX_PORT:
            raise ValidationError(name, f"must be a port 1..{_MAX_PORT} (0: chosen by the OS)")
    if nsqd_port == 0 and lookupd_port:
        nsqd_port = lookupd_port + lookupds
    lookupd_ports = set(range(lookupd_port, lookupd_port + lookupds)) if lookupd_port else set()
    nsqd_ports = set(range(nsqd_port, nsqd_port + 2 * nodes)) if nsqd_port else set()
    if max(lookupd_ports | nsqd_ports, default=0) > _MAX_PORT:
        raise ValidationError("nsqd_port", f"the ports of {nodes} nodes go past {_MAX_PORT}")
    if lookupd_ports & nsqd_ports:
        raise ValidationError(
            "nsqd_port",
            f"nsqd ports {nsqd_port}..{nsqd_port + 2 * nodes - 1} overlap the nsqlookupd "
            f"ports {lookupd_port}..{lookupd_port + lookupds - 1}",
        )
    return lookupd_port, nsqd_port


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
    ) -> None:
        if nodes is None:
            nodes = 1 if classic else 3
        if nodes < 1:
            raise ValidationError("nodes", "must be >= 1")
        if lookupds < 1:
            raise ValidationError("lookupds", "must be >= 1")
        if classic and lookupds != 1:
            raise ValidationError("lookupds", "a classic cluster has exactly one nsqlookupd")
        self.classic = classic
        self.host = host
        # Where clients on this machine connect: the bind address, or loopback for a wildcard.
        self.local_host = _LOOPBACK.get(host, host)
        self.broadcast_address = _check_broadcast(broadcast_address, self.local_host)
        self._port_plan = _port_plan(lookupd_port, nsqd_port, lookupds, nodes)
        self.failover_delay = failover_delay
        self.allow_write_with_no_channels = allow_write_with_no_channels
        self.record_deliveries = record_deliveries
        self.sweep_interval = sweep_interval
        self.write_disabled = ""
        self.registrations = 0
        self.hostname = socket.gethostname()
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
        self.nodes = [NsqdNode(self, i, self.settings) for i in range(nodes)]
        self._node_http = [
            HttpServer(NsqdHttpApi(node).handle, host, self.planned_port(node.index, "http"))
            for node in self.nodes
        ]
        self.lookupds = [LookupdNode(self, i) for i in range(lookupds)]
        self.topics: dict[str, Topic] = {}
        self._partitions_by_log: dict[int, Partition] = {}
        self._records: dict[tuple[str, str], ChannelRecord] = {}
        # log index each channel started at (classic nsqd counts a channel's messages from it)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failovers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self._changed: asyncio.Event | None = None
        self._waiters = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopped = False

    def planned_port(self, index: int, kind: str) -> int:
        """The fixed port of lookupd ``index`` (kind "lookupd") or of nsqd ``index`` ("tcp",
        "http"); 0 (the OS chooses) without ``lookupd_port``/``nsqd_port``."""
        lookupd_base, nsqd_base = self._port_plan
        if kind == "lookupd":
            return lookupd_base + index if lookupd_base else 0
        if not nsqd_base:
            return 0
        return nsqd_base + 2 * index + (1 if kind == "http" else 0)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Cluster:
        """Start every nsqlookupd and nsqd (what ``async with Cluster(...)`` does)."""
        if self._started:
            raise ClusterError("cluster already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        for lookupd in self.lookupds:
            await lookupd.start()
        for index in range(len(self.nodes)):
            await self._start_node_servers(index)
        self._sweeper = self._loop.create_task(self._sweep_loop())
        log.info("cluster started: lookupd %s, nsqd %s", self.lookupd_urls, self.nsqd_addresses)
        return self

    async def _start_node_servers(self, index: int) -> None:
        """A node's TCP and HTTP servers (the same ports again on a restart)."""
        node, http = self.nodes[index], self._node_http[index]
        await node.start()
        await http.start()
        node.http_port = http.port

    async def stop(self) -> None:
        """Stop every server and task; safe to call twice."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        for handle in self._failovers.values():
            handle.cancel()
        self._failovers.clear()
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

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background task of the emulator referenced until done; cancelled by stop()."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval)
            now = time.monotonic()
            for channel in self._all_channels():
                channel.sweep(now)

    def _all_channels(self) -> Iterable[Channel]:
        for topic in self.topics.values():
            for partition in topic.partitions.values():
                yield from partition.log.channels.values()
        for node in self.nodes:
            for log_ in node.classic_topics.values():
                yield from log_.channels.values()

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
        for lookupd in self.lookupds:
            if lookupd.running:
                return lookupd
        return None

    # ------------------------------------------------------------------ change notification

    def changed(self) -> None:
        """Something observable changed (messages, deliveries, topology): wake waiters."""
        if self._waiters and self._changed is not None:
            self._changed.set()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` is true, re-checking on every cluster change.

        Raises ``TimeoutError`` (``asyncio.TimeoutError``) if it does not become true in time.
        """
        if self._changed is None:
            raise ClusterError("cluster not started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._waiters += 1
        try:
            while not predicate():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise asyncio.TimeoutError(f"condition not met within {timeout} s")
                self._changed.clear()
                try:
                    # Also re-check periodically: timers (timeouts, deferrals) change state too.
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))
                except asyncio.TimeoutError:
                    pass
        finally:
            self._waiters -= 1

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
        ``placement`` maps partition -> nodes holding it, leader first; by default partitions
        are spread round-robin over the live nodes.
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
        nodes unless several partitions may share a node, as the real lookupd checks)."""
        from smartnsq.testing.http import ApiError

        if self.classic:
            raise ClusterError("classic nsqd creates topics on first PUB or SUB")
        check_topic(name)
        if not 1 <= partitions <= 255:
            raise ValidationError("partitions", "must be 1..255")
        if not 1 <= replicas <= 5:
            raise ValidationError("replicas", "must be 1..5")
        names = [check_channel(channel) for channel in channels]
        if disable_channel_auto_create is None:
            disable_channel_auto_create = bool(names)
        elif names and not disable_channel_auto_create:
            raise ValidationError(
                "channels",
                "registered channels need disable_channel_auto_create=True (youzan registers "
                "channels only on topics whose channels SUB cannot create)",
            )
        alive = [n.index for n in self.nodes if n.running]
        existing = self.topics.get(name)
        if existing is not None:
            same = (
                existing.partition_num == partitions
                and existing.replica == replicas
                and existing.ordered == ordered
                and existing.ext == ext
                and existing.disable_channel_auto_create == disable_channel_auto_create
            )
            if not same:
                raise ApiError(400, "ErrType:9 ErrCode:1 : No node is available for topic")
            for channel in names:
                if channel not in existing.registered_channels:
                    self.register_channel_now(name, channel)
            return existing
        if partitions >= 255:
            # the coordinator's own limit, checked after the HTTP arguments
            raise ApiError(400, "max partition allowed exceed")
        # The real cluster refuses more partitions x replicas than nodes unless several
        # partitions may share a node; the Python API is lenient (tests want small clusters).
        too_big = replicas > len(alive) or (
            strict_placement and partitions * replicas > len(alive) and not (ordered or multi_part)
        )
        if too_big:
            if strict_placement:
                raise ApiError(400, "ErrType:9 ErrCode:1 : No node is available for topic")
            raise ClusterError(f"{replicas} replicas need as many live nodes ({len(alive)} alive)")
        topic = Topic(
            name,
            partitions,
            replicas,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
        )
        if placement is not None:
            self._check_placement(placement, partitions, replicas)
        for pid in range(partitions):
            if placement is not None:
                members = list(placement[pid])
            else:
                members = [alive[(pid + k) % len(alive)] for k in range(replicas)]
            log_ = PartitionLog(pid, ext=ext, classic=False, topic_name=name)
            partition = Partition(topic, pid, members, members[0], log_)
            topic.partitions[pid] = partition
            self._partitions_by_log[id(log_)] = partition
        self.topics[name] = topic
        for channel in names:
            self.register_channel_now(name, channel)
        self.changed()
        return topic

    def _check_placement(
        self, placement: Mapping[int, Sequence[int]], partitions: int, replicas: int
    ) -> None:
        if sorted(placement) != list(range(partitions)):
            raise ValidationError("placement", f"must map each partition 0..{partitions - 1}")
        for pid, members in placement.items():
            if len(members) != replicas or len(set(members)) != replicas:
                raise ValidationError(
                    "placement", f"partition {pid} needs {replicas} distinct nodes"
                )
            for member in members:
                self._node(member)

    async def create_channel(self, topic: str, channel: str) -> None:
        """Register a channel of ``topic``, as ``smartnsq.admin.Admin.create_channel`` does
        through the nsqlookupd leader: it exists on every replica of every partition, so it
        survives a leader failover. youzan registers channels only on topics created with
        ``disable_channel_auto_create``."""
        self.register_channel_now(topic, channel)
        await asyncio.sleep(0)

    def register_channel_now(self, topic_name: str, channel_name: str) -> None:
        """:meth:`create_channel` without awaiting (nsqlookupd ``/channel/create`` runs it)."""
        check_channel(channel_name)
        topic = self._topic(topic_name)
        if not topic.disable_channel_auto_create:
            raise ClusterError(f"channel auto create NOT disabled in topic {topic_name}")
        if channel_name in topic.registered_channels:
            raise ClusterError(f"channel {channel_name} already registered")
        topic.registered_channels.append(channel_name)
        for partition in topic.partitions.values():
            self._replicate(self.ensure_channel(partition.log, channel_name))

    async def create_channel_on_leaders(self, topic: str, channel: str) -> None:
        """Create a channel the way a consumer's SUB (or nsqd's HTTP ``/channel/create`` on
        each partition leader) does, on a topic that lets SUB create channels: it starts at
        the topic's end, on each partition's leader only, and reaches the replicas once a
        consumer finishes a message; a leader failover before that loses it."""
        check_channel(channel)
        partitions = self._topic(topic).partitions.values()
        for partition in partitions:
            self.ensure_channel(partition.log, channel)
        await asyncio.sleep(0)

    def ensure_channel(self, log_: PartitionLog, name: str) -> Channel:
        """The live channel ``name`` of a log, created if needed: what a SUB (or nsqd's HTTP
        ``/channel/create``) does. youzan starts a new channel at the queue's end, on the
        partition leader only; classic nsqd hands the topic's backlog to its first channel."""
        channel = log_.channels.get(name)
        if channel is not None:
            return channel
        start = 0 if (log_.classic and not log_.had_channel) else len(log_.records)
        log_.had_channel = True
        return self._open_channel(log_, name, start)

    def _open_channel(self, log_: PartitionLog, name: str, start: int) -> Channel:
        """A live channel of ``log_`` that starts delivering at log index ``start``."""
        record = None
        if self.record_deliveries:
            record = self._records.setdefault((log_.topic_name, name), ChannelRecord())
        channel = Channel(
            name,
            log_,
            start_index=start,
            schedule=self._running_loop().call_soon,
            clock=time.monotonic,
            record=record,
        )
        partition = self._partitions_by_log.get(id(log_))
        if partition is not None:
            channel.serving = partition.leader is not None and self.nodes[partition.leader].running
            channel.on_confirm = self._replicate
            if name not in partition.topic.channel_names:
                partition.topic.channel_names.append(name)
        log_.channels[name] = channel
        self.changed()
        return channel

    def _replicate(self, channel: Channel) -> None:
        """The leader syncs a channel's consume offset to its replicas when messages are
        confirmed (youzan's FinishMessageToCluster; a replica that lacks the channel creates
        it then): from now on every live replica holds the channel and follows it. Ephemeral
        channels are never synced."""
        channel.replicated = True
        partition = self._partitions_by_log.get(id(channel.log))
        if partition is None or channel.name.endswith("#ephemeral"):
            return
        for node in partition.replicas:
            if node == partition.leader or not self.nodes[node].running:
                continue
            copies = partition.copies_on(node)
            copy = copies.get(channel.name)
            if copy is None:
                copies[channel.name] = ChannelCopy(channel.name, channel.start_index, channel)
            else:
                copy.follows = channel

    def client_left(self, channel: Channel) -> None:
        """A client left ``channel``: an ephemeral channel without clients is deleted."""
        if channel.name.endswith("#ephemeral") and not channel.clients:
            channel.log.channels.pop(channel.name, None)
            partition = self._partitions_by_log.get(id(channel.log))
            if partition is not None and not any(
                channel.name in p.log.channels for p in partition.topic.partitions.values()
            ):
                partition.topic.channel_names.remove(channel.name)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ClusterError("cluster not started")
        return self._loop

    def classic_topic(self, node: NsqdNode, name: str) -> PartitionLog:
        """A classic nsqd's topic, created on first use (as PUB or SUB do)."""
        log_ = node.classic_topics.get(name)
        if log_ is None:
            log_ = PartitionLog(None, ext=False, classic=True, topic_name=name)
            node.classic_topics[name] = log_
            self.changed()
        return log_

    def delete_classic_topic(self, node: NsqdNode, name: str) -> None:
        """Classic nsqd ``/topic/delete``: its consumers are disconnected, the topic's
        channels and messages are gone."""
        log_ = node.classic_topics.pop(name)
        node.detach_consumers(log_)
        for channel in log_.channels.values():
            channel.serving = False
        self.changed()

    def partition_of(self, log_: PartitionLog) -> Partition | None:
        """The youzan partition a log belongs to (None for a classic topic)."""
        return self._partitions_by_log.get(id(log_))

    def _topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise ClusterError(f"no topic {name!r}")
        return topic

    def _partition(self, topic: str, partition: int) -> Partition:
        found = self._topic(topic).partitions.get(partition)
        if found is None:
            raise ClusterError(f"topic {topic!r} has no partition {partition}")
        return found

    def _node(self, index: int) -> NsqdNode:
        if not 0 <= index < len(self.nodes):
            raise ClusterError(f"no node {index} (nodes are 0..{len(self.nodes) - 1})")
        return self.nodes[index]

    def topology(self, topic: str) -> dict[int, dict[str, Any]]:
        """partition -> leader, replicas and writability, for tests and the CLI."""
        return {
            pid: {"leader": p.leader, "replicas": list(p.replicas), "writable": p.writable}
            for pid, p in sorted(self._topic(topic).partitions.items())
        }

    def leader(self, topic: str, partition: int) -> int | None:
        """The node number leading ``partition`` (None while it has no leader)."""
        return self._partition(topic, partition).leader

    def is_stable(self) -> bool:
        """Every partition has a live leader taking writes and no failover is pending."""
        if self._failovers:
            return False
        return all(
            p.leader is not None and self.nodes[p.leader].running and p.writable
            for t in self.topics.values()
            for p in t.partitions.values()
        )

    # ------------------------------------------------------------------ leadership

    def _quorum(self, partition: Partition) -> int:
        # youzan refuses writes unless the in-sync replicas are a majority of the topic's
        # replica count (2 replicas: both; 3: two).
        return partition.topic.replica // 2 + 1

    def _alive_replicas(self, partition: Partition) -> list[int]:
        return [r for r in partition.replicas if self.nodes[r].running]

    def _set_leader(self, partition: Partition, leader: int, *, restarted: bool = False) -> None:
        """Make ``leader`` serve the partition. Consumers of the old leader are detached.

        The new leader serves the channels it holds, each from its confirmed position (the
        messages after it are redelivered, same ids, attempts counted afresh): a restarted
        leader its own channels; another node its replica copies, as far as the old leader
        had synced them. The old leader keeps its channels as a replica. A channel only the
        old leader had is gone from the new one: the next SUB creates it at the topic's end.
        """
        old = partition.leader
        partition.leader = leader
        log_ = partition.log
        if old is not None and old != leader:
            self.nodes[old].detach_consumers(log_)
        if old != leader or restarted:
            self._hand_over(partition, old, leader)
        serving = self.nodes[leader].running
        for channel in log_.channels.values():
            channel.serving = serving
        self._update_writable(partition)
        self.changed()

    def _hand_over(self, partition: Partition, old: int | None, leader: int) -> None:
        """Replace the live channels by the ones ``leader`` holds (see _set_leader)."""
        log_ = partition.log
        previous = log_.channels
        durable = {n: c for n, c in previous.items() if not n.endswith("#ephemeral")}
        if old == leader:
            starts = {name: channel.confirmed_index() for name, channel in durable.items()}
        else:
            starts = {n: c.position() for n, c in partition.copies.pop(leader, {}).items()}
            if old is not None:
                kept = partition.copies_on(old)
                for name, channel in durable.items():
                    kept[name] = ChannelCopy(name, channel.confirmed_index())
            for name in partition.topic.registered_channels:
                # registered channels exist on every replica (a node new to the partition
                # gets the old leader's position)
                if name not in starts:
                    had = previous.get(name)
                    starts[name] = had.confirmed_index() if had else len(log_.records)
        for copies in partition.copies.values():
            for copy in copies.values():
                copy.freeze()  # they followed the old leader's channels
        for channel in previous.values():
            channel.serving = False
        log_.channels = {}
        for name, start in starts.items():
            self._open_channel(log_, name, start)

    def _update_writable(self, partition: Partition) -> None:
        alive = self._alive_replicas(partition)
        partition.writable = (
            partition.leader is not None
            and partition.leader in alive
            and len(alive) >= self._quorum(partition)
            and not partition.forced_unwritable
        )

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
        if self._partition(topic, partition).leader == to_node:
            return
        self.move_partition_now(topic, partition, move_leader=True, to_node=to_node)

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
        part = self._partition(topic, partition)
        live = {n.index for n in self.nodes if n.running}
        if from_node is None and move_leader:
            from_node = part.leader
        if to_node is None:
            to_node = self._default_move_target(part, live, from_node, replica=move_leader)
        if from_node == to_node:
            raise ClusterError("move to and from node can not be the same")
        if move_leader and from_node != part.leader:
            raise ClusterError("move from not the topic leader")
        if not move_leader:
            if from_node == part.leader:
                raise ClusterError("can not move leader without moveleader param")
            if from_node not in part.replicas:
                raise ClusterError("the move source node has no replica for the topic")
            if to_node in part.replicas:
                raise ClusterError("the move destination has the topic data already")
        if to_node not in live:
            raise ClusterError("the move destination is not found in cluster")
        if from_node not in live:
            raise ClusterError("the move source data is lost in cluster")
        if not move_leader:
            part.replicas[part.replicas.index(from_node)] = to_node
            part.copies.pop(from_node, None)
            for channel in part.log.channels.values():
                channel.replicated = False  # the new replica gets them on the next sync
                if channel.name in part.topic.registered_channels:
                    self._replicate(channel)
            self._update_writable(part)
            self.changed()
            return to_node
        if to_node not in part.replicas:
            part.replicas.append(to_node)
        self._set_leader(part, to_node)
        return to_node

    def _default_move_target(
        self, part: Partition, live: set[int], from_node: int | None, *, replica: bool
    ) -> int:
        """Leadership goes to the next live replica; replica data to a node without it."""
        replicas = part.replicas
        if replica:
            start = replicas.index(part.leader) if part.leader in replicas else -1
            for k in range(1, len(replicas) + 1):
                candidate = replicas[(start + k) % len(replicas)]
                if candidate not in (part.leader, from_node) and candidate in live:
                    return candidate
        for node in sorted(live):
            if node not in replicas:
                return node
        raise ClusterError("no live node to move the partition to")

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and all its partitions (nsqlookupd ``/topic/delete?partition=**``).
        Consumers are disconnected; later publishes get E_TOPIC_NOT_EXIST."""
        self.delete_topic_now(name)
        await asyncio.sleep(0)

    def delete_topic_now(self, name: str) -> None:
        """:meth:`delete_topic` without awaiting."""
        topic = self._topic(name)
        for part in topic.partitions.values():
            self._cancel_failover(part)
            for node in self.nodes:
                node.detach_consumers(part.log)
            for channel in part.log.channels.values():
                channel.serving = False
            self._partitions_by_log.pop(id(part.log), None)
        del self.topics[name]
        self.changed()

    async def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Make a partition refuse writes (E_FAILED_ON_NOT_WRITABLE) or take them again."""
        part = self._partition(topic, partition)
        part.forced_unwritable = not writable
        self._update_writable(part)
        self.changed()
        await asyncio.sleep(0)

    async def stop_node(self, index: int) -> None:
        """Stop a node like a crash. Partitions it led fail over to a live replica after
        ``failover_delay`` seconds (writable only with a majority of replicas alive)."""
        node = self._node(index)
        if not node.running:
            return
        for log_ in self._logs_led_by(index):
            node.detach_consumers(log_)
            for channel in log_.channels.values():
                channel.serving = False
        await node.stop()
        await self._node_http[index].stop()
        for topic in self.topics.values():
            for part in topic.partitions.values():
                if index not in part.replicas:
                    continue
                self._update_writable(part)
                if part.leader == index:
                    self._schedule_failover(part)
                else:
                    for copy in part.copies_on(index).values():
                        copy.freeze()  # no more offset syncs while it is down
        self.changed()

    def _logs_led_by(self, index: int) -> list[PartitionLog]:
        if self.classic:
            return list(self.nodes[index].classic_topics.values())
        return [
            p.log for t in self.topics.values() for p in t.partitions.values() if p.leader == index
        ]

    def _schedule_failover(self, partition: Partition) -> None:
        self._cancel_failover(partition)
        if self.failover_delay <= 0:
            self._failover(partition)
            return
        key = (partition.topic.name, partition.id)
        self._failovers[key] = self._running_loop().call_later(
            self.failover_delay, self._failover, partition
        )

    def _cancel_failover(self, partition: Partition) -> None:
        pending = self._failovers.pop((partition.topic.name, partition.id), None)
        if pending is not None:
            pending.cancel()

    def _failover(self, partition: Partition) -> None:
        self._failovers.pop((partition.topic.name, partition.id), None)
        leader = partition.leader
        if leader is not None and self.nodes[leader].running:
            return
        alive = self._alive_replicas(partition)
        if alive:
            self._set_leader(partition, alive[0])
        # else: no replica left; the dead leader leads again when it comes back

    async def start_node(self, index: int) -> None:
        """Restart a stopped node on the same ports. It rejoins its partitions as a replica
        (and leads those that had no live replica)."""
        node = self._node(index)
        if node.running:
            return
        await self._start_node_servers(index)
        for topic in self.topics.values():
            for part in topic.partitions.values():
                if index not in part.replicas:
                    continue
                if part.leader == index:
                    # It still led (failover pending, or no replica could take over).
                    self._cancel_failover(part)
                    self._set_leader(part, index, restarted=True)
                else:
                    self._update_writable(part)
                    for channel in part.log.channels.values():
                        channel.replicated = False  # it catches up on the next sync
        for log_ in node.classic_topics.values():
            for channel in log_.channels.values():
                channel.serving = True
                channel.reset_for_new_leader()
        self.changed()

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

    async def stop_lookupd(self, index: int) -> None:
        """Stop an nsqlookupd (its port stays reserved for a restart)."""
        await self.lookupds[index].stop()

    async def start_lookupd(self, index: int) -> None:
        """Start a stopped nsqlookupd again, on the same port."""
        await self.lookupds[index].start()

    def freeze_lookupd(self, index: int, topics: Sequence[str]) -> None:
        """Make a lookupd keep answering lookups of ``topics`` as they are now (stale)."""
        self.lookupds[index].snapshot(list(topics))

    def thaw_lookupd(self, index: int) -> None:
        """The lookupd answers from the live state again (see :meth:`freeze_lookupd`)."""
        self.lookupds[index].frozen = None

    async def disable_write(self, kind: str = "all") -> None:
        """nsqlookupd ``/disable/write``: "all", "ordered", or "" to re-enable."""
        self.write_disabled = kind if kind in ("all", "ordered") else ""
        await asyncio.sleep(0)

    # ------------------------------------------------------------------ introspection

    def _logs(self, topic: str, partition: int | None = None) -> list[PartitionLog]:
        if self.classic:
            return [n.classic_topics[topic] for n in self.nodes if topic in n.classic_topics]
        parts = self._topic(topic).partitions
        if partition is not None:
            return [self._partition(topic, partition).log]
        return [parts[p].log for p in sorted(parts)]

    def _channels(self, topic: str, channel: str, partition: int | None = None) -> list[Channel]:
        """The channel ``channel`` of each log of the topic (or partition) that has it."""
        return [
            log_.channels[channel]
            for log_ in self._logs(topic, partition)
            if channel in log_.channels
        ]

    def messages(self, topic: str, partition: int | None = None) -> list[Record]:
        """Every message accepted for the topic (or one partition), in log order."""
        return [r for log_ in self._logs(topic, partition) for r in log_.records]

    def depth(self, topic: str, channel: str | None = None, partition: int | None = None) -> int:
        """Messages not yet delivered: of a channel, or of the topic's logs."""
        if channel is None:
            return sum(len(log_.records) for log_ in self._logs(topic, partition))
        return sum(c.depth for c in self._channels(topic, channel, partition))

    def in_flight(self, topic: str, channel: str, partition: int | None = None) -> int:
        """Messages of the channel (or of one partition of it) delivered and not answered yet."""
        return sum(len(c.in_flight) for c in self._channels(topic, channel, partition))

    def subscriber_rdy(self, topic: str, channel: str, partition: int | None = None) -> list[int]:
        """The RDY count of each client subscribed to the channel (or to one partition of
        it): [] when nobody listens, all zeros when every subscriber is paused."""
        channels = self._channels(topic, channel, partition)
        return [client.rdy for c in channels for client in c.clients]

    def channel_record(self, topic: str, channel: str) -> ChannelRecord:
        """Deliveries, FINs, requeues and timeouts of a channel (all partitions)."""
        return self._records.setdefault((topic, channel), ChannelRecord())

    def unfinished(self, topic: str, channel: str) -> int:
        """Messages of the channel not finished yet (waiting, deferred or in flight)."""
        return sum(c.depth + len(c.in_flight) for c in self._channels(topic, channel))

    def clients(self, index: int) -> int:
        """How many client connections a node has (producers and consumers)."""
        return len(self._node(index).sessions)
