"""Where a new youzan topic's partitions go: nsqlookupd's placement, as pure code.

The rules are those of youzan nsqlookupd's coordinator (youzan/nsq 0.3.7-HA.1.13.0,
``consistence/data_placement_mgr.go``), which ``NsqLookupCoordinator.CreateTopic`` and
``checkAndUpdateTopicPartitions`` (``consistence/nsqlookup_coord_api.go``) call for a new
topic through ``DataPlacement.allocTopicLeaderAndISR``:

* A plain topic (:func:`place_by_load`): every partition on nodes of its own. The live nodes
  are sorted by leader load (``NodeTopicStats.LeaderLessLoader``) and the first ones lead
  partitions 0, 1, ... in turn. The nodes are sorted again by replica load
  (``SlaveLessLoader``), and the nodes that lead none of the topic's partitions are handed
  out as followers in that order, partition 0's first: a node never holds two partitions of
  the topic.
* An ordered (``orderedmulti``) or multi-part topic (:func:`place_in_rotation`), through
  ``allocMultiPartTopicLeaderAndISR`` (``allocOrderedTopicLeaderAndISR`` before multi-part
  topics existed) and ``getRebalancedMultiTopicPartitionsFromNameList``: the live nodes in
  order, partition ``p`` on ``replicas`` consecutive nodes from index
  ``murmur3_32(topic name) + p``, wrapping around, the first leading. Load plays no part, and
  partitions share nodes when there are more of them than nodes.

The loads come from each node's topic statistics (``NsqdCoordRpcServer.GetTopicStats``,
``consistence/coordinator_rpc.go``). Both comparisons first weigh load factors made of the
last day's hourly publish volume, the channels' backlog and the data on disk, and compare
those only when they differ by 0.5 or more: tens of MiB published in an hour, or GiBs of
backlog, which an emulated cluster never holds. Otherwise (always, here) a node is less
loaded when it has fewer partitions, a follower counting 0.7 of a leader:
:meth:`NodeLoad.weight`.

Where the real coordinator leaves the outcome to chance, the emulator decides, so that a
test sees the same placement on every run:

* nodes of equal weight keep their node-number order (nsqlookupd iterates a Go map, whose
  order is random);
* the rotation runs over node numbers (nsqlookupd sorts the node ids as strings; the
  emulator's ids differ only by OS-chosen ports);
* the weights are read fresh for every topic. nsqlookupd caches a node's statistics for a
  minute (``NsqLookupCoordinator.getNsqdTopicStat``), so topics created within a minute of
  each other are all placed by the same old weights and only the random order spreads them
  (docs/protocol.md#placement-of-new-topics). Reading them fresh spreads leadership over the
  nodes as topics are created, which is where real placement ends up over time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mmh3

from smartnsq.testing.errors import ClusterError

__all__ = ["NodeLoad", "place_by_load", "place_in_rotation", "place_topic"]

# RATIO_BETWEEN_LEADER_FOLLOWER in data_placement_mgr.go: what a follower weighs.
FOLLOWER_WEIGHT = 0.7


@dataclass(frozen=True)
class NodeLoad:
    """A live node and the partitions it holds (of every topic): ``leads`` of them as the
    leader, ``holds`` in all (led or followed)."""

    node: int
    leads: int
    holds: int

    def weight(self) -> float:
        """Leaders count 1, followers 0.7, computed in float64 as nsqlookupd does."""
        return float(self.leads) + float(self.holds - self.leads) * FOLLOWER_WEIGHT


def place_topic(
    name: str, nodes: Sequence[NodeLoad], *, partitions: int, replicas: int, multi: bool
) -> dict[int, list[int]]:
    """partition -> nodes, leader first, for a new topic on the live ``nodes`` (in node
    order). ``multi``: ordered or multi-part. A plain topic with more partitions x replicas
    than nodes, which nsqlookupd refuses and the lenient Python API creates, is placed as a
    multi-part one."""
    if multi or partitions * replicas > len(nodes):
        return place_in_rotation(name, [n.node for n in nodes], partitions, replicas)
    return place_by_load(nodes, partitions, replicas)


def place_by_load(
    nodes: Sequence[NodeLoad], partitions: int, replicas: int
) -> dict[int, list[int]]:
    """allocTopicLeaderAndISR for a plain topic (see the module doc). Needs at least
    ``partitions * replicas`` nodes."""
    if partitions * replicas > len(nodes):
        raise ClusterError(f"{partitions} partitions x {replicas} replicas need as many nodes")
    # A stable sort from node order: equal weights keep it (see the module doc). Both of
    # nsqlookupd's sorts compare the same weight here, so the replica sort keeps this order.
    ranked = [n.node for n in sorted(nodes, key=NodeLoad.weight)]
    leaders = ranked[:partitions]
    followers = iter(ranked[partitions:])
    return {
        pid: [leader, *(next(followers) for _ in range(replicas - 1))]
        for pid, leader in enumerate(leaders)
    }


def place_in_rotation(
    name: str, nodes: Sequence[int], partitions: int, replicas: int
) -> dict[int, list[int]]:
    """getRebalancedMultiTopicPartitionsFromNameList over ``nodes`` (see the module doc)."""
    if not nodes or replicas > len(nodes):
        raise ClusterError(f"{replicas} replicas need as many nodes")
    start = mmh3.hash(name.encode(), 0, signed=False)
    return {
        pid: [nodes[(start + pid + k) % len(nodes)] for k in range(replicas)]
        for pid in range(partitions)
    }
