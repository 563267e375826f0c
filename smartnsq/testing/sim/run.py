"""One seeded simulation of the real client against the emulated cluster, and many.

:func:`simulate` draws everything from the seed: the cluster (4 youzan nodes, a topic of 4
partitions x 2 replicas, ext or plain), the clients' options (publish and request
timeouts, auto-batching, ordered or not, ``max_in_flight``, failing and slow handlers,
poison messages), the workload and the fault plan (:mod:`smartnsq.testing.sim.faults`). It
runs on a :class:`~smartnsq.testing.sim.loop.SimLoop` over a
:class:`~smartnsq.testing.sim.network.SimNetwork`: publishes start on time, each its own
task, for ``duration`` simulated seconds while the faults come and go; then the run heals,
waits for the consumer to handle what was acknowledged, closes the clients and checks the
invariants (:mod:`smartnsq.testing.sim.invariants`) on what it recorded. The trace hash
fingerprints the run: the same seed gives the same hash, and a failure replays from its seed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import smartnsq
from smartnsq.consumer.message import Message
from smartnsq.flow.backoff import BackoffPolicy
from smartnsq.flow.retry import Backoff
from smartnsq.routing.sharding import Sharder
from smartnsq.testing.cluster import Cluster
from smartnsq.testing.nsqd import ClientError, ClientSession
from smartnsq.testing.sim.faults import KINDS, Fault, plan
from smartnsq.testing.sim.harness import Simulation, SimulationError
from smartnsq.testing.sim.history import UNKEYED, Handled, History, Published
from smartnsq.testing.sim.invariants import STALL_BOUND, check
from smartnsq.testing.sim.network import SimNetwork, SimTransport

__all__ = ["Outcome", "Scenario", "scenario_for", "simulate"]

TOPIC = "sim"
CHANNEL = "check"
NODES = 4
PARTITIONS = 4
KEYS = 6
#: The consumer's backoff when a scenario has one: short windows, so that a handler failing
#: one message in twenty slows the flow without starving it (the default's windows grow to
#: 120 s, which no drain bound could tell from a stall).
_BACKOFF = BackoffPolicy(multiplier=0.2, max_delay=2.0)


@dataclass(frozen=True)
class Scenario:
    """What a seed draws: the cluster, the clients and the faults."""

    seed: int
    duration: float
    ext: bool
    ordered: bool
    rate: float  # publishes per second
    publish_timeout: float
    request_timeout: float
    linger: float | None
    max_in_flight: int | None
    fail_rate: float  # a handler raising (requeue)
    slow_rate: float  # a handler taking a while
    poison_rate: float  # bodies that always fail (given up after max_attempts)
    failover_delay: float
    backoff: bool  # handler failures slow the flow (windows of 0.2 s up to 2 s)
    faults: tuple[Fault, ...]

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: {self.duration:g} s, {'ext' if self.ext else 'plain'} topic, "
            f"{'ordered' if self.ordered else 'unordered'} consumer "
            f"(max_in_flight {self.max_in_flight}), {self.rate:g} publishes/s, "
            f"publish_timeout {self.publish_timeout:g} s, request_timeout "
            f"{self.request_timeout:g} s, linger {self.linger}, failing {self.fail_rate:.2f}, "
            f"slow {self.slow_rate:.2f}, poison {self.poison_rate:.2f}, failover "
            f"{self.failover_delay:g} s, backoff {'on' if self.backoff else 'off'}",
        ]
        lines += [f"  {fault.describe()}" for fault in self.faults]
        return "\n".join(lines)


def scenario_for(
    seed: int, *, duration: float = 60.0, faults: int | None = None, kinds: tuple[str, ...] = KINDS
) -> Scenario:
    """The scenario ``seed`` draws."""
    rng = random.Random(f"scenario:{seed}")
    ordered = rng.random() < 0.7
    poison = rng.choice([0.0, 0.0, 0.03])
    return Scenario(
        seed=seed,
        duration=duration,
        ext=rng.random() < 0.6,
        ordered=ordered,
        rate=rng.choice([4.0, 8.0, 12.0]),
        publish_timeout=rng.choice([3.0, 8.0, 20.0]),
        request_timeout=rng.choice([1.5, 5.0]),
        linger=rng.choice([None, None, None, 0.005]),
        max_in_flight=None if ordered else rng.choice([4, 20]),
        fail_rate=rng.choice([0.0, 0.05]),
        slow_rate=rng.choice([0.0, 0.1]),
        poison_rate=poison,
        failover_delay=rng.choice([2.0, 8.0]),
        backoff=rng.random() < 0.5,
        faults=tuple(
            plan(
                rng,
                duration=duration,
                nodes=NODES,
                partitions=PARTITIONS,
                faults=rng.randint(2, 6) if faults is None else faults,
                kinds=kinds,
            )
        ),
    )


@dataclass
class Outcome:
    """How a run went: the rules it broke (none: it passed), its trace hash, the virtual
    seconds it simulated, and what it did."""

    scenario: Scenario
    problems: list[str]
    trace_hash: str
    simulated: float
    wall: float
    events: int
    published: int = 0
    acknowledged: int = 0
    failed: int = 0
    handled: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def report(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [
            f"simulation {verdict}: {self.scenario.describe()}",
            f"  {self.published} publishes ({self.acknowledged} acknowledged, {self.failed} "
            f"failed), {self.handled} handled; {self.simulated:.1f} simulated s in "
            f"{self.wall:.2f} s; trace {self.trace_hash}",
        ]
        lines += [f"  problem: {problem}" for problem in self.problems]
        lines += (
            [f"  replay: pytest tests/sim --sim-seed {self.scenario.seed}"] if self.problems else []
        )
        return "\n".join(lines)


class _Workload:
    """The clients of a run and what they record."""

    def __init__(self, scenario: Scenario, cluster: Cluster, history: History) -> None:
        self.scenario = scenario
        self.cluster = cluster
        self.history = history
        self.rng = random.Random(f"workload:{scenario.seed}")
        self.numbers = [0] * KEYS
        self.tasks: list[asyncio.Task[None]] = []
        self.handled_bodies: set[bytes] = set()
        self.drained = asyncio.Event()

    # ------------------------------------------------------------------ producing

    def producer(self) -> smartnsq.Producer:
        s = self.scenario
        return smartnsq.Producer(
            lookupd=[self.cluster.lookupd_url],
            publish_timeout=s.publish_timeout,
            request_timeout=s.request_timeout,
            retry_backoff=Backoff(initial=0.05, maximum=1.0),
            heartbeat_interval=5.0,
            linger=s.linger,
            max_batch=20,
            lookupd_poll_interval=15.0,
        )

    async def publish_for(self, producer: smartnsq.Producer, until: float) -> None:
        loop = asyncio.get_running_loop()
        s = self.scenario
        gap = 1.0 / s.rate
        while loop.time() < until:
            self.tasks.append(loop.create_task(self._one(producer)))
            await asyncio.sleep(self.rng.uniform(0.5 * gap, 1.5 * gap))
        await asyncio.gather(*self.tasks)

    async def _one(self, producer: smartnsq.Producer) -> None:
        loop = asyncio.get_running_loop()
        s = self.scenario
        roll = self.rng.random()
        index = len(self.history.published)
        key = UNKEYED if roll < 0.15 else self.rng.randrange(KEYS)
        batch = key != UNKEYED and roll > 0.85
        count = self.rng.randint(2, 4) if batch else 1
        numbers = []
        bodies = []
        for _ in range(count):
            number = 0
            if key != UNKEYED:
                number = self.numbers[key]
                self.numbers[key] += 1
            numbers.append(number)
            poison = self.rng.random() < s.poison_rate
            bodies.append(f"{key}:{number}:{index}:{'p' if poison else 'k'}".encode())
        started = loop.time()
        bound = started + s.publish_timeout + (s.linger or 0.0) * 2
        record = Published(index, key, numbers, bodies, started, bound)
        self.history.published.append(record)
        try:
            if batch:
                results = await producer.publish_many(TOPIC, bodies, sharding_key=key)
                record.partition = results[0].partition
            elif key == UNKEYED:
                result = await producer.publish(TOPIC, bodies[0])
                record.partition = None
            else:
                result = await producer.publish(TOPIC, bodies[0], sharding_key=key)
                record.partition = result.partition
        except Exception as exc:  # noqa: BLE001 - every failure is checked by the invariants
            record.error = exc
        record.ended = loop.time()

    # ------------------------------------------------------------------ consuming

    def consumer(self) -> smartnsq.Consumer:
        s = self.scenario
        return smartnsq.Consumer(
            TOPIC,
            CHANNEL,
            lookupd=[self.cluster.lookupd_url],
            handler=self._handle,
            ordered=s.ordered,
            max_in_flight=s.max_in_flight,
            max_attempts=3,
            backoff=_BACKOFF if s.backoff else False,
            ordered_give_up=True,
            requeue_delay=0.2,
            on_giving_up=self._given_up,
            heartbeat_interval=5.0,
            msg_timeout=10.0,
            lookupd_poll_interval=15.0,
        )

    async def _handle(self, message: Message) -> None:
        s = self.scenario
        if message.body.endswith(b":p") or self.rng.random() < s.fail_rate:
            raise RuntimeError("the handler failed")
        if self.rng.random() < s.slow_rate:
            await asyncio.sleep(self.rng.uniform(0.01, 0.3))
        self._record(message, given_up=False)

    def _given_up(self, message: Message) -> None:
        self._record(message, given_up=True)

    def _record(self, message: Message, *, given_up: bool) -> None:
        key, number, _, _ = message.body.split(b":")
        self.history.handled.append(
            Handled(
                asyncio.get_running_loop().time(),
                int(key),
                int(number),
                message.body,
                message.partition,
                message.attempts,
                given_up,
            )
        )
        self.handled_bodies.add(message.body)
        if self.drain_target is not None and self.drain_target <= self.handled_bodies:
            self.drained.set()

    drain_target: set[bytes] | None = None

    async def drain(self, bound: float) -> float | None:
        """Wait until every acknowledged body was handled, for as long as the consumer makes
        progress: None if ``bound`` seconds pass with no new body handled (a stall), else the
        time it was drained."""
        self.drain_target = {
            body for p in self.history.published if p.acknowledged for body in p.bodies
        }
        loop = asyncio.get_running_loop()
        while not self.drain_target <= self.handled_bodies:
            progress = len(self.handled_bodies)
            try:
                await asyncio.wait_for(self.drained.wait(), bound)
            except TimeoutError:
                if len(self.handled_bodies) == progress:
                    return None
        return loop.time()


@contextmanager
def _observed(history: History, cluster: Cluster, network: SimNetwork) -> Iterator[None]:
    """What the emulated nsqd sees, recorded while the run lasts: each RDY (the sum the
    consumer's connections hold), each subscribe, each refusal a store follows on the same
    connection, and each FIN or REQ of a delivery already answered."""
    real_subscribe = ClientSession._subscribe
    real_dispatch = ClientSession._dispatch
    real_deliver = ClientSession.deliver_many
    real_finish_many = ClientSession._finish_many
    limit = history.max_in_flight if history.max_in_flight is not None else history.partitions

    # The RDY counts the client granted, read from what its connections write (the
    # client's view: nsqd may still hold a count for a connection the client gave up on).
    granted: dict[SimTransport, int] = {}
    unread: dict[SimTransport, bytes] = {}

    def written(end: SimTransport, data: bytes) -> None:
        if end is not end.link.client:
            return
        stream = unread.pop(end, b"") + data
        counts = _RDY.findall(stream)
        cut = stream.rfind(b"\n")
        if cut < len(stream) - 1:
            unread[end] = stream[max(cut, 0) :][-16:]  # a command cut short: its start
        if not counts:
            return
        granted[end] = int(counts[-1])
        total = sum(count for other, count in granted.items() if not other.is_closing())
        history.max_rdy = max(history.max_rdy, total)
        if total > limit and len(history.rdy_overruns) < 3:
            history.rdy_overruns.append(
                f"RDY {total} granted at once at {asyncio.get_running_loop().time():.3f} s, "
                f"over {limit}"
            )

    def subscribe(session: ClientSession, command: Any, kind: str) -> bytes | None:
        answer = real_subscribe(session, command, kind)
        partition = None
        if len(command.params) > 2:
            try:
                partition = int(command.params[2])
            except ValueError:
                partition = None
        history.subscribes[(session.node.index, partition)].append(
            asyncio.get_running_loop().time()
        )
        return answer

    refused: dict[int, list[bytes]] = {}
    # per session: the deliveries of each id on it not answered yet (youzan delivers the
    # first message of a channel's first SUB_ORDERED twice: each copy gets its answer)
    answers: dict[int, dict[bytes, int]] = {}

    def deliver(session: ClientSession, deliveries: Any) -> None:
        pending = answers.setdefault(id(session), {})
        for delivery in deliveries:
            message_id = delivery.record.id
            pending[message_id] = pending.get(message_id, 0) + 1
        real_deliver(session, deliveries)

    def answered(session: ClientSession, name: bytes, message_id: bytes) -> None:
        pending = answers.get(id(session), {})
        unanswered = pending.get(message_id)
        if unanswered == 0 and len(history.answered_twice) < 3:
            history.answered_twice.append(
                f"{name.decode()} of {message_id!r} at "
                f"{asyncio.get_running_loop().time():.3f} s: already answered on its connection"
            )
        if unanswered:
            pending[message_id] = unanswered - 1

    def finish_many(session: ClientSession, message_ids: list[bytes]) -> None:
        for message_id in message_ids:
            answered(session, b"FIN", message_id)
        real_finish_many(session, message_ids)

    def dispatch(session: ClientSession, command: Any) -> bytes | None:
        name = command.name
        if name in (b"FIN", b"REQ") and command.params:
            answered(session, name, bytes(command.params[0]))
        is_pub = name in (b"PUB", b"PUB_EXT", b"PUB_TRACE", b"MPUB", b"MPUB_EXT")
        try:
            answer = real_dispatch(session, command)
        except ClientError as exc:
            if is_pub and not exc.fatal:
                refused.setdefault(id(session), []).extend(_bodies(command))
            raise
        if is_pub:
            for body in _bodies(command):
                for earlier in refused.get(id(session), ()):
                    history.inversions.add((earlier, body))
        return answer

    watched = {
        "_subscribe": (subscribe, real_subscribe),
        "_dispatch": (dispatch, real_dispatch),
        "deliver_many": (deliver, real_deliver),
        "_finish_many": (finish_many, real_finish_many),
    }
    for name, (watcher, _) in watched.items():
        setattr(ClientSession, name, watcher)
    network.on_write = written
    try:
        yield
    finally:
        network.on_write = None
        for name, (_, real) in watched.items():
            setattr(ClientSession, name, real)


_RDY = re.compile(rb"(?:^|\n)RDY ([0-9]+)(?=\n)")
_BODY = re.compile(rb"(?<![0-9-])-?[0-9]+:[0-9]+:[0-9]+:[kp]")


def _bodies(command: Any) -> list[bytes]:
    """The workload's bodies in a PUB or MPUB command (``key:number:index:k``, each
    self-delimiting whatever frames or headers surround it)."""
    return _BODY.findall(bytes(command.body or b""))


async def _run(scenario: Scenario, sim: Simulation, history: History) -> None:
    network = sim.network
    loop = asyncio.get_running_loop()
    # nsqd scans its in-flight messages for timeouts every 100 ms (QueueScanInterval,
    # nsqio/nsq nsqd/options.go), where the emulator's default is finer for tests
    cluster = Cluster(
        nodes=NODES,
        failover_delay=scenario.failover_delay,
        record_deliveries=False,
        sweep_interval=0.1,
    )
    async with cluster:
        await cluster.create_topic(
            TOPIC, PARTITIONS, 2, ext=scenario.ext, ordered=False, channels=[CHANNEL]
        )
        baseline_tasks = set(asyncio.all_tasks())
        network.note("cluster ready")
        with _observed(history, cluster, network):
            workload = _Workload(scenario, cluster, history)
            consumer = workload.consumer()
            producer = workload.producer()
            await consumer.start()
            await producer.start()
            faults = sim.inject(cluster, TOPIC, list(scenario.faults))
            await workload.publish_for(producer, loop.time() + scenario.duration)
            await faults.wait()
            history.healed_at = loop.time()
            network.note("healed")
            history.drained_at = await workload.drain(STALL_BOUND)
            await producer.close()
            await consumer.close(timeout=5.0)
            network.note("closed")
        for partition in range(PARTITIONS):
            for record in cluster.messages(TOPIC, partition):
                history.stored[record.body] = history.stored.get(record.body, 0) + 1
        await asyncio.sleep(1.0)  # what the close left in flight settles
        _leaks(history, network, baseline_tasks)


def _leaks(history: History, network: SimNetwork, baseline: set[asyncio.Task[Any]]) -> None:
    """The clients' connections, tasks and timers, once closed: none left (a sleep of a
    client's task is its task's, counted with it)."""
    client_links = [link for link in network.open_links() if not link.client.is_closing()]
    if client_links:
        history.leaks.append(f"{len(client_links)} client connection(s) still open: {client_links}")
    left = [
        task
        for task in asyncio.all_tasks()
        if task not in baseline and not task.done() and _is_clients(task)
    ]
    if left:
        history.leaks.append(f"{len(left)} client task(s) still running: {left[:3]}")
    loop = asyncio.get_running_loop()
    timers = [
        handle
        for handle in getattr(loop, "_scheduled", ())
        if not handle.cancelled() and _is_clients_callback(handle._callback)
    ]
    if timers:
        history.leaks.append(f"{len(timers)} client timer(s) still armed: {timers[:3]}")


def _is_clients_callback(callback: Any) -> bool:
    owner = getattr(callback, "__self__", None)
    module = type(owner).__module__ if owner is not None else getattr(callback, "__module__", "")
    module = module or ""
    return module.startswith("smartnsq") and not module.startswith("smartnsq.testing")


def _is_clients(task: asyncio.Task[Any]) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    filename = getattr(code, "co_filename", "")
    return "smartnsq" in filename and "smartnsq/testing" not in filename


def simulate(seed: int, **options: Any) -> Outcome:
    """Run the scenario ``seed`` draws (``options``: :func:`scenario_for`'s) and check it."""
    scenario = scenario_for(seed, **options)
    history = History(
        ordered=scenario.ordered,
        ext=scenario.ext,
        max_in_flight=scenario.max_in_flight,
        partitions=PARTITIONS,
    )
    sim = Simulation(seed)
    started = time.perf_counter()
    problems: list[str] = []
    quiet = _quiet_logs()
    try:
        sim.run(lambda sim: _run(scenario, sim, history))
    except SimulationError:
        pass  # the loop's errors are checked below, with the rest
    except Exception as exc:  # noqa: BLE001 - a crash of the run is a problem found
        problems.append(f"the run raised {exc!r}")
    finally:
        quiet()
    wall = time.perf_counter() - started
    history.loop_errors = sim.loop_errors
    problems += check(history, Sharder("java"))
    return Outcome(
        scenario=scenario,
        problems=problems,
        trace_hash=sim.trace_hash,
        simulated=sim.time(),
        wall=wall,
        events=sim.network.events,
        published=len(history.published),
        acknowledged=sum(p.acknowledged for p in history.published),
        failed=sum(p.error is not None for p in history.published),
        handled=len(history.handled),
    )


def _quiet_logs() -> Callable[[], None]:
    """A run logs what its faults cause (warnings by design): kept out of the output."""
    logger = logging.getLogger("smartnsq")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    return lambda: logger.setLevel(level)
