"""Address mapping: from the addresses nsqlookupd announces to the ones this client can reach.

nsqd registers its ``--broadcast-address`` (by default its hostname; on youzan, the address of
``--broadcast-interface``) with its own listening ports, and nsqlookupd hands exactly that to
clients. Behind Docker, NAT or a port forward, those are a container's name or address and
port, which a client elsewhere cannot reach (nsqio/nsq#1453). Kafka clients solve the same
problem by mapping advertised listeners; an :class:`AddressMap` does it for NSQ: every nsqd
address a lookup returns (TCP and HTTP) and every nsqlookupd address ``/listlookup`` returns
goes through it before anything connects.

Pure: no I/O. Used by the lookup manager (:mod:`smartnsq.transport.lookup`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Union

from smartnsq.errors import ValidationError
from smartnsq.protocol.lookupd import LookupdNode, Node, TopicLayout, join_host_port

__all__ = ["AddressMap", "AddressMapping", "AddressResolver", "split_host_port"]

#: A function from an announced ``"host:port"`` to the ``"host:port"`` to connect to (return
#: the argument unchanged to keep it).
AddressResolver = Callable[[str], str]
#: What ``address_map=`` accepts.
AddressMapping = Union[Mapping[str, str], AddressResolver, "AddressMap"]

_FIELD = "address_map"


def split_host_port(address: object, field: str = "address", what: str = "") -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port), surrounding spaces ignored.

    The one host:port parser of the client (connections, ``nsqd=[...]``, the CLI, address
    maps). A host with spaces, slashes or brackets, or a port outside 1..65535, raises
    ValidationError naming ``field``; ``what`` says which value it was, when the field holds
    several."""
    shown = f"{what} {address!r}" if what else repr(address)
    if not isinstance(address, str) or ":" not in address:
        raise ValidationError(field, f"{shown}: expected 'host:port'")
    host, _, port_text = address.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or any(c.isspace() for c in host) or "/" in host or "[" in host:
        raise ValidationError(field, f"{shown}: expected 'host:port'")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise ValidationError(field, f"{shown}: the port must be 1..65535")
    return host, int(port_text)


def _key(host: str, port: int) -> str:
    # Host names compare case-insensitively, as DNS does.
    return join_host_port(host.lower(), port)


class AddressMap:
    """Translates announced ``host:port`` addresses; ``address_map=`` of the clients.

    ``AddressMap({"nsqd0:4150": "127.0.0.1:32768", "nsqd0:4151": "127.0.0.1:32769"})``
    maps exact addresses (host names case-insensitively); addresses it does not name are
    used as announced. ``AddressMap(resolver)`` calls ``resolver("host:port")`` for every
    address and connects to what it returns, which suits addresses that change (a container
    restarted on new ports). Mapping entries are checked when the map is built, a resolver's
    answers when they are used: either way a ``ValidationError`` names the bad address
    before anything connects to it. ``AddressMap(None)`` maps nothing.
    """

    __slots__ = ("_resolver", "_table")

    def __init__(self, mapping: AddressMapping | None = None) -> None:
        self._table: dict[str, tuple[str, int]] = {}
        self._resolver: AddressResolver | None = None
        if mapping is None:
            return
        if isinstance(mapping, AddressMap):
            self._table = dict(mapping._table)
            self._resolver = mapping._resolver
        elif isinstance(mapping, Mapping):
            for source, target in mapping.items():
                self._table[_key(*split_host_port(source, _FIELD, "key"))] = split_host_port(
                    target, _FIELD, f"value of {source!r}"
                )
        elif callable(mapping):
            self._resolver = mapping
        else:
            raise ValidationError(
                _FIELD,
                "expected a dict {'host:port': 'host:port'} or a function "
                f"(address) -> address, not {type(mapping).__name__}",
            )

    @classmethod
    def of(cls, mapping: AddressMapping | None) -> AddressMap:
        """``mapping`` as an AddressMap (itself when it is one already)."""
        return mapping if isinstance(mapping, AddressMap) else cls(mapping)

    def __bool__(self) -> bool:
        """False when the map changes nothing (the clients then skip it)."""
        return bool(self._table) or self._resolver is not None

    def __repr__(self) -> str:
        if self._resolver is not None:
            return f"AddressMap({self._resolver!r})"
        shown = {k: join_host_port(*v) for k, v in self._table.items()}
        return f"AddressMap({shown!r})"

    def target(self, host: str, port: int) -> tuple[str, int]:
        """Where to connect for the announced ``host``/``port``."""
        if self._resolver is not None:
            announced = join_host_port(host, port)
            answer = self._resolver(announced)
            return split_host_port(answer, _FIELD, f"the resolver's answer for {announced!r}:")
        return self._table.get(_key(host, port), (host, port))

    def resolve(self, address: str) -> str:
        """``"host:port"`` -> the ``"host:port"`` to connect to."""
        return join_host_port(*self.target(*split_host_port(address, _FIELD)))

    def node(self, node: Node) -> Node:
        """The nsqd ``node`` with its TCP and HTTP addresses mapped (the same object when
        neither changes). The mapped node remembers the TCP address it was announced with."""
        announced_http_host = node.http_host or node.broadcast_address
        tcp_host, tcp_port = self.target(node.broadcast_address, node.tcp_port)
        http_host, http_port = self.target(announced_http_host, node.http_port)
        tcp_same = (tcp_host, tcp_port) == (node.broadcast_address, node.tcp_port)
        if tcp_same and (http_host, http_port) == (announced_http_host, node.http_port):
            return node
        return dataclasses.replace(
            node,
            broadcast_address=tcp_host,
            tcp_port=tcp_port,
            http_port=http_port,
            http_host="" if http_host == tcp_host else http_host,
            announced=node.announced or node.tcp_address,
        )

    def layout(self, layout: TopicLayout) -> TopicLayout:
        """A lookup answer with every node mapped."""
        if not self:
            return layout
        return dataclasses.replace(
            layout,
            partitions={pid: self.node(node) for pid, node in layout.partitions.items()},
            classic_nodes=tuple(dict.fromkeys(self.node(n) for n in layout.classic_nodes)),
        )

    def lookupd(self, node: LookupdNode) -> LookupdNode:
        """An nsqlookupd listed by ``/listlookup`` with its HTTP address mapped."""
        host, port = self.target(node.node_ip, node.http_port)
        if (host, port) == (node.node_ip, node.http_port):
            return node
        return dataclasses.replace(node, node_ip=host, http_port=port)
