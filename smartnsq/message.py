"""The message a consumer hands to its handler (or yields when iterated)."""

from __future__ import annotations

import json
from types import TracebackType
from typing import TYPE_CHECKING, Any

from smartnsq.protocol.message import EXT_VERSION_JSON, EXT_VERSION_TAG, MessageFrame

if TYPE_CHECKING:
    from smartnsq.consumer import _Subscription

__all__ = ["Message"]

_UNSET: Any = object()


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

    _sub: _Subscription
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
