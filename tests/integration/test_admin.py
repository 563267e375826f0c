"""smartnsq.admin against the embedded cluster: topics and durable (registered) channels
through the nsqlookupd leader, and what a leader crash does to channels that are not."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from smartnsq.admin import Admin
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import (
    AdminError,
    ChannelNotRegisteredError,
    ConnectionClosedError,
    NSQTimeoutError,
    PlacementError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


# nsqlookupd's topic checks every 5 s instead of 60: a topic created through it takes writes
# after a check, which may come 0.5 s after the last instead of 6 (test_cluster_topic_checks.py
# runs the real timing).
CHECKS = {"topic_check_interval": 5.0}


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    # partitions x replicas may not exceed the nodes (nsqlookupd's rule, unless ordered)
    async with Cluster(nodes=4, lookupds=2, **CHECKS) as c:
        yield c


def _follower_url(cluster: Cluster) -> str:
    """A lookupd that is not the leader: admin requests must find the leader from it."""
    leader = cluster.lookupd_leader()
    return next(lk.url for lk in cluster.lookupds if lk is not leader)


async def _lookup(cluster: Cluster, topic: str) -> dict[str, object]:
    async with httpx.AsyncClient() as http:
        answer = await http.get(
            f"{cluster.lookupd_url}/lookup",
            params={"topic": topic, "metainfo": "true"},
            headers=V1,
        )
    result: dict[str, object] = answer.json()
    return result


async def _nsqd_pub(cluster: Cluster, topic: str, body: bytes) -> None:
    """nsqd HTTP /pub on partition 0's leader."""
    leader = cluster.leader(topic, 0)
    assert leader is not None
    address = cluster.nsqd_http_addresses[leader]
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"http://{address}/pub", params={"topic": topic, "partition": "0"}, content=body
        )
    assert answer.status_code == 200, answer.text


async def test_create_topic_registers_durable_channels_through_the_leader(
    cluster: Cluster,
) -> None:
    async with Admin([_follower_url(cluster)]) as admin:
        await admin.create_topic("orders", 2, 2, channels=["billing", "audit"])
    topic = cluster.topics["orders"]
    assert (topic.partition_num, topic.replica, topic.disable_channel_auto_create) == (2, 2, True)
    assert topic.registered_channels == ["billing", "audit"]
    for partition in topic.partitions.values():
        assert set(partition.log.channels) == {"billing", "audit"}  # on the leader
        for replica in partition.replicas[1:]:
            assert set(partition.copies_on(replica)) == {"billing", "audit"}  # and replicas
    answer = await _lookup(cluster, "orders")
    assert answer["meta"] == {
        "disable_channel_auto_create": True,
        "extend_support": False,
        "multi_part": False,
        "ordered": False,
        "partition_num": 2,
        "replica": 2,
    }
    assert set(answer["channels"]) == {"billing", "audit"}  # type: ignore[arg-type]


