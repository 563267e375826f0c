"""The lookup manager: where topics live, kept fresh from every nsqlookupd (its ``/lookup``
and ``/listlookup``, ``nsqlookupd/http.go``).

A *round* for one (topic, access):

1. discovery: ``GET /listlookup`` on the known lookupds (shared by all topics, coalesced and
   rate-limited); the known set is the seeds plus every ``NodeIP:HttpPort`` listed. A failure,
   or a 404 from a classic lookupd, keeps the current set; seeds are never removed;
2. ``GET /lookup?topic=T&access=r|w&metainfo=true`` on every healthy lookupd concurrently
   (until a discovery has ended, the known lookupds are asked beside it and those it adds
   once it ends, so that a new client's first lookup waits for one round trip, not two);
3. merge (:func:`smartnsq.protocol.lookupd.merge_layouts`): union of the nodes, and for each
   partition the leader most lookupds agree on, ties going to the answer received last.

Both youzan SDKs ask a single lookupd per round; asking all of them and voting hides a lookupd
whose registry lags behind a leader change.

Every request is bounded (:func:`smartnsq.transport.httpclient.exchange`): its whole answer
within ``timeout`` (a total deadline: a lookupd trickling its answer cannot hold a round) and at
most ``max_answer_bytes`` of it. A lookupd that fails (transport error, timeout, an answer too
large, a 5xx that is not an nsqlookupd answer, a body that does not parse) is skipped by lookups
for an exponentially growing time (1 s doubling up to 60 s by default, on the injected clock);
when every lookupd is being skipped they are all tried anyway, and the periodic poll asks every
lookupd whatever its state, so one that failed is asked again at the next poll. A success resets
the backoff. Failures are logged at WARNING once per ``log_interval`` per lookupd, with the
count of the records held back.

Concurrent refreshes of the same (topic, access) share one round, and a refresh less than
``refresh_min_interval`` after the previous round finished reuses that round's result. Tracked
topics are refreshed in the background every ``poll_interval`` (± ``poll_jitter``), and
:meth:`LookupManager.watch` callbacks see every layout that differs from the previous one.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from smartnsq.errors import (
    ClientClosedError,
    ConnectionClosedError,
    LookupFailedError,
    NotHttpError,
    NotLookupdError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    TopicHasNoChannelError,
    TopicNotFoundError,
    ValidationError,
)
from smartnsq.flow.backoff import exponential
from smartnsq.flow.logthrottle import LogThrottle
from smartnsq.protocol.lookupd import (
    ACCEPT_V1,
    TOPIC_NOT_FOUND,
    Access,
    LookupdHTTPError,
    LookupdNode,
    Node,
    TopicLayout,
    _check_access,
    join_host_port,
    merge_layouts,
    parse_listlookup,
    parse_lookup,
    parse_node,
    unwrap_response,
)
from smartnsq.protocol.validation import check_topic
from smartnsq.routing.addresses import AddressMap, AddressMapping
from smartnsq.transport.httpclient import (
    DEFAULT_MAX_ANSWER_BYTES,
    HttpClient,
    exchange,
    new_http_client,
)
from smartnsq.transport.plainhttp import InvalidURL

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_LOOKUPD_PORT",
    "DEFAULT_TIMEOUT",
    "LookupManager",
    "LookupdAnswer",
    "WatchCallback",
    "normalize_seed",
]

DEFAULT_LOOKUPD_PORT = 4161
#: The bound of one exchange with an nsqlookupd, its whole answer included (seconds).
DEFAULT_TIMEOUT = 5.0

WatchCallback = Callable[[TopicLayout], Awaitable[None] | None]
Sleep = Callable[[float], Awaitable[object]]
_Key = tuple[str, Access]

# wait_until's rounds are at least this far apart, even with refresh_min_interval=0.
_MIN_WAIT_STEP = 0.05


class _InvalidURL(Exception):
    """The request's URL was refused before anything was sent (``httpx.InvalidURL``, or the
    plain-http client's): an address no URL holds."""


# What a lookupd that is down or broken raises; anything else is a bug and propagates.
_FAILURES = (ConnectionClosedError, NSQTimeoutError, ProtocolError, _InvalidURL)


class _ServerFault(ProtocolError):
    """A 5xx answer that is not nsqlookupd's own (a proxy, a server in trouble): retried."""


def normalize_seed(seed: object, field: str = "seeds") -> tuple[str, str]:
    """An nsqlookupd address, ``"host:port"`` (port 4161 when omitted) or
    ``"http(s)://host:port"``, as (``host:port``, base URL); ValidationError otherwise,
    naming ``field`` (the caller's argument: ``lookupd`` for a client)."""
    if not isinstance(seed, str) or not seed.strip():
        raise ValidationError(field, f"each address must be a non-empty str, not {seed!r}")
    text = seed.strip()
    if "://" not in text:
        text = f"http://{text}"
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValidationError(field, f"{seed!r}: the scheme must be http or https")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValidationError(field, f"{seed!r}: expected host:port or http://host:port")
    try:
        port = parts.port
    except ValueError as exc:
        raise ValidationError(field, f"{seed!r}: invalid port") from exc
    host = parts.hostname
    if not host:
        raise ValidationError(field, f"{seed!r}: missing host")
    if port == 0:
        raise ValidationError(field, f"{seed!r}: port must be 1..65535")
    address = join_host_port(host, port or DEFAULT_LOOKUPD_PORT)
    return address, f"{parts.scheme}://{address}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (ConnectionClosedError, _InvalidURL)) and exc.__cause__ is not None:
        exc = exc.__cause__  # what the request met (the URL is said beside it)
    if isinstance(exc, _ServerFault):
        return str(exc)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_retriable(exc: BaseException) -> bool:
    # Nothing answered, or a 5xx that is not nsqlookupd's (see _get_once); not a timeout,
    # which used the whole of the request's time.
    return isinstance(exc, (ConnectionClosedError, _ServerFault))


