"""What changes across the tries of one publish, kept apart from the request (which stays as
it was asked): the producer's retry loop owns it."""

from __future__ import annotations

from typing import Any

from smartnsq.errors import ServerError
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.routes import Route

__all__ = ["UNROUTED", "PublishTries"]

_NONE_FAILED: frozenset[int] = frozenset()
# The route of a publish not routed yet (no partition, no address).
UNROUTED = Route("", None, False, False, "")


class PublishTries:
    """The tries of one publish so far: how many (``count``), the partitions that failed an
    unkeyed publish (``avoid``: its next try goes elsewhere), the partition a keyed or
    explicit-partition publish is bound to (``pinned``, fixed at its first routing), the
    ``route`` (:data:`UNROUTED` before the first) and ``layout`` of the last try (a retry
    waits for a layout other than the one that failed), the trace ids the last try sent (the
    codec's choice for its server) and the publish's telemetry ``span`` (None when off).
    ``sent``: the last try's bytes were queued on a connection; ``unanswered``: a try was
    sent and ended with no answer from nsqd, so the message may have been stored."""

    __slots__ = (
        "avoid",
        "count",
        "layout",
        "pinned",
        "route",
        "sent",
        "span",
        "trace_ids",
        "unanswered",
    )

    def __init__(self, span: Any = None) -> None:
        self.count = 1
        self.avoid = _NONE_FAILED
        self.pinned: int | None = None
        self.route = UNROUTED
        self.layout: TopicLayout | None = None
        self.trace_ids: list[int] | None = None
        self.span = span
        self.sent = False
        self.unanswered = False

    @property
    def last_partition(self) -> int | None:
        """The partition the last try was routed to (None: classic, or not routed yet)."""
        return self.route.partition

    def ended(self, failure: BaseException) -> None:
        """The last try failed with ``failure``: if it was sent and nsqd did not answer it
        (an error frame is an answer: nothing was stored), its outcome is unknown."""
        if self.sent and not isinstance(failure, ServerError):
            self.unanswered = True
        self.sent = False

    def failed(self, request: PublishRequest) -> None:
        """The last try failed in a way a retry may fix: an unkeyed publish avoids its
        partition from now on (while another is writable)."""
        partition = self.last_partition
        if partition is not None and request.movable:
            self.avoid = self.avoid | {partition}
