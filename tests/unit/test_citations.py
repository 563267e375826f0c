"""The code and the docs cite only what a reader of the repository can reach: the real
servers' source (repository, file, function, release) or the project's own pages
(docs/protocol.md for what is known from running the servers). Notes kept outside the
repository (a protocol write-up, recorded sessions) are dead links in a clone."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Folders held to the rule: the whole package and its docs.
CHECKED = ("smartnsq", "docs", "README.md", "tests", "bench", "compat", ".ci")
UNREACHABLE = ("PROTOCOL.md", "../shared", "captures/", "/work/")


def _files() -> list[Path]:
    return sorted(
        path
        for folder in CHECKED
        for path in [ROOT / folder, *(ROOT / folder).rglob("*")]
        if (path.suffix in (".py", ".pyx", ".md") or path.name == "run")
        and path.is_file()
        and not any(part.startswith(".") and part != ".ci" for part in path.parts)
    )


def _mentions(path: Path) -> list[str]:
    if path == Path(__file__).resolve():
        return []  # this test names what it looks for
    lines = path.read_text(encoding="utf-8").splitlines()
    relative = path.relative_to(ROOT).as_posix()
    return [
        f"{relative}:{number}: {line.strip()}"
        for number, line in enumerate(lines, 1)
        if any(name in line for name in UNREACHABLE)
    ]


def test_the_checked_folders_have_files() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _files()}
    assert "smartnsq/testing/topology.py" in names
    assert "smartnsq/protocol/commands.py" in names
    assert "docs/protocol.md" in names


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_citation_of_notes_outside_the_repository(path: Path) -> None:
    assert _mentions(path) == []
