"""The embedded cluster's modules import only downward (docs/architecture.md): the floor of
data and rules knows no server, the servers do not know the Cluster that owns them, and no
two modules import each other, not even for type checking."""

from __future__ import annotations

import ast
from pathlib import Path

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
    "publish",
    "offsets",
)
SERVERS = ("http", "nsqd", "nsqd_stats", "nsqd_http", "lookupd")


def _imports() -> dict[str, set[str]]:
    """module -> the modules of smartnsq.testing it imports (anywhere in the file)."""
    graph: dict[str, set[str]] = {}
    for path in TESTING.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found.update(n.removeprefix(PACKAGE) for n in names if n.startswith(PACKAGE))
        graph[path.stem] = found
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of the graph ([] if it has none)."""
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> list[str]:
        if module in trail:
            return [*trail[trail.index(module) :], module]
        if module in done:
            return []
        for imported in sorted(graph.get(module, ())):
            circle = visit(imported, [*trail, module])
            if circle:
                return circle
        done.add(module)
        return []

    for module in sorted(graph):
        circle = visit(module, [])
        if circle:
            return circle
    return []


def test_the_emulator_has_no_import_circle() -> None:
    assert _circle(_imports()) == []


def test_the_circle_finder_finds_one() -> None:
    graph = {"cluster": {"nsqd"}, "nsqd": {"state", "cluster"}, "state": set()}
    assert _circle(graph) == ["cluster", "nsqd", "cluster"]


def test_the_floor_knows_no_server() -> None:
    graph = _imports()
    for module in FLOOR:
        above = graph[module] & {*SERVERS, "cluster"}
        assert not above, f"{module}.py imports {sorted(above)}"


def test_no_server_knows_the_cluster() -> None:
    graph = _imports()
    for module in SERVERS:
        assert "cluster" not in graph[module], f"{module}.py imports cluster.py"
