"""``smartnsq topic`` and ``smartnsq channel``: topics and registered channels from the
command line, against the embedded cluster (youzan and classic)."""

from __future__ import annotations

import pytest

from smartnsq.testing import Cluster
from tests.integration.test_cli import _env, smartnsq


async def test_topic_create_registers_channels_and_channel_create_adds_one() -> None:
    async with Cluster(nodes=3) as cluster:
        result = await smartnsq(
            "topic", "create", "orders", "--partitions", "3", "--replicas", "1",
            "--channel", "billing", "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert result.rc == 0, result
        assert result.out == (
            "topic orders: 3 partitions x 1 replica, channels registered: billing\n"
        )
        topic = cluster.topics["orders"]
        assert (topic.partition_num, topic.disable_channel_auto_create) == (3, True)
        assert topic.registered_channels == ["billing"]
        env = _env(SMARTNSQ_LOOKUPD=cluster.lookupd_url)
        result = await smartnsq("channel", "create", "orders", "audit", env=env)
        assert (result.rc, result.out) == (0, "channel orders/audit: registered\n")
        assert topic.registered_channels == ["billing", "audit"]


async def test_channel_create_on_a_topic_that_auto_creates_channels_fails_in_one_line() -> None:
    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("t")
        result = await smartnsq("channel", "create", "t", "c", "--lookupd", cluster.lookupd_url)
        assert result.rc == 1
        (line,) = result.err_lines
        assert line.startswith("smartnsq channel: error: cannot register channel 'c'")
        assert "disable_channel_auto_create" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("topic", "create", "bad name"), "invalid topic name"),
        (
            ("topic", "create", "t", "--partitions", "0", "--lookupd", "127.0.0.1:1"),
            "partitions: must be an int in 1..254",
        ),
        (("channel", "create", "t", "bad name"), "invalid channel name"),
        (("topic", "create", "t"), "give --lookupd URL or --nsqd-http HOST:PORT"),
    ],
)
async def test_mistakes_exit_2_before_sending(args: tuple[str, ...], message: str) -> None:
    result = await smartnsq(*args)
    assert result.rc == 2, result
    (line,) = result.err_lines
    assert message in line


async def test_classic_through_nsqd_http() -> None:
    async with Cluster(classic=True) as cluster:
        http = cluster.nsqd_http_addresses[0]
        result = await smartnsq("topic", "create", "t", "--channel", "c", "--nsqd-http", http)
        assert result.rc == 0, result
        assert list(cluster.nodes[0].classic_topics["t"].channels) == ["c"]
        result = await smartnsq("topic", "delete", "t", "--nsqd-http", http)
        assert (result.rc, result.out) == (0, "topic t: deleted\n")
        assert "t" not in cluster.nodes[0].classic_topics


async def test_a_topic_that_cannot_be_placed_is_a_usage_error_in_words() -> None:
    """issue 21: `topic create --replicas 5` on 4 nodes printed nsqlookupd's raw
    "ErrType:9 ErrCode:1 : No node is available for topic"."""
    async with Cluster(nodes=4) as cluster:
        result = await smartnsq(
            "topic", "create", "t", "--replicas", "5", "--lookupd", cluster.lookupd_url
        )
        assert result.rc == 2, result
        (line,) = result.err_lines
        assert line == (
            "smartnsq topic: error: replicas: 5 replicas asked, but the cluster has 4 nsqd "
            "nodes: every replica of a partition needs a node of its own; ask for at most 4"
        )
        result = await smartnsq(
            "topic", "create", "t", "--partitions", "3", "--replicas", "2",
            "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert result.rc == 2, result
        assert "3 partitions x 2 replicas need 6 nsqd nodes" in result.err_lines[0]
        assert "--multi-part" in result.err_lines[0]
        assert "t" not in cluster.topics
        result = await smartnsq(
            "topic", "create", "t", "--partitions", "3", "--replicas", "2", "--multi-part",
            "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert (result.rc, result.out) == (0, "topic t: 3 partitions x 2 replicas (multi-part)\n")
        assert cluster.topics["t"].multi_part


async def test_channel_create_of_no_topic_says_which() -> None:
    """issue 21: `channel create nosuch c` printed only "Key not found"."""
    async with Cluster(nodes=1) as cluster:
        result = await smartnsq(
            "channel", "create", "nosuch", "c", "--lookupd", cluster.lookupd_url
        )
        assert result.rc == 1
        (line,) = result.err_lines
        assert line.startswith(
            "smartnsq channel: error: cannot register channel 'c': the cluster has no topic "
            "'nosuch'; create the topic first"
        )
        assert line.endswith("/channel/create: Key not found)")


async def test_classic_topic_create_says_what_classic_made() -> None:
    """issue 21: on classic NSQ `topic create` printed "1 partition x 1 replica"."""
    async with Cluster(classic=True) as cluster:
        result = await smartnsq(
            "topic", "create", "events", "--channel", "c", "--lookupd", cluster.lookupd_url
        )
        assert (result.rc, result.out) == (
            0,
            "topic events: created on every nsqd (classic NSQ: no partitions or replicas), "
            "channels: c\n",
        )
