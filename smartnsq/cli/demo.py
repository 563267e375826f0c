"""``smartnsq demo``: keyed, ordered messaging end to end on the embedded cluster.

Publishes order events for many customers with the customer id as sharding key (a sample
traced), consumes them with an ordered consumer, and checks what the handler saw: for every
customer, sequence numbers 1, 2, 3... with none missing or out of order, all from one
partition.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smartnsq.cli._common import Progress, add_verbosity, plural, setup_logging, table
from smartnsq.cli.usage import UsageError
from smartnsq.client.tracelog import TRACE_LOGGER
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.producer.producer import Producer
from smartnsq.protocol.validation import MAX_PARTITIONS
from smartnsq.transport import loops

if TYPE_CHECKING:
    from smartnsq.testing import Cluster

__all__ = ["register"]

TOPIC = "orders"
CHANNEL = "billing"
# Concurrent publishers; each owns a set of customers and publishes their events in order.
PUBLISHERS = 64
TRACE_LINES = 4

DESCRIPTION = """\
Start the embedded NSQ cluster (smartnsq's in-process emulator of youzan nsqd and
nsqlookupd), create an ordered topic, publish order events for many customers with the
customer id as sharding key (every Nth event traced), consume them with an ordered
consumer, verify per-customer order and print a short report.

Exit code 0 when every event arrived in order; 1 when any was lost or out of order.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="keyed, ordered messaging end to end on the embedded cluster",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    number = {"type": int, "metavar": "N"}
    parser.add_argument("--messages", default=20_000, help="events to publish (20000)", **number)
    parser.add_argument("--customers", default=500, help="customers = keys (500)", **number)
    parser.add_argument("--partitions", type=int, default=4, metavar="N", help="partitions (4)")
    parser.add_argument("--nodes", type=int, default=3, metavar="N", help="nsqd nodes (3)")
    parser.add_argument(
        "--replicas", type=int, metavar="N", help="replicas per partition (2, at most --nodes)"
    )
    parser.add_argument(
        "--trace-every",
        type=int,
        default=1000,
        metavar="N",
        help="trace every Nth event (1000; 0: none)",
    )
    parser.add_argument(
        "--max-in-flight", type=int, metavar="N", help="consumer's max_in_flight (4 x partitions)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed of the event stream")
    add_verbosity(parser)
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class _Settings:
    messages: int
    customers: int
    partitions: int
    nodes: int
    replicas: int
    trace_every: int
    max_in_flight: int
    seed: int


def _settings(args: argparse.Namespace) -> _Settings:
    def at_least(name: str, value: int, low: int) -> int:
        if value < low:
            raise UsageError(f"--{name} must be >= {low}, not {value}")
        return value

    nodes = at_least("nodes", args.nodes, 1)
    partitions = at_least("partitions", args.partitions, 1)
    if partitions > MAX_PARTITIONS:
        raise UsageError(f"--partitions must be at most {MAX_PARTITIONS}, not {partitions}")
    replicas = min(2, nodes) if args.replicas is None else at_least("replicas", args.replicas, 1)
    if replicas > nodes:
        raise UsageError(f"--replicas {replicas} needs as many nodes (--nodes is {nodes})")
    max_in_flight = 4 * partitions if args.max_in_flight is None else args.max_in_flight
    return _Settings(
        messages=at_least("messages", args.messages, 1),
        customers=at_least("customers", args.customers, 1),
        partitions=partitions,
        nodes=nodes,
        replicas=replicas,
        trace_every=at_least("trace-every", args.trace_every, 0),
        max_in_flight=at_least("max-in-flight", max_in_flight, 1),
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    setup_logging("demo", args.verbose)
    return loops.run(_Demo(settings).main())


# --------------------------------------------------------------------------- checking


@dataclass
class _Checker:
    """What the handler saw, per customer: the last sequence number and its partition."""

    expected: Counter[int]
    last: dict[int, int] = field(default_factory=dict)
    partition_of: dict[int, int | None] = field(default_factory=dict)
    per_partition: Counter[int | None] = field(default_factory=Counter)
    received: int = 0  # distinct events
    redelivered: int = 0
    violations: int = 0
    examples: list[str] = field(default_factory=list)
    complete: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, message: Message) -> None:
        event = json.loads(message.body)
        customer, seq = event["customer"], event["seq"]
        last = self.last.get(customer, 0)
        partition = self.partition_of.setdefault(customer, message.partition)
        if partition != message.partition:
            self._violation(f"customer {customer}: partitions {partition} and {message.partition}")
        if seq <= last and message.attempts > 1:
            self.redelivered += 1  # nsqd gave it again after a timeout: seen already
            return
        if seq != last + 1:
            self._violation(
                f"customer {customer}: seq {seq} after {last} (partition {message.partition})"
            )
        if seq > last:
            self.last[customer] = seq
            self.received += 1
            self.per_partition[message.partition] += 1
        if self.received == sum(self.expected.values()):
            self.complete.set()

    def _violation(self, text: str) -> None:
        self.violations += 1
        if len(self.examples) < 3:
            self.examples.append(text)

    @property
    def lost(self) -> int:
        return sum(n - self.last.get(c, 0) for c, n in self.expected.items())


