"""A deterministic asyncio event loop with virtual time, for simulations.

:class:`SimLoop` is an asyncio loop: the client's and the emulator's code run on it
unchanged. It differs from asyncio's own in three ways (FoundationDB's simulator, turmoil
for tokio):

* **Virtual time.** :meth:`SimLoop.time` is a number the loop moves. Time passes only when
  nothing is ready to run: the loop then jumps to its next timer at once. A minute of
  timeouts, heartbeats and backoffs passes in the milliseconds its callbacks take.
* **No I/O.** There is no selector and no file descriptor: connections and servers are the
  in-memory links of a :class:`~smartnsq.testing.sim.network.SimNetwork`
  (``create_connection``, ``create_server``, ``open_connection``, ``start_server``), and
  names resolve without DNS. A thread (``run_in_executor``, ``to_thread``) is refused: its
  timing would be the machine's, not the simulation's.
* **Stalls are errors.** When nothing is ready and no timer is due, nothing can ever happen
  again: the loop raises :class:`SimulationStalled` rather than wait for ever.

While a simulation runs (:func:`virtual_clocks`) the ``time`` module's clocks read the loop's
time too (``time.monotonic()``, ``time.time()``...), so code that reads them directly sees
the simulation's time, the global ``random`` is seeded from the simulation's seed, and the
garbage collector waits (what it finalises could act at a moment no seed decides).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.testing.sim.network import SimNetwork

__all__ = ["SimLoop", "SimulationStalled", "virtual_clocks"]

#: The least time a timer waits (see :meth:`SimLoop.call_at`).
TICK = 1e-6
#: The virtual wall clock's start: 2026-01-01T00:00:00Z (any fixed time keeps runs equal).
EPOCH = 1_767_225_600.0


class SimulationStalled(RuntimeError):
    """Nothing is ready to run and no timer is due: the simulation can never go on."""


class _VirtualSelector:
    """What BaseEventLoop polls between iterations: no I/O, so a wait of ``timeout`` seconds
    is the virtual clock moving by that much."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise SimulationStalled(
                f"at {self._loop.time():.6f} s nothing is ready and no timer is due"
            )
        if timeout > 0:
            self._loop.advance_to_next_timer(timeout)
        return []

    def close(self) -> None:
        return None


class SimLoop(asyncio.BaseEventLoop):
    """An event loop with virtual time over a :class:`SimNetwork` (see the module)."""

    def __init__(self, network: SimNetwork) -> None:
        super().__init__()
        self._now = 0.0
        self._selector = _VirtualSelector(self)
        self.network = network
        network.bind(self)
        #: Callbacks run since the loop was made (a measure of the work a run did).
        self.iterations = 0

    # ------------------------------------------------------------------ time

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the virtual clock by ``seconds``."""
        self._now += seconds

    def advance_to_next_timer(self, timeout: float) -> None:
        """What the loop's wait of ``timeout`` seconds does: the clock moves to its next
        timer, exactly (``now + (when - now)`` may fall short of ``when`` in floating point,
        and a timer never due would spin the loop for ever)."""
        scheduled = self._scheduled  # type: ignore[attr-defined]
        target = self._now + timeout
        if scheduled:
            target = max(target, scheduled[0]._when)
        self._now = target

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:  # type: ignore[override]
        # A timer is never due before a microsecond has passed: code that re-arms a timer
        # for a deadline a rounding error short of it (``now + (deadline - now)``) would
        # otherwise find it due, not expired, at the same instant for ever (a real clock
        # moves on between two turns of the loop).
        return super().call_at(max(when, self._now + TICK), callback, *args, context=context)

    def _run_once(self) -> None:
        self.iterations += 1
        super()._run_once()  # type: ignore[misc]

    # ------------------------------------------------------------------ no I/O, no threads

    def _process_events(self, event_list: list[Any]) -> None:
        return None

    def _write_to_self(self) -> None:
        return None

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:  # type: ignore[override]
        raise RuntimeError(
            "a simulation runs on one thread: a thread's timing would be the machine's "
            f"({func!r} was handed to an executor)"
        )

    async def getaddrinfo(
        self,
        host: Any,
        port: Any,
        *,
        family: int = 0,
        type: int = 0,
        proto: int = 0,
        flags: int = 0,
    ) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (str(host), int(port or 0)))]

    # ------------------------------------------------------------------ the network

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **options: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        if options.get("sock") is not None or options.get("ssl"):
            raise RuntimeError("a simulation has no sockets and no TLS")
        return await self.network.connect(protocol_factory, str(host), int(port or 0))

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        **options: Any,
    ) -> asyncio.AbstractServer:
        if options.get("sock") is not None or options.get("ssl"):
            raise RuntimeError("a simulation has no sockets and no TLS")
        return self.network.listen(protocol_factory, host or "127.0.0.1", int(port or 0))

    def reserve_port(self, host: str) -> Any:
        """A port of the network nothing listens on yet, held (as a bound socket would be)."""
        return self.network.reserve(host)


@contextlib.contextmanager
def virtual_clocks(loop: SimLoop, seed: int) -> Iterator[None]:
    """While in it, the ``time`` module's clocks read ``loop``'s virtual time (the wall
    clock from :data:`EPOCH`) and the global ``random`` draws from ``seed``; both are put
    back after."""
    saved = {
        name: getattr(time, name)
        for name in ("monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time")
    }
    saved_ns = time.time_ns
    state = random.getstate()
    time.monotonic = loop.time
    time.perf_counter = loop.time
    time.monotonic_ns = lambda: round(loop.time() * 1e9)
    time.perf_counter_ns = time.monotonic_ns
    time.time = lambda: EPOCH + loop.time()
    time.time_ns = lambda: round((EPOCH + loop.time()) * 1e9)
    random.seed(seed)
    # The collector runs when allocations add up, and what it finalises (a coroutine's
    # finally block, a __del__) can act: it would act at a point no seed decides.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
        for name, value in saved.items():
            setattr(time, name, value)
        time.time_ns = saved_ns
        random.setstate(state)
