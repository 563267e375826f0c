"""The embedded nsqlookupd answers every recorded lookupd request like the real servers.

For each answer in ``tests/fixtures/lookupd`` (``index.json``), the cluster is put in the state
of the capture (the recorded topology; no channel yet; a moment of a leader-change timeline;
classic with topics created by TCP PUB), the same request is sent with the same envelope, and
the answer must match: HTTP status, envelope, JSON keys in the same order, value types, nested
shapes, and the values that are facts of the topology (partition ids, which node leads which
partition, producers, meta flags, channel names, tombstones, lookupd addresses). Connection
details (remote ports, hostnames) and the order of Go map iterations are not facts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster
from tests.integration.conftest import create_capture_topics
from tests.integration.rawclient import RawClient

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lookupd"
INDEX: dict[str, dict[str, Any]] = json.loads((FIXTURES / "index.json").read_text())
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
V1_HEADER = ("x-nsq-content-type", "nsq; version=1.0")
YOUZAN_VERSION = "0.3.7-HA.1.13.0"
CLASSIC_PORT = 14150

# Recorded moments the emulator cannot reproduce, and why (the rest of each answer is checked).
# SIGTERM: while the old leader shut down gracefully, lookupd still listed its stale producer
# registration beside the new leader; the emulator hands the leadership over at once.
STALE_PRODUCERS = {
    "leader_change_r3test_p0_SIGTERM_w_after_failover.v1.json",
    "leader_change_r3test_p0_SIGTERM_r_after_failover.v1.json",
}


# --------------------------------------------------------------------------- scenarios


async def _nsqd_channel(cluster: Cluster, node: int, topic: str, partition: int, name: str) -> None:
    """Create a channel on a partition leader, through nsqd's HTTP API."""
    async with httpx.AsyncClient(timeout=5) as http:
        answer = await http.post(
            f"http://{cluster.nsqd_http_addresses[node]}/channel/create",
            params={"topic": topic, "partition": partition, "channel": name},
        )
    assert answer.status_code == 200, answer.text


async def _consume_one(cluster: Cluster, node: int, topic: str, partition: int, name: str) -> None:
    """Publish one message to the partition's leader and finish it on channel ``name``."""
    address = cluster.nsqd_addresses[node]
    producer = await RawClient.identified(address)
    consumer = await RawClient.identified(address)
    await consumer.ok(c.sub(topic, name, partition))
    await producer.ok(c.pub(topic, b"consumed before the change", partition))
    consumer.send(c.rdy(1))
    message = await consumer.message(MessageLayout.youzan())
    consumer.send(c.fin(message.id))
    await cluster.wait_for(lambda: cluster.unfinished(topic, name) == 0)
    await producer.close()
    await consumer.close()


async def _leader_change(cluster: Cluster, name: str) -> None:
    """Replay a leader_change_* timeline up to the moment the answer was recorded.

    Node numbers are the transcripts' nsqdN minus one."""
    _, _, topic, _, signal, _, moment = name.split(".")[0].split("_", 6)
    if (topic, signal) == ("ptest", "SIGKILL"):
        # ptest-0 was led by nsqd3 in that run; SUBs had created four more channels.
        await cluster.move_leader("ptest", 0, to_node=2)
        for channel in ("chnoident", "chadv", "chsub", "chnopart"):
            await _nsqd_channel(cluster, 2, "ptest", 0, channel)
        if moment == "before":
            return
        # 2 replicas, one left: the replica leads but cannot take writes
        await cluster.stop_node(2)
        if moment == "after_failover":
            return
        await _nsqd_channel(cluster, 1, "ptest", 0, "chlc")  # the consumer's SUB
        await cluster.start_node(2)
    elif (topic, signal) == ("r3test", "SIGKILL"):
        await cluster.move_leader("r3test", 0, to_node=1)
        await _nsqd_channel(cluster, 1, "r3test", 0, "chlc")
        # That run's consumer had finished messages on chlc: its offset (and so the channel)
        # had reached the replicas, and the new leader lists it.
        await _consume_one(cluster, 1, "r3test", 0, "chlc")
        if moment == "before":
            return
        await cluster.stop_node(1)  # 3 replicas, two left: writable again at once
        if moment == "after_failover":
            return
        await cluster.start_node(1)
    elif (topic, signal) == ("r3test", "SIGTERM"):
        if moment == "before":
            return
        # SIGTERM: nsqd hands its leadership over before it exits
        await cluster.move_leader("r3test", 0, to_node=1)
        await _nsqd_channel(cluster, 1, "r3test", 0, "chlc")
        if moment == "after_failover":
            return
        await cluster.stop_node(0)
        await cluster.start_node(0)
    else:
        raise AssertionError(f"no scenario for {name}")


