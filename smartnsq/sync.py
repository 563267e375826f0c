"""Blocking facade: ``smartnsq.sync.Producer`` and ``smartnsq.sync.Consumer`` take the same
arguments as ``smartnsq.Producer`` and ``smartnsq.Consumer`` and block instead of returning
coroutines.

Why a thread and not a second implementation: each blocking client owns one private event
loop running in a daemon thread. The async client is created and used only on that loop;
every blocking method submits the async method to it (``run_coroutine_threadsafe``) and waits
for the outcome, so results and exceptions are the async client's own, and there is no
second protocol implementation to keep in step. Many threads can share one client: the loop
serialises everything that touches the client's state. The loop thread, with its fork and
deadlock guards, is :class:`smartnsq.transport.loopthread.LoopThread` (the Spark source uses
it too).

One exception, for speed: ``Producer.publish`` makes its first try in the calling thread
(:mod:`smartnsq.producer.blocking`), over a blocking connection driven by the same protocol
session, with the async producer's router, codec and cached layouts; what that try does not
end (no layout cached yet, an error, a lost connection, the deadline) goes on on the loop
as the async publish goes on after its first try, retries and failover included. A
sequential blocking publish then costs about what an async one does, instead of two thread
hops more. Auto-batching producers (``linger``), OpenTelemetry-traced ones and sharding
callables of the user's (which run on the loop) keep every try on the loop.

Rules that follow from the design:

* A client belongs to the process that created it. After ``os.fork()`` the child holds a copy
  of the object but not its loop thread, so using it raises :class:`ForkedClientError`
  (create clients in the worker process). ``close()`` in the child only drops the copy.
* Blocking methods must not be called from the client's own loop thread (a coroutine
  handler, a sharding callable): they would wait for the loop they block. That raises
  ``RuntimeError`` instead of hanging.
* Plain callables given as ``handler`` or ``on_giving_up`` receive the blocking
  :class:`Message`; coroutine functions receive the async ``smartnsq.Message`` and run on the
  client's loop, like with the async client.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from os import getpid
from threading import get_ident
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from smartnsq.consumer.consumer import Consumer as AsyncConsumer
from smartnsq.consumer.consumer import ConsumerStats, is_coroutine_function
from smartnsq.consumer.message import Message as AsyncMessage
from smartnsq.errors import ClientClosedError, NSQTimeoutError
from smartnsq.flow.backoff import check_seconds
from smartnsq.producer.blocking import BlockingPublisher
from smartnsq.producer.producer import Producer as AsyncProducer
from smartnsq.producer.producer import ProducerStats
from smartnsq.publishing.result import PublishResult
from smartnsq.transport.loopthread import GRACE as _GRACE
from smartnsq.transport.loopthread import LoopThread, call_plain

__all__ = ["Consumer", "ConsumerStats", "Message", "Producer", "ProducerStats", "PublishResult"]

log = logging.getLogger("smartnsq.sync")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# How long close() waits for the loop thread to end.
_JOIN_TIMEOUT = 10.0
# What a publish may name and still make its first try in the calling thread.
_PUBLISH_KEYWORDS = frozenset(inspect.signature(AsyncProducer.publish).parameters) - {
    "self",
    "topic",
    "body",
}
# The async consumer's default drain time, read rather than copied.
_DRAIN_TIMEOUT: float = inspect.signature(AsyncConsumer.close).parameters["timeout"].default


# --------------------------------------------------------------------------- signatures


def _same_arguments(
    method: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """Give a forwarding method the parameters of the async client's ``method`` (for type
    checkers and ``help()``) without a hand-maintained copy of them. The return type is the
    forward's own: for a blocking twin, the coroutine's result (mypy checks it, as the forward
    returns what :meth:`LoopThread.run` gives)."""

    def decorate(forward: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        forward.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
        return forward

    return decorate


# --------------------------------------------------------------------------- lifecycle


class _Client:
    """Lifecycle shared by the blocking clients: state, fork and thread checks, close(),
    and the ResourceWarning of a client garbage-collected while started."""

    _kind = "client"
    # new -> started -> closing -> closed. A class default so that __del__ of an object
    # whose __init__ failed does nothing.
    _state = "closed"
    _runner: LoopThread

    def _start_loop(self, name: str) -> LoopThread:
        self._lifecycle = threading.RLock()
        self._closed = threading.Event()
        self._was_started = False
        self._close_error: BaseException | None = None
        self._closer: int | None = None
        self._close_bound = 0.0
        self._reported: BaseException | None = None
        self._runner = LoopThread(name)
        return self._runner

    def _build(self, factory: Callable[[], T]) -> T:
        """Create the async client on the loop (so it binds to nothing else); argument
        errors are raised here and leave no thread behind."""
        try:
            client = self._runner.run(call_plain(factory), _GRACE, f"{self._kind}()")
        except BaseException:
            self._runner.stop(_JOIN_TIMEOUT)
            raise
        self._state = "new"
        return client

    def _check(self, what: str) -> None:
        runner = self._runner
        if os.getpid() != runner.pid or runner.in_loop_thread():
            runner.check(f"{self._kind}.{what}()")  # raises what it is
        if self._state in ("closing", "closed"):
            raise ClientClosedError(f"this {self._kind} is closed; create a new one")

    def _read(self, fn: Callable[[], T], what: str) -> T:
        """Reads run on the loop, or directly once its thread is over (nothing races then).
        They never wait for the loop's work, so the loop thread itself may call them."""
        runner = self._runner
        if os.getpid() != runner.pid:
            runner.check(what)
        if runner.in_loop_thread():
            return fn()
        if runner.stopping:
            runner.join(_JOIN_TIMEOUT)
            if not runner.alive:
                return fn()
        return runner.call(fn, what)

    def _mark_started(self) -> None:
        if self._state != "new":
            return
        with self._lifecycle:
            if self._state == "new":
                self._state = "started"
                self._was_started = True

    def _close(
        self, closing: Callable[[], Coroutine[Any, Any, Any]], bound: float
    ) -> BaseException | None:
        """Close the async client on its loop, then stop and join the loop thread. Idempotent;
        a second caller waits for the first. Returns the async close's error, if any."""
        runner = self._runner
        if os.getpid() != runner.pid:
            # A forked child's copy: the loop thread and the connections are the parent's.
            self._state = "closed"
            return None
        if runner.in_loop_thread():
            runner.check(f"{self._kind}.close()")  # raises the deadlock RuntimeError
        with self._lifecycle:
            state = self._state
            if state in ("new", "started"):
                self._state = "closing"
                self._closer = threading.get_ident()
                self._close_bound = bound + _JOIN_TIMEOUT
        if state == "closed":
            return None
        if state == "closing":
            self._wait_closed()
            return None
        error: BaseException | None = None
        try:
            runner.run(closing(), bound, f"{self._kind}.close()")
        except Exception as exc:  # noqa: BLE001 - returned to the caller, after the cleanup
            error = exc
        finally:
            stopped = runner.stop(_JOIN_TIMEOUT)
            self._state = "closed"
            self._closed.set()
        if error is None and not stopped:
            error = NSQTimeoutError(
                f"the {self._kind}'s event loop thread did not stop within {_JOIN_TIMEOUT} s"
            )
        self._close_error = error
        return error

    def _wait_closed(self) -> None:
        """Wait until another thread's close() is over (not when this thread is the closer,
        re-entered from a signal handler: that would wait for itself)."""
        if self._closer != threading.get_ident():
            self._closed.wait(self._close_bound)

    def _abandon(self) -> Callable[[], Awaitable[Any]]:
        raise NotImplementedError

    def __del__(self) -> None:
        if self._state in ("closing", "closed"):
            return
        runner = self.__dict__.get("_runner")
        if runner is None or os.getpid() != runner.pid:
            return
        if self._state == "started":
            warnings.warn(f"unclosed {self!r}", ResourceWarning, source=self, stacklevel=2)
        self._state = "closed"
        runner.stop_soon(self._abandon())

    def __repr__(self) -> str:
        return f"<smartnsq.sync.{self._kind} {self._state}>"


