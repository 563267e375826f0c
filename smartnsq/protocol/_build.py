"""Which build of the protocol floor's hot functions runs: the compiled twins in
``_speedups`` (built by ``pip install`` where a C compiler is) unless ``SMARTNSQ_PURE`` is
set, else the pure-Python functions, which are the reference and run everywhere."""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["COMPILED", "PURE_ENV", "speedups"]

PURE_ENV = "SMARTNSQ_PURE"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return None
    try:
        from smartnsq.protocol import _speedups
    except ImportError:
        return None
    return _speedups


speedups = _load()
COMPILED = speedups is not None
