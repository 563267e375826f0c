"""A simulation to run code in: the loop, the network and the clocks of one seed.

:class:`Simulation` is what a test (the project's or a user's) runs its own coroutine in::

    def test_my_ordering() -> None:
        sim = Simulation(seed=7)

        async def scenario(sim: Simulation) -> None:
            async with Cluster(nodes=4) as cluster:
                await cluster.create_topic("orders", 4, 2, ext=True, channels=["billing"])
                faults = sim.inject(cluster, "orders", sim.plan(duration=30, faults=3))
                ...  # the test's producers and consumers, on virtual time
                await faults.wait()

        sim.run(scenario)

Everything in it happens on a :class:`~smartnsq.testing.sim.loop.SimLoop` over a
:class:`~smartnsq.testing.sim.network.SimNetwork`: the emulated cluster and the real client
talk through in-memory links, time is virtual (a minute passes in well under a second),
and every random draw comes from the seed, so the same seed runs the same way again
(:attr:`Simulation.trace_hash` fingerprints what went over the network). An exception that
reaches the loop (a task's error nobody retrieved, a callback that raised) fails the run.
"""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from smartnsq.testing.sim.faults import KINDS, Fault, FaultRunner, plan
from smartnsq.testing.sim.loop import SimLoop, virtual_clocks
from smartnsq.testing.sim.network import SimNetwork

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["Simulation", "SimulationError"]

T = TypeVar("T")


class SimulationError(AssertionError):
    """Something escaped to the simulation's loop (an unretrieved task error, a callback that
    raised): a failure of the code under test, reported with the seed that replays it."""


class Simulation:
    """One seeded run (see the module): make it, then :meth:`run` a coroutine in it, once."""

    def __init__(self, seed: int, *, latency: float = 0.0002) -> None:
        if type(seed) is not int:
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        self.seed = seed
        self.network = SimNetwork(seed, latency=latency)
        self.loop = SimLoop(self.network)
        #: Draws for the test's own choices (keys, delays...): the seed's, apart from the
        #: client's and the faults', so adding a draw here changes nothing else.
        self.rng = random.Random(f"user:{seed}")
        #: What reached the loop's exception handler, in order.
        self.loop_errors: list[dict[str, Any]] = []
        self._ran = False

    @property
    def trace_hash(self) -> str:
        """A fingerprint of every connection, write and note of the run so far."""
        return self.network.trace_hash

    def time(self) -> float:
        """The virtual time, in seconds since the simulation began."""
        return self.loop.time()

    def plan(
        self,
        *,
        duration: float,
        faults: int = 3,
        nodes: int = 4,
        partitions: int = 4,
        kinds: tuple[str, ...] = KINDS,
    ) -> list[Fault]:
        """``faults`` faults of ``kinds`` drawn from the seed, within ``duration`` seconds
        from when they are injected, on ``nodes`` nodes and ``partitions`` partitions."""
        rng = random.Random(f"plan:{self.seed}")
        return plan(
            rng, duration=duration, nodes=nodes, partitions=partitions, faults=faults, kinds=kinds
        )

    def inject(self, cluster: Cluster, topic: str, faults: list[Fault]) -> FaultRunner:
        """Start ``faults`` (times from now) on ``cluster`` and the network; ``await`` the
        returned runner's ``wait()`` for the last one to heal."""
        runner = FaultRunner(self.network, cluster, topic, random.Random(f"faults:{self.seed}"))
        runner.start(list(faults))
        return runner

    def run(self, main: Callable[[Simulation], Awaitable[T]]) -> T:
        """Run ``main(self)`` to its end on the simulation's loop, then close the loop: what
        ``main`` returns, or what it raised. Called from plain (not async) code: the loop
        cannot run inside another one."""
        if self._ran:
            raise RuntimeError("a Simulation runs once: make another with the same seed")
        self._ran = True
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "Simulation.run() runs its own loop: call it from a plain def test, not from "
                "an async one"
            )
        loop = self.loop
        loop.set_exception_handler(lambda _, context: self.loop_errors.append(context))

        async def started() -> T:
            return await main(self)

        with virtual_clocks(loop, self.seed):
            try:
                result = loop.run_until_complete(started())
            finally:
                _close(loop)
                gc.collect()  # "exception was never retrieved" comes out now
        if self.loop_errors:
            first = self.loop_errors[0]
            raise SimulationError(
                f"seed {self.seed}: an exception reached the loop: {first.get('message')} "
                f"{first.get('exception')!r}"
            )
        return result


def _close(loop: SimLoop) -> None:
    """Cancel what is left, let it unwind, and close the loop."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
