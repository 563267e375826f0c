"""nsqlookupd HTTP answers: envelopes, ``/lookup`` layouts, ``/listlookup`` nodes, and the merge
of several lookupds' answers (``nsqlookupd/http.go``: ``doLookup``, ``doListLookup``, in
nsqio/nsq v1.3.0 and youzan/nsq 0.3.7-HA.1.13.0). Pure parsing: no HTTP, no asyncio.

Flow: :func:`unwrap_response` turns (HTTP status, headers, body) into the JSON payload or a
:class:`LookupdHTTPError`; :func:`parse_lookup` and :func:`parse_listlookup` turn payloads into
typed, immutable values; :func:`merge_layouts` combines the layouts several lookupds gave.
Nothing here trusts the JSON types: a wrong type raises :class:`~smartnsq.errors.ProtocolError`
naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from smartnsq.errors import (
    LookupFailedError,
    NSQError,
    ProtocolError,
    TopicHasNoChannelError,
    TopicNotFoundError,
    ValidationError,
)
from smartnsq.protocol.identify import is_youzan_version

__all__ = [
    "ACCEPT_V1",
    "CONTENT_TYPE_V1",
    "Access",
    "LookupdHTTPError",
    "LookupdNode",
    "Node",
    "TopicLayout",
    "TopicMeta",
    "join_host_port",
    "merge_layouts",
    "parse_listlookup",
    "parse_lookup",
    "parse_node",
    "unwrap_response",
]

Access = Literal["r", "w"]

# Sent by both youzan SDKs; with it, Negotiate endpoints answer bare JSON
# (``internal/http_api/api_response.go``, ``NegotiateVersion``).
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
# The response header that marks a v1 (bare JSON) answer.
CONTENT_TYPE_V1 = "nsq; version=1.0"

# Classic nsqlookupd, any access mode.
TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
# youzan nsqlookupd, access=w of a topic etcd does not know (consistence.ErrKeyNotFound).
KEY_NOT_FOUND = "Key not found"
# youzan nsqlookupd, access=w of a topic whose partitions have no channel yet.
NO_CHANNEL_PREFIX = "Topic has no channel"

_PARTITION_ID_RE = re.compile(r"-?[0-9]+")
_MAX_PORT = 65535


# --------------------------------------------------------------------------- envelopes


@dataclass(frozen=True, slots=True)
class LookupdHTTPError:
    """An error answer nsqlookupd sent on purpose (as opposed to a broken or missing answer).

    ``status`` is the HTTP status of a v1 answer; legacy answers are always HTTP 500, so for
    them it is the envelope's ``status_code`` (also 500) and only ``message`` tells errors apart.
    """

    status: int
    message: str
    legacy: bool = False

    @property
    def topic_not_found(self) -> bool:
        """Classic ``TOPIC_NOT_FOUND`` or youzan ``Key not found`` (write lookup, unknown topic)."""
        text = self.message.strip()
        return text in (TOPIC_NOT_FOUND, KEY_NOT_FOUND)

    @property
    def topic_has_no_channel(self) -> bool:
        """youzan refuses a write lookup until the topic has a channel."""
        return self.message.strip().startswith(NO_CHANNEL_PREFIX)

    def to_exception(self, topic: str) -> NSQError:
        """The typed exception for this answer to a lookup of ``topic``."""
        if self.topic_not_found:
            return TopicNotFoundError(topic, self.message.strip())
        if self.topic_has_no_channel:
            return TopicHasNoChannelError(topic)
        return LookupFailedError(f"nsqlookupd answered HTTP {self.status}: {self.message}")

    def __str__(self) -> str:
        return f"HTTP {self.status} {self.message}"


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, val in headers.items():
        if key.lower() == lowered:
            return val
    return None


def _is_v1(headers: Mapping[str, str]) -> bool:
    value = _header(headers, "X-NSQ-Content-Type")
    if value is None:
        return False
    return value.replace(" ", "").lower() == CONTENT_TYPE_V1.replace(" ", "")


def _legacy_envelope(obj: object) -> tuple[int, str, object] | None:
    """(status_code, status_txt, data) when ``obj`` is the legacy wrapper, else None."""
    if not isinstance(obj, dict):
        return None
    code = obj.get("status_code")
    text = obj.get("status_txt")
    if type(code) is not int or not isinstance(text, str):
        return None
    data: object = obj.get("data")
    return code, text, data


def unwrap_response(status: int, headers: Mapping[str, str], body: bytes) -> object:
    """The JSON payload of an nsqlookupd answer, or a :class:`LookupdHTTPError`.

    Handles both envelopes: v1 (``X-NSQ-Content-Type: nsq; version=1.0``, or any bare JSON
    body) and the legacy ``{"status_code", "status_txt", "data"}`` wrapper. An empty 2xx body
    gives ``None`` (``/listlookup`` without an HA coordinator). Raises ProtocolError when the
    body is not an nsqlookupd answer at all (not JSON, or an error status without a message).
    """
    if not body.strip():
        if 200 <= status < 300:
            return None
        raise ProtocolError(f"nsqlookupd answered HTTP {status} with an empty body")
    try:
        obj: object = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(
            f"nsqlookupd answered HTTP {status} with a body that is not JSON: {body[:80]!r}"
        ) from exc
    if not _is_v1(headers):
        legacy = _legacy_envelope(obj)
        if legacy is not None:
            code, text, data = legacy
            if code == 200:
                return data
            return LookupdHTTPError(code, text, legacy=True)
    if 200 <= status < 300:
        return obj
    if isinstance(obj, dict):
        message = obj.get("message")
        if isinstance(message, str):
            return LookupdHTTPError(status, message)
    raise ProtocolError(
        f"nsqlookupd answered HTTP {status} without an error message: {body[:80]!r}"
    )


# --------------------------------------------------------------------------- field helpers


def _field(obj: Mapping[str, object], key: str, where: str) -> object:
    if key not in obj:
        raise ProtocolError(f"{where}: missing field {key!r}")
    return obj[key]


def _as_str(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string, not {type(value).__name__}")
    return value


def _as_int(value: object, name: str) -> int:
    if type(value) is not int:
        raise ProtocolError(f"{name} must be an integer, not {type(value).__name__}")
    return value


def _as_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be a boolean, not {type(value).__name__}")
    return value


def _as_port(value: object, name: str) -> int:
    return _check_port(_as_int(value, name), name)


def _check_port(port: int, name: str) -> int:
    if not 0 < port <= _MAX_PORT:
        raise ProtocolError(f"{name} must be 1..{_MAX_PORT}, got {port}")
    return port


def _as_object(value: object, name: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ProtocolError(f"{name} must be a JSON object, not {type(value).__name__}")
    return value


def _as_list(value: object, name: str) -> list[object]:
    """A JSON array; ``null`` (a nil Go slice) counts as empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(f"{name} must be a JSON array, not {type(value).__name__}")
    return value


