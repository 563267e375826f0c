"""What a simulation saw: every publish (when it was called, when and how it ended), every
handler call, and what the emulated cluster observed (each session's RDY, each subscribe,
each refusal that a later store on the same connection followed). The invariants
(:mod:`smartnsq.testing.sim.invariants`) read it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Handled", "History", "Published"]

UNKEYED = -1


@dataclass
class Published:
    """One ``publish()`` or ``publish_many()`` of the workload."""

    index: int  # call order, across the whole run
    key: int  # UNKEYED for a round-robin publish
    numbers: list[int]  # per-key sequence numbers of its bodies, in order
    bodies: list[bytes]
    started: float
    bound: float  # when it must have ended by (its deadline, and a linger)
    ended: float | None = None
    partition: int | None = None  # where the results say it went
    error: BaseException | None = None

    @property
    def acknowledged(self) -> bool:
        return self.ended is not None and self.error is None

    @property
    def in_doubt(self) -> bool:
        """It failed, and a try of it may have been stored."""
        return bool(getattr(self.error, "outcome_unknown", False))


@dataclass
class Handled:
    """One handler call (or a give-up) of the workload's consumer."""

    at: float
    key: int
    number: int
    body: bytes
    partition: int | None
    attempts: int
    given_up: bool = False


@dataclass
class History:
    """Everything a run recorded, for the invariants."""

    ordered: bool
    ext: bool
    max_in_flight: int | None
    partitions: int
    published: list[Published] = field(default_factory=list)
    handled: list[Handled] = field(default_factory=list)
    max_rdy: int = 0  # the most RDY the consumer's connections held at once
    rdy_overruns: list[str] = field(default_factory=list)
    # per (node, partition): the times the consumer subscribed there
    subscribes: dict[tuple[int, int | None], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    # bodies (a, b): nsqd refused a and then stored b on the same connection
    inversions: set[tuple[bytes, bytes]] = field(default_factory=set)
    stored: dict[bytes, int] = field(default_factory=dict)  # body -> copies stored
    # a FIN or REQ the consumer sent for a delivery it had already answered
    answered_twice: list[str] = field(default_factory=list)
    loop_errors: list[dict[str, Any]] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    drained_at: float | None = None
    healed_at: float = 0.0
    notes: list[str] = field(default_factory=list)

    def by_body(self) -> dict[bytes, Published]:
        return {body: p for p in self.published for body in p.bodies}
