"""Keeps a consumer subscribed: which (nsqd, partition) to subscribe to, and those
subscriptions alive.

:class:`Subscriber` reads the topic's layout from the lookup (or takes the classic nsqd
addresses it was given), opens one :class:`~smartnsq.transport.connection.Connection` per
(nsqd, partition) and sends SUB, SUB_ORDERED or SUB_ADVANCED; it retries what fails with the
reconnect backoff, follows leaders that move (retiring the old subscription once its
messages are answered), and while a wanted partition has no live subscription it looks up
again every backoff step, so a partition is consumed again within about two seconds of its
new leader taking writes. What arrives on a subscription, and the flow control, are its
listener's (the consumer's dispatcher): it tells it through :class:`SubscriptionListener`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from smartnsq.consumer.message import Message
from smartnsq.consumer.subscription import Answerer, Key, Subscription
from smartnsq.errors import (
    LookupFailedError,
    NSQError,
    ProtocolError,
    ServerError,
    TopicNotFoundError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.flow.retry import Backoff, Delays, needs_lookup_refresh
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.lookupd import Node, TopicLayout
from smartnsq.protocol.message import MessageFrame
from smartnsq.protocol.session import SubscribeCommand, SubscribeKind
from smartnsq.transport.connection import Connection, ConnectionConfig
from smartnsq.transport.httpclient import new_http_client
from smartnsq.transport.lookup import LookupManager
from smartnsq.transport.offsets import set_channel_offset
from smartnsq.transport.waiting import wait_event

if TYPE_CHECKING:
    import httpx

__all__ = ["MISSING_TOPIC_BACKOFF", "STABLE_AFTER", "Subscriber", "SubscriptionListener"]

log = logging.getLogger("smartnsq.consumer")

# How often a consumer looks for a topic that does not exist yet.
MISSING_TOPIC_BACKOFF = Backoff(initial=0.5, maximum=5.0)
# A subscription that lasts less than this many seconds counts as a failed subscribe: its
# reconnections back off instead of following at once.
STABLE_AFTER = 10.0


class SubscriptionListener(Protocol):
    """What a :class:`Subscriber` tells (the consumer's dispatcher), and asks."""

    @property
    def running(self) -> bool:
        """Started and not closing: lost subscriptions are replaced."""

    @property
    def stopping(self) -> bool:
        """Closing or closed: nothing new is subscribed."""

    @property
    def answerer(self) -> Answerer:
        """What answers the messages of the subscriptions."""

    def on_message(self, sub: Subscription, conn: Connection, frame: MessageFrame) -> None:
        """A message arrived on ``sub`` (decoded as a :class:`Message`)."""

    def on_server_error(self, sub: Subscription, conn: Connection, error: ServerError) -> None:
        """A non-fatal error frame on ``sub`` (E_FIN_FAILED...)."""

    def wants(self, subscriptions: int) -> None:
        """How many subscriptions there should be now (the partitions wanted, or the nsqd
        nodes), told before they are opened."""

    def subscribed(self, sub: Subscription) -> None:
        """``sub`` is subscribed: give it its share of the flow."""

    def retired(self, sub: Subscription) -> None:
        """``sub`` leaves the flow (its leader moved): its in-flight messages are still
        answered, then the listener closes its connection."""

    def lost(self, sub: Subscription) -> None:
        """``sub``'s connection closed: nothing on it can be answered any more."""

    def fatal(self, error: BaseException) -> None:
        """A non-recoverable error (misconfiguration): the consumer stops."""

    def warn(self, key: Hashable, text: str, *args: object) -> None:
        """A warning that may repeat (rate-limited)."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as one of the consumer's tasks."""


class Subscriber:
    """Subscribes ``listener`` to its topic's partitions (or classic nsqd) and keeps the
    subscriptions alive. Give ``lookup`` or ``nsqd`` addresses, not both."""

    def __init__(
        self,
        listener: SubscriptionListener,
        *,
        topic: str,
        channel: str,
        ordered: bool,
        partitions: frozenset[int] | None,
        start_position: StartPosition | None,
        desired_tag: str | None,
        connection_config: ConnectionConfig,
        reconnect_backoff: Delays,
        lookup: LookupManager | None,
        nsqd: list[str],
        fail_fast: bool = False,
    ) -> None:
        self.listener = listener
        self.topic = topic
        self.channel = channel
        self.ordered = ordered
        self.partitions = partitions
        self.start_position = start_position
        self.desired_tag = desired_tag
        self.connection_config = connection_config
        self.reconnect_backoff = reconnect_backoff
        self.lookup = lookup
        self.nsqd = nsqd
        self.fail_fast = fail_fast
        self._lookup_failing = False  # no lookup answered lately: looked up again soon
        self.subs: dict[Key, Subscription] = {}
        self.connecting: dict[Key, asyncio.Task[None]] = {}
        self.last_connect_error: NSQError | None = None
        # youzan: the partitions wanted (from the lookup's partition_num); while one has no
        # live subscription the supervisor looks up again every reconnect_backoff step
        self.wanted: frozenset[int] = frozenset()
        self._retry_at: dict[Key, float] = {}
        self._failures: dict[Key, int] = {}
        self._failing_since: dict[Key, float] = {}  # when each run of failures began
        self._addresses: dict[int | None, str] = {}  # partition -> the nsqd last subscribed
        self._leaders: dict[int, Node] = {}  # partition -> its leader, as last looked up
        self._positioned: set[int] = set()  # partitions moved to start_position already
        self._http: httpx.AsyncClient | None = None  # for /channel/setoffset (start=)
        # subscriptions closed within STABLE_AFTER of their SUB (counted as failed subscribes)
        self.short_lived = 0
        self._relookups = 0
        self._relooking_since = 0.0
        self._topic_missing = False
        self._force_refresh = False
        self._extend_support: bool | None = None
        self._warned_unregistered = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._unwatch: Any = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """The first subscriptions: returns once they are in place or failed (failures are
        retried by :meth:`supervise`)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.lookup is not None:
            timeout = self.connection_config.connect_timeout
            error: NSQError | None = None
            try:
                async with asyncio.timeout(timeout):
                    await self.lookup.discover()
            except TimeoutError:
                addresses = ", ".join(self.lookup.lookupd_addresses)
                error = LookupFailedError(
                    f"no nsqlookupd answered within connect_timeout ({timeout:g} s): {addresses}"
                )
            except LookupFailedError as exc:
                error = exc
            if error is not None and (self.fail_fast or not error.retriable):
                raise error
            # Else the lookups go on in the background (an orchestrator may start this
            # service before nsqlookupd): the first one below says so, once.
            self._unwatch = self.lookup.watch(self.topic, "r", self._on_layout)
        await self._reconcile()
        if self.connecting:
            await asyncio.wait(
                list(self.connecting.values()), timeout=self.connection_config.connect_timeout
            )

    def supervise(self) -> None:
        """Keep the subscriptions alive in the background (after :meth:`start`)."""
        loop = self._loop or asyncio.get_running_loop()
        self._supervisor = loop.create_task(
            self._supervise(), name=f"smartnsq-consumer-{self.topic}"
        )

    def stop(self) -> None:
        """No more subscribing: the supervisor and the subscriptions being opened are
        cancelled; the lookup stops telling about layout changes."""
        if self._supervisor is not None:
            self._supervisor.cancel()
        for task in list(self.connecting.values()):
            task.cancel()
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    async def close(self) -> None:
        """:meth:`stop`, wait for what it cancelled, and close every connection."""
        self.stop()
        pending = list(self.connecting.values())
        if self._supervisor is not None:
            pending.append(self._supervisor)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.gather(*(sub.conn.close() for sub in list(self.subs.values())))
        self.subs.clear()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def open_subscriptions(self) -> int:
        return sum(1 for sub in self.subs.values() if sub.conn.is_open)

    # ------------------------------------------------------------------ discovery

    def _on_layout(self, layout: TopicLayout) -> None:
        self.wake_up()

    def wake_up(self, *, refresh: bool = False) -> None:
        """Make the supervisor reconcile now; ``refresh``: with the layout read again from
        nsqlookupd rather than the lookup manager's cache."""
        if refresh:
            self._force_refresh = True
        if self._wake is not None:
            self._wake.set()

    async def _desired(self) -> dict[Key, None]:
        """The subscriptions wanted, in the layout's order (a dict: subscribing in an order
        no hash decides, so a simulation's seed replays it)."""
        if self.lookup is None:
            return dict.fromkeys((address, None) for address in self.nsqd)
        try:
            if self._force_refresh:
                self._force_refresh = False
                layout = await self.lookup.refresh(self.topic, "r")
            else:
                layout = await self.lookup.lookup(self.topic, "r")
        except TopicNotFoundError:
            self._warn_missing_topic()  # classic lookupd before the topic exists
            self._topic_missing = True
            return {}
        missing = layout.empty and (layout.meta is None or not layout.meta.valid)
        if missing:
            self._warn_missing_topic()  # a youzan lookupd answers an unknown topic empty
        elif self._topic_missing:
            log.info("%s/%s: topic %r exists now", self.topic, self.channel, self.topic)
        self._topic_missing = missing
        self._check_layout(layout)
        if layout.youzan and layout.partition_num:
            self.wanted = self.partitions or frozenset(range(layout.partition_num))
        keys: dict[Key, None] = {}
        for partition, leader in layout.partitions.items():
            if self.partitions is None or partition in self.partitions:
                keys[(leader.tcp_address, partition)] = None
                self._leaders[partition] = leader
        if self.partitions is None:
            keys.update(dict.fromkeys((node.tcp_address, None) for node in layout.classic_nodes))
        return keys

    def _check_layout(self, layout: TopicLayout) -> None:
        self._extend_support = layout.extend_support if layout.youzan else None
        meta = layout.meta
        if meta is not None and meta.valid and not meta.disable_channel_auto_create:
            self._warn_unregistered()
        if layout.is_classic and self.ordered and layout.classic_nodes:
            raise UnsupportedFeatureError("classic nsqd has no ordered consumption (SUB_ORDERED)")
        if self.partitions is not None and layout.partition_num:
            unknown = sorted(p for p in self.partitions if p >= layout.partition_num)
            if unknown:
                raise ValidationError(
                    "partitions",
                    f"topic {self.topic!r} has {layout.partition_num} partitions; "
                    f"no partition {unknown}",
                )

    def _warn_missing_topic(self) -> None:
        if self._topic_missing:
            return  # said already
        log.warning(
            "%s/%s: topic %r does not exist (no nsqlookupd knows it): waiting for it to be "
            "created; this consumer subscribes as soon as a lookup shows its partitions "
            "(it looks again every few seconds)",
            self.topic,
            self.channel,
            self.topic,
        )

    def _warn_unregistered(self) -> None:
        """Once: the topic lets SUB create channels, so this one is not registered."""
        if self._warned_unregistered or self.channel.endswith("#ephemeral"):
            return
        self._warned_unregistered = True
        log.warning(
            "%s/%s: channel %r is not registered: topic %r lets SUB create channels, so this "
            "one lives on each partition's leader only until it has finished a message there. "
            "If that leader fails over before, the new leader starts the channel afresh at the "
            "topic's end: what is published until this consumer subscribes again is never "
            "delivered to it. Register it: create the topic with its channels, e.g. smartnsq "
            "topic create %s --partitions N --replicas R --channel %s (or "
            "smartnsq.admin.Admin.create_topic(..., channels=[%r]))",
            self.topic,
            self.channel,
            self.channel,
            self.topic,
            self.topic,
            self.channel,
            self.channel,
        )

    async def _reconcile(self) -> float | None:
        """Subscribe where wanted and due; returns when the earliest subscribe put off by its
        backoff is due (None: none is). The supervisor waits for that time itself, not for
        what is left of it when it looks: time passes while this runs, and a retry that fell
        due meanwhile would otherwise wait for the next 30 s tick."""
        try:
            desired = await self._desired()
        except (ValidationError, UnsupportedFeatureError) as exc:
            self.listener.fatal(exc)
            return None
        except NSQError as exc:
            self._lookup_failed(exc)
            return None
        # Before the first subscribe: what is wanted, not how many are open so far.
        self.listener.wants(max(len(self.wanted), len(desired)))
        if self._lookup_failing:
            self._lookup_failing = False
            log.info("%s/%s: nsqlookupd answers now", self.topic, self.channel)
        loop = self._loop
        if loop is None:
            return None
        now = loop.time()
        due: float | None = None
        for key in desired:
            if key in self.subs or key in self.connecting:
                continue
            retry_at = self._retry_at.get(key, 0.0)
            if retry_at > now:
                due = retry_at if due is None else min(due, retry_at)
                continue
            task = loop.create_task(self._subscribe(key), name=f"smartnsq-connect-{key[0]}")
            self.connecting[key] = task
        for key, sub in list(self.subs.items()):
            if key not in desired and not sub.closing:
                # This node no longer leads the partition: stop its flow, let in-flight
                # messages be answered, then close.
                self._retire(sub)
        return due

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        wake = self._wake
        if wake is None:
            return
        while self.listener.running:
            wake.clear()
            due = await self._reconcile()
            now = loop.time()
            waits = [] if due is None else [due - now]
            if self._unserved():
                # A partition has no live subscription (its leader failed over, or is down):
                # look up again soon, and keep looking until the lookup names its leader.
                self._relookups += 1
                if self._relookups == 1:
                    self._relooking_since = now
                waits.append(
                    self.reconnect_backoff.delay(
                        self._relookups, self.last_connect_error, now - self._relooking_since
                    )
                )
            elif self._topic_missing or self._lookup_failing:
                self._relookups += 1
                waits.append(MISSING_TOPIC_BACKOFF.delay(self._relookups))
            else:
                self._relookups = 0
            timeout = min([*waits, 30.0])
            woken = await wait_event(wake, max(timeout, 0.01))
            if not woken and self._relookups:
                self._force_refresh = True

    def _lookup_failed(self, exc: NSQError) -> None:
        """A lookup of the topic failed: said at WARNING when lookups start failing (once,
        not at every try), and looked up again soon, with backoff, until one answers."""
        if not self._lookup_failing:
            self._lookup_failing = True
            log.warning(
                "%s/%s: the lookup failed (%s); looking up again in the background, with "
                "backoff: this consumer subscribes as soon as nsqlookupd answers "
                "(fail_fast=True makes start() raise instead)",
                self.topic,
                self.channel,
                exc,
            )
        else:
            log.debug("%s/%s: the lookup failed again: %s", self.topic, self.channel, exc)

    def _unserved(self) -> bool:
        """Some wanted partition has no open subscription (and none is being opened)."""
        wanted = self.wanted
        if not wanted or self.lookup is None:
            return False
        served = {key[1] for key in self.connecting}
        served.update(s.partition for s in self.subs.values() if s.conn.is_open)
        return not wanted <= served

    # ------------------------------------------------------------------ subscriptions

    async def _position(self, partition: int) -> None:
        """``start``: move the channel to the start position on the partition's leader
        (``/channel/setoffset``), once, when this consumer first subscribes to it: after its
        SUB (which creates a channel SUB may create) and before its first RDY, so nothing
        is in flight that the move would drop."""
        leader = self._leaders.get(partition)
        position = self.start_position
        if leader is None or position is None:
            return
        if self._http is None:
            self._http = new_http_client(self.connection_config.connect_timeout)
        moved = await set_channel_offset(
            self._http, leader.http_address, self.topic, partition, self.channel, position
        )
        self._positioned.add(partition)
        log.info(
            "%s/%s: partition %s positioned at %s%s",
            self.topic,
            self.channel,
            partition,
            position,
            "" if moved else " (it holds no message yet)",
        )

    async def _subscribe(self, key: Key) -> None:
        address, partition = key
        listener = self.listener
        conn = Connection(
            address,
            self.connection_config,
            extend_support=self._extend_support if partition is not None else None,
            desired_tag=self.desired_tag,
            label=f"{address}/{self.topic}/{partition}",
        )
        sub = Subscription(listener.answerer, self.topic, self.channel, key, conn)
        try:
            if partition is None and self.start_position is not None:
                raise UnsupportedFeatureError(
                    "classic nsqd has no queue offsets: a start position needs youzan nsqd"
                )
            await conn.connect()
            # A youzan partition: SUB_ORDERED, or SUB_ADVANCED in its 4-word form (messages
            # carry their queue offset and size). A start position is never put on the wire
            # (the 5-word form subscribes to the node's default partition, whatever partition
            # it names): the channel is positioned over HTTP.
            kind = SubscribeKind.for_partition(partition, ordered=self.ordered)
            await conn.subscribe(
                SubscribeCommand(kind, self.topic, self.channel, partition),
                on_message=functools.partial(listener.on_message, sub, conn),
                message_class=Message,
                on_error=functools.partial(listener.on_server_error, sub, conn),
            )
            if (
                partition is not None
                and self.start_position is not None
                and partition not in self._positioned
            ):
                await self._position(partition)
        except asyncio.CancelledError:
            conn.abort()
            raise
        except NSQError as exc:
            conn.abort()
            self._connect_failed(key, exc)
            return
        finally:
            self.connecting.pop(key, None)
        if listener.stopping:
            await conn.close()
            return
        if conn.closed:  # lost between SUB's answer and now
            self._connect_failed(key, NSQError("connection closed after SUB"))
            return
        conn.set_close_callback(functools.partial(self._on_close, sub))
        self.subs[key] = sub
        # The failures in a row are forgotten only once the subscription lasts (_on_close):
        # a SUB that succeeds on a node that then drops the connection is no success.
        self._retry_at.pop(key, None)
        if self._loop is not None:
            sub.subscribed_at = self._loop.time()
        moved_from = self._addresses.get(partition)
        self._addresses[partition] = address
        if partition is not None and moved_from is not None and moved_from != address:
            log.info(
                "%s/%s: partition %s's leader moved from %s to %s",
                self.topic,
                self.channel,
                partition,
                moved_from,
                address,
            )
        log.info(
            "%s/%s: subscribed to %s partition %s", self.topic, self.channel, address, partition
        )
        listener.subscribed(sub)

    def _connect_failed(self, key: Key, exc: NSQError) -> None:
        self.last_connect_error = exc
        if _unfixable(exc):
            # Misconfiguration (an ordered topic without ordered=True, an unregistered
            # channel, bad credentials, an HTTP port given as nsqd's), a bad argument or a
            # position nsqd refuses: retrying cannot help. on_error hears of it, start() or
            # join() raises it.
            self.listener.fatal(exc)
            return
        failures = self._count_failure(key, exc, first_at_once=False)
        self.listener.warn(
            ("subscribe", key[0]),
            "%s: subscribing to %s failed (%s); retrying",
            self.topic,
            key[0],
            exc,
        )
        # The layout may be stale (a moved leader): read it again from nsqlookupd when nsqd
        # says so or when subscribing keeps failing.
        self.wake_up(
            refresh=self.lookup is not None and (needs_lookup_refresh(exc) or failures > 1)
        )

    def _count_failure(
        self, key: Key, failure: BaseException | None, *, first_at_once: bool
    ) -> int:
        """One more failure in a row for ``key`` (forgotten once a subscription lasts), the
        last being ``failure``: the next attempt waits the reconnect backoff, except the
        first one with ``first_at_once``."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        loop = self._loop
        if loop is not None:
            now = loop.time()
            since = self._failing_since.setdefault(key, now)
            if failures > 1 or not first_at_once:
                wait = self.reconnect_backoff.delay(failures, failure, now - since)
                self._retry_at[key] = now + wait
        return failures

    def _on_close(self, sub: Subscription, conn: Connection, exc: BaseException | None) -> None:
        if self.subs.get(sub.key) is sub:
            del self.subs[sub.key]
        listener = self.listener
        listener.lost(sub)
        if not listener.running or sub.closing:
            return
        if isinstance(exc, ServerError) and not exc.retriable:
            listener.warn(
                ("lost", sub.address), "%s: connection to %s lost: %s", self.topic, sub.address, exc
            )
            listener.fatal(exc)
            return
        lasted = self._loop.time() - sub.subscribed_at if self._loop is not None else 0.0
        if lasted >= STABLE_AFTER:
            # A subscription that was working (a leader move, an nsqd restart): expected,
            # retried at once.
            self._failures.pop(sub.key, None)
            self._failing_since.pop(sub.key, None)
            log.info(
                "%s/%s: connection to %s closed (%s); subscribing again",
                self.topic,
                self.channel,
                sub.address,
                exc,
            )
            self._count_failure(sub.key, exc, first_at_once=True)
        else:
            # Dropped soon after its SUB succeeded (real youzan: a new leader not writable
            # yet refuses the FIN of what it redelivers, fatally): a failed subscribe, which
            # backs off, rather than a storm of reconnections hammering a recovering node.
            self.short_lived += 1
            failures = self._count_failure(sub.key, exc, first_at_once=False)
            listener.warn(
                ("lost", sub.address),
                "%s: connection to %s closed %.1f s after subscribing (%s); retrying in "
                "%.1f s (%d in a row)",
                self.topic,
                sub.address,
                lasted,
                exc,
                self._retry_at.get(sub.key, 0.0) - (self._loop.time() if self._loop else 0.0),
                failures,
            )
        self.wake_up(refresh=self.lookup is not None)

    def _retire(self, sub: Subscription) -> None:
        """This node no longer leads ``sub``'s partition: the listener stops its flow and
        closes it once its messages are answered."""
        self.listener.retired(sub)


def _unfixable(exc: NSQError) -> bool:
    """Whether a failed subscribe is one no retry can fix: any error that is not retriable,
    but a stream that was garbled (a plain ProtocolError: the next connection may be fine)."""
    return not exc.retriable and type(exc) is not ProtocolError
