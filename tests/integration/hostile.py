"""An HTTP server on 127.0.0.1 that answers as told, including the ways a broken or hostile
nsqlookupd does: a trickle of one byte at a time, an answer far larger than any real one,
an HTML error page. The answer can change while clients use it (``server.answer = ...``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lookupd"


def lookup_answer(name: str = "nsqlookupd_lookup_ptest_access_w_metainfo.v1.json") -> bytes:
    """A real youzan nsqlookupd's ``/lookup`` answer (a recorded fixture)."""
    return (FIXTURES / name).read_bytes()


def with_leader_port(answer: bytes, port: int) -> bytes:
    """``answer`` with every partition's leader on ``port``: a layout that differs."""
    payload = json.loads(answer)
    for node in payload["partitions"].values():
        node["tcp_port"] = port
    return json.dumps(payload).encode()


@dataclass
class Answer:
    """What the server sends: ``status``, ``body`` (with a Content-Length unless
    ``declare_length`` is False: then the body ends when the connection closes), written
    ``chunk`` bytes at a time with ``pause`` seconds between writes."""

    body: bytes
    status: int = 200
    content_type: str = "application/json; charset=utf-8"
    declare_length: bool = True
    chunk: int = 1 << 16
    pause: float = 0.0

    @classmethod
    def trickle(cls, body: bytes, pause: float) -> Answer:
        return cls(body, chunk=1, pause=pause)

    @classmethod
    def html_error(cls, status: int = 500) -> Answer:
        return cls(b"<html><body>Internal Server Error</body></html>", status, "text/html")


class HostileHttp:
    """Serves :attr:`answer` to every request; counts requests per path and the body bytes
    it managed to write (:attr:`sent`)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: Counter[str] = Counter()
        self.sent = 0
        self._arrived = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("not started")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def wait_requests(self, path: str, count: int) -> None:
        """Until ``path`` has been asked ``count`` times in all."""
        while self.requests[path] < count:
            self._arrived.clear()
            await self._arrived.wait()

    async def __aenter__(self) -> HostileHttp:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            async with _closing(writer):
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].split(b"?", 1)[0].decode()
                self.requests[path] += 1
                self._arrived.set()
                await self._write(writer, self.answer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up: what the tests are about
        except asyncio.CancelledError:
            pass  # the server is closing: the handler ends quietly
        finally:
            if task is not None:
                self._handlers.discard(task)

    async def _write(self, writer: asyncio.StreamWriter, answer: Answer) -> None:
        lines = [f"HTTP/1.1 {answer.status} X", f"Content-Type: {answer.content_type}"]
        if answer.declare_length:
            lines.append(f"Content-Length: {len(answer.body)}")
        lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        body = memoryview(answer.body)
        for start in range(0, len(body), answer.chunk):
            piece = body[start : start + answer.chunk]
            writer.write(piece)
            await writer.drain()
            self.sent += len(piece)
            if answer.pause:
                await asyncio.sleep(answer.pause)


@contextlib.asynccontextmanager
async def _closing(writer: asyncio.StreamWriter) -> AsyncIterator[None]:
    try:
        yield
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
