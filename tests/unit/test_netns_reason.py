"""smartnsq.testing.netns says why namespaces cannot be used, in one line, for tests to
skip on (the namespaces themselves: tests/integration/test_netns.py)."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.testing import netns


@pytest.fixture(autouse=True)
def _fresh_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "_unavailable", [])


def test_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.sys, "platform", "linux")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.netns_unavailable_reason() == "network namespaces need root"


def test_no_ip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.sys, "platform", "linux")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    assert netns.netns_unavailable_reason() == "the ip command (iproute2) is not installed"


def test_ip_netns_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.sys, "platform", "linux")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda name: "/sbin/ip")

    def refuse(*args: str, check: bool = True) -> None:
        raise netns.NetnsError("ip netns add x: Operation not permitted")

    monkeypatch.setattr(netns, "_ip", refuse)
    reason = netns.netns_unavailable_reason()
    assert reason == "ip netns does not work here: ip netns add x: Operation not permitted"
    with pytest.raises(netns.NetnsUnavailableError, match="does not work here"):
        asyncio.run(netns.Netns().start())


def test_elsewhere_than_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.sys, "platform", "darwin")
    assert netns.netns_unavailable_reason() == "network namespaces need Linux"
