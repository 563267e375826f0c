"""``smartnsq tail``: print a topic's messages as they arrive, one line each."""

from __future__ import annotations

import argparse
import asyncio
import io
import secrets
import signal
import sys
from typing import Any

from smartnsq.cli._common import (
    Target,
    add_connection_options,
    add_verbosity,
    channel_arg,
    dash,
    muted_logs,
    resolve_target,
    setup_logging,
    silence_stdout,
    topic_arg,
)
from smartnsq.cli.usage import UsageError
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.errors import NSQError, TopicNotFoundError
from smartnsq.transport import loops
from smartnsq.transport.connection import Connection, ConnectionConfig
from smartnsq.transport.lookup import LookupManager

__all__ = ["format_message", "register"]

DEFAULT_MAX_IN_FLIGHT = 200

DESCRIPTION = """\
Print TOPIC's messages as they arrive, one line each:

  partition=P offset=O trace_id=T attempts=A BODY

P and O are "-" on classic nsqd, which has no partitions or queue offsets (every youzan
message carries its queue offset), T on a message that was not traced. BODY is decoded as
UTF-8 (invalid bytes replaced) with newlines shown as \\n, so each message stays on one
line; --raw prints Python's repr of the bytes instead.

Every printed message is finished (FIN) after it is written out; messages that arrive
after -n N are handed back (REQ) unprinted. The default channel is a new ephemeral one
(tail-XXXXXX#ephemeral), which nsqd deletes when tail exits: tailing leaves nothing behind
and starts with new messages. A youzan topic created with disable_channel_auto_create takes
registered channels only: register one for tailing and pass --channel. Ordered topics are
consumed with SUB_ORDERED automatically.

Ctrl-C or SIGTERM stops taking messages, lets the one being printed finish and exits 0; a
second Ctrl-C or SIGTERM during that exits at once with 130.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tail",
        help="print a topic's messages as they arrive",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument(
        "--channel",
        metavar="NAME",
        help="channel to consume (default: a new tail-XXXXXX#ephemeral channel)",
    )
    add_connection_options(parser)
    parser.add_argument(
        "--ordered",
        action="store_true",
        help="ordered subscription (SUB_ORDERED): each partition strictly in queue order",
    )
    parser.add_argument(
        "--partitions",
        type=_partition_list,
        metavar="LIST",
        help="only these partitions, e.g. 0,2",
    )
    parser.add_argument(
        "-n", dest="count", type=int, metavar="N", help="exit after printing N messages"
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        metavar="N",
        help=f"messages in flight at once (default {DEFAULT_MAX_IN_FLIGHT}, or about N with -n)",
    )
    parser.add_argument("--raw", action="store_true", help="print repr(body) instead of text")
    add_verbosity(parser)
    parser.set_defaults(func=run)


def _partition_list(text: str) -> list[int]:
    try:
        partitions = [int(part, 10) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected partition numbers such as 0,2, not {text!r}"
        ) from None
    if any(p < 0 for p in partitions):
        raise argparse.ArgumentTypeError(f"partition numbers are >= 0, not {text!r}")
    return sorted(set(partitions))


def format_message(message: Message, raw: bool = False) -> str:
    """The line ``tail`` prints for ``message`` (without the newline)."""
    if raw:
        body = repr(message.body)
    else:
        text = message.body.decode("utf-8", "replace")
        body = text.replace("\r", "\\r").replace("\n", "\\n")
    return (
        f"partition={dash(message.partition)} offset={dash(message.offset)} "
        f"trace_id={message.trace_id or '-'} attempts={message.attempts} {body}"
    )


def run(args: argparse.Namespace) -> int:
    topic = topic_arg(args.topic)
    channel = channel_arg(args.channel or f"tail-{secrets.token_hex(3)}#ephemeral")
    target = resolve_target(args)
    if args.count is not None and args.count < 1:
        raise UsageError(f"-n must be >= 1, not {args.count}")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise UsageError(f"--max-in-flight must be >= 1, not {args.max_in_flight}")
    if target.nsqd is not None and (args.ordered or args.partitions):
        option = "--ordered" if args.ordered else "--partitions"
        raise UsageError(f"{option} needs youzan partitions: use --lookupd (--nsqd is classic)")
    setup_logging("tail", args.verbose)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # A body the terminal's encoding cannot show must not fail (and requeue) forever.
        sys.stdout.reconfigure(errors="backslashreplace")
    return loops.run(_Tail(args, topic, channel, target).main())


class _Tail:
    def __init__(self, args: argparse.Namespace, topic: str, channel: str, target: Target):
        self.args = args
        self.topic = topic
        self.channel = channel
        self.target = target
        self.printed = 0
        self.done = False
        self.broken_pipe = False
        self.stop = asyncio.Event()
        self.closing = False

    async def handle(self, message: Message) -> None:
        if self.done:
            # Not printed, so not finished: back to the channel for someone else.
            await message.requeue(0, backoff=False)
            return
        try:
            sys.stdout.write(format_message(message, self.args.raw) + "\n")
            sys.stdout.flush()  # written out before the FIN that follows the return
        except BrokenPipeError:
            self.broken_pipe = self.done = True
            self.stop.set()
            await message.requeue(0, backoff=False)
            return
        self.printed += 1
        if self.args.count is not None and self.printed >= self.args.count:
            self.done = True
            self.stop.set()

    async def main(self) -> int:
        args = self.args
        lookup = (
            LookupManager(self.target.lookupd, address_map=self.target.address_map)
            if self.target.lookupd
            else None
        )
        consumer: Consumer | None = None
        try:
            with muted_logs(args.verbose):
                ordered, subscriptions = await self._prepare(lookup)
                consumer = Consumer(
                    self.topic,
                    self.channel,
                    nsqd=self.target.nsqd,
                    lookup_manager=lookup,
                    handler=self.handle,
                    ordered=ordered,
                    partitions=args.partitions,
                    max_in_flight=self._max_in_flight(subscriptions),
                )
                await consumer.start()
            return await self._run(consumer)
        finally:
            # After a second signal cut the drain short, exit without waiting again.
            if consumer is not None and not self.closing:
                await consumer.close()
            if lookup is not None:
                await lookup.close()
            if self.broken_pipe:
                silence_stdout()

    async def _prepare(self, lookup: LookupManager | None) -> tuple[bool, int]:
        """Fail fast (one line, exit 1) when nothing answers; learn the topic's layout."""
        ordered = bool(self.args.ordered)
        if lookup is None:
            await _probe(self.target.nsqd or [])
            return ordered, len(self.target.nsqd or [])
        await lookup.discover()
        try:
            layout = await lookup.lookup(self.topic, "r")
        except TopicNotFoundError:
            layout = None
        if layout is None or layout.empty:
            _note(f"no nsqd has topic {self.topic!r} yet; waiting for it")
            return ordered, 1
        auto_create = layout.meta is None or not layout.meta.disable_channel_auto_create
        if not auto_create and self.args.channel is None:
            # nsqd refuses a SUB to any channel not registered (ephemeral ones too).
            raise UsageError(
                f"topic {self.topic!r} accepts registered channels only (created with "
                "disable_channel_auto_create): register one for tailing (smartnsq channel "
                f"create {self.topic} tail) and pass --channel tail; tailing a channel "
                "that an application consumes takes messages away from it"
            )
        if layout.ordered and not ordered:
            # A plain SUB to an ordered topic is refused (E_SUB_ORDER_IS_MUST).
            _note(f"{self.topic} is an ordered topic: subscribing with SUB_ORDERED")
            ordered = True
        subscriptions = len(layout.partitions) + len(layout.classic_nodes)
        if self.args.partitions:
            subscriptions = len(self.args.partitions)
        return ordered, subscriptions

    def _max_in_flight(self, subscriptions: int) -> int:
        explicit: int | None = self.args.max_in_flight
        count: int | None = self.args.count
        if explicit is not None:
            return explicit
        if count is None:
            return DEFAULT_MAX_IN_FLIGHT
        # Few more than N (what arrives beyond N goes back), but at least one per
        # partition: below that, partitions take turns every few seconds.
        return min(DEFAULT_MAX_IN_FLIGHT, max(count, subscriptions))

    async def _run(self, consumer: Consumer) -> int:
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        interrupted = False

        def on_signal() -> None:
            nonlocal interrupted
            if self.stop.is_set() and main_task is not None:
                interrupted = True
                main_task.cancel()  # a second signal: do not wait for the drain
            self.stop.set()

        signals = (signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            loop.add_signal_handler(signum, on_signal)
        stopped = asyncio.ensure_future(self.stop.wait())
        joined = asyncio.ensure_future(consumer.join())
        try:
            await asyncio.wait({stopped, joined}, return_when=asyncio.FIRST_COMPLETED)
            if joined.done():
                joined.result()  # the consumer stopped itself: raise why
                return 0
            self.closing = True
            await consumer.close()  # drain: what is being printed is finished first
            return 0
        except asyncio.CancelledError:
            if interrupted:
                return 130
            raise
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)
            for task in (stopped, joined):
                task.cancel()
            await asyncio.gather(stopped, joined, return_exceptions=True)


async def _probe(addresses: list[str]) -> None:
    """Raise the first connection error if no nsqd accepts a connection."""
    errors: list[NSQError] = []
    for address in addresses:
        conn = Connection(address, ConnectionConfig(connect_timeout=5.0))
        try:
            await conn.connect()
        except NSQError as exc:
            errors.append(exc)
            continue
        await conn.close()
        return
    if errors:
        raise errors[0]


def _note(text: str) -> None:
    print(f"smartnsq tail: note: {text}", file=sys.stderr)
