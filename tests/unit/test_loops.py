"""The loops smartnsq creates: uvloop's when installed (unless turned off), never a policy."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from smartnsq.transport import loops
from smartnsq.transport.loopthread import LoopThread

uvloop = pytest.importorskip("uvloop")


def _close(loop: asyncio.AbstractEventLoop) -> str:
    name = loops.loop_name(loop)
    loop.close()
    return name


def test_uvloop_when_installed_and_the_choice_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(loops.UVLOOP_ENV, raising=False)
    with caplog.at_level(logging.DEBUG, logger="smartnsq.loops"):
        loop = loops.new_event_loop()
    assert isinstance(loop, uvloop.Loop)
    assert _close(loop) == "uvloop"
    assert "event loop: uvloop" in caplog.text


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_the_environment_turns_uvloop_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    monkeypatch.setenv(loops.UVLOOP_ENV, value)
    with caplog.at_level(logging.DEBUG, logger="smartnsq.loops"):
        loop = loops.new_event_loop()
    assert not isinstance(loop, uvloop.Loop)
    assert _close(loop) == "asyncio"
    assert "event loop: asyncio" in caplog.text


def test_asyncio_when_uvloop_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loops.UVLOOP_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert _close(loops.new_event_loop()) == "asyncio"


def test_run_uses_the_chosen_loop_and_leaves_the_application_s_loops_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No global policy is set: after smartnsq ran its uvloop loop, the application's
    asyncio.run and asyncio.new_event_loop still make asyncio's (what a uvloop policy would
    change). Observed through those two, not the policy functions, which Python 3.14
    deprecates and 3.16 removes."""
    monkeypatch.delenv(loops.UVLOOP_ENV, raising=False)

    async def main() -> str:
        await asyncio.sleep(0)
        return loops.loop_name(asyncio.get_running_loop())

    assert loops.run(main()) == "uvloop"
    assert asyncio.run(main()) == "asyncio"
    assert _close(asyncio.new_event_loop()) == "asyncio"


def test_the_blocking_facade_and_the_spark_receiver_run_on_the_chosen_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Their loop thread (smartnsq.loopthread) is a loop smartnsq owns: uvloop's, or
    asyncio's with SMARTNSQ_UVLOOP=0."""
    for setting, expected in (("1", "uvloop"), ("0", "asyncio")):
        monkeypatch.setenv(loops.UVLOOP_ENV, setting)
        thread = LoopThread(f"test-{expected}")
        try:
            assert loops.loop_name(thread.loop) == expected
        finally:
            assert thread.stop(5.0)
