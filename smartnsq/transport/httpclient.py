"""The HTTP client for lookupd and the nsqd HTTP API. Loading the system's CA bundle costs
about 0.2 s, a large share of a short CLI run, and most clusters are plain http: the
verifying TLS transport is only built for the first https request."""

from __future__ import annotations

import ssl
from types import TracebackType

import httpx

__all__ = ["new_http_client"]


class _TlsOnDemand(httpx.AsyncBaseTransport):
    """http requests go through a transport whose TLS context is never used; the first
    https request builds the default, verifying one."""

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


def new_http_client(
    timeout: float | httpx.Timeout, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` with ``timeout``; ``transport`` replaces the network (tests)."""
    return httpx.AsyncClient(timeout=timeout, transport=transport or _TlsOnDemand())
