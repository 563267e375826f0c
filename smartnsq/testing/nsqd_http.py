"""Emulated nsqd HTTP API, youzan HA flavour or classic nsqd 1.3.

Answers follow the real servers' handlers: youzan/nsq 0.3.7-HA.1.13.0 ``nsqdserver/http.go``
(``doPUB``, ``doPUBExt``, ``doPUBTrace``, ``doMPUB``, ``doStats``, ``doCreateChannel``,
``doSetChannelOffset``) and nsqio/nsq v1.3.0 ``nsqd/http.go``: the same order of checks,
statuses, envelopes and error strings. The publishing rules themselves live in
:mod:`smartnsq.testing.publish`, shared with TCP.

youzan: ``GET /ping``, ``GET /info``, ``POST /pub``, ``/pub_ext``, ``/mpub`` (negotiated
envelope), ``POST /pubtrace`` (v1), ``GET /stats`` (negotiated), ``POST /channel/create`` (v1),
``POST /channel/setoffset`` (v1; the rules in :mod:`smartnsq.testing.offsets`).
Classic: ``GET /ping``, ``GET /info``, ``POST /pub``, ``/mpub``, ``GET /stats``,
``POST /topic/create``, ``/topic/delete``, ``/channel/create`` (all v1, as nsqd 1.x answers).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from smartnsq.testing.http import (
    ApiError,
    Mode,
    Request,
    Response,
    Route,
    dispatch,
)
from smartnsq.testing.nsqd_stats import StatsQuery, classic_stats, stats_text, youzan_stats
from smartnsq.testing.offsets import OffsetError, locate_position, parse_position, seek_channel
from smartnsq.testing.publish import (
    PublishError,
    append_message,
    check_leader,
    check_writable,
    go_atoi,
    go_json,
    header_trace_id,
    parse_trace_id,
    resolve_partition,
    split_binary,
    split_lines,
    valid_name,
)

if TYPE_CHECKING:
    from smartnsq.testing.nsqd import NsqdNode
    from smartnsq.testing.state import Partition, PartitionLog, Topic

__all__ = ["NsqdHttpApi"]

TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"
EXT_HEADER_PREFIX = "x-nsqext-"
_GET = ("GET",)
_POST = ("POST",)


def _error(status: int, exc: PublishError) -> ApiError:
    return ApiError(status, exc.code)


class NsqdHttpApi:
    def __init__(self, node: NsqdNode) -> None:
        self.node = node
        if node.settings.youzan:
            self.routes = {
                "/ping": Route(_GET, self._ping, Mode.PLAIN),
                "/info": Route(_GET, self._info, Mode.NEGOTIATE),
                "/pub": Route(_POST, self._pub, Mode.NEGOTIATE),
                "/pub_ext": Route(_POST, self._pub_ext, Mode.NEGOTIATE),
                "/pubtrace": Route(_POST, self._pub_trace, Mode.V1),
                "/mpub": Route(_POST, self._mpub, Mode.NEGOTIATE),
                "/stats": Route(_GET, self._stats, Mode.NEGOTIATE),
                "/channel/create": Route(_POST, self._channel_create, Mode.V1),
                "/channel/setoffset": Route(_POST, self._channel_setoffset, Mode.V1),
            }
        else:
            self.routes = {
                "/ping": Route(_GET, self._ping, Mode.PLAIN),
                "/info": Route(_GET, self._info, Mode.V1),
                "/pub": Route(_POST, self._classic_pub, Mode.V1),
                "/mpub": Route(_POST, self._classic_mpub, Mode.V1),
                "/stats": Route(_GET, self._stats, Mode.V1),
                "/topic/create": Route(_POST, self._classic_topic_create, Mode.V1),
                "/topic/delete": Route(_POST, self._classic_topic_delete, Mode.V1),
                "/channel/create": Route(_POST, self._classic_channel_create, Mode.V1),
            }

    async def handle(self, request: Request) -> Response:
        return await dispatch(self.routes, request)

    # ------------------------------------------------------------------ shared

    def _ping(self, request: Request) -> str:
        return "OK"

    def _info(self, request: Request) -> dict[str, Any]:
        node = self.node
        info: dict[str, Any] = {
            "version": node.settings.version,
            "broadcast_address": node.directory.broadcast_address,
            "hostname": node.directory.hostname,
            "http_port": node.http_port,
            "tcp_port": node.tcp_port,
            "start_time": node.start_time,
        }
        if node.settings.youzan:
            info["ha_support"] = True
        return info

    def _stats(self, request: Request) -> Any:
        query = StatsQuery(
            request.arg("topic") or "",
            request.arg("partition") or "",
            request.arg("channel") or "",
            leader_only=_go_bool(request.arg("leaderOnly") or ""),
            include_clients=_go_bool(request.arg("include_clients") or "true"),
            include_mem=_go_bool(request.arg("include_mem") or "true"),
        )
        node = self.node
        stats = youzan_stats(node, query) if node.settings.youzan else classic_stats(node, query)
        if request.arg("format") != "json":
            return stats_text(node, stats).encode()
        return stats

    def _published(self) -> None:
        self.node.changes.changed()

    # ------------------------------------------------------------------ youzan publish

    def _topic_partition(
        self, request: Request, *, channel: bool = False, missing_partition: int = -1
    ) -> tuple[Topic, Partition]:
        """nsqd's getExistingTopic(Channel)FromQuery: argument errors are 400 (with the text
        of Go's error), a partition this node does not hold is 404 E_TOPIC_NOT_EXIST.
        ``missing_partition``: the partition when the argument is absent or empty."""
        name = request.arg("topic") or ""
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        text = request.arg("partition") or ""
        partition_id = missing_partition
        if text:
            try:
                partition_id = go_atoi(text)
            except ValueError as exc:
                raise ApiError(400, str(exc)) from None
        if channel:
            _channel_arg(request)
        try:
            return resolve_partition(self.node.topology.topics, self.node.index, name, partition_id)
        except PublishError as exc:
            raise _error(404, exc) from None

    def _check_pub_size(self, request: Request) -> None:
        if len(request.body) > self.node.settings.max_msg_size:
            raise ApiError(413, "MSG_TOO_BIG")
        if not request.body:
            raise ApiError(406, "MSG_EMPTY")

    def _pub(self, request: Request) -> Any:
        return self._internal_pub(request, trace=False, ext=False)

    def _pub_trace(self, request: Request) -> Any:
        return self._internal_pub(request, trace=True, ext=False)

    def _pub_ext(self, request: Request) -> Any:
        return self._internal_pub(request, trace=False, ext=True)

    def _internal_pub(self, request: Request, *, trace: bool, ext: bool) -> Any:
        """youzan's internalPUB: size checks, then the topic (every failure there is 404
        E_TOPIC_NOT_EXIST, whatever the cause), the leader check, the trace id and ext header,
        then the write."""
        self._check_pub_size(request)
        try:
            topic, partition = self._topic_partition(request)
        except ApiError:
            raise ApiError(404, TOPIC_NOT_EXIST) from None
        node = self.node
        try:
            check_leader(partition, node.index)
        except PublishError as exc:
            raise _error(400, exc) from None
        trace_text = request.arg("trace_id") or ""
        trace_id = parse_trace_id(trace_text)
        if trace_id is None and trace:
            raise ApiError(400, "INVALID_TRACE_ID")
        need_receipt = trace
        header: dict[str, Any] | None = None
        raw = b""
        if ext:
            header = self._ext_header(request)
            try:
                text, value = header_trace_id(header)
            except PublishError as exc:
                raise _error(400, exc) from None
            if text is not None:
                trace_text, trace_id, need_receipt = text, value, True
            raw = go_json(header)
            if not topic.ext:
                if not node.settings.allow_ext_compatible:
                    raise ApiError(400, "E_EXT_NOT_SUPPORT")
                header = None  # allow_ext_compatible: the header is dropped
        try:
            check_writable(partition, node.index)
        except PublishError as exc:
            raise _error(400, exc) from None
        record = append_message(
            partition.log, request.body, trace_id=trace_id or 0, header=header, raw_header=raw
        )
        self._published()
        if need_receipt:
            return {
                "status": "OK",
                "id": record.internal_id,
                "trace_id": trace_text,
                "queue_offset": record.offset,
                "rawsize": record.raw_size,
            }
        return "OK"

    def _ext_header(self, request: Request) -> dict[str, Any]:
        """The ``ext`` query argument (a JSON object), overridden by ``X-Nsqext-<key>``
        headers (keys lower-cased, as Go canonicalises them)."""
        text = unquote(request.arg("ext") or "")
        if not text:
            raise ApiError(400, "E_INVALID_JSON_HEADER")
        try:
            header = json.loads(text)
        except ValueError:
            raise ApiError(400, "E_INVALID_JSON_HEADER") from None
        if not isinstance(header, dict):
            raise ApiError(400, "E_INVALID_JSON_HEADER")
        for name, value in request.headers.items():
            if name.startswith(EXT_HEADER_PREFIX):
                header[name[len(EXT_HEADER_PREFIX) :]] = value
        return header

    def _mpub(self, request: Request) -> Any:
        """youzan's doMPUB: body limit, topic (argument errors pass through), body split,
        leader check, write."""
        settings = self.node.settings
        if len(request.body) > settings.max_body_size:
            raise ApiError(413, "BODY_TOO_BIG")
        _, partition = self._topic_partition(request)
        messages = self._split(request, binary="binary" in request.query)
        node = self.node
        try:
            check_writable(partition, node.index)
        except PublishError as exc:
            raise _error(400, exc) from None
        if not messages:
            # nsqd divides its latency figure by the message count after the write and
            # panics; its panic handler answers this.
            raise ApiError(500, "INTERNAL_ERROR", always_v1=True)
        partition.log.extend(messages)
        self._published()
        return "OK"

    def _split(self, request: Request, *, binary: bool) -> list[bytes]:
        settings = self.node.settings
        try:
            if binary:
                return split_binary(request.body, settings.max_msg_size, settings.max_body_size)
            return split_lines(request.body, settings.max_msg_size)
        except PublishError as exc:
            raise _error(413, exc) from None

    def _channel_create(self, request: Request) -> None:
        """Creates the channel on one partition; only its leader may (youzan's
        doCreateChannel: a replica answers 400 E_FAILED_ON_NOT_LEADER)."""
        _, partition = self._topic_partition(request, channel=True)
        try:
            check_leader(partition, self.node.index)
        except PublishError as exc:
            raise _error(400, exc) from None
        self.node.topology.ensure_channel(partition.log, _channel_arg(request))

    def _channel_setoffset(self, request: Request) -> None:
        """doSetChannelOffset: the query (GetTopicPartitionArgs takes partition 0 when it is
        absent), the channel on this node (a replica holds its copy), the body, then the
        leader check; a position the search cannot place is 500 with nsqd's text."""
        _, partition = self._topic_partition(request, channel=True, missing_partition=0)
        name = _channel_arg(request)
        node = self.node.index
        live = partition.leader == node
        if name not in (partition.log.channels if live else partition.copies_on(node)):
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        if not request.body:
            raise ApiError(406, "MSG_EMPTY")
        try:
            position = parse_position(request.body)
        except OffsetError as exc:
            raise ApiError(400, _go_text(exc)) from None
        try:
            check_leader(partition, node)
        except PublishError as exc:
            raise _error(400, exc) from None
        channel = partition.log.channels[name]
        try:
            index = locate_position(partition.log, position)
        except OffsetError as exc:
            raise ApiError(500, _go_text(exc)) from None
        seek_channel(channel, index, reorder=True)
        self.node.changes.changed()

    # ------------------------------------------------------------------ classic

    def _classic_topic(self, request: Request) -> PartitionLog:
        """nsqd 1.x getTopicFromQuery: it creates the topic once the name is valid."""
        if "topic" not in request.query:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        name = request.query["topic"][0]
        if not valid_name(name):
            raise ApiError(400, "INVALID_TOPIC")
        return self.node.topology.classic_topic(self.node.index, name)

    def _classic_pub(self, request: Request) -> str:
        settings = self.node.settings
        if len(request.body) > settings.max_msg_size:
            raise ApiError(413, "MSG_TOO_BIG")
        if not request.body:
            raise ApiError(400, "MSG_EMPTY")
        log_ = self._classic_topic(request)
        delay_ms = 0
        if "defer" in request.query:
            try:
                delay_ms = go_atoi(request.query["defer"][0])
            except ValueError:
                raise ApiError(400, "INVALID_DEFER") from None
            if not 0 <= delay_ms <= settings.max_req_timeout * 1000:
                raise ApiError(400, "INVALID_DEFER")
        record = log_.append(request.body)
        if delay_ms:
            # the same deferral as TCP DPUB
            record.not_before = time.monotonic() + delay_ms / 1000
        self._published()
        return "OK"

    def _classic_mpub(self, request: Request) -> str:
        if len(request.body) > self.node.settings.max_body_size:
            raise ApiError(413, "BODY_TOO_BIG")
        log_ = self._classic_topic(request)
        binary = "binary" in request.query and _go_bool(request.query["binary"][0], True)
        log_.extend(self._split(request, binary=binary))
        self._published()
        return "OK"

    def _classic_topic_create(self, request: Request) -> None:
        self._classic_topic(request)

    def _classic_topic_delete(self, request: Request) -> None:
        """nsqd 1.x doDeleteTopic: the topic, its channels and messages go."""
        name = request.arg("topic") or ""
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if name not in self.node.classic_topics:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        self.node.topology.delete_classic_topic(self.node.index, name)

    def _classic_channel_create(self, request: Request) -> None:
        name = request.arg("topic") or ""
        if not name:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not valid_name(name):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        channel = _channel_arg(request)
        log_ = self.node.classic_topics.get(name)
        if log_ is None:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        self.node.topology.ensure_channel(log_, channel)


def _channel_arg(request: Request) -> str:
    channel = request.arg("channel") or ""
    if not channel:
        raise ApiError(400, "MISSING_ARG_CHANNEL")
    if not valid_name(channel):
        raise ApiError(400, "INVALID_ARG_CHANNEL")
    return channel


def _go_text(exc: Exception) -> str:
    """An error text as Go's JSON encoder writes it (bytes that are not UTF-8 replaced)."""
    return str(exc).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _go_bool(text: str, default: bool = False) -> bool:
    """Go's ``strconv.ParseBool`` (``default`` when it does not parse)."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return default
