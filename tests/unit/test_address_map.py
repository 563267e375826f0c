"""AddressMap: the translation of announced nsqd/nsqlookupd addresses (pure)."""

from __future__ import annotations

import pytest

from smartnsq.errors import ValidationError
from smartnsq.protocol.lookupd import LookupdNode, Node, TopicLayout
from smartnsq.routing.addresses import AddressMap, split_host_port

NODE = Node("nsqd0", 4150, 4151, "0.3.7-HA.1.13.0", hostname="nsqd0")


def test_split_host_port() -> None:
    assert split_host_port("nsqd0:4150") == ("nsqd0", 4150)
    assert split_host_port("[::1]:4150") == ("::1", 4150)
    assert split_host_port(" 10.0.0.7:1 ") == ("10.0.0.7", 1)


@pytest.mark.parametrize(
    "bad", ["nsqd0", "nsqd0:", ":4150", "nsqd0:0", "nsqd0:65536", "nsqd0:41x", "a b:1", 4150, None]
)
def test_bad_addresses_are_refused_when_the_map_is_built(bad: object) -> None:
    with pytest.raises(ValidationError) as as_key:
        AddressMap({bad: "127.0.0.1:1"})  # type: ignore[dict-item]
    assert as_key.value.field == "address_map"
    with pytest.raises(ValidationError) as as_value:
        AddressMap({"nsqd0:4150": bad})  # type: ignore[dict-item]
    assert "value of 'nsqd0:4150'" in str(as_value.value)


def test_other_types_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"a dict .* or a function"):
        AddressMap(["nsqd0:4150=127.0.0.1:1"])  # type: ignore[arg-type]


def test_dict_maps_exact_addresses_and_leaves_the_rest() -> None:
    mapping = AddressMap({"NSQD0:4150": "127.0.0.1:32768"})
    assert mapping
    assert mapping.resolve("nsqd0:4150") == "127.0.0.1:32768"  # host names: any case
    assert mapping.resolve("nsqd0:4151") == "nsqd0:4151"
    assert mapping.resolve("nsqd1:4150") == "nsqd1:4150"
    assert not AddressMap(None)
    assert not AddressMap({})


def test_ipv6_keys_and_targets() -> None:
    mapping = AddressMap({"[fd00::7]:4150": "[::1]:32768"})
    assert mapping.resolve("[fd00::7]:4150") == "[::1]:32768"


def test_node_tcp_and_http_are_mapped_separately() -> None:
    mapping = AddressMap({"nsqd0:4150": "127.0.0.1:32768", "nsqd0:4151": "127.0.0.1:32769"})
    node = mapping.node(NODE)
    assert node.tcp_address == "127.0.0.1:32768"
    assert node.http_address == "127.0.0.1:32769"
    assert node.announced == "nsqd0:4150"
    assert node.version == NODE.version
    assert node.hostname == "nsqd0"


def test_node_http_on_another_host() -> None:
    mapping = AddressMap({"nsqd0:4150": "127.0.0.1:32768", "nsqd0:4151": "gateway:8080"})
    node = mapping.node(NODE)
    assert node.tcp_address == "127.0.0.1:32768"
    assert node.http_address == "gateway:8080"
    # Only the TCP address mapped: HTTP stays on the announced host.
    only_tcp = AddressMap({"nsqd0:4150": "127.0.0.1:32768"}).node(NODE)
    assert only_tcp.http_address == "nsqd0:4151"


def test_unmapped_node_is_the_same_object() -> None:
    assert AddressMap({"other:1": "127.0.0.1:2"}).node(NODE) is NODE


def test_layout_partitions_and_classic_nodes() -> None:
    other = Node("nsqd1", 4150, 4151, "1.3.0")
    layout = TopicLayout("t", "w", partitions={0: NODE, 1: other}, classic_nodes=(other,))
    mapping = AddressMap({"nsqd0:4150": "127.0.0.1:1", "nsqd1:4150": "127.0.0.1:2"})
    mapped = mapping.layout(layout)
    assert {p: n.tcp_address for p, n in mapped.partitions.items()} == {
        0: "127.0.0.1:1",
        1: "127.0.0.1:2",
    }
    assert [n.tcp_address for n in mapped.classic_nodes] == ["127.0.0.1:2"]
    assert AddressMap().layout(layout) is layout


def test_lookupd_nodes() -> None:
    lookupd = LookupdNode("nsqlookupd0", 4161, tcp_port=4160)
    mapped = AddressMap({"nsqlookupd0:4161": "127.0.0.1:32770"}).lookupd(lookupd)
    assert mapped.http_address == "127.0.0.1:32770"
    assert mapped.tcp_port == 4160


def test_resolver_sees_each_announced_address() -> None:
    seen: list[str] = []

    def resolver(address: str) -> str:
        seen.append(address)
        port = address.rpartition(":")[2]
        return f"127.0.0.1:{int(port) + 30000}"

    node = AddressMap(resolver).node(NODE)
    assert seen == ["nsqd0:4150", "nsqd0:4151"]
    assert (node.tcp_address, node.http_address) == ("127.0.0.1:34150", "127.0.0.1:34151")


@pytest.mark.parametrize("answer", [None, "nowhere", "127.0.0.1:0", 4150])
def test_resolver_answers_are_checked(answer: object) -> None:
    mapping = AddressMap(lambda address: answer)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValidationError) as caught:
        mapping.node(NODE)
    assert "the resolver's answer for 'nsqd0:4150'" in str(caught.value)


def test_an_address_map_is_accepted_as_its_own_argument() -> None:
    mapping = AddressMap({"nsqd0:4150": "127.0.0.1:1"})
    assert AddressMap.of(mapping) is mapping
    assert AddressMap(mapping).resolve("nsqd0:4150") == "127.0.0.1:1"
