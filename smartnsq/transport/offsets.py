"""A youzan channel's position in one partition, over its leader's nsqd HTTP API: moving it
(``POST /channel/setoffset``) and reading it (``GET /stats``). One request each, on an httpx
client the caller owns; the arguments and answers are ``smartnsq.protocol.offsets``'.

``Admin.seek`` and ``Admin.offsets`` use these for every partition of a topic; a consumer can
call :func:`set_channel_offset` for each partition it is about to subscribe to, with the
partition leader's HTTP address from its lookup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smartnsq.errors import AdminError, NotLeaderError, ProtocolError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.lookupd import ACCEPT_V1, LookupdHTTPError, unwrap_response
from smartnsq.protocol.offsets import (
    CHANNEL_NOT_FOUND,
    EMPTY_QUEUE,
    NOT_LEADER,
    SETOFFSET_PATH,
    STATS_PATH,
    PartitionOffsets,
    parse_partition_offsets,
    setoffset_body,
    setoffset_params,
    stats_params,
    v1_error_message,
)
from smartnsq.transport.httpclient import client_timeout, exchange

if TYPE_CHECKING:
    import httpx

__all__ = ["read_channel_offsets", "set_channel_offset"]


async def set_channel_offset(
    http: httpx.AsyncClient,
    leader: str,
    topic: str,
    partition: int,
    channel: str,
    position: StartPosition,
) -> bool:
    """Move ``channel`` of ``topic``'s ``partition`` to ``position`` on the partition's
    ``leader`` (its nsqd HTTP ``host:port``). False: the partition holds no message, so the
    channel is already at the only position there is and nothing was moved.

    After a move, nsqd forgets the channel's messages in flight (their FINs fail) and
    redelivers from the new position, not necessarily in queue order.

    Raises ValidationError (bad arguments, before anything is sent), NotLeaderError
    (``leader`` does not lead the partition: refresh the layout and try the new leader),
    AdminError (refused: no such channel on the leader, or a position nsqd cannot place;
    ``status``, ``message`` and ``url`` say which), ConnectionClosedError (no answer) or
    ProtocolError (the answer is not nsqd's).
    """
    params = setoffset_params(topic, partition, channel)
    body = setoffset_body(position)
    url = f"http://{leader}{SETOFFSET_PATH}"
    answer = await _request(http, "POST", url, params, body)
    if isinstance(answer, LookupdHTTPError):
        if answer.message == EMPTY_QUEUE:
            return False
        if answer.message == NOT_LEADER:
            raise NotLeaderError(
                f"{leader} does not lead partition {partition} of {topic!r}",
                command="POST " + SETOFFSET_PATH,
                address=leader,
            )
        detail = answer.message
        if answer.message == CHANNEL_NOT_FOUND:
            detail = (
                f"{CHANNEL_NOT_FOUND}: channel {channel!r} does not exist on partition "
                f"{partition} of {topic!r} (register it, or subscribe once, first)"
            )
        raise AdminError(detail, status=answer.status, url=url)
    return True


async def read_channel_offsets(
    http: httpx.AsyncClient, leader: str, topic: str, partition: int, channel: str
) -> PartitionOffsets:
    """The queue's start and end and ``channel``'s position in ``topic``'s ``partition``,
    from the partition ``leader``'s ``/stats`` (its nsqd HTTP ``host:port``). Raises as
    :func:`set_channel_offset` does (AdminError for a refused request)."""
    params = stats_params(topic, partition, channel)
    url = f"http://{leader}{STATS_PATH}"
    answer = await _request(http, "GET", url, params)
    if isinstance(answer, LookupdHTTPError):
        raise AdminError(answer.message, status=answer.status, url=url)
    return parse_partition_offsets(answer, topic, partition, channel, leader)


async def _request(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    params: dict[str, str],
    body: bytes | None = None,
) -> object:
    """The answer's payload or its LookupdHTTPError (nsqd's API shares lookupd's
    envelopes), within the client's timeout as a whole."""
    answer = await exchange(
        http,
        method,
        url,
        params=params,
        content=body,
        headers={"Accept": ACCEPT_V1},
        timeout=client_timeout(http),
    )
    status = answer.status
    try:
        return unwrap_response(status, answer.headers, answer.body)
    except ProtocolError as exc:
        message = v1_error_message(answer.body)
        if message is not None and status >= 400:
            return LookupdHTTPError(status, message)
        raise ProtocolError(f"{url} answered in a way nsqd does not ({exc})") from None
