"""Where the embedded cluster puts a new youzan topic: nsqlookupd's placement (youzan/nsq
consistence/data_placement_mgr.go, allocTopicLeaderAndISR), by load for a plain topic, in a
rotation from the topic name's murmur3 hash for an ordered or multi-part one."""

from __future__ import annotations

from collections import Counter

import mmh3
import pytest

from smartnsq.testing.changes import Changes
from smartnsq.testing.directory import Directory
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.placement import NodeLoad, place_by_load, place_in_rotation, place_topic
from smartnsq.testing.topology import Topology


def _idle(nodes: int) -> list[NodeLoad]:
    return [NodeLoad(node, leads=0, holds=0) for node in range(nodes)]


def _topology(nodes: int = 4, down: tuple[int, ...] = ()) -> Topology:
    directory = Directory(
        nodes=nodes,
        lookupds=1,
        host="127.0.0.1",
        broadcast_address=None,
        lookupd_port=0,
        nsqd_port=0,
        allow_write_with_no_channels=False,
    )
    for entry in directory.nsqds:
        entry.running = entry.index not in down
    return Topology(
        directory,
        Changes(),
        classic=False,
        failover_delay=0.0,
        record_deliveries=False,
        detach_consumers=lambda node, log: None,
    )


def _leaders(topology: Topology) -> Counter[int]:
    return Counter(p.leader for t in topology.topics.values() for p in t.partitions.values())


def _held(topology: Topology) -> Counter[int]:
    return Counter(
        node for t in topology.topics.values() for p in t.partitions.values() for node in p.replicas
    )


# ---------------------------------------------------------------- the rules, small cases


def test_a_plain_topic_leads_from_the_least_loaded_and_follows_on_the_rest() -> None:
    # Idle nodes: the leaders are the first in node order, the followers the next ones,
    # partition 0's first: no node holds two partitions of the topic.
    assert place_by_load(_idle(4), 2, 2) == {0: [0, 2], 1: [1, 3]}
    assert place_by_load(_idle(5), 1, 3) == {0: [0, 1, 2]}
    assert place_by_load(_idle(3), 3, 1) == {0: [0], 1: [1], 2: [2]}


def test_a_follower_weighs_seven_tenths_of_a_leader() -> None:
    nodes = [
        NodeLoad(0, leads=1, holds=1),  # 1.0
        NodeLoad(1, leads=0, holds=1),  # 0.7
        NodeLoad(2, leads=0, holds=2),  # 1.4
        NodeLoad(3, leads=0, holds=0),  # 0.0
    ]
    assert [n.weight() for n in nodes] == [1.0, 0.7, 1.4, 0.0]
    assert place_by_load(nodes, 1, 1) == {0: [3]}
    assert place_by_load(nodes, 2, 2) == {0: [3, 0], 1: [1, 2]}


def test_nodes_of_equal_weight_keep_their_order() -> None:
    # nsqlookupd leaves the order of equal nodes to a Go map; the emulator keeps node order.
    nodes = [NodeLoad(2, leads=1, holds=2), NodeLoad(0, leads=0, holds=0)]
    nodes += [NodeLoad(1, leads=1, holds=2), NodeLoad(3, leads=0, holds=0)]
    assert place_by_load(nodes, 4, 1) == {0: [0], 1: [3], 2: [2], 3: [1]}


def test_an_ordered_topic_rotates_from_its_name_hash() -> None:
    # youzan 0.3.7-HA.1.13.0 placed the ordered 4 x 2 topic "otest" on nodes 1..4 so:
    # partition 0 led by node 4 (with node 1), 1 by node 1 (with 2), 2 by 2, 3 by 3
    # (docs/protocol.md#placement-of-new-topics). Here nodes are numbered from 0.
    assert mmh3.hash(b"otest", 0, signed=False) % 4 == 3
    assert place_in_rotation("otest", [0, 1, 2, 3], 4, 2) == {
        0: [3, 0],
        1: [0, 1],
        2: [1, 2],
        3: [2, 3],
    }


