"""``smartnsq channel seek`` and ``smartnsq channel lag`` against the embedded cluster."""

from __future__ import annotations

import json

import pytest

from smartnsq.protocol import commands as c
from smartnsq.testing import Cluster
from tests.integration.rawclient import RawClient
from tests.integration.test_cli import smartnsq


async def _cluster_with_messages(cluster: Cluster) -> None:
    """orders: partition 0 (node 0) holds 10 messages of 32 bytes, partition 1 (node 1) is
    empty; channel billing registered."""
    await cluster.create_topic("orders", 2, 1, channels=["billing"], placement={0: [0], 1: [1]})
    producer = await RawClient.identified(cluster.nsqd_addresses[0])
    await producer.ok(c.mpub("orders", [b"m%d" % i for i in range(10)], 0))
    await producer.close()


async def test_lag_prints_a_table_per_partition_and_json() -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        lookupd = ("--lookupd", cluster.lookupd_url)
        result = await smartnsq("channel", "lag", "orders", "billing", *lookupd)
        assert result.rc == 0, result
        p0, p1 = cluster.nsqd_http_addresses
        assert result.out.splitlines() == [
            "orders/billing",
            "  PARTITION  LEADER" + " " * (len(p0) - 4) + "START  END  POSITION  DEPTH  LAG",
            f"  0          {p0}  0      320  0         10     320",
            f"  1          {p1}  0      0    0         0      0",
        ]
        result = await smartnsq("channel", "lag", "orders", "billing", "--json", *lookupd)
        assert result.rc == 0, result
        assert json.loads(result.out) == {
            "topic": "orders",
            "channel": "billing",
            "partitions": [
                {"partition": 0, "leader": p0, "start": 0, "end": 320, "position": 0,
                 "depth": 10, "lag": 320},
                {"partition": 1, "leader": p1, "start": 0, "end": 0, "position": 0,
                 "depth": 0, "lag": 0},
            ],
        }  # fmt: skip
        result = await smartnsq("channel", "lag", "orders", "nobody", "--json", *lookupd)
        assert [p["position"] for p in json.loads(result.out)["partitions"]] == [None, None]


async def test_seek_moves_every_partition_or_the_ones_named() -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        lookupd = ("--lookupd", cluster.lookupd_url)
        result = await smartnsq(
            "channel", "seek", "orders", "billing", "--to", "earliest", *lookupd
        )
        assert result.rc == 0, result
        p0, p1 = cluster.nsqd_http_addresses
        assert result.out.splitlines() == [
            f"partition 0: moved to earliest, now at offset 0 of 320 ({p0})",
            "partition 1: no messages, left as it is",
            "channel orders/billing: 1 partition moved to earliest",
        ]
        # an empty partition has an end, though
        result = await smartnsq("channel", "seek", "orders", "billing", "--to", "latest", *lookupd)
        assert (
            result.out.splitlines()[1]
            == f"partition 1: moved to latest, now at offset 0 of 0 ({p1})"
        )
        result = await smartnsq(
            "channel", "seek", "orders", "billing", "--to", "msgcount:4", "--partition", "0",
            *lookupd,
        )  # fmt: skip
        assert result.rc == 0, result
        # the documented forms everywhere, whichever form was typed
        assert result.out.splitlines() == [
            f"partition 0: moved to message:4, now at offset 96 of 320 ({p0})",
            "channel orders/billing: 1 partition moved to message:4",
        ]
        lag = await smartnsq("channel", "lag", "orders", "billing", "--json", *lookupd)
        assert json.loads(lag.out)["partitions"][0]["position"] == 96


@pytest.mark.parametrize("to", ["message:999", "offset:1000000"])
async def test_a_seek_past_the_end_says_where_each_partition_went(to: str) -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        result = await smartnsq(
            "channel", "seek", "orders", "billing", "--to", to, "--partition", "0",
            "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert result.rc == 0, result
        p0 = cluster.nsqd_http_addresses[0]
        assert result.out.splitlines() == [
            f"partition 0: {to} lies past the end: moved to the end, offset 320 ({p0})",
            f"channel orders/billing: 1 partition moved to {to} (1 of them past the end: "
            "moved to the end)",
        ]


async def test_a_timestamp_with_a_fraction_of_a_second() -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        result = await smartnsq(
            "channel", "seek", "orders", "billing", "--to", "timestamp:1795765880.5",
            "--partition", "0", "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert result.rc == 0, result
        assert result.out.splitlines()[-1] == (
            "channel orders/billing: 1 partition moved to timestamp:1795765880"
        )


@pytest.mark.parametrize(
    ("args", "rc", "message"),
    [
        (("--to", "first"), 2, "invalid --to: 'first': expected earliest, latest"),
        (("--to", "offset:-1"), 2, "invalid --to: must be >= 0"),
        (("--to", "message:0"), 2, "invalid --to: 'message:0': messages count from 1"),
        # milliseconds would wrap round in nsqd's nanoseconds and move the channel to its end
        (("--to", "timestamp:1795862637877"), 2, "in milliseconds? divide by 1000"),
        (("--to", "earliest", "--partition", "-1"), 2, "partitions: must be"),
        (("--to", "earliest", "--partition", "5"), 2, "partitions 0..1, not 5"),
        (("--to", "earliest"), 0, None),
    ],
)
async def test_seek_exit_codes(args: tuple[str, ...], rc: int, message: str | None) -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        result = await smartnsq(
            "channel", "seek", "orders", "billing", *args, "--lookupd", cluster.lookupd_url
        )
        assert result.rc == rc, result
        if message is not None:
            (line,) = result.err_lines
            assert line.startswith("smartnsq channel: error: ")
            assert message in line


async def test_a_refused_seek_fails_with_exit_1() -> None:
    async with Cluster(nodes=2) as cluster:
        await _cluster_with_messages(cluster)
        result = await smartnsq(
            "channel", "seek", "orders", "nobody", "--to", "earliest",
            "--lookupd", cluster.lookupd_url,
        )  # fmt: skip
        assert result.rc == 1, result
        (line,) = result.err_lines
        assert "CHANNEL_NOT_FOUND" in line


async def test_classic_nsqd_has_no_offsets() -> None:
    async with Cluster(classic=True) as cluster:
        http = ("--nsqd-http", cluster.nsqd_http_addresses[0])
        for args in (("seek", "t", "c", "--to", "earliest"), ("lag", "t", "c")):
            result = await smartnsq("channel", *args, *http)
            assert result.rc == 2, result
            (line,) = result.err_lines
            assert "classic nsqd has no queue offsets" in line
