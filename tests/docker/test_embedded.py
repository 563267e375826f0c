"""EmbeddedContainerCluster: the smartnsq image's emulator in a container, reached from the
host through random published ports and the address map."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import docker
import pytest

import smartnsq
from smartnsq import sync
from smartnsq.testing.containers import (
    LABEL,
    ContainerClusterError,
    EmbeddedContainerCluster,
    YouzanContainerCluster,
)
from smartnsq.transport.lookup import LookupManager


@pytest.fixture(scope="module")
def embedded(embedded_image: str) -> Iterator[EmbeddedContainerCluster]:
    cluster = EmbeddedContainerCluster(
        3, image=embedded_image, topics=["orders:3:2"], channels=["orders:billing"]
    )
    with cluster:
        yield cluster


async def test_ready_with_addresses_on_the_host(embedded: EmbeddedContainerCluster) -> None:
    assert embedded.lookupd_url.startswith("http://127.0.0.1:")
    assert len(embedded.nsqd_addresses) == 3
    assert all(a.startswith("127.0.0.1:") for a in embedded.nsqd_addresses)
    # Published on random host ports, not the container's own.
    assert not {int(a.rpartition(":")[2]) for a in embedded.nsqd_addresses} & set(range(4161, 4168))
    client = docker.from_env()
    try:
        labelled = client.containers.list(filters={"label": f"{LABEL}={embedded.id}"})
        assert [c.id for c in labelled] == embedded.container_ids
        assert labelled[0].attrs["Config"]["Hostname"] == "smartnsq"
    finally:
        client.close()


async def test_lookupd_announces_the_container_and_the_map_translates(
    embedded: EmbeddedContainerCluster,
) -> None:
    async with LookupManager([embedded.lookupd_url]) as plain:
        announced = await plain.lookup("orders", "w")
    assert {node.broadcast_address for node in announced.nodes} == {"smartnsq"}
    assert {node.tcp_port for node in announced.nodes} <= {4162, 4164, 4166}
    async with LookupManager([embedded.lookupd_url], address_map=embedded.address_map) as mapped:
        layout = await mapped.lookup("orders", "w")
        each = await mapped.lookup_each("orders", "r")
    assert sorted(n.tcp_address for n in layout.nodes) == sorted(
        embedded.nsqd_addresses[n.tcp_port // 2 - 2081] for n in announced.nodes
    )
    assert {n.announced.rpartition(":")[0] for n in layout.nodes} == {"smartnsq"}
    # /listlookup names the lookupd "smartnsq:4161": mapped onto the seed, asked once.
    assert [a.lookupd for a in each] == [embedded.lookupd_url.removeprefix("http://")]


async def test_publish_and_consume_through_the_mapped_addresses(
    embedded: EmbeddedContainerCluster,
) -> None:
    bodies = [f"order {i}".encode() for i in range(30)]
    async with embedded.producer() as producer:
        results = [
            await producer.publish("orders", b, sharding_key=i) for i, b in enumerate(bodies)
        ]
    assert {r.address for r in results} <= set(embedded.nsqd_addresses)
    assert {r.partition for r in results} == {0, 1, 2}

    received: list[bytes] = []
    done = asyncio.Event()

    async def handle(message: smartnsq.Message) -> None:
        received.append(message.body)
        if len(received) >= len(bodies):
            done.set()

    async with embedded.consumer("orders", "billing", handler=handle, max_in_flight=50):
        await asyncio.wait_for(done.wait(), 20)
    assert sorted(received) == sorted(bodies)


async def test_create_topic_through_the_admin_api(embedded: EmbeddedContainerCluster) -> None:
    await embedded.create_topic("later", 3, 1, channels=["c"])
    async with embedded.producer() as producer:
        result = await producer.publish("later", b"created in the container", partition=2)
    assert result.address in embedded.nsqd_addresses


def test_sync_facade_with_the_map(embedded: EmbeddedContainerCluster) -> None:
    with sync.Producer(lookupd=[embedded.lookupd_url], address_map=embedded.address_map) as p:
        assert p.publish("orders", b"blocking", partition=0).address in embedded.nsqd_addresses


def _publish_once(cluster: EmbeddedContainerCluster, body: bytes) -> str:
    with sync.Producer(
        lookupd=[cluster.lookupd_url],
        address_map=cluster.address_map,
        publish_timeout=2.0,
        connect_timeout=2.0,
    ) as producer:
        return producer.publish("t", body, partition=0).address


def test_stop_kill_start_pause(embedded_image: str) -> None:
    with EmbeddedContainerCluster(
        1, image=embedded_image, topics=["t:1:1"], channels=["t:c"]
    ) as cluster:
        lookupd = cluster.lookupd_url
        address = _publish_once(cluster, b"before")

        started = time.monotonic()
        cluster.stop(0)  # SIGTERM: smartnsq cluster exits 0 at once
        assert time.monotonic() - started < 8
        state = cluster._service("smartnsq").container.get_wrapped_container().attrs["State"]
        assert state["ExitCode"] == 0
        with pytest.raises((smartnsq.NSQError, TimeoutError)):  # start() times out
            _publish_once(cluster, b"while stopped")
        cluster.start(0)
        assert cluster.lookupd_url == lookupd  # the same host ports after a restart
        assert _publish_once(cluster, b"after stop") == address

        cluster.kill(0)
        state = cluster._service("smartnsq").container.get_wrapped_container().attrs["State"]
        assert state["ExitCode"] == 137
        cluster.start(0)
        assert _publish_once(cluster, b"after kill") == address

        cluster.pause(0)
        with pytest.raises((smartnsq.NSQError, TimeoutError)):
            _publish_once(cluster, b"while paused")
        cluster.unpause(0)
        assert _publish_once(cluster, b"after pause") == address


@pytest.mark.nsq_docker("embedded", nodes=2, topics=["audit:2:1"], channels=["audit:log"])
async def test_the_pytest_fixture(nsq_docker_cluster: EmbeddedContainerCluster) -> None:
    async with nsq_docker_cluster.producer() as producer:
        result = await producer.publish("audit", b"x", partition=1)
    assert result.address in nsq_docker_cluster.nsqd_addresses


@pytest.mark.timeout(60)  # half the startup timeout: waiting it out fails the test
def test_a_container_that_exits_fails_the_start_at_once(embedded_image: str) -> None:
    """A youzan cluster whose images are not youzan's: etcd's command line reaches the
    smartnsq CLI, which exits 2. The start fails at once, naming the container and quoting
    its log, instead of waiting 120 s for an HTTP answer that cannot come."""
    cluster = YouzanContainerCluster(
        1, image=embedded_image, etcd_image=embedded_image, startup_timeout=120
    )
    with pytest.raises(ContainerClusterError) as caught:
        cluster.open()
    text = str(caught.value)
    assert text.startswith(
        f"container etcd ({embedded_image}) exited with code 2 before it was ready; "
        "the last lines of its log: smartnsq: error: "
    )
    assert "invalid choice: '/usr/local/bin/etcd'" in text
    client = docker.from_env()
    try:  # what was started is removed
        assert client.containers.list(all=True, filters={"label": f"{LABEL}={cluster.id}"}) == []
    finally:
        client.close()
