"""An address that answers, but is not what it was given as, fails at once and says so
(issue 13: a bare TimeoutError after connect_timeout, or 40 s of retries ending in HTTP 404)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from smartnsq.admin import Admin
from smartnsq.consumer.consumer import Consumer
from smartnsq.errors import NotLookupdError, NSQError, NSQTimeoutError, ProtocolError
from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster
from tests.integration.test_cli import smartnsq


@pytest.fixture
async def classic() -> AsyncIterator[Cluster]:
    async with Cluster(classic=True) as cluster:
        yield cluster


@pytest.fixture
async def web_page() -> AsyncIterator[str]:
    """An HTTP server that answers every request with an HTML 404 page."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        page = b"<html><body>Not Found</body></html>"
        writer.write(
            b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(page), page)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"127.0.0.1:{port}"
    server.close()
    await server.wait_closed()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """Accepts connections and never answers (a hung nsqd)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_an_nsqd_http_port_given_as_nsqd_tcp(classic: Cluster) -> None:
    producer = Producer(nsqd=[classic.nsqd_http_addresses[0]])
    with pytest.raises(ProtocolError, match=r"answered in HTTP .*not an nsqd TCP port"):
        await producer.start()


async def test_a_hung_nsqd(silent_port: int) -> None:
    producer = Producer(nsqd=[f"127.0.0.1:{silent_port}"], connect_timeout=0.5)
    with pytest.raises(NSQTimeoutError, match=r"could not start within 0\.5 s") as caught:
        await producer.start()
    assert isinstance(caught.value, TimeoutError)  # also the builtin, as documented
    assert "NSQ handshake" in str(caught.value)


@pytest.mark.parametrize("client", ["producer", "consumer"])
async def test_an_nsqd_http_port_given_as_nsqlookupd(classic: Cluster, client: str) -> None:
    http = classic.nsqd_http_addresses[0]
    tcp = classic.nsqd_addresses[0]
    if client == "producer":
        starting = Producer(lookupd=[http]).start()
    else:
        starting = Consumer("t", "c", lookupd=[http], handler=lambda m: None).start()
    with pytest.raises(NotLookupdError) as caught:
        await starting
    assert str(caught.value) == (
        f"http://{http} is an nsqd's HTTP address, not an nsqlookupd: give nsqlookupd's HTTP "
        f"address (default port 4161), or nsqd=['{tcp}'] to use that classic nsqd directly"
    )


@pytest.mark.parametrize("client", ["producer", "consumer"])
async def test_an_nsqd_tcp_port_given_as_nsqlookupd(classic: Cluster, client: str) -> None:
    """nsqd answers an HTTP request on its TCP port with E_BAD_PROTOCOL and closes: that
    address is named for what it is, at once, not retried as a lookupd that failed."""
    tcp = classic.nsqd_addresses[0]
    if client == "producer":
        starting = Producer(lookupd=[f"http://{tcp}"]).start()
    else:
        starting = Consumer("t", "c", lookupd=[f"http://{tcp}"], handler=lambda m: None).start()
    with pytest.raises(NotLookupdError) as caught:
        await asyncio.wait_for(starting, 10)
    assert str(caught.value) == (
        f"http://{tcp} is an nsqd's TCP address, not an nsqlookupd (it answered "
        "E_BAD_PROTOCOL): give nsqlookupd's HTTP address (default port 4161), or "
        f"nsqd=['{tcp}'] to use that classic nsqd directly"
    )


async def test_a_web_page_given_as_nsqlookupd(web_page: str) -> None:
    with pytest.raises(NotLookupdError, match="is not an nsqlookupd: it answers HTTP"):
        await Producer(lookupd=[web_page]).start()


async def test_the_cli_says_it_in_one_line(classic: Cluster) -> None:
    result = await smartnsq("pub", "t", "x", "--lookupd", classic.nsqd_http_addresses[0])
    assert result.rc == 1
    (line,) = result.err_lines
    assert "is an nsqd's HTTP address, not an nsqlookupd" in line
    result = await smartnsq("lookup", "t", "--lookupd", f"http://{classic.nsqd_addresses[0]}")
    assert result.rc == 1
    (line,) = result.err_lines
    assert "is an nsqd's TCP address, not an nsqlookupd (it answered E_BAD_PROTOCOL)" in line


def test_not_lookupd_is_not_retried() -> None:
    from smartnsq.flow.retry import is_retriable

    assert not is_retriable(NotLookupdError("x"))
    assert isinstance(NotLookupdError("x"), NSQError)


@pytest.mark.parametrize("classic", [False, True], ids=["youzan", "classic"])
async def test_admin_names_an_nsqd_given_as_nsqlookupd(classic: bool) -> None:
    """Every Admin call asks nsqlookupd first: an nsqd's HTTP or TCP address fails there,
    saying so, instead of "topic not found", "NOT_FOUND (HTTP 404)" or a wait that ends
    "not ready after 3 s"."""
    async with Cluster(nodes=1, classic=classic) as cluster:
        http, tcp = cluster.nsqd_http_addresses[0], cluster.nsqd_addresses[0]
        to_classic = f", or nsqd_http=['{http}'] to manage that classic nsqd directly"
        wrong = {
            http: f"http://{http} is an nsqd's HTTP address, not an nsqlookupd: give "
            "nsqlookupd's HTTP address (default port 4161)" + (to_classic if classic else ""),
            f"http://{tcp}": f"http://{tcp} is an nsqd's TCP address, not an nsqlookupd (it "
            "answered E_BAD_PROTOCOL): give nsqlookupd's HTTP address (default port 4161)",
        }
        calls = [
            lambda admin: admin.create_topic("t", channels=["c"], wait=3),
            lambda admin: admin.create_channel("t", "c", wait=3),
            lambda admin: admin.delete_topic("t"),
            lambda admin: admin.seek("t", "c", "earliest"),
            lambda admin: admin.offsets("t", "c"),
            lambda admin: admin.is_youzan(),
        ]
        for address, message in wrong.items():
            async with Admin([address]) as admin:
                for call in calls:
                    with pytest.raises(NotLookupdError) as caught:
                        await asyncio.wait_for(call(admin), 5)
                    assert str(caught.value) == message


async def test_admin_leaves_an_nsqd_out_when_a_lookupd_is_given_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Cluster(nodes=1) as cluster:
        http = cluster.nsqd_http_addresses[0]
        async with Admin([http, cluster.lookupd_url]) as admin:
            await admin.create_topic("t", channels=["c"], wait=None)
            assert [o.end for o in await admin.offsets("t", "c")] == [0]
    assert f"http://{http} is an nsqd's HTTP address, not an nsqlookupd" in caplog.text


async def test_the_cli_channel_lag_says_it_in_one_line(classic: Cluster) -> None:
    for address in (classic.nsqd_http_addresses[0], f"http://{classic.nsqd_addresses[0]}"):
        result = await smartnsq("channel", "lag", "t", "c", "--lookupd", address)
        assert result.rc == 1, result
        (line,) = result.err_lines
        assert line.startswith(
            f"smartnsq channel: error: http://{address.removeprefix('http://')} is an nsqd's "
        )
        assert "not an nsqlookupd" in line
