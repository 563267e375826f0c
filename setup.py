"""Builds smartnsq's compiled hot path (``smartnsq/protocol/_speedups.pyx``,
``smartnsq/consumer/_eager_speedups.pyx``) where it can.

Everything else is in pyproject.toml. Without a C compiler (or with ``SMARTNSQ_PURE_BUILD=1``)
the extension is skipped with a warning and the install goes on: the pure-Python modules are
the reference and run everywhere (``smartnsq.protocol._build`` picks what was built).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SPEEDUPS = [
    Extension("smartnsq.protocol._speedups", ["smartnsq/protocol/_speedups.pyx"]),
    Extension("smartnsq.consumer._eager_speedups", ["smartnsq/consumer/_eager_speedups.pyx"]),
]


class OptionalBuildExt(build_ext):
    """build_ext that skips what cannot be compiled instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - no compiler: the pure modules run instead
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - a failed compile: the pure modules run
            self._skipped(exc)

    @staticmethod
    def _skipped(exc: BaseException) -> None:
        print(
            f"smartnsq: the compiled hot path was not built ({exc}); the pure-Python modules "
            "run instead",
            file=sys.stderr,
        )


def extensions() -> list[Extension]:
    if os.environ.get("SMARTNSQ_PURE_BUILD", "").strip().lower() not in ("", "0", "false", "no"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("smartnsq: Cython is missing; the pure-Python modules run", file=sys.stderr)
        return []
    return list(cythonize(SPEEDUPS, quiet=True))


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
