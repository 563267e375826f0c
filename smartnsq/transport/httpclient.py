"""The HTTP clients for lookupd and the nsqd HTTP API, and the one way an exchange is made.

Every exchange (:func:`exchange`) is bounded in time and size: the whole of it (connect,
send, the full answer) within one deadline, since httpx's timeouts bound each read and a
server trickling a byte at a time never trips them; and at most ``max_bytes`` of answer,
read as a stream, so a huge answer is refused before it is held in memory.

Two clients make them. :class:`HttpClient`, the lookup manager's own, sends plain-http
requests itself (:mod:`smartnsq.transport.plainhttp`) and the others (https, or any request
when the environment names a proxy for http, which httpx would use) through httpx, loaded
for the first of them; :func:`new_http_client` is an ``httpx.AsyncClient``. Loading httpx,
httpcore and anyio costs a short-lived process more than the rest of its first publish.

Loading the system's CA bundle costs about 0.2 s, a large share of a short CLI run, and most
clusters are plain http: the verifying TLS transport is only built for the first https
request."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from smartnsq.errors import ConnectionClosedError, NotHttpError, NSQTimeoutError, ProtocolError
from smartnsq.protocol.errors import BAD_PROTOCOL_FRAME
from smartnsq.transport.httplog import quiet
from smartnsq.transport.plainhttp import AnswerTooLarge, MalformedAnswer, NotHttpAnswer, PlainHttp

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "HttpAnswer",
    "HttpClient",
    "client_timeout",
    "exchange",
    "new_http_client",
]

#: The largest answer read from nsqlookupd or nsqd's HTTP API (4 MiB): a lookup of a topic
#: with 255 partitions, or a filtered ``/stats``, is a few hundred KiB at most.
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024
# What the probe for an nsqd TCP port reads at most: its answer is a 22-byte frame.
_PROBE_BYTES = 64 * 1024


@functools.cache
def _tls_on_demand() -> type[httpx.AsyncBaseTransport]:
    """The transport of :func:`new_http_client` (defined once httpx is loaded): http requests
    go through a transport whose TLS context is never used; the first https request builds
    the default, verifying one."""
    import ssl
    from types import TracebackType

    import httpx

    class TlsOnDemand(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            # A bare client context (no CA loaded): cheap, and it could only ever fail closed.
            self._plain = httpx.AsyncHTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
            self._tls: httpx.AsyncHTTPTransport | None = None

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.scheme == "https":
                if self._tls is None:
                    self._tls = httpx.AsyncHTTPTransport()
                return await self._tls.handle_async_request(request)
            return await self._plain.handle_async_request(request)

        async def aclose(self) -> None:
            await self._plain.aclose()
            if self._tls is not None:
                await self._tls.aclose()

        async def __aexit__(
            self,
            exc_type: type[BaseException] | None = None,
            exc_value: BaseException | None = None,
            traceback: TracebackType | None = None,
        ) -> None:
            await self.aclose()

    return TlsOnDemand


def new_http_client(
    timeout: float | httpx.Timeout, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` with ``timeout``; ``transport`` replaces the network (tests)."""
    import httpx

    return httpx.AsyncClient(timeout=timeout, transport=transport or _tls_on_demand()())


class HttpClient:
    """The lookup manager's client: plain-http requests made by :class:`PlainHttp`, the
    others by an httpx client made for the first of them (``timeout``: its timeout). Whether
    the environment names a proxy for http is read when it is made, as httpx does."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._plain = PlainHttp()
        self._proxied = _http_proxy_configured()
        self._httpx: httpx.AsyncClient | None = None

    def route(self, url: str) -> PlainHttp | httpx.AsyncClient:
        """What makes a request to ``url``: :class:`PlainHttp` for plain http that no proxy
        takes, else the httpx client (made now if it is the first)."""
        if url.startswith("http://") and not self._proxied:
            return self._plain
        if self._httpx is None:
            self._httpx = new_http_client(self.timeout)
        return self._httpx

    async def aclose(self) -> None:
        await self._plain.aclose()
        if self._httpx is not None:
            await self._httpx.aclose()


def _http_proxy_configured() -> bool:
    """Whether httpx would send an http request through a proxy (it reads
    ``urllib.request.getproxies()``: the environment, and the system's settings on macOS and
    Windows); in doubt, yes (httpx then decides, ``NO_PROXY`` included)."""
    if sys.platform in ("darwin", "win32"):
        import urllib.request

        proxies = urllib.request.getproxies()
        return bool(proxies.get("http") or proxies.get("all"))
    return any(
        value and name.lower() in ("http_proxy", "all_proxy") for name, value in os.environ.items()
    )


def client_timeout(http: httpx.AsyncClient, default: float = 10.0) -> float:
    """The timeout ``http`` was made with (:func:`new_http_client`), as the bound of a whole
    exchange."""
    timeout = http.timeout
    values = [v for v in (timeout.connect, timeout.read, timeout.write, timeout.pool) if v]
    return max(values) if values else default


@dataclass(frozen=True)
class HttpAnswer:
    """A complete answer: its status, headers and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


