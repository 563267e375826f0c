"""nsqlookupd answers -> typed layouts, checked against answers recorded from real servers."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from smartnsq.errors import (
    LookupFailedError,
    ProtocolError,
    TopicHasNoChannelError,
    TopicNotFoundError,
    ValidationError,
)
from smartnsq.protocol.lookupd import (
    LookupdHTTPError,
    LookupdNode,
    Node,
    TopicLayout,
    TopicMeta,
    merge_layouts,
    parse_listlookup,
    parse_lookup,
    parse_node,
    unwrap_response,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lookupd"
V1_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0"}


@cache
def index() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads((FIXTURES / "index.json").read_text())
    return data


def answer(name: str, *, with_header: bool = True) -> object:
    """Unwrap a recorded answer the way the client receives it (status + headers + body)."""
    entry = index()[name]
    headers = V1_HEADERS if entry["envelope"] == "v1" and with_header else {}
    return unwrap_response(entry["status"], headers, (FIXTURES / name).read_bytes())


def layout(name: str, topic: str = "t", access: str = "r") -> TopicLayout:
    payload = answer(name)
    assert not isinstance(payload, LookupdHTTPError), payload
    return parse_lookup(topic, access, payload)  # type: ignore[arg-type]


def leader_ports(lay: TopicLayout) -> dict[int, int]:
    return {pid: node.tcp_port for pid, node in lay.partitions.items()}


def both(base: str) -> list[str]:
    return [f"{base}.v1.json", f"{base}.default.json"]


# --------------------------------------------------------------------------- fixtures sanity


def test_index_covers_every_fixture() -> None:
    files = {p.name for p in FIXTURES.glob("*.json")} - {"index.json"}
    assert files == set(index())
    assert len(files) == 56


# --------------------------------------------------------------------------- envelopes


@pytest.mark.parametrize(
    "base",
    [
        "nsqlookupd_lookup_ptest",
        "nsqlookupd_lookup_ptest_access_r",
        "nsqlookupd_lookup_ptest_access_w_metainfo",
        "nsqlookupd_lookup_otest_access_w_metainfo",
        "nsqlookupd_lookup_etest_access_r_metainfo",
        "nsqlookupd_lookup_ptest_partition_1",
        "nsqlookupd_lookup_nonexistent",
        "nsqlookupd_lookup_no_channel_yet_access_r",
        "nsqlookupd_lookup_no_channel_yet_no_access_arg",
    ],
)
def test_both_envelopes_give_the_same_layout(base: str) -> None:
    v1, legacy = (layout(name) for name in both(base))
    assert v1 == legacy
    # A bare JSON body is v1 even without the X-NSQ-Content-Type header.
    bare = answer(f"{base}.v1.json", with_header=False)
    assert parse_lookup("t", "r", bare) == v1


def test_legacy_envelope_is_unwrapped() -> None:
    payload = answer("nsqlookupd_lookup_ptest.default.json")
    assert isinstance(payload, dict)
    assert set(payload) == {"channels", "partitions", "producers"}


def test_v1_header_is_case_insensitive() -> None:
    body = (FIXTURES / "nsqlookupd_lookup_ptest.v1.json").read_bytes()
    payload = unwrap_response(200, {"x-nsq-content-type": "nsq;version=1.0"}, body)
    assert isinstance(payload, dict)
    assert "producers" in payload


@pytest.mark.parametrize(
    ("name", "status", "legacy", "exception"),
    [
        (
            "nsqlookupd_lookup_nonexistent_access_w_metainfo.v1.json",
            404,
            False,
            TopicNotFoundError,
        ),
        (
            "nsqlookupd_lookup_nonexistent_access_w_metainfo.default.json",
            500,
            True,
            TopicNotFoundError,
        ),
        ("nsqlookupd_lookup_no_channel_yet_access_w.v1.json", 404, False, TopicHasNoChannelError),
        (
            "nsqlookupd_lookup_no_channel_yet_access_w.default.json",
            500,
            True,
            TopicHasNoChannelError,
        ),
        (
            "nsqlookupd_lookup_no_channel_yet_access_w_metainfo.v1.json",
            404,
            False,
            TopicHasNoChannelError,
        ),
        (
            "nsqlookupd_lookup_no_channel_yet_access_w_metainfo.default.json",
            500,
            True,
            TopicHasNoChannelError,
        ),
        ("nsqlookupd_lookup_missing_topic_arg.v1.json", 400, False, LookupFailedError),
        ("nsqlookupd_lookup_missing_topic_arg.default.json", 500, True, LookupFailedError),
        ("nsqlookupd_lookup_bad_access.v1.json", 400, False, LookupFailedError),
        ("nsqlookupd_lookup_bad_access.default.json", 500, True, LookupFailedError),
    ],
)
def test_error_answers(name: str, status: int, legacy: bool, exception: type[Exception]) -> None:
    err = answer(name)
    assert isinstance(err, LookupdHTTPError)
    assert err.status == status
    assert err.legacy is legacy
    exc = err.to_exception("ptest")
    assert type(exc) is exception
    if isinstance(exc, (TopicNotFoundError, TopicHasNoChannelError)):
        assert exc.topic == "ptest"
    assert err.topic_not_found is (exception is TopicNotFoundError)
    assert err.topic_has_no_channel is (exception is TopicHasNoChannelError)


def test_error_messages_are_kept() -> None:
    err = answer("nsqlookupd_lookup_nonexistent_access_w_metainfo.v1.json")
    assert isinstance(err, LookupdHTTPError)
    assert err.message == "Key not found"
    assert "Key not found" in str(err.to_exception("nope"))
    no_channel = answer("nsqlookupd_lookup_no_channel_yet_access_w.v1.json")
    assert isinstance(no_channel, LookupdHTTPError)
    assert "start a consumer first" in str(no_channel.to_exception("ptest"))
    bad = answer("nsqlookupd_lookup_bad_access.default.json")
    assert isinstance(bad, LookupdHTTPError)
    assert "INVALID_ACCESS_MODE" in str(bad.to_exception("ptest"))


def test_classic_topic_not_found() -> None:
    # classic nsqlookupd: 404 TOPIC_NOT_FOUND (v1) or 500 in the legacy envelope
    v1 = unwrap_response(404, V1_HEADERS, b'{"message":"TOPIC_NOT_FOUND"}')
    legacy = unwrap_response(
        500, {}, b'{"status_code":404,"status_txt":"TOPIC_NOT_FOUND","data":null}'
    )
    for err in (v1, legacy):
        assert isinstance(err, LookupdHTTPError)
        assert err.topic_not_found
        assert isinstance(err.to_exception("t"), TopicNotFoundError)


# --------------------------------------------------------------------------- youzan layouts


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_ptest"))
def test_ptest_without_metainfo(name: str) -> None:
    lay = layout(name, "ptest")
    assert lay.topic == "ptest"
    assert lay.youzan
    assert leader_ports(lay) == {0: 24520, 1: 24540}
    assert lay.partition_ids == (0, 1)
    assert lay.meta is None  # no metainfo asked, no meta given
    assert lay.partition_num == 2  # go-nsq's fallback: len(partitions)
    assert lay.channels == ("init",)
    assert lay.classic_nodes == ()
    assert not lay.is_classic
    assert not lay.empty
    assert not lay.ordered
    assert not lay.extend_support
    assert [n.tcp_address for n in lay.nodes] == ["127.0.0.1:24520", "127.0.0.1:24540"]
    leader = lay.leader(1)
    assert leader is not None
    assert leader.http_address == "127.0.0.1:24541"
    assert leader.hostname == "vm"
    assert leader.version == "0.3.7-HA.1.13.0"
    assert leader.distributed_id == "127.0.0.1:24542:24540:4"
    assert leader.remote_address == "127.0.0.1:36086"
    assert leader.is_youzan
    assert lay.leader(2) is None


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_ptest_access_w_metainfo"))
def test_ptest_write_with_meta(name: str) -> None:
    lay = layout(name, "ptest", "w")
    assert lay.access == "w"
    assert leader_ports(lay) == {0: 24520, 1: 24540}
    assert lay.meta == TopicMeta(partition_num=2, replica=2)
    assert lay.partition_num == 2
    assert not lay.ordered
    assert not lay.extend_support


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_otest_access_w_metainfo"))
def test_otest_ordered(name: str) -> None:
    lay = layout(name, "otest", "w")
    assert leader_ports(lay) == {0: 24540, 1: 24510, 2: 24520, 3: 24530}
    assert lay.meta == TopicMeta(partition_num=4, replica=2, ordered=True)
    assert lay.ordered
    assert not lay.extend_support
    assert lay.partition_num == 4
    assert len(lay.nodes) == 4


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_etest_access_r_metainfo"))
def test_etest_ext(name: str) -> None:
    lay = layout(name, "etest")
    assert leader_ports(lay) == {0: 24520, 1: 24540}
    assert lay.meta == TopicMeta(partition_num=2, replica=2, extend_support=True)
    assert lay.extend_support
    assert not lay.ordered


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_ptest_partition_1"))
def test_single_partition_lookup(name: str) -> None:
    lay = layout(name, "ptest")
    assert leader_ports(lay) == {1: 24540}
    assert lay.partition_ids == (1,)
    assert lay.partition_num == 1


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_nonexistent"))
def test_nonexistent_topic_read_is_an_empty_layout(name: str) -> None:
    lay = layout(name, "no_such_topic")
    assert lay.youzan
    assert lay.empty
    assert lay.partitions == {}
    assert lay.classic_nodes == ()
    assert lay.nodes == ()
    assert lay.channels == ()
    assert lay.partition_num == 0
    assert lay.is_classic


@pytest.mark.parametrize("name", both("nsqlookupd_lookup_no_channel_yet_access_r"))
def test_read_lookup_before_any_channel(name: str) -> None:
    lay = layout(name, "ptest")
    assert leader_ports(lay) == {0: 24520, 1: 24540}
    assert lay.channels == ()


def test_write_lookup_after_channel_create() -> None:
    lay = layout("nsqlookupd_lookup_no_channel_yet_after_channel_create.v1.json", "ptest", "w")
    assert leader_ports(lay) == {0: 24520, 1: 24540}
    assert lay.channels == ("init",)


# --------------------------------------------------------------------------- failover answers


def test_failover_sigterm_old_leader_is_not_a_classic_node() -> None:
    before = layout("leader_change_r3test_p0_SIGTERM_w_before.v1.json", "r3test", "w")
    assert leader_ports(before) == {0: 24510}
    after = layout("leader_change_r3test_p0_SIGTERM_w_after_failover.v1.json", "r3test", "w")
    assert leader_ports(after) == {0: 24520}
    # nsqd1 (24510), the old leader, is still listed among the producers...
    payload = answer("leader_change_r3test_p0_SIGTERM_w_after_failover.v1.json")
    assert isinstance(payload, dict)
    ports = {p["tcp_port"] for p in payload["producers"]}
    assert ports == {24510, 24520}
    # ...but it leads nothing and is an HA node: never a target without a partition.
    assert after.classic_nodes == ()
    assert [n.tcp_port for n in after.nodes] == [24520]
    assert after.meta == TopicMeta(partition_num=1, replica=3)
    assert after.channels == ("init", "chlc")
    assert after != before

    read = layout("leader_change_r3test_p0_SIGTERM_r_after_failover.v1.json", "r3test")
    assert leader_ports(read) == {0: 24520}
    assert read.classic_nodes == ()

    rejoined = layout("leader_change_r3test_p0_SIGTERM_w_after_rejoin.v1.json", "r3test", "w")
    assert rejoined == after  # same leader and channels; only producers changed


def test_failover_sigkill_new_leader_reconnected() -> None:
    before = layout("leader_change_r3test_p0_SIGKILL_w_before.v1.json", "r3test", "w")
    after = layout("leader_change_r3test_p0_SIGKILL_w_after_failover.v1.json", "r3test", "w")
    assert leader_ports(before) == {0: 24520}
    assert leader_ports(after) == {0: 24510}
    leader = after.leader(0)
    assert leader is not None
    # nsqd1 reconnected to lookupd: new id/remote_address, same node.
    assert leader.remote_address == "127.0.0.1:43210"
    otest = layout("nsqlookupd_lookup_otest_access_w_metainfo.v1.json", "otest", "w")
    earlier = otest.leader(1)
    assert earlier is not None
    assert earlier.remote_address == "127.0.0.1:36058"
    assert leader == earlier
    assert hash(leader) == hash(earlier)


def test_failover_partial_write_layout() -> None:
    # ptest-0 lost its leader: the write lookup drops the partition, meta still says 2.
    after = layout("leader_change_ptest_p0_SIGKILL_w_after_failover.v1.json", "ptest", "w")
    assert leader_ports(after) == {1: 24540}
    assert after.partition_num == 2
    assert after.leader(0) is None
    assert not after.is_classic
    read = layout("leader_change_ptest_p0_SIGKILL_r_after_failover.v1.json", "ptest")
    assert leader_ports(read) == {0: 24520, 1: 24540}
    rejoined = layout("leader_change_ptest_p0_SIGKILL_w_after_rejoin.v1.json", "ptest", "w")
    assert leader_ports(rejoined) == {0: 24520, 1: 24540}
    assert len(rejoined.channels) == 6


# --------------------------------------------------------------------------- classic


def test_classic_lookupd() -> None:
    lay = layout("classic_nsqlookupd_lookup_t1.json", "t1")
    assert not lay.youzan
    assert lay.is_classic
    assert not lay.empty
    assert lay.partitions == {}
    assert lay.meta is None
    assert lay.partition_num == 0
    assert [n.tcp_address for n in lay.classic_nodes] == ["127.0.0.1:14150"]
    assert lay.nodes == lay.classic_nodes
    node = lay.classic_nodes[0]
    assert node.version == "1.3.0"
    assert not node.is_youzan
    assert node.distributed_id == ""
    assert node.http_address == "127.0.0.1:14151"


def test_classic_lookupd_youzan_producers_are_still_classic() -> None:
    # A classic lookupd (no partitions key) answers: every producer is used without partition.
    node = {
        "broadcast_address": "10.0.0.1",
        "tcp_port": 4150,
        "http_port": 4151,
        "version": "0.3.7-HA.1.13.0",
    }
    lay = parse_lookup("t", "r", {"channels": [], "producers": [node]})
    assert [n.tcp_port for n in lay.classic_nodes] == [4150]


def test_mixed_cluster_keeps_old_nsqd_as_classic_node() -> None:
    ha = {"broadcast_address": "10.0.0.1", "tcp_port": 4150, "http_port": 4151}
    old = {"broadcast_address": "10.0.0.2", "tcp_port": 4150, "http_port": 4151}
    payload = {
        "channels": ["c"],
        "partitions": {"0": {**ha, "version": "0.3.7-HA.1.13.0"}},
        "producers": [{**ha, "version": "0.3.7-HA.1.13.0"}, {**old, "version": "0.3.7"}],
    }
    lay = parse_lookup("t", "w", payload)
    assert [n.broadcast_address for n in lay.classic_nodes] == ["10.0.0.2"]
    assert [n.broadcast_address for n in lay.nodes] == ["10.0.0.1", "10.0.0.2"]
    assert not lay.is_classic


def test_old_nsqd_topic_with_zero_meta_is_classic() -> None:
    # metainfo on a topic that only old nsqd nodes carry: lookupd sends a meta of zeros.
    payload = {
        "channels": [],
        "meta": {"partition_num": 0, "replica": 0, "extend_support": False},
        "partitions": {},
        "producers": [
            {"broadcast_address": "h", "tcp_port": 4150, "http_port": 4151, "version": "0.3.7"}
        ],
    }
    lay = parse_lookup("t", "w", payload)
    assert lay.meta == TopicMeta()
    assert lay.meta is not None
    assert not lay.meta.valid
    assert lay.is_classic
    assert lay.partition_num == 0


# --------------------------------------------------------------------------- model details


def test_node_identity_ignores_volatile_fields() -> None:
    a = Node("h", 4150, 4151, "v1", remote_address="h:1", distributed_id="x")
    b = Node("h", 4150, 9999, "v2", remote_address="h:2", distributed_id="y")
    assert a == b
    assert hash(a) == hash(b)
    assert a != Node("h", 4151, 4151, "v1")
    assert a != Node("g", 4150, 4151, "v1")


def test_ipv6_addresses_are_bracketed() -> None:
    node = Node("::1", 4150, 4151, "1.3.0")
    assert node.tcp_address == "[::1]:4150"
    assert node.http_address == "[::1]:4151"
    assert LookupdNode("fe80::1", 4161).http_address == "[fe80::1]:4161"


def test_layout_partitions_are_sorted_and_read_only() -> None:
    n0, n1 = Node("a", 1, 2, "x"), Node("b", 1, 2, "x")
    lay = TopicLayout("t", "w", {3: n1, 0: n0})
    assert lay.partition_ids == (0, 3)
    assert isinstance(lay.partitions, MappingProxyType)
    with pytest.raises(TypeError):
        lay.partitions[5] = n0  # type: ignore[index]
    assert lay == TopicLayout("t", "w", {0: n0, 3: n1})
    assert hash(lay) == hash(TopicLayout("t", "w", {0: n0, 3: n1}))


def test_layout_defaults() -> None:
    lay = TopicLayout("t", "r")
    assert lay.empty
    assert lay.is_classic
    assert lay.partitions == {}
    assert lay.partition_num == 0


def test_meta_missing_keys_default() -> None:
    # Older youzan lookupds sent only these three keys.
    meta = TopicMeta.parse({"partition_num": 3, "replica": 2, "extend_support": False})
    assert meta == TopicMeta(partition_num=3, replica=2)
    assert TopicMeta.parse({}) == TopicMeta()


def test_unknown_keys_and_nulls_are_tolerated() -> None:
    payload = {
        "channels": None,
        "partitions": None,
        "producers": None,
        "meta": None,
        "future": {"anything": [1, 2]},
    }
    lay = parse_lookup("t", "r", payload)
    assert lay.empty
    assert lay.youzan
    node = parse_node(
        {
            "broadcast_address": "h",
            "tcp_port": 1,
            "http_port": 2,
            "version": "1",
            "tombstones": [False],
            "new": 1,
        }
    )
    assert node.tcp_port == 1


def test_duplicate_producers_are_merged() -> None:
    p = {"broadcast_address": "h", "tcp_port": 1, "http_port": 2, "version": "1.3.0"}
    lay = parse_lookup("t", "r", {"producers": [p, {**p, "remote_address": "h:9"}]})
    assert len(lay.classic_nodes) == 1


def test_access_is_validated() -> None:
    with pytest.raises(ValidationError):
        parse_lookup("t", "x", {"producers": []})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- /listlookup


@pytest.mark.parametrize(
    "name", ["nsqlookupd_listlookup.v1.json", "nsqlookupd_listlookup.default.json"]
)
def test_listlookup(name: str) -> None:
    leader, nodes = parse_listlookup(answer(name))
    expected = LookupdNode(
        node_ip="127.0.0.1",
        http_port=24161,
        tcp_port=24160,
        rpc_port=24260,
        node_id="127.0.0.1:24260:24160:nsqlookup",
        epoch=0,
    )
    assert leader == expected
    assert leader is not None
    assert (leader.tcp_port, leader.rpc_port, leader.node_id) == (24160, 24260, expected.node_id)
    assert nodes == (expected,)
    assert nodes[0].http_address == "127.0.0.1:24161"


def test_listlookup_without_coordinator() -> None:
    # v1: empty body; legacy: data null.
    assert parse_listlookup(unwrap_response(200, V1_HEADERS, b"")) == (None, ())
    legacy = unwrap_response(200, {}, b'{"status_code":200,"status_txt":"OK","data":null}')
    assert legacy is None
    assert parse_listlookup(legacy) == (None, ())


def test_listlookup_leader_unknown_and_int_ports() -> None:
    payload = {
        "lookupdleader": {"ID": "", "NodeIP": "", "TcpPort": "", "HttpPort": "", "Epoch": 0},
        "lookupdnodes": [
            {"ID": "a", "NodeIP": "10.0.0.1", "HttpPort": 4161},
            {"ID": "b", "NodeIP": "10.0.0.2", "HttpPort": "4161", "TcpPort": "4160"},
            {"ID": "a2", "NodeIP": "10.0.0.1", "HttpPort": "4161"},
        ],
    }
    leader, nodes = parse_listlookup(payload)
    assert leader is None
    assert [n.http_address for n in nodes] == ["10.0.0.1:4161", "10.0.0.2:4161"]


# --------------------------------------------------------------------------- merge


def _node(port: int, remote: str = "") -> Node:
    return Node("127.0.0.1", port, port + 1, "0.3.7-HA.1.13.0", remote_address=remote)


def test_merge_majority_wins() -> None:
    a = TopicLayout("t", "w", {0: _node(1), 1: _node(2)})
    b = TopicLayout("t", "w", {0: _node(1), 1: _node(3)})
    c = TopicLayout("t", "w", {0: _node(9), 1: _node(2)})
    merged = merge_layouts("t", "w", [a, b, c])
    assert leader_ports(merged) == {0: 1, 1: 2}


def test_merge_tie_goes_to_the_freshest() -> None:
    old = TopicLayout("t", "w", {0: _node(1)})
    new = TopicLayout("t", "w", {0: _node(2)})
    assert leader_ports(merge_layouts("t", "w", [old, new])) == {0: 2}
    assert leader_ports(merge_layouts("t", "w", [new, old])) == {0: 1}
    # two votes each: the freshest answer naming either decides
    assert leader_ports(merge_layouts("t", "w", [old, new, new, old])) == {0: 1}


def test_merge_uses_the_freshest_node_object() -> None:
    a = TopicLayout("t", "w", {0: _node(1, "x:1")})
    b = TopicLayout("t", "w", {0: _node(1, "x:2")})
    leader = merge_layouts("t", "w", [a, b]).leader(0)
    assert leader is not None
    assert leader.remote_address == "x:2"


def test_merge_union_meta_and_channels() -> None:
    classic = Node("10.0.0.9", 4150, 4151, "0.3.7")
    meta_old = TopicMeta(partition_num=2, replica=2)
    meta_new = TopicMeta(partition_num=3, replica=2)
    a = TopicLayout("t", "w", {0: _node(1)}, (classic,), meta_old, ("c1",), youzan=True)
    b = TopicLayout("t", "w", {1: _node(2)}, (), meta_new, ("c1", "c2"), youzan=True)
    c = TopicLayout("t", "w", {1: _node(2)}, (), None, (), youzan=True)
    merged = merge_layouts("t", "w", [a, b, c])
    assert leader_ports(merged) == {0: 1, 1: 2}
    assert merged.classic_nodes == (classic,)
    assert merged.meta == meta_new
    assert merged.channels == ("c1", "c2")
    assert merged.youzan
    assert merge_layouts("t", "w", []) == TopicLayout("t", "w")


def test_merge_of_one_is_identity() -> None:
    lay = layout("nsqlookupd_lookup_ptest.v1.json", "ptest", "w")
    assert merge_layouts("ptest", "w", [lay]) is lay


# --------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b"not json"),
        (200, b"\xff\xfe"),
        (502, b"<html>Bad Gateway</html>"),
        (500, b""),
        (404, b"404 page not found\n"),
        (404, b'{"error":"nope"}'),
        (503, b"[]"),
    ],
)
def test_unparseable_bodies(status: int, body: bytes) -> None:
    with pytest.raises(ProtocolError):
        unwrap_response(status, {}, body)


_GOOD_NODE = {"broadcast_address": "h", "tcp_port": 1, "http_port": 2, "version": "v"}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([], "lookup answer"),
        (None, "lookup answer"),
        ({"channels": []}, "producers"),
        ({"producers": {}}, "producers"),
        ({"producers": [1]}, "producers[0]"),
        ({"producers": [{**_GOOD_NODE, "tcp_port": "1"}]}, "tcp_port"),
        ({"producers": [{**_GOOD_NODE, "tcp_port": True}]}, "tcp_port"),
        ({"producers": [{**_GOOD_NODE, "tcp_port": 70000}]}, "tcp_port"),
        ({"producers": [{**_GOOD_NODE, "http_port": 0}]}, "http_port"),
        ({"producers": [{**_GOOD_NODE, "version": 3}]}, "version"),
        ({"producers": [{**_GOOD_NODE, "broadcast_address": ""}]}, "broadcast_address"),
        ({"producers": [{**_GOOD_NODE, "hostname": 5}]}, "hostname"),
        ({"producers": [{"tcp_port": 1, "http_port": 2, "version": "v"}]}, "broadcast_address"),
        ({"producers": [], "channels": [1]}, "channels[0]"),
        ({"producers": [], "channels": "c"}, "channels"),
        ({"producers": [], "partitions": []}, "partitions"),
        ({"producers": [], "partitions": {"-1": _GOOD_NODE}}, "negative"),
        ({"producers": [], "partitions": {"x": _GOOD_NODE}}, "partition id"),
        ({"producers": [], "partitions": {"1.5": _GOOD_NODE}}, "partition id"),
        ({"producers": [], "partitions": {"0": "h:1"}}, "partitions[0]"),
        ({"producers": [], "meta": []}, "meta"),
        ({"producers": [], "meta": {"partition_num": "2"}}, "meta.partition_num"),
        ({"producers": [], "meta": {"ordered": "yes"}}, "meta.ordered"),
        ({"producers": [], "meta": {"replica": 2.0}}, "meta.replica"),
    ],
)
def test_malformed_lookup_payloads(payload: object, field: str) -> None:
    with pytest.raises(ProtocolError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_lookup("t", "r", payload)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ([], "listlookup answer"),
        ({"lookupdnodes": {}}, "lookupdnodes"),
        ({"lookupdnodes": ["x"]}, r"lookupdnodes\[0\]"),
        ({"lookupdnodes": [{"NodeIP": "h", "HttpPort": "abc"}]}, "HttpPort"),
        ({"lookupdnodes": [{"NodeIP": "h", "HttpPort": "0"}]}, "HttpPort"),
        ({"lookupdnodes": [{"NodeIP": "h"}]}, "HttpPort"),
        ({"lookupdnodes": [{"NodeIP": 1, "HttpPort": "1"}]}, "NodeIP"),
        ({"lookupdnodes": [{"NodeIP": "h", "HttpPort": "1", "Epoch": "1"}]}, "Epoch"),
        ({"lookupdnodes": [{"NodeIP": "h", "HttpPort": "1", "TcpPort": "x"}]}, "TcpPort"),
        ({"lookupdleader": "h"}, "lookupdleader"),
    ],
)
def test_malformed_listlookup_payloads(payload: object, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        parse_listlookup(payload)
