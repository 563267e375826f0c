"""Pure pieces of the command line: progress throttling, argument plumbing. The commands
themselves are tested as subprocesses in tests/integration/test_cli.py."""

from __future__ import annotations

import io

import pytest

from smartnsq.cli import _positionals, main
from smartnsq.cli._common import Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_throttled_and_cleared() -> None:
    stream = io.StringIO()
    clock = FakeClock()
    progress = Progress(stream, enabled=True, interval=1.0, clock=clock)
    calls: list[int] = []

    def text() -> str:
        calls.append(1)
        return f"done {len(calls)}"

    progress.update(text)  # too early: the first line comes after one interval
    clock.now += 1.0
    progress.update(text)
    clock.now += 0.5
    progress.update(text)
    clock.now += 0.6
    progress.update(text)
    progress.clear()
    progress.clear()
    assert stream.getvalue() == "\rdone 1\x1b[K\rdone 2\x1b[K\r\x1b[K"
    assert len(calls) == 2  # the text is only built when shown


def test_progress_is_silent_off_a_terminal() -> None:
    stream = io.StringIO()  # isatty() is False
    clock = FakeClock()
    progress = Progress(stream, clock=clock)
    clock.now += 10
    progress.update(lambda: "x")
    progress.clear()
    assert not progress.enabled
    assert stream.getvalue() == ""


def test_extra_positionals() -> None:
    assert _positionals(["a", "b"]) == ["a", "b"]
    assert _positionals(["a", "--", "-b", "--"]) == ["a", "-b", "--"]
    assert _positionals(["-"]) == ["-"]
    assert _positionals(["a", "--bogus"]) is None


def test_unknown_option_after_bodies_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pub", "t", "--nsqd", "h:1", "a", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "smartnsq pub: error: unrecognized arguments: a --bogus (see 'smartnsq pub --help')\n"
    )
