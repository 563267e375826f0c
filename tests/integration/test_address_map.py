"""address_map over real sockets: the embedded cluster announces addresses nobody can reach
(``Cluster(broadcast_address=...)``, like nsqd in a container announcing its hostname) and
the clients map them to the real ones."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import httpx
import pytest

import smartnsq
from smartnsq import sync
from smartnsq.admin import Admin
from smartnsq.errors import NSQError, PublishError, ValidationError
from smartnsq.testing import Cluster
from smartnsq.transport.lookup import LookupManager

# Never resolved: every address announced with it is mapped before anything connects.
HIDDEN = "nsqd.in-a-container"
# Announced without a map: loopback, but nothing listens there (connections are refused).
UNREACHABLE = "127.0.0.2"


def real_addresses(cluster: Cluster, announced: str) -> dict[str, str]:
    """announced host:port -> local host:port, for every nsqd (TCP, HTTP) and lookupd."""
    mapping = {}
    for node in cluster.nodes:
        mapping[f"{announced}:{node.tcp_port}"] = node.tcp_address
        mapping[f"{announced}:{node.http_port}"] = node.http_address
    for lookupd in cluster.lookupds:
        mapping[f"{announced}:{lookupd.http_port}"] = lookupd.url.removeprefix("http://")
    return mapping


@pytest.fixture
async def hidden() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=3, broadcast_address=HIDDEN) as cluster:
        await cluster.create_topic("orders", partitions=3, replicas=2, channels=["billing"])
        yield cluster


async def test_the_cluster_announces_its_broadcast_address(hidden: Cluster) -> None:
    async with LookupManager([hidden.lookupd_url]) as manager:
        layout = await manager.lookup("orders", "w")
        each = await manager.lookup_each("orders", "r")
    assert {node.broadcast_address for node in layout.nodes} == {HIDDEN}
    assert {node.tcp_port for node in layout.nodes} == {n.tcp_port for n in hidden.nodes}
    # /listlookup named the lookupd by its broadcast address too: it is known, failing.
    assert each[0].layout is not None
    assert len(each) == 2
    assert each[1].lookupd == f"{HIDDEN}:{hidden.lookupds[0].http_port}"
    assert each[1].failure


async def test_publish_and_consume_through_a_dict(hidden: Cluster) -> None:
    mapping = real_addresses(hidden, HIDDEN)
    received: list[smartnsq.Message] = []
    done = asyncio.Event()

    async def handle(message: smartnsq.Message) -> None:
        received.append(message)
        if len(received) == 6:
            done.set()

    async with smartnsq.Producer(lookupd=[hidden.lookupd_url], address_map=mapping) as producer:
        results = [
            await producer.publish("orders", f"m{i}".encode(), partition=i % 3) for i in range(6)
        ]
    local = set(hidden.nsqd_addresses)
    assert {r.address for r in results} <= local
    assert {r.partition for r in results} == {0, 1, 2}
    consumer = smartnsq.Consumer(
        "orders", "billing", lookupd=[hidden.lookupd_url], handler=handle,
        max_in_flight=10, address_map=mapping,
    )  # fmt: skip
    async with consumer:
        await asyncio.wait_for(done.wait(), 10)
    assert sorted(m.body for m in received) == [f"m{i}".encode() for i in range(6)]
    assert {m.address for m in received} <= local
    await hidden.wait_for(lambda: hidden.unfinished("orders", "billing") == 0)


async def test_http_addresses_and_lookupds_are_mapped(hidden: Cluster) -> None:
    mapping = real_addresses(hidden, HIDDEN)
    async with LookupManager([hidden.lookupd_url], address_map=mapping) as manager:
        layout = await manager.lookup("orders", "r")
        each = await manager.lookup_each("orders", "r")
    assert sorted(n.http_address for n in layout.nodes) == sorted(hidden.nsqd_http_addresses)
    assert {n.announced.rpartition(":")[0] for n in layout.nodes} == {HIDDEN}
    # The lookupd listed by /listlookup is the seed itself once mapped: asked once, answering.
    assert [a.lookupd for a in each] == [hidden.lookupd_url.removeprefix("http://")]
    assert not each[0].failure


async def test_a_resolver_follows_a_moving_node(hidden: Cluster) -> None:
    calls: list[str] = []

    def resolver(address: str) -> str:
        calls.append(address)
        return real_addresses(hidden, HIDDEN).get(address, address)

    async with smartnsq.Producer(lookupd=[hidden.lookupd_url], address_map=resolver) as producer:
        result = await producer.publish("orders", b"x", partition=1)
    assert result.address == hidden.nodes[hidden.leader("orders", 1)].tcp_address
    assert f"{HIDDEN}:{hidden.nodes[0].tcp_port}" in calls


async def test_a_bad_resolver_answer_fails_before_anything_is_sent(hidden: Cluster) -> None:
    producer = smartnsq.Producer(
        lookupd=[hidden.lookupd_url], address_map=lambda address: "nowhere", publish_timeout=5
    )
    try:
        # start() already asks /listlookup, whose lookupd address goes through the resolver.
        with pytest.raises(ValidationError, match="the resolver's answer for"):
            await producer.start()
        with pytest.raises(ValidationError, match="the resolver's answer for"):
            await producer.publish("orders", b"x", partition=0)
    finally:
        await producer.close()
    assert hidden.messages("orders") == []


async def test_without_a_map_the_announced_address_is_unreachable() -> None:
    async with Cluster(nodes=1, broadcast_address=UNREACHABLE) as cluster:
        await cluster.create_topic("orders", channels=["billing"])
        async with smartnsq.Producer(
            lookupd=[cluster.lookupd_url], publish_timeout=1.0, connect_timeout=1.0
        ) as producer:
            with pytest.raises(PublishError) as caught:
                await producer.publish("orders", b"lost")
        assert f"{UNREACHABLE}:{cluster.nodes[0].tcp_port}" in str(caught.value)
        assert cluster.messages("orders") == []
        mapping = {f"{UNREACHABLE}:{cluster.nodes[0].tcp_port}": cluster.nsqd_addresses[0]}
        async with smartnsq.Producer(
            lookupd=[cluster.lookupd_url], address_map=mapping
        ) as producer:
            assert (await producer.publish("orders", b"found")).address == cluster.nsqd_addresses[0]
        assert [r.body for r in cluster.messages("orders")] == [b"found"]


def test_address_map_is_checked_when_the_client_is_built() -> None:
    with pytest.raises(ValidationError, match="address_map"):
        smartnsq.Producer(lookupd=["127.0.0.1:4161"], address_map={"nsqd0": "127.0.0.1:1"})
    with pytest.raises(ValidationError, match="needs lookupd"):
        smartnsq.Producer(nsqd=["127.0.0.1:4150"], address_map={"a:1": "b:2"})
    with pytest.raises(ValidationError, match="address_map"):
        smartnsq.Consumer("t", "c", lookupd=["127.0.0.1:4161"], address_map={"a:1": "b:0"})
    manager = LookupManager(["127.0.0.1:4161"])
    with pytest.raises(ValidationError, match="give it to the LookupManager"):
        smartnsq.Producer(lookup_manager=manager, address_map={"a:1": "b:2"})


async def test_sync_facade_forwards_the_map(hidden: Cluster) -> None:
    mapping = real_addresses(hidden, HIDDEN)

    def publish() -> str:
        with sync.Producer(lookupd=[hidden.lookupd_url], address_map=mapping) as producer:
            return producer.publish("orders", b"blocking", partition=2).address

    address = await asyncio.to_thread(publish)
    assert address == hidden.nodes[hidden.leader("orders", 2)].tcp_address


async def test_cli_address_map_option_and_environment(hidden: Cluster) -> None:
    mapping = real_addresses(hidden, HIDDEN)
    options = [f"--address-map={k}={v}" for k, v in mapping.items()]
    pub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "pub", "orders", "--lookupd", hidden.lookupd_url,
        "--partition", "0", *options, "cli",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(pub.communicate(), 30)
    assert pub.returncode == 0, err.decode()
    assert [r.body for r in hidden.messages("orders", 0)] == [b"cli"]

    env_map = ",".join(f"{k}={v}" for k, v in mapping.items())
    lookup = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "lookup", "orders", "--lookupd", hidden.lookupd_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**_clean_env(), "SMARTNSQ_ADDRESS_MAP": env_map},
    )  # fmt: skip
    out, err = await asyncio.wait_for(lookup.communicate(), 30)
    assert lookup.returncode == 0, err.decode()
    assert HIDDEN not in out.decode()
    assert hidden.nsqd_addresses[0] in out.decode()


async def test_cli_bad_address_map_is_a_usage_error() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "pub", "orders", "--lookupd", "127.0.0.1:4161",
        "--address-map", "nsqd0:4150", "x",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_clean_env(),
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().splitlines() == [
        "smartnsq pub: error: --address-map 'nsqd0:4150': expected FROM=TO (host:port=host:port)"
    ]


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("SMARTNSQ_")}


async def test_fixed_ports_host_and_broadcast_address() -> None:
    async with Cluster(nodes=2, host="0.0.0.0", broadcast_address=HIDDEN) as probe:
        base = probe.lookupds[0].http_port  # a port the OS just gave out (freed below)
    try:
        cluster = Cluster(nodes=2, host="0.0.0.0", lookupd_port=base, broadcast_address=HIDDEN)
        await cluster.start()
    except OSError:
        pytest.skip(f"port block {base}.. was taken meanwhile")
    try:
        assert cluster.lookupd_url == f"http://127.0.0.1:{base}"
        assert cluster.nsqd_addresses == [f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 3}"]
        assert cluster.nsqd_http_addresses == [f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 4}"]
        await cluster.stop_node(1)
        await cluster.start_node(1)  # the same ports again
        assert cluster.nsqd_addresses[1] == f"127.0.0.1:{base + 3}"
    finally:
        await cluster.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"broadcast_address": "0.0.0.0"}, "must name a host"),
        ({"broadcast_address": ""}, "must name a host"),
        ({"lookupd_port": -1}, "lookupd_port"),
        ({"lookupd_port": 4161, "nsqd_port": 4160}, "overlap"),
        ({"nsqd_port": 65534}, "go past 65535"),
    ],
)
def test_cluster_address_arguments_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(NSQError, match=message):
        Cluster(nodes=3, **kwargs)  # type: ignore[arg-type]


async def test_admin_creates_topics_through_the_map(hidden: Cluster) -> None:
    mapping = real_addresses(hidden, HIDDEN)
    async with Admin([hidden.lookupd_url], address_map=mapping) as admin:
        await admin.create_topic("audit", 1, 3, channels=["archive"], wait=10)
    assert len(hidden.topology("audit")[0]["replicas"]) == 3
    async with smartnsq.Producer(lookupd=[hidden.lookupd_url], address_map=mapping) as producer:
        assert (await producer.publish("audit", b"a", partition=0)).partition == 0


async def test_admin_classic_nodes_through_the_map() -> None:
    async with Cluster(classic=True, broadcast_address=UNREACHABLE) as cluster:
        # classic nsqd registers with nsqlookupd once it has a topic
        cluster.classic_topic(cluster.nodes[0], "bootstrap")
        async with Admin([cluster.lookupd_url], timeout=2) as admin:
            # (Admin lets httpx's ConnectError through here rather than an NSQError)
            with pytest.raises((NSQError, httpx.ConnectError)):
                await admin.create_topic("events", channels=["c"], wait=None)
        mapping = {
            f"{UNREACHABLE}:{cluster.nodes[0].http_port}": cluster.nsqd_http_addresses[0],
        }
        async with Admin([cluster.lookupd_url], address_map=mapping) as admin:
            await admin.create_topic("events", channels=["c"])
        assert "c" in cluster.nodes[0].classic_topics["events"].channels