async def _create_init_everywhere(cluster: Cluster) -> None:
    """As recorded: POST /channel/create?channel=init on every replica of every partition
    (only leaders accept)."""
    async with httpx.AsyncClient(timeout=5) as http:
        for topic in ("ptest", "otest", "etest", "p3", "r3test"):
            for pid, info in cluster.topology(topic).items():
                for node in info["replicas"]:
                    answer = await http.post(
                        f"http://{cluster.nsqd_http_addresses[node]}/channel/create",
                        params={"topic": topic, "partition": pid, "channel": "init"},
                    )
                    assert answer.status_code == (200 if node == info["leader"] else 400)


@asynccontextmanager
async def _cluster_for(name: str) -> AsyncIterator[Cluster]:
    if name.startswith("classic_"):
        async with Cluster(classic=True, nodes=1) as cluster:
            producer = await RawClient.identified(cluster.nsqd_addresses[0])
            for topic in ("t1", "tcl"):
                await producer.ok(c.pub(topic, b"created by a PUB"))
            await producer.close()
            yield cluster
        return
    async with Cluster(nodes=4) as cluster:
        no_channel = "no_channel_yet" in name
        await create_capture_topics(cluster, channels=() if no_channel else ("init",))
        if name.startswith("leader_change_"):
            await _leader_change(cluster, name)
        elif name.endswith("_after_channel_create.v1.json"):
            await _create_init_everywhere(cluster)
        yield cluster


# --------------------------------------------------------------------------- comparisons


def _recorded_node(port: int) -> int:
    """Node number of a recorded nsqd TCP port (youzan nsqd i listened on 245i0)."""
    if port == CLASSIC_PORT:
        return 0
    return (port - 24500) // 10 - 1


def _emulated_node(cluster: Cluster, port: int) -> int:
    ports = [int(a.rsplit(":", 1)[1]) for a in cluster.nsqd_addresses]
    return ports.index(port)


def _same_shape(recorded: Any, emulated: Any, where: str) -> None:
    """Same types; objects with the same keys in the same order; lists of the same kind.

    ``partitions`` maps are keyed by data (partition ids, topic names): their keys are
    checked as facts, here only their order (Go marshals map keys sorted) and values."""
    assert type(emulated) is type(recorded), f"{where}: {emulated!r} vs recorded {recorded!r}"
    if isinstance(recorded, dict) and where.endswith(".partitions"):
        assert list(emulated) == sorted(emulated), f"{where}: keys not sorted"
        for key, value in emulated.items():
            if recorded:
                _same_shape(next(iter(recorded.values())), value, f"{where}.{key}")
    elif isinstance(recorded, dict):
        assert list(emulated) == list(recorded), f"{where}: keys differ"
        for key, value in recorded.items():
            _same_shape(value, emulated[key], f"{where}.{key}")
    elif isinstance(recorded, list) and recorded:
        for i, item in enumerate(emulated):
            _same_shape(recorded[0], item, f"{where}[{i}]")


def _check_peer(cluster: Cluster, recorded: dict[str, Any], emulated: dict[str, Any]) -> None:
    assert emulated["version"] == recorded["version"]
    assert emulated["broadcast_address"] == recorded["broadcast_address"]
    node = _emulated_node(cluster, emulated["tcp_port"])
    assert emulated["http_port"] == int(cluster.nsqd_http_addresses[node].rsplit(":", 1)[1])
    if "distributed_id" in recorded:
        for peer in (recorded, emulated):  # host:rpc_port:tcp_port:node_id
            fields = peer["distributed_id"].split(":")
            assert len(fields) == 4
            assert fields[0] == peer["broadcast_address"]
            assert fields[2] == str(peer["tcp_port"])


def _check_lookup(cluster: Cluster, name: str, recorded: Any, emulated: Any) -> None:
    assert set(emulated["channels"]) == set(recorded["channels"])
    if "meta" in recorded:
        assert emulated["meta"] == recorded["meta"]
    if "partitions" in recorded:
        assert {
            pid: _emulated_node(cluster, peer["tcp_port"])
            for pid, peer in emulated["partitions"].items()
        } == {pid: _recorded_node(peer["tcp_port"]) for pid, peer in recorded["partitions"].items()}
        for pid, peer in emulated["partitions"].items():
            _check_peer(cluster, recorded["partitions"][pid], peer)
    producers = {_emulated_node(cluster, p["tcp_port"]) for p in emulated["producers"]}
    expected = {_recorded_node(p["tcp_port"]) for p in recorded["producers"]}
    if name in STALE_PRODUCERS:
        assert producers < expected
    else:
        assert producers == expected
        assert len(emulated["producers"]) == len(recorded["producers"])
    for peer in emulated["producers"]:
        _check_peer(cluster, recorded["producers"][0], peer)


