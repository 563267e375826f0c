"""Deterministic simulation: the real client and the emulated cluster on one thread, over
an in-memory network, on virtual time, every random draw from one seed.

:class:`Simulation` runs a test's own coroutine under it (the ``nsq_sim`` pytest fixture
makes one); :mod:`smartnsq.testing.sim.run` is the project's own workload and its checks
(``simulate(seed)``). See the testing guide.
"""

from smartnsq.testing.sim.faults import KINDS, Fault, FaultRunner
from smartnsq.testing.sim.harness import Simulation, SimulationError
from smartnsq.testing.sim.loop import SimLoop, SimulationStalled
from smartnsq.testing.sim.network import LinkFaults, SimNetwork

__all__ = [
    "KINDS",
    "Fault",
    "FaultRunner",
    "LinkFaults",
    "SimLoop",
    "SimNetwork",
    "Simulation",
    "SimulationError",
    "SimulationStalled",
]
