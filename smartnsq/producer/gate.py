"""How many retries start in one turn of the event loop.

A heal releases every publish that waited for it at once: thousands when a link was silent
for a while at a few hundred publishes a second (a connection closed at ``request_timeout``
fails every request on it in one callback; a lookup naming a new leader wakes every publish
waiting for it). Routed, encoded and written in one turn, they stall the loop for as long as
that takes, and everything else on it (consumers' heartbeats and FINs, other publishes)
waits. The gate lets :data:`PER_TURN` retries start per turn and queues the rest, in the
order they came, for the turns that follow.

Nothing waits when retries are few: a retry takes a ticket (a counter) and goes on.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["PER_TURN", "RetryGate"]

#: Retries started per turn of the loop at most: about 2 ms of work each turn (a retry's
#: routing, encoding and write cost 10-30 µs), so a storm of 8,000 takes 125 short turns.
PER_TURN = 64


class RetryGate:
    """At most ``per_turn`` retries start in one turn of the loop; the others wait, first
    come first served. Bound to the loop of its first use."""

    __slots__ = ("_loop", "_per_turn", "_started", "_turn", "_waiting")

    def __init__(self, per_turn: int = PER_TURN) -> None:
        self._per_turn = per_turn
        self._started = 0  # retries started in this turn
        self._turn: asyncio.Handle | None = None  # the end of this turn: the count resets
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Retries waiting for a later turn."""
        return len(self._waiting)

    async def enter(self) -> None:
        """Return when this retry may start (at once, unless this turn is full)."""
        if self._started < self._per_turn and not self._waiting:
            self._take()
            return
        loop = self._loop or asyncio.get_running_loop()
        ticket: asyncio.Future[None] = loop.create_future()
        self._waiting.append(ticket)
        self._schedule_turn(loop)
        await ticket  # its own future: a cancelled retry leaves the others waiting

    def _take(self) -> None:
        self._started += 1
        if self._turn is None:
            self._schedule_turn(self._loop or asyncio.get_running_loop())

    def _schedule_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self._turn is None:
            self._turn = loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn: up to ``per_turn`` of those waiting go, in order."""
        self._turn = None
        self._started = 0
        waiting = self._waiting
        while waiting and self._started < self._per_turn:
            ticket = waiting.popleft()
            if not ticket.done():  # cancelled meanwhile: its place goes to the next
                ticket.set_result(None)
                self._started += 1
        if self._started:
            self._turn = self._loop.call_soon(self._next_turn) if self._loop else None
