"""The embedded cluster's topology and its rules: topics, partitions, replicas and leaders,
writability (the replica quorum), where each channel lives, classic topics, failover.

youzan: a partition's log is shared by its replicas (what replication achieves on a real
cluster). Its leader serves the live channels; the other replicas hold copies, which follow
the leader's consume offset once the leader syncs it (on a FIN, or at once for a channel
registered through nsqlookupd). When the leadership moves, the new leader serves the channels
it holds, each from its confirmed position. Classic: each nsqd holds its own topics.

The rules are youzan's (youzan/nsq 0.3.7-HA.1.13.0, package ``consistence``): where a new
topic goes is :mod:`~smartnsq.testing.placement`; a partition takes writes while more than
half of its replicas are in sync (``coordData.IsISRReadyForWrite``, topic_coordinator.go,
checked by ``NsqdCoordinator.doSyncOpToCluster``, nsqd_coordinator_cluster_write.go); a
leader that is lost is replaced by a live in-sync replica (nsqlookupd's
``NsqLookupCoordinator.handleTopicLeaderElection``, nsqlookup_coordinator.go, choosing with
``DataPlacement.chooseNewLeaderFromISR``); an operator moves a partition with
``MoveTopicPartitionDataByManual`` (nsqlookup_coord_api.go). How long a real failover takes
is known from running one (docs/protocol.md#leader-change-timings); here it is
``failover_delay``.

No servers and no sockets here. What the servers must do about a change (close the consumers
of a log on a node) goes through the ``detach_consumers`` callback; whether a node runs is
read from the :class:`~smartnsq.testing.directory.Directory`; timers (channel pumps,
failovers) go through the :class:`Scheduler` given at :meth:`Topology.start`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import check_auto_create, check_channel, check_topic
from smartnsq.testing.changes import Changes
from smartnsq.testing.directory import Directory
from smartnsq.testing.errors import ClusterError
from smartnsq.testing.placement import NodeLoad, place_topic
from smartnsq.testing.state import (
    Channel,
    ChannelCopy,
    ChannelRecord,
    Partition,
    PartitionLog,
    Topic,
)

__all__ = ["DetachConsumers", "Scheduler", "TopicExists", "TopicRefused", "Topology"]

# The coordinator's refusal when a topic cannot be placed (or exists with another shape).
NO_NODE = "ErrType:9 ErrCode:1 : No node is available for topic"


class TopicRefused(ClusterError):
    """nsqlookupd's coordinator refuses to create a topic; the text is the real one."""


class TopicExists(TopicRefused):
    """The topic exists with other settings: nsqlookupd answers :data:`NO_NODE` all the
    same; ``existing`` and ``wanted`` say the settings in words."""

    def __init__(self, existing: str, wanted: str) -> None:
        super().__init__(NO_NODE)
        self.existing = existing
        self.wanted = wanted


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """The event loop's timers, as the topology uses them (an ``asyncio`` loop is one)."""

    def call_soon(self, callback: Callable[[], None]) -> object: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Cancellable: ...


# (node, log): the node no longer serves the log; its consumers of it must leave now.
DetachConsumers = Callable[[int, PartitionLog], None]


