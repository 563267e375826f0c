"""HTTP/1.1 over asyncio for the client's own plain-http requests to nsqlookupd (``/lookup``,
``/listlookup``, ``/nodes``, ``/info``): what httpx does for them, without loading httpx,
httpcore and anyio first. A short-lived process pays for those on its first lookup: measured,
most of the time from a new Producer to its first publish (``docs/performance.md``).

Only what those answers need: one request (a query, optionally a body), an answer framed by
``Content-Length``, chunked, or the end of the connection; connections kept alive for
``KEEPALIVE`` seconds (as httpx does), so a round's requests to one lookupd share one. No
TLS, proxies, redirects or content encodings: :mod:`smartnsq.transport.httpclient` sends
those requests through httpx. The caller bounds a request in time; :meth:`PlainHttp.request`
bounds its answer's size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit

from smartnsq._version import __version__

__all__ = [
    "KEEPALIVE",
    "AnswerTooLarge",
    "InvalidURL",
    "MalformedAnswer",
    "NotHttpAnswer",
    "PlainHttp",
]

#: Seconds an idle connection is kept for the next request (httpx's default keepalive_expiry).
KEEPALIVE = 5.0
_MAX_IDLE = 4  # idle connections kept per address
_MAX_HEAD = 64 * 1024  # the status line and headers, at most
_MAX_HEADERS = 100
_READ = 64 * 1024
_USER_AGENT = f"smartnsq/{__version__}"

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AnswerTooLarge(Exception):
    """The answer is larger than the request allows; ``how``: what showed it."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


class MalformedAnswer(Exception):
    """What came back is not an HTTP/1.1 answer (httpx: ``RemoteProtocolError``)."""


class NotHttpAnswer(MalformedAnswer):
    """The server sent bytes without an HTTP status line among them and closed the
    connection; ``received``: those bytes (an nsqd TCP port sends its E_BAD_PROTOCOL
    frame)."""

    def __init__(self, received: bytes) -> None:
        super().__init__(
            f"the server sent {len(received)} bytes that are no HTTP status line "
            f"({received[:40]!r}) and closed the connection"
        )
        self.received = received


class InvalidURL(ValueError):
    """The URL names no http host and port (httpx: ``InvalidURL``)."""


class _Unanswered(ConnectionResetError):
    """The server closed the connection before any byte of an answer."""


class PlainHttp:
    """Requests to ``http://`` URLs, the idle connections kept per address."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[tuple[_Stream, float]]] = {}
        self._closed = False

    async def request(
        self,
        method: str,
        url: str,
        *,
        max_bytes: int,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body). Raises :class:`InvalidURL` before
        anything is sent, OSError when nothing answers, :class:`MalformedAnswer` or
        :class:`AnswerTooLarge`."""
        address, request = _request(method, url, params, content, headers)
        stream = self._take_idle(address)
        if stream is not None:
            try:
                return await self._exchange(address, stream, request, method, max_bytes)
            except _Unanswered:
                if method not in ("GET", "HEAD"):
                    raise
                # The server closed the kept connection as it was taken: a new one.
        stream = await asyncio.open_connection(*address, limit=_MAX_HEAD)
        return await self._exchange(address, stream, request, method, max_bytes)

    async def _exchange(
        self, address: tuple[str, int], stream: _Stream, request: bytes, method: str, max_bytes: int
    ) -> tuple[int, dict[str, str], bytes]:
        reader, writer = stream
        reusable = False
        try:
            try:
                writer.write(request)
                await writer.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _Unanswered(f"the server closed the connection: {exc}") from None
            status, headers, body, reusable = await _read_answer(reader, method, max_bytes)
        finally:
            if reusable and not self._closed:
                self._keep(address, stream)
            else:
                writer.close()
        return status, headers, body

    def _take_idle(self, address: tuple[str, int]) -> _Stream | None:
        """The connection to ``address`` idle for the shortest time, if the server has not
        closed it and it has been idle less than ``KEEPALIVE``; the others met are closed."""
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            (reader, writer), since = idle.pop()
            if now - since < KEEPALIVE and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    def _keep(self, address: tuple[str, int], stream: _Stream) -> None:
        idle = self._idle.setdefault(address, [])
        idle.append((stream, time.monotonic()))
        if len(idle) > _MAX_IDLE:
            (_, oldest), _ = idle.pop(0)
            oldest.close()

    async def aclose(self) -> None:
        """Close the idle connections; requests made afterwards are not kept alive."""
        self._closed = True
        idle, self._idle = self._idle, {}
        writers = [writer for streams in idle.values() for (_, writer), _ in streams]
        for writer in writers:
            writer.close()
        for writer in writers:
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the server had closed it already