# --------------------------------------------------------------------------- producer


class Producer(_Client):
    """Blocking :class:`smartnsq.Producer`: the same arguments, results and exceptions.

    Thread-safe: any number of threads may publish through one producer (their publishes
    are pipelined on its connections). ``start()`` is optional (the first publish starts
    it); ``close()`` or a ``with`` block releases the connections and the loop thread.
    """

    _kind = "Producer"

    @_same_arguments(AsyncProducer.__init__)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._start_loop("smartnsq-producer-loop")
        producer = self._producer = self._build(lambda: _bound(AsyncProducer(*args, **kwargs)))
        config = producer.options.connection_config
        # A publish may connect and look up before its own time limit starts to count.
        self._overhead = 2 * config.connect_timeout + config.request_timeout + _GRACE
        # Publishes make their first try in the calling thread when they can: not when they
        # are auto-batched (the batches are the loop's) or traced with OpenTelemetry (their
        # spans are); a keyed one not when a sharding callable of the user's routes it (it
        # runs on the loop).
        options = producer.options
        self._here = (
            BlockingPublisher(producer.sender, config)
            if options.linger is None and not producer.instrumented
            else None
        )
        self._shards_here = isinstance(options.sharder.strategy, str)

    def start(self) -> Producer:
        """Return once publishing can succeed (see :meth:`smartnsq.Producer.start`)."""
        self._check("start")
        config = self._producer.options.connection_config
        self._runner.run(self._producer.start(), config.connect_timeout + _GRACE, "start()")
        self._mark_started()
        return self

    @_same_arguments(AsyncProducer.publish)
    def publish(self, *args: Any, **kwargs: Any) -> PublishResult:
        """Blocking :meth:`smartnsq.Producer.publish`."""
        runner = self._runner
        if self._state != "started" or getpid() != runner.pid or get_ident() == runner.ident:
            # What _check and _mark_started see once started in this process, in another
            # thread than the loop's, asked inline: two calls less per publish.
            self._check("publish")
            self._mark_started()  # the async producer starts itself on first use
        here = self._here
        if (
            here is not None
            and len(args) == 2
            and kwargs.keys() <= _PUBLISH_KEYWORDS
            and (self._shards_here or kwargs.get("sharding_key") is None)
        ):
            producer = self._producer
            option = kwargs.get
            request, timeout = producer.arguments.message(
                *args,
                option("partition"),
                option("sharding_key"),
                option("trace_id"),
                option("ext"),
                option("delay"),
                option("timeout"),
            )
            return here.publish(request, timeout)[0]
        bound = self._bound(kwargs.get("timeout"))
        return self._runner.run(self._producer.publish(*args, **kwargs), bound, "publish()")

    @_same_arguments(AsyncProducer.publish_many)
    def publish_many(self, *args: Any, **kwargs: Any) -> list[PublishResult]:
        """Blocking :meth:`smartnsq.Producer.publish_many`."""
        self._check("publish_many")
        self._mark_started()
        bound = self._bound(kwargs.get("timeout"))
        coro = self._producer.publish_many(*args, **kwargs)
        return self._runner.run(coro, bound, "publish_many()")

    def stats(self) -> ProducerStats:
        """A snapshot of the counters (see :meth:`smartnsq.Producer.stats`; also after close)."""
        snapshot = self._read(self._producer.stats, "stats()")
        here = self._here
        if here is not None:
            snapshot.connections += here.open_connections()
        return snapshot

    def set_trace(self, enabled: bool, topic: str | None = None) -> None:
        """Turn message tracing on or off (see :meth:`smartnsq.Producer.set_trace`)."""
        producer = self._producer
        self._read(lambda: producer.set_trace(enabled, topic), "set_trace()")

    def tracing(self, topic: str) -> bool:
        """Whether publishes to ``topic`` are traced by default."""
        producer = self._producer
        return self._read(lambda: producer.tracing(topic), "tracing()")

    def _bound(self, timeout: object) -> float:
        limit = self._producer.options.publish_timeout
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0:
            limit = float(timeout)
        return limit + self._overhead

    def close(self) -> None:
        """Close the connections and stop the loop thread. Idempotent; the producer is not
        reusable. Publishes still running in other threads fail."""
        error = self._close(self._abandon(), _GRACE)
        if error is not None:
            raise error

    def _abandon(self) -> Callable[[], Coroutine[Any, Any, None]]:
        here, producer = self._here, self._producer

        async def close_all() -> None:
            if here is not None:
                here.close()
            await producer.close()

        return close_all

    def __enter__(self) -> Producer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _bound(producer: AsyncProducer) -> AsyncProducer:
    """A producer made on its loop thread, its sender bound to that loop: publishes made in
    the callers' threads hand what they cannot end to it."""
    producer.sender.bind(asyncio.get_running_loop())
    return producer


