"""Publishing rules of the emulated nsqd, shared by its TCP and HTTP front ends.

Pure functions over the topology's data: which partition a publish targets, whether this node
may write it, how message bodies are split and how an ext header is validated and stored.
Each front end maps :class:`PublishError` codes to its own answer (an error frame over TCP,
a status and message over HTTP), so the two paths cannot drift on the rules themselves.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from smartnsq.protocol.message import EXT_VERSION_JSON
from smartnsq.protocol.server import MpubFormatError, split_mpub
from smartnsq.protocol.validation import TRACE_ID_KEY, UINT64_MAX
from smartnsq.testing.golang import go_parse_int

if TYPE_CHECKING:
    from smartnsq.testing.state import Partition, PartitionLog, Record, Topic

__all__ = [
    "TAG_KEY",
    "PublishError",
    "append_message",
    "check_leader",
    "check_writable",
    "default_partition",
    "go_atoi",
    "go_json",
    "header_trace_id",
    "parse_trace_id",
    "resolve_partition",
    "split_binary",
    "split_lines",
    "valid_name",
]

TAG_KEY = "##client_dispatch_tag"
NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class PublishError(Exception):
    """A publish refused by nsqd: ``code`` is the server's error code."""

    def __init__(self, code: str, description: str = "") -> None:
        super().__init__(f"{code} {description}".rstrip())
        self.code = code
        self.description = description


@functools.lru_cache(maxsize=4096)  # checked on every PUB; a client uses few names
def valid_name(name: str) -> bool:
    """nsqd's topic/channel name rule (1..64 chars of ``[.a-zA-Z0-9_-]``, ``#ephemeral``)."""
    base = name[: -len("#ephemeral")] if name.endswith("#ephemeral") else name
    return 1 <= len(name) <= 64 and bool(base) and set(base) <= _NAME_CHARS


def go_atoi(text: str) -> int:
    """Go's ``strconv.Atoi`` (int64); the ValueError carries Go's message (servers echo it)."""
    return go_parse_int(text, "Atoi")


def parse_trace_id(text: str) -> int | None:
    """A trace id as nsqd reads it (``strconv.ParseUint(s, 10, 64)``): None if invalid."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if value <= UINT64_MAX else None


def default_partition(topic: Topic, node_index: int) -> int:
    """nsqd's "default partition" of a topic: the lowest one this node leads, else -1."""
    led = [pid for pid, p in topic.partitions.items() if p.leader == node_index]
    return min(led) if led else -1


def resolve_partition(
    topics: Mapping[str, Topic], node_index: int, topic_name: str, partition_id: int
) -> tuple[Topic, Partition]:
    """The topic partition a publish targets on this node (-1: the default partition), among
    the cluster's ``topics``.

    Raises E_TOPIC_NOT_EXIST when the node holds no such partition (leader or replica)."""
    topic = topics.get(topic_name)
    if topic is None:
        raise PublishError(TOPIC_NOT_EXIST)
    if partition_id < 0:
        partition_id = default_partition(topic, node_index)
    partition = topic.partitions.get(partition_id)
    if partition is None or node_index not in partition.replicas:
        raise PublishError(TOPIC_NOT_EXIST)
    return topic, partition


def check_leader(partition: Partition, node_index: int) -> None:
    """Only the partition leader accepts writes (and channel creations)."""
    if partition.leader != node_index:
        raise PublishError(NOT_LEADER)


def check_writable(partition: Partition, node_index: int) -> None:
    """Only the leader writes, and only while the partition has its replica quorum."""
    check_leader(partition, node_index)
    if not partition.writable:
        raise PublishError(NOT_WRITABLE)


def split_lines(body: bytes, max_msg_size: int) -> list[bytes]:
    """An HTTP ``/mpub`` text body: one message per line, empty lines silently skipped (as
    nsqd has done since 0.2.22). A line above the message limit: MSG_TOO_BIG."""
    messages = [line for line in body.split(b"\n") if line]
    if any(len(m) > max_msg_size for m in messages):
        raise PublishError("MSG_TOO_BIG")
    return messages


def split_binary(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """An HTTP ``/mpub?binary`` body (MPUB framing). Errors are the TCP codes without their
    ``E_`` prefix, which is how nsqd's HTTP handler reports them."""
    try:
        return split_mpub(body, max_msg_size, max_body_size)
    except MpubFormatError as exc:
        raise PublishError(
            "BAD_BODY" if exc.reason == "count" else "BAD_MESSAGE", str(exc)
        ) from None


def go_json(value: Any) -> bytes:
    """``json.Marshal`` of a decoded JSON value: compact, map keys sorted, and ``<``, ``>``,
    ``&``, U+2028 and U+2029 escaped (nsqd stores HTTP ext headers re-marshalled)."""
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text.encode()


def append_message(
    log_: PartitionLog,
    body: bytes,
    *,
    trace_id: int = 0,
    header: dict[str, Any] | None = None,
    raw_header: bytes = b"",
) -> Record:
    """Store one message; an ext header (already validated) sets the JSON ext block and the
    dispatch tag."""
    if header is None:
        return log_.append(body, trace_id=trace_id)
    tag = header.get(TAG_KEY)
    return log_.append(
        body,
        trace_id=trace_id,
        ext_version=EXT_VERSION_JSON,
        ext_raw=raw_header,
        tag=tag if isinstance(tag, str) else None,
    )


def header_trace_id(header: dict[str, Any]) -> tuple[str | None, int]:
    """The ``##trace_id`` of an ext header: (its text or None, its value). A present but
    invalid one (not a string of decimal digits) raises INVALID_TRACE_ID."""
    if TRACE_ID_KEY not in header:
        return None, 0
    text = header[TRACE_ID_KEY]
    value = parse_trace_id(text) if isinstance(text, str) else None
    if value is None:
        raise PublishError("INVALID_TRACE_ID", f"invalid trace id {text!r}")
    return text, value
