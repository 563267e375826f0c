"""A simulation's faults: a seeded plan of what goes wrong and when, and the calls that make
it happen on the simulated network and the emulated cluster.

Each :class:`Fault` starts at a time of the plan and, most of them, ends ``seconds`` later:

* on the network (``SimNetwork``), per node's links to its clients: ``reset`` (RST both
  ways), ``half-open`` (held, then delivered; ``half-open-lost``: then lost), ``latency``
  (with jitter), ``slicing`` (pieces of 1..7 bytes), ``refuse`` (new connections refused),
  ``cut`` (the node partitioned from the clients: connects hang, links held);
* in the cluster (the emulator): ``crash`` (the node stops like a crash, its partitions fail
  over, it restarts after ``seconds``), ``move-leader`` (a partition's leadership moves),
  ``unwritable`` (a partition refuses writes), ``lookupd-slow`` (nsqlookupd answers late),
  ``lookupd-blackhole`` (nsqlookupd silent), ``node-blackhole`` (the node silent to every
  peer: nothing read, what it writes held; no failover).

The plan is drawn from the simulation's seed alone (:func:`plan`), so a seed always means the
same faults at the same virtual times.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smartnsq.testing.errors import ClusterError
from smartnsq.testing.sim.network import LinkFaults, SimNetwork

if TYPE_CHECKING:
    from smartnsq.testing.cluster import Cluster

__all__ = ["KINDS", "Fault", "plan"]

KINDS = (
    "reset",
    "half-open",
    "half-open-lost",
    "latency",
    "slicing",
    "refuse",
    "cut",
    "crash",
    "move-leader",
    "unwritable",
    "lookupd-slow",
    "lookupd-blackhole",
    "node-blackhole",
)


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``node`` (or ``partition``) from ``at`` for ``seconds``."""

    at: float
    kind: str
    node: int = 0
    partition: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        where = (
            f"partition {self.partition}"
            if self.kind in ("move-leader", "unwritable")
            else (f"node {self.node}")
        )
        length = f" for {self.seconds:.2f} s" if self.seconds else ""
        return f"{self.at:7.2f} s {self.kind} {where}{length}"


def plan(
    rng: random.Random,
    *,
    duration: float,
    nodes: int,
    partitions: int,
    faults: int,
    kinds: tuple[str, ...] = KINDS,
) -> list[Fault]:
    """``faults`` faults drawn from ``kinds`` over ``duration`` seconds, each over before
    the end (so that the run can heal and drain), in the order they start."""
    chosen = []
    for _ in range(faults):
        kind = rng.choice(kinds)
        seconds = 0.0
        if kind not in ("reset", "move-leader"):
            seconds = round(rng.uniform(0.5, min(20.0, duration / 3)), 3)
        at = round(rng.uniform(1.0, max(1.0, duration - seconds - 1.0)), 3)
        chosen.append(
            Fault(at, kind, rng.randrange(nodes), rng.randrange(max(1, partitions)), seconds)
        )
    return sorted(chosen, key=lambda fault: (fault.at, KINDS.index(fault.kind)))


class FaultRunner:
    """Carries out a plan on ``network`` and ``cluster`` (``topic``: the topic whose
    partitions ``move-leader`` and ``unwritable`` touch)."""

    def __init__(
        self, network: SimNetwork, cluster: Cluster, topic: str, rng: random.Random
    ) -> None:
        self.network = network
        self.cluster = cluster
        self.topic = topic
        self.rng = rng
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, faults: list[Fault]) -> None:
        loop = asyncio.get_running_loop()
        for fault in faults:
            self.tasks.append(loop.create_task(self._run(fault), name=f"sim-fault-{fault.kind}"))

    async def wait(self) -> None:
        await asyncio.gather(*self.tasks)

    def _port(self, node: int) -> int:
        return self.cluster.nodes[node].tcp_port

    def _links(self, node: int) -> list[object]:
        port = self._port(node)
        return [link for link in self.network.open_links() if link.server.local[1] == port]

    async def _run(self, fault: Fault) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, fault.at - loop.time()))
        network, cluster = self.network, self.cluster
        network.note(f"fault {fault.kind} node={fault.node} partition={fault.partition}")
        kind, node = fault.kind, fault.node
        port = self._port(node)
        if kind == "reset":
            for link in self._links(node):
                link.reset()  # type: ignore[attr-defined]
            return
        if kind in ("half-open", "half-open-lost"):
            links = self._links(node)
            for link in links:
                link.hold()  # type: ignore[attr-defined]
            await asyncio.sleep(fault.seconds)
            for link in links:
                link.release(deliver=kind == "half-open")  # type: ignore[attr-defined]
            return
        if kind in ("latency", "slicing"):
            shaped = (
                LinkFaults(latency=0.05, jitter=0.04)
                if kind == "latency"
                else LinkFaults(latency=network.default_faults.latency, slice=7)
            )
            network.shape(port, shaped)
            await asyncio.sleep(fault.seconds)
            network.shape(port, None)
            return
        if kind == "refuse":
            network.refuse("127.0.0.1", port)
            await asyncio.sleep(fault.seconds)
            network.refuse("127.0.0.1", port, refused=False)
            return
        if kind == "cut":
            network.cut(port)
            await asyncio.sleep(fault.seconds)
            network.cut(port, cut=False)
            return
        if kind == "crash":
            await cluster.stop_node(node)
            await asyncio.sleep(fault.seconds)
            await cluster.start_node(node)
            return
        if kind == "move-leader":
            leader = cluster.leader(self.topic, fault.partition)
            if leader is not None:
                others = [n for n in range(len(cluster.nodes)) if n != leader]
                try:
                    await cluster.move_leader(self.topic, fault.partition, self.rng.choice(others))
                except ClusterError as exc:
                    # As nsqlookupd refuses an operator's move (its leader down, say).
                    network.note(f"move refused: {exc}")
            return
        if kind == "unwritable":
            await cluster.set_writable(self.topic, fault.partition, False)
            await asyncio.sleep(fault.seconds)
            await cluster.set_writable(self.topic, fault.partition, True)
            return
        if kind == "lookupd-slow":
            lookupd = int(cluster.lookupd_urls[0].rsplit(":", 1)[1])
            network.shape(lookupd, LinkFaults(latency=0.8, jitter=0.5))
            await asyncio.sleep(fault.seconds)
            network.shape(lookupd, None)
            return
        if kind == "lookupd-blackhole":
            cluster.blackhole_lookupd(0)
            await asyncio.sleep(fault.seconds)
            cluster.heal_lookupd(0)
            return
        if kind == "node-blackhole":
            cluster.blackhole(node)
            await asyncio.sleep(fault.seconds)
            cluster.heal(node)
            return
        raise ValueError(f"unknown fault {kind!r}")