def test_a_rotation_may_put_several_partitions_on_a_node() -> None:
    start = mmh3.hash(b"orders", 0, signed=False)
    placed = place_in_rotation("orders", [0, 1, 2], 5, 2)
    assert placed == {p: [(start + p) % 3, (start + p + 1) % 3] for p in range(5)}
    assert Counter(nodes[0] for nodes in placed.values()) in (
        Counter({0: 2, 1: 2, 2: 1}),
        Counter({0: 2, 1: 1, 2: 2}),
        Counter({0: 1, 1: 2, 2: 2}),
    )


def test_load_plays_no_part_in_a_rotation() -> None:
    busy = [NodeLoad(0, leads=9, holds=9), NodeLoad(1, leads=0, holds=0)]
    assert place_topic("o", busy, partitions=2, replicas=1, multi=True) == place_in_rotation(
        "o", [0, 1], 2, 1
    )


def test_a_plain_topic_too_big_for_the_nodes_is_placed_as_a_multi_part_one() -> None:
    # nsqlookupd refuses it; the lenient Python API lets partitions share nodes.
    assert place_topic("big", _idle(2), partitions=3, replicas=2, multi=False) == (
        place_in_rotation("big", [0, 1], 3, 2)
    )


def test_impossible_placements_are_refused() -> None:
    with pytest.raises(ClusterError):
        place_by_load(_idle(3), 2, 2)
    with pytest.raises(ClusterError):
        place_in_rotation("t", [0, 1], 1, 3)


# ---------------------------------------------------------------- the cluster's topics


def test_leadership_spreads_as_topics_are_created() -> None:
    topology = _topology(4)
    for name in ("a", "b", "c", "d"):
        topology.create_topic(name, partitions=2, replicas=2)
    # Today's placement: a on 0,1 (followers 2,3), then b led by the nodes that only follow.
    assert topology.layout("a") == {
        0: {"leader": 0, "replicas": [0, 2], "writable": True},
        1: {"leader": 1, "replicas": [1, 3], "writable": True},
    }
    assert [p["replicas"] for p in topology.layout("b").values()] == [[2, 0], [3, 1]]
    assert _leaders(topology) == Counter({0: 2, 1: 2, 2: 2, 3: 2})
    assert _held(topology) == Counter({0: 4, 1: 4, 2: 4, 3: 4})


def test_single_partition_topics_take_turns() -> None:
    topology = _topology(3)
    leaders = []
    for name in "abcdef":
        topology.create_topic(name, partitions=1, replicas=1)
        leaders.append(topology.topic(name).partitions[0].leader)
    assert leaders == [0, 1, 2, 0, 1, 2]


def test_replicated_single_partition_topics_spread_their_leaders() -> None:
    topology = _topology(4)
    for name in "abcd":
        topology.create_topic(name, partitions=1, replicas=3)
    assert topology.layout("a")[0]["replicas"] == [0, 1, 2]
    # weights after a: 1.0, 0.7, 0.7, 0 -> b led by node 3; after b: 1.0, 1.4, 1.4, 1.0 -> c
    # led by node 0; after c: 2.0, 2.1, 1.4, 1.7 -> d led by node 2.
    assert [topology.layout(name)[0]["replicas"] for name in "bcd"] == [
        [3, 1, 2],
        [0, 3, 1],
        [2, 3, 0],
    ]
    assert _leaders(topology) == Counter({0: 2, 2: 1, 3: 1})


def test_ordered_topics_are_spread_by_their_names_only() -> None:
    topology = _topology(4)
    topology.create_topic("plain", partitions=2, replicas=2)
    topology.create_topic("otest", partitions=4, replicas=2, ordered=True)
    assert [p["replicas"] for p in topology.layout("otest").values()] == [
        [3, 0],
        [0, 1],
        [1, 2],
        [2, 3],
    ]


def test_a_node_that_is_down_is_left_out() -> None:
    topology = _topology(4, down=(0,))
    topology.create_topic("t", partitions=1, replicas=3)
    assert topology.layout("t")[0]["replicas"] == [1, 2, 3]
    topology.create_topic("o", partitions=3, replicas=1, ordered=True)
    assert {p["leader"] for p in topology.layout("o").values()} == {1, 2, 3}


def test_an_explicit_placement_is_kept() -> None:
    topology = _topology(4)
    topology.create_topic("t", partitions=2, replicas=2, placement={0: [3, 2], 1: [0, 1]})
    assert [p["replicas"] for p in topology.layout("t").values()] == [[3, 2], [0, 1]]
