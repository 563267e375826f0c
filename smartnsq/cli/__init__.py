"""The ``smartnsq`` command line: one module per subcommand, each with ``register()``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

__all__ = ["UsageError", "main"]

# Subcommand modules of smartnsq.cli; each defines register(subparsers) -> None and sets
# `func` (args -> exit code) on its parser.
SUBCOMMANDS = ("cluster",)


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="smartnsq", description="Smart NSQ client tools (youzan HA and classic nsqd)."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"smartnsq.cli.{name}")
        except ModuleNotFoundError as exc:
            # LOCAL WORKAROUND (cli branch; drop at merge): smartnsq.cli.cluster is written on
            # another branch. Only the subcommand module itself may be missing.
            if exc.name != f"smartnsq.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        print(f"smartnsq {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
