"""What the subcommands share: connection options, argument checks, logging and progress."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TextIO

from smartnsq.admin import Admin
from smartnsq.cli.usage import UsageError
from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import check_channel, check_topic
from smartnsq.routing.addresses import AddressMap
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.targets import check_nsqd_address

__all__ = [
    "ENV_ADDRESS_MAP",
    "ENV_LOOKUPD",
    "ENV_NSQD",
    "Progress",
    "Target",
    "add_admin_options",
    "add_connection_options",
    "add_verbosity",
    "admin_for",
    "channel_arg",
    "dash",
    "muted_logs",
    "plural",
    "resolve_target",
    "setup_logging",
    "silence_stdout",
    "table",
    "topic_arg",
]

ENV_LOOKUPD = "SMARTNSQ_LOOKUPD"
ENV_ADDRESS_MAP = "SMARTNSQ_ADDRESS_MAP"
ENV_NSQD = "SMARTNSQ_NSQD"


@dataclass(frozen=True)
class Target:
    """Where to connect: exactly one of ``lookupd`` (HTTP addresses) or ``nsqd`` (TCP)."""

    lookupd: list[str] | None = None
    nsqd: list[str] | None = None
    # announced nsqd/nsqlookupd "host:port" -> the "host:port" to connect to (lookupd only)
    address_map: dict[str, str] | None = None

    @property
    def description(self) -> str:
        if self.lookupd is not None:
            return "nsqlookupd " + ", ".join(self.lookupd)
        return "nsqd " + ", ".join(self.nsqd or ())


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "connection",
        # Kept short by hand: the raw help formatters do not wrap it.
        f"--lookupd or --nsqd, not both; default: ${ENV_LOOKUPD} or ${ENV_NSQD}\n"
        "(comma-separated addresses)",
    )
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--lookupd",
        action="append",
        metavar="URL",
        help="nsqlookupd HTTP address (http://host:4161 or host:port); repeatable",
    )
    exclusive.add_argument(
        "--nsqd",
        action="append",
        metavar="HOST:PORT",
        help="nsqd TCP address (classic nsqd, without lookupd); repeatable",
    )
    group.add_argument(
        "--address-map",
        action="append",
        metavar="FROM=TO",
        help=(
            "connect to TO (host:port) where nsqlookupd announces FROM (host:port), e.g. a "
            f"node in Docker; repeatable; default: ${ENV_ADDRESS_MAP} (comma-separated)"
        ),
    )


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "connection", f"--lookupd or --nsqd-http, not both; default: ${ENV_LOOKUPD}"
    )
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--lookupd",
        action="append",
        metavar="URL",
        help="nsqlookupd HTTP address (http://host:4161 or host:port); repeatable",
    )
    exclusive.add_argument(
        "--nsqd-http",
        action="append",
        metavar="HOST:PORT",
        help="classic nsqd HTTP address (without lookupd); repeatable",
    )


def admin_for(args: argparse.Namespace) -> Admin:
    """An :class:`Admin` for the --lookupd/--nsqd-http addresses (or $SMARTNSQ_LOOKUPD)."""
    lookupd: list[str] | None = args.lookupd
    nsqd_http: list[str] | None = args.nsqd_http
    if lookupd is None and nsqd_http is None:
        lookupd = _split(os.environ.get(ENV_LOOKUPD, "")) or None
        if lookupd is None:
            raise UsageError(f"give --lookupd URL or --nsqd-http HOST:PORT (or set ${ENV_LOOKUPD})")
    try:
        return Admin(lookupd, nsqd_http=nsqd_http)
    except ValidationError as exc:
        raise UsageError(f"invalid address: {exc.reason}") from None


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more of the client's log (-v: info, -vv: debug; default: warnings)",
    )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def resolve_target(args: argparse.Namespace) -> Target:
    """The --lookupd/--nsqd addresses, else the environment's; every address checked."""
    lookupd: list[str] | None = args.lookupd
    nsqd: list[str] | None = args.nsqd
    if lookupd is None and nsqd is None:
        env_lookupd = _split(os.environ.get(ENV_LOOKUPD, ""))
        env_nsqd = _split(os.environ.get(ENV_NSQD, ""))
        if env_lookupd and env_nsqd:
            raise UsageError(
                f"both ${ENV_LOOKUPD} and ${ENV_NSQD} are set; choose with --lookupd or --nsqd"
            )
        if not env_lookupd and not env_nsqd:
            raise UsageError(f"give --lookupd URL or --nsqd HOST:PORT (or set ${ENV_LOOKUPD})")
        lookupd, nsqd = env_lookupd or None, env_nsqd or None
    address_map = _address_map(args)
    if lookupd is not None:
        for address in lookupd:
            try:
                # The lookup manager's own seed check, so the CLI accepts exactly what it does.
                LookupManager([address])
            except ValidationError as exc:
                raise UsageError(f"invalid nsqlookupd address: {exc.reason}") from None
        return Target(lookupd=list(lookupd), address_map=address_map)
    if address_map is not None:
        raise UsageError("--address-map maps what nsqlookupd announces: it needs --lookupd")
    addresses = list(nsqd or ())
    for address in addresses:
        try:
            check_nsqd_address(address)
        except ValidationError as exc:
            raise UsageError(f"invalid nsqd address: {exc.reason}") from None
    return Target(nsqd=addresses)


