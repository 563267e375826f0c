"""What a publish returns: :class:`PublishResult`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PublishResult"]


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What nsqd accepted. ``internal_id``, ``trace_id``, ``offset`` and ``size`` come from
    a trace receipt (traced publishes on youzan) and are None otherwise."""

    topic: str
    partition: int | None
    address: str
    internal_id: int | None = None
    trace_id: int | None = None
    offset: int | None = None
    size: int | None = None
    tries: int = 1