# --------------------------------------------------------------------------- consumer

SyncHandler = Callable[["Message"], Any]
AsyncHandler = Callable[[AsyncMessage], Awaitable[Any]]


class Consumer(_Client):
    """Blocking :class:`smartnsq.Consumer`: the same arguments.

    With a ``handler``, :meth:`run` consumes until :meth:`close` is called (from another
    thread or a signal handler). A plain function handler runs in the consumer's thread pool
    and receives a blocking :class:`Message`; a coroutine function runs on the consumer's
    loop and receives the async ``smartnsq.Message``. Without a handler, iterate:
    ``for msg in consumer: ...; msg.finish()``.

    When the consumer stops by itself (a fatal server error), :meth:`run` or the iteration
    raises that error once and the loop thread is released.
    """

    _kind = "Consumer"

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        handler: SyncHandler | AsyncHandler | None = None,
        on_giving_up: SyncHandler | AsyncHandler | None = None,
        **options: Any,
    ) -> None:
        """``options`` are :class:`smartnsq.Consumer`'s keyword arguments."""
        runner = self._start_loop("smartnsq-consumer-loop")
        on_message = _adapt(handler, runner, is_handler=True)
        give_up = _adapt(on_giving_up, runner, is_handler=False)
        self._consumer = self._build(
            lambda: AsyncConsumer(
                topic, channel, handler=on_message, on_giving_up=give_up, **options
            )
        )
        self._connect_timeout = self._consumer.options.connection_config.connect_timeout
        # Iterating threads take turns on the loop: the async iterator serves one at a time.
        self._next_lock = asyncio.Lock()

    @property
    def topic(self) -> str:
        """The topic consumed."""
        return self._consumer.topic

    @property
    def channel(self) -> str:
        """The channel consumed."""
        return self._consumer.channel

    def start(self) -> Consumer:
        """Discover, connect and subscribe (see :meth:`smartnsq.Consumer.start`). A consumer
        whose start failed is closed (the async one is, too)."""
        self._check("start")
        bound = 2 * self._connect_timeout + _GRACE
        try:
            self._runner.run(self._consumer.start(), bound, "start()")
        except Exception as exc:
            self._stopped_by(exc)
            raise
        self._mark_started()
        return self

    def run(self) -> None:
        """Consume until :meth:`close` is called; raise the error that stopped the consumer,
        if it stopped by itself. Starts the consumer if needed; returns at once if close()
        came first.

        In the main thread, while it runs, SIGTERM (what Docker, Kubernetes and systemd stop
        a program with) closes the consumer: it drains (the handlers finish their messages)
        and run() returns, as it does after close(). A SIGTERM handler the program installed
        itself is left alone, and the previous handler is put back when run() returns."""
        if self._was_started and self._reported is None and self._state in ("closing", "closed"):
            # close() won the race with run(): the consuming run() would wait for is over.
            # A consumer that stopped by an error is not "over" quietly: that is raised below.
            self._wait_closed()
            if self._close_error is None:
                return
        self._check("run")
        try:
            with _close_on_sigterm(self.close):
                if self._state == "new":
                    self.start()
                self._runner.run(self._consumer.join(), None, "run()")
        except ClientClosedError:
            if self._state not in ("closing", "closed"):
                raise
        except Exception as exc:
            self._stopped_by(exc)
            raise
        # close() ended the wait: return once it is over, loop thread included
        self._wait_closed()

    def close(self, timeout: float | None = None) -> None:
        """Drain (see :meth:`smartnsq.Consumer.close`; ``timeout`` None: its default, and
        the bound of the drain as there), then stop the loop thread. Idempotent. Raises the
        error that stopped the consumer unless :meth:`run` or the iteration already raised
        it."""
        drain = _DRAIN_TIMEOUT
        if timeout is not None:
            drain = check_seconds("timeout", timeout, positive=False)
        # the async close() keeps within the drain time; the grace is for a blocked loop
        error = self._close(lambda: self._consumer.close(drain), drain + _GRACE)
        if error is not None and error is not self._reported:
            raise error

    def _stopped_by(self, error: BaseException) -> None:
        """The consumer stopped by itself: ``error`` is being reported to the caller, so
        close() will not raise it again; release the loop thread now."""
        self._reported = error
        if self._state not in ("new", "started"):
            return
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the caller is getting the original error
            log.debug("closing %r after %r failed: %r", self, error, exc)

    def _abandon(self) -> Callable[[], Awaitable[Any]]:
        return self._consumer.close

    # ------------------------------------------------------------------ flow control

    def stats(self) -> ConsumerStats:
        """A snapshot of the counters (also after close)."""
        return self._read(self._consumer.stats, "stats()")

    def is_starved(self) -> bool:
        """See :meth:`smartnsq.Consumer.is_starved`."""
        return self._read(self._consumer.is_starved, "is_starved()")

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change the in-flight budget; 0 pauses consumption."""
        runner = self._runner
        if os.getpid() != runner.pid:
            runner.check("Consumer.set_max_in_flight()")
        if self._state in ("closing", "closed"):
            raise ClientClosedError("this Consumer is closed; create a new one")
        consumer = self._consumer
        # Like the reads, it never waits for the loop's work: allowed on the loop thread.
        runner.call(lambda: consumer.set_max_in_flight(max_in_flight), "set_max_in_flight()")

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Message]:
        self._check("__iter__")
        self._runner.call(self._consumer.__aiter__, "__iter__")  # refuses a handler
        return self

    def __next__(self) -> Message:
        """The next message (blocks until one arrives). Ends when the consumer is closed."""
        self._check("__next__")
        if self._state == "new":
            self.start()
        try:
            message = self._runner.run(
                _next_message(self._consumer, self._next_lock), None, "__next__()"
            )
        except ClientClosedError:
            if self._state not in ("closing", "closed"):
                raise
            message = None
        except Exception as exc:
            self._stopped_by(exc)
            raise
        if message is None:  # closed: end once close() is over, loop thread included
            self._wait_closed()
            raise StopIteration
        return Message(message, self._runner)

    def getmany(self, max_messages: int = 100, timeout: float | None = None) -> list[Message]:
        """Blocking :meth:`smartnsq.Consumer.getmany`: up to ``max_messages`` messages, what
        has arrived or the first ones within ``timeout`` seconds ([] after the timeout, or
        once closed)."""
        self._check("getmany")
        if self._state == "new":
            self.start()

        async def fetch() -> list[AsyncMessage]:
            async with self._next_lock:
                return await self._consumer.getmany(max_messages, timeout)

        try:
            messages = self._runner.run(fetch(), None, "getmany()")
        except ClientClosedError:
            if self._state not in ("closing", "closed"):
                raise
            return []
        except Exception as exc:
            self._stopped_by(exc)
            raise
        return [Message(message, self._runner) for message in messages]

    def __enter__(self) -> Consumer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextlib.contextmanager
def _close_on_sigterm(close: Callable[[], None]) -> Iterator[None]:
    """SIGTERM calls ``close()`` while the block runs: only from the main thread (the only
    one that may install a handler) and only over the default handler (the program's own
    stays); the previous handler is put back."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def on_sigterm(signum: int, frame: object) -> None:
        # close() blocks until the drain is over: run it in a thread of its own, as a
        # close() from another thread, never inside the handler (which interrupts the main
        # thread anywhere, even between checking the loop and handing it run()'s wait).
        log.info("SIGTERM received: closing the consumer (draining)")
        threading.Thread(target=_close_quietly, args=(close,), name="smartnsq-sigterm").start()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _close_quietly(close: Callable[[], None]) -> None:
    """close() for SIGTERM: an error that stopped the consumer is run()'s to raise."""
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - raised by run() in the main thread
        log.debug("closing on SIGTERM: %r", exc)


