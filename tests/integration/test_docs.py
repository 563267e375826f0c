"""Every Python example in README.md and docs/ runs, against a fresh embedded cluster.

Examples are complete programs. Those written for a real cluster use the usual local
addresses (nsqlookupd ``http://127.0.0.1:4161``, classic nsqd ``127.0.0.1:4150``), which are
rewritten to the embedded clusters' addresses. A block fenced as ``python pytest`` is a test
module and runs under pytest (with the project's nsq_cluster plugin).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import pytest

import smartnsq
from smartnsq.testing import Cluster

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```python( pytest)?\n(.*?)^```", re.MULTILINE | re.DOTALL)
LOOKUPD = "http://127.0.0.1:4161"
NSQD = "127.0.0.1:4150"
TIMEOUT = 90
# An example that starts a Spark session (10-20 s, and its first job starts Python workers).
SPARK_TIMEOUT = 300


class Example(NamedTuple):
    where: str
    code: str
    pytest: bool


def _examples() -> list[Example]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            found.append(Example(where, match.group(2), bool(match.group(1))))
    return found


EXAMPLES = _examples()


class Clusters(NamedTuple):
    youzan: Cluster
    classic: Cluster


@pytest.fixture
async def clusters() -> AsyncIterator[Clusters]:
    async with Cluster(nodes=3) as youzan, Cluster(classic=True) as classic:
        await youzan.create_topic("orders", 4, 2, channels=["billing"])
        await youzan.create_topic("payments", 4, 2, ordered=True, channels=["ledger", "audit"])
        await youzan.create_topic("audit", 1, 1, ext=True, channels=["archive"])
        yield Clusters(youzan, classic)


def test_examples_were_found() -> None:
    assert len(EXAMPLES) >= 10
    assert any(example.pytest for example in EXAMPLES)


def _params() -> list[object]:
    """Spark examples get a longer pytest timeout (and the spark marker)."""
    params: list[object] = []
    for example in EXAMPLES:
        marks = []
        if "pyspark" in example.code:
            marks = [pytest.mark.spark, pytest.mark.timeout(SPARK_TIMEOUT + 30)]
        params.append(pytest.param(example, marks=marks, id=example.where))
    return params


@pytest.mark.parametrize("example", _params())
async def test_example_runs(example: Example, clusters: Clusters, tmp_path: Path) -> None:
    code = example.code.replace(LOOKUPD, clusters.youzan.lookupd_url).replace(
        NSQD, clusters.classic.nsqd_addresses[0]
    )
    if example.pytest:
        script = tmp_path / "test_example.py"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)]
    else:
        script = tmp_path / "example.py"
        command = [sys.executable, str(script)]
    script.write_text(code)
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        limit = SPARK_TIMEOUT if "pyspark" in example.code else TIMEOUT
        out, err = await asyncio.wait_for(process.communicate(), limit)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"{example.where} failed:\n{out.decode()}\n{err.decode()}"


def test_reference_names_every_public_name() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    missing = [name for name in smartnsq.__all__ if name != "__version__" and name not in reference]
    assert missing == []


def test_architecture_names_existing_modules() -> None:
    """The architecture page matches the code: every module it names exists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = {
        n.removeprefix("smartnsq/") for n in re.findall(r"\b((?:[a-z_]+/)*[a-z_]+\.py)\b", text)
    }
    package = ROOT / "smartnsq"
    missing = [
        name
        for name in named
        if not (package / name).exists()
        and not (package / "protocol" / name).exists()
        and not (package / "testing" / name).exists()
    ]
    assert missing == []
