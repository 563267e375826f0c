"""What every subcommand reports with: a user mistake (:class:`UsageError`, exit code 2) and
an error on one line. Its own module, below the subcommands and the command line that loads
them, so that no subcommand imports ``smartnsq.cli`` back."""

from __future__ import annotations

__all__ = ["UsageError", "one_line"]


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2, no traceback."""


def one_line(exc: BaseException) -> str:
    """``exc``'s text on one line (its class name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