def _retrieve(task: asyncio.Task[object]) -> None:
    """Mark a shared task's exception as retrieved (every caller may have gone away)."""
    if not task.cancelled():
        task.exception()


@dataclass(eq=False)
class _Lookupd:
    address: str
    base_url: str
    seed: bool
    failures: int = 0
    retry_at: float = 0.0
    last_error: str = ""
    classic: bool = False  # answered /listlookup with a 404: a classic nsqlookupd
    # answered once (anything, even a broken answer): its failures are news (a WARNING); a
    # lookupd never heard from is one a client was started before (its client says so)
    answered: bool = False
    not_lookupd: str = ""  # why it is not an nsqlookupd at all (an nsqd's HTTP port...)


@dataclass(eq=False, slots=True)
class _Waiter:
    """One caller of :meth:`LookupManager.wait_until`: what it waits for, until when (on the
    manager's clock), and the future its answer goes to."""

    predicate: Callable[[TopicLayout], bool]
    until: float
    answer: asyncio.Future[TopicLayout | None]


class _Waiting:
    """The callers waiting for a layout of one (topic, access), and the one task that asks
    the lookupds for them, round after round."""

    __slots__ = ("task", "waiters", "wake", "wake_at")

    def __init__(self) -> None:
        self.waiters: dict[_Waiter, None] = {}  # insertion-ordered; O(1) removal
        self.task: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()  # a waiter that must not wait for the next round
        self.wake_at = float("inf")  # when the sleeping task looks again by itself


@dataclass(eq=False)
class _Watcher:
    callback: WatchCallback


@dataclass
class _Answer:
    """One lookupd's answer in a round; ``seq`` orders answers by arrival."""

    lookupd: str
    layout: TopicLayout | None = None
    error: LookupdHTTPError | None = None
    failure: str = ""
    seq: int = 0


@dataclass(frozen=True)
class LookupdAnswer:
    """One lookupd's answer to :meth:`LookupManager.lookup_each`."""

    lookupd: str
    layout: TopicLayout | None
    error: str = ""  # what the lookupd answered instead of a layout
    failure: str = ""  # why it did not answer (transport error, bad body...)
    topic_not_found: bool = False


