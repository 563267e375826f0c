"""The README's editable install (``pip install -e '.[dev]'``) is visible to type checkers:
setuptools puts the checkout on the path with a static .pth file (pyproject.toml's
``package-dir``), not an import hook, which mypy and pyright cannot follow; so mypy run on
user code outside the checkout finds smartnsq and its types."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_CODE = """\
import smartnsq


async def send(producer: smartnsq.Producer) -> int | None:
    result = await producer.publish("orders", b"body", sharding_key=42)
    return result.partition


wrong: int = smartnsq.__version__
"""


def _editable_distribution() -> metadata.Distribution:
    """This venv's smartnsq, when it is an editable install of this checkout (else a skip:
    a wheel install, or another checkout's). The checkout's own smartnsq.egg-info, found first
    from its root, is no install: the one installed has a direct_url.json."""
    for distribution in metadata.distributions(name="smartnsq"):
        direct_url = distribution.read_text("direct_url.json")
        if direct_url is not None:
            break
    else:
        pytest.skip("smartnsq is not installed with pip in this environment")
    origin = json.loads(direct_url)
    if not origin.get("dir_info", {}).get("editable"):
        pytest.skip("smartnsq is not an editable install here")
    if Path(origin["url"].removeprefix("file://")).resolve() != ROOT:
        pytest.skip("the editable install is of another checkout")
    return distribution


def test_the_editable_install_is_a_static_path_to_the_checkout() -> None:
    """Every line of the install's .pth files is a directory (no ``import`` line: a hook), and
    one of them holds this checkout's package."""
    distribution = _editable_distribution()
    pth_files = [
        Path(str(distribution.locate_file(file)))
        for file in distribution.files or []
        if file.name.endswith(".pth")
    ]
    assert pth_files, "the editable install wrote no .pth file"
    entries = [
        line.strip()
        for path in pth_files
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    hooks = [entry for entry in entries if entry.startswith(("import ", "import\t"))]
    assert not hooks, f"an import hook instead of a path: {hooks}"
    packages = {(Path(entry) / "smartnsq").resolve() for entry in entries}
    assert ROOT / "smartnsq" in packages, entries


def test_mypy_finds_the_package_from_outside_the_checkout(tmp_path: Path) -> None:
    """mypy, run where user code lives, sees smartnsq's own types: the one mistake in the
    file is reported, and nothing about a missing module."""
    _editable_distribution()
    pytest.importorskip("mypy", reason="mypy comes with the dev extra")
    (tmp_path / "app.py").write_text(USER_CODE)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--strict", "app.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, run.stdout + run.stderr
    assert errors[0].startswith("app.py:9: error: Incompatible types in assignment"), errors
    assert 'expression has type "str", variable has type "int"' in errors[0], errors
