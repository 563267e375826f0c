"""The message a consumer hands to its handler (or yields when iterated), and the
subscription it came through.

A message is answered by the consumer that received it; it knows that consumer only as an
:class:`Answerer`, so this module stands below the consumer.
"""

from __future__ import annotations

import json
from collections import deque
from types import TracebackType
from typing import Any, Protocol

from smartnsq.protocol.message import EXT_VERSION_JSON, EXT_VERSION_TAG, MessageFrame
from smartnsq.transport.connection import Connection

__all__ = ["Answerer", "Message", "Subscription"]

_UNSET: Any = object()


class Answerer(Protocol):
    """What answers a message: the consumer that received it."""

    topic: str
    channel: str

    def finish(self, message: Message) -> None: ...

    def requeue(
        self, message: Message, delay: float | None = None, *, backoff: bool = True
    ) -> None: ...

    def touch(self, message: Message) -> None: ...

    def _context_exit(self, message: Message, exc: BaseException | None) -> bool: ...


class Subscription:
    """One subscribed connection of a consumer: (nsqd address, partition), and what is in
    flight on it."""

    __slots__ = (
        "address",
        "channel",
        "closing",
        "conn",
        "consumer",
        "current",
        "in_flight",
        "key",
        "last",
        "partition",
        "pending",
        "queue",
        "topic",
    )

    def __init__(self, consumer: Answerer, key: tuple[str, int | None], conn: Connection) -> None:
        self.consumer = consumer
        self.key = key
        self.address, self.partition = key
        self.topic = consumer.topic
        self.channel = consumer.channel
        self.conn = conn
        self.in_flight = 0
        # ids delivered on this connection and not answered yet: nsqd may send one twice
        self.pending: set[bytes] = set()
        # ordered mode: (id, attempts) of the last delivery; a copy may follow it at once
        self.last: tuple[bytes, int] | None = None
        self.closing = False
        # ordered mode: the message this partition's turn belongs to (handled, or handed out
        # by the iterator) until it is over; the others wait in `queue`
        self.current: Message | None = None
        self.queue: deque[Message] = deque()

    def __repr__(self) -> str:
        return f"<Subscription {self.address} partition={self.partition}>"


class Message(MessageFrame):
    """A delivered message.

    Fields from the wire: ``body``, ``id`` (the raw 16 bytes), ``attempts``, ``timestamp``
    (ns), and on youzan ``internal_id``, ``trace_id``, ``offset`` and ``raw_size`` (the last
    two with ordered or advanced subscriptions), ``ext`` (the parsed JSON header on ext
    topics). Where it came from: ``topic``, ``channel``, ``partition``, ``address``.

    Answer it once with :meth:`finish` or :meth:`requeue` (a handler's return or exception
    does it for you); :meth:`touch` asks nsqd for more time. ``responded`` tells whether it
    has been answered.
    """

    __slots__ = ("_ext", "_sub", "responded", "waiting")

    _sub: Subscription
    _ext: dict[str, Any] | None
    responded: bool
    waiting: bool  # ordered mode: the client is waiting out a requeue delay

    @property
    def topic(self) -> str:
        """The topic it was consumed from."""
        return self._sub.topic

    @property
    def channel(self) -> str:
        """The channel it was consumed from."""
        return self._sub.channel

    @property
    def partition(self) -> int | None:
        """Its partition (None on classic nsqd)."""
        return self._sub.partition

    @property
    def address(self) -> str:
        """``host:port`` of the nsqd that delivered it."""
        return self._sub.address

    @property
    def ext(self) -> dict[str, Any] | None:
        """The JSON ext header (youzan ext topics), or None."""
        try:
            return self._ext
        except AttributeError:
            pass
        ext = None
        if self.ext_version == EXT_VERSION_JSON and self.ext_raw:
            try:
                parsed = json.loads(self.ext_raw)
            except ValueError:
                parsed = None
            ext = parsed if isinstance(parsed, dict) else None
        self._ext = ext
        return ext

    @property
    def tag(self) -> str | None:
        """The dispatch tag (``##client_dispatch_tag``, or a legacy tag ext), if any."""
        if self.ext_version == EXT_VERSION_TAG and self.ext_raw:
            return self.ext_raw.decode("utf-8", "replace")
        ext = self.ext
        tag = ext.get("##client_dispatch_tag") if ext else None
        return tag if isinstance(tag, str) else None

    async def finish(self) -> None:
        """Tell nsqd the message is done (FIN)."""
        self._sub.consumer.finish(self)

    async def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds (None: the
        consumer's requeue policy). ``backoff=False`` does not count as a failure."""
        self._sub.consumer.requeue(self, delay, backoff=backoff)

    async def touch(self) -> None:
        """Reset the message's timeout on nsqd (never sent automatically)."""
        self._sub.consumer.touch(self)

    async def __aenter__(self) -> Message:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """``async with message:`` finishes the message when the block ends, or requeues it
        (with the backoff) when the block raises: the exception is logged and counted like
        a handler's, and does not propagate. An answer given inside the block stands."""
        return self._sub.consumer._context_exit(self, exc)

    def __repr__(self) -> str:
        where = f"{self._sub.topic}/{self._sub.partition}" if hasattr(self, "_sub") else "?"
        return (
            f"<Message {where} id={self.id.hex()} attempts={self.attempts} "
            f"offset={self.offset} body={self.body[:32]!r}>"
        )
