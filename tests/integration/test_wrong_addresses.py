"""An address that answers, but is not what it was given as, fails at once and says so
(issue 13: a bare TimeoutError after connect_timeout, or 40 s of retries ending in HTTP 404)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

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
