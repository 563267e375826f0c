"""``smartnsq pub``: publish the arguments, or one message per stdin line."""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from smartnsq.cli._common import (
    Progress,
    Target,
    add_connection_options,
    add_verbosity,
    dash,
    muted_logs,
    plural,
    resolve_target,
    setup_logging,
    topic_arg,
)
from smartnsq.cli.usage import UsageError, one_line
from smartnsq.errors import NSQError, UnsupportedFeatureError, ValidationError
from smartnsq.producer.producer import DEFAULT_PUBLISH_TIMEOUT, Producer
from smartnsq.publishing.result import PublishResult
from smartnsq.routing.sharding import INT64_MAX, INT64_MIN, Sharder
from smartnsq.transport import loops

__all__ = ["parse_sharding_key", "register"]

DEFAULT_BATCH = 500
# Far below nsqd's MPUB limit (5 MiB by default): a batch is one request to one partition.
MAX_BATCH_BYTES = 1024 * 1024
_READ_SIZE = 1 << 16
# How far stdin is read ahead of the publishes (while a batch is on its way), in bytes.
_READ_AHEAD = 8 * 1024 * 1024
EXIT_INTERRUPTED = 130

# The canonical decimal form of an integer: what str(int) gives, ASCII digits only.
_CANONICAL_INT = re.compile(r"-?(?:0|[1-9][0-9]*)\Z")
_DECIMAL_INT = re.compile(r"[+-]?[0-9]+\Z")

