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

What an answer is read as (RFC 9112; held to h11, httpx's parser, by a differential fuzz test:
tests/unit/test_plainhttp_h11.py):

- Lines end with CRLF or a bare LF (RFC 9112 2.2), except a chunk size line: CRLF only.
- Status line: ``HTTP/1.<digit> <3 digits>``, then nothing or a space and a reason (any byte
  but NUL, CR, LF, VT, FF). Codes 100-999; interim 1xx heads are skipped, but 101 is refused
  (no upgrade is ever asked for). HTTP/1.1 and later minors keep the connection unless
  ``Connection: close``; HTTP/1.0 never does.
- Header lines: a token, ``:``, the value between optional spaces and tabs; a value may hold
  any byte but NUL, CR, LF, VT, FF (other controls and obs-text are kept, as RFC 9110 5.5
  allows). A line starting with a space or tab (obs-fold) continues the previous value, joined
  with one space (RFC 9112 5.2). A repeated name's values are joined with ", "; names come
  out lower-case, values decoded as latin-1. At most 100 lines, 64 KiB of head.
- Framing (RFC 9112 6.3): no body for HEAD, 204 and 304; else ``Transfer-Encoding`` (whose
  value must be ``chunked`` alone, in any case) reads chunks, and wins over a Content-Length
  beside it, whose connection is then not kept; else ``Content-Length`` (decimal, at most 20
  digits; a list or repetition of one value is that value, RFC 9110 8.6) reads that many
  bytes; else the body runs to the end of the connection. The framing fields are checked on
  every head (interim ones and trailers too), whether or not they frame a body.
- Chunks: a size of 1-20 hex digits, optional spaces or tabs, an optional extension (``;``
  and anything: ignored), CRLF; the data and CRLF; after the zero chunk, trailer lines read
  like header lines (checked, then dropped) up to an empty line.
- Refused, with :class:`MalformedAnswer`: anything else (another HTTP major version, a code
  of another length, a name that is no token or space before the colon, a forbidden byte, a
  continuation line first, lengths that differ or are no decimal, any other transfer coding
  or a list of them, ``0x``, signs or ``_`` in a chunk size, chunk data not followed by
  CRLF, a line over 64 KiB); with :class:`AnswerTooLarge`: a body over the request's
  ``max_bytes``; with ConnectionResetError: an answer that the server's close cut short.
  Nothing else is raised for what a server sends.
- Where h11 reads otherwise, on purpose: spaces before a chunk extension's ``;`` are allowed
  (RFC 9112 7.1.1's BWS; h11 refuses them); a status line of another major version is refused
  (h11 reads any ``HTTP/d.d``); so are more than 100 header lines (h11 bounds only the head's
  size); and a chunked answer that also has a Content-Length is read as h11 reads it, but its
  connection is not kept (RFC 9112 6.3: "ought to be handled as an error").
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

# The grammar of what is read (RFC 9112, and h11's where RFC 9110 lets a recipient choose),
# checked with bytes methods rather than regular expressions: compiling those would cost the
# start-up this module is for about a millisecond.
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_HEX = b"0123456789ABCDEFabcdef"
# Bytes no value or reason may hold (h11's field-vchar, spaces and tabs aside: RFC 9110 5.5
# leaves the other controls to the recipient, and h11 keeps them).
_FORBIDDEN = b"\x00\n\x0b\x0c\r"
_MAX_DIGITS = 20  # of a Content-Length or a chunk size

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
        minor, status, headers = await _read_head(reader)
        if status == 101:
            raise MalformedAnswer("101 Switching Protocols, and no upgrade was asked for")
        if status >= 200:
            break  # 1xx answers are interim: the real one follows
    connection = {token.strip(" \t") for token in headers.get("connection", "").lower().split(",")}
    reusable = minor >= 1 and "close" not in connection
    chunked = "transfer-encoding" in headers  # _fields let only "chunked" through
    declared = headers.get("content-length")
    if chunked and declared is not None:
        reusable = False  # RFC 9112 6.3: chunked wins, and a length beside it is suspect
    if method == "HEAD" or status in (204, 304):
        return status, headers, b"", reusable
    if chunked:
        return status, headers, await _read_chunked(reader, max_bytes), reusable
    if declared is not None:
        length = int(declared)
        if length > max_bytes:
            raise AnswerTooLarge(f"it declares {length} bytes")
        return status, headers, await _read_exactly(reader, length), reusable
    return status, headers, await _read_to_end(reader, max_bytes), False


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, int, dict[str, str]]:
    """(the HTTP/1 minor version, status, headers) of one answer's head."""
    line = await _read_line(reader, first=True)
    # HTTP/1.<digit> SP <3 digits> [SP reason]
    code = line[9:12]
    if not (
        line[:7] == b"HTTP/1."
        and line[7:8].isdigit()
        and line[8:9] == b" "
        and len(code) == 3
        and code.isdigit()
        and line[12:13] in (b"", b" ")
        and _allowed(line[13:])
    ):
        raise MalformedAnswer(f"not an HTTP/1.1 status line: {line[:80]!r}")
    if code < b"100":
        raise MalformedAnswer(f"a status code below 100: {line[:80]!r}")
    lines = await _read_field_lines(reader, len(line))
    return int(line[7:8]), int(code), _fields(lines)


