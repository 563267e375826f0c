"""The simulation's loop, network and harness (smartnsq.testing.sim): virtual time, no real
I/O, exact replay, and what a user's test sees through the nsq_sim fixture."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

import smartnsq
from smartnsq.testing import Cluster
from smartnsq.testing.sim import Simulation, SimulationError, SimulationStalled


def test_time_jumps_to_the_next_timer_and_the_clocks_follow() -> None:
    sim = Simulation(1)

    async def main(sim: Simulation) -> tuple[float, float, float]:
        before = time.monotonic()
        await asyncio.sleep(3600)
        return before, time.monotonic(), sim.time()

    before, after, now = sim.run(main)
    assert after - before == pytest.approx(3600)
    assert now == pytest.approx(3600)


def test_nothing_left_to_happen_is_a_stall_not_a_hang() -> None:
    async def main(sim: Simulation) -> None:
        await asyncio.get_running_loop().create_future()  # nobody will ever set it

    with pytest.raises(SimulationStalled):
        Simulation(1).run(main)


def test_a_thread_is_refused() -> None:
    async def main(sim: Simulation) -> None:
        await asyncio.to_thread(print, "never")

    with pytest.raises(RuntimeError, match="one thread"):
        Simulation(1).run(main)


def test_an_exception_nobody_retrieved_fails_the_run_with_its_seed() -> None:
    async def fails() -> None:
        raise ValueError("lost in a task")

    async def main(sim: Simulation) -> None:
        asyncio.get_running_loop().create_task(fails())
        await asyncio.sleep(1)

    with pytest.raises(SimulationError, match=r"seed 5: .*lost in a task"):
        Simulation(5).run(main)


def test_random_draws_come_from_the_seed() -> None:
    async def main(sim: Simulation) -> tuple[float, float]:
        return random.random(), sim.rng.random()

    assert Simulation(9).run(main) == Simulation(9).run(main)
    assert Simulation(9).run(main) != Simulation(10).run(main)


def test_a_simulation_runs_once_and_not_inside_a_loop() -> None:
    async def main(sim: Simulation) -> None:
        return None

    sim = Simulation(1)
    sim.run(main)
    with pytest.raises(RuntimeError, match="runs once"):
        sim.run(main)

    async def nested() -> None:
        Simulation(2).run(main)

    with pytest.raises(RuntimeError, match="plain def test"):
        asyncio.run(nested())


async def _ordered_under_faults(sim: Simulation) -> tuple[list[str], int, int]:
    """A user's test: keyed publishes and an ordered handler through the seed's faults."""
    problems: list[str] = []
    last: dict[bytes, int] = {}

    async def handle(message: smartnsq.Message) -> None:
        key, number = message.body.split(b":")
        if last.get(key, -1) >= int(number):
            problems.append(f"{message.body!r} after {last[key]}")
        last[key] = int(number)

    async with Cluster(nodes=4) as cluster:
        await cluster.create_topic("orders", 4, 2, ext=True, channels=["billing"])
        faults = sim.inject(cluster, "orders", sim.plan(duration=20, faults=3))
        consumer = smartnsq.Consumer(
            "orders", "billing", lookupd=[cluster.lookupd_url], handler=handle, ordered=True
        )
        acknowledged = 0
        async with consumer, smartnsq.Producer(lookupd=[cluster.lookupd_url]) as producer:
            for number in range(100):
                key = f"k{number % 5}"
                try:
                    await producer.publish("orders", f"{key}:{number}".encode(), sharding_key=key)
                    acknowledged += 1
                except smartnsq.PublishError:
                    pass
                await asyncio.sleep(0.2)
            await faults.wait()
            # polling costs nothing on virtual time
            while consumer.stats().finished < acknowledged and sim.time() < 300:  # noqa: ASYNC110
                await asyncio.sleep(1)
            finished = consumer.stats().finished
    return problems, acknowledged, finished


def test_a_users_ordered_handler_meets_the_faults(nsq_sim: Simulation) -> None:
    problems, acknowledged, finished = nsq_sim.run(_ordered_under_faults)
    assert problems == []
    assert finished >= acknowledged > 0


def test_the_same_seed_runs_the_same_way() -> None:
    first, second = Simulation(77), Simulation(77)
    assert first.run(_ordered_under_faults) == second.run(_ordered_under_faults)
    assert first.trace_hash == second.trace_hash
    third = Simulation(78)
    third.run(_ordered_under_faults)
    assert third.trace_hash != first.trace_hash


@pytest.mark.nsq_sim(seed=12)
def test_the_marker_gives_the_seed(nsq_sim: Simulation, request: pytest.FixtureRequest) -> None:
    wanted = request.config.getoption("sim_seed")
    assert nsq_sim.seed == (12 if wanted is None else wanted)
