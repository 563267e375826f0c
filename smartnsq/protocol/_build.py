"""Which build of the hot functions runs: their compiled twins (``protocol/_speedups`` and
``consumer._eager_speedups``, built by ``pip install`` where a C compiler is) unless
``SMARTNSQ_PURE`` is set, else the pure-Python functions, which are the reference and run
everywhere."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["COMPILED", "PURE_ENV", "compiled", "speedups"]

PURE_ENV = "SMARTNSQ_PURE"


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``name``, or None: not built, or ``SMARTNSQ_PURE`` is set."""
    if os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


speedups = compiled("smartnsq.protocol._speedups")
COMPILED = speedups is not None
