"""The real client against the emulated cluster through seeded fault schedules
(smartnsq.testing.sim.run): a thousand of them per run, side by side on the machine's cores.

``--sim-runs N`` runs seeds 1..N (a soak: ``--sim-runs 100000``); ``--sim-seed N`` replays
seed N alone, twice, and holds the two runs to the same trace hash. A failure prints each
failing seed's scenario, the rules it broke and the command that replays it."""

from __future__ import annotations

import pytest

from smartnsq.testing.sim.run import simulate
from tests.sim.parallel import run_one, run_seeds

#: Schedules per run of the suite: 60 simulated seconds each, about 4 minutes on 2 cores.
RUNS = 1000
#: Seeds that once failed, each for a bug since fixed (docs/guides/testing.md).
REGRESSIONS = {
    269: "a copy FINed on the new leader while its handler failed on the old one: lost",
    276: "the same, after a crash and a leader move",
    282: "a new leader's message handled beside the old leader's handler: out of order",
}


@pytest.mark.timeout(1800)  # about 4 minutes on 2 cores; a soak sets its own with --timeout
def test_seeded_schedules(request: pytest.FixtureRequest) -> None:
    seed = request.config.getoption("sim_seed")
    if seed is not None:
        first, again = simulate(seed), simulate(seed)
        print(first.report())
        assert again.trace_hash == first.trace_hash, "the seed did not replay exactly"
        assert first.passed, first.report()
        return
    runs = request.config.getoption("sim_runs") or RUNS
    failed = [report for _, passed, report, _ in run_seeds(range(1, runs + 1)) if not passed]
    assert not failed, f"{len(failed)} of {runs} schedules failed:\n\n" + "\n\n".join(failed)


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_regression_seed(seed: int) -> None:
    outcome = simulate(seed)
    assert outcome.passed, f"{REGRESSIONS[seed]}\n{outcome.report()}"


def test_a_seed_replays_alike_in_another_process() -> None:
    # another interpreter: another hash seed for str and bytes, other addresses
    here = [simulate(seed).trace_hash for seed in (3, 4)]
    there = [trace for _, _, _, trace in run_seeds([3, 4])]
    assert here == there
    assert run_one((3, None))[3] == here[0]