async def exchange(
    http: HttpClient | httpx.AsyncClient,
    method: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    params: dict[str, str] | None = None,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> HttpAnswer:
    """One request and its whole answer within ``timeout`` seconds, at most ``max_bytes``
    of it. Raises :class:`~smartnsq.errors.NSQTimeoutError` when the answer is not complete
    in time, :class:`~smartnsq.errors.ProtocolError` when it is larger than ``max_bytes``
    (what came beyond is never read), :class:`~smartnsq.errors.NotHttpError` when an nsqd
    TCP port answered, :class:`~smartnsq.errors.ConnectionClosedError` when nothing answers.
    httpx logs nothing of it (:mod:`smartnsq.transport.httplog`)."""
    late = f"{method} {url}: no complete answer within {timeout:.3g} s"
    route = http.route(url) if isinstance(http, HttpClient) else http
    timed_out: type[Exception] = _Never
    unreadable: type[Exception] = _Never
    no_answer: tuple[type[Exception], ...] = (MalformedAnswer, OSError)
    if not isinstance(route, PlainHttp):
        timed_out, unreadable, failed = _httpx_failures()
        no_answer += (failed,)
    try:
        async with asyncio.timeout(timeout):
            if isinstance(route, PlainHttp):
                status, answer_headers, body = await route.request(
                    method,
                    url,
                    max_bytes=max_bytes,
                    params=params,
                    content=content,
                    headers=headers,
                )
                return HttpAnswer(status, answer_headers, body)
            try:
                with quiet():
                    async with route.stream(
                        method,
                        url,
                        params=params,
                        content=content,
                        headers=headers,
                        timeout=timeout,
                    ) as response:
                        body = await _read_bounded(response, url, max_bytes)
            except unreadable:
                # httpx does not show what answered: an nsqd TCP port is told by its bytes.
                if url.startswith("http://"):
                    await _nsqd_tcp_probe(url)
                raise
            return HttpAnswer(response.status_code, response.headers, body)
    except TimeoutError:
        raise NSQTimeoutError(late) from None
    except timed_out as exc:
        raise NSQTimeoutError(late) from exc
    except AnswerTooLarge as exc:
        raise _too_large(url, max_bytes, exc.how) from None
    except NotHttpAnswer as exc:
        if exc.received.startswith(BAD_PROTOCOL_FRAME):
            raise _nsqd_tcp_port(url) from exc
        raise ConnectionClosedError(
            f"{method} {url} got no answer: {type(exc).__name__}: {exc}"
        ) from exc
    except no_answer as exc:
        raise ConnectionClosedError(
            f"{method} {url} got no answer: {type(exc).__name__}: {exc}"
        ) from exc


async def _nsqd_tcp_probe(url: str) -> None:
    """Raise :class:`NotHttpError` when ``url``'s server answers a plain GET as an nsqd TCP
    port does; return otherwise (whatever else it answers, or fails with)."""
    base = urlsplit(url)
    plain = PlainHttp()
    try:
        await plain.request("GET", f"http://{base.netloc}/", max_bytes=_PROBE_BYTES)
    except NotHttpAnswer as exc:
        if exc.received.startswith(BAD_PROTOCOL_FRAME):
            raise _nsqd_tcp_port(url) from exc
    except (MalformedAnswer, AnswerTooLarge, OSError, ValueError):
        pass
    finally:
        await plain.aclose()


def _nsqd_tcp_port(url: str) -> NotHttpError:
    address = urlsplit(url).netloc.rpartition("@")[2]
    return NotHttpError(
        f"{url}: {address} is an nsqd TCP port, not an HTTP address (it answered "
        "E_BAD_PROTOCOL, nsqd's answer to anything but its protocol); nsqd's HTTP API is on "
        "its HTTP port (default 4151), nsqlookupd's on 4161"
    )


class _Never(Exception):
    """Raised by nothing: what a request that makes no use of httpx catches of its errors."""


def _httpx_failures() -> tuple[type[Exception], type[Exception], type[Exception]]:
    """httpx's timeout, its error for an answer that is no HTTP, and its other errors
    (loaded with its client)."""
    import httpx

    return httpx.TimeoutException, httpx.RemoteProtocolError, httpx.HTTPError


async def _read_bounded(response: httpx.Response, url: str, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(url, max_bytes, f"it declares {int(declared)} bytes")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(url, max_bytes, "it went on past that")
    return bytes(body)


def _too_large(url: str, max_bytes: int, how: str) -> ProtocolError:
    return ProtocolError(
        f"{url}: the answer is over the {max_bytes} bytes read at most ({how}); nsqlookupd and "
        "nsqd answer far less (raise max_answer_bytes if this one is right)"
    )
