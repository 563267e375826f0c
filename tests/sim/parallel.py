"""Seeds run side by side: one process per core (at most two, CI's), each simulation on its
own; the reports of what failed come back in seed order."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable, Iterator
from contextlib import ExitStack

from smartnsq.testing.sim.run import simulate
from tests.sim import bugs

WORKERS = max(1, min(2, os.cpu_count() or 1))


def run_one(job: tuple[int, str | None]) -> tuple[int, bool, str, str]:
    """(seed, passed, report, trace hash) of ``seed``, with the re-introduced bug named (if
    any) in place."""
    seed, bug = job
    with ExitStack() as stack:
        if bug is not None:
            stack.enter_context(bugs.BUGS[bug]())
        outcome = simulate(seed)
    return seed, outcome.passed, outcome.report(), outcome.trace_hash


def run_seeds(seeds: Iterable[int], bug: str | None = None) -> Iterator[tuple[int, bool, str, str]]:
    """Each seed's result, in seed order; stopping early stops the workers."""
    jobs = [(seed, bug) for seed in seeds]
    # spawn, not fork: the test session may have threads (a lock held by one would be held
    # for ever in a forked child)
    context = multiprocessing.get_context("spawn")
    with context.Pool(WORKERS) as pool:
        yield from pool.imap(run_one, jobs, chunksize=4)
