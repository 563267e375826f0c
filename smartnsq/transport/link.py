"""What a connection to one nsqd is, whichever way it is driven: its address and settings,
its protocol session (:class:`~smartnsq.protocol.session.ClientSession`), and what that
session says of it. The asyncio :class:`~smartnsq.transport.connection.Connection` and the
calling thread's :class:`~smartnsq.transport.blocking.BlockingConnection` are both one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from smartnsq.errors import ConnectionClosedError, NSQError, NSQTimeoutError
from smartnsq.protocol.session import ClientSession
from smartnsq.routing.addresses import split_host_port
from smartnsq.transport.config import ConnectionConfig

__all__ = ["SessionLink"]


class SessionLink:
    """A connection's address (``host``, ``port``), its ``config`` and its session, made to
    hand each answer to :meth:`_answered`. The subclass moves the bytes and keeps
    ``_closed``."""

    if not TYPE_CHECKING:
        # No instance dictionary: the asyncio Connection lists every attribute of its bases
        # in its own slots (a base with slots of its own would clash with the others).
        # Hidden from mypy, which would check this class's assignments against it.
        __slots__ = ()

    _closed: bool
    _session: ClientSession

    def __init__(
        self,
        address: str,
        config: ConnectionConfig,
        *,
        extend_support: bool | None = None,
        desired_tag: str | None = None,
    ) -> None:
        self.address = address
        self.host, self.port = split_host_port(address)
        self.config = config
        self._closed = False
        self._session = config.session(
            address,
            on_response=self._answered,
            extend_support=extend_support,
            desired_tag=desired_tag,
        )

    def _not_connected(self, exc: OSError, timeout: float) -> NSQError:
        """The error of a connect that failed with ``exc`` (a ``TimeoutError`` after
        ``timeout`` seconds); the link is closed."""
        self._closed = True
        if isinstance(exc, TimeoutError):
            return NSQTimeoutError(f"connecting to {self.address} timed out after {timeout} s")
        return ConnectionClosedError(f"cannot connect: {exc}", self.address)

    def _answered(self, token: int, data: bytes) -> None:
        """nsqd's answer to the request of ``token``, paired by the session as it reads."""
        raise NotImplementedError

    @property
    def is_open(self) -> bool:
        """Handshake done, and neither closed nor failed."""
        return self._session.accepts_requests and not self._closed

    @property
    def youzan(self) -> bool:
        return self._session.youzan

    @property
    def pending_count(self) -> int:
        """Requests waiting for their answer."""
        return self._session.pending_count
