"""Emulated nsqlookupd HTTP API, youzan HA flavour or classic (PROTOCOL.md section 8).

Every lookupd of a cluster answers from the shared cluster state (real lookupds converge
through etcd); a lookupd can be *frozen* to keep answering from a snapshot, which is how tests
make lookupds disagree.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from smartnsq.testing.http import (
    ApiError,
    HttpServer,
    Request,
    Response,
    api_response,
    text_response,
)
from smartnsq.testing.nsqd import CLASSIC_VERSION, YOUZAN_VERSION, NsqdNode, _valid_name

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["LookupdNode"]

NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
HOSTNAME = socket.gethostname()


def _reserve_port(host: str) -> socket.socket:
    """A bound socket that keeps a port number for the (unserved) lookupd TCP/RPC ports."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    return sock


class LookupdNode:
    def __init__(self, cluster: Cluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.http = HttpServer(self.handle, cluster.host)
        self.running = False
        self.frozen: dict[tuple[str, str, str], tuple[int, Any]] | None = None
        self._reserved: list[socket.socket] = []
        self.tcp_port = 0
        self.rpc_port = 0

    @property
    def url(self) -> str:
        return f"http://{self.http.address}"

    @property
    def http_port(self) -> int:
        return self.http.port

    async def start(self) -> None:
        await self.http.start()
        if not self._reserved:
            self._reserved = [_reserve_port(self.cluster.host) for _ in range(2)]
            self.tcp_port = self._reserved[0].getsockname()[1]
            self.rpc_port = self._reserved[1].getsockname()[1]
        self.running = True

    async def stop(self) -> None:
        self.running = False
        await self.http.stop()

    def release(self) -> None:
        for sock in self._reserved:
            sock.close()
        self._reserved = []

    @property
    def is_leader(self) -> bool:
        leader = self.cluster.lookupd_leader()
        return leader is self

    def node_info(self) -> dict[str, Any]:
        host = self.cluster.host
        return {
            "ID": f"{host}:{self.rpc_port}:{self.tcp_port}:nsqlookup",
            "NodeIP": host,
            "TcpPort": str(self.tcp_port),
            "HttpPort": str(self.http_port),
            "RpcPort": str(self.rpc_port),
            "Epoch": 0,
        }

    # ------------------------------------------------------------------ routing

    async def handle(self, request: Request) -> Response:
        cluster = self.cluster
        path = request.path
        if path == "/ping":
            return text_response("OK")
        if self.frozen is not None and request.method == "GET":
            key = (path, request.arg("topic") or "", request.arg("access") or "r")
            snap = self.frozen.get(key)
            if snap is not None:
                status, data = snap
                if status != 200:
                    raise ApiError(status, data)
                return api_response(request, data)
        routes = self._classic_routes if cluster.classic else self._youzan_routes
        route = routes.get(path)
        if route is None:
            raise ApiError(404, "NOT_FOUND")
        method, fn, negotiate = route
        if request.method not in method:
            raise ApiError(405, "METHOD_NOT_ALLOWED")
        try:
            data = fn(self, request)
        except ApiError as exc:
            if not negotiate:
                return _v1_error(exc)
            raise
        if isinstance(data, Response):
            return data
        return api_response(request, data, negotiate=negotiate)

    def snapshot(self, topics: list[str]) -> None:
        """Freeze: keep answering lookups for ``topics`` as they are now."""
        frozen: dict[tuple[str, str, str], tuple[int, Any]] = {}
        for topic in topics:
            for access in ("r", "w"):
                fake = Request(
                    "GET",
                    "/lookup",
                    {"topic": [topic], "access": [access], "metainfo": ["true"]},
                    {},
                )
                try:
                    frozen[("/lookup", topic, access)] = (200, self._lookup(fake))
                except ApiError as exc:
                    frozen[("/lookup", topic, access)] = (exc.status, exc.message)
        self.frozen = frozen

    # ------------------------------------------------------------------ shared

    def _info(self, request: Request) -> dict[str, Any]:
        if self.cluster.classic:
            return {"version": CLASSIC_VERSION}
        return {"version": YOUZAN_VERSION, "ha_support": True}

    def _topic_arg(self, request: Request) -> str:
        topic = request.arg("topic")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        return topic

    # ------------------------------------------------------------------ youzan

    def _peer(self, node: NsqdNode) -> dict[str, Any]:
        host = self.cluster.host
        remote = f"{host}:{node.registration_port}"
        return {
            "id": remote,
            "remote_address": remote,
            "hostname": HOSTNAME,
            "broadcast_address": host,
            "tcp_port": node.tcp_port,
            "http_port": node.http_port,
            "version": YOUZAN_VERSION,
            "distributed_id": f"{host}:{node.tcp_port + 2}:{node.tcp_port}:{node.index}",
        }

    def _lookup(self, request: Request) -> dict[str, Any]:
        cluster = self.cluster
        name = self._topic_arg(request)
        access = request.arg("access", "r")
        if access not in ("r", "w"):
            raise ApiError(400, "INVALID_ACCESS_MODE")
        metainfo = bool(request.arg("metainfo"))
        only = request.arg("partition", "*")
        if only != "*":
            try:
                only_id: int | None = int(only or "")
            except ValueError:
                raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION") from None
        else:
            only_id = None
        topic = cluster.topics.get(name)
        if topic is None:
            if access == "w":
                raise ApiError(404, "Key not found")
            return {"channels": [], "partitions": {}, "producers": []}
        write_disabled = cluster.write_disabled == "all" or (
            cluster.write_disabled == "ordered" and topic.ordered
        )
        partitions: dict[str, Any] = {}
        producers: list[dict[str, Any]] = []
        seen: set[int] = set()
        dropped_for_channels = False
        for pid in sorted(topic.partitions):
            if only_id is not None and pid != only_id:
                continue
            partition = topic.partitions[pid]
            leader = partition.leader
            if leader is None or not cluster.nodes[leader].running:
                continue
            if access == "w":
                if write_disabled or not partition.writable:
                    continue
                if not partition.log.channels and not cluster.allow_write_with_no_channels:
                    dropped_for_channels = True
                    continue
            node = cluster.nodes[leader]
            partitions[str(pid)] = self._peer(node)
            if leader not in seen:
                seen.add(leader)
                producers.append(self._peer(node))
        if access == "w" and dropped_for_channels and not partitions:
            raise ApiError(404, NO_CHANNEL)
        answer: dict[str, Any] = {"channels": list(topic.channel_names)}
        if metainfo or (write_disabled and cluster.write_disabled == "ordered"):
            answer["meta"] = topic.meta()
        answer["partitions"] = partitions
        answer["producers"] = producers
        return answer

    def _listlookup(self, request: Request) -> Any:
        nodes = [lk.node_info() for lk in self.cluster.lookupds if lk.running]
        leader = self.cluster.lookupd_leader()
        return {
            "lookupdleader": leader.node_info() if leader is not None else None,
            "lookupdnodes": nodes,
        }

    def _topics(self, request: Request) -> dict[str, Any]:
        cluster = self.cluster
        if cluster.classic:
            names = list(dict.fromkeys(n for node in cluster.nodes for n in node.classic_topics))
            return {"topics": names}
        answer: dict[str, Any] = {"topics": list(cluster.topics)}
        if request.arg("metaInfo") == "true":
            answer["meta_info"] = [
                {
                    "topic_name": t.name,
                    "extend_support": t.ext,
                    "ordered": t.ordered,
                    "multi_part": t.multi_part,
                    "disable_channel_auto_create": t.disable_channel_auto_create,
                    "registered_channels": list(t.channel_names),
                }
                for t in cluster.topics.values()
            ]
        return answer

    def _channels(self, request: Request) -> dict[str, Any]:
        cluster = self.cluster
        name = self._topic_arg(request)
        if cluster.classic:
            channels: list[str] = []
            for node in cluster.nodes:
                log_ = node.classic_topics.get(name)
                if log_ is not None:
                    channels += [c for c in log_.channels if c not in channels]
            return {"channels": channels}
        topic = cluster.topics.get(name)
        if topic is None:
            return {"channels": []}
        partition = request.arg("partition")
        if partition is not None and partition != "*":
            try:
                part = topic.partitions.get(int(partition))
            except ValueError:
                raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION") from None
            return {"channels": list(part.log.channels) if part else []}
        return {"channels": list(topic.channel_names)}

    def _nodes(self, request: Request) -> dict[str, Any]:
        cluster = self.cluster
        producers = []
        for node in cluster.nodes:
            if not node.running:
                continue
            if cluster.classic:
                topics = list(node.classic_topics)
                producers.append(
                    {
                        "remote_address": f"{cluster.host}:{node.registration_port}",
                        "hostname": HOSTNAME,
                        "broadcast_address": cluster.host,
                        "tcp_port": node.tcp_port,
                        "http_port": node.http_port,
                        "version": CLASSIC_VERSION,
                        "tombstones": [False] * len(topics),
                        "topics": topics,
                    }
                )
                continue
            led: dict[str, list[str]] = {}
            for topic in cluster.topics.values():
                ids = [str(p.id) for p in topic.partitions.values() if p.leader == node.index]
                if ids:
                    led[topic.name] = ids
            peer = self._peer(node)
            del peer["id"], peer["distributed_id"]
            peer["tombstones"] = [False] * len(led)
            peer["topics"] = list(led)
            peer["partitions"] = led
            producers.append(peer)
        return {"producers": producers}

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise ApiError(400, "E_FAILED_ON_NOT_LEADER")

    def _topic_create(self, request: Request) -> Response:
        self._require_leader()
        name = self._topic_arg(request)
        if not _valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        partition_num = _int_arg(request, "partition_num", "TOPIC_PARTITION_NUM", 1, 255)
        replicator = _int_arg(request, "replicator", "TOPIC_REPLICATOR", 1, 5)
        if request.arg("suggestload") is not None:
            _int_arg(request, "suggestload", "TOPIC_LOAD_FACTOR", 0, 10000)
        ordered = request.arg("orderedmulti") == "true"
        multi_part = request.arg("multipart") == "true"
        ext = request.arg("extend") == "true"
        no_auto = request.arg("disable_channel_auto_create") == "true"
        self.cluster.create_topic_now(
            name,
            partitions=partition_num,
            replicas=replicator,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            disable_channel_auto_create=no_auto,
            strict_placement=True,
        )
        return Response(200, b"", content_type="application/json; charset=utf-8")

    def _disable_write(self, request: Request) -> Response:
        self._require_leader()
        kind = request.arg("type", "")
        self.cluster.write_disabled = kind if kind in ("all", "ordered") else ""
        return Response(200, b"", content_type="application/json; charset=utf-8")

    def _channel_create(self, request: Request) -> Response:
        self._require_leader()
        name = self._topic_arg(request)
        channel = request.arg("channel")
        if not channel:
            raise ApiError(400, "MISSING_ARG_CHANNEL")
        if not _valid_name(channel):
            raise ApiError(400, "INVALID_ARG_CHANNEL")
        if name not in self.cluster.topics:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        self.cluster.create_channel_now(name, channel)
        return Response(200, b"", content_type="application/json; charset=utf-8")

    # ------------------------------------------------------------------ classic

    def _classic_peer(self, node: NsqdNode) -> dict[str, Any]:
        host = self.cluster.host
        return {
            "remote_address": f"{host}:{node.registration_port}",
            "hostname": HOSTNAME,
            "broadcast_address": host,
            "tcp_port": node.tcp_port,
            "http_port": node.http_port,
            "version": CLASSIC_VERSION,
        }

    def _classic_lookup(self, request: Request) -> dict[str, Any]:
        name = self._topic_arg(request)
        producers = []
        channels: list[str] = []
        for node in self.cluster.nodes:
            log_ = node.classic_topics.get(name)
            if log_ is None or not node.running:
                continue
            producers.append(self._classic_peer(node))
            channels += [c for c in log_.channels if c not in channels]
        if not producers:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        return {"channels": channels, "producers": producers}

    _youzan_routes: dict[str, Any] = {}
    _classic_routes: dict[str, Any] = {}


def _int_arg(request: Request, name: str, code: str, low: int, high: int) -> int:
    text = request.arg(name)
    if text is None or text == "":
        raise ApiError(400, f"MISSING_ARG_{code}")
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"INVALID_ARG_{code}") from None
    if not low <= value <= high:
        raise ApiError(400, f"INVALID_ARG_{code}")
    return value


def _v1_error(error: ApiError) -> Response:
    from smartnsq.testing.http import json_response

    return json_response({"message": error.message}, error.status, v1_header=True)


_GET = ("GET",)
_POST = ("POST", "PUT")
LookupdNode._youzan_routes = {
    "/info": (_GET, LookupdNode._info, True),
    "/lookup": (_GET, LookupdNode._lookup, True),
    "/listlookup": (_GET, LookupdNode._listlookup, True),
    "/topics": (_GET, LookupdNode._topics, True),
    "/channels": (_GET, LookupdNode._channels, True),
    "/nodes": (_GET, LookupdNode._nodes, True),
    "/topic/create": (_POST, LookupdNode._topic_create, False),
    "/disable/write": (_POST, LookupdNode._disable_write, False),
    "/channel/create": (_POST, LookupdNode._channel_create, False),
}
LookupdNode._classic_routes = {
    "/info": (_GET, LookupdNode._info, True),
    "/lookup": (_GET, LookupdNode._classic_lookup, True),
    "/topics": (_GET, LookupdNode._topics, True),
    "/channels": (_GET, LookupdNode._channels, True),
    "/nodes": (_GET, LookupdNode._nodes, True),
}