async def _next_message(consumer: AsyncConsumer, lock: asyncio.Lock) -> AsyncMessage | None:
    async with lock:
        try:
            return await consumer.__anext__()
        except StopAsyncIteration:
            return None


def _adapt(fn: Any, runner: LoopThread, *, is_handler: bool) -> Any:
    """Plain callables get the blocking Message; coroutine functions (and anything that is
    not callable, which the async consumer rejects itself) are passed through."""
    if fn is None or not callable(fn) or is_coroutine_function(fn):
        return fn

    def with_blocking_message(message: AsyncMessage) -> Any:
        result = fn(Message(message, runner))
        if is_handler and inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"handler {fn!r} returned an awaitable but is not a coroutine function: "
                "declare it with async def (it then receives the async smartnsq.Message)"
            )
        return result

    return with_blocking_message


# --------------------------------------------------------------------------- message


# What of smartnsq.Message a blocking Message does not show: the consumer's own bookkeeping
# (the subscription it came by, an ordered requeue waiting) and the raw ext block (``ext``
# and ``tag`` read it). Every other public field has a read-only property below, which a
# unit test (test_forwarding) holds to the async message's fields, both ways.
NOT_FORWARDED = frozenset({"lane", "waiting", "ext_raw", "ext_version"})


class Message:
    """A delivered message whose answers block: :meth:`finish`, :meth:`requeue` and
    :meth:`touch` forward to the async message on the consumer's loop. The fields are those
    of :class:`smartnsq.Message`, read-only."""

    __slots__ = ("_message", "_runner")

    def __init__(self, message: AsyncMessage, runner: LoopThread) -> None:
        self._message = message
        self._runner = runner

    @property
    def body(self) -> bytes:
        """The message body."""
        return self._message.body

    @property
    def id(self) -> bytes:
        """The raw message id (16 bytes)."""
        return self._message.id

    @property
    def attempts(self) -> int:
        """How many times nsqd delivered it (1 the first time)."""
        return self._message.attempts

    @property
    def timestamp(self) -> int:
        """Nanoseconds since the epoch."""
        return self._message.timestamp

    @property
    def topic(self) -> str:
        """The topic it was consumed from."""
        return self._message.topic

    @property
    def channel(self) -> str:
        """The channel it was consumed from."""
        return self._message.channel

    @property
    def partition(self) -> int | None:
        """Its partition (None on classic nsqd)."""
        return self._message.partition

    @property
    def internal_id(self) -> int | None:
        """youzan: the id within its partition (grows monotonically); None on classic nsqd."""
        return self._message.internal_id

    @property
    def trace_id(self) -> int | None:
        """youzan: its trace id (0 when not traced); None on classic nsqd."""
        return self._message.trace_id

    @property
    def offset(self) -> int | None:
        """youzan: its queue offset (ordered and advanced subscriptions), else None."""
        return self._message.offset

    @property
    def raw_size(self) -> int | None:
        """youzan: its size on disk (ordered and advanced subscriptions), else None."""
        return self._message.raw_size

    @property
    def ext(self) -> dict[str, Any] | None:
        """The parsed JSON ext header (youzan ext topics), or None."""
        return self._message.ext

    @property
    def tag(self) -> str | None:
        """The dispatch tag (``##client_dispatch_tag`` or a legacy tag ext), if any."""
        return self._message.tag

    @property
    def address(self) -> str:
        """``host:port`` of the nsqd that delivered it."""
        return self._message.address

    @property
    def responded(self) -> bool:
        """Whether it has been answered (finished or requeued)."""
        return self._message.responded

    @_same_arguments(AsyncMessage.finish)
    def finish(self, *args: Any, **kwargs: Any) -> None:
        """Blocking :meth:`smartnsq.Message.finish` (FIN)."""
        self._runner.check("Message.finish()")
        return self._runner.run(self._message.finish(*args, **kwargs), _GRACE, "finish()")

    @_same_arguments(AsyncMessage.requeue)
    def requeue(self, *args: Any, **kwargs: Any) -> None:
        """Blocking :meth:`smartnsq.Message.requeue` (REQ)."""
        self._runner.check("Message.requeue()")
        return self._runner.run(self._message.requeue(*args, **kwargs), _GRACE, "requeue()")

    @_same_arguments(AsyncMessage.touch)
    def touch(self, *args: Any, **kwargs: Any) -> None:
        """Blocking :meth:`smartnsq.Message.touch` (TOUCH)."""
        self._runner.check("Message.touch()")
        return self._runner.run(self._message.touch(*args, **kwargs), _GRACE, "touch()")

    def __enter__(self) -> Message:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """``with message:`` finishes the message when the block ends, or requeues it (with
        the backoff) when the block raises: the exception is logged and counted like a
        handler's, and does not propagate (see :meth:`smartnsq.Message.__aexit__`)."""
        message = self._message
        answerer = message.lane.answerer
        return self._runner.call(lambda: answerer.exit_context(message, exc), "__exit__()")

    def __repr__(self) -> str:
        return f"<sync {self._message!r}>"
