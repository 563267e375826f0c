"""The message a consumer hands to its handler (or yields when iterated).

A message is answered through the subscription it came by (a
:class:`~smartnsq.consumer.subscription.Subscription`), which knows what answers it, so this module
stands below the consumer.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

from smartnsq.consumer.subscription import Subscription
from smartnsq.flow.delivery import Delivery
from smartnsq.protocol.message import EXT_VERSION_JSON, EXT_VERSION_TAG

__all__ = ["Message"]


class Message(Delivery):
    """A delivered message.

    Fields from the wire: ``body``, ``id`` (the raw 16 bytes), ``attempts``, ``timestamp``
    (ns), and on youzan ``internal_id``, ``trace_id``, ``offset`` and ``raw_size`` (the last
    two come with SUB_ADVANCED and SUB_ORDERED, which the Consumer subscribes every youzan
    partition with), ``ext`` (the parsed JSON header on ext topics). Where it came from:
    ``topic``, ``channel``, ``partition``, ``address``.

    Answer it once with :meth:`finish` or :meth:`requeue` (a handler's return or exception
    does it for you); :meth:`touch` asks nsqd for more time. ``responded`` tells whether it
    has been answered.
    """

    __slots__ = ("_ext",)

    lane: Subscription  # the subscription it came by (set when it was received)
    _ext: dict[str, Any] | None

    @property
    def topic(self) -> str:
        """The topic it was consumed from."""
        return self.lane.topic

    @property
    def channel(self) -> str:
        """The channel it was consumed from."""
        return self.lane.channel

    @property
    def partition(self) -> int | None:
        """Its partition (None on classic nsqd)."""
        return self.lane.partition

    @property
    def address(self) -> str:
        """``host:port`` of the nsqd that delivered it."""
        return self.lane.address

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
        self.lane.answerer.finish(self)

    async def requeue(self, delay: float | None = None, *, backoff: bool = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds (None: the
        consumer's requeue policy). ``backoff=False`` does not count as a failure."""
        self.lane.answerer.requeue(self, delay, backoff=backoff)

    async def touch(self) -> None:
        """Reset the message's timeout on nsqd (never sent automatically)."""
        self.lane.answerer.touch(self)

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
        return self.lane.answerer.exit_context(self, exc)

    def __repr__(self) -> str:
        where = f"{self.lane.topic}/{self.lane.partition}" if hasattr(self, "lane") else "?"
        return (
            f"<Message {where} id={self.id.hex()} attempts={self.attempts} "
            f"offset={self.offset} body={self.body[:32]!r}>"
        )
