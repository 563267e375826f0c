"""Emulated nsqlookupd HTTP API, youzan HA flavour or classic nsqlookupd 1.3: the handlers of
``nsqlookupd/http.go`` in youzan/nsq 0.3.7-HA.1.13.0 (``doLookup``, ``doListLookup``,
``doTopics``, ``doChannels``, ``doNodes``, ``doInfo`` and the operator endpoints below) and in
nsqio/nsq v1.3.0 (``doLookup``, ``doTopics``, ``doChannels``, ``doNodes``, ``doInfo``).

Every lookupd of a cluster answers from the shared cluster state (real lookupds converge
through etcd); a lookupd can be *frozen* to keep answering from a snapshot, which is how tests
make lookupds disagree.

Registrations follow the youzan nsqd: a partition leader registers the partition (and its
channels) only while it can take writes. So a partition without a writable leader is missing
from write lookups and its channels from every answer, while read lookups still name its
current leader (nsqlookupd fills missing partitions from the coordinator for consumers:
``tryFindRegsForConsumer``), as seen during leader changes
(docs/protocol.md#leader-change-timings).

youzan operator endpoints (v1, on the leader lookupd), beside ``/topic/create`` and
``/disable/write``:

* ``POST /topic/partition/move?topic=&partition=&move_leader=true[&move_from=][&move_to=]``
  (``doMoveTopicParition``, then the coordinator's ``MoveTopicPartitionDataByManual`` in
  consistence/nsqlookup_coord_api.go): the same implementation as :meth:`Cluster.move_leader`.
  ``move_from``/``move_to`` name nsqd nodes by their ``distributed_id`` (as lookups report
  it, the real servers' node id), by ``host:tcp_port`` or by node number. ``move_from``
  defaults to the leader, ``move_to`` to the next live replica. Without
  ``move_leader=true`` a replica's data moves from ``move_from`` to ``move_to``. The answer
  comes once the move is done.
* ``POST /topic/delete?topic=&partition=**`` (``doDeleteTopic``).
* ``POST /channel/create?topic=&channel=`` (``doCreateChannel``): registers a channel of a
  topic created with ``disable_channel_auto_create=true``.
* ``GET /cluster/stats`` (``doClusterStats``): ``{"stable", "node_stat_list": [{"hostname",
  "broadcast_address", "tcp_port", "http_port", "leader_load_factor", "node_load_factor"}],
  "topn_topics": []}`` as the real lookupd; the emulated load factors are the numbers of
  partitions a node leads (writably) and holds, where the real ones weigh data and traffic
  (``NsqLookupCoordinator.GetClusterNodeLoadFactor``). ``stable``: every partition has a
  live, writable leader and no failover is pending.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any

from smartnsq.testing.directory import (
    CLASSIC_VERSION,
    YOUZAN_VERSION,
    Directory,
    LookupdEntry,
    NsqdEntry,
)
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.http import (
    ApiError,
    HttpServer,
    Mode,
    Request,
    Response,
    Route,
    dispatch,
    respond,
)
from smartnsq.testing.publish import go_atoi, valid_name
from smartnsq.testing.topology import TopicRefused

if TYPE_CHECKING:
    from smartnsq.testing.checks import TopicChecks
    from smartnsq.testing.state import Partition, Topic
    from smartnsq.testing.topology import Topology

__all__ = ["LookupdNode"]

NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
KEY_NOT_FOUND = "Key not found"
NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
# the coordinator's ErrNotNsqLookupLeader, which some operator endpoints answer instead
NOT_LOOKUP_LEADER = "Not nsqlookup leader"
MAX_PARTITION_NUM = 255
OLD_VERSION_PID = -11  # the partition id nsqlookupd accepts for pre-HA nsqd nodes
HOSTNAME = socket.gethostname()
_GET = ("GET",)
_POST = ("POST",)


def _reserve_port(host: str) -> Any:
    """A bound socket that keeps a port number for the (unserved) lookupd TCP/RPC ports; on
    a simulation's loop, a port of its network (it has no sockets)."""
    reserve = getattr(asyncio.get_running_loop(), "reserve_port", None)
    if reserve is not None:
        return reserve(host)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    return sock


