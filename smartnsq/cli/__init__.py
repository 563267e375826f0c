"""The ``smartnsq`` command line: one module per subcommand, each with ``register()``.

Exit codes: 0 success; 1 failure (nothing listening, a publish that failed, a demo that
found lost or out-of-order messages); 2 a user mistake (bad arguments, addresses or names),
always reported as one line on stderr without a traceback; 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from smartnsq._version import __version__
from smartnsq.cli.usage import UsageError, one_line
from smartnsq.errors import NSQError, UnsupportedFeatureError, ValidationError

__all__ = ["UsageError", "main"]

# Subcommand modules of smartnsq.cli; each defines register(subparsers) -> None and sets
# `func` (args -> exit code) on its parser.
SUBCOMMANDS = ("pub", "tail", "lookup", "topic", "channel", "cluster", "demo")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (it prints the whole usage otherwise)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="smartnsq", description="Smart NSQ client tools (youzan HA and classic nsqd)."
    )
    parser.add_argument("--version", action="version", version=f"smartnsq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"smartnsq.cli.{name}")
        module.register(subparsers)
    return parser


def _options(extras: list[str]) -> list[str]:
    """The options among ``extras``: what starts with "-" (but "-" itself) before a "--"."""
    options: list[str] = []
    for extra in extras:
        if extra == "--":
            break
        if extra.startswith("-") and extra != "-":
            options.append(extra)
    return options


def _positionals(extras: list[str]) -> list[str] | None:
    """``extras`` as positional arguments (``--`` ends options), or None if one is an option."""
    if _options(extras):
        return None
    values = list(extras)
    if "--" in values:
        values.remove("--")  # the first one, which ended the options
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    # argparse fills a nargs="*" positional from one stretch of arguments only: in
    # `pub TOPIC --lookupd URL BODY...` the bodies come back as unknown. A subcommand that
    # names its list in `more_positionals` gets them (unknown options are still errors).
    if extras:
        more: str | None = getattr(args, "more_positionals", None)
        positionals = _positionals(extras) if more is not None else None
        if more is None or positionals is None:
            # Where the subcommand takes more positionals, only the options are unknown: so
            # on every Python (3.13's argparse already gives the subcommand positionals that
            # come before an unknown option, 3.11's leaves them in extras).
            unknown = extras if more is None else _options(extras)
            print(
                f"smartnsq {args.command}: error: unrecognized arguments: {' '.join(unknown)} "
                f"(see 'smartnsq {args.command} --help')",
                file=sys.stderr,
            )
            return 2
        getattr(args, more).extend(positionals)
    func: Callable[[argparse.Namespace], int] = args.func
    prefix = f"smartnsq {args.command}: error:"
    try:
        return func(args)
    except UsageError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return 2
    except (ValidationError, UnsupportedFeatureError) as exc:
        # The client refused an argument before sending anything: the user's to fix.
        print(f"{prefix} {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        from smartnsq.cli._common import silence_stdout

        silence_stdout()
        return 1
    except (TimeoutError, NSQError, OSError) as exc:
        print(f"{prefix} {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