def _request(
    method: str,
    url: str,
    params: Mapping[str, str] | None,
    content: bytes | None,
    headers: Mapping[str, str] | None,
) -> tuple[tuple[str, int], bytes]:
    """The address to connect to and the request's bytes."""
    parts = urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        raise InvalidURL(f"{url!r}: invalid port") from None
    if parts.scheme != "http" or not parts.hostname:
        raise InvalidURL(f"{url!r}: not a plain http URL")
    target = parts.path or "/"
    query = "&".join(q for q in (parts.query, urlencode(params) if params else "") if q)
    if query:
        target += "?" + query
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {parts.netloc.rpartition('@')[2]}",
        f"User-Agent: {_USER_AGENT}",
    ]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if content is not None or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(content or b'')}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return (parts.hostname, port), head + content if content else head


async def _read_answer(
    reader: asyncio.StreamReader, method: str, max_bytes: int
) -> tuple[int, dict[str, str], bytes, bool]:
    """(status, headers, body, whether the connection can carry another request)."""
    while True:
        version, status, headers = await _read_head(reader)
        if not 100 <= status < 200:
            break  # 1xx answers are interim: the real one follows
    connection = {token.strip() for token in headers.get("connection", "").lower().split(",")}
    reusable = version == "HTTP/1.1" and "close" not in connection
    if method == "HEAD" or status in (204, 304):
        return status, headers, b"", reusable
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, headers, await _read_chunked(reader, max_bytes), reusable
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise MalformedAnswer(f"a Content-Length that is no length: {declared!r}")
        length = int(declared)
        if length > max_bytes:
            raise AnswerTooLarge(f"it declares {length} bytes")
        return status, headers, await _read_exactly(reader, length), reusable
    return status, headers, await _read_to_end(reader, max_bytes), False


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, int, dict[str, str]]:
    status_line = await _read_line(reader, first=True)
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise MalformedAnswer(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    size = len(status_line)
    for _ in range(_MAX_HEADERS + 1):
        line = await _read_line(reader)
        if not line:
            return version, int(code), headers
        size += len(line)
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or size > _MAX_HEAD:
            raise MalformedAnswer(f"a malformed header line: {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    raise MalformedAnswer(f"more than {_MAX_HEADERS} header lines")


async def _read_line(reader: asyncio.StreamReader, first: bool = False) -> str:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise _Unanswered("the server closed the connection without answering") from None
        if first:
            raise NotHttpAnswer(exc.partial) from None
        raise ConnectionResetError("the server closed the connection mid-answer") from None
    except asyncio.LimitOverrunError:
        raise MalformedAnswer(f"a line longer than {_MAX_HEAD} bytes") from None
    return line.rstrip(b"\r\n").decode("latin-1")


async def _read_exactly(reader: asyncio.StreamReader, count: int) -> bytes:
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("the server closed the connection mid-answer") from None


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        line = await _read_line(reader)
        size_text = line.partition(";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise MalformedAnswer(f"a chunk size that is no number: {line[:80]!r}") from None
        if size < 0:
            raise MalformedAnswer(f"a negative chunk size: {line[:80]!r}")
        if size == 0:
            while await _read_line(reader):  # trailers, up to the empty line
                pass
            return bytes(body)
        if len(body) + size > max_bytes:
            raise AnswerTooLarge("it went on past that")
        chunk = await _read_exactly(reader, size + 2)
        if chunk[-2:] != b"\r\n":
            raise MalformedAnswer("a chunk not ended by CRLF")
        body += chunk[:-2]


async def _read_to_end(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        data = await reader.read(_READ)
        if not data:
            return bytes(body)
        body += data
        if len(body) > max_bytes:
            raise AnswerTooLarge("it went on past that")