async def test_create_topic_is_idempotent_and_refuses_other_settings(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("t", 2, 2, ordered=True, channels=["c"])
        await admin.create_topic("t", 2, 2, ordered=True, channels=["c"])  # the same: fine
        with pytest.raises(AdminError, match=r"exists with other settings \(2 partitions x 2"):
            await admin.create_topic("t", 4, 2, ordered=True, channels=["c"])
    assert cluster.topics["t"].registered_channels == ["c"]


async def test_a_topic_that_cannot_be_placed_is_refused_in_words_before_sending() -> None:
    """nsqlookupd places every replica of a partition on a node of its own, and a plain topic
    one node per replica of every partition: Admin counts the nodes (/nodes) and says so
    before posting, with what would fit (docker_real_images.txt: a 2x2 plain topic on the
    3-node compose cluster got "ErrType:9 ErrCode:1 : No node is available for topic")."""
    async with Cluster(nodes=3, **CHECKS) as cluster, Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(PlacementError) as caught:
            await admin.create_topic("t", 2, 2)
        error = caught.value
        assert isinstance(error, ValidationError)
        assert isinstance(error, AdminError)
        assert error.status is None  # nothing was sent
        assert (error.field, error.partitions, error.replicas, error.nodes) == (
            "partitions",
            2,
            2,
            3,
        )
        assert str(error) == (
            "partitions: a plain topic puts every replica of every partition on a node of its "
            "own: 2 partitions x 2 replicas need 4 nsqd nodes, the cluster has 3 nsqd nodes. "
            "Ask for at most 1 x 2 or 2 x 1 (partitions x replicas), or make the topic "
            "ordered or multi-part (ordered=True or multi_part=True; smartnsq topic create "
            "--ordered or --multi-part), whose partitions may share nodes"
        )
        with pytest.raises(PlacementError, match=r"^replicas: 4 replicas asked, but the cluster"):
            await admin.create_topic("t", 1, 4, ordered=True)
        assert "t" not in cluster.topics
        # What fits: ordered and multi-part topics share nodes
        await admin.create_topic("o", 2, 2, ordered=True)
        await admin.create_topic("m", 2, 2, multi_part=True)
        await admin.create_topic("m", 2, 2, multi_part=True)  # the same again: fine
        assert cluster.topics["m"].multi_part
        assert not cluster.topics["o"].multi_part
        assert (await _lookup(cluster, "m"))["meta"]["multi_part"] is True  # type: ignore[index]
        with pytest.raises(AdminError, match="exists with other settings"):
            await admin.create_topic("m", 2, 2, ordered=True)
        await admin.create_topic("one", 1, 2, multi_part=True)
        with pytest.raises(AdminError, match=r"exists with other settings \(1 partitions x 2"):
            await admin.create_topic("one", 1, 2)  # nsqlookupd compares multi-part too


async def test_an_existing_topic_is_fine_with_a_node_down() -> None:
    """Creating a topic that exists with the same settings is not an error, also while the
    cluster has fewer nodes than a new one would need."""
    async with Cluster(nodes=3, **CHECKS) as cluster, Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("t", 1, 3, channels=["c"])
        await cluster.stop_node(2)
        await admin.create_topic("t", 1, 3, channels=["c"])  # 2 of its 3 replicas: writable
        with pytest.raises(PlacementError, match="3 replicas asked, but the cluster has 2"):
            await admin.create_topic("u", 1, 3)


async def test_nsqlookupds_placement_refusal_is_said_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a node count (a lookupd that does not list its nodes), the refusal comes from
    nsqlookupd: said in words, its own text kept as the detail."""

    async def unknown(self: Admin) -> None:
        return None

    monkeypatch.setattr(Admin, "_node_count", unknown)
    async with Cluster(nodes=3) as cluster, Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(PlacementError) as caught:
            await admin.create_topic("t", 2, 2)
    error = caught.value
    assert (error.status, error.nodes, error.field) == (400, None, "partitions")
    assert error.detail == "ErrType:9 ErrCode:1 : No node is available for topic"
    assert error.url == cluster.lookupd_url + "/topic/create"
    assert error.reason.startswith(
        "nsqlookupd found no nsqd node for part of topic 't' (2 partitions x 2 replicas): "
        "every replica of a partition needs a live node of its own, and a plain topic one per "
        "replica of every partition"
    )
    assert str(error).endswith(
        f"(HTTP 400 from {error.url}: ErrType:9 ErrCode:1 : No node is available for topic)"
    )


async def test_registering_a_channel_of_no_topic_says_so(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(AdminError) as caught:
            await admin.create_channel("nosuch", "c")
    error = caught.value
    assert error.message.startswith(
        "cannot register channel 'c': the cluster has no topic 'nosuch'"
    )
    assert (error.status, error.detail) == (400, "Key not found")
    assert str(error).endswith(": Key not found)")


async def test_create_channel_registers_on_every_replica(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("t", 1, 3, disable_channel_auto_create=True)
        await admin.create_channel("t", "late")
        await admin.create_channel("t", "late")  # registered already: fine
    partition = cluster.topics["t"].partitions[0]
    assert "late" in partition.log.channels
    assert all("late" in partition.copies_on(r) for r in partition.replicas[1:])


async def test_registering_on_a_topic_that_auto_creates_channels_explains(
    cluster: Cluster,
) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("t", 1, 1)
        with pytest.raises(AdminError, match="disable_channel_auto_create") as caught:
            await admin.create_channel("t", "c")
    assert caught.value.status == 400
    assert "SUB create its channels" in str(caught.value)


async def test_a_registered_channel_keeps_every_message_through_a_leader_crash(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """channel_durability.txt, through the client: 100 published, the leader crashes, 100
    more; the registered channel delivers all 200, the one an nsqd created on the leader
    delivers none of them (the new leader starts it afresh at the end)."""
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("durable", 1, 3, channels=["heldout"])
        await admin.create_topic("leaderonly", 1, 3)
    await cluster.create_channel_on_leaders("leaderonly", "heldout")  # nsqd /channel/create
    async with Producer(lookupd=[cluster.lookupd_url]) as producer:
        for topic in ("durable", "leaderonly"):
            await producer.publish_many(topic, [b"before-%d" % i for i in range(100)])
        # SIGKILL-like: each topic's leader crashes (nsqlookupd may have put them on two
        # nodes: then two of four stop, and each topic keeps two of its three replicas);
        # both fail over to a replica.
        leaders = {cluster.leader(topic, 0) for topic in ("durable", "leaderonly")}
        for leader in leaders:
            assert leader is not None
            await cluster.stop_node(leader)
        await producer.publish_many("durable", [b"after-%d" % i for i in range(100)])
        # The new leader has no channel of that topic, so nsqlookupd refuses write lookups
        # ("Topic has no channel"): publish on the leader itself, as the recording did.
        for i in range(100):
            await _nsqd_pub(cluster, "leaderonly", b"after-%d" % i)

        got: dict[str, list[bytes]] = {"durable": [], "leaderonly": []}
        caplog.set_level(logging.WARNING, "smartnsq.consumer")
        for topic in ("durable", "leaderonly"):

            def handle(message: Message, topic: str = topic) -> None:
                got[topic].append(message.body)

            async with Consumer(topic, "heldout", lookupd=[cluster.lookupd_url], handler=handle):
                await cluster.wait_for(lambda t=topic: cluster.subscriber_rdy(t, "heldout") != [])
                await _nsqd_pub(cluster, topic, b"marker")
                await cluster.wait_for(lambda t=topic: b"marker" in got[t])
                await cluster.wait_for(lambda t=topic: cluster.unfinished(t, "heldout") == 0)
    assert len(got["durable"]) == 201
    assert got["leaderonly"] == [b"marker"]
    warnings = [r.getMessage() for r in caplog.records if "is not registered" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("leaderonly/heldout: channel 'heldout' is not registered")
    assert "never delivered" in warnings[0]


async def test_a_topic_with_registered_channels_refuses_other_channels(cluster: Cluster) -> None:
    await cluster.create_topic("t", 1, 1, channels=["c"])  # the same semantics as Admin
    consumer = Consumer("t", "other", lookupd=[cluster.lookupd_url], handler=lambda m: None)
    with pytest.raises(ChannelNotRegisteredError):
        await consumer.start()


async def test_delete_topic(cluster: Cluster) -> None:
    async with Admin([cluster.lookupd_url]) as admin:
        await admin.create_topic("t", 2, 1, channels=["c"])
        await admin.delete_topic("t")
    assert "t" not in cluster.topics


async def test_wait_reports_what_is_missing(cluster: Cluster) -> None:
    # Every lookupd keeps answering as before the topic existed.
    for index in range(2):
        cluster.freeze_lookupd(index, ["slow"])
    async with Admin([cluster.lookupd_url]) as admin:
        with pytest.raises(NSQTimeoutError, match=r"topic 'slow' is not ready after 0\.3 s"):
            await admin.create_topic("slow", 2, 1, channels=["c"], wait=0.3)
    assert "slow" in cluster.topics


async def test_the_cluster_api_has_the_admin_rule_for_registered_channels(
    cluster: Cluster,
) -> None:
    with pytest.raises(ValidationError, match="need disable_channel_auto_create=True"):
        await cluster.create_topic("t", 1, 1, channels=["c"], disable_channel_auto_create=False)
    assert "t" not in cluster.topics
    topic = await cluster.create_topic("t", 1, 1, channels=["c"])
    assert topic.disable_channel_auto_create
    assert topic.registered_channels == ["c"]


async def test_arguments_are_checked_before_anything_is_sent() -> None:
    admin = Admin(["127.0.0.1:1"])  # nothing listens: a request would fail differently
    for args, kwargs in (
        (("t", 0), {}),
        (("t", 255), {}),
        (("t", 1, 6), {}),
        (("bad name",), {}),
        (("t",), {"channels": "c"}),
        (("t",), {"channels": ["c"], "disable_channel_auto_create": False}),
        (("t",), {"wait": -1}),
    ):
        with pytest.raises(ValidationError):
            await admin.create_topic(*args, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        await admin.create_channel("t", "bad channel")
    await admin.close()
    with pytest.raises(ValidationError):
        Admin()
    with pytest.raises(ValidationError):
        Admin("127.0.0.1:4161")  # type: ignore[arg-type]


@pytest.mark.parametrize("through", ["lookupd", "nsqd_http"])
async def test_classic(through: str) -> None:
    async with Cluster(classic=True) as cluster:
        if through == "lookupd":
            admin = Admin([cluster.lookupd_url])
        else:
            admin = Admin(nsqd_http=cluster.nsqd_http_addresses)
        async with admin:
            assert not await admin.is_youzan()
            await admin.create_topic("t", channels=["c"])
            node = cluster.nodes[0]
            assert list(node.classic_topics["t"].channels) == ["c"]
            await admin.create_channel("t", "d")
            assert list(node.classic_topics["t"].channels) == ["c", "d"]
            with pytest.raises(UnsupportedFeatureError):
                await admin.create_topic("t", 2)
            await admin.delete_topic("t")
            assert "t" not in node.classic_topics
            with pytest.raises(AdminError, match="no nsqd has topic 't'"):
                await admin.delete_topic("t")


async def test_an_nsqd_that_does_not_answer_is_a_typed_error() -> None:
    async with Admin(nsqd_http=["127.0.0.1:1"]) as admin:  # nothing listens there
        with pytest.raises(ConnectionClosedError, match="got no answer"):
            await admin.create_topic("t")
