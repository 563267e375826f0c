"""The benchmark harnesses still run: ``bench/producer.py``, ``bench/consumer.py`` and
``bench/scale.py`` with tiny counts, ``bench/soak.py`` for 10 s with two faults,
``bench/startup.py`` for one round (this tree as its own baseline), and ``bench/compare.py``
for one workload when ``bench/.env`` (pynsq, gnsq) exists.

No timing assertions: the benchmark is the judge, this only checks that it works. Each
harness runs in its own session; whatever it started is gone when it returns, or is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
BENCH_ENV_PYTHON = BENCH / ".env" / "bin" / "python"
TIMEOUT = 45.0  # under the suite's 60 s per test
# Tiny counts; never wait for a quiet machine, never run again.
FAST = ["--quiet-patience=0", "--retries=0"]

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the harnesses read /proc and pin cores"
)


def run_harness(argv: list[str], timeout: float = TIMEOUT) -> str:
    """Run a harness in a new session; kill the whole session if it overstays or leaks."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv[1]} still running after {timeout} s:\n{err[-3000:]}")
    finally:
        leaked = True
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            leaked = False
        if leaked:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{argv[1]} exited with {proc.returncode}:\n{err[-3000:]}"
    assert not leaked, f"{argv[1]} left processes behind"
    return out


def run_bench(script: str, *arguments: str) -> str:
    """``bench/<script>`` with this interpreter (see run_harness)."""
    return run_harness([sys.executable, str(BENCH / script), *arguments])


def test_producer_bench(tmp_path: Path) -> None:
    result = tmp_path / "producer.json"
    out = run_bench(
        "producer.py",
        "--rounds=1",
        "--messages=300",
        "--sequential=100",
        "--batched=1000",
        "--warmup=50",
        f"--json={result}",
        *FAST,
    )
    assert "pipelined" in out
    summary = json.loads(result.read_text())["summary"]
    assert set(summary) == {"sequential", "pipelined", "batched", "auto-batched"}
    assert all(row["msgs_per_s"] > 0 for row in summary.values())


def test_consumer_bench_classic(tmp_path: Path) -> None:
    result = tmp_path / "consumer.json"
    out = run_bench(
        "consumer.py", "--classic", "--rounds=1", "--messages=2000", f"--json={result}", *FAST
    )
    assert "consume" in out
    data = json.loads(result.read_text())
    (run,) = data["runs"]["consume"]
    assert run["messages"] == 2000
    assert run["extra"]["finished"] >= 2000


def test_scale_bench(tmp_path: Path) -> None:
    result = tmp_path / "scale.json"
    out = run_bench(
        "scale.py",
        "--sizes=16",
        "--rounds=1",
        "--idle=0.2",
        "--fast-idle=0.2",
        "--messages=320",
        "--quiet-patience=0",
        f"--json={result}",
    )
    assert "memory per connection" in out
    runs = json.loads(result.read_text())["results"]["16"]["smartnsq"]
    assert {run["mode"] for run in runs} == {"main", "heartbeats", "traced"}
    assert all(run["connections"] == 16 for run in runs)
    assert [run["messages"] for run in runs if run["mode"] == "main"] == [320]


def test_soak_bench(tmp_path: Path) -> None:
    result = tmp_path / "soak.json"
    # 10 s: a reset, then a 1 s half-open window
    faults = ["--minutes=0.17", "--cycle=10", "--faults=reset,blackhole", "--blackhole-seconds=1"]
    out = run_bench("soak.py", *faults, "--rate=200", "--interval=5", f"--json={result}")
    assert "memory per waiting publish" in out
    assert "loop lag on heal" in out
    data = json.loads(result.read_text())
    assert [e["kind"] for e in data["episodes"]] == ["reset", "blackhole"]
    totals = data["totals"]
    assert totals["sent"] == totals["acknowledged"] > 0
    assert totals["lost"] == 0
    (half_open,) = totals["half_open"]
    assert half_open["traced"]


def test_startup_bench(tmp_path: Path) -> None:
    result = tmp_path / "startup.json"
    one_quick_round = ["--rounds=1", "--consume=500", "--publish=500", *FAST]
    out = run_bench("startup.py", *one_quick_round, f"--baseline=again={ROOT}", f"--json={result}")
    assert "youzan: construction to first ack" in out
    data = json.loads(result.read_text())
    rows = {row["metric"]: row for row in data["summary"]["rows"]}
    first = rows["youzan: construction to first ack (ms)"]
    assert set(first["values"]) == {"smartnsq", "again"}
    assert set(first["ratios"]) == {"again"}
    assert rows["consumer: peak RSS (MiB)"]["values"]["smartnsq"]["median"] > 0
    kinds = {run["kind"] for run in data["runs"]}
    assert kinds == {
        "empty",
        "import",
        "importtime",
        "first-youzan",
        "first-classic",
        "rss-import",
        "rss-consume",
        "rss-publish",
    }


def _bench_env_ready() -> bool:
    if not BENCH_ENV_PYTHON.exists():
        return False
    probe = [str(BENCH_ENV_PYTHON), "-c", "import nsq, gnsq, smartnsq"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_compare_one_workload(tmp_path: Path) -> None:
    if not _bench_env_ready():
        pytest.skip("no bench/.env with pynsq and gnsq (bench/compare creates it)")
    result = tmp_path / "compare.json"
    out = run_harness(
        [
            str(BENCH_ENV_PYTHON),
            str(BENCH / "compare.py"),
            "--quick",
            "--only=pub100",
            "--pub100=1000",
            "--warmup=50",
            f"--json={result}",
            *FAST,
        ]
    )
    assert "same-round ratios" in out
    summary = json.loads(result.read_text())["summary"]
    assert {r["against"] for r in summary["ratios"]} == {"pynsq", "gnsq"}
    rows = summary["rows"]
    assert {row["client"] for row in rows} == {"smartnsq", "pynsq", "gnsq"}
    assert all(row["runs"] == 1 for row in rows)


def test_compare_the_blocking_publish(tmp_path: Path) -> None:
    """The blocking row: smartnsq.sync.Producer beside gnsq's blocking publish and the async
    publish of the same variant, in the same round."""
    if not _bench_env_ready():
        pytest.skip("no bench/.env with pynsq and gnsq (bench/compare creates it)")
    result = tmp_path / "compare.json"
    run_harness(
        [
            str(BENCH_ENV_PYTHON),
            str(BENCH / "compare.py"),
            "--quick",
            "--only=pub1,pub1-blocking",
            "--clients=gnsq",
            "--pub1=200",
            "--warmup=50",
            f"--json={result}",
            *FAST,
        ]
    )
    summary = json.loads(result.read_text())["summary"]
    blocking = {
        (r["against"], r["metric"]) for r in summary["ratios"] if r["workload"] == "pub1-blocking"
    }
    assert {("gnsq", "msgs/s"), ("smartnsq", "msgs/s"), ("smartnsq", "client CPU")} <= blocking
    assert any(t["target"].startswith("blocking sequential PUB") for t in summary["targets"])
