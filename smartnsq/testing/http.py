"""A small asyncio HTTP/1.1 server for the emulated nsqlookupd and nsqd HTTP APIs, and the
NSQ response envelopes (internal/http_api/api_response.go: ``NegotiateVersion``, ``V1`` and
``PlainText`` in youzan/nsq 0.3.7-HA.1.13.0; nsqio/nsq v1.3.0 has ``V1`` and ``PlainText``
only).

Only what the NSQ APIs need: request line, headers, ``Content-Length`` bodies, keep-alive.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "V1_ACCEPT",
    "ApiError",
    "HttpServer",
    "Mode",
    "Request",
    "Response",
    "Route",
    "dispatch",
    "json_response",
    "respond",
    "respond_error",
    "text_response",
]

log = logging.getLogger("smartnsq.testing.http")

V1_ACCEPT = "application/vnd.nsq; version=1.0"
V1_CONTENT_TYPE_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
_JSON = "application/json; charset=utf-8"
_SNIFFED_TEXT = "text/plain; charset=utf-8"  # what Go's http.DetectContentType says of text
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    411: "Length Required",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
MAX_HEADER_BYTES = 64 * 1024
MAX_REQUEST_BODY = 16 * 1024 * 1024


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes = b""

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    @property
    def wants_v1(self) -> bool:
        """The exact Accept header selects the v1 envelope (anything else: legacy)."""
        return self.headers.get("accept") == V1_ACCEPT


@dataclass
class Response:
    """An answer. ``content_type`` None: the handler set none, so Go's net/http sniffs the
    body: ``text/plain; charset=utf-8`` for the text bodies the APIs write, and no
    ``Content-Type`` header at all for an empty body (the servers' empty 200 answers)."""

    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str | None = None


class ApiError(Exception):
    """Raised by handlers to answer with an NSQ API error (status + message).

    ``always_v1``: answered in the v1 format whatever the endpoint's mode (the servers'
    panic, not-found and method-not-allowed handlers)."""

    def __init__(self, status: int, message: str, *, always_v1: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.always_v1 = always_v1


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def json_response(data: Any, status: int = 200, *, v1_header: bool = False) -> Response:
    headers = [V1_CONTENT_TYPE_HEADER] if v1_header else []
    return Response(status, _dumps(data), headers, _JSON)


def text_response(text: str | bytes, status: int = 200) -> Response:
    body = text.encode() if isinstance(text, str) else text
    return Response(status, body)


def api_error(request: Request, error: ApiError, *, negotiate: bool = True) -> Response:
    """Errors: v1 mode keeps the status and answers ``{"message":...}``; the legacy envelope
    always answers HTTP 500."""
    if not negotiate or request.wants_v1:
        return v1_error(error)
    return json_response({"status_code": 500, "status_txt": error.message, "data": None}, 500)


def v1_error(error: ApiError) -> Response:
    # The servers format this body with Sprintf, not a JSON encoder: a message holding a quote
    # gives invalid JSON there too, so clients must cope with it.
    body = ('{"message":"%s"}' % error.message).encode()  # noqa: UP031
    return Response(error.status, body, [V1_CONTENT_TYPE_HEADER], _JSON)


class Mode(enum.Enum):
    """How an endpoint answers (the servers' ``http_api`` decorators)."""

    PLAIN = "plain"  # text body, the error text with its status
    NEGOTIATE = "negotiate"  # v1 with the exact Accept header, else the legacy envelope
    V1 = "v1"  # always v1


def respond(request: Request, data: Any, mode: Mode) -> Response:
    """A success answer. Text (str/bytes) is sent as is in every mode, JSON otherwise; None is
    an empty v1 body."""
    if mode is Mode.PLAIN:
        return text_response(data if isinstance(data, (str, bytes)) else str(data))
    v1 = mode is Mode.V1 or request.wants_v1
    if isinstance(data, (str, bytes)):
        response = text_response(data)
        if v1:
            response.headers.append(V1_CONTENT_TYPE_HEADER)
        return response
    if v1:
        if data is None:
            return Response(200, b"", [V1_CONTENT_TYPE_HEADER])
        return json_response(data, v1_header=True)
    return json_response({"status_code": 200, "status_txt": "OK", "data": data})


def respond_error(request: Request, error: ApiError, mode: Mode) -> Response:
    if error.always_v1:
        return v1_error(error)
    if mode is Mode.PLAIN:
        return text_response(error.message, error.status)
    return api_error(request, error, negotiate=mode is Mode.NEGOTIATE)


RouteHandler = Callable[[Request], Any]


@dataclass(frozen=True)
class Route:
    """An endpoint: accepted methods, handler (sync or async, returns data or a Response) and
    answer mode."""

    methods: tuple[str, ...]
    handler: RouteHandler
    mode: Mode


async def dispatch(routes: Mapping[str, Route], request: Request) -> Response:
    """Route a request like the servers' httprouter: unknown paths answer 404 and wrong methods
    405, both always in the v1 format."""
    route = routes.get(request.path)
    if route is None:
        return v1_error(ApiError(404, "NOT_FOUND"))
    if request.method not in route.methods:
        return v1_error(ApiError(405, "METHOD_NOT_ALLOWED"))
    try:
        data = route.handler(request)
        if inspect.isawaitable(data):
            data = await data
    except ApiError as exc:
        return respond_error(request, exc, route.mode)
    if isinstance(data, Response):
        return data
    return respond(request, data, route.mode)


Handler = Callable[[Request], Awaitable[Response]]


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._held: list[bytes] = []  # answered while blackholed, sent on heal
        self._close_held = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server._connections[self] = None
        if self._server.blackholed:
            self.go_silent()

    def go_silent(self) -> None:
        """The server was blackholed: read nothing more; answers are held."""
        if self._transport is not None:
            self._transport.pause_reading()

    def answer_again(self) -> None:
        """The server was healed: send what was held, then read again."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        held, self._held = self._held, []
        for data in held:
            transport.write(data)
        if self._close_held:
            transport.close()
            return
        transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.pop(self, None)
        self._closing = True

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > MAX_HEADER_BYTES + MAX_REQUEST_BODY:
            self.close()
            return
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._serve())
            tasks = self._server._tasks
            tasks[self._task] = None
            self._task.add_done_callback(lambda task: tasks.pop(task, None))

    def _next_request(self) -> Request | bool | None:
        """A complete request, None if more bytes are needed, False if malformed. Like Go's
        net/http, a first line that is not ``METHOD target HTTP/x.y`` is refused as soon as
        it ends (an NSQ TCP client sent to an HTTP port gets its 400 at once)."""
        first = self._buf.find(b"\n")
        if first >= 0:
            words = bytes(self._buf[:first]).rstrip(b"\r").split(b" ")
            if len(words) != 3 or not words[2].startswith(b"HTTP/1."):
                return False
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            return False if len(self._buf) > MAX_HEADER_BYTES else None
        head = bytes(self._buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            return False
        method, target, _ = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                return False
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return False
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            return False
        if length < 0 or length > MAX_REQUEST_BODY:
            return False
        if len(self._buf) < end + 4 + length:
            return None
        body = bytes(self._buf[end + 4 : end + 4 + length])
        del self._buf[: end + 4 + length]
        url = urlsplit(target)
        return Request(method.upper(), url.path, parse_qs(url.query, True), headers, body)

    async def _serve(self) -> None:
        while not self._closing:
            request = self._next_request()
            if request is None:
                return
            if request is False:
                self._write(Response(400, b"400 Bad Request"), keep_alive=False)
                self.close()
                return
            if not isinstance(request, Request):
                return
            try:
                response = await self._server.handler(request)
            except ApiError as exc:
                response = api_error(request, exc)
            except Exception:  # a bug in an emulated endpoint must not kill the server
                log.exception("HTTP handler failed for %s %s", request.method, request.path)
                response = text_response("INTERNAL_ERROR", 500)
            keep_alive = request.headers.get("connection", "").lower() != "close"
            self._write(response, keep_alive=keep_alive)
            if not keep_alive:
                self.close()
                return

    def _write(self, response: Response, *, keep_alive: bool) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        reason = _REASONS.get(response.status, "Unknown")
        content_type = response.content_type
        if content_type is None and response.body:
            content_type = _SNIFFED_TEXT
        head = [f"HTTP/1.1 {response.status} {reason}"]
        if content_type is not None:
            head.append(f"Content-Type: {content_type}")
        head.append(f"Content-Length: {len(response.body)}")
        head += [f"{k}: {v}" for k, v in response.headers]
        if not keep_alive:
            head.append("Connection: close")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body
        if self._server.blackholed:
            self._held.append(data)
        else:
            self._transport.write(data)

    def close(self) -> None:
        self._closing = True
        if self._server.blackholed and not self._server.stopping:
            self._close_held = True
        elif self._transport is not None:
            self._transport.close()


class HttpServer:
    """Serves ``handler`` on 127.0.0.1 (port 0 = chosen by the OS)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self._server: asyncio.base_events.Server | None = None
        # dicts, not sets: what acts on each does so in the order they came
        self._connections: dict[_HttpProtocol, None] = {}
        self._tasks: dict[asyncio.Task[None], None] = {}
        self.blackholed = False
        self.stopping = False

    def blackhole(self) -> None:
        """Stop answering, silently: open connections read nothing more and hold their
        answers (no FIN, no RST); new ones are accepted and never answered. Until
        :meth:`heal`, across a restart too."""
        self.blackholed = True
        for conn in list(self._connections):
            conn.go_silent()

    def heal(self) -> None:
        """Answer again: held answers are sent, waiting requests read."""
        self.blackholed = False
        for conn in list(self._connections):
            conn.answer_again()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HttpProtocol(self), self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self.stopping = True
            self._server.close()
            for conn in list(self._connections):
                conn.close()
            await self._server.wait_closed()
            self._server = None
            self.stopping = False
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
