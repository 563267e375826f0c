"""One logical publish (a message or an MPUB batch) across its tries, and the checks and
conversions of its arguments that the Producer's methods share."""

from __future__ import annotations

import json
import random
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.protocol.lookupd import TopicLayout
from smartnsq.protocol.validation import MAX_DPUB_DELAY_MS

__all__ = ["NO_KEY", "PublishRequest", "delay_to_ms", "ext_with_trace_id", "new_trace_ids"]

# No sharding key was given (None cannot say so: it is refused as a key, not ignored).
NO_KEY: Any = object()


class PublishRequest:
    """One logical publish (a message or an MPUB batch) across its tries: what was asked,
    and what routing decided so far."""

    __slots__ = (
        "address",
        "auto_trace",
        "avoid",
        "bodies",
        "command",
        "delay_ms",
        "exts",
        "key",
        "last_partition",
        "layout",
        "partition",
        "pinned",
        "span",
        "topic",
        "trace_ids",
    )

    def __init__(self, topic: str, command: str, bodies: list[bytes]) -> None:
        self.topic = topic
        self.command = command
        self.bodies = bodies
        self.partition: int | None = None
        self.key: Any = NO_KEY
        self.trace_ids: list[int] | None = None
        self.exts: list[bytes | None] | None = None
        self.delay_ms: int | None = None
        # Partitions that failed this publish: an unkeyed retry goes elsewhere.
        self.avoid: set[int] = set()
        # A keyed publish keeps the partition of its first routing, whatever happens.
        self.pinned: int | None = None
        self.last_partition: int | None = None
        # The layout the last try was routed in: a retry waits for a different one.
        self.layout: TopicLayout | None = None
        # Traced because of the producer's trace switch (not an explicit trace_id): classic
        # nsqd has no PUB_TRACE, so such publishes fall back to plain PUB there.
        self.auto_trace = False
        self.span: Any = None
        self.address: str | None = None  # classic batches stay on their nsqd

    @property
    def batch(self) -> bool:
        return self.command.startswith("M")

    @property
    def movable(self) -> bool:
        """Neither a partition nor a key binds it: any writable partition will do."""
        return self.partition is None and self.key is NO_KEY


def delay_to_ms(delay: float) -> int:
    """A DPUB delay in seconds, checked, as nsqd's milliseconds."""
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ValidationError("delay", f"must be seconds >= 0, got {delay!r}")
    ms = round(delay * 1000)
    if ms > MAX_DPUB_DELAY_MS:
        raise ValidationError("delay", f"must be at most {MAX_DPUB_DELAY_MS // 1000} s")
    return ms


def ext_with_trace_id(ext: bytes, trace_id: int, generated: bool) -> tuple[bytes, int]:
    """The ext header carrying ``trace_id`` as ``##trace_id``. A header that has one already
    keeps it when ``trace_id`` was generated (the trace switch), and must agree with an
    explicit ``trace_id``."""
    header = json.loads(ext)
    present = header.get("##trace_id")
    if present is not None:
        if generated:
            return ext, int(present)
        if present != str(trace_id):
            raise ValidationError(
                "ext", f"its ##trace_id {present!r} differs from trace_id={trace_id}"
            )
        return ext, trace_id
    header["##trace_id"] = str(trace_id)
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode(), trace_id


def new_trace_ids(count: int) -> list[int]:
    """Random 64-bit trace ids, one per message."""
    return [random.getrandbits(64) for _ in range(count)]