class LookupManager:
    """Finds and tracks topic layouts through every reachable nsqlookupd.

    ``seeds``: nsqlookupd HTTP addresses, ``"host:port"`` (port 4161 when omitted) or
    ``"http://host:port"``. ``timeout``: the bound of one request to a lookupd, its retry and its
    whole answer included (5 s); ``max_answer_bytes``: the largest answer read (4 MiB; a larger one
    is a failure of that lookupd); ``log_interval``: a lookupd's failures are logged once per
    interval, with a count. ``http_client``: an httpx client to use instead of the manager's own
    (the caller closes it); ``transport``: an httpx transport for the manager's own client.
    ``clock``, ``rand`` and ``sleep`` drive backoff, jitter and polling, so tests can control time.
    ``address_map``: a dict ``{"host:port": "host:port"}`` or a function ``(address) -> address``
    (see :class:`~smartnsq.routing.addresses.AddressMap`) applied to every nsqd address (TCP and
    HTTP) the lookups return and every nsqlookupd ``/listlookup`` lists: what a client outside
    Docker or NAT needs to reach nodes that announce inner addresses.

    Bound to the event loop lazily: nothing loop-bound is created before the first call.
    """

    def __init__(
        self,
        seeds: Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        log_interval: float = 10.0,
        poll_interval: float = 60.0,
        poll_jitter: float = 0.3,
        refresh_min_interval: float = 0.25,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        http_attempts: int = 2,
        http_retry_wait: float = 0.1,
        clock: Callable[[], float] | None = None,
        rand: Callable[[], float] = random.random,
        sleep: Sleep = asyncio.sleep,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        logger: logging.Logger | None = None,
        address_map: AddressMapping | None = None,
    ) -> None:
        self._address_map = AddressMap.of(address_map)
        if isinstance(seeds, str) or not isinstance(seeds, Sequence):
            raise ValidationError("seeds", "must be a sequence of addresses (a list, not a str)")
        if not seeds:
            raise ValidationError("seeds", "at least one nsqlookupd address is required")
        _positive("poll_interval", poll_interval)
        _positive("timeout", timeout)
        _positive("log_interval", log_interval)
        if type(max_answer_bytes) is not int or max_answer_bytes < 1:
            raise ValidationError("max_answer_bytes", "must be an int >= 1 (bytes)")
        if not 0 <= poll_jitter < 1:
            raise ValidationError("poll_jitter", "must be in [0, 1)")
        _non_negative("refresh_min_interval", refresh_min_interval)
        _positive("backoff_base", backoff_base)
        _positive("backoff_max", backoff_max)
        _non_negative("http_retry_wait", http_retry_wait)
        if type(http_attempts) is not int or http_attempts < 1:
            raise ValidationError("http_attempts", "must be an int >= 1")
        if http_client is not None and transport is not None:
            raise ValidationError("transport", "give either http_client or transport, not both")

        self._lookupds: dict[str, _Lookupd] = {}
        for seed in seeds:
            address, base_url = normalize_seed(seed)
            self._lookupds.setdefault(address, _Lookupd(address, base_url, seed=True))

        self._timeout = float(timeout)
        self._max_answer_bytes = max_answer_bytes
        self._log_throttle = LogThrottle(float(log_interval), clock)
        self._poll_interval = float(poll_interval)
        self._poll_jitter = float(poll_jitter)
        self._refresh_min_interval = float(refresh_min_interval)
        self._backoff_base = float(backoff_base)
        self._backoff_max = float(backoff_max)
        self._http_attempts = http_attempts
        self._http_retry_wait = float(http_retry_wait)
        # Read from the time module when made (a simulation stands in for its clocks).
        self._clock = clock if clock is not None else time.monotonic
        self._rand = rand
        self._sleep = sleep
        self._client: HttpClient | httpx.AsyncClient | None = http_client
        self._owns_client = http_client is None
        self._transport = transport
        self._logger = logger if logger is not None else logging.getLogger("smartnsq.lookup")

        self._cache: dict[_Key, TopicLayout] = {}
        # The same layouts by topic, per access: what cached_getter() reads (in step with
        # _cache: every change of one is made to the other).
        self._by_access: dict[str, dict[str, TopicLayout]] = {"r": {}, "w": {}}
        self._topic_errors: dict[_Key, NSQError] = {}
        self._round_end: dict[_Key, float] = {}
        self._forced_end: dict[_Key, float] = {}
        self._inflight: dict[_Key, asyncio.Task[TopicLayout]] = {}
        self._tracked: dict[_Key, float] = {}  # key -> when its next periodic refresh is due
        self._watchers: dict[_Key, list[_Watcher]] = {}
        self._waiting: dict[_Key, _Waiting] = {}
        self._discovery: asyncio.Task[None] | None = None
        self._discovery_end: float | None = None
        self._poller: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._poll_deadline = float("-inf")  # when the sleeping poller wakes up by itself
        self._seq = itertools.count(1)
        self._closed = False

    # ------------------------------------------------------------------ public API

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def address_map(self) -> AddressMap:
        """The map applied to every address the lookupds return (empty: none)."""
        return self._address_map

    @property
    def lookupd_addresses(self) -> tuple[str, ...]:
        """Every known nsqlookupd (seeds first, then discovered), as ``host:port``."""
        return tuple(self._lookupds)

    async def lookup(self, topic: str, access: Access = "r") -> TopicLayout:
        """The layout of ``topic``: the cached one if known, otherwise one refresh round.

        Raises TopicNotFoundError, TopicHasNoChannelError (write lookups of a topic without a
        channel) or LookupFailedError (no lookupd answered and nothing is cached).
        """
        key = self._key(topic, access)
        self._track(key)
        self._start_poller()
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        return await self._refresh(key)

    def cached(self, topic: str, access: Access = "r") -> TopicLayout | None:
        """The cached layout, without waiting (None if unknown): the publish fast path."""
        return self._cache.get((topic, access))

    def cached_getter(self, access: Access) -> Callable[[str], TopicLayout | None]:
        """``cached`` for one ``access``, as a function of the topic alone: a dict's own
        ``get`` (a publish reads it each time; a Python call would cost as much again)."""
        return self._by_access[access].get

    async def refresh(self, topic: str, access: Access = "r") -> TopicLayout:
        """Ask the lookupds again (coalesced with a round in flight, rate-limited).

        When no lookupd answers and a layout is cached, the cached layout is returned (and a
        warning logged); LookupFailedError is raised only when nothing is cached.
        """
        key = self._key(topic, access)
        self._track(key)
        self._start_poller()
        return await self._refresh(key, forced=True)

    async def wait_until(
        self,
        topic: str,
        access: Access,
        predicate: Callable[[TopicLayout], bool],
        timeout: float,
    ) -> TopicLayout | None:
        """Ask the lookupds again until a layout satisfies ``predicate`` (returned) or
        ``timeout`` seconds pass (None); at least once, even with ``timeout`` 0.

        What a publish waiting for a partition's new leader does: concurrent waiters share
        each round (forced refreshes, coalesced), and rounds are ``refresh_min_interval``
        apart, so a leader is seen about that soon after nsqlookupd names it. A round that
        fails is waited out like one that does not satisfy ``predicate``."""
        key = self._key(topic, access)
        self._track(key)
        self._start_poller()
        # Every caller waiting for this key shares one task that asks in rounds: a waiter is
        # a predicate and a future, whatever the number (a failover can have thousands of
        # publishes waiting for one partition's leader).
        loop = asyncio.get_running_loop()
        waiter = _Waiter(predicate, self._clock() + timeout, loop.create_future())
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = _Waiting()
        waiting.waiters[waiter] = None
        if waiting.task is None or waiting.task.done():
            waiting.task = loop.create_task(
                self._wait_rounds(key, waiting), name=f"smartnsq-lookup-wait-{key[0]}"
            )
        elif waiter.until < waiting.wake_at:
            waiting.wake.set()  # sooner than the next round: one for it now
        try:
            return await waiter.answer
        finally:
            waiting.waiters.pop(waiter, None)

    async def _wait_rounds(self, key: _Key, waiting: _Waiting) -> None:
        """Rounds of forced refreshes for the waiters of ``key``, ``refresh_min_interval``
        apart (sooner for a waiter whose time ends first), each waiter answered with the first
        layout that satisfies its predicate, or None once its time is up (after one round at
        least)."""
        step = max(self._refresh_min_interval, _MIN_WAIT_STEP)
        waiters = waiting.waiters
        try:
            while waiters:
                waiting.wake.clear()
                layout: TopicLayout | None = None
                try:
                    layout = await self._refresh(key, forced=True)
                except (LookupFailedError, TopicNotFoundError, TopicHasNoChannelError) as exc:
                    self._logger.debug("waiting for a layout of %r (access=%s): %s", *key, exc)
                now = self._clock()
                for waiter in list(waiters):
                    if waiter.answer.done():
                        continue
                    if layout is not None and waiter.predicate(layout):
                        waiter.answer.set_result(layout)
                    elif waiter.until <= now:
                        waiter.answer.set_result(None)
                pending = [waiter.until for waiter in waiters if not waiter.answer.done()]
                if not pending:
                    break
                delay = min(step, max(0.0, min(pending) - now))
                waiting.wake_at = now + delay
                if not waiting.wake.is_set():
                    await self._idle_or_woken(waiting.wake, delay)
                waiting.wake_at = float("inf")
        except BaseException as exc:
            error = exc if isinstance(exc, NSQError) else None
            if error is None and self._closed:
                error = ClientClosedError("the LookupManager was closed during the wait")
            for waiter in waiters:
                if not waiter.answer.done():
                    if error is None:
                        waiter.answer.cancel()
                    else:
                        waiter.answer.set_exception(error)
            if not isinstance(exc, (asyncio.CancelledError, NSQError)):
                raise
        finally:
            if self._waiting.get(key) is waiting and not waiters:
                del self._waiting[key]

    async def _idle_or_woken(self, wake: asyncio.Event, delay: float) -> None:
        """Sleep ``delay`` with the injected sleep, or less if ``wake`` is set meanwhile."""
        sleeper = asyncio.ensure_future(self._sleep(delay))
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            woken.cancel()
            await asyncio.gather(sleeper, woken, return_exceptions=True)

    def watch(self, topic: str, access: Access, callback: WatchCallback) -> Callable[[], None]:
        """Call ``callback(layout)`` (sync or async) whenever a refresh, periodic or forced,
        produces a layout different from the previous one. Returns the function that stops it.

        Callbacks run inside the refresh round, in registration order; keep them short.
        Exceptions they raise are logged and ignored. The first call comes with the first
        layout obtained after ``watch`` if none was cached, or with the first change.
        """
        key = self._key(topic, access)
        watcher = _Watcher(callback)
        self._watchers.setdefault(key, []).append(watcher)
        if key not in self._tracked:
            # Nothing known yet (only tracked keys are ever cached): due at once, so the
            # poller fetches it without waiting.
            self._schedule(key, self._clock())
        self._start_poller()

        def unwatch() -> None:
            watchers = self._watchers.get(key)
            if watchers is not None and watcher in watchers:
                watchers.remove(watcher)
                if not watchers:
                    del self._watchers[key]

        return unwatch

    async def discover(self) -> tuple[str, ...]:
        """Ask the lookupds for each other (``/listlookup``) and return the known addresses.

        Raises :class:`LookupFailedError` when no lookupd answers: how a client's
        ``start()`` proves that lookups can work before any topic is named.
        """
        self._check_open()
        await self._discover()
        lookupds = list(self._lookupds.values())
        wrong = [lookupd for lookupd in lookupds if lookupd.not_lookupd]
        if wrong and len(wrong) == len(lookupds):
            raise NotLookupdError("; ".join(lookupd.not_lookupd for lookupd in wrong))
        if all(lookupd.failures for lookupd in self._lookupds.values()):
            details = "; ".join(
                f"{lookupd.address}: {lookupd.last_error}" for lookupd in self._lookupds.values()
            )
            raise LookupFailedError(f"no nsqlookupd answered: {details}")
        return self.lookupd_addresses

    async def lookup_each(self, topic: str, access: Access = "r") -> list[LookupdAnswer]:
        """Every known lookupd's own answer, unmerged and uncached (after discovery): for
        tools that show where lookupds disagree. A lookupd that fails is reported, not
        raised; an unknown topic is an answer with ``topic_not_found``."""
        topic, access = self._key(topic, access)
        await self._discover()
        targets = list(self._lookupds.values())
        answers = await asyncio.gather(*(self._lookup_one(t, topic, access) for t in targets))
        return [
            LookupdAnswer(
                a.lookupd,
                a.layout,
                "" if a.error is None else str(a.error.to_exception(topic)),
                a.failure,
                a.error is not None and a.error.topic_not_found,
            )
            for a in answers
        ]

    async def poll_once(self) -> int:
        """Refresh every tracked (topic, access) whose periodic refresh is due; return how
        many were. The background poller calls this; it is public for embedding and tests."""
        self._check_open()
        now = self._clock()
        due = [key for key, when in self._tracked.items() if when <= now]
        for key in due:
            # A placeholder in case the refresh is rate-limited; a round reschedules with jitter.
            self._schedule(key, now + self._poll_interval)
        if due:
            await asyncio.gather(*(self._poll_key(key) for key in due))
        return len(due)

    async def close(self) -> None:
        """Stop the background poller and in-flight rounds, close the manager's own HTTP
        client. Idempotent; the manager cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        current = asyncio.current_task()
        tasks: list[asyncio.Task[object]] = []
        waits = [waiting.task for waiting in self._waiting.values()]
        for task in (self._poller, self._discovery, *self._inflight.values(), *waits):
            if task is not None and task is not current and not task.done():
                task.cancel()
                tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._poller = None
        self._discovery = None
        self._inflight.clear()
        self._watchers.clear()
        self._tracked.clear()
        client, self._client = self._client, None
        if client is not None and self._owns_client:
            await client.aclose()

    async def __aenter__(self) -> LookupManager:
        self._check_open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ rounds

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the LookupManager is closed")

    def _key(self, topic: str, access: object) -> _Key:
        self._check_open()
        return check_topic(topic), _check_access(access)

    def _interval(self) -> float:
        jitter = self._poll_jitter * (2.0 * self._rand() - 1.0)
        return self._poll_interval * (1.0 + jitter)

    def _next_due(self) -> float:
        return self._clock() + self._interval()

    def _track(self, key: _Key) -> None:
        if key not in self._tracked:
            # A placeholder: the round that follows reschedules from its own end.
            self._schedule(key, self._clock() + self._poll_interval)

    def _schedule(self, key: _Key, when: float) -> None:
        """Set when ``key`` is next refreshed; wake the poller if that is before its alarm."""
        self._tracked[key] = when
        if self._wake is not None and when < self._poll_deadline:
            self._wake.set()

    async def _refresh(
        self, key: _Key, *, forced: bool = False, periodic: bool = False
    ) -> TopicLayout:
        task = self._inflight.get(key)
        if task is None:
            # A forced refresh (a client saw a stale layout) is spaced from the previous
            # forced one only: the round that just filled the cache may be the stale one.
            end = (self._forced_end if forced else self._round_end).get(key)
            if end is not None and self._clock() - end < self._refresh_min_interval:
                cached = self._cache.get(key)
                if cached is not None:
                    return cached
                error = self._topic_errors.get(key)
                if error is not None:
                    raise error.with_traceback(None)
            task = asyncio.get_running_loop().create_task(
                self._round(key, periodic), name=f"smartnsq-lookup-{key[0]}-{key[1]}"
            )
            task.add_done_callback(_retrieve)
            self._inflight[key] = task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if self._closed and task.cancelled():
                raise ClientClosedError("the LookupManager was closed during the lookup") from None
            raise
        finally:
            if forced:
                self._forced_end[key] = self._clock()

    async def _round(self, key: _Key, periodic: bool = False) -> TopicLayout:
        topic, access = key
        self._topic_errors.pop(key, None)  # remembered for one round only
        try:
            layout = await self._query(topic, access, periodic)
        except (TopicNotFoundError, TopicHasNoChannelError) as exc:
            # A definitive answer: forget the old layout so lookup() asks again next time.
            self._cache.pop(key, None)
            self._by_access[access].pop(topic, None)
            self._topic_errors[key] = exc
            raise
        except LookupFailedError as exc:
            cached = self._cache.get(key)
            if cached is None:
                raise
            self._warn(("stale", key), "%s; serving the cached layout of %r (access=%s)", exc, *key)
            return cached
        finally:
            if self._inflight.get(key) is asyncio.current_task():
                del self._inflight[key]
            self._round_end[key] = self._clock()
            if key in self._tracked:
                self._schedule(key, self._next_due())
        previous = self._cache.get(key)
        self._cache[key] = layout
        self._by_access[access][topic] = layout
        if layout != previous:
            self._logger.debug(
                "layout of %r (access=%s) changed: %s", topic, access, _summary(layout)
            )
            await self._notify(key, layout)
        return layout

    async def _query(self, topic: str, access: Access, periodic: bool = False) -> TopicLayout:
        targets, answers = await self._ask(topic, access, periodic)
        layouts = sorted((a for a in answers if a.layout is not None), key=lambda a: a.seq)
        if layouts:
            return merge_layouts(topic, access, [a.layout for a in layouts if a.layout is not None])
        errors = [a.error for a in answers if a.error is not None]
        if any(e.topic_has_no_channel for e in errors):
            raise TopicHasNoChannelError(topic)
        if access == "w" and errors and all(e.message.strip() == TOPIC_NOT_FOUND for e in errors):
            # Classic NSQ creates a topic on its first PUB to any nsqd: publish there.
            bootstrap = await self._classic_nodes(topic, [t for t in targets if t.classic])
            if bootstrap is not None:
                return bootstrap
        for error in errors:
            if error.topic_not_found:
                raise error.to_exception(topic)
        details = "; ".join(
            [f"{a.lookupd}: {a.error or a.failure}" for a in answers]
            + [
                f"{lookupd.address}: not asked, backing off after {lookupd.last_error}"
                for lookupd in self._lookupds.values()
                if lookupd not in targets
            ]
        )
        raise LookupFailedError(
            f"no nsqlookupd answered the lookup of topic {topic!r} (access={access}): {details}"
        )

    async def _ask(
        self, topic: str, access: Access, periodic: bool
    ) -> tuple[list[_Lookupd], list[_Answer]]:
        """The lookupds this round asks, and their answers. Discovery comes first, and the
        lookupds it lists are asked; but until a discovery has ended, the known ones (the
        seeds) are asked beside it, so that a new client's first lookup waits for one round
        trip and not two. Those it adds are asked once it ends; the answers of those it drops,
        or finds not to be nsqlookupds, are left out, as if they had not been asked."""
        if self._discovery_end is not None:
            await self._discover()
            targets = self._pick(every=periodic)
            self._log_lookup(topic, access, targets)
            answers = await asyncio.gather(*(self._lookup_one(t, topic, access) for t in targets))
            return targets, answers
        early = self._pick(every=periodic)
        self._log_lookup(topic, access, early)
        asked = [asyncio.ensure_future(self._lookup_one(t, topic, access)) for t in early]
        try:
            await self._discover()
        except BaseException:
            for task in asked:
                task.cancel()
            raise
        current = self._pick(every=periodic)
        later = [lookupd for lookupd in current if lookupd not in early]
        if later:
            self._log_lookup(topic, access, later)
        answers = await asyncio.gather(*asked, *(self._lookup_one(t, topic, access) for t in later))
        kept = [
            (lookupd, answer)
            for lookupd, answer in zip(early + later, answers, strict=True)
            if lookupd in current
            or (self._lookupds.get(lookupd.address) is lookupd and not lookupd.not_lookupd)
        ]
        return [lookupd for lookupd, _ in kept], [answer for _, answer in kept]

    def _log_lookup(self, topic: str, access: Access, targets: list[_Lookupd]) -> None:
        self._logger.debug(
            "lookup of %r (access=%s) on %s", topic, access, ", ".join(t.address for t in targets)
        )

    async def _classic_nodes(self, topic: str, lookupds: list[_Lookupd]) -> TopicLayout | None:
        """A write layout of every nsqd that classic lookupds know (``GET /nodes``)."""
        nodes: dict[Node, None] = {}
        for lookupd in lookupds:
            try:
                payload = await self._get(lookupd, "/nodes", None)
                if isinstance(payload, LookupdHTTPError) or not isinstance(payload, dict):
                    continue
                for index, peer in enumerate(payload.get("producers") or []):
                    node = parse_node(peer, f"producers[{index}]")
                    nodes[self._address_map.node(node)] = None
            except _FAILURES as exc:
                self._mark_failed(lookupd, exc)
        if not nodes:
            return None
        self._logger.info(
            "topic %r is new: publishing to any of the %d classic nsqd nodes", topic, len(nodes)
        )
        return TopicLayout(topic, "w", classic_nodes=tuple(nodes))

    async def _lookup_one(self, lookupd: _Lookupd, topic: str, access: Access) -> _Answer:
        params = {"topic": topic, "access": access, "metainfo": "true"}
        try:
            payload = await self._get(lookupd, "/lookup", params)
            if isinstance(payload, LookupdHTTPError):
                self._mark_ok(lookupd)
                self._logger.debug("nsqlookupd %s: %s", lookupd.address, payload)
                return _Answer(lookupd.address, error=payload)
            layout = self._address_map.layout(parse_lookup(topic, access, payload))
        except _FAILURES as exc:
            self._mark_failed(lookupd, exc)
            return _Answer(lookupd.address, failure=_describe(exc))
        self._mark_ok(lookupd)
        return _Answer(lookupd.address, layout=layout, seq=next(self._seq))

    # ------------------------------------------------------------------ discovery

    async def _discover(self) -> None:
        task = self._discovery
        if task is None or task.done():
            end = self._discovery_end
            if end is not None and self._clock() - end < self._refresh_min_interval:
                return
            task = asyncio.get_running_loop().create_task(
                self._discover_round(), name="smartnsq-lookup-discovery"
            )
            self._discovery = task
        await asyncio.shield(task)

    async def _discover_round(self) -> None:
        try:
            targets = self._pick()
            results = await asyncio.gather(*(self._listlookup(t) for t in targets))
        finally:
            self._discovery_end = self._clock()
        answered = [nodes for nodes in results if nodes is not None]
        if not answered:
            return
        discovered = {node.http_address: node for nodes in answered for node in nodes}
        known = {
            address: lookupd
            for address, lookupd in self._lookupds.items()
            if lookupd.seed or address in discovered
        }
        for address in discovered:
            if address not in known:
                known[address] = _Lookupd(address, f"http://{address}", seed=False)
        if list(known) != list(self._lookupds):
            self._logger.debug("nsqlookupds: %s", ", ".join(known))
        self._lookupds = known

    async def _listlookup(self, lookupd: _Lookupd) -> tuple[LookupdNode, ...] | None:
        """The lookupds ``lookupd`` lists, or None when it cannot tell (failure, old lookupd)."""
        try:
            payload = await self._get(lookupd, "/listlookup", None, tolerate_404=True)
            if isinstance(payload, LookupdHTTPError):
                # A classic nsqlookupd has no /listlookup (404); keep what we know. So has an
                # nsqd's HTTP port, or another web service: /info tells them apart.
                if not lookupd.classic:
                    lookupd.not_lookupd = await self._not_lookupd(lookupd)
                    if lookupd.not_lookupd:
                        self._logger.warning("%s", lookupd.not_lookupd)
                lookupd.classic = True
                self._mark_ok(lookupd)
                self._logger.debug("nsqlookupd %s: no /listlookup (%s)", lookupd.address, payload)
                return None
            _, nodes = parse_listlookup(payload)
        except _FAILURES as exc:
            self._mark_failed(lookupd, exc)
            return None
        self._mark_ok(lookupd)
        if self._address_map:
            nodes = tuple(dict.fromkeys(self._address_map.lookupd(node) for node in nodes))
        return nodes

    async def _not_lookupd(self, lookupd: _Lookupd) -> str:
        """Why ``lookupd`` is not an nsqlookupd ("" if it may well be one), from ``/info``:
        nsqd's names its TCP and HTTP ports, an nsqlookupd's does not."""
        where = lookupd.base_url
        try:
            info = await self._get(lookupd, "/info", None)
        except _ServerFault:
            return ""  # a server in trouble says nothing about what it is
        except ProtocolError as exc:
            return (
                f"{where} is not an nsqlookupd: it answers HTTP, but not as nsqlookupd does "
                f"({exc}); give nsqlookupd's HTTP address (default port 4161)"
            )
        except _FAILURES:
            return ""  # not answering now says nothing about what it is
        if isinstance(info, dict) and "tcp_port" in info:
            return (
                f"{where} is an nsqd's HTTP address, not an nsqlookupd: give nsqlookupd's HTTP "
                f"address (default port 4161), or nsqd=['{_nsqd_tcp(lookupd, info)}'] to use "
                "that classic nsqd directly"
            )
        return ""

    # ------------------------------------------------------------------ health

    def _pick(self, every: bool = False) -> list[_Lookupd]:
        """The lookupds to ask now: the healthy ones, or all when none is or ``every`` (the
        periodic poll) says so; never an address found not to be an nsqlookupd, unless there
        is no other."""
        now = self._clock()
        candidates = [lookupd for lookupd in self._lookupds.values() if not lookupd.not_lookupd]
        candidates = candidates or list(self._lookupds.values())
        if every:
            return candidates
        healthy = [lookupd for lookupd in candidates if lookupd.retry_at <= now]
        return healthy or candidates

    def _mark_ok(self, lookupd: _Lookupd) -> None:
        lookupd.answered = True
        if lookupd.failures:
            self._logger.info("nsqlookupd %s is answering again", lookupd.address)
        lookupd.failures = 0
        lookupd.retry_at = 0.0
        lookupd.last_error = ""

    def _mark_failed(self, lookupd: _Lookupd, exc: BaseException) -> None:
        lookupd.last_error = _describe(exc)
        if not isinstance(exc, (ConnectionClosedError, NSQTimeoutError)):
            lookupd.answered = True  # it answers, but not as it should
        now = self._clock()
        if lookupd.retry_at <= now:
            lookupd.failures += 1
            delay = exponential(lookupd.failures, self._backoff_base, self._backoff_max)
            lookupd.retry_at = now + delay
        # else: tried early (every lookupd down-ranked, or a poll): keep the current backoff.
        if isinstance(exc, NotHttpError):
            # nsqd's TCP port: asking it again would only get the same refusal.
            if not lookupd.not_lookupd:
                lookupd.not_lookupd = (
                    f"{lookupd.base_url} is an nsqd's TCP address, not an nsqlookupd (it "
                    "answered E_BAD_PROTOCOL): give nsqlookupd's HTTP address (default port "
                    f"4161), or nsqd=['{lookupd.address}'] to use that classic nsqd directly"
                )
                self._logger.warning("%s", lookupd.not_lookupd)
            return
        if not lookupd.answered:
            # Never heard from yet (a client started before its nsqlookupd): the client
            # that waits for it says so once; here it is detail.
            self._logger.debug("nsqlookupd %s failed: %s", lookupd.address, lookupd.last_error)
            return
        self._warn(
            ("failed", lookupd.address),
            "nsqlookupd %s failed (%s; %d in a row); lookups skip it for %.1f s",
            lookupd.address,
            lookupd.last_error,
            lookupd.failures,
            max(0.0, lookupd.retry_at - now),
        )

    def _warn(self, kind: object, message: str, *args: object) -> None:
        """A WARNING, once per ``log_interval`` per ``kind``, with the count held back."""
        held = self._log_throttle.allow(kind)
        if held is not None:
            note = LogThrottle.note(held, self._log_throttle.interval)
            self._logger.warning(message + "%s", *args, note)

    # ------------------------------------------------------------------ HTTP

    def _http(self) -> HttpClient | httpx.AsyncClient:
        if self._client is None:
            if self._transport is None:
                self._client = HttpClient(self._timeout)
            else:
                self._client = new_http_client(self._timeout, self._transport)
        return self._client

    async def _get(
        self,
        lookupd: _Lookupd,
        path: str,
        params: dict[str, str] | None,
        *,
        tolerate_404: bool = False,
    ) -> object:
        """One request, tried again once when nothing answered, all within ``timeout``: the
        payload or a LookupdHTTPError; raises one of ``_FAILURES`` when the lookupd is down,
        too slow, or its answer is not nsqlookupd's."""
        deadline = asyncio.get_running_loop().time() + self._timeout
        attempt = 1
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise NSQTimeoutError(
                    f"{lookupd.base_url}{path}: no answer within {self._timeout:g} s"
                )
            try:
                return await self._get_once(lookupd, path, params, tolerate_404, remaining)
            except _FAILURES as exc:
                if attempt >= self._http_attempts or not _is_retriable(exc):
                    raise
            attempt += 1
            # real time, as the deadline is (the injected sleep paces polls and backoff)
            await asyncio.sleep(min(self._http_retry_wait, max(0.0, remaining)))

    async def _get_once(
        self,
        lookupd: _Lookupd,
        path: str,
        params: dict[str, str] | None,
        tolerate_404: bool,
        timeout: float,
    ) -> object:
        url = lookupd.base_url + path
        try:
            answer = await exchange(
                self._http(),
                "GET",
                url,
                params=params,
                headers={"Accept": ACCEPT_V1},
                timeout=timeout,
                max_bytes=self._max_answer_bytes,
            )
        except InvalidURL as exc:
            raise _InvalidURL(str(exc)) from exc
        except Exception as exc:
            httpx = sys.modules.get("httpx")  # only a request through httpx raises its errors
            if httpx is not None and isinstance(exc, httpx.InvalidURL):
                raise _InvalidURL(str(exc)) from exc
            raise
        status = answer.status
        try:
            return unwrap_response(status, answer.headers, answer.body)
        except ProtocolError as exc:
            if status >= 500:
                raise _ServerFault(f"HTTP {status} from {url}, not nsqlookupd's: {exc}") from None
            if status == 404 and tolerate_404:
                text = answer.body[:100].decode("utf-8", "replace").strip()
                return LookupdHTTPError(404, text or "not found")
            raise

    # ------------------------------------------------------------------ polling

    def _start_poller(self) -> None:
        if self._closed or (self._poller is not None and not self._poller.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # watch() outside a loop: the poller starts with the first lookup
        self._poller = loop.create_task(self._poll_loop(), name="smartnsq-lookup-poller")

    async def _poll_loop(self) -> None:
        wake = self._wake = asyncio.Event()
        while not self._closed:
            try:
                await self.poll_once()
            except ClientClosedError:
                return
            except Exception:
                self._logger.exception("lookup poller: unexpected error")
            await self._idle(wake, self._poll_delay())

    def _poll_delay(self) -> float:
        if not self._tracked:
            return self._poll_interval
        return max(0.0, min(self._tracked.values()) - self._clock())

    async def _idle(self, wake: asyncio.Event, delay: float) -> None:
        """Sleep ``delay`` with the injected sleep, or less if something becomes due earlier
        (see :meth:`_schedule`)."""
        self._poll_deadline = self._clock() + delay
        sleeper = asyncio.ensure_future(self._sleep(delay))
        waiter = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._poll_deadline = float("-inf")
            sleeper.cancel()
            waiter.cancel()
            await asyncio.gather(sleeper, waiter, return_exceptions=True)
            wake.clear()

    async def _poll_key(self, key: _Key) -> None:
        try:
            await self._refresh(key, periodic=True)
        except ClientClosedError:
            pass
        except NSQError as exc:
            if not any(lookupd.answered for lookupd in self._lookupds.values()):
                # none ever answered: the client waiting for one says so (see _mark_failed)
                self._logger.debug("periodic lookup of %r (access=%s): %s", *key, exc)
                return
            self._warn(("poll", key), "periodic lookup of %r (access=%s): %s", *key, exc)

    async def _notify(self, key: _Key, layout: TopicLayout) -> None:
        for watcher in list(self._watchers.get(key, ())):
            try:
                result = watcher.callback(layout)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self._logger.exception(
                    "lookup watcher %r of %r (access=%s) failed", watcher.callback, *key
                )


def _nsqd_tcp(lookupd: _Lookupd, info: dict[str, object]) -> str:
    """The TCP address of the nsqd whose HTTP port ``lookupd`` is (from its ``/info``)."""
    host = lookupd.address.rsplit(":", 1)[0]
    return f"{host}:{info.get('tcp_port')}"


def _summary(layout: TopicLayout) -> str:
    parts = [f"p{pid}={node.tcp_address}" for pid, node in layout.partitions.items()]
    parts += [f"classic={node.tcp_address}" for node in layout.classic_nodes]
    if layout.meta is not None:
        parts.append(f"partition_num={layout.meta.partition_num}")
    return " ".join(parts) or "empty"


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValidationError(name, f"must be a number > 0, not {value!r}")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValidationError(name, f"must be a number >= 0, not {value!r}")