def _optional_str(obj: Mapping[str, object], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    return _as_str(value, f"{where}.{key}")


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


# --------------------------------------------------------------------------- nsqd nodes


@dataclass(frozen=True, slots=True)
class Node:
    """An nsqd as nsqlookupd reports it (``PeerInfo``).

    Identity (equality, hash) is ``(broadcast_address, tcp_port)`` only: the ``id`` and
    ``remote_address`` of the same nsqd change whenever it reconnects to nsqlookupd
    (docs/protocol.md#node-ids-in-lookups), so they must not decide whether two answers name the
    same node.
    """

    broadcast_address: str
    tcp_port: int
    http_port: int = field(compare=False)
    version: str = field(compare=False)
    hostname: str = field(default="", compare=False)
    remote_address: str = field(default="", compare=False)
    distributed_id: str = field(default="", compare=False)
    # Set when a client's address map moved the node (smartnsq.routing.addresses): the HTTP
    # host when it differs from the TCP one, and the TCP address nsqlookupd announced.
    http_host: str = field(default="", compare=False)
    announced: str = field(default="", compare=False)

    @property
    def tcp_address(self) -> str:
        """``host:port`` for the TCP protocol (IPv6 hosts in brackets)."""
        return join_host_port(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        return join_host_port(self.http_host or self.broadcast_address, self.http_port)

    @property
    def is_youzan(self) -> bool:
        """A youzan HA nsqd, by its version (see ``identify.is_youzan_version``)."""
        return is_youzan_version(self.version)


def parse_node(value: object, where: str = "producer") -> Node:
    """Parse one ``PeerInfo`` object. Unknown keys (``id``, ``tombstones``...) are ignored."""
    obj = _as_object(value, where)
    address = _as_str(_field(obj, "broadcast_address", where), f"{where}.broadcast_address")
    if not address:
        raise ProtocolError(f"{where}.broadcast_address is empty")
    return Node(
        broadcast_address=address,
        tcp_port=_as_port(_field(obj, "tcp_port", where), f"{where}.tcp_port"),
        http_port=_as_port(_field(obj, "http_port", where), f"{where}.http_port"),
        version=_as_str(_field(obj, "version", where), f"{where}.version"),
        hostname=_optional_str(obj, "hostname", where),
        remote_address=_optional_str(obj, "remote_address", where),
        distributed_id=_optional_str(obj, "distributed_id", where),
    )


# --------------------------------------------------------------------------- topic layouts


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """The ``meta`` of a youzan lookup (``metainfo=true``, HA coordinator only).

    A topic that lives on old non-partitioned nsqd nodes gets a meta full of zeros: go-nsq calls
    a meta with ``partition_num <= 0`` invalid, see :attr:`valid`.
    """

    partition_num: int = 0
    replica: int = 0
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False

    @property
    def valid(self) -> bool:
        return self.partition_num > 0

    @classmethod
    def parse(cls, value: object) -> TopicMeta:
        obj = _as_object(value, "meta")

        def get_int(key: str) -> int:
            raw = obj.get(key)
            return 0 if raw is None else _as_int(raw, f"meta.{key}")

        def get_bool(key: str) -> bool:
            raw = obj.get(key)
            return False if raw is None else _as_bool(raw, f"meta.{key}")

        return cls(
            partition_num=get_int("partition_num"),
            replica=get_int("replica"),
            extend_support=get_bool("extend_support"),
            ordered=get_bool("ordered"),
            multi_part=get_bool("multi_part"),
            disable_channel_auto_create=get_bool("disable_channel_auto_create"),
        )


_EMPTY_PARTITIONS: Mapping[int, Node] = MappingProxyType({})


def _freeze_partitions(partitions: Mapping[int, Node]) -> Mapping[int, Node]:
    return MappingProxyType(dict(sorted(partitions.items())))


def _distinct(nodes: Iterable[Node]) -> tuple[Node, ...]:
    return tuple(dict.fromkeys(nodes))


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """Where a topic lives, for reading (``access="r"``) or writing (``"w"``).

    ``partitions`` maps each partition id to its LEADER node (sorted by id, read-only).
    ``classic_nodes`` are nsqd nodes to use without a partition: every producer of a classic
    nsqlookupd, or, on youzan, old non-HA nsqd nodes of a mixed cluster. A youzan node listed
    among the producers but leading no partition is NOT a classic node: after a failover the
    old leader stays listed, and publishing to it without a partition fails for good
    (E_TOPIC_NOT_EXIST). ``youzan`` says the answer came from a youzan nsqlookupd (it had a
    ``partitions`` key).
    """

    topic: str
    access: Access
    partitions: Mapping[int, Node] = field(default_factory=lambda: _EMPTY_PARTITIONS, hash=False)
    classic_nodes: tuple[Node, ...] = ()
    meta: TopicMeta | None = None
    channels: tuple[str, ...] = ()
    youzan: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, MappingProxyType) or list(self.partitions) != sorted(
            self.partitions
        ):
            object.__setattr__(self, "partitions", _freeze_partitions(self.partitions))

    @property
    def partition_num(self) -> int:
        """``meta.partition_num`` when valid, else the number of partitions listed (go-nsq)."""
        if self.meta is not None and self.meta.valid:
            return self.meta.partition_num
        return len(self.partitions)

    @property
    def ordered(self) -> bool:
        return self.meta is not None and self.meta.ordered

    @property
    def extend_support(self) -> bool:
        return self.meta is not None and self.meta.extend_support

    @property
    def is_classic(self) -> bool:
        """No partition and no valid meta: publish and subscribe without a partition."""
        return not self.partitions and (self.meta is None or not self.meta.valid)

    def leader(self, partition: int) -> Node | None:
        return self.partitions.get(partition)

    @property
    def partition_ids(self) -> tuple[int, ...]:
        return tuple(self.partitions)

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every distinct node: partition leaders by partition id, then classic nodes."""
        return _distinct((*self.partitions.values(), *self.classic_nodes))

    @property
    def empty(self) -> bool:
        """Nothing to connect to (yet)."""
        return not self.partitions and not self.classic_nodes


def _check_access(access: object) -> Access:
    if access == "r":
        return "r"
    if access == "w":
        return "w"
    raise ValidationError("access", f"must be 'r' or 'w', not {access!r}")


def _parse_partition_id(key: object) -> int:
    if not isinstance(key, str) or not _PARTITION_ID_RE.fullmatch(key):
        raise ProtocolError(f"partitions: key {key!r} is not a partition id")
    pid = int(key)
    if pid < 0:
        raise ProtocolError(f"partitions: negative partition id {pid}")
    return pid


def parse_lookup(topic: str, access: Access, payload: object) -> TopicLayout:
    """Parse a ``/lookup`` payload (already unwrapped) into a :class:`TopicLayout`.

    Works for classic answers (``channels`` + ``producers``) and youzan answers (plus
    ``partitions`` and, with ``metainfo``, ``meta``). Unknown keys are ignored.
    """
    checked_access = _check_access(access)
    obj = _as_object(payload, "lookup answer")
    producers_raw = _as_list(_field(obj, "producers", "lookup answer"), "producers")
    producers = _distinct(
        parse_node(item, f"producers[{i}]") for i, item in enumerate(producers_raw)
    )

    channels_raw = _as_list(obj.get("channels"), "channels")
    channels = tuple(_as_str(item, f"channels[{i}]") for i, item in enumerate(channels_raw))

    youzan = "partitions" in obj
    partitions: dict[int, Node] = {}
    if youzan:
        raw_partitions = obj["partitions"]
        if raw_partitions is not None:
            for key, value in _as_object(raw_partitions, "partitions").items():
                pid = _parse_partition_id(key)
                partitions[pid] = parse_node(value, f"partitions[{key}]")
        classic_nodes = tuple(node for node in producers if not node.is_youzan)
    else:
        classic_nodes = producers

    raw_meta = obj.get("meta")
    meta = None if raw_meta is None else TopicMeta.parse(raw_meta)

    return TopicLayout(
        topic=topic,
        access=checked_access,
        partitions=partitions,
        classic_nodes=classic_nodes,
        meta=meta,
        channels=channels,
        youzan=youzan,
    )


def merge_layouts(topic: str, access: Access, layouts: Sequence[TopicLayout]) -> TopicLayout:
    """Combine the layouts several lookupds gave, oldest answer first, freshest last.

    * nodes: the union (classic nodes in order of first appearance);
    * each partition: the leader most answers agree on; a tie goes to the leader named by the
      freshest answer among the tied ones. A partition missing from some answers is not a
      vote against it (a write lookup drops partitions it cannot serve right now);
    * ``meta``: from the freshest answer that has one; ``channels``: from the freshest answer
      that lists any.
    """
    checked_access = _check_access(access)
    if len(layouts) == 1:
        only = layouts[0]
        if only.topic == topic and only.access == checked_access:
            return only
    # pid -> node -> (votes, index of the freshest answer naming it, that answer's Node object)
    votes: dict[int, dict[Node, tuple[int, int, Node]]] = {}
    classic: list[Node] = []
    meta: TopicMeta | None = None
    channels: tuple[str, ...] = ()
    for index, layout in enumerate(layouts):
        for pid, node in layout.partitions.items():
            candidates = votes.setdefault(pid, {})
            count = candidates[node][0] if node in candidates else 0
            candidates[node] = (count + 1, index, node)
        classic.extend(layout.classic_nodes)
        if layout.meta is not None:
            meta = layout.meta
        if layout.channels:
            channels = layout.channels
    partitions = {
        pid: max(candidates.values(), key=lambda c: (c[0], c[1]))[2]
        for pid, candidates in votes.items()
    }
    return TopicLayout(
        topic=topic,
        access=checked_access,
        partitions=partitions,
        classic_nodes=_distinct(classic),
        meta=meta,
        channels=channels,
        youzan=any(layout.youzan for layout in layouts),
    )


# --------------------------------------------------------------------------- /listlookup


@dataclass(frozen=True, slots=True)
class LookupdNode:
    """One nsqlookupd of a youzan cluster, as ``/listlookup`` reports it.

    The JSON uses Go's default field names with ports as strings (``NodeIP``, ``HttpPort``...).
    Identity is ``(node_ip, http_port)``.
    """

    node_ip: str
    http_port: int
    tcp_port: int = field(default=0, compare=False)
    rpc_port: int = field(default=0, compare=False)
    node_id: str = field(default="", compare=False)
    epoch: int = field(default=0, compare=False)

    @property
    def http_address(self) -> str:
        return join_host_port(self.node_ip, self.http_port)


def _string_port(value: object, name: str, *, required: bool) -> int:
    if value is None or value == "":
        if required:
            raise ProtocolError(f"{name} is missing")
        return 0
    if type(value) is int:
        port = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        port = int(value)
    else:
        raise ProtocolError(f"{name} must be a port number, not {value!r}")
    return _check_port(port, name)


def _parse_lookupd_node(value: object, where: str) -> LookupdNode | None:
    obj = _as_object(value, where)
    node_ip = _optional_str(obj, "NodeIP", where)
    if not node_ip:
        return None  # Go zero value: no leader elected / unknown
    epoch_raw = obj.get("Epoch")
    return LookupdNode(
        node_ip=node_ip,
        http_port=_string_port(obj.get("HttpPort"), f"{where}.HttpPort", required=True),
        tcp_port=_string_port(obj.get("TcpPort"), f"{where}.TcpPort", required=False),
        rpc_port=_string_port(obj.get("RpcPort"), f"{where}.RpcPort", required=False),
        node_id=_optional_str(obj, "ID", where),
        epoch=0 if epoch_raw is None else _as_int(epoch_raw, f"{where}.Epoch"),
    )


def parse_listlookup(payload: object) -> tuple[LookupdNode | None, tuple[LookupdNode, ...]]:
    """Parse a ``/listlookup`` payload into (leader or None, distinct lookupd nodes).

    ``None`` (empty v1 body, or legacy ``data: null``: no HA coordinator) gives no nodes.
    """
    if payload is None:
        return None, ()
    obj = _as_object(payload, "listlookup answer")
    raw_nodes = _as_list(obj.get("lookupdnodes"), "lookupdnodes")
    parsed = (_parse_lookupd_node(item, f"lookupdnodes[{i}]") for i, item in enumerate(raw_nodes))
    nodes = tuple(dict.fromkeys(node for node in parsed if node is not None))
    raw_leader = obj.get("lookupdleader")
    leader = None if raw_leader is None else _parse_lookupd_node(raw_leader, "lookupdleader")
    return leader, nodes
