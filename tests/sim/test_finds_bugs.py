"""The simulation finds known bugs: each is put back (tests/sim/bugs.py) and the seeds are
run from 1 until one fails, well within a CI run's thousand. The seeds it took are the table
in docs/guides/testing.md."""

from __future__ import annotations

import pytest

from tests.sim.bugs import BUGS
from tests.sim.parallel import run_seeds

#: The most seeds a hunt may take: a CI run's (test_schedules.RUNS). A bug it cannot find by
#: then is one the suite would miss.
LIMIT = 1000


@pytest.mark.timeout(1200)  # the rarest takes a few hundred seeds; most are found at once
@pytest.mark.parametrize("bug", list(BUGS))
def test_the_simulation_finds(bug: str) -> None:
    for tried, (seed, passed, report, _) in enumerate(run_seeds(range(1, LIMIT + 1), bug), 1):
        if not passed:
            print(f"{bug}: found by seed {seed}, the {tried}th tried\n{report}")
            return
    pytest.fail(f"{bug}: no seed of 1..{LIMIT} found it")