class Topology:
    """Every topic of the cluster and the rules that move them (see the module doc)."""

    def __init__(
        self,
        directory: Directory,
        changes: Changes,
        *,
        classic: bool,
        failover_delay: float,
        record_deliveries: bool,
        detach_consumers: DetachConsumers,
    ) -> None:
        self.classic = classic
        self.failover_delay = failover_delay
        self.record_deliveries = record_deliveries
        self.topics: dict[str, Topic] = {}
        # classic: each node's own topics, by node number
        self.classic_topics: list[dict[str, PartitionLog]] = [{} for _ in directory.nsqds]
        self._directory = directory
        self._nodes = directory.nsqds
        self._changes = changes
        self._detach = detach_consumers
        self._partitions_by_log: dict[int, Partition] = {}
        self._records: dict[tuple[str, str], ChannelRecord] = {}
        self._failovers: dict[tuple[str, int], Cancellable] = {}
        self._scheduler: Scheduler | None = None
        self._late_echoes: set[tuple[str, str]] = set()  # (topic, channel): see Channel

    def start(self, scheduler: Scheduler) -> None:
        """The cluster started: timers can run."""
        self._scheduler = scheduler

    def stop(self) -> None:
        """The cluster stops: no failover will run."""
        for handle in self._failovers.values():
            handle.cancel()
        self._failovers.clear()

    def _running_scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise ClusterError("cluster not started")
        return self._scheduler

    # ------------------------------------------------------------------ lookups

    def topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise ClusterError(f"no topic {name!r}")
        return topic

    def partition(self, topic: str, partition: int) -> Partition:
        found = self.topic(topic).partitions.get(partition)
        if found is None:
            raise ClusterError(f"topic {topic!r} has no partition {partition}")
        return found

    def partition_of(self, log_: PartitionLog) -> Partition | None:
        """The youzan partition a log belongs to (None for a classic topic)."""
        return self._partitions_by_log.get(id(log_))

    def layout(self, topic: str) -> dict[int, dict[str, Any]]:
        """partition -> leader, replicas and writability."""
        return {
            pid: {"leader": p.leader, "replicas": list(p.replicas), "writable": p.writable}
            for pid, p in sorted(self.topic(topic).partitions.items())
        }

    def is_stable(self) -> bool:
        """Every partition has a live leader taking writes and no failover is pending."""
        if self._failovers:
            return False
        nodes = self._nodes
        return all(
            p.leader is not None and nodes[p.leader].running and p.writable
            for t in self.topics.values()
            for p in t.partitions.values()
        )

    def logs(self, topic: str, partition: int | None = None) -> list[PartitionLog]:
        """The logs of a topic (classic: one per node that has it), or of one partition."""
        if self.classic:
            return [topics[topic] for topics in self.classic_topics if topic in topics]
        parts = self.topic(topic).partitions
        if partition is not None:
            return [self.partition(topic, partition).log]
        return [parts[p].log for p in sorted(parts)]

    def channels(self, topic: str, channel: str, partition: int | None = None) -> list[Channel]:
        """The channel ``channel`` of each log of the topic (or partition) that has it."""
        return [
            log_.channels[channel]
            for log_ in self.logs(topic, partition)
            if channel in log_.channels
        ]

    def all_channels(self) -> Iterator[Channel]:
        for topic in self.topics.values():
            for partition in topic.partitions.values():
                yield from partition.log.channels.values()
        for topics in self.classic_topics:
            for log_ in topics.values():
                yield from log_.channels.values()

    def channel_record(self, topic: str, channel: str) -> ChannelRecord:
        """Deliveries, FINs, requeues and timeouts of a channel (all partitions)."""
        return self._records.setdefault((topic, channel), ChannelRecord())

    # ------------------------------------------------------------------ topics

    def create_topic(
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
        awaiting_check: bool = False,
    ) -> Topic:
        """Create a youzan topic (or return the same one): what nsqlookupd ``/topic/create``
        runs. ``channels`` are registered. With ``strict_placement``, partitions x replicas
        may not exceed the live nodes unless several partitions may share a node, as the
        real lookupd checks. ``placement`` maps partition -> nodes, leader first; by default
        they are placed as nsqlookupd places them (:mod:`~smartnsq.testing.placement`). With
        ``awaiting_check`` (nsqlookupd's own creation) the partitions take writes only after
        the next topic check (:meth:`run_topic_check`).

        TopicRefused (nsqlookupd's texts) for a topic that exists with another shape, and
        for one it cannot place."""
        if self.classic:
            raise ClusterError("classic nsqd creates topics on first PUB or SUB")
        check_topic(name)
        if not 1 <= partitions <= 255:
            raise ValidationError("partitions", "must be 1..255")
        if not 1 <= replicas <= 5:
            raise ValidationError("replicas", "must be 1..5")
        names = [check_channel(channel) for channel in channels]
        disable_channel_auto_create = check_auto_create(bool(names), disable_channel_auto_create)
        alive = [n.index for n in self._nodes if n.running]
        if strict_placement:
            # nsqlookupd's CreateTopic checks the partition limit and the live nodes before
            # it looks for the topic: a topic that exists is refused too when nodes are down.
            if partitions >= 255:
                raise TopicRefused("max partition allowed exceed")
            multi = ordered or multi_part
            if replicas > len(alive) or (partitions * replicas > len(alive) and not multi):
                raise TopicRefused(NO_NODE)
        existing = self.topics.get(name)
        if existing is not None:
            same = (
                existing.partition_num == partitions
                and existing.replica == replicas
                and existing.ordered == ordered
                and existing.multi_part == multi_part
                and existing.ext == ext
                and existing.disable_channel_auto_create == disable_channel_auto_create
            )
            if not same:
                wanted = _describe(
                    partitions,
                    replicas,
                    ordered=ordered,
                    multi_part=multi_part,
                    ext=ext,
                    disable_channel_auto_create=disable_channel_auto_create,
                )
                shown = _describe(
                    existing.partition_num,
                    existing.replica,
                    ordered=existing.ordered,
                    multi_part=existing.multi_part,
                    ext=existing.ext,
                    disable_channel_auto_create=existing.disable_channel_auto_create,
                )
                raise TopicExists(shown, wanted)
            for channel in names:
                if channel not in existing.registered_channels:
                    self.register_channel(name, channel)
            return existing
        if partitions >= 255:
            raise TopicRefused("max partition allowed exceed")
        # The Python API is lenient: more partitions x replicas than nodes share nodes, as a
        # multi-part topic's do (tests want small clusters), but every replica needs a node.
        if replicas > len(alive):
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
        else:
            placement = place_topic(
                name,
                self._node_loads(alive),
                partitions=partitions,
                replicas=replicas,
                multi=ordered or multi_part,
            )
        for pid in range(partitions):
            members = list(placement[pid])
            log_ = PartitionLog(pid, ext=ext, classic=False, topic_name=name)
            partition = Partition(topic, pid, members, members[0], log_)
            if awaiting_check:
                partition.awaiting_check = True
                self._update_writable(partition)
            topic.partitions[pid] = partition
            self._partitions_by_log[id(log_)] = partition
        self.topics[name] = topic
        for channel in names:
            self.register_channel(name, channel)
        self._changes.changed()
        return topic

    def _node_loads(self, alive: Sequence[int]) -> list[NodeLoad]:
        """What each live node leads and holds, as its topic statistics tell nsqlookupd."""
        parts = [p for t in self.topics.values() for p in t.partitions.values()]
        return [
            NodeLoad(
                node,
                leads=sum(1 for p in parts if p.leader == node),
                holds=sum(1 for p in parts if node in p.replicas),
            )
            for node in alive
        ]

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
                self._directory.nsqd(member)

    def delete_topic(self, name: str) -> None:
        """nsqlookupd ``/topic/delete?partition=**``: consumers are detached."""
        topic = self.topic(name)
        for part in topic.partitions.values():
            self._cancel_failover(part)
            for node in range(len(self._nodes)):
                self._detach(node, part.log)
            for channel in part.log.channels.values():
                channel.serving = False
            self._partitions_by_log.pop(id(part.log), None)
        del self.topics[name]
        self._changes.changed()

    def classic_topic(self, node: int, name: str) -> PartitionLog:
        """A classic nsqd's topic, created on first use (as PUB or SUB do)."""
        topics = self.classic_topics[node]
        log_ = topics.get(name)
        if log_ is None:
            log_ = PartitionLog(None, ext=False, classic=True, topic_name=name)
            topics[name] = log_
            self._changes.changed()
        return log_

    def delete_classic_topic(self, node: int, name: str) -> None:
        """Classic nsqd ``/topic/delete``: its consumers are disconnected, the topic's
        channels and messages are gone."""
        log_ = self.classic_topics[node].pop(name)
        self._detach(node, log_)
        for channel in log_.channels.values():
            channel.serving = False
        self._changes.changed()

    # ------------------------------------------------------------------ channels

    def register_channel(self, topic_name: str, channel_name: str) -> None:
        """nsqlookupd ``/channel/create``: the channel exists on every replica of every
        partition (youzan registers channels only on topics created with
        ``disable_channel_auto_create``)."""
        check_channel(channel_name)
        topic = self.topic(topic_name)
        if not topic.disable_channel_auto_create:
            raise ClusterError(f"channel auto create NOT disabled in topic {topic_name}")
        if channel_name in topic.registered_channels:
            raise ClusterError(f"channel {channel_name} already registered")
        topic.registered_channels.append(channel_name)
        for partition in topic.partitions.values():
            self._replicate(self.ensure_channel(partition.log, channel_name))

    def create_channel_on_leaders(self, topic: str, channel: str) -> None:
        """A channel as a consumer's SUB creates it, on each partition's leader only."""
        check_channel(channel)
        for partition in self.topic(topic).partitions.values():
            self.ensure_channel(partition.log, channel)

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
            schedule=self._running_scheduler().call_soon,
            clock=time.monotonic,
            record=record,
        )
        channel.late_echo = (log_.topic_name, name) in self._late_echoes
        partition = self._partitions_by_log.get(id(log_))
        if partition is not None:
            leader = partition.leader
            channel.serving = leader is not None and self._nodes[leader].running
            channel.on_confirm = self._replicate
            if name not in partition.topic.channel_names:
                partition.topic.channel_names.append(name)
        log_.channels[name] = channel
        self._changes.changed()
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
            if node == partition.leader or not self._nodes[node].running:
                continue
            copies = partition.copies_on(node)
            copy = copies.get(channel.name)
            if copy is None:
                copies[channel.name] = ChannelCopy(channel.name, channel.start_index, channel)
            else:
                copy.follows = channel

    def set_ordered_echo_late(self, topic: str, channel: str, late: bool) -> None:
        """The fault :attr:`Channel.late_echo` on ``channel`` of every partition of
        ``topic``, now and when the channel is opened again (a new leader's)."""
        check_channel(channel)
        found = self.topic(topic)
        if late:
            self._late_echoes.add((topic, channel))
        else:
            self._late_echoes.discard((topic, channel))
        for partition in found.partitions.values():
            live = partition.log.channels.get(channel)
            if live is not None:
                live.late_echo = late

    def client_left(self, channel: Channel) -> None:
        """A client left ``channel``: an ephemeral channel without clients is deleted."""
        if channel.name.endswith("#ephemeral") and not channel.clients:
            channel.log.channels.pop(channel.name, None)
            partition = self._partitions_by_log.get(id(channel.log))
            if partition is not None and not any(
                channel.name in p.log.channels for p in partition.topic.partitions.values()
            ):
                partition.topic.channel_names.remove(channel.name)

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

    # ------------------------------------------------------------------ leadership

    def _quorum(self, partition: Partition) -> int:
        # youzan refuses writes unless the in-sync replicas are more than half the topic's
        # replica count (2 replicas: both; 3: two): IsISRReadyForWrite, topic_coordinator.go.
        return partition.topic.replica // 2 + 1

    def _alive_replicas(self, partition: Partition) -> list[int]:
        nodes = self._nodes
        return [r for r in partition.replicas if nodes[r].running]

    def _update_writable(self, partition: Partition) -> None:
        alive = self._alive_replicas(partition)
        partition.in_sync = (
            partition.leader is not None
            and partition.leader in alive
            and len(alive) >= self._quorum(partition)
            and not partition.forced_unwritable
        )
        partition.writable = partition.in_sync and not partition.awaiting_check

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Make a partition lose its in-sync majority, as during a failover's catch-up
        (publishes and FINs on ordered channels get E_FAILED_ON_NOT_WRITABLE), or regain it."""
        part = self.partition(topic, partition)
        part.forced_unwritable = not writable
        self._update_writable(part)
        self._changes.changed()

    def run_topic_check(self) -> None:
        """nsqlookupd's full topic check: topics created through it take writes from now on
        (see :mod:`~smartnsq.testing.checks`)."""
        changed = False
        for topic in self.topics.values():
            for part in topic.partitions.values():
                if part.awaiting_check:
                    part.awaiting_check = False
                    self._update_writable(part)
                    changed = True
        if changed:
            self._changes.changed()

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
            self._detach(old, log_)
        if old != leader or restarted:
            self._hand_over(partition, old, leader)
        serving = self._nodes[leader].running
        for channel in log_.channels.values():
            channel.serving = serving
        self._update_writable(partition)
        self._changes.changed()

    def move_leader(self, topic: str, partition: int, to_node: int) -> None:
        """Move a partition's leadership to ``to_node`` (nothing to do if it leads)."""
        if self.partition(topic, partition).leader == to_node:
            return
        self.move_partition(topic, partition, move_leader=True, to_node=to_node)

    def move_partition(
        self,
        topic: str,
        partition: int,
        *,
        move_leader: bool,
        from_node: int | None = None,
        to_node: int | None = None,
    ) -> int:
        """nsqlookupd ``/topic/partition/move``, with the defaults and checks that
        ``Cluster.move_partition_now`` documents. Returns the destination node."""
        part = self.partition(topic, partition)
        live = {n.index for n in self._nodes if n.running}
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
            self._changes.changed()
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

    # ------------------------------------------------------------------ nodes down and up

    def node_stopping(self, index: int) -> None:
        """Node ``index`` is about to crash: the logs it leads stop serving, their consumers
        are detached."""
        for log_ in self._logs_led_by(index):
            self._detach(index, log_)
            for channel in log_.channels.values():
                channel.serving = False

    def node_stopped(self, index: int) -> None:
        """Node ``index`` is down: its partitions lose a replica; those it led fail over to a
        live replica after ``failover_delay`` seconds."""
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
        self._changes.changed()

    def node_started(self, index: int) -> None:
        """Node ``index`` is back: it rejoins its partitions as a replica, as a restarted
        youzan leader was seen to (docs/protocol.md#leader-change-timings), and leads those
        that had no live replica; its classic topics serve again."""
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
        for log_ in self.classic_topics[index].values():
            for channel in log_.channels.values():
                channel.serving = True
                channel.reset_for_new_leader()
        self._changes.changed()

    def _logs_led_by(self, index: int) -> list[PartitionLog]:
        if self.classic:
            return list(self.classic_topics[index].values())
        return [
            p.log for t in self.topics.values() for p in t.partitions.values() if p.leader == index
        ]

    def _schedule_failover(self, partition: Partition) -> None:
        self._cancel_failover(partition)
        if self.failover_delay <= 0:
            self._failover(partition)
            return
        key = (partition.topic.name, partition.id)
        self._failovers[key] = self._running_scheduler().call_later(
            self.failover_delay, lambda: self._failover(partition)
        )

    def _cancel_failover(self, partition: Partition) -> None:
        pending = self._failovers.pop((partition.topic.name, partition.id), None)
        if pending is not None:
            pending.cancel()

    def _failover(self, partition: Partition) -> None:
        """The lost leader's replacement: the first live replica in the partition's order.
        youzan's chooseNewLeaderFromISR takes, among the live in-sync replicas with the
        newest commit log, the least loaded (by its leader load factor; for an ordered or
        multi-part topic, the next in its rotation). The emulator's replicas share one log, so
        all are equally new, and it keeps the partition's order: for a topic it placed, the
        rotation's order for an ordered one, the order the followers were chosen for a plain
        one."""
        self._failovers.pop((partition.topic.name, partition.id), None)
        leader = partition.leader
        if leader is not None and self._nodes[leader].running:
            return
        alive = self._alive_replicas(partition)
        if alive:
            self._set_leader(partition, alive[0])
        # else: no replica left; the dead leader leads again when it comes back


def _describe(partitions: int, replicas: int, **flags: bool) -> str:
    """A topic's settings in words, as ``smartnsq.admin`` words them: ``2 partitions x 1
    replicas, multi-part``."""
    shown = [name.replace("multi_part", "multi-part") for name, on in flags.items() if on]
    text = f"{partitions} partitions x {replicas} replicas"
    return text + (", " + ", ".join(shown) if shown else "")
