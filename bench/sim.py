"""How fast the deterministic simulation runs (smartnsq.testing.sim.run): simulated seconds
per wall second, one process, seed after seed (a cluster of 4 nodes, one producer and one
consumer through each seed's faults), and the wall time of a CI run's thousand schedules on
``--workers`` processes.

Usage: python bench/sim.py [--seeds 40] [--first 1] [--workers 2] [--ci 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smartnsq.testing.sim.run import simulate  # noqa: E402


def _one(seed: int) -> tuple[float, float, bool]:
    outcome = simulate(seed)
    return outcome.simulated, outcome.wall, outcome.passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40, help="seeds timed one by one")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ci", type=int, default=0, help="also time this many seeds in parallel")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ratios = []
    walls = []
    for seed in range(args.first, args.first + args.seeds):
        simulated, wall, _ = _one(seed)
        ratios.append(simulated / wall)
        walls.append(wall)
    result: dict[str, float] = {
        "seeds": args.seeds,
        "simulated_per_wall_median": statistics.median(ratios),
        "simulated_per_wall_lowest": min(ratios),
        "wall_per_seed_median": statistics.median(walls),
    }
    print(
        f"{args.seeds} seeds, one process: {result['simulated_per_wall_median']:.0f} simulated "
        f"s per wall s (median; lowest {result['simulated_per_wall_lowest']:.0f}), "
        f"{result['wall_per_seed_median']:.2f} s per seed"
    )
    if args.ci:
        started = time.perf_counter()
        context = multiprocessing.get_context("spawn")
        with context.Pool(args.workers) as pool:
            outcomes = list(pool.imap(_one, range(args.first, args.first + args.ci), chunksize=4))
        elapsed = time.perf_counter() - started
        result["ci_seeds"] = args.ci
        result["ci_wall"] = elapsed
        result["ci_failed"] = sum(not passed for _, _, passed in outcomes)
        print(
            f"{args.ci} seeds on {args.workers} processes: {elapsed:.0f} s "
            f"({result['ci_failed']:.0f} failed)"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
