"""Every module of smartnsq stands on its floor (docs/architecture.md, the table at the top):
it imports only modules of its own floor or of the floors below, no import makes a circle,
and the embedded cluster beside the client stands on the protocol floor and the leaves only.

Imports are read from the source: every ``import`` and ``from ... import`` anywhere in a
module (inside functions and ``TYPE_CHECKING`` blocks too), and the dynamic ones, which
static tools miss: a module that calls ``importlib.import_module`` imports every smartnsq
module whose name it spells in a string, and every module of a package it spells as an
f-string prefix (``f"smartnsq.cli.{name}"``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.import_graph import find_circle, imports_of

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "smartnsq"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
BESIDE = "beside"  # the embedded cluster: its floor is below the client's, apart from it
LEAVES = "leaves"
# What the embedded cluster may import from the client's side: floor 1 and the leaves.
EMULATOR_MAY_IMPORT = {1, 0}


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def floor_table(text: str) -> dict[str, int | str]:
    """The table: file or folder (relative to smartnsq/, folders ending in /) -> floor
    number, or "beside" for the embedded cluster's folder. "leaves" is floor 0."""
    block = text.split("```", 2)[1]
    table: dict[str, int | str] = {}
    floor: int | str | None = None
    for line in block.splitlines():
        if not line.strip():
            continue
        numbered = re.match(r"\s*(\d+)\s+\S+\s+(.*)", line)  # " 4  API  producer.py ..."
        labelled = re.match(r"\s*(leaves|beside)\s+(.*)", line)  # "    leaves  errors.py ..."
        if numbered is not None:
            floor, rest = int(numbered.group(1)), numbered.group(2)
        elif labelled is not None:
            floor = 0 if labelled.group(1) == LEAVES else BESIDE
            rest = labelled.group(2)
        else:
            rest = line
        if floor is None:
            continue
        for word in rest.split():
            if word.startswith("("):
                break  # the parenthesis lists a folder's modules
            if word.endswith((".py", "/")):
                table[word] = floor
    return table


def _floor_of(module: str, table: dict[str, int | str]) -> int | str:
    relative = module.removeprefix("smartnsq").lstrip(".").replace(".", "/")
    if not relative:
        return table["__init__.py"]
    candidates = [f"{relative}.py", f"{relative}/__init__.py"]
    for candidate in candidates:
        if candidate in table:
            return table[candidate]
    inside = {floor for name, floor in table.items() if name.startswith(relative + "/")}
    if len(inside) == 1:  # a package whose modules are all on one floor: its __init__ too
        return inside.pop()
    parts = relative.split("/")
    for depth in range(len(parts), 0, -1):  # the nearest folder named in the table
        folder = "/".join(parts[:depth]) + "/"
        if folder in table:
            return table[folder]
    raise AssertionError(f"{module} is on no floor of docs/architecture.md")


def _graph() -> tuple[dict[str, set[str]], dict[str, int | str]]:
    modules = _modules()
    table = floor_table(ARCHITECTURE.read_text())
    known = set(modules)
    graph = {name: imports_of(path, name, known) for name, path in modules.items()}
    floors = {name: _floor_of(name, table) for name in modules}
    return graph, floors


def test_every_module_imports_only_its_floor_and_below() -> None:
    graph, floors = _graph()
    wrong = []
    for module, imported in sorted(graph.items()):
        floor = floors[module]
        for other in sorted(imported):
            other_floor = floors[other]
            if module.startswith(other + "."):
                continue  # the package a module belongs to is loaded before it
            if floor == BESIDE:
                ok = other_floor == BESIDE or other_floor in EMULATOR_MAY_IMPORT
            elif other_floor == BESIDE:
                ok = floor == max(f for f in floors.values() if isinstance(f, int))
            else:
                ok = isinstance(floor, int) and isinstance(other_floor, int)
                ok = ok and other_floor <= floor
            if not ok:
                wrong.append(f"{module} (floor {floor}) imports {other} (floor {other_floor})")
    assert wrong == []


def test_no_import_circle_in_the_package() -> None:
    graph, _ = _graph()
    assert find_circle(graph) == []


def test_dynamic_imports_count() -> None:
    """cli/__init__ loads its subcommands by name; they are its imports."""
    graph, _ = _graph()
    assert "smartnsq.cli.pub" in graph["smartnsq.cli"]
    assert "smartnsq.consumer.consumer" in graph["smartnsq"]  # the lazy top-level names


def test_the_circle_finder_and_the_table_reader() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_circle(graph) == ["a", "b", "c", "a"]
    assert find_circle({"p.q": {"p"}, "p": {"p.q"}}) == ["p", "p.q", "p"]  # dynamic or not
    table = floor_table("x\n```\n 2  mid   a.py  b/\n          c.py\n    leaves  e.py\n```\n")
    assert table == {"a.py": 2, "b/": 2, "c.py": 2, "e.py": 0}


@pytest.mark.parametrize("module", ["smartnsq.testing.cluster", "smartnsq.testing.nsqd"])
def test_the_embedded_cluster_stands_beside(module: str) -> None:
    _, floors = _graph()
    assert floors[module] == BESIDE
