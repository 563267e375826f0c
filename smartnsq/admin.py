"""Topic and channel administration: :class:`Admin`.

youzan HA: topics are created by the nsqlookupd *leader* (``POST /topic/create``), which places
the partitions and their replicas on nsqd nodes. A channel is durable only when it is
*registered* there (``POST /channel/create``), which youzan allows only on topics created with
``disable_channel_auto_create=true``: a registered channel exists on every replica of every
partition, so it survives a leader failover. A channel that a consumer's SUB (or nsqd's own
``/channel/create``) creates instead starts at the topic's end, on the partition leader only:
after a crash of that leader the new leader has no such channel, and the messages published
until a consumer subscribes again are never delivered to it.

Classic nsqd: every nsqd creates topics and channels itself (``POST /topic/create``,
``/channel/create`` and ``/topic/delete`` on each nsqd, found through nsqlookupd ``/nodes`` or
given with ``nsqd_http=[...]``).

Requests that only the lookupd leader serves are sent to the configured lookupds first (with a
single lookupd, the usual case, that is the leader), then to the leader ``/listlookup`` names.

``address_map`` (the clients' option, :class:`~smartnsq.routing.addresses.AddressMap`)
translates the nsqd and nsqlookupd addresses nsqlookupd announces, for clusters in Docker or
behind NAT.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NamedTuple

from smartnsq.client.moves import announce
from smartnsq.errors import (
    AdminError,
    ClientClosedError,
    ConnectionClosedError,
    NotHttpError,
    NotLeaderError,
    NotLookupdError,
    NSQError,
    NSQTimeoutError,
    PlacementError,
    ProtocolError,
    TopicNotFoundError,
    UnsupportedFeatureError,
    ValidationError,
)
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.lookupd import (
    ACCEPT_V1,
    LookupdHTTPError,
    TopicLayout,
    TopicMeta,
    parse_listlookup,
    parse_lookup,
    parse_node,
    unwrap_response,
)
from smartnsq.protocol.offsets import (
    PartitionOffsets,
    SeekResult,
    landed_offset,
    lies_past_end,
)
from smartnsq.protocol.validation import (
    MAX_PARTITIONS,
    check_auto_create,
    check_channel,
    check_partition,
    check_topic,
)
from smartnsq.routing.addresses import AddressMap, AddressMapping
from smartnsq.transport.httpclient import DEFAULT_MAX_ANSWER_BYTES, exchange, new_http_client
from smartnsq.transport.lookup import normalize_seed
from smartnsq.transport.offsets import read_channel_offsets, set_channel_offset

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_PARTITIONS", "MAX_REPLICAS", "Admin", "PartitionOffsets", "SeekResult"]

log = logging.getLogger("smartnsq.admin")

MAX_REPLICAS = 5
_NOT_LEADER = ("E_FAILED_ON_NOT_LEADER", "Not nsqlookup leader")
_ALREADY_REGISTERED = "already registered"
_AUTO_CREATE_ALLOWED = "channel auto create NOT disabled"
_NO_NODE = "No node is available for topic"  # the coordinator cannot place the topic
_KEY_NOT_FOUND = "Key not found"  # the coordinator does not know the topic
_POLL = 0.1  # seconds between readiness checks of a created topic
# Seconds between two posts of a created topic while it has leaders but takes no writes: each
# asks nsqlookupd for the topic check that makes it writable (see _wait_ready).
_REPOST = 2.0


class _LookupdInfo(NamedTuple):
    """What a lookupd given to Admin answered to ``/info``."""

    base: str
    answered: bool = False
    info: object = None
    not_lookupd: str = ""  # why it is not an nsqlookupd at all
    failure: str = ""  # why it did not answer
    error: NSQError | None = None  # raised once every lookupd was asked


class Admin:
    """Creates and deletes topics and channels.

    Give ``lookupd`` (nsqlookupd HTTP addresses; youzan or classic) or ``nsqd_http`` (classic nsqd
    HTTP addresses, ``host:port``). ``timeout`` bounds each HTTP request, its whole answer
    included, and ``max_answer_bytes`` (4 MiB) its size. Use it as an async context manager, or
    call :meth:`close`. A ``lookupd`` address that is an nsqd is found out by the first call
    (see :meth:`is_youzan`): NotLookupdError.
    """

    def __init__(
        self,
        lookupd: Sequence[str] | None = None,
        *,
        nsqd_http: Sequence[str] | None = None,
        timeout: float = 10.0,
        address_map: AddressMapping | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self._address_map = AddressMap.of(address_map)
        if (lookupd is None) == (nsqd_http is None):
            raise ValidationError("lookupd", "give exactly one of lookupd=[...] or nsqd_http=[...]")
        if isinstance(lookupd, str) or isinstance(nsqd_http, str):
            raise ValidationError("lookupd", "lookupd and nsqd_http take lists of addresses")
        addresses = list(lookupd if lookupd is not None else nsqd_http or ())
        given = "lookupd" if lookupd is not None else "nsqd_http"
        if not addresses:
            raise ValidationError(given, "is empty")
        # nsqd HTTP addresses have the same shape as lookupd ones (host:port or a URL).
        bases = list(dict.fromkeys(normalize_seed(address, given)[1] for address in addresses))
        self._lookupds = bases if lookupd is not None else []
        self._nsqds = bases if nsqd_http is not None else []
        if type(timeout) not in (int, float) or not timeout > 0:
            raise ValidationError("timeout", "must be a number of seconds > 0")
        self._timeout = float(timeout)
        if type(max_answer_bytes) is not int or max_answer_bytes < 1:
            raise ValidationError("max_answer_bytes", "must be an int >= 1 (bytes)")
        self._max_answer_bytes = max_answer_bytes
        self._client: httpx.AsyncClient | None = None
        self._youzan: bool | None = False if nsqd_http is not None else None
        self._closed = False

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP client; the Admin cannot be used afterwards."""
        self._closed = True
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ public API

    async def is_youzan(self) -> bool:
        """Whether the cluster is a youzan HA cluster (its nsqlookupd has HA support).

        Asked first by every call, it also checks the ``lookupd`` addresses: one that is an
        nsqd (its HTTP port, whose ``/info`` names its TCP port, or its TCP port, which
        answers ``E_BAD_PROTOCOL``) is left out with a warning, and NotLookupdError is
        raised when every one that answered is."""
        if self._youzan is None:
            info = await self._lookupd_info()
            self._youzan = isinstance(info, dict) and bool(info.get("ha_support"))
        return self._youzan

    async def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replicas: int = 1,
        *,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
        channels: Sequence[str] = (),
        disable_channel_auto_create: bool | None = None,
        wait: float | None = 30.0,
    ) -> None:
        """Create ``topic`` and register ``channels`` on it.

        youzan: ``partitions`` x ``replicas`` placed by the nsqlookupd leader; ``ordered``
        (orderedmulti), ``multi_part`` (multipart) and ``ext`` (JSON ext headers) topics.
        Every replica of a partition needs an nsqd node of its own, and a plain topic
        (neither ordered nor multi-part) one node per replica of every partition:
        ``partitions x replicas <= nodes``. A topic that cannot be placed raises
        :class:`~smartnsq.errors.PlacementError`, saying what would fit: before sending
        when nsqlookupd lists its nodes, else from nsqlookupd's refusal.

        ``channels`` are registered durably, which needs ``disable_channel_auto_create``
        (True by default when channels are given): consumers may then subscribe only to
        registered channels. ``wait`` (seconds, None: do not wait) waits until every
        partition has a leader and takes writes, and nsqlookupd lists the channels.

        Creating a topic that exists with the same settings is not an error.

        Classic nsqd: the topic and its channels are created on every nsqd; ``partitions``
        and ``replicas`` must be 1, and ``ordered``/``multi_part``/``ext`` are refused.
        """
        check_topic(topic)
        names = _channel_names(channels)
        _check_count("partitions", partitions, MAX_PARTITIONS)
        _check_count("replicas", replicas, MAX_REPLICAS)
        wait = _check_wait(wait)
        disable_channel_auto_create = check_auto_create(bool(names), disable_channel_auto_create)
        if not await self.is_youzan():
            if partitions != 1 or replicas != 1 or ordered or multi_part or ext:
                raise UnsupportedFeatureError(
                    "classic nsqd topics have no partitions, replicas, ordering, multiple "
                    "parts or ext headers"
                )
            await self._classic_create(topic, names)
            return
        multi = ordered or multi_part
        wanted_meta = TopicMeta(
            partition_num=partitions,
            replica=replicas,
            extend_support=ext,
            ordered=ordered,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
        )
        nodes = await self._node_count()
        problem = _placement_problem(partitions, replicas, multi, nodes)
        if problem is not None:
            # Placed already, with the same settings (and a node down since, say)? Fine.
            existing = await self._existing_meta(topic)
            if existing is None:
                field, message = problem
                raise PlacementError(
                    field, message, partitions=partitions, replicas=replicas, nodes=nodes
                )
            _check_same(topic, existing, wanted_meta, None)
        else:
            try:
                await self._post_leader("/topic/create", _create_params(topic, wanted_meta))
            except AdminError as exc:
                existing = await self._existing_meta(topic)
                if existing is None:
                    if _NO_NODE in exc.message:
                        raise _refused_placement(
                            exc, topic, partitions, replicas, multi, nodes
                        ) from exc
                    raise
                _check_same(topic, existing, wanted_meta, exc)
        for name in names:
            await self._register_channel(topic, name)
        if wait is not None:
            await self._wait_ready(topic, partitions, names, wait)

    async def create_channel(self, topic: str, channel: str, *, wait: float | None = 30.0) -> None:
        """Register ``channel`` on ``topic`` (youzan: a durable channel, on a topic created
        with ``disable_channel_auto_create``; classic: created on every nsqd that has the
        topic). Registering a channel twice is not an error. ``wait``: seconds to wait until
        nsqlookupd lists the channel and the topic's partitions take writes (None: do not
        wait)."""
        check_topic(topic)
        check_channel(channel)
        wait = _check_wait(wait)
        if not await self.is_youzan():
            await self._classic_create(topic, [channel], create_topic=False)
            return
        await self._register_channel(topic, channel)
        if wait is not None:
            await self._wait_ready(topic, None, [channel], wait)

    async def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` with every partition (youzan: through the lookupd leader; classic:
        on every nsqd that has it) and all its messages."""
        check_topic(topic)
        if await self.is_youzan():
            await self._post_leader("/topic/delete", {"topic": topic, "partition": "**"})
            return
        done = 0
        for base in await self._classic_nsqds():
            answer = await self._request("POST", base, "/topic/delete", {"topic": topic})
            if isinstance(answer, LookupdHTTPError):
                if answer.status == 404:
                    continue  # this nsqd never had the topic
                raise _refused(answer, base + "/topic/delete")
            done += 1
        if not done:
            raise AdminError(f"no nsqd has topic {topic!r}")

    # ------------------------------------------------------------------ positions (youzan)

    async def seek(
        self,
        topic: str,
        channel: str,
        position: StartPosition | Literal["earliest", "latest"],
        partitions: Sequence[int] | None = None,
    ) -> list[SeekResult]:
        """Move ``channel``'s consume position to ``position`` (a :class:`StartPosition`, or
        ``"earliest"`` or ``"latest"`` as ``Consumer(start=...)`` takes them) in every
        partition of ``topic`` (or only in ``partitions``), through each partition's leader
        (``POST /channel/setoffset``). One result per partition, in partition order; a
        partition without any message is reported ``empty`` and left as it is.

        Each result says where the channel went (``offset``, ``end``, read from the leader's
        ``/stats`` after the move): nsqd puts a position past the queue's end (an offset past
        it, ``message_count(999)`` of 100 messages) at the end, without an error, and
        ``past_end`` says so.

        nsqd forgets the channel's messages in flight (their FINs fail) and delivers again
        from the new position, not necessarily in queue order: a reader of an exact range
        orders by queue offset itself. Consumers already subscribed stay connected; an
        ordered one checks its order anew from the new position, and hands the messages
        replayed by a seek backwards to its handler (those of this process hear of the move
        from here, the others see it in what they are delivered).

        Raises ValidationError for bad arguments (before anything is sent),
        UnsupportedFeatureError on classic nsqd (no queue offsets), TopicNotFoundError, and
        AdminError (no such channel on a leader, a partition without a leader, a refused
        position; when partitions were moved before the failure, the error names them).
        """
        check_topic(topic)
        check_channel(channel)
        position = _seek_position(position)
        wanted = _partition_ids(partitions)
        await self._require_offsets("seek a channel")
        leaders = await self._leaders(topic, wanted)
        results: list[SeekResult] = []
        try:
            for partition, leader in leaders.items():
                try:
                    moved_one = await self._seek_one(topic, partition, channel, position, leader)
                except NSQError as exc:
                    if not results:
                        raise
                    moved = ", ".join(str(r.partition) for r in results)
                    raise AdminError(
                        f"partition {partition}: {exc} (partitions {moved} were moved to "
                        f"{position.text()} already)",
                        status=getattr(exc, "status", None),
                        url=getattr(exc, "url", ""),
                    ) from exc
                results.append(moved_one)
        finally:
            if results:  # this process's consumers of the channel hear of it at once
                announce(topic, channel, [r.partition for r in results if not r.empty])
        return results

    async def offsets(self, topic: str, channel: str) -> list[PartitionOffsets]:
        """Per partition of ``topic``, in partition order: the queue's start and end, and
        ``channel``'s consumed position, depth and lag (see
        :class:`~smartnsq.protocol.offsets.PartitionOffsets`), read from each partition's
        leader (``GET /stats``). A partition whose leader has no such channel has None there.

        Raises UnsupportedFeatureError on classic nsqd, TopicNotFoundError, AdminError.
        """
        check_topic(topic)
        check_channel(channel)
        await self._require_offsets("read a channel's offsets")
        leaders = await self._leaders(topic, None)
        http = self._http()
        return list(
            await asyncio.gather(
                *(
                    read_channel_offsets(http, leader, topic, partition, channel)
                    for partition, leader in leaders.items()
                )
            )
        )

    async def _require_offsets(self, what: str) -> None:
        if not await self.is_youzan():
            raise UnsupportedFeatureError(
                f"cannot {what}: classic nsqd has no queue offsets (youzan nsqd only)"
            )

    async def _leaders(self, topic: str, wanted: Sequence[int] | None) -> dict[int, str]:
        """partition -> its leader's nsqd HTTP address, for ``wanted`` (None: every one).
        AdminError when one has no leader; ValidationError for a partition the topic lacks."""
        layout = await self._layout(topic, "r")
        if layout is None or (not layout.partitions and layout.partition_num == 0):
            raise TopicNotFoundError(topic)
        count = layout.partition_num
        for partition in wanted or ():
            if partition >= count:
                raise ValidationError(
                    "partitions", f"topic {topic!r} has partitions 0..{count - 1}, not {partition}"
                )
        leaders = {}
        for partition in wanted if wanted is not None else range(count):
            node = layout.leader(partition)
            if node is None:
                raise AdminError(
                    f"partition {partition} of {topic!r} has no leader now (a failover in "
                    "progress?); try again"
                )
            leaders[partition] = node.http_address
        return leaders

    async def _seek_one(
        self,
        topic: str,
        partition: int,
        channel: str,
        position: StartPosition,
        leader: str,
    ) -> SeekResult:
        """One partition; a leader that moved meanwhile is looked up again, once."""
        try:
            moved = await set_channel_offset(
                self._http(), leader, topic, partition, channel, position
            )
        except NotLeaderError:
            leader = (await self._leaders(topic, [partition]))[partition]
            try:
                moved = await set_channel_offset(
                    self._http(), leader, topic, partition, channel, position
                )
            except NotLeaderError as exc:
                raise AdminError(
                    f"partition {partition} of {topic!r}: {exc}; its leader is changing, try again"
                ) from exc
        if not moved:
            return SeekResult(partition, leader, position, empty=True)
        return await self._landed(topic, partition, channel, position, leader)

    async def _landed(
        self, topic: str, partition: int, channel: str, position: StartPosition, leader: str
    ) -> SeekResult:
        """A moved partition's result: where the channel went, from the leader's /stats
        (nsqd answers the move itself with nothing but 200)."""
        try:
            queue = await read_channel_offsets(self._http(), leader, topic, partition, channel)
        except NSQError as exc:
            # The move happened; only the report is missing, which offset=None says.
            log.warning(
                "partition %d of %r: moved to %s, but reading where it went failed: %s",
                partition,
                topic,
                position.text(),
                exc,
            )
            return SeekResult(partition, leader, position)
        return SeekResult(
            partition,
            leader,
            position,
            offset=landed_offset(position, queue),
            end=queue.end,
            past_end=lies_past_end(position, queue),
        )

    # ------------------------------------------------------------------ youzan

    async def _register_channel(self, topic: str, channel: str) -> None:
        try:
            await self._post_leader("/channel/create", {"topic": topic, "channel": channel})
        except AdminError as exc:
            if _ALREADY_REGISTERED in exc.message:
                return
            if exc.message == _KEY_NOT_FOUND:
                raise AdminError(
                    f"cannot register channel {channel!r}: the cluster has no topic {topic!r}; "
                    "create the topic first (with the channel: smartnsq topic create "
                    f"{topic} --channel {channel})",
                    status=exc.status,
                    url=exc.url,
                    detail=exc.message,
                ) from exc
            if _AUTO_CREATE_ALLOWED in exc.message:
                raise AdminError(
                    f"cannot register channel {channel!r}: topic {topic!r} lets SUB create its "
                    "channels (created without disable_channel_auto_create), and youzan "
                    "registers channels only on topics created with it. Recreate the topic "
                    "with disable_channel_auto_create=True (smartnsq topic create ... "
                    "--channel NAME) to get durable channels",
                    status=exc.status,
                    url=exc.url,
                ) from exc
            raise

    async def _post_leader(self, path: str, params: dict[str, str]) -> None:
        """POST to the nsqlookupd leader: the configured lookupds first, then the leader
        named by ``/listlookup`` (non-leaders answer E_FAILED_ON_NOT_LEADER)."""
        tried: list[str] = []
        for base in await self._leader_candidates():
            try:
                answer = await self._request("POST", base, path, params)
            except (ConnectionClosedError, ProtocolError) as exc:
                tried.append(f"{base}: {type(exc).__name__}: {exc}")
                continue
            if isinstance(answer, LookupdHTTPError):
                if any(text in answer.message for text in _NOT_LEADER):
                    tried.append(f"{base}: not the leader")
                    continue
                raise _refused(answer, base + path)
            return
        raise AdminError(f"no nsqlookupd leader took {path}: " + "; ".join(tried))

    async def _leader_candidates(self) -> list[str]:
        candidates = list(self._lookupds)
        for base in self._lookupds:
            try:
                payload = await self._request("GET", base, "/listlookup", {})
            except (ConnectionClosedError, ProtocolError):
                continue
            if isinstance(payload, LookupdHTTPError):
                continue
            try:
                leader, _ = parse_listlookup(payload)
            except ProtocolError:
                continue
            if leader is not None:
                leader = self._address_map.lookupd(leader)
                candidates.append(f"http://{leader.http_address}")
            break
        return list(dict.fromkeys(candidates))

    async def _lookupd_info(self) -> object:
        """``/info`` of the first given lookupd that answers it as an nsqlookupd; those
        that are nsqds are left out (every one asked at once, on the first call)."""
        answers = await asyncio.gather(*(self._info_of(base) for base in self._lookupds))
        for answer in answers:
            if answer.error is not None:
                raise answer.error
        wrong = [answer.not_lookupd for answer in answers if answer.not_lookupd]
        if wrong:
            kept = [answer.base for answer in answers if not answer.not_lookupd]
            if not kept:
                raise NotLookupdError("; ".join(wrong))
            for not_lookupd in wrong:
                log.warning("%s", not_lookupd)
            self._lookupds = kept
        for answer in answers:
            if answer.answered and not answer.not_lookupd:
                return answer.info
        failures = [answer.failure for answer in answers if answer.failure]
        raise AdminError("no nsqlookupd answered /info: " + "; ".join(failures))

    async def _info_of(self, base: str) -> _LookupdInfo:
        """What ``base`` answers to ``/info``, and whether that is an nsqlookupd."""
        try:
            info = await self._request("GET", base, "/info", {})
        except ConnectionClosedError as exc:
            return _LookupdInfo(base, failure=str(exc))
        except NotHttpError:
            return _LookupdInfo(
                base,
                not_lookupd=f"{base} is an nsqd's TCP address, not an nsqlookupd (it answered "
                "E_BAD_PROTOCOL): give nsqlookupd's HTTP address (default port 4161)",
            )
        except NSQError as exc:
            return _LookupdInfo(base, error=exc)
        if isinstance(info, LookupdHTTPError):
            return _LookupdInfo(base, error=_refused(info, base + "/info"))
        if isinstance(info, dict) and "tcp_port" in info:
            # nsqd's /info names its ports; nsqlookupd's does not.
            not_lookupd = (
                f"{base} is an nsqd's HTTP address, not an nsqlookupd: give nsqlookupd's "
                "HTTP address (default port 4161)"
            )
            if not info.get("ha_support"):
                address = base.split("://", 1)[1]
                not_lookupd += f", or nsqd_http=['{address}'] to manage that classic nsqd directly"
            return _LookupdInfo(base, True, info, not_lookupd=not_lookupd)
        return _LookupdInfo(base, True, info)

    async def _layout(self, topic: str, access: str) -> TopicLayout | None:
        """The topic's layout from the first lookupd that answers (None: not known)."""
        params = {"topic": topic, "access": access, "metainfo": "true"}
        answer = await self._get_any(self._lookupds, "/lookup", params, errors_ok=True)
        if answer is None or isinstance(answer, LookupdHTTPError):
            return None
        layout = parse_lookup(topic, "w" if access == "w" else "r", answer)
        return self._address_map.layout(layout)

    async def _existing_meta(self, topic: str) -> TopicMeta | None:
        layout = await self._layout(topic, "r")
        if layout is None or layout.meta is None or not layout.meta.valid:
            return None
        return layout.meta

    async def _wait_ready(
        self, topic: str, partitions: int | None, channels: Sequence[str], timeout: float
    ) -> None:
        """Until every partition has a leader and takes writes, and lookupd lists the
        channels.

        youzan nsqlookupd makes a new topic writable in its next topic check, and skips a
        check asked for within 6 s of the last one (one runs when the nsqd nodes join, then
        every minute): a topic created right after the cluster starts would wait a minute or
        two. Posting ``/topic/create`` again for the existing topic asks for a check
        (writable about a second later), so it is posted again every few seconds while the
        partitions have leaders but do not take writes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_post = loop.time() + _REPOST
        state = "no answer from nsqlookupd"
        post_failure = ""
        while True:
            read = await self._layout(topic, "r")
            if read is not None:
                expected = partitions if partitions is not None else read.partition_num
                missing = sorted(set(channels) - set(read.channels))
                writable = await self._writable_partitions(topic)
                led = len(read.partitions) >= expected
                state = (
                    f"{len(read.partitions)} of {expected} partitions have a leader, "
                    f"{len(writable)} writable"
                    + (f", channels {missing} not listed yet" if missing else "")
                    + post_failure
                )
                if led and len(writable) >= expected and not missing:
                    return
                meta = read.meta
                if led and meta is not None and meta.valid and loop.time() >= next_post:
                    next_post = loop.time() + _REPOST
                    try:
                        await self._post_leader("/topic/create", _create_params(topic, meta))
                        post_failure = ""
                    except (AdminError, ConnectionClosedError, ProtocolError) as exc:
                        post_failure = f" (posting the create again failed: {exc})"
            if loop.time() >= deadline:
                raise NSQTimeoutError(f"topic {topic!r} is not ready after {timeout:g} s: {state}")
            await asyncio.sleep(_POLL)

    async def _writable_partitions(self, topic: str) -> set[int]:
        """The partitions of ``topic`` whose leader registered them with nsqlookupd: a
        youzan nsqd registers a partition it leads while the partition takes writes
        (``/nodes``, whatever the topic's channels)."""
        try:
            payload = await self._get_any(self._lookupds, "/nodes", {})
        except AdminError:
            return set()
        found: set[int] = set()
        for producer in _producers(payload):
            led = producer.get("partitions")
            ids = led.get(topic) if isinstance(led, dict) else None
            for pid in ids if isinstance(ids, list) else ():
                if isinstance(pid, str) and pid.isdigit():
                    found.add(int(pid))
        return found

    async def _node_count(self) -> int | None:
        """How many nsqd nodes nsqlookupd lists (``/nodes``), None when it does not say."""
        try:
            payload = await self._get_any(self._lookupds, "/nodes", {})
        except (AdminError, ConnectionClosedError, ProtocolError):
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("producers"), list):
            return None
        return len(_producers(payload))

    # ------------------------------------------------------------------ classic

    async def _classic_nsqds(self) -> list[str]:
        if self._nsqds:
            return self._nsqds
        payload = await self._get_any(self._lookupds, "/nodes", {})
        producers = payload.get("producers") if isinstance(payload, dict) else None
        if not isinstance(producers, list):
            raise AdminError("nsqlookupd /nodes answered without a producers list")
        nodes = [
            self._address_map.node(parse_node(peer, f"producers[{i}]"))
            for i, peer in enumerate(producers)
        ]
        if not nodes:
            raise AdminError("no nsqd is registered with nsqlookupd yet")
        return [f"http://{node.http_address}" for node in nodes]

    async def _classic_create(
        self, topic: str, channels: Sequence[str], *, create_topic: bool = True
    ) -> None:
        created = 0
        for base in await self._classic_nsqds():
            if create_topic:
                answer = await self._request("POST", base, "/topic/create", {"topic": topic})
                if isinstance(answer, LookupdHTTPError):
                    raise _refused(answer, base + "/topic/create")
            skipped = False
            for channel in channels:
                params = {"topic": topic, "channel": channel}
                answer = await self._request("POST", base, "/channel/create", params)
                if isinstance(answer, LookupdHTTPError):
                    if answer.status == 404 and not create_topic:
                        skipped = True  # this nsqd does not have the topic
                        break
                    raise _refused(answer, base + "/channel/create")
            created += not skipped
        if not created:
            raise AdminError(f"no nsqd has topic {topic!r}: create it first")

    # ------------------------------------------------------------------ HTTP

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ClientClosedError("this Admin is closed; create a new one")
        if self._client is None:
            self._client = new_http_client(self._timeout)
        return self._client

    async def _request(self, method: str, base: str, path: str, params: dict[str, str]) -> object:
        """One request, its whole answer within ``timeout``: the answer's payload or its
        LookupdHTTPError. Raises ConnectionClosedError when nothing answers (NSQTimeoutError
        when the answer is not complete in time), ProtocolError when what answers is not an
        nsqlookupd or nsqd, or answers more than ``max_answer_bytes``."""
        answer = await exchange(
            self._http(),
            method,
            base + path,
            params=params,
            headers={"Accept": ACCEPT_V1},
            timeout=self._timeout,
            max_bytes=self._max_answer_bytes,
        )
        try:
            return unwrap_response(answer.status, answer.headers, answer.body)
        except ProtocolError as exc:
            raise ProtocolError(
                f"{base}{path} answered HTTP {answer.status} in a way no nsqlookupd or "
                f"nsqd does ({exc}); is {base} an nsqlookupd (youzan or classic) HTTP address?"
            ) from None

    async def _get_any(
        self, bases: Sequence[str], path: str, params: dict[str, str], *, errors_ok: bool = False
    ) -> object:
        """The first answer of ``bases`` to ``GET path`` (an error answer is returned with
        ``errors_ok``, else raised); AdminError when none answers."""
        failures: list[str] = []
        for base in bases:
            try:
                answer = await self._request("GET", base, path, params)
            except ConnectionClosedError as exc:
                failures.append(str(exc))
                continue
            if isinstance(answer, LookupdHTTPError) and not errors_ok:
                raise _refused(answer, base + path)
            return answer
        raise AdminError(f"no nsqlookupd answered {path}: " + "; ".join(failures))


def _refused(answer: LookupdHTTPError, url: str) -> AdminError:
    return AdminError(answer.message, status=answer.status, url=url)


def _channel_names(channels: Sequence[str]) -> list[str]:
    if isinstance(channels, str):
        raise ValidationError("channels", "takes a list of channel names, not a str")
    return list(dict.fromkeys(check_channel(name) for name in channels))


def _check_count(field: str, value: object, maximum: int) -> None:
    if type(value) is not int or not 1 <= value <= maximum:
        raise ValidationError(field, f"must be an int in 1..{maximum}, not {value!r}")


def _partition_ids(partitions: Sequence[int] | None) -> list[int] | None:
    """The partitions asked for, checked and without repeats (None: every partition)."""
    if partitions is None:
        return None
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
        raise ValidationError("partitions", "takes a list of partition numbers")
    if not partitions:
        raise ValidationError("partitions", "is empty (None means every partition)")
    return list(dict.fromkeys(check_partition(p, "partitions") for p in partitions))


def _seek_position(position: object) -> StartPosition:
    """``position``: a StartPosition, or one of the two positions Kafka users name, as
    ``Consumer(start=...)`` takes them."""
    if position == "earliest":
        return StartPosition.earliest()
    if position == "latest":
        return StartPosition.latest()
    if not isinstance(position, StartPosition):
        raise ValidationError(
            "position",
            "must be a StartPosition (StartPosition.earliest(), .latest(), .queue_offset(n), "
            ".message_count(n), .timestamp(t), or StartPosition.parse(text)), 'earliest' or "
            f"'latest'; got {position!r}",
        )
    return position


def _check_wait(wait: float | None) -> float | None:
    if wait is None:
        return None
    if type(wait) not in (int, float) or not wait >= 0:
        raise ValidationError("wait", "must be None or a number of seconds >= 0")
    return float(wait)


def _check_same(
    topic: str, existing: TopicMeta, wanted: TopicMeta, refusal: AdminError | None
) -> None:
    """An existing topic is fine when it has the settings asked for."""
    if _differs(existing, wanted):
        raise AdminError(
            f"topic {topic!r} exists with other settings ({_describe(existing)}); "
            f"asked for {_describe(wanted)}",
            status=refusal.status if refusal is not None else None,
            url=refusal.url if refusal is not None else "",
        ) from refusal


def _differs(existing: TopicMeta, wanted: TopicMeta) -> bool:
    return (
        existing.partition_num,
        existing.replica,
        existing.ordered,
        existing.multi_part,
        existing.extend_support,
        existing.disable_channel_auto_create,
    ) != (
        wanted.partition_num,
        wanted.replica,
        wanted.ordered,
        wanted.multi_part,
        wanted.extend_support,
        wanted.disable_channel_auto_create,
    )


def _describe(meta: TopicMeta) -> str:
    flags = [
        name
        for name, on in (
            ("ordered", meta.ordered),
            ("multi-part", meta.multi_part),
            ("ext", meta.extend_support),
            ("disable_channel_auto_create", meta.disable_channel_auto_create),
        )
        if on
    ]
    shown = f"{meta.partition_num} partitions x {meta.replica} replicas"
    return shown + (", " + ", ".join(flags) if flags else "")


def _producers(payload: object) -> list[dict[str, object]]:
    """The ``producers`` of a ``/nodes`` answer."""
    producers = payload.get("producers") if isinstance(payload, dict) else None
    return [p for p in producers or () if isinstance(p, dict)]


def _create_params(topic: str, meta: TopicMeta) -> dict[str, str]:
    """nsqlookupd ``/topic/create``'s parameters for a topic of ``meta``'s settings."""
    params = {
        "topic": topic,
        "partition_num": str(meta.partition_num),
        "replicator": str(meta.replica),
    }
    for flag, wanted in (
        ("orderedmulti", meta.ordered),
        ("multipart", meta.multi_part),
        ("extend", meta.extend_support),
        ("disable_channel_auto_create", meta.disable_channel_auto_create),
    ):
        if wanted:
            params[flag] = "true"
    return params


def _placement_problem(
    partitions: int, replicas: int, multi: bool, nodes: int | None
) -> tuple[str, str] | None:
    """Why nsqlookupd cannot place a topic on ``nodes`` nsqd nodes, in words with what
    would fit (field, message), or None when it can or the node count is unknown. ``multi``:
    an ordered or multi-part topic, whose partitions may share nodes."""
    if nodes is None:
        return None
    if replicas > nodes:
        return (
            "replicas",
            f"{replicas} replicas asked, but the cluster has {_nodes(nodes)}: every replica "
            f"of a partition needs a node of its own; ask for at most {nodes}",
        )
    if multi or partitions * replicas <= nodes:
        return None
    fits = [f"{nodes // replicas} x {replicas}"] if nodes // replicas else []
    if nodes // partitions and nodes // partitions != replicas:
        fits.append(f"{partitions} x {nodes // partitions}")
    return (
        "partitions",
        f"a plain topic puts every replica of every partition on a node of its own: "
        f"{partitions} partitions x {replicas} replicas need {partitions * replicas} nsqd "
        f"nodes, the cluster has {_nodes(nodes)}. Ask for at most "
        f"{' or '.join(fits)} (partitions x replicas), or make the topic ordered or "
        "multi-part (ordered=True or multi_part=True; smartnsq topic create --ordered or "
        "--multi-part), whose partitions may share nodes",
    )


def _refused_placement(
    exc: AdminError, topic: str, partitions: int, replicas: int, multi: bool, nodes: int | None
) -> PlacementError:
    """nsqlookupd's "No node is available for topic", in words."""
    field, message = _placement_problem(partitions, replicas, multi, nodes) or (
        "replicas" if multi or partitions == 1 else "partitions",
        f"nsqlookupd found no nsqd node for part of topic {topic!r} "
        f"({partitions} partitions x {replicas} replicas"
        + (f", {_nodes(nodes)} registered" if nodes is not None else "")
        + "): every replica of a partition needs a live node of its own"
        + ("" if multi else ", and a plain topic one per replica of every partition")
        + "; check that enough nsqd nodes are up, or ask for fewer replicas"
        + ("" if multi else " or partitions, or make the topic ordered or multi-part"),
    )
    return PlacementError(
        field,
        message,
        partitions=partitions,
        replicas=replicas,
        nodes=nodes,
        status=exc.status,
        url=exc.url,
        detail=exc.message,
    )


def _nodes(count: int) -> str:
    return f"{count} nsqd node" + ("" if count == 1 else "s")