def _check_nodes(cluster: Cluster, recorded: Any, emulated: Any) -> None:
    def by_node(answer: Any, node_of: Any) -> dict[int, Any]:
        return {node_of(p["tcp_port"]): p for p in answer["producers"]}

    emulated_nodes = by_node(emulated, lambda port: _emulated_node(cluster, port))
    recorded_nodes = by_node(recorded, _recorded_node)
    assert set(emulated_nodes) == set(recorded_nodes)
    for node, rec in recorded_nodes.items():
        emu = emulated_nodes[node]
        _check_peer(cluster, rec, emu)
        assert set(emu["topics"]) == set(rec["topics"])
        assert emu["tombstones"] == [False] * len(emu["topics"])
        if "partitions" in rec:
            assert emu["partitions"] == rec["partitions"]


def _check_facts(cluster: Cluster, name: str, path: str, recorded: Any, emulated: Any) -> None:
    if path == "/lookup":
        _check_lookup(cluster, name, recorded, emulated)
    elif path == "/nodes":
        _check_nodes(cluster, recorded, emulated)
    elif path in ("/topics", "/channels"):
        key = path[1:]
        assert sorted(emulated[key]) == sorted(recorded[key])
    elif path == "/info":
        assert emulated == recorded
    elif path == "/listlookup":
        lookupd = cluster.lookupds[0]
        assert len(emulated["lookupdnodes"]) == len(recorded["lookupdnodes"])
        rec, emu = recorded["lookupdleader"], emulated["lookupdleader"]
        for info in (rec, emu):
            assert info["ID"] == f"{info['NodeIP']}:{info['RpcPort']}:{info['TcpPort']}:nsqlookup"
            assert all(info[k].isdigit() for k in ("TcpPort", "HttpPort", "RpcPort"))
        assert emu["NodeIP"] == rec["NodeIP"]
        assert emu["HttpPort"] == str(lookupd.http_port)
        assert emu["Epoch"] == rec["Epoch"]
        assert emulated["lookupdnodes"] == [emu]
    else:
        raise AssertionError(f"no facts to check for {path}")


# --------------------------------------------------------------------------- the test


@pytest.mark.parametrize("name", sorted(INDEX))
async def test_recorded_answer(name: str) -> None:
    entry = INDEX[name]
    method, target = entry["request"].split(" ", 1)
    path = target.split("?", 1)[0]
    recorded = json.loads((FIXTURES / name).read_bytes())
    classic = name.startswith("classic_")
    async with _cluster_for(name) as cluster, httpx.AsyncClient(timeout=5) as http:
        url = cluster.lookupd_url + target
        v1 = entry["envelope"] == "v1" and not classic
        answer = await http.request(method, url, headers=V1 if v1 else {})
        if classic:
            # classic nsqlookupd 1.x answers v1 whatever the Accept header
            again = await http.request(method, url, headers=V1)
            assert (again.status_code, again.content) == (answer.status_code, answer.content)
        assert answer.status_code == entry["status"]
        assert answer.headers["content-type"] == "application/json; charset=utf-8"
        emulated = answer.json()
        if entry["envelope"] == "legacy":
            assert V1_HEADER[0] not in answer.headers
            assert list(emulated) == list(recorded) == ["status_code", "status_txt", "data"]
            assert emulated["status_code"] == recorded["status_code"]
            assert emulated["status_txt"] == recorded["status_txt"]
            recorded, emulated = recorded["data"], emulated["data"]
        else:
            assert answer.headers.get(V1_HEADER[0]) == V1_HEADER[1]
        if recorded is None or entry["status"] != 200:
            assert emulated == recorded
            return
        _same_shape(recorded, emulated, "$")
        _check_facts(cluster, name, path, recorded, emulated)


def test_every_recorded_answer_is_replayed() -> None:
    assert len(INDEX) == 56
    kinds = {entry["request"].split("?")[0] for entry in INDEX.values()}
    assert kinds == {
        "GET /lookup",
        "GET /listlookup",
        "GET /nodes",
        "GET /topics",
        "GET /channels",
        "GET /info",
    }