def _allowed(value: bytes) -> bool:
    """Whether ``value`` holds none of the bytes no value may hold."""
    return len(value.translate(None, _FORBIDDEN)) == len(value)


async def _read_field_lines(reader: asyncio.StreamReader, size: int) -> list[bytes]:
    """The lines up to the empty one (a head's header lines, or a chunked body's trailer
    lines), at most _MAX_HEADERS of them and _MAX_HEAD bytes with ``size`` bytes before."""
    lines: list[bytes] = []
    for _ in range(_MAX_HEADERS + 1):
        line = await _read_line(reader)
        if not line:
            return lines
        size += len(line)
        if size > _MAX_HEAD:
            raise MalformedAnswer(f"a head larger than {_MAX_HEAD} bytes")
        lines.append(line)
    raise MalformedAnswer(f"more than {_MAX_HEADERS} header lines")


def _fields(lines: list[bytes]) -> dict[str, str]:
    """Header lines as a dict: lower-case names, the values of a repeated name joined with
    ", ", obs-fold replaced by a space (RFC 9112 5.2); the framing fields checked
    (Content-Length: one length, Transfer-Encoding: chunked alone)."""
    folded: list[bytes] = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):  # obs-fold: the previous field's value goes on
            if not folded:
                raise MalformedAnswer(f"a header line that starts with a space: {line[:80]!r}")
            folded[-1] += b" " + line.lstrip(b" \t")
        else:
            folded.append(line)
    headers: dict[str, str] = {}
    for line in folded:
        # token ":" OWS value OWS
        raw_name, colon, raw_value = line.partition(b":")
        raw_value = raw_value.strip(b" \t")
        if not (colon and raw_name and not raw_name.translate(None, _TOKEN)) or not _allowed(
            raw_value
        ):
            raise MalformedAnswer(f"a malformed header line: {line[:80]!r}")
        name = raw_name.decode("ascii").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    declared = headers.get("content-length")
    if declared is not None:
        lengths = {length.strip(" \t") for length in declared.split(",")}
        length = lengths.pop()
        decimal = length.isascii() and length.isdigit() and len(length) <= _MAX_DIGITS
        if lengths or not decimal:
            raise MalformedAnswer(f"a Content-Length that is no length: {declared[:80]!r}")
        headers["content-length"] = length
    coding = headers.get("transfer-encoding")
    if coding is not None:
        if coding.lower() != "chunked":
            raise MalformedAnswer(f"a transfer coding other than chunked alone: {coding[:80]!r}")
        headers["transfer-encoding"] = "chunked"
    return headers


async def _read_line(reader: asyncio.StreamReader, first: bool = False) -> bytes:
    """The next line, without its LF and a CR before it (RFC 9112 2.2: a bare LF ends a line
    of the head too)."""
    line = await _read_raw_line(reader, first)
    return line[:-2] if line.endswith(b"\r\n") else line[:-1]


async def _read_raw_line(reader: asyncio.StreamReader, first: bool = False) -> bytes:
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise _Unanswered("the server closed the connection without answering") from None
        if first:
            raise NotHttpAnswer(exc.partial) from None
        raise ConnectionResetError("the server closed the connection mid-answer") from None
    except asyncio.LimitOverrunError:
        raise MalformedAnswer(f"a line longer than {_MAX_HEAD} bytes") from None


async def _read_exactly(reader: asyncio.StreamReader, count: int) -> bytes:
    try:
        return await reader.readexactly(count)
    except asyncio.IncompleteReadError:
        raise ConnectionResetError("the server closed the connection mid-answer") from None


async def _read_chunked(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        line = await _read_raw_line(reader)
        # 1*HEXDIG [ BWS ";" anything ] CRLF, or trailing whitespace without an extension
        digits = line.partition(b";")[0].removesuffix(b"\r\n").rstrip(b" \t")
        if not (
            line.endswith(b"\r\n")
            and 0 < len(digits) <= _MAX_DIGITS
            and not digits.translate(None, _HEX)
        ):
            raise MalformedAnswer(f"a malformed chunk size line: {line[:80]!r}")
        size = int(digits, 16)
        if size == 0:
            _fields(await _read_field_lines(reader, 0))  # the trailers: checked, not kept
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
