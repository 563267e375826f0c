"""Every public class, method and property users reach has a docstring (issue 13:
``Consumer.stats`` had none): ``help()`` and editors are how most users read an API."""

from __future__ import annotations

import inspect

import pytest

import smartnsq
from smartnsq import sync
from smartnsq.admin import Admin
from smartnsq.testing import Cluster
from smartnsq.transport.lookup import LookupManager

CLASSES = [
    getattr(smartnsq, name)
    for name in smartnsq.__all__
    if name != "__version__" and inspect.isclass(getattr(smartnsq, name))
]
CLASSES += [sync.Producer, sync.Consumer, sync.Message, Admin, Cluster, LookupManager]
# Dunders and members inherited from Python's own classes (Exception, dataclasses...) are
# documented by Python.
INHERITED = {name for base in (Exception, object) for name in dir(base)}


def _public_members(cls: type) -> list[str]:
    names = []
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") or name in INHERITED:
            continue
        if not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        if inspect.getattr_static(cls, name, None) is None:
            continue
        names.append(name)
    return names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_public_api_is_documented(cls: type) -> None:
    assert inspect.getdoc(cls), f"{cls.__qualname__} has no docstring"
    missing = [name for name in _public_members(cls) if not inspect.getdoc(getattr(cls, name))]
    assert missing == [], f"{cls.__qualname__}: no docstring on {missing}"
