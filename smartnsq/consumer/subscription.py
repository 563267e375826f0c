"""One subscribed connection of a consumer, and what answers the messages it delivers.

A :class:`Subscription` is the delivery ledger's :class:`~smartnsq.flow.delivery.Lane`
(what is in flight on it, whose ordered turn it is) plus where it came from: the
(nsqd address, partition) key, the topic and channel, its connection, and the
:class:`Answerer` that answers its messages (the consumer's dispatcher). A message knows its
subscription, so this module stands below both the message and the consumer.
"""

from __future__ import annotations

from typing import Protocol

from smartnsq.flow.delivery import Delivery, Lane
from smartnsq.transport.connection import Connection

__all__ = ["Answerer", "Key", "Subscription"]

Key = tuple[str, "int | None"]  # (nsqd TCP address, partition; None on classic nsqd)


class Answerer(Protocol):
    """What answers a consumer's messages: ``await message.finish()`` and the rest end
    here."""

    def finish(self, message: Delivery) -> None:
        """FIN ``message``; raises if it was answered already."""

    def requeue(
        self, message: Delivery, delay: float | None = None, *, backoff: bool = True
    ) -> None:
        """REQ ``message`` (``delay`` None: the requeue policy); raises if answered."""

    def touch(self, message: Delivery) -> None:
        """TOUCH ``message``; raises if it was answered already."""

    def exit_context(self, message: Delivery, exc: BaseException | None) -> bool:
        """``async with message:`` ends (``exc`` what its block raised): whether to
        swallow ``exc``."""


class Subscription(Lane):
    """A consumer's subscription to one (nsqd, partition): its connection, and the ledger's
    view of what is in flight on it."""

    __slots__ = ("address", "answerer", "channel", "conn", "key", "subscribed_at", "topic")

    def __init__(
        self, answerer: Answerer, topic: str, channel: str, key: Key, conn: Connection
    ) -> None:
        super().__init__(key[1])
        self.answerer = answerer
        self.topic = topic
        self.channel = channel
        self.key = key
        self.address = key[0]
        self.conn = conn
        self.subscribed_at = 0.0  # loop time of the SUB's answer

    def __repr__(self) -> str:
        return f"<Subscription {self.address} partition={self.partition}>"
