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
    # Only what CI runs: the host's Python and the legs .ci/run runs in Debian roots.
    assert [f"3.{minor}" for minor in minors] == sorted(_ci_legs(), key=_version_key)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _ci_legs() -> dict[str, str]:
    """The Python versions .ci/run tests, each with its set of tests: the host's
    (``HOST_PYTHON``, everything: ``host``) and each ``.ci/python VERSION SET`` it runs."""
    ci = (ROOT / ".ci" / "run").read_text()
    host = re.findall(r"^HOST_PYTHON=(3\.\d+)$", ci, re.MULTILINE)
    assert len(host) == 1, "one HOST_PYTHON= line in .ci/run"
    legs = {host[0]: "host"}
    for version, test_set in re.findall(
        r"^as_root \.ci/python (\S+) (\S+) \|\| failed_legs\+=\(\1\)$", ci, re.MULTILINE
    ):
        assert version not in legs, f"Python {version} runs twice in .ci/run"
        legs[version] = test_set
    return legs


def test_ci_tests_the_versions_on_both_ends_fully_and_the_readme_names_them() -> None:
    """Every leg is a version .ci/python knows and a set it has; the oldest version runs on
    the host (everything), the newest the full set; the README's Development section names
    each version CI tests."""
    legs = _ci_legs()
    assert len(legs) >= 2
    versions = sorted(legs, key=_version_key)
    assert legs[versions[0]] == "host"
    assert legs[versions[-1]] == "full"
    script = (ROOT / ".ci" / "python").read_text()
    known = re.search(r'^case "\$VERSION" in\n(.*?)^esac$', script, re.MULTILINE | re.DOTALL)
    assert known is not None
    for version, test_set in legs.items():
        if test_set != "host":
            assert test_set in ("full", "light")
            assert re.search(
                rf"^    [\d. |]*\b{re.escape(version)}\b[\d. |]*\)", known.group(1), re.MULTILINE
            ), f".ci/python does not know Python {version}"
    readme = (ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b3\.\d+\b", development))
    assert named == set(legs), f"the README names {sorted(named)}, CI tests {versions}"


def test_the_legs_run_the_host_s_pure_python_selection() -> None:
    """.ci/python's SELECTION (what each leg runs with SMARTNSQ_PURE=1, and a light leg on
    both builds) is what .ci/run runs again with SMARTNSQ_PURE=1 on the host."""
    ci = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    host = re.findall(r"^SMARTNSQ_PURE=1 \.venv/bin/python -m pytest (.+)$", ci, re.MULTILINE)
    assert len(host) == 1
    script = (ROOT / ".ci" / "python").read_text()
    selection = re.search(r"^SELECTION=\((.*?)\)$", script, re.MULTILINE | re.DOTALL)
    assert selection is not None
    assert selection.group(1).split() == host[0].split()
