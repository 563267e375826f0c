"""nsqlookupd's operator endpoints on the embedded cluster: /topic/partition/move (one
implementation with Cluster.move_leader), /topic/delete, /channel/create, /cluster/stats and
/topic/create, with the real lookupd's validation errors.

Node numbers follow the transcripts minus one (the transcripts' nsqd2 is node 1).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from smartnsq.protocol import commands as c
from smartnsq.protocol.message import MessageLayout
from smartnsq.testing import Cluster, ClusterError
from tests.integration.rawclient import RawClient

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
YOUZAN = MessageLayout.youzan()
V1_CONTENT = ("x-nsq-content-type", "nsq; version=1.0")


async def _call(
    cluster: Cluster, path: str, params: dict[str, Any] | None = None, *, lookupd: int = 0
) -> httpx.Response:
    method = "GET" if path == "/cluster/stats" else "POST"
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.request(method, cluster.lookupd_urls[lookupd] + path, params=params)


def _error(answer: httpx.Response) -> tuple[int, str]:
    # operator endpoints are v1 only: errors keep their status and say {"message": ...}
    assert answer.headers[V1_CONTENT[0]] == V1_CONTENT[1]
    return answer.status_code, answer.json()["message"]


def _done(answer: httpx.Response) -> None:
    assert (answer.status_code, answer.content) == (200, b""), answer.text
    assert answer.headers[V1_CONTENT[0]] == V1_CONTENT[1]
    # an empty answer: no Content-Type at all (Go's net/http sniffs one only from a body)
    assert "content-type" not in answer.headers


async def _lookup(cluster: Cluster, topic: str, access: str = "w") -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as http:
        return await http.get(
            f"{cluster.lookupd_url}/lookup", params={"topic": topic, "access": access}, headers=V1
        )


def _node(cluster: Cluster, tcp_port: int) -> int:
    return [int(a.rsplit(":", 1)[1]) for a in cluster.nsqd_addresses].index(tcp_port)


# --------------------------------------------------------------------------- partition move


async def test_move_leader_over_http_with_a_producer_and_a_consumer(youzan: Cluster) -> None:
    """The move answers once done; the old leader's producer connection stays open and
    answers E_FAILED_ON_NOT_LEADER, its consumer connection is closed; the lookup names the new
    leader; un-FINed messages come again from the new leader, same id, attempts back to 1."""
    old = 1  # ptest-0: leader node 1, replica node 2
    producer = await RawClient.identified(youzan.nsqd_addresses[old])
    consumer = await RawClient.identified(youzan.nsqd_addresses[old])
    await consumer.ok(c.sub("ptest", "mv", 0))
    consumer.send(c.rdy(10))
    await producer.ok(c.pub("ptest", b"finished", 0))
    await producer.ok(c.pub("ptest", b"unfinished", 0))
    finished, unfinished = [await consumer.message(YOUZAN) for _ in range(2)]
    consumer.send(c.fin(finished.id))
    await youzan.wait_for(lambda: len(youzan.channel_record("ptest", "mv").finished) == 1)

    answer = await _call(
        youzan, "/topic/partition/move", {"topic": "ptest", "partition": 0, "move_leader": "true"}
    )
    _done(answer)
    new = youzan.leader("ptest", 0)
    assert new == 2  # the next live replica
    assert youzan.topology("ptest")[0] == {"leader": 2, "replicas": [1, 2], "writable": True}

    assert await consumer.closed()
    for body in (b"x", b"y"):  # not fatal: the connection stays open
        assert await producer.error(c.pub("ptest", body, 0)) == "E_FAILED_ON_NOT_LEADER "
    async with httpx.AsyncClient(timeout=5) as http:
        stale = await http.post(
            f"http://{youzan.nsqd_http_addresses[old]}/pub?topic=ptest&partition=0",
            content=b"z",
            headers=V1,
        )
    assert (stale.status_code, stale.json()) == (400, {"message": "E_FAILED_ON_NOT_LEADER"})
    partitions = (await _lookup(youzan, "ptest")).json()["partitions"]
    assert _node(youzan, partitions["0"]["tcp_port"]) == new

    again = await RawClient.identified(youzan.nsqd_addresses[new])
    await again.ok(c.sub("ptest", "mv", 0))
    again.send(c.rdy(10))
    redelivered = await again.message(YOUZAN)
    assert (redelivered.id, redelivered.attempts, redelivered.body) == (
        unfinished.id,
        1,
        b"unfinished",
    )
    assert await again.silent(0.1)  # the finished message does not come back
    writer = await RawClient.identified(youzan.nsqd_addresses[new])
    await writer.ok(c.pub("ptest", b"after", 0))
    assert (await again.message(YOUZAN)).body == b"after"
    for client in (producer, again, writer):
        await client.close()


async def test_move_names_nodes_like_the_lookup(youzan: Cluster) -> None:
    """move_to: the distributed id a lookup reports, host:tcp_port, or a node number."""
    lookup = (await _lookup(youzan, "ptest", "r")).json()
    leader_id = lookup["partitions"]["1"]["distributed_id"]  # ptest-1: node 3
    answer = await _call(
        youzan,
        "/topic/partition/move",
        {
            "topic": "ptest",
            "partition": 1,
            "move_leader": "true",
            "move_from": leader_id,
            "move_to": youzan.nsqd_addresses[0],
        },
    )
    _done(answer)
    assert youzan.leader("ptest", 1) == 0
    # a node that holds no replica is added to the replicas, as the real lookupd adds it
    answer = await _call(
        youzan,
        "/topic/partition/move",
        {"topic": "ptest", "partition": 1, "move_leader": "true", "move_to": "2"},
    )
    _done(answer)
    assert youzan.topology("ptest")[1] == {"leader": 2, "replicas": [3, 0, 2], "writable": True}


async def test_move_a_replica(youzan: Cluster) -> None:
    params = {"topic": "ptest", "partition": 0, "move_from": "2", "move_to": "3"}
    _done(await _call(youzan, "/topic/partition/move", params))
    assert youzan.topology("ptest")[0] == {"leader": 1, "replicas": [1, 3], "writable": True}
    # without move_to, the data goes to a live node that does not hold it
    params = {"topic": "ptest", "partition": 0, "move_from": "3"}
    _done(await _call(youzan, "/topic/partition/move", params))
    assert youzan.topology("ptest")[0]["replicas"] == [1, 0]


MOVE_ERRORS = [
    ({}, "MISSING_ARG_TOPIC"),
    ({"topic": "ptest"}, "MISSING_ARG_TOPIC_PARTITION"),
    ({"topic": "ptest", "partition": "x"}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ({"topic": "ptest", "partition": 255}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ({"topic": "ptest", "partition": -1}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ({"topic": "nope", "partition": 0, "move_leader": "true"}, "Key not found"),
    ({"topic": "ptest", "partition": 7, "move_leader": "true"}, "Key not found"),
    ({"topic": "ptest", "partition": -11, "move_leader": "true"}, "Key not found"),
    (
        {"topic": "ptest", "partition": 0, "move_leader": "true", "move_from": "2"},
        "move from not the topic leader",
    ),
    (
        {"topic": "ptest", "partition": 0, "move_leader": "true", "move_to": "1"},
        "move to and from node can not be the same",
    ),
    (
        {"topic": "ptest", "partition": 0, "move_leader": "true", "move_to": "10.0.0.9:4150"},
        "the move destination is not found in cluster",
    ),
    (
        {"topic": "ptest", "partition": 0, "move_from": "1", "move_to": "3"},
        "can not move leader without moveleader param",
    ),
    (
        {"topic": "ptest", "partition": 0, "move_to": "3"},
        "the move source node has no replica for the topic",
    ),
    (
        {"topic": "ptest", "partition": 0, "move_from": "2", "move_to": "1"},
        "the move destination has the topic data already",
    ),
]


@pytest.mark.parametrize(("params", "message"), MOVE_ERRORS)
async def test_move_errors(youzan: Cluster, params: dict[str, Any], message: str) -> None:
    before = youzan.topology("ptest")
    assert _error(await _call(youzan, "/topic/partition/move", params)) == (400, message)
    assert youzan.topology("ptest") == before


async def test_move_to_a_stopped_node_and_the_python_api_agree(youzan: Cluster) -> None:
    await youzan.stop_node(2)
    params = {"topic": "ptest", "partition": 1, "move_leader": "true", "move_to": "2"}
    expected = "the move destination is not found in cluster"
    assert _error(await _call(youzan, "/topic/partition/move", params)) == (400, expected)
    with pytest.raises(ClusterError, match=expected):
        await youzan.move_leader("ptest", 1, to_node=2)
    with pytest.raises(ClusterError, match="move from not the topic leader"):
        youzan.move_partition_now("ptest", 1, move_leader=True, from_node=0, to_node=1)


async def test_operator_endpoints_need_the_leader_lookupd() -> None:
    async with Cluster(nodes=2, lookupds=2) as cluster:
        await cluster.create_topic("t", 1, 2, channels=["c"], placement={0: [0, 1]})
        await cluster.create_topic("d", 1, 1, disable_channel_auto_create=True)
        move = {"topic": "t", "partition": 0, "move_leader": "true"}
        create = {"topic": "n", "partition_num": 1, "replicator": 1}
        cases = [
            ("/topic/partition/move", {}, (400, "MISSING_ARG_TOPIC")),  # arguments first
            ("/topic/partition/move", move, (400, "E_FAILED_ON_NOT_LEADER")),
            ("/topic/create", {"topic": "n"}, (400, "MISSING_ARG_TOPIC_PARTITION_NUM")),
            ("/topic/create", create, (400, "E_FAILED_ON_NOT_LEADER")),
            ("/cluster/stats", {}, (400, "E_FAILED_ON_NOT_LEADER")),
            # the coordinator's own refusals (nsqlookupd http.go / coordinator sources)
            ("/topic/delete", {"topic": "t", "partition": "**"}, (500, "Not nsqlookup leader")),
            ("/channel/create", {"topic": "d", "channel": "x"}, (400, "Not nsqlookup leader")),
        ]
        for path, params, expected in cases:
            assert _error(await _call(cluster, path, params, lookupd=1)) == expected, path
        assert cluster.leader("t", 0) == 0
        assert "n" not in cluster.topics
        _done(await _call(cluster, "/topic/partition/move", move))  # the leader lookupd
        assert cluster.leader("t", 0) == 1


# --------------------------------------------------------------------------- topic delete


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, (400, "MISSING_ARG_TOPIC")),
        ({"topic": "ptest"}, (400, "MISSING_ARG_TOPIC_PARTITION")),
        ({"topic": "ptest", "partition": "0"}, (400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")),
        ({"topic": "nope", "partition": "**"}, (500, "Topic not exist")),
    ],
)
async def test_delete_errors(
    youzan: Cluster, params: dict[str, Any], expected: tuple[int, str]
) -> None:
    assert _error(await _call(youzan, "/topic/delete", params)) == expected
    assert "ptest" in youzan.topics


async def test_delete_topic(youzan: Cluster) -> None:
    producer = await RawClient.identified(youzan.nsqd_addresses[1])
    consumer = await RawClient.identified(youzan.nsqd_addresses[1])
    await consumer.ok(c.sub("ptest", "init", 0))
    _done(await _call(youzan, "/topic/delete", {"topic": "ptest", "partition": "**"}))
    assert await consumer.closed()
    assert await producer.error(c.pub("ptest", b"x", 0)) == "E_TOPIC_NOT_EXIST "
    assert (await _lookup(youzan, "ptest", "r")).json() == {
        "channels": [],
        "partitions": {},
        "producers": [],
    }
    gone = await _lookup(youzan, "ptest", "w")
    assert (gone.status_code, gone.json()) == (404, {"message": "Key not found"})
    async with httpx.AsyncClient(timeout=5) as http:
        topics = await http.get(f"{youzan.lookupd_url}/topics", headers=V1)
    assert "ptest" not in topics.json()["topics"]
    # the name can be used again
    _done(
        await _call(
            youzan, "/topic/create", {"topic": "ptest", "partition_num": 1, "replicator": 1}
        )
    )
    assert youzan.topology("ptest")[0]["replicas"] != []


async def test_delete_topic_python_api(youzan: Cluster) -> None:
    await youzan.delete_topic("p3")
    assert "p3" not in youzan.topics
    with pytest.raises(ClusterError):
        await youzan.delete_topic("p3")
    stats = (await _call(youzan, "/cluster/stats")).json()
    assert stats["stable"] is True


# --------------------------------------------------------------------------- channel create


async def test_channel_create_registers_channels_of_restricted_topics(youzan: Cluster) -> None:
    _done(
        await _call(
            youzan,
            "/topic/create",
            {
                "topic": "reg",
                "partition_num": 1,
                "replicator": 1,
                "disable_channel_auto_create": "true",
            },
        )
    )
    node = youzan.leader("reg", 0)
    assert node is not None
    consumer = await RawClient.identified(youzan.nsqd_addresses[node])
    error = await consumer.error(c.sub("reg", "c", 0))
    assert error.startswith("E_SUB_CHANNEL_NOT_REGISTERED")
    _done(await _call(youzan, "/channel/create", {"topic": "reg", "channel": "c"}))
    assert (await _lookup(youzan, "reg")).json()["channels"] == ["c"]
    consumer = await RawClient.identified(youzan.nsqd_addresses[node])
    await consumer.ok(c.sub("reg", "c", 0))
    again = await _call(youzan, "/channel/create", {"topic": "reg", "channel": "c"})
    assert _error(again) == (400, "channel c already registered")
    await consumer.close()


async def test_the_python_api_says_a_topic_exists_with_other_settings(youzan: Cluster) -> None:
    """nsqlookupd answers "No node is available for topic" (above); Cluster.create_topic,
    like Admin.create_topic, says what is wrong: both settings. The same settings are fine."""
    assert await youzan.create_topic("ptest", 2, 2) is youzan.topics["ptest"]
    with pytest.raises(ClusterError) as caught:
        await youzan.create_topic("ptest", 3, 2, ordered=True, channels=["c"])
    assert str(caught.value) == (
        "topic 'ptest' exists with other settings (2 partitions x 2 replicas); asked for "
        "3 partitions x 2 replicas, ordered, disable_channel_auto_create"
    )
    assert youzan.topics["ptest"].partition_num == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "bad!", "channel": "c"}, "INVALID_ARG_TOPIC"),
        ({"topic": "ptest"}, "MISSING_ARG_CHANNEL"),
        ({"topic": "ptest", "channel": "bad!"}, "INVALID_ARG_CHANNEL"),
        ({"topic": "nope", "channel": "c"}, "Key not found"),
        ({"topic": "ptest", "channel": "c"}, "channel auto create NOT disabled in topic ptest"),
    ],
)
async def test_channel_create_errors(youzan: Cluster, params: dict[str, Any], message: str) -> None:
    assert _error(await _call(youzan, "/channel/create", params)) == (400, message)


# --------------------------------------------------------------------------- cluster stats


async def test_cluster_stats() -> None:
    async with Cluster(nodes=3, failover_delay=30) as cluster:
        await cluster.create_topic("t", 2, 2, channels=["c"], placement={0: [0, 1], 1: [1, 2]})
        answer = await _call(cluster, "/cluster/stats")
        assert answer.status_code == 200
        assert answer.headers[V1_CONTENT[0]] == V1_CONTENT[1]
        stats = answer.json()
        assert list(stats) == ["stable", "node_stat_list", "topn_topics"]
        assert stats["stable"] is True
        assert stats["topn_topics"] == []
        for entry in stats["node_stat_list"]:
            assert list(entry) == [
                "hostname",
                "broadcast_address",
                "tcp_port",
                "http_port",
                "leader_load_factor",
                "node_load_factor",
            ]
        loads = {
            _node(cluster, e["tcp_port"]): (e["leader_load_factor"], e["node_load_factor"])
            for e in stats["node_stat_list"]
        }
        assert loads == {0: (1, 1), 1: (1, 2), 2: (0, 1)}
        await cluster.stop_node(0)  # its partition waits for the failover: unstable
        stats = (await _call(cluster, "/cluster/stats")).json()
        assert stats["stable"] is False
        assert {_node(cluster, e["tcp_port"]) for e in stats["node_stat_list"]} == {1, 2}


# --------------------------------------------------------------------------- topic create


async def test_topic_create_recorded_answers(youzan: Cluster) -> None:
    """The three /topic/create lines at the end of nsqlookupd_INDEX.txt."""
    same = {"topic": "ptest", "partition_num": 2, "replicator": 2, "syncdisk": 1}
    _done(await _call(youzan, "/topic/create", same))
    different = {**same, "partition_num": 3}
    assert _error(await _call(youzan, "/topic/create", different)) == (
        400,
        "ErrType:9 ErrCode:1 : No node is available for topic",
    )
    invalid = {**same, "topic": "bad name!"}
    assert _error(await _call(youzan, "/topic/create", invalid)) == (400, "INVALID_ARG_TOPIC")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "n"}, "MISSING_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "n", "partition_num": 0}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "n", "partition_num": 1}, "MISSING_ARG_TOPIC_REPLICATOR"),
        ({"topic": "n", "partition_num": 1, "replicator": 6}, "INVALID_ARG_TOPIC_REPLICATOR"),
        (
            {"topic": "n", "partition_num": 1, "replicator": 1, "suggestload": "x"},
            "INVALID_ARG_TOPIC_LOAD_FACTOR",
        ),
        (
            {"topic": "n", "partition_num": 1, "replicator": 1, "syncdisk": "x"},
            "INVALID_ARG_TOPIC_SYNC_DISK",
        ),
    ],
)
async def test_topic_create_errors(youzan: Cluster, params: dict[str, Any], message: str) -> None:
    assert _error(await _call(youzan, "/topic/create", params)) == (400, message)
    assert "n" not in youzan.topics


NO_NODE_BODY = b'{"message":"ErrType:9 ErrCode:1 : No node is available for topic"}'


@pytest.mark.parametrize(
    ("nodes", "partitions", "replicas", "flag", "placed"),
    [
        # docker_real_images.txt: a plain topic needs partitions x replicas <= nodes
        (3, 2, 2, None, False),
        (3, 4, 2, None, False),
        (3, 2, 2, "orderedmulti", True),  # a node may lead several of its partitions
        (4, 4, 1, None, True),
        (4, 8, 1, None, False),
        # youzan nsqlookupd's CreateTopic (consistence/nsqlookup_coord_api.go): multi-part
        # lifts it too, and no topic
        # gets more replicas than nodes
        (3, 2, 2, "multipart", True),
        (3, 1, 3, None, True),
        (3, 1, 4, "orderedmulti", False),
    ],
)
async def test_topic_create_places_as_nsqlookupd_does(
    nodes: int, partitions: int, replicas: int, flag: str | None, placed: bool
) -> None:
    params = {"topic": "t", "partition_num": partitions, "replicator": replicas}
    if flag is not None:
        params[flag] = "true"
    async with Cluster(nodes=nodes) as cluster:
        async with httpx.AsyncClient(timeout=5) as http:
            url = cluster.lookupd_url + "/topic/create"
            answer = await http.post(url, params=params, headers=V1)
        if placed:
            _done(answer)
            assert len(cluster.topology("t")) == partitions
        else:
            assert (answer.status_code, answer.content) == (400, NO_NODE_BODY)
            assert answer.headers[V1_CONTENT[0]] == V1_CONTENT[1]
            assert "t" not in cluster.topics


async def test_topic_create_checks_the_nodes_before_the_topic() -> None:
    """nsqlookupd's CreateTopic counts the live nodes before it looks for the topic: posting
    an existing topic again, same settings, is refused while too few nodes are up."""
    params = {"topic": "t", "partition_num": 1, "replicator": 3}
    async with Cluster(nodes=3) as cluster, httpx.AsyncClient(timeout=5) as http:
        url = cluster.lookupd_url + "/topic/create"
        _done(await http.post(url, params=params, headers=V1))
        _done(await http.post(url, params=params, headers=V1))
        await cluster.stop_node(2)
        answer = await http.post(url, params=params, headers=V1)
        assert (answer.status_code, answer.content) == (400, NO_NODE_BODY)
        await cluster.start_node(2)
        _done(await http.post(url, params=params, headers=V1))
