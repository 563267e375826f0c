"""smartnsq.testing.netns: servers in a network namespace of their own, the link cut (set
down) and restored: a true partition. Skipped where namespaces cannot be made (not root,
no ``ip netns``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

import smartnsq
from smartnsq.errors import ValidationError
from smartnsq.testing.netns import (
    Netns,
    NetnsCluster,
    NetnsError,
    netns_unavailable_reason,
)

REASON = netns_unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=REASON or "")

WAIT = 10.0
SILENCE = 0.3
ECHO = """
import socket
server = socket.create_server((%r, 7000))
print("listening", flush=True)
client, _ = server.accept()
while data := client.recv(100):
    client.sendall(data)
"""


def _exists(*command: str) -> str:
    return subprocess.run(["ip", *command], capture_output=True, text=True, check=False).stdout


@needs_netns
async def test_a_partition_is_silent_both_ways_and_heals() -> None:
    async with Netns() as ns:
        assert ns.name in _exists("netns", "list")
        server = await ns.spawn(
            sys.executable, "-c", ECHO % ns.address, stdout=asyncio.subprocess.PIPE
        )
        assert server.stdout is not None
        assert await asyncio.wait_for(server.stdout.readline(), WAIT) == b"listening\n"
        reader, writer = await asyncio.open_connection(ns.address, 7000)
        writer.write(b"a")
        assert await asyncio.wait_for(reader.readexactly(1), WAIT) == b"a"
        ns.partition()
        ns.partition()  # idempotent
        writer.write(b"b")
        with pytest.raises(asyncio.TimeoutError):  # no answer, no FIN, no RST
            await asyncio.wait_for(reader.read(1), SILENCE)
        with pytest.raises((asyncio.TimeoutError, OSError)):  # OSError: no route
            await asyncio.wait_for(asyncio.open_connection(ns.address, 7000), SILENCE)
        ns.heal()
        assert await asyncio.wait_for(reader.readexactly(1), WAIT) == b"b"  # retransmitted
        writer.close()
        name, veth = ns.name, ns.host_veth
    assert name not in _exists("netns", "list")
    assert veth not in _exists("link", "show")
    assert server.returncode is not None


@needs_netns
async def test_a_cluster_in_a_namespace() -> None:
    async with NetnsCluster("--classic", "--topic", "t", "--channel", "t:c") as cluster:
        address = cluster.nsqd_addresses[0]
        assert address.startswith(cluster.netns.address + ":")
        received: list[bytes] = []
        both = asyncio.Event()

        def handle(message: smartnsq.Message) -> None:
            received.append(message.body)
            if len(received) == 2:
                both.set()

        consumer = smartnsq.Consumer("t", "c", lookupd=[cluster.lookupd_url], handler=handle)
        async with smartnsq.Producer(nsqd=[address]) as producer, consumer:
            await producer.publish("t", b"before")
            cluster.partition()
            assert cluster.partitioned
            publish = asyncio.ensure_future(producer.publish("t", b"during"))
            done, _ = await asyncio.wait({publish}, timeout=SILENCE)
            assert not done
            cluster.heal()
            await asyncio.wait_for(publish, WAIT)
            await asyncio.wait_for(both.wait(), WAIT)
        assert received == [b"before", b"during"]
        process = cluster._process
    assert process is not None
    assert process.returncode is not None


async def test_bad_arguments() -> None:
    with pytest.raises(ValidationError, match="--host"):
        NetnsCluster("--host", "0.0.0.0")
    with pytest.raises(NetnsError, match="not made"):
        Netns().partition()


@needs_netns
async def test_a_bad_subnet() -> None:
    with pytest.raises(ValidationError, match="subnet"):
        await Netns(subnet="10.213.9.0/31").start()
