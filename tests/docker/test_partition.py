"""ContainerCluster.partition / heal: a node cut off the cluster's network (docker network
disconnect) and joined again. Between containers the link goes silent and comes back;
from the host the published ports go with the network."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from testcontainers.core.container import DockerContainer

from smartnsq.testing.containers import EmbeddedContainerCluster

WAIT = 20.0

# Runs in a container on the cluster's network: publishes every 0.2 s on one connection to
# the node and prints each change between "answered" and "silent" (no answer within 0.5 s,
# the connection still open), or "closed" when the connection ends.
PROBE = """
import socket, struct, time

def recvn(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError("closed")
        data += chunk
    return data

def frame(s):
    size, _ = struct.unpack(">ii", recvn(s, 8))
    return recvn(s, size - 4)

s = socket.create_connection(("smartnsq", 4162), 5)
s.sendall(b"  V2IDENTIFY\\n" + struct.pack(">i", 2) + b"{}")
frame(s)
s.settimeout(0.5)
state = None
while True:
    s.sendall(b"PUB t\\n" + struct.pack(">i", 1) + b"x")
    try:
        frame(s)
        new = "answered"
    except socket.timeout:
        new = "silent"
    except (OSError, EOFError) as exc:
        print("closed", repr(exc), flush=True)
        break
    if new != state:
        print(new, flush=True)
        state = new
    time.sleep(0.2)
"""


@pytest.fixture
def embedded(embedded_image: str) -> Iterator[EmbeddedContainerCluster]:
    with EmbeddedContainerCluster(
        1, image=embedded_image, topics=["t:1:1"], channels=["t:c"]
    ) as cluster:
        yield cluster


def _probe_log(probe: DockerContainer) -> list[str]:
    return bytes(probe.get_wrapped_container().logs()).decode().split()


def _wait_log(probe: DockerContainer, expected: list[str]) -> None:
    """Wait until the probe printed ``expected`` (its whole log so far)."""
    deadline = time.monotonic() + WAIT
    while _probe_log(probe) != expected:
        if time.monotonic() > deadline or len(_probe_log(probe)) > len(expected):
            raise AssertionError(f"the probe printed {_probe_log(probe)}, not {expected}")
        time.sleep(0.1)  # polling another process's log: there is no event to wait on


def test_between_containers_a_partition_is_silent_and_heals(
    embedded: EmbeddedContainerCluster,
) -> None:
    assert embedded._network is not None
    probe = DockerContainer(embedded.image).with_network(embedded._network)
    probe.with_kwargs(entrypoint=["python3", "-c", PROBE])
    probe.start()
    try:
        _wait_log(probe, ["answered"])
        embedded.partition(0)
        assert embedded.partitioned(0)
        _wait_log(probe, ["answered", "silent"])  # open, and nothing comes back
        embedded.heal(0)
        assert not embedded.partitioned(0)
        _wait_log(probe, ["answered", "silent", "answered"])  # the same connection
    finally:
        probe.get_wrapped_container().remove(force=True)


async def test_from_the_host_the_published_ports_go_and_come_back(
    embedded: EmbeddedContainerCluster,
) -> None:
    host, port = embedded.nsqd_addresses[0].rsplit(":", 1)
    async with embedded.producer() as producer:
        await producer.publish("t", b"before")
    reader, writer = await asyncio.open_connection(host, int(port))
    await asyncio.to_thread(embedded.partition, 0)
    await asyncio.to_thread(embedded.partition, 0)  # idempotent
    assert await asyncio.wait_for(reader.read(), WAIT) == b""  # closed by Docker's proxy
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection(host, int(port))
    await asyncio.to_thread(embedded.heal, 0)
    assert embedded.nsqd_addresses[0] == f"{host}:{port}"  # the same host port
    async with embedded.producer() as producer:
        result = await producer.publish("t", b"after")
    assert result.address == embedded.nsqd_addresses[0]
