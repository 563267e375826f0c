"""Reading a package's import graph from its source, for the floor tests: static imports
anywhere in a module, and the dynamic ones (``importlib.import_module``) static tools miss."""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["find_circle", "imports_of"]


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """The smartnsq modules ``path`` imports, static and dynamic (see the module's text)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    dynamic = False
    strings: list[str] = []
    prefixes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # a submodule named in the import is what it takes, not its package (which
                # Python loads first anyway, like for `import package.module`)
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func):
            dynamic = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                prefixes.append(first.value)
    if dynamic:
        found.update(s for s in strings if s in known)
        for prefix in prefixes:
            if prefix.startswith("smartnsq.") and prefix.endswith("."):
                found.update(m for m in known if m.startswith(prefix))
    return {name for name in found if name in known and name != module}


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module"
    )


def find_circle(graph: dict[str, set[str]]) -> list[str]:
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