class LookupdNode:
    """One emulated nsqlookupd: its HTTP API over the cluster's directory and topology. Its
    ports and whether it runs are its entry in the directory."""

    def __init__(
        self, index: int, directory: Directory, topology: Topology, checks: TopicChecks
    ) -> None:
        self.index = index
        self.directory = directory
        self.topology = topology
        self.checks = checks
        self.entry = directory.lookupds[index]
        self.http = HttpServer(
            self.handle, directory.host, directory.planned_port(index, "lookupd")
        )
        self.frozen: dict[tuple[str, str, str], tuple[int, Any]] | None = None
        self._reserved: list[Any] = []  # bound sockets, or a simulation's ports
        if topology.classic:
            # nsqlookupd 1.x answers every endpoint in the v1 format
            self.routes = {
                "/ping": Route(_GET, self._ping, Mode.PLAIN),
                "/info": Route(_GET, self._info, Mode.V1),
                "/lookup": Route(_GET, self._classic_lookup, Mode.V1),
                "/topics": Route(_GET, self._topics, Mode.V1),
                "/channels": Route(_GET, self._channels, Mode.V1),
                "/nodes": Route(_GET, self._nodes, Mode.V1),
            }
        else:
            self.routes = {
                "/ping": Route(_GET, self._ping, Mode.PLAIN),
                "/info": Route(_GET, self._info, Mode.NEGOTIATE),
                "/lookup": Route(_GET, self._lookup, Mode.NEGOTIATE),
                "/listlookup": Route(_GET, self._listlookup, Mode.NEGOTIATE),
                "/topics": Route(_GET, self._topics, Mode.NEGOTIATE),
                "/channels": Route(_GET, self._channels, Mode.NEGOTIATE),
                "/nodes": Route(_GET, self._nodes, Mode.NEGOTIATE),
                "/cluster/stats": Route(_GET, self._cluster_stats, Mode.V1),
                "/topic/create": Route(("POST", "PUT"), self._topic_create, Mode.V1),
                "/topic/delete": Route(_POST, self._topic_delete, Mode.V1),
                "/topic/partition/move": Route(_POST, self._partition_move, Mode.V1),
                "/channel/create": Route(_POST, self._channel_create, Mode.V1),
                "/disable/write": Route(_POST, self._disable_write, Mode.V1),
            }

    @property
    def url(self) -> str:
        """Where a client on this machine connects (``/listlookup`` announces
        ``broadcast_address`` instead)."""
        return f"http://{self.directory.local_host}:{self.http.port}"

    @property
    def http_port(self) -> int:
        return self.http.port

    @property
    def tcp_port(self) -> int:
        return self.entry.tcp_port

    @property
    def rpc_port(self) -> int:
        return self.entry.rpc_port

    @property
    def running(self) -> bool:
        return self.entry.running

    async def start(self) -> None:
        await self.http.start()
        entry = self.entry
        entry.http_port = self.http.port
        if not self._reserved:
            self._reserved = [_reserve_port(self.directory.host) for _ in range(2)]
            entry.tcp_port = self._reserved[0].getsockname()[1]
            entry.rpc_port = self._reserved[1].getsockname()[1]
        entry.running = True

    async def stop(self) -> None:
        self.entry.running = False
        await self.http.stop()

    def release(self) -> None:
        for sock in self._reserved:
            sock.close()
        self._reserved = []

    @property
    def is_leader(self) -> bool:
        return self.directory.lookupd_leader() is self.entry

    def node_info(self) -> dict[str, Any]:
        return _lookupd_info(self.directory, self.entry)

    # ------------------------------------------------------------------ routing

    async def handle(self, request: Request) -> Response:
        if self.frozen is not None and request.method == "GET" and request.path != "/ping":
            key = (request.path, request.arg("topic") or "", request.arg("access") or "r")
            snap = self.frozen.get(key)
            if snap is not None:
                status, data = snap
                mode = self.routes[request.path].mode
                if status != 200:
                    return await dispatch({request.path: _raising(status, data, mode)}, request)
                return respond(request, data, mode)
        return await dispatch(self.routes, request)

    def snapshot(self, topics: list[str]) -> None:
        """Freeze: keep answering lookups for ``topics`` as they are now."""
        frozen: dict[tuple[str, str, str], tuple[int, Any]] = {}
        lookup = self.routes["/lookup"].handler
        for topic in topics:
            for access in ("r", "w"):
                fake = Request(
                    "GET",
                    "/lookup",
                    {"topic": [topic], "access": [access], "metainfo": ["true"]},
                    {},
                )
                try:
                    frozen[("/lookup", topic, access)] = (200, lookup(fake))
                except ApiError as exc:
                    frozen[("/lookup", topic, access)] = (exc.status, exc.message)
        self.frozen = frozen

    # ------------------------------------------------------------------ shared

    def _ping(self, request: Request) -> str:
        return "OK"

    def _info(self, request: Request) -> dict[str, Any]:
        if self.topology.classic:
            return {"version": CLASSIC_VERSION}
        return {"version": YOUZAN_VERSION, "ha_support": True}

    def _topic_arg(self, request: Request) -> str:
        topic = request.arg("topic")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        return topic

    def _topic_channel_args(self, request: Request) -> tuple[str, str]:
        """http_api.GetTopicChannelArgs."""
        topic = self._topic_arg(request)
        if not valid_name(topic):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        channel = request.arg("channel")
        if not channel:
            raise ApiError(400, "MISSING_ARG_CHANNEL")
        if not valid_name(channel):
            raise ApiError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    # ------------------------------------------------------------------ youzan registrations

    def _registered(self, partition: Partition) -> bool:
        """A partition's leader registers it while the partition takes writes."""
        leader = partition.leader
        return leader is not None and self.directory.nsqds[leader].running and partition.writable

    def _consumable(self, partition: Partition) -> bool:
        """Read lookups also name a leader that cannot take writes (nsqlookupd's
        tryFindRegsForConsumer), as long as it is connected."""
        leader = partition.leader
        return leader is not None and self.directory.nsqds[leader].running

    def _partition_channels(self, part: Partition) -> set[str]:
        """The channels live nodes hold for a partition: every nsqd registers its own (the
        leader's live ones, and the copies on replicas; write lookups list the channels of an
        old leader that rejoined: docs/protocol.md#leader-change-timings)."""
        nodes = self.directory.nsqds
        held: set[str] = set()
        if part.leader is not None and nodes[part.leader].running:
            held.update(part.log.channels)
        for node, copies in part.copies.items():
            if node != part.leader and node in part.replicas and nodes[node].running:
                held.update(copies)
        return held

    def _registered_channels(self, topic: Topic, partition: str = "*") -> list[str]:
        present: set[str] = set()
        for pid, part in topic.partitions.items():
            if partition == "*" or partition == str(pid):
                present |= self._partition_channels(part)
        return [name for name in topic.channel_names if name in present]

    def _peer(self, node: NsqdEntry) -> dict[str, Any]:
        # remote_address: where nsqd's registration came from, not what it announces
        directory = self.directory
        remote = f"{directory.local_host}:{node.registration_port}"
        return {
            "id": remote,
            "remote_address": remote,
            "hostname": HOSTNAME,
            "broadcast_address": directory.broadcast_address,
            "tcp_port": node.tcp_port,
            "http_port": node.http_port,
            "version": YOUZAN_VERSION,
            "distributed_id": directory.distributed_id(node),
        }

    # ------------------------------------------------------------------ youzan reads

    def _lookup(self, request: Request) -> dict[str, Any]:
        """nsqlookupd doLookup, over the registration model described in the module doc."""
        directory = self.directory
        name = self._topic_arg(request)
        only = request.arg("partition") or "*"
        access = request.arg("access") or "r"
        if access not in ("r", "w"):
            raise ApiError(400, "INVALID_ACCESS_MODE")
        topic = self.topology.topics.get(name)
        if topic is None:
            if access == "w":
                # nothing registered: the coordinator (etcd) does not know the topic either
                raise ApiError(404, KEY_NOT_FOUND)
            return {"channels": [], "partitions": {}, "producers": []}
        selected = [p for pid, p in sorted(topic.partitions.items()) if only in ("*", str(pid))]
        registered = [p for p in selected if self._registered(p)]
        # readers also get leaders that cannot take writes
        consumable = [p for p in selected if self._consumable(p)]
        serving = consumable if access == "r" else registered
        partitions: dict[str, Any] = {}
        producers: list[dict[str, Any]] = []
        seen: set[int] = set()
        dropped_for_channels = False
        for part in serving:
            node = directory.nsqds[part.leader] if part.leader is not None else None
            if node is None:
                continue
            no_channel = not self._partition_channels(part)
            if access == "w" and no_channel and not directory.allow_write_with_no_channels:
                dropped_for_channels = True
                continue
            partitions[str(part.id)] = self._peer(node)
            if node.index not in seen:
                seen.add(node.index)
                producers.append(self._peer(node))
        if registered and dropped_for_channels and not partitions and not producers:
            raise ApiError(404, NO_CHANNEL)
        answer: dict[str, Any] = {"channels": self._registered_channels(topic, only)}
        need_meta = bool(request.arg("metainfo"))
        withheld = False  # writes disabled: nsqlookupd answers Go nils (JSON null)
        if access == "w":
            if directory.write_disabled == "all":
                withheld = True
            elif directory.write_disabled == "ordered":
                need_meta = True
                withheld = topic.ordered
        if need_meta:
            answer["meta"] = topic.meta()
        # Go marshals map keys sorted as strings ("10" before "2")
        answer["partitions"] = None if withheld else dict(sorted(partitions.items()))
        answer["producers"] = None if withheld else producers
        return answer

    def _listlookup(self, request: Request) -> Any:
        directory = self.directory
        nodes = [_lookupd_info(directory, lk) for lk in directory.lookupds if lk.running]
        leader = directory.lookupd_leader()
        return {
            "lookupdleader": _lookupd_info(directory, leader) if leader is not None else None,
            "lookupdnodes": nodes,
        }

    def _topics(self, request: Request) -> dict[str, Any]:
        topology = self.topology
        if topology.classic:
            names = list(dict.fromkeys(n for topics in topology.classic_topics for n in topics))
            return {"topics": names}
        # topics some node registered
        topics = [
            t for t in topology.topics.values() if any(map(self._registered, t.partitions.values()))
        ]
        answer: dict[str, Any] = {"topics": [t.name for t in topics]}
        if request.arg("metaInfo") == "true":
            answer["meta_info"] = [
                {
                    "topic_name": t.name,
                    "extend_support": t.ext,
                    "ordered": t.ordered,
                    "multi_part": t.multi_part,
                    "disable_channel_auto_create": t.disable_channel_auto_create,
                    "registered_channels": list(t.registered_channels),
                }
                for t in topics
            ]
        return answer

    def _channels(self, request: Request) -> dict[str, Any]:
        topology = self.topology
        name = self._topic_arg(request)
        if topology.classic:
            channels: list[str] = []
            for node, topics in zip(self.directory.nsqds, topology.classic_topics, strict=True):
                log_ = topics.get(name)
                if log_ is not None and node.running:
                    channels += [c for c in log_.channels if c not in channels]
            return {"channels": channels}
        topic = topology.topics.get(name)
        if topic is None:
            return {"channels": []}
        return {"channels": self._registered_channels(topic, request.arg("partition") or "*")}

    def _nodes(self, request: Request) -> dict[str, Any]:
        topology = self.topology
        producers = []
        for node in self.directory.nsqds:
            if not node.running:
                continue
            if topology.classic:
                topics = list(topology.classic_topics[node.index])
                producers.append(
                    {
                        **self._classic_peer(node),
                        "tombstones": [False] * len(topics),
                        "topics": topics,
                    }
                )
                continue
            led: dict[str, list[str]] = {}
            for topic in topology.topics.values():
                ids = [
                    str(p.id)
                    for p in topic.partitions.values()
                    if p.leader == node.index and self._registered(p)
                ]
                if ids:
                    led[topic.name] = ids
            peer = self._peer(node)
            del peer["id"], peer["distributed_id"]
            peer["tombstones"] = [False] * len(led)
            peer["topics"] = list(led)
            peer["partitions"] = dict(sorted(led.items()))  # Go marshals map keys sorted
            producers.append(peer)
        return {"producers": producers}

    # ------------------------------------------------------------------ youzan operator

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise ApiError(400, NOT_LEADER)

    def _cluster_stats(self, request: Request) -> dict[str, Any]:
        """nsqlookupd doClusterStats, on the leader lookupd only."""
        self._require_leader()
        directory = self.directory
        partitions = [p for t in self.topology.topics.values() for p in t.partitions.values()]
        stats = []
        for node in directory.nsqds:
            if not node.running:
                continue
            led = sum(1 for p in partitions if p.leader == node.index and self._registered(p))
            held = sum(1 for p in partitions if node.index in p.replicas)
            stats.append(
                {
                    "hostname": HOSTNAME,
                    "broadcast_address": directory.broadcast_address,
                    "tcp_port": node.tcp_port,
                    "http_port": node.http_port,
                    # Go prints a whole float64 without a fraction: 2, not 2.0
                    "leader_load_factor": led,
                    "node_load_factor": held,
                }
            )
        return {
            "stable": self.topology.is_stable(),
            "node_stat_list": stats,
            "topn_topics": [],
        }

    def _topic_create(self, request: Request) -> None:
        """nsqlookupd doCreateTopic: every argument is checked before the leadership. A new
        topic takes writes after the next topic check, which this asks for, as a post for an
        existing topic of the same settings does (:mod:`~smartnsq.testing.checks`)."""
        name = self._topic_arg(request)
        if not valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        partition_num = _int_arg(request, "partition_num", "TOPIC_PARTITION_NUM", 1, 255)
        replicator = _int_arg(request, "replicator", "TOPIC_REPLICATOR", 1, 5)
        if request.arg("suggestload"):
            _int_arg(request, "suggestload", "TOPIC_LOAD_FACTOR", 0, 10000)
        if request.arg("syncdisk"):
            _int_arg(request, "syncdisk", "TOPIC_SYNC_DISK", -(2**63), 2**63 - 1)
        retention = request.arg("retention")
        if retention:
            try:
                go_atoi(retention)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        self._require_leader()
        try:
            self.topology.create_topic(
                name,
                partitions=partition_num,
                replicas=replicator,
                ordered=request.arg("orderedmulti") == "true",
                ext=request.arg("extend") == "true",
                multi_part=request.arg("multipart") == "true",
                disable_channel_auto_create=request.arg("disable_channel_auto_create") == "true",
                strict_placement=True,
                awaiting_check=True,
            )
        except TopicRefused as exc:
            raise ApiError(400, str(exc)) from None
        self.checks.request()

    def _topic_delete(self, request: Request) -> None:
        """nsqlookupd doDeleteTopic: only ``partition=**``; the coordinator refuses on a
        non-leader lookupd (500 "Not nsqlookup leader") and for an unknown topic."""
        name = self._topic_arg(request)
        partition = request.arg("partition")
        if not partition:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        if partition != "**":
            raise ApiError(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
        if not self.is_leader:
            raise ApiError(500, NOT_LOOKUP_LEADER)
        if name not in self.topology.topics:
            raise ApiError(500, "Topic not exist")
        self.topology.delete_topic(name)

    def _partition_move(self, request: Request) -> None:
        """nsqlookupd doMoveTopicParition, one implementation with Cluster.move_leader."""
        name = self._topic_arg(request)
        text = request.arg("partition")
        if not text:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        try:
            pid = go_atoi(text)
        except ValueError:
            raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION_NUM") from None
        if not 0 <= pid < MAX_PARTITION_NUM and pid != OLD_VERSION_PID:
            raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        self._require_leader()
        topic = self.topology.topics.get(name)
        if topic is None or pid not in topic.partitions:
            raise ApiError(400, KEY_NOT_FOUND)
        try:
            self.topology.move_partition(
                name,
                pid,
                move_leader=request.arg("move_leader") == "true",
                from_node=self._node_ref(request.arg("move_from")),
                to_node=self._node_ref(request.arg("move_to")),
            )
        except ClusterError as exc:
            raise ApiError(400, str(exc)) from None

    def _node_ref(self, text: str | None) -> int | None:
        """An nsqd named by distributed id, ``host:tcp_port`` or number; -1 when unknown."""
        if not text:
            return None
        directory = self.directory
        for node in directory.nsqds:
            names = (
                directory.distributed_id(node),
                directory.announced_tcp_address(node),
                str(node.index),
            )
            if text in (*names, directory.tcp_address(node)):
                return node.index
        return -1

    def _channel_create(self, request: Request) -> None:
        """nsqlookupd doCreateChannel: registers a channel of a topic whose channel
        auto-creation is disabled (consumers may then subscribe to it)."""
        name, channel = self._topic_channel_args(request)
        topic = self.topology.topics.get(name)
        if topic is None:
            raise ApiError(400, KEY_NOT_FOUND)
        if not topic.disable_channel_auto_create:
            raise ApiError(400, f"channel auto create NOT disabled in topic {name}")
        if channel in topic.registered_channels:
            raise ApiError(400, f"channel {channel} already registered")
        if not self.is_leader:
            raise ApiError(400, NOT_LOOKUP_LEADER)
        self.topology.register_channel(name, channel)

    def _disable_write(self, request: Request) -> None:
        """nsqlookupd doDisableClusterWrite: ``type=all`` or ``ordered``, anything else
        enables writes again."""
        self._require_leader()
        kind = request.arg("type") or ""
        self.directory.write_disabled = kind if kind in ("all", "ordered") else ""

    # ------------------------------------------------------------------ classic

    def _classic_peer(self, node: NsqdEntry) -> dict[str, Any]:
        return {
            "remote_address": f"{self.directory.local_host}:{node.registration_port}",
            "hostname": HOSTNAME,
            "broadcast_address": self.directory.broadcast_address,
            "tcp_port": node.tcp_port,
            "http_port": node.http_port,
            "version": CLASSIC_VERSION,
        }

    def _classic_lookup(self, request: Request) -> dict[str, Any]:
        name = self._topic_arg(request)
        producers = []
        channels: list[str] = []
        for node, topics in zip(self.directory.nsqds, self.topology.classic_topics, strict=True):
            log_ = topics.get(name)
            if log_ is None or not node.running:
                continue
            producers.append(self._classic_peer(node))
            channels += [c for c in log_.channels if c not in channels]
        if not producers:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        return {"channels": channels, "producers": producers}


def _lookupd_info(directory: Directory, lookupd: LookupdEntry) -> dict[str, Any]:
    """A lookupd as ``/listlookup`` announces it."""
    host = directory.broadcast_address
    return {
        "ID": f"{host}:{lookupd.rpc_port}:{lookupd.tcp_port}:nsqlookup",
        "NodeIP": host,
        "TcpPort": str(lookupd.tcp_port),
        "HttpPort": str(lookupd.http_port),
        "RpcPort": str(lookupd.rpc_port),
        "Epoch": 0,
    }


def _raising(status: int, message: str, mode: Mode) -> Route:
    def handler(request: Request) -> None:
        raise ApiError(status, message)

    return Route(_GET, handler, mode)


def _int_arg(request: Request, name: str, code: str, low: int, high: int) -> int:
    text = request.arg(name)
    if not text:
        raise ApiError(400, f"MISSING_ARG_{code}")
    try:
        value = go_atoi(text)
    except ValueError:
        raise ApiError(400, f"INVALID_ARG_{code}") from None
    if not low <= value <= high:
        raise ApiError(400, f"INVALID_ARG_{code}")
    return value
