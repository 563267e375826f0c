"""The project's own contract: the README's set-up commands and CI stay in step."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)


def test_ci_runs_the_readme_test_command() -> None:
    test_command = _readme_commands()[1]
    assert "pytest" in test_command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
    assert "set -euo pipefail" in ci


def test_package_is_typed() -> None:
    assert (ROOT / "smartnsq" / "py.typed").exists()


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_embedded_cluster_uses_nothing_of_the_client() -> None:
    """The emulator stands on the protocol floor only, so a client bug cannot be mirrored
    by the server it is tested against; and the protocol floor does no I/O."""
    client = ("smartnsq.transport", "smartnsq.producer", "smartnsq.consumer", "smartnsq.flow")
    client += ("smartnsq.publishing",)
    client += ("smartnsq.routing", "smartnsq.sync", "smartnsq.client")
    # containers.py is no emulator: it runs real servers in Docker and hands out clients.
    testing = (ROOT / "smartnsq" / "testing").glob("*.py")
    emulator = [path for path in testing if path.name != "containers.py"]
    for path in sorted(emulator):
        leaks = {m for m in _imported_modules(path) if m.startswith(client)}
        assert not leaks, f"{path.name} imports {leaks}"
    for path in sorted((ROOT / "smartnsq" / "protocol").glob("*.py")):
        io = {m for m in _imported_modules(path) if m.split(".")[0] in ("asyncio", "socket")}
        assert not io, f"{path.name} imports {io}"


def test_the_publish_path_parts_are_pure() -> None:
    """smartnsq.publishing does no I/O and stands only on the floors below the Producer (the
    other pure decisions of floor 2 included: flow/)."""
    below = ("smartnsq.protocol", "smartnsq.routing", "smartnsq.publishing", "smartnsq.flow")
    below += ("smartnsq.errors",)
    for path in sorted((ROOT / "smartnsq" / "publishing").glob("*.py")):
        imported = _imported_modules(path)
        above = {m for m in imported if m.split(".")[0] == "smartnsq" and not m.startswith(below)}
        assert not above, f"{path.name} imports {above}"
        io = {m for m in imported if m.split(".")[0] in ("asyncio", "socket")}
        assert not io, f"{path.name} imports {io}"


def test_package_metadata_names_its_authors_links_and_audience() -> None:
    """What PyPI shows: authors, the project's links (one repository), and classifiers
    that agree with requires-python and the package itself."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["authors"] == [{"name": "smartnsq developers"}]
    urls = project["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    repository = urls["Source"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository)
    assert urls["Homepage"] == repository
    assert urls["Issues"] == f"{repository}/issues"
    assert urls["Documentation"].startswith(f"{repository}/")
    assert project["keywords"]
    assert "nsq" in project["keywords"]
    classifiers = project["classifiers"]
    assert len(set(classifiers)) == len(classifiers)
    # PEP 639: the SPDX `license` field replaces license classifiers (setuptools refuses both)
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert ("Typing :: Typed" in classifiers) == (ROOT / "smartnsq" / "py.typed").exists()
    lowest = re.fullmatch(r">=3\.(\d+)", project["requires-python"])
    assert lowest is not None
    minors = sorted(
        int(c.rsplit(".", 1)[1])
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    )
    assert minors[0] == int(lowest.group(1))
    # Only what CI runs: the machine's 3.11 (.ci/run) and Debian 13's 3.13 (.ci/python313).
    assert minors == [11, 13]
