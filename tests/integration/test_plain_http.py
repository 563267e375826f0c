"""The lookup manager's own HTTP client (smartnsq.transport.plainhttp, through
httpclient.exchange) over real sockets: the answers' framings, keep-alive, and the typed
errors and bounds every exchange has."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable

import pytest

from smartnsq import errors
from smartnsq.errors import ConnectionClosedError, NSQTimeoutError, ProtocolError
from smartnsq.transport import plainhttp
from smartnsq.transport.httpclient import HttpClient, exchange, new_http_client
from smartnsq.transport.plainhttp import PlainHttp

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-NSQ-Content-Type: nsq; version=1.0\r\n"
    b"\r\n3;ext=1\r\nabc\r\n5\r\ndefgh\r\n0\r\nTrailer: x\r\n\r\n"
)
BOUND = 10.0

Script = Callable[[bytes], bytes | None]  # the request head -> the answer (None: hang up)


class RawHttp:
    """Answers each request with ``script(head)``, on as many connections as the client
    opens (closing each after one answer with ``close_after``, or hanging up on the request
    after ``answers`` answers); counts them and keeps the request heads."""

    def __init__(
        self, script: Script, *, close_after: bool = False, answers: int | None = None
    ) -> None:
        self.script = script
        self.close_after = close_after
        self.answers = answers
        self.connections = 0
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            for answered in itertools.count():
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                answer = self.script(head)
                if answer is None or answered == self.answers:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the server is closing
        finally:
            writer.close()
            self._handlers.discard(task)  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawHttp]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self._server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()


@contextlib.asynccontextmanager
async def client() -> AsyncIterator[HttpClient]:
    http = HttpClient(5.0)
    try:
        yield http
    finally:
        await http.aclose()


async def test_a_round_s_requests_share_a_kept_alive_connection() -> None:
    async with RawHttp(lambda head: OK).running() as server, client() as http:
        for _ in range(3):
            answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
            assert (answer.status, answer.body) == (200, b"ok")
        assert server.connections == 1


async def test_an_idle_connection_is_not_kept_past_keepalive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plainhttp, "KEEPALIVE", 0.0)
    async with RawHttp(lambda head: OK).running() as server, client() as http:
        await exchange(http, "GET", server.url + "/a", timeout=BOUND)
        await exchange(http, "GET", server.url + "/b", timeout=BOUND)
        assert server.connections == 2


async def test_a_kept_connection_the_server_closed_is_replaced() -> None:
    """The server hangs up on the next request (an idle timeout on its side, met as the
    connection was taken again): the GET goes again on a new connection, without an error."""
    async with RawHttp(lambda head: OK, answers=1).running() as server, client() as http:
        for _ in range(2):
            answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
            assert answer.body == b"ok"
        assert (server.connections, len(server.heads)) == (2, 3)


async def test_the_request_carries_its_query_host_and_headers() -> None:
    async with RawHttp(lambda head: OK).running() as server, client() as http:
        port = server.url.rsplit(":", 1)[1]
        await exchange(
            http,
            "GET",
            server.url + "/lookup",
            params={"topic": "t", "access": "w"},
            headers={"Accept": "application/vnd.nsq; version=1.0"},
            timeout=BOUND,
        )
    lines = server.heads[0].decode().split("\r\n")
    assert lines[0] == "GET /lookup?topic=t&access=w HTTP/1.1"
    assert f"Host: 127.0.0.1:{port}" in lines
    assert "Accept: application/vnd.nsq; version=1.0" in lines


async def test_a_chunked_answer_is_joined_and_its_headers_read() -> None:
    async with RawHttp(lambda head: CHUNKED).running() as server, client() as http:
        answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
        assert answer.body == b"abcdefgh"
        assert answer.headers["x-nsq-content-type"] == "nsq; version=1.0"
        await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)  # framed: kept
        assert server.connections == 1
    async with RawHttp(lambda head: CHUNKED).running() as server, client() as http:
        with pytest.raises(ProtocolError, match="over the 7 bytes read at most"):
            await exchange(http, "GET", server.url + "/lookup", timeout=BOUND, max_bytes=7)


async def test_an_answer_without_a_length_ends_with_its_connection() -> None:
    unframed = RawHttp(lambda head: b"HTTP/1.0 200 OK\r\n\r\nall", close_after=True)
    async with unframed.running() as server, client() as http:
        for _ in range(2):
            answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
            assert answer.body == b"all"
        assert server.connections == 2


async def test_interim_answers_are_skipped() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" + OK
    async with RawHttp(lambda head: interim).running() as server, client() as http:
        answer = await exchange(http, "GET", server.url + "/", timeout=BOUND)
        assert (answer.status, answer.body) == (200, b"ok")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "without answering"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not an HTTP/1.1 status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "mid-answer"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "no length"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header"),
        (b"\x00\x00\x00\x06\x00\x00\x00\x01E_BAD", "no HTTP status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\nok", "no length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "chunked"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nok\r\n0\r\n\r\n", "chunk"),
    ],
    ids=[
        "hang-up",
        "not-http",
        "cut-short",
        "bad-length",
        "bad-header",
        "no-line",
        "a-digit-no-int-takes",
        "gzip-coding",
        "0x-chunk-size",
    ],
)
async def test_what_is_no_answer_is_a_typed_error(answer: bytes | None, why: str) -> None:
    async with RawHttp(lambda head: answer, close_after=True).running() as server, client() as http:
        with pytest.raises(ConnectionClosedError, match=f"got no answer: .*{why}"):
            await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)


@pytest.mark.parametrize("through", ["plain", "httpx"])
async def test_an_nsqd_tcp_port_is_told_apart(through: str) -> None:
    """nsqd answers a request on its TCP port with its E_BAD_PROTOCOL frame and closes: not
    a connection that failed (retried), a wrong address (NotHttpError, not retriable).
    httpx does not show those bytes: what answered is asked again with a GET of its own."""
    bad_protocol = b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"
    nsqd_tcp = RawHttp(lambda head: bad_protocol, close_after=True)
    async with nsqd_tcp.running() as server:
        url = server.url
        http = HttpClient(5.0) if through == "plain" else new_http_client(5.0)
        try:
            with pytest.raises(errors.NotHttpError) as caught:
                await exchange(http, "POST", url + "/channel/setoffset", timeout=BOUND)
        finally:
            await http.aclose()
    address = url.removeprefix("http://")
    assert str(caught.value) == (
        f"{url}/channel/setoffset: {address} is an nsqd TCP port, not an HTTP address "
        "(it answered E_BAD_PROTOCOL, nsqd's answer to anything but its protocol); nsqd's "
        "HTTP API is on its HTTP port (default 4151), nsqlookupd's on 4161"
    )
    assert isinstance(caught.value, ProtocolError)
    assert not caught.value.retriable
    # httpx's POST is never sent again: the probe is a GET of "/"
    probed = [head.split(b" ", 2)[:2] for head in server.heads]
    assert probed == (
        [[b"POST", b"/channel/setoffset"]]
        if through == "plain"
        else [[b"POST", b"/channel/setoffset"], [b"GET", b"/"]]
    )


async def test_a_folded_header_is_joined_with_a_space() -> None:
    folded = b"HTTP/1.1 200 OK\r\nX-Note: first\r\n  second\r\nContent-Length: 2\r\n\r\nok"
    async with RawHttp(lambda head: folded).running() as server, client() as http:
        answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
        assert (answer.headers["x-note"], answer.body) == ("first second", b"ok")


async def test_chunked_beside_a_length_is_read_and_its_connection_not_kept() -> None:
    both = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n"
    both += b"2\r\nok\r\n0\r\n\r\n"
    async with RawHttp(lambda head: both).running() as server, client() as http:
        for _ in range(2):
            answer = await exchange(http, "GET", server.url + "/lookup", timeout=BOUND)
            assert answer.body == b"ok"
        assert server.connections == 2


async def test_nothing_listening_is_a_typed_error() -> None:
    async with RawHttp(lambda head: OK).running() as server:
        url = server.url
    async with client() as http:
        with pytest.raises(ConnectionClosedError, match="got no answer"):
            await exchange(http, "GET", url + "/lookup", timeout=BOUND)


async def test_a_silent_server_is_bounded_by_the_deadline() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()  # never answers
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, client() as http:
        with pytest.raises(NSQTimeoutError, match=r"no complete answer within 0\.2 s"):
            await exchange(http, "GET", f"http://127.0.0.1:{port}/lookup", timeout=0.2)


async def test_https_and_proxied_requests_go_through_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    async with client() as direct:
        assert isinstance(direct.route("http://127.0.0.1:4161/lookup"), PlainHttp)
        assert not isinstance(direct.route("https://127.0.0.1:4161/lookup"), PlainHttp)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    async with client() as proxied:
        assert not isinstance(proxied.route("http://127.0.0.1:4161/lookup"), PlainHttp)