def _address_map(args: argparse.Namespace) -> dict[str, str] | None:
    """``--address-map FROM=TO`` (repeatable), else ``$SMARTNSQ_ADDRESS_MAP``, checked."""
    given: list[str] | None = getattr(args, "address_map", None)
    option = "--address-map"
    if given is None:
        given = _split(os.environ.get(ENV_ADDRESS_MAP, "")) or None
        option = f"${ENV_ADDRESS_MAP}"
    if given is None:
        return None
    mapping: dict[str, str] = {}
    for item in given:
        source, sep, target = item.partition("=")
        if not sep:
            raise UsageError(f"{option} {item!r}: expected FROM=TO (host:port=host:port)")
        mapping[source.strip()] = target.strip()
    try:
        AddressMap(mapping)
    except ValidationError as exc:
        raise UsageError(f"{option}: {exc.reason}") from None
    return mapping


def topic_arg(topic: str) -> str:
    try:
        return check_topic(topic)
    except ValidationError as exc:
        raise UsageError(f"invalid topic name: {exc.reason}") from None


def channel_arg(channel: str) -> str:
    try:
        return check_channel(channel)
    except ValidationError as exc:
        raise UsageError(f"invalid channel name: {exc.reason}") from None


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def dash(value: object) -> str:
    """``value`` as text, ``-`` for None."""
    return "-" if value is None else str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns two spaces apart, each line indented and without trailing blanks."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for row in (header, *rows):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


# --------------------------------------------------------------------------- logging


class _Formatter(logging.Formatter):
    def __init__(self, command: str) -> None:
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        return f"smartnsq {self.command}: {record.levelname.lower()}: {record.getMessage()}"


def setup_logging(command: str, verbose: int = 0) -> None:
    """The client's log on stderr, one line per record: warnings by default, -v for info."""
    logger = logging.getLogger("smartnsq")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(command))
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(
        logging.DEBUG if verbose >= 2 else logging.INFO if verbose == 1 else logging.WARNING
    )
    # The message trace log is for the demo and for applications, not for the tools' stderr.
    logging.getLogger("smartnsq.trace").setLevel(logging.WARNING)


@contextlib.contextmanager
def muted_logs(verbose: int = 0) -> Iterator[None]:
    """While connecting, the command reports a failure itself in one line: the client's
    warnings about the same failure would only repeat it (shown with -v)."""
    logger = logging.getLogger("smartnsq")
    if verbose:
        yield
        return
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def silence_stdout() -> None:
    """The reader of stdout went away (``| head``): point stdout at /dev/null so the final
    flush at exit does not fail again with a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


# --------------------------------------------------------------------------- progress


class Progress:
    """A progress line on stderr, rewritten at most once per ``interval`` when stderr is a
    terminal; nothing otherwise (logs and pipes get the caller's one summary line)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty is not None and isatty())
        self.enabled = enabled
        self.interval = interval
        self.clock = clock
        self._next = clock() + interval
        self._shown = False

    def update(self, text: Callable[[], str]) -> None:
        """Show ``text()`` if the interval has passed (``text`` is only called then)."""
        if not self.enabled:
            return
        now = self.clock()
        if now < self._next:
            return
        self._next = now + self.interval
        self.stream.write(f"\r{text()}\x1b[K")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False