class _TraceCapture(logging.Handler):
    """Keeps the ``smartnsq.trace`` lines so the report can quote a few of them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, int, str]] = []  # (event, trace id, line)

    def emit(self, record: logging.LogRecord) -> None:
        fields: dict[str, Any] = getattr(record, "nsq", {})
        self.lines.append((fields.get("event", ""), fields.get("trace_id", 0), record.getMessage()))


# --------------------------------------------------------------------------- the demo


class _Demo:
    def __init__(self, settings: _Settings) -> None:
        self.s = settings
        self.out = sys.stdout
        self.progress = Progress(interval=0.5)

    def say(self, text: str = "") -> None:
        self.progress.clear()
        print(text, file=self.out, flush=True)

    async def main(self) -> int:
        # Imported here: the emulator is only needed by the demo, not by every CLI command.
        from smartnsq.testing import Cluster

        s = self.s
        started = time.perf_counter()
        events = _events(s.messages, s.customers, s.seed)
        expected = Counter(customer for customer, _ in events)
        capture = _TraceCapture()
        TRACE_LOGGER.addHandler(capture)
        TRACE_LOGGER.setLevel(logging.INFO)
        TRACE_LOGGER.propagate = False
        self.say("smartnsq demo: keyed, ordered messaging on the embedded NSQ cluster")
        self.say("  The cluster is smartnsq's in-process emulator of youzan nsqd/nsqlookupd, not a")
        self.say("  real deployment: client and servers share this one Python process.")
        try:
            async with Cluster(nodes=s.nodes, record_deliveries=False) as cluster:
                await cluster.create_topic(
                    TOPIC, s.partitions, s.replicas, ordered=True, channels=[CHANNEL]
                )
                self.say()
                nodes = plural(s.nodes, "nsqd node")
                self.say(f"cluster   {nodes}, nsqlookupd {cluster.lookupd_url}")
                self.say(
                    f"topic     {TOPIC}: ordered, {plural(s.partitions, 'partition')} x "
                    f"{plural(s.replicas, 'replica')}, channel {CHANNEL}"
                )
                await self._publish(cluster, events)
                checker = _Checker(expected)
                complete = await self._consume(cluster, checker)
                self._report(cluster, checker, capture)
        finally:
            self.progress.clear()
            TRACE_LOGGER.removeHandler(capture)
        ok = complete and checker.violations == 0 and checker.lost == 0
        self.say()
        verdict = "ok" if ok else "FAILED"
        self.say(f"{verdict} in {time.perf_counter() - started:.1f} s")
        return 0 if ok else 1

    async def _publish(self, cluster: Cluster, events: list[tuple[int, int]]) -> None:
        s = self.s
        workers = min(PUBLISHERS, s.customers)
        done, total = 0, s.messages

        shares: list[list[tuple[int, int, int]]] = [[] for _ in range(workers)]
        for number, (customer, seq) in enumerate(events, 1):
            shares[customer % workers].append((number, customer, seq))

        async def publisher(share: list[tuple[int, int, int]], producer: Producer) -> None:
            nonlocal done
            for number, customer, seq in share:
                body = json.dumps(
                    {"event": "order_placed", "customer": customer, "seq": seq, "n": number}
                )
                traced = s.trace_every and number % s.trace_every == 0
                await producer.publish(
                    TOPIC,
                    body,
                    sharding_key=customer,
                    trace_id=number if traced else None,
                )
                done += 1
                self.progress.update(functools.partial("publishing {}/{}".format, done, total))

        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            began = time.perf_counter()
            await asyncio.gather(*(publisher(share, producer) for share in shares))
            elapsed = time.perf_counter() - began
        traced = s.messages // s.trace_every if s.trace_every else 0
        customers = plural(len({c for c, _ in events}), "customer")
        self.say(
            f"publish   {s.messages} order events for {customers} (sharding key: customer id), "
            f"{traced} traced"
        )
        self.say(f"          {_rate(s.messages, elapsed)}")

    async def _consume(self, cluster: Cluster, checker: _Checker) -> bool:
        s = self.s
        consumer = Consumer(
            TOPIC,
            CHANNEL,
            lookupd=[cluster.lookupd_url],
            handler=checker.handle,
            ordered=True,
            max_in_flight=s.max_in_flight,
        )
        # Generous: an emulator on a loaded machine still does thousands per second.
        limit = 30.0 + s.messages / 500
        began = time.perf_counter()
        async with consumer:
            deadline = asyncio.get_running_loop().time() + limit
            while not checker.complete.is_set():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(checker.complete.wait(), min(remaining, 0.5))
                except TimeoutError:
                    self.progress.update(lambda: f"consuming {checker.received}/{s.messages}")
            elapsed = time.perf_counter() - began
        complete = checker.complete.is_set()
        self.say(f"consume   ordered consumer (SUB_ORDERED), max_in_flight {s.max_in_flight}")
        if complete:
            self.say(f"          {_rate(checker.received, elapsed)}")
        else:
            self.say(f"          {checker.received} of {s.messages} after {elapsed:.1f} s: gave up")
        return complete

    def _report(
        self,
        cluster: Cluster,
        checker: _Checker,
        capture: _TraceCapture,
    ) -> None:
        self.say()
        topology = cluster.topology(TOPIC)
        rows = []
        for pid in range(self.s.partitions):
            leader = topology[pid]["leader"]
            rows.append((str(pid), f"node {leader}", str(checker.per_partition.get(pid, 0))))
        for line in table(("partition", "leader", "messages"), rows, indent=""):
            self.say(line)
        self.say()
        keys = len(checker.expected)
        self.say(f"per-key order verified: {keys} keys, {checker.violations} violations")
        for example in checker.examples:
            self.say(f"  {example}")
        if checker.lost:
            self.say(f"lost: {plural(checker.lost, 'event')} never arrived")
        if checker.redelivered:
            self.say(f"redelivered: {checker.redelivered} (seen before, skipped)")
        traced = [line for line in capture.lines if line[1]]
        if traced:
            shown = _trace_sample(traced)
            self.say()
            self.say(f"trace log (logger smartnsq.trace), {len(shown)} of {len(traced)} lines:")
            for line in shown:
                self.say(f"  {line}")


def _trace_sample(lines: list[tuple[str, int, str]]) -> list[str]:
    """The publish and consume lines of the first traced messages, side by side."""
    shown: list[str] = []
    for trace_id in dict.fromkeys(t for _, t, _ in lines):
        for event in ("publish", "consume"):
            shown += [text for e, t, text in lines if t == trace_id and e == event][:1]
        if len(shown) >= TRACE_LINES:
            break
    return shown[:TRACE_LINES]


def _events(messages: int, customers: int, seed: int) -> list[tuple[int, int]]:
    """(customer, sequence number) in publishing order; each customer counts from 1."""
    rng = random.Random(seed)
    seq: Counter[int] = Counter()
    events = []
    for _ in range(messages):
        customer = rng.randrange(customers)
        seq[customer] += 1
        events.append((customer, seq[customer]))
    return events


def _rate(count: int, seconds: float) -> str:
    return f"{count} in {seconds:.2f} s: {count / max(seconds, 1e-6):,.0f} msg/s"
