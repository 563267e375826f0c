"""The embedded cluster's modules import only downward (docs/architecture.md): the floor of
data and rules knows no server, the servers do not know the Cluster that owns them, and no
two modules import each other, not even for type checking."""

from __future__ import annotations

from pathlib import Path

from tests.unit.import_graph import find_circle, imports_of

TESTING = Path(__file__).resolve().parents[2] / "smartnsq" / "testing"
PACKAGE = "smartnsq.testing."

# Data and rules: no servers, no sockets.
FLOOR = (
    "errors",
    "golang",
    "state",
    "directory",
    "changes",
    "checks",
    "topology",
    "placement",
    "publish",
    "offsets",
)
SERVERS = ("http", "nsqd", "nsqd_stats", "nsqd_http", "lookupd")


def _imports() -> dict[str, set[str]]:
    """module -> the modules of smartnsq.testing it imports (anywhere in the file)."""
    modules = {f"{PACKAGE}{path.stem}": path for path in TESTING.glob("*.py")}
    known = set(modules)
    return {
        name.removeprefix(PACKAGE): {m.removeprefix(PACKAGE) for m in imports_of(path, name, known)}
        for name, path in modules.items()
    }


def test_the_emulator_has_no_importfind_circle() -> None:
    assert find_circle(_imports()) == []


def test_the_circle_finder_finds_one() -> None:
    graph = {"cluster": {"nsqd"}, "nsqd": {"state", "cluster"}, "state": set()}
    assert find_circle(graph) == ["cluster", "nsqd", "cluster"]


def test_the_floor_knows_no_server() -> None:
    graph = _imports()
    for module in FLOOR:
        above = graph[module] & {*SERVERS, "cluster"}
        assert not above, f"{module}.py imports {sorted(above)}"


def test_no_server_knows_the_cluster() -> None:
    graph = _imports()
    for module in SERVERS:
        assert "cluster" not in graph[module], f"{module}.py imports cluster.py"
