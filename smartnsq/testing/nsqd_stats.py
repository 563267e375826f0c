"""``GET /stats`` of the emulated nsqd, in the youzan shape (``doStats`` in nsqdserver/http.go
and the stats types of nsqd/stats.go, youzan/nsq 0.3.7-HA.1.13.0) or the classic nsqd 1.3
one (nsqio/nsq v1.3.0, nsqd/http.go and nsqd/stats.go).

The meaningful figures come from the cluster state (depths, in-flight, requeue and timeout
counts, message counts, clients, leadership); figures the emulator does not model (latency
histograms, hourly sizes, delayed queues) are zeros of the types youzan's stats have.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from smartnsq.protocol.compression import DeflateCodec, SnappyCodec
from smartnsq.testing.nsqd import ClientSession
from smartnsq.testing.state import Channel, ChannelCopy

if TYPE_CHECKING:
    from smartnsq.testing.nsqd import NsqdNode
    from smartnsq.testing.state import Partition, PartitionLog, Subscriber

__all__ = ["StatsQuery", "classic_stats", "stats_text", "youzan_stats"]

_E2E = {"count": 0, "percentiles": None}
# nsqd's client states (nsqd/client_v2.go): subscribed, closing.
_STATE_SUBSCRIBED = 3
_STATE_CLOSING = 4
_MEMORY_KEYS = (
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
)


class StatsQuery:
    """The ``/stats`` filters: topic, partition (youzan), channel, leaderOnly (youzan),
    include_clients and include_mem (classic)."""

    def __init__(
        self,
        topic: str = "",
        partition: str = "",
        channel: str = "",
        *,
        leader_only: bool = False,
        include_clients: bool = True,
        include_mem: bool = True,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.channel = channel
        self.leader_only = leader_only
        self.include_clients = include_clients
        self.include_mem = include_mem


def go_time(ns: int) -> str:
    """Go's ``time.Time.String()`` in UTC: ``2026-11-21 04:29:56.72433852 +0000 UTC``."""
    seconds, frac = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + " +0000 UTC"


# --------------------------------------------------------------------------- youzan


def youzan_stats(node: NsqdNode, query: StatsQuery) -> dict[str, Any]:
    held: list[Partition] = [
        p
        for t in node.topology.topics.values()
        if not query.topic or t.name == query.topic
        for p in t.partitions.values()
        if node.index in p.replicas
    ]
    held.sort(key=lambda p: f"{p.topic.name}-{p.id}")  # nsqd sorts by full name
    topics = []
    for partition in held:
        # nsqd reports "not write-disabled": a leader without its replica quorum is disabled
        is_leader = partition.leader == node.index and partition.writable
        if query.leader_only and not is_leader:
            continue
        if query.partition and str(partition.id) != query.partition:
            continue
        topics.append(_youzan_topic(node, partition, is_leader, query))
    return {
        "version": node.settings.version,
        "health": "OK",
        "start_time": node.start_time,
        "topics": topics,
    }


def _youzan_topic(
    node: NsqdNode, partition: Partition, is_leader: bool, query: StatsQuery
) -> dict[str, Any]:
    topic = partition.topic
    log_ = partition.log
    # The leader serves the live channels; a replica reports its own copies.
    held: dict[str, Channel | ChannelCopy] = dict(
        log_.channels if partition.leader == node.index else partition.copies_on(node.index)
    )
    entries = {
        name: _youzan_channel(node, ch) if isinstance(ch, Channel) else _replica_channel(ch, log_)
        for name, ch in sorted(held.items())
    }
    channels = [entry for name, entry in entries.items() if name == query.channel]
    if not channels:
        # nsqd keeps the topic's channel list unfiltered when the channel is not found
        channels = list(entries.values())
    size_stats = [0] * 16
    for record in log_.records:
        size_stats[_size_bucket(len(record.body))] += 1
    latency_stats = [0] * 16
    latency_stats[0] = len(log_.records)  # every emulated write completes in < 1 ms
    statsd_name = f"{topic.name}.{partition.id}" if topic.ordered else topic.name
    return {
        "topic_name": topic.name,
        "topic_full_name": f"{topic.name}-{partition.id}",
        "topic_partition": str(partition.id),
        "channels": channels,
        "channel_num": len(held),
        "depth": log_.end_offset,  # youzan reports the topic depth in bytes
        "backend_depth": log_.end_offset,
        "backend_start": 0,
        "message_count": len(log_.records),
        "is_leader": is_leader,
        "hourly_pubsize": 0,
        "client_pub_stats": [],
        "client_num": 0,
        "msg_size_stats": size_stats,
        "msg_write_latency_stats": latency_stats,
        "is_multi_ordered": topic.ordered,
        "is_multi_part": topic.multi_part,
        "is_ext": topic.ext,
        "is_channel_auto_create_disabled": topic.disable_channel_auto_create,
        "statsd_name": statsd_name,
        "pub_failed_cnt": 0,
        "e2e_processing_latency": dict(_E2E),
    }