DESCRIPTION = """\
Publish messages to TOPIC: each BODY argument is one message; without BODY arguments, each
line of stdin is one message (the trailing newline removed), published as it arrives. An
empty line is an error (NSQ messages cannot be empty) unless --skip-empty. Stdin lines are
sent in batches (MPUB); with --partition or --sharding-key every batch goes to that one
partition, in input order.

A sharding KEY that is an integer written the plain way (ASCII digits, an optional minus
sign, no leading zeros) within the signed 64-bit range is an integer key, as an int
sharding_key of the Python API or a Long key of the Java SDK; any other KEY is a string
key. --key-type str or int decides instead: "42" and 42 may land on different partitions.
--sharding chooses the rule: java (default, the youzan Java SDK's, also the Python API's
default) or murmur3 (youzan go-nsq's).

Prints a summary line on stderr at the end (progress once a second when stderr is a
terminal). With --trace, stdout gets one line per message: partition, internal id, trace
id, queue offset and size, from nsqd's trace receipts (youzan nsqd only).

Exit codes: 0 everything published; 1 a publish failed (the error says how many messages
were published before it); 2 a usage mistake, or a stdin line that cannot be a message
(empty, or over the 1 MiB message size); 130 interrupted. Ctrl-C or SIGTERM stops reading
stdin, publishes the lines already read and exits 130; a second Ctrl-C or SIGTERM exits at
once, saying how many lines read were not published.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pub",
        help="publish messages (arguments, or one per stdin line)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic", metavar="TOPIC")
    # default=[]: argparse lists a nargs="*" positional without a default as required.
    parser.add_argument(
        "bodies",
        nargs="*",
        default=[],
        metavar="BODY",
        help="message bodies (none: one message per stdin line)",
    )
    add_connection_options(parser)
    routing = parser.add_mutually_exclusive_group()
    routing.add_argument("--partition", type=int, metavar="N", help="publish to partition N")
    routing.add_argument(
        "--sharding-key",
        metavar="KEY",
        help="route by KEY: every message to KEY's partition, in order",
    )
    parser.add_argument(
        "--key-type",
        choices=("auto", "int", "str"),
        help="hash KEY as an integer (int: a Java Long) or a string (str); auto (default): "
        "an integer if KEY is a plain decimal integer within 64 bits, else a string",
    )
    parser.add_argument(
        "--sharding",
        choices=("java", "murmur3"),
        help="how KEY picks a partition: java (default, as the Java SDK and the Python API) "
        "or murmur3 (as youzan go-nsq)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="traced publishes; print each message's trace receipt on stdout",
    )
    parser.add_argument(
        "--ext",
        action="append",
        metavar="KEY=VALUE",
        help="an ext header field for every message (ext topics); repeatable",
    )
    parser.add_argument(
        "--skip-empty",
        action="store_true",
        help="skip empty stdin lines (default: an empty line is an error)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"at most N stdin lines per MPUB (default {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_PUBLISH_TIMEOUT,
        metavar="SECONDS",
        help=(
            "give up on a message after this long, retries included (default "
            f"{DEFAULT_PUBLISH_TIMEOUT:g}, the API's: it outlasts a real failover)"
        ),
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    add_verbosity(parser)
    parser.set_defaults(func=run, more_positionals="bodies")


def parse_sharding_key(text: str, key_type: str = "auto") -> int | str:
    """The sharding key that ``--sharding-key TEXT --key-type KEY_TYPE`` stands for, as the
    Python API takes it (``Producer.publish(..., sharding_key=...)``).

    ``"auto"``: ``int`` when ``text`` is an integer in canonical decimal form (what ``str()``
    of an int gives: ASCII digits, an optional ``-``, no leading zeros, not ``-0``) within
    the signed 64-bit range, else ``str``; for murmur3 sharding the two hash the same bytes.
    ``"int"``: any decimal integer (sign and leading zeros allowed); ``"str"``: ``text``.
    Raises :class:`UsageError`.
    """
    if key_type == "str":
        return text
    if key_type == "int":
        if not _DECIMAL_INT.match(text):
            raise UsageError(f"--sharding-key {text!r} is not an integer (--key-type int)")
        return int(text, 10)
    if key_type != "auto":
        raise UsageError(f"--key-type must be auto, int or str, not {key_type!r}")
    if _CANONICAL_INT.match(text) and text != "-0":
        value = int(text, 10)
        if INT64_MIN <= value <= INT64_MAX:
            return value
    return text


def _sharding_key(args: argparse.Namespace) -> int | str | None:
    if args.sharding_key is None:
        for option, value in (("--key-type", args.key_type), ("--sharding", args.sharding)):
            if value is not None:
                raise UsageError(f"{option} needs --sharding-key")
        return None
    key = parse_sharding_key(args.sharding_key, args.key_type or "auto")
    try:
        Sharder(args.sharding or "java").partition_for(key, 1)  # the API's own key check
    except ValidationError as exc:
        raise UsageError(f"--sharding-key {args.sharding_key!r}: {exc.reason}") from None
    return key


def _ext(values: Sequence[str] | None) -> dict[str, str] | None:
    if not values:
        return None
    ext: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--ext {item!r}: expected KEY=VALUE")
        ext[key] = value
    return ext


def run(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    target = resolve_target(args)
    key = _sharding_key(args)
    ext = _ext(args.ext)
    if args.partition is not None and args.partition < 0:
        raise UsageError(f"--partition must be >= 0, not {args.partition}")
    if args.trace and ext is not None:
        raise UsageError("--trace and --ext cannot be combined (a batch carries one or the other)")
    if args.batch_size < 1:
        raise UsageError("--batch-size must be >= 1")
    if not args.timeout > 0:
        raise UsageError("--timeout must be > 0 seconds")
    # os.fsencode gives back the argument's original bytes, whatever the locale.
    bodies = [os.fsencode(body) for body in args.bodies]
    for number, body in enumerate(bodies, 1):
        if not body:
            raise UsageError(f"BODY argument {number} is empty: NSQ messages cannot be empty")
    if not bodies and sys.stdin is None:
        raise UsageError("no BODY arguments, and stdin is closed")
    setup_logging("pub", args.verbose)
    publisher = _Publisher(args, topic, target, key, ext)
    return loops.run(publisher.main(bodies or None))


class _LineTooLongError(Exception):
    """A stdin line (complete or not) is over the maximum message size."""


class _StdinLines:
    """The lines of a file descriptor, read by the event loop as they arrive.

    No thread: a thread blocked in ``read()`` on a pipe that stays open (``tail -f log |
    smartnsq pub``) would still hold stdin's lock when the command ends, and the interpreter
    aborts at shutdown (SIGABRT). Pipes, sockets and terminals are watched with
    ``add_reader`` and read once per readiness, so the read never blocks (the descriptor
    stays in blocking mode: it may be shared with a shell). Files the selector refuses
    (regular files, /dev/null) are read directly: reading them does not wait for a writer.
    At most ``_READ_AHEAD`` bytes are read ahead of the consumer.
    """

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop, max_line: int) -> None:
        self.fd = fd
        self.loop = loop
        self.max_line = max_line
        self.taken = 0  # lines handed out
        self._lines: deque[bytes] = deque()
        self._buffered = 0  # bytes in _lines
        self._rest = b""  # the start of a line whose newline has not come yet
        self._ended = False  # no more lines will come (end of input, stop() or an error)
        self._error: BaseException | None = None  # raised once the lines before it are out
        self._watching = False
        self._direct = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def read_lines(self) -> int:
        """Lines read so far: handed out, waiting, and an incomplete last one."""
        return self.taken + len(self._lines) + (1 if self.partial else 0)

    @property
    def partial(self) -> int:
        """Bytes of a last line left without its newline by :meth:`stop`."""
        return len(self._rest) if self._ended else 0

    def start(self) -> None:
        try:
            self.loop.add_reader(self.fd, self._read_once)
        except (OSError, ValueError):
            self._direct = True  # epoll refuses regular files and /dev/null (EPERM)
        else:
            self._watching = True

    def stop(self) -> None:
        """Read no more: the complete lines read so far are still handed out; an incomplete
        last line is not (its end is still with the writer), see :attr:`partial`."""
        if not self._ended:
            self._end(None)

    def close(self) -> None:
        self._unwatch()
        self._ended = True

    @property
    def reading(self) -> bool:
        """More lines may still come."""
        return not self._ended

    def buffered(self) -> bool:
        """Lines are waiting to be taken."""
        return bool(self._lines)

    async def take(self) -> list[bytes] | None:
        """Every line read so far, waiting for at least one; None at the end of input."""
        while not self._lines:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if self._ended:
                return None
            if self._direct:
                self._read_once()
                continue
            if not self._watching:
                self._watch()
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        lines = list(self._lines)
        self._lines.clear()
        self._buffered = 0
        self.taken += len(lines)
        if not self._watching and not self._ended and not self._direct:
            self._watch()  # read-ahead space again
        return lines

    def _read_once(self) -> None:
        try:
            data = os.read(self.fd, _READ_SIZE)
        except BlockingIOError:
            # A non-blocking descriptor (a terminal shared with a program that set it so)
            # with nothing there: wait for the next readiness. Direct reads cannot wait.
            if self._direct:
                self._end(OSError(errno.EAGAIN, "cannot read stdin: nothing to read yet"))
            return
        except OSError as exc:
            self._end(OSError(exc.errno, f"cannot read stdin: {exc.strerror}"))
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        if self._ended:
            return
        if not data:
            if self._rest:  # a last line without a newline is a message too
                self._lines.append(self._rest)
                self._rest = b""
            self._end(None)
            return
        lines = (self._rest + data).split(b"\n") if self._rest else data.split(b"\n")
        self._rest = lines.pop()
        if max(map(len, lines), default=0) > self.max_line:
            # Keep the lines before the first one too long; the error comes after them.
            del lines[next(i for i, line in enumerate(lines) if len(line) > self.max_line) :]
            self._rest = b""
            self._end(_LineTooLongError())
        elif len(self._rest) > self.max_line:
            self._rest = b""
            self._end(_LineTooLongError())
        if lines:
            self._lines.extend(lines)
            self._buffered += sum(map(len, lines))
            if self._buffered >= _READ_AHEAD:
                self._unwatch()
        self._wake()

    def _end(self, error: BaseException | None) -> None:
        self._ended = True
        self._error = error
        self._unwatch()
        self._wake()

    def _watch(self) -> None:
        self.loop.add_reader(self.fd, self._read_once)
        self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self.loop.remove_reader(self.fd)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Publisher:
    def __init__(
        self,
        args: argparse.Namespace,
        topic: str,
        target: Target,
        key: int | str | None,
        ext: dict[str, str] | None,
    ) -> None:
        self.args = args
        self.topic = topic
        self.target = target
        self.key = key
        self.ext = ext
        self.published = 0
        self.skipped = 0  # empty stdin lines skipped (--skip-empty)
        self.lines_done = 0  # stdin lines published or skipped
        self.sending = 0  # messages of the publish being awaited
        self.total: int | None = None  # BODY arguments
        self.reader: _StdinLines | None = None
        self.interrupted = False  # a signal stopped the reading of stdin
        self.cut_short = False  # a signal stopped the command at once
        self.no_receipt = False
        # classic nsqd has no partitions: the sharding key picked this nsqd (told at the end)
        self.key_nsqd: set[str] = set()
        self.progress = Progress()
        self.started = 0.0

    async def main(self, bodies: list[bytes] | None) -> int:
        """Publish, and say how it went. Ctrl-C or SIGTERM while stdin is being read stops
        reading it (the lines read are still published); otherwise it stops at once."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_signal() -> None:
            reader = self.reader
            if not self.interrupted and reader is not None and reader.reading:
                self.interrupted = True
                reader.stop()
            elif task is not None:
                self.cut_short = True
                task.cancel()

        signals = (signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            loop.add_signal_handler(signum, on_signal)
        try:
            code = await self._publish(bodies)
        except asyncio.CancelledError:
            if not self.cut_short:
                raise
            self._report_cut_short()
            return EXIT_INTERRUPTED
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
        return code

    async def _publish(self, bodies: list[bytes] | None) -> int:
        args = self.args
        # The summary times the whole publish: finding the partitions and connecting (which
        # a short publish spends most of its time on) up to the producer's close.
        self.started = time.perf_counter()
        producer = Producer(
            lookupd=self.target.lookupd,
            nsqd=self.target.nsqd,
            address_map=self.target.address_map,
            trace=args.trace,
            publish_timeout=args.timeout,
            sharding=args.sharding or "java",
        )
        try:
            with muted_logs(args.verbose):
                await producer.start()
            try:
                if bodies is not None:
                    self.total = len(bodies)
                    await self._send_all(producer, deque(bodies), lambda: False)
                else:
                    await self._pump_stdin(producer)
            except NSQError as exc:
                if not self.published:
                    raise
                # Say how far it got, still in one line.
                done = f"{plural(self.published, 'message')} published before it"
                if bodies is None:
                    done += f", through stdin line {self.lines_done}"
                if isinstance(exc, (ValidationError, UnsupportedFeatureError)):
                    raise UsageError(f"{one_line(exc)} ({done})") from exc
                raise NSQError(f"{one_line(exc)} ({done})") from exc
        finally:
            self.progress.clear()
            if self.reader is not None:
                self.reader.close()
            await producer.close()
        self._report()
        return EXIT_INTERRUPTED if self.interrupted else 0

    def _report(self) -> None:
        args = self.args
        elapsed = max(time.perf_counter() - self.started, 1e-6)
        if self.no_receipt:
            print(
                "smartnsq pub: note: nsqd sent no trace receipts (classic nsqd cannot trace)",
                file=sys.stderr,
            )
        if self.key_nsqd:
            print(
                "smartnsq pub: note: classic nsqd has no partitions: --sharding-key chose the "
                f"nsqd ({', '.join(sorted(self.key_nsqd))}), the same one for the same key, as "
                "the Python API does; it orders nothing by itself",
                file=sys.stderr,
            )
        if not args.quiet:
            skipped = f", {plural(self.skipped, 'empty line')} skipped" if self.skipped else ""
            print(
                f"published {plural(self.published, 'message')} to {self.topic} in "
                f"{elapsed:.2f} s ({self.published / elapsed:.0f} msg/s){skipped}",
                file=sys.stderr,
            )
        if self.interrupted:
            note = f"stopped reading stdin after line {self.lines_done}"
            partial = self.reader.partial if self.reader is not None else 0
            if partial:
                note += (
                    "; the next line had no newline yet and was not published "
                    f"({plural(partial, 'byte')} read)"
                )
            print(f"smartnsq pub: interrupted: {note}", file=sys.stderr)

    def _report_cut_short(self) -> None:
        """Stopped at once by a signal: what was published and what was not."""
        done = plural(self.published, "message")
        if self.total is not None:
            done = f"{self.published} of {plural(self.total, 'message')}"
        text = f"{done} published"
        reader = self.reader
        if reader is not None:
            unpublished = reader.read_lines - self.published - self.skipped
            if unpublished:
                text += f"; {plural(unpublished, 'line')} read from stdin not published"
        if self.sending:
            text += f" (the last {self.sending} sent may have arrived)"
        print(f"smartnsq pub: interrupted: {text}", file=sys.stderr)

    async def _pump_stdin(self, producer: Producer) -> None:
        stdin = sys.stdin
        if stdin is None:  # checked in run() already
            raise UsageError("no BODY arguments, and stdin is closed")
        fd = stdin.fileno()
        if os.isatty(fd) and not self.args.quiet:
            print(
                "smartnsq pub: reading messages from stdin, one per line (Ctrl-D to end)",
                file=sys.stderr,
            )
        reader = _StdinLines(fd, asyncio.get_running_loop(), producer.options.max_msg_size)
        self.reader = reader
        reader.start()
        pending: deque[bytes] = deque()
        while True:
            try:
                lines = await reader.take()
            except _LineTooLongError:
                # The lines before it first, then the error.
                await self._send_all(producer, pending, lambda: False)
                raise UsageError(
                    f"stdin line {self.lines_done + 1} is over the maximum message size of "
                    f"{producer.options.max_msg_size} bytes "
                    f"({plural(self.published, 'message')} published before it)"
                ) from None
            if lines is None:
                await self._send_all(producer, pending, lambda: False)
                return
            pending.extend(lines)
            # Full batches go now; the rest too unless more lines are already waiting to
            # join it (a slow writer, tail -f | ..., gets each line sent as it comes).
            await self._send_all(producer, pending, reader.buffered)

    async def _send_all(
        self, producer: Producer, pending: deque[bytes], more_waiting: Callable[[], bool]
    ) -> None:
        """Send full batches, and the rest too unless ``more_waiting()``."""
        limit = self.args.batch_size
        while pending and (len(pending) >= limit or not more_waiting()):
            batch: list[bytes] = []
            size = 0
            while pending and len(batch) < limit:
                body = pending[0]
                if not body:
                    if self.args.skip_empty:
                        pending.popleft()
                        self.skipped += 1
                        self.lines_done += 1
                        continue
                    if batch:
                        break  # publish what precedes the empty line first
                    raise UsageError(
                        f"stdin line {self.lines_done + 1} is empty: NSQ messages cannot be "
                        f"empty ({plural(self.published, 'message')} published before it; "
                        "--skip-empty skips empty lines)"
                    )
                if batch and size + len(body) + 4 > MAX_BATCH_BYTES:
                    break
                batch.append(pending.popleft())
                size += len(body) + 4
            if batch:
                await self._send(producer, batch)

    async def _send(self, producer: Producer, batch: list[bytes]) -> None:
        args = self.args
        self.sending = len(batch)
        if len(batch) == 1:
            results = [
                await producer.publish(
                    self.topic,
                    batch[0],
                    partition=args.partition,
                    sharding_key=self.key,
                    ext=self.ext,
                )
            ]
        else:
            results = await producer.publish_many(
                self.topic,
                batch,
                partition=args.partition,
                sharding_key=self.key,
                exts=[self.ext] * len(batch) if self.ext is not None else None,
            )
        self.sending = 0
        if self.key is not None and results[0].partition is None:
            self.key_nsqd.add(results[0].address)
        self.published += len(results)
        self.lines_done += len(results)
        if args.trace:
            self._print_receipts(results)
        self.progress.update(self._progress_text)

    def _progress_text(self) -> str:
        rate = self.published / max(time.perf_counter() - self.started, 1e-6)
        return f"published {self.published} messages to {self.topic} ({rate:.0f} msg/s)"

    def _print_receipts(self, results: list[PublishResult]) -> None:
        lines = []
        for r in results:
            if r.internal_id is None:
                self.no_receipt = True
            lines.append(
                f"partition={dash(r.partition)} internal_id={dash(r.internal_id)} "
                f"trace_id={dash(r.trace_id)} offset={dash(r.offset)} size={dash(r.size)}\n"
            )
        sys.stdout.write("".join(lines))
        sys.stdout.flush()
