"""The lookupd/admin HTTP client builds its verifying TLS transport only for https, and
that transport still verifies: a certificate nobody trusts is refused, a trusted one works."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from smartnsq.testing.tls import self_signed_contexts
from smartnsq.transport.httpclient import new_http_client

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(RESPONSE)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass  # the client refused our certificate
    finally:
        writer.close()


async def _serve(tls: ssl.SSLContext | None) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(_answer, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    return server, f"{'https' if tls else 'http'}://127.0.0.1:{port}/ping"


@pytest.fixture
async def https_url(tmp_path: Path) -> AsyncIterator[str]:
    server_context, _ = self_signed_contexts(tmp_path)
    server, url = await _serve(server_context)
    async with server:
        yield url


async def test_plain_http_builds_no_tls_transport() -> None:
    server, url = await _serve(None)
    async with server, new_http_client(5.0) as client:
        response = await client.get(url)
        assert response.text == "ok"
        assert client._transport._tls is None  # type: ignore[attr-defined]


async def test_untrusted_certificate_is_refused(https_url: str) -> None:
    async with new_http_client(5.0) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(https_url)


async def test_trusted_certificate_is_accepted(
    https_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))
    async with new_http_client(5.0) as client:
        response = await client.get(https_url)
    assert response.text == "ok"