def _size_bucket(size: int) -> int:
    # nsqd's buckets: < 100 B, < 1 KiB, then one per power of two of KiB
    if size < 100:
        return 0
    if size < 1024:
        return 1
    return min((size // 1024).bit_length() + 1, 15)


def _clients_of(node: NsqdNode, channel: Channel) -> list[Subscriber]:
    """The channel's clients connected to this node (replicas share the channel state)."""
    return [c for c in channel.clients if not isinstance(c, ClientSession) or c.node is node]


def _in_flight_on(channel: Channel, mine: list[Subscriber]) -> int:
    """The channel's messages in flight to ``mine`` (its clients on one node)."""
    return sum(1 for d in channel.in_flight.values() if d.client in mine)


def _unmeasured_channel_fields() -> dict[str, Any]:
    """The youzan channel fields the emulator does not model, at the values an idle real
    channel shows (fresh containers each time: callers may change them)."""
    return {
        "skipped": False,
        "zan_test_skipped": False,
        "delayed_queue_count": 0,
        "delayed_queue_recent": go_time(0),
        "delayed_queue_recent_nano": 0,
        "e2e_processing_latency": dict(_E2E),
        "msg_consume_latency_stats": [0] * 12,
        "msg_delivery_latency_stats": [0] * 12,
    }


def _youzan_channel(node: NsqdNode, channel: Channel) -> dict[str, Any]:
    # youzan's depth counts from the confirmed position (the first unfinished message) to
    # the end, so in-flight messages and those finished after them too; depth_size is the
    # same span in bytes (diskQueueReader.updateDepth); backlogs the messages not read yet
    # plus the deferred ones (Channel.Backlogs).
    log_ = channel.log
    confirmed = channel.confirmed_index()
    depth = len(log_.records) - confirmed
    oldest = _oldest_unfinished_ns(channel)
    mine = _clients_of(node, channel)
    clients = [_youzan_client(c, channel) for c in mine]
    return {
        "channel_name": channel.name,
        "backlogs": len(log_.records) - channel.next_index + len(channel.deferred),
        "depth": depth,
        "depth_size": _bytes_from(log_, confirmed),
        "depth_ts": go_time(oldest),
        "depth_ts_nano": oldest,
        "backend_depth": depth,
        "hourly_subsize": 0,
        "in_flight_count": _in_flight_on(channel, mine),
        "deferred_count": len(channel.deferred),
        "deferred_from_delay_count": 0,
        # youzan: the total count of the channel's queue, not the deliveries
        "message_count": len(channel.log.records),
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "clients": clients,
        "client_num": len(clients),
        "paused": channel.paused,
        **_unmeasured_channel_fields(),
    }


def _replica_channel(copy: ChannelCopy, log_: PartitionLog) -> dict[str, Any]:
    """A replica's copy of a channel: no clients, nothing in flight; its depth counts from
    the position the leader last synced to it."""
    records = log_.records
    start = copy.position()
    depth = len(records) - start
    oldest = records[start].timestamp if start < len(records) else 0
    size = _bytes_from(log_, start)
    return {
        "channel_name": copy.name,
        "backlogs": depth,
        "depth": depth,
        "depth_size": size,
        "depth_ts": go_time(oldest),
        "depth_ts_nano": oldest,
        "backend_depth": depth,
        "hourly_subsize": 0,
        "in_flight_count": 0,
        "deferred_count": 0,
        "deferred_from_delay_count": 0,
        "message_count": len(records),
        "requeue_count": 0,
        "timeout_count": 0,
        "clients": [],
        "client_num": 0,
        "paused": False,
        **_unmeasured_channel_fields(),
    }


def _bytes_from(log_: PartitionLog, index: int) -> int:
    """The queue's bytes from log index ``index`` to its end."""
    records = log_.records
    return log_.end_offset - records[index].offset if index < len(records) else 0


def _oldest_unfinished_ns(channel: Channel) -> int:
    records = channel.log.records
    stamps = [d.record.timestamp for d in channel.iter_unfinished()]
    if channel.next_index < len(records):
        stamps.append(records[channel.next_index].timestamp)
    if stamps:
        return min(stamps)
    return records[-1].timestamp if records else 0


def _client_common(client: Subscriber, channel: Channel) -> dict[str, Any]:
    """The fields both flavours share, in their order (nsqd ClientStats)."""
    session = client if isinstance(client, ClientSession) else None
    delivered = 0
    if channel.record is not None:
        delivered = sum(1 for d in channel.record.deliveries if d[3] == client.label)
    codec = getattr(session, "_codec", None)
    return {
        "client_id": session.peer.client_id if session else client.label,
        "hostname": session.peer.hostname if session else "",
        "version": "V2",
        "remote_address": _remote(session) if session is not None else "",
        "state": _STATE_CLOSING if session is not None and session.closing else _STATE_SUBSCRIBED,
        "ready_count": client.rdy,
        "in_flight_count": client.in_flight,
        "message_count": delivered,
        # FINs and REQs are not attributed to clients by the emulator
        "finish_count": 0,
        "requeue_count": 0,
        "timeout_count": 0,
        "deferred_count": 0,
        "connect_ts": 0,
        "sample_rate": client.peer.sample_rate,
        "deflate": isinstance(codec, DeflateCodec),
        "snappy": isinstance(codec, SnappyCodec),
        "user_agent": session.peer.user_agent if session else "",
        "tls": bool(session and session.tls),
    }


def _tls_fields(client: dict[str, Any]) -> dict[str, Any]:
    return {
        "tls": client["tls"],
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }


def _youzan_client(client: Subscriber, channel: Channel) -> dict[str, Any]:
    common = _client_common(client, channel)
    answer: dict[str, Any] = {"name": common["client_id"]}
    answer.update({k: v for k, v in common.items() if k != "tls"})
    answer["desired_tag"] = client.peer.desired_tag
    answer.update(_tls_fields(common))
    return answer


# --------------------------------------------------------------------------- classic


def classic_stats(node: NsqdNode, query: StatsQuery) -> dict[str, Any]:
    topics = []
    for name in sorted(node.classic_topics):
        if query.topic and name != query.topic:
            continue
        topics.append(_classic_topic(node, name, node.classic_topics[name], query))
    answer: dict[str, Any] = {
        "version": node.settings.version,
        "health": "OK",
        "start_time": node.start_time,
        "topics": topics,
    }
    if query.include_mem:
        answer["memory"] = dict.fromkeys(_MEMORY_KEYS, 0)
    answer["producers"] = _classic_producers(node) if query.include_clients else None
    return answer


def _classic_topic(
    node: NsqdNode, name: str, log_: PartitionLog, query: StatsQuery
) -> dict[str, Any]:
    # Classic nsqd moves messages from the topic to its channels at once; without a channel
    # they wait in the topic.
    depth = 0 if log_.had_channel else len(log_.records)
    channels = [
        _classic_channel(node, ch, query)
        for ch_name, ch in sorted(log_.channels.items())
        if not query.channel or ch_name == query.channel
    ]
    return {
        "topic_name": name,
        "channels": channels,
        "depth": depth,
        "backend_depth": 0,
        "message_count": len(log_.records),
        "message_bytes": sum(len(r.body) for r in log_.records),
        "paused": False,
        "e2e_processing_latency": dict(_E2E),
    }


def _classic_channel(node: NsqdNode, channel: Channel, query: StatsQuery) -> dict[str, Any]:
    start = channel.start_index
    mine = _clients_of(node, channel)
    clients: list[dict[str, Any]] | None = None
    if query.include_clients:
        clients = [_classic_client(c, channel) for c in mine]
    return {
        "channel_name": channel.name,
        "depth": channel.depth - len(channel.deferred),
        "backend_depth": 0,
        "in_flight_count": _in_flight_on(channel, mine),
        "deferred_count": len(channel.deferred),
        # classic: messages the channel received from its topic (redeliveries excluded)
        "message_count": len(channel.log.records) - start,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(mine),
        "clients": clients,
        "paused": channel.paused,
        "e2e_processing_latency": dict(_E2E),
    }


def _classic_client(client: Subscriber, channel: Channel) -> dict[str, Any]:
    common = _client_common(client, channel)
    skipped = ("timeout_count", "deferred_count", "tls")
    answer = {k: v for k, v in common.items() if k not in skipped}
    answer.update(_tls_fields(common))
    return answer


def _classic_producers(node: NsqdNode) -> list[dict[str, Any]]:
    producers = []
    for session in sorted(node.sessions, key=lambda s: s.label):
        if session.channel is not None or not session.published:
            continue
        producers.append(
            {
                "client_id": session.peer.client_id,
                "hostname": session.peer.hostname,
                "version": "V2",
                "remote_address": _remote(session),
                "state": 2,  # connected
                "ready_count": 0,
                "in_flight_count": 0,
                "message_count": 0,
                "finish_count": 0,
                "requeue_count": 0,
                "connect_ts": 0,
                "sample_rate": 0,
                "deflate": False,
                "snappy": False,
                "user_agent": session.peer.user_agent,
                **_tls_fields({"tls": session.tls}),
            }
        )
    return producers


def _remote(session: ClientSession) -> str:
    if session.transport is None:
        return ""
    peer = session.transport.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else ""


# --------------------------------------------------------------------------- text


def stats_text(node: NsqdNode, stats: dict[str, Any]) -> str:
    """The plain-text ``/stats`` (without ``format=json``), after nsqd's printStats."""
    uptime = int(time.time()) - node.start_time
    lines = [
        f"nsqd v{node.settings.version}",
        f"start_time {datetime.fromtimestamp(node.start_time, tz=UTC).isoformat()}",
        f"uptime {uptime}s",
    ]
    if not stats["topics"]:
        return "\n".join([*lines, "", "NO_TOPICS", ""])
    lines += ["", f"Health: {stats['health']}"]
    for topic in stats["topics"]:
        name = topic.get("topic_full_name", topic["topic_name"])
        lines.append("")
        lines.append(
            f"   [{name:<15}] depth: {topic['depth']:<5} be-depth: {topic['backend_depth']:<5} "
            f"msgs: {topic['message_count']:<8}"
        )
        for ch in topic["channels"]:
            prefix = "   *P " if ch["paused"] else "      "
            lines.append(
                f"{prefix}[{ch['channel_name']:<25}] depth: {ch['depth']:<5} "
                f"be-depth: {ch['backend_depth']:<5} inflt: {ch['in_flight_count']:<4} "
                f"def: {ch['deferred_count']:<4} re-q: {ch['requeue_count']:<5} "
                f"timeout: {ch['timeout_count']:<5} msgs: {ch['message_count']:<8}"
            )
            for client in ch["clients"] or []:
                lines.append(
                    f"        [{client['version']} {client['client_id']:<21}] "
                    f"state: {client['state']} inflt: {client['in_flight_count']:<4} "
                    f"rdy: {client['ready_count']:<4} fin: {client['finish_count']:<8} "
                    f"re-q: {client['requeue_count']:<8} msgs: {client['message_count']:<8}"
                )
    return "\n".join(lines) + "\n"
