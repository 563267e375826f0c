"""``smartnsq pub``: publish the arguments, or one message per stdin line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, BinaryIO

from smartnsq.cli import UsageError, _one_line
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
from smartnsq.errors import NSQError, UnsupportedFeatureError, ValidationError
from smartnsq.producer import Producer
from smartnsq.publish_result import PublishResult

__all__ = ["register"]

DEFAULT_BATCH = 500
# Far below nsqd's MPUB limit (5 MiB by default): a batch is one request to one partition.
MAX_BATCH_BYTES = 1024 * 1024
_READ_SIZE = 1 << 16

DESCRIPTION = """\
Publish messages to TOPIC: each BODY argument is one message; without BODY arguments, each
line of stdin is one message (the trailing newline removed, nothing skipped: an empty line
is an error, NSQ messages cannot be empty). Stdin lines are sent in batches (MPUB); with
--partition or --sharding-key every batch goes to that one partition, in input order.

Prints a summary line on stderr at the end (progress once a second when stderr is a
terminal). With --trace, stdout gets one line per message: partition, internal id, trace
id, queue offset and size, from nsqd's trace receipts (youzan nsqd only).
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pub",
        help="publish messages (arguments, or one per stdin line)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("bodies", nargs="*", metavar="BODY", help="message bodies")
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
        choices=("str", "int"),
        help="hash KEY as a string (default) or as an integer (Java Long.hashCode)",
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
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"at most N stdin lines per MPUB (default {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=40.0,
        metavar="SECONDS",
        help="give up on a message after this long, retries included (default 40)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no summary line")
    add_verbosity(parser)
    parser.set_defaults(func=run, more_positionals="bodies")


def _sharding_key(args: argparse.Namespace) -> Any:
    if args.sharding_key is None:
        if args.key_type is not None:
            raise UsageError("--key-type needs --sharding-key")
        return None
    if args.key_type == "int":
        try:
            return int(args.sharding_key, 10)
        except ValueError:
            raise UsageError(f"--sharding-key {args.sharding_key!r} is not an integer") from None
    return args.sharding_key


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
    setup_logging("pub", args.verbose)
    # os.fsencode gives back the argument's original bytes, whatever the locale.
    bodies = [os.fsencode(body) for body in args.bodies]
    for number, body in enumerate(bodies, 1):
        if not body:
            raise UsageError(f"BODY argument {number} is empty: NSQ messages cannot be empty")
    publisher = _Publisher(args, topic, target, key, ext)
    return asyncio.run(publisher.main(bodies or None))


class _StdinReader:
    """Reads lines in a daemon thread (a blocking read must not stall the event loop; a
    daemon cannot keep the process alive) and hands over lists of lines through a bounded
    queue, which also bounds memory when stdin is a huge file."""

    def __init__(self, stream: BinaryIO, loop: asyncio.AbstractEventLoop) -> None:
        self.stream = stream
        self.loop = loop
        self.queue: asyncio.Queue[list[bytes] | BaseException | None] = asyncio.Queue(64)

    def start(self) -> None:
        threading.Thread(target=self._run, name="smartnsq-pub-stdin", daemon=True).start()

    def _put(self, item: list[bytes] | BaseException | None) -> None:
        asyncio.run_coroutine_threadsafe(self.queue.put(item), self.loop).result()

    def _run(self) -> None:
        try:
            self._read()
            last: BaseException | None = None
        except RuntimeError:
            return  # the event loop is gone: the command ended early
        except Exception as exc:  # noqa: BLE001 - handed to the event loop, which reports it
            last = exc
        try:
            self._put(last)
        except RuntimeError:
            pass

    def _read(self) -> None:
        read = getattr(self.stream, "read1", self.stream.read)
        rest = b""
        while chunk := read(_READ_SIZE):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            if lines:
                self._put(lines)
        if rest:
            self._put([rest])  # a last line without a newline is a message too


class _Publisher:
    def __init__(
        self,
        args: argparse.Namespace,
        topic: str,
        target: Target,
        key: Any,
        ext: dict[str, str] | None,
    ) -> None:
        self.args = args
        self.topic = topic
        self.target = target
        self.key = key
        self.ext = ext
        self.published = 0
        self.no_receipt = False
        self.progress = Progress()
        self.started = 0.0

    async def main(self, bodies: list[bytes] | None) -> int:
        args = self.args
        producer = Producer(
            lookupd=self.target.lookupd,
            nsqd=self.target.nsqd,
            address_map=self.target.address_map,
            trace=args.trace,
            publish_timeout=args.timeout,
        )
        try:
            with muted_logs(args.verbose):
                await producer.start()
            self.started = time.perf_counter()
            try:
                if bodies is not None:
                    await self._send_all(producer, deque(bodies), eof=True)
                else:
                    await self._pump_stdin(producer)
            except NSQError as exc:
                if not self.published:
                    raise
                # Say how far it got, still in one line.
                done = f"{plural(self.published, 'message')} published before it"
                if isinstance(exc, (ValidationError, UnsupportedFeatureError)):
                    raise UsageError(f"{_one_line(exc)} ({done})") from exc
                raise NSQError(f"{_one_line(exc)} ({done})") from exc
        finally:
            self.progress.clear()
            await producer.close()
        elapsed = max(time.perf_counter() - self.started, 1e-6)
        if self.no_receipt:
            print(
                "smartnsq pub: note: nsqd sent no trace receipts (classic nsqd cannot trace)",
                file=sys.stderr,
            )
        if not args.quiet:
            print(
                f"published {plural(self.published, 'message')} to {self.topic} in "
                f"{elapsed:.2f} s ({self.published / elapsed:.0f} msg/s)",
                file=sys.stderr,
            )
        return 0

    async def _pump_stdin(self, producer: Producer) -> None:
        reader = _StdinReader(sys.stdin.buffer, asyncio.get_running_loop())
        reader.start()
        pending: deque[bytes] = deque()
        while True:
            item = await reader.queue.get()
            if isinstance(item, BaseException):
                raise item
            eof = item is None
            if item is not None:
                pending.extend(item)
            # Whatever has arrived meanwhile joins the batch; a slow writer (tail -f | ...)
            # still gets each line sent as soon as nothing else is waiting.
            while not eof and len(pending) < self.args.batch_size and not reader.queue.empty():
                more = reader.queue.get_nowait()
                if isinstance(more, BaseException):
                    raise more
                if more is None:
                    eof = True
                else:
                    pending.extend(more)
            await self._send_all(producer, pending, eof=eof or reader.queue.empty())
            if eof:
                return

    async def _send_all(self, producer: Producer, pending: deque[bytes], *, eof: bool) -> None:
        """Send full batches; with ``eof`` (nothing more is waiting), the rest too."""
        limit = self.args.batch_size
        while pending and (eof or len(pending) >= limit):
            batch: list[bytes] = []
            size = 0
            while pending and len(batch) < limit:
                body = pending[0]
                if not body:
                    if batch:
                        break  # publish what precedes the empty line first
                    raise UsageError(
                        f"stdin line {self.published + 1} is empty: NSQ messages cannot be empty "
                        f"({plural(self.published, 'message')} published before it)"
                    )
                if batch and size + len(body) + 4 > MAX_BATCH_BYTES:
                    break
                batch.append(pending.popleft())
                size += len(body) + 4
            await self._send(producer, batch)

    async def _send(self, producer: Producer, batch: list[bytes]) -> None:
        args = self.args
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
        self.published += len(results)
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
