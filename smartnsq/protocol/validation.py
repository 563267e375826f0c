"""Argument validation shared by the command encoders and the clients.

Every check raises :class:`~smartnsq.errors.ValidationError` (a ``ValueError``) naming the
offending field, before any byte is written. Limits default to the servers' defaults
(``nsqd/options.go``, ``NewOptions``; names: ``internal/protocol/names.go``); callers that
negotiated other limits pass them explicitly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.protocol._build import speedups

MAX_NAME_LENGTH = 64
MAX_MSG_SIZE = 1024 * 1024
MAX_BODY_SIZE = 5 * 1024 * 1024
MAX_RDY_COUNT = 2500
MAX_EXT_JSON_SIZE = 65535
MAX_DESIRED_TAG_LENGTH = 100
UINT64_MAX = (1 << 64) - 1
MESSAGE_ID_SIZE = 16
# youzan's max_req_timeout (3 days); classic nsqd clamps to 1 h itself.
MAX_REQ_DELAY_MS = 3 * 24 * 3600 * 1000
# classic DPUB: 0 <= defer <= max_req_timeout (1 h by default).
MAX_DPUB_DELAY_MS = 3600 * 1000
# The most partitions a youzan topic can have. nsqlookupd's /topic/create takes 1..255
# (GetValidPartitionNum, nsqlookupd/http.go), then its coordinator's CreateTopic refuses 255
# and more with "max partition allowed exceed" (consistence/nsqlookup_coordinator.go;
# MAX_PARTITION_NUM is 255 in consistence/nsqlookup_coord_api.go, youzan/nsq 0.3.7-HA.1.13.0).
MAX_PARTITIONS = 254

_NAME_RE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")
_valid_names: set[str] = set()
_VALID_NAMES_CACHE = 8192
TRACE_ID_KEY = "##trace_id"


def _check_name(field: str, name: object) -> str:
    if type(name) is str and name in _valid_names:
        return name
    if not isinstance(name, str):
        raise ValidationError(field, f"must be a str, not {type(name).__name__}")
    if not 1 <= len(name) <= MAX_NAME_LENGTH:
        raise ValidationError(field, f"{name!r} must be 1..{MAX_NAME_LENGTH} characters long")
    if not _NAME_RE.match(name):
        raise ValidationError(
            field, f"{name!r} must match [.a-zA-Z0-9_-]+ with an optional '#ephemeral' suffix"
        )
    if len(_valid_names) < _VALID_NAMES_CACHE:
        _valid_names.add(name)
    return name


def check_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid NSQ topic name."""
    return _check_name("topic", topic)


def check_channel(channel: object) -> str:
    """Return ``channel`` if it is a valid NSQ channel name."""
    return _check_name("channel", channel)


def check_auto_create(registered_channels: bool, disable_channel_auto_create: bool | None) -> bool:
    """youzan's ``disable_channel_auto_create`` for a topic created with (or without)
    registered channels: on by default when there are some, and required by them, since
    youzan registers channels only on topics whose channels SUB cannot create."""
    if disable_channel_auto_create is None:
        return registered_channels
    if registered_channels and not disable_channel_auto_create:
        raise ValidationError(
            "channels",
            "registered (durable) channels need disable_channel_auto_create=True: youzan "
            "registers channels only on topics whose channels SUB cannot create",
        )
    return bool(disable_channel_auto_create)


def check_partition(partition: object, field: str = "partition") -> int:
    """A partition id is an int >= 0 (bool is refused).

    youzan nsqd also takes -1 (and no partition at all) for "the partition this node leads";
    the client never sends it: it routes every publish and subscription itself, and a
    server-chosen partition would hide which partition took a message (or make an ordered
    publish land on the wrong one). ``partition=None`` sends no partition where that is
    meaningful (classic nsqd)."""
    if type(partition) is not int:
        raise ValidationError(field, f"must be an int, not {type(partition).__name__}")
    if partition < 0:
        raise ValidationError(field, f"must be >= 0, got {partition}")
    return partition


def check_body(body: object, max_size: int = MAX_MSG_SIZE, field: str = "body") -> bytes:
    """Return the body as bytes: bytes-like or str (UTF-8), 1..max_size bytes."""
    if type(body) is bytes:
        data = body
    elif isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body)
    elif isinstance(body, str):
        data = body.encode("utf-8")
    else:
        raise ValidationError(field, f"must be bytes-like or str, not {type(body).__name__}")
    size = len(data)
    if size == 0:
        raise ValidationError(field, "must not be empty")
    if size > max_size:
        raise ValidationError(field, f"is {size} bytes, over the maximum of {max_size}")
    return data


_ONLY_BYTES = {bytes}


def pure_checked_size(bodies: list[Any], max_msg_size: int) -> int:
    """The bytes of ``bodies`` together when every one is ``bytes`` of 1..``max_msg_size``
    bytes (and there is one at least), else -1: a batch to check body by body. The
    reference of the compiled twin (``_speedups.checked_size``), which checks a batch
    without a Python call per body."""
    if not bodies or set(map(type, bodies)) != _ONLY_BYTES:
        return -1
    sizes = list(map(len, bodies))
    if min(sizes) == 0 or max(sizes) > max_msg_size:
        return -1
    return sum(sizes)


checked_size = pure_checked_size if speedups is None else speedups.checked_size


def check_bodies(
    bodies: object, max_msg_size: int = MAX_MSG_SIZE, max_body_size: int = MAX_BODY_SIZE
) -> list[bytes]:
    """Validate an MPUB batch: 1.. messages, each valid, whole frame within max_body_size."""
    if isinstance(bodies, (bytes, bytearray, memoryview, str)) or not hasattr(bodies, "__iter__"):
        raise ValidationError("bodies", "must be a sequence of bodies")
    out = list(bodies)
    if not out:
        raise ValidationError("bodies", "must contain at least one body")
    size = checked_size(out, max_msg_size)
    if size < 0:
        # the slow path names the first offending body
        out = [check_body(b, max_msg_size, field=f"bodies[{i}]") for i, b in enumerate(out)]
        size = sum(map(len, out))
    max_count = (max_body_size - 4) // 5
    if len(out) > max_count:
        raise ValidationError("bodies", f"{len(out)} messages, over the maximum of {max_count}")
    total = 4 + 4 * len(out) + size
    if total > max_body_size:
        raise ValidationError(
            "bodies", f"batch is {total} bytes on the wire, over the maximum of {max_body_size}"
        )
    return out


def check_uint64(value: object, field: str) -> int:
    if type(value) is not int:
        raise ValidationError(field, f"must be an int, not {type(value).__name__}")
    if not 0 <= value <= UINT64_MAX:
        raise ValidationError(field, f"must be in 0..2**64-1, got {value}")
    return value


def check_trace_id(trace_id: object) -> int:
    return check_uint64(trace_id, "trace_id")


def encode_ext(ext: object) -> bytes:
    """Validate an ext header and return its JSON bytes.

    The header is a JSON object of at most 65535 bytes; ``##trace_id``, when present, must be
    a string of decimal digits within uint64 (otherwise nsqd answers INVALID_TRACE_ID).
    Pre-encoded ``bytes`` are accepted if they parse as such an object.
    """
    if isinstance(ext, (bytes, bytearray, memoryview)):
        raw = bytes(ext)
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise ValidationError("ext", f"is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ValidationError("ext", "must be a JSON object")
        _check_ext_trace_id(parsed)
    elif isinstance(ext, Mapping):
        for key in ext:
            if not isinstance(key, str):
                raise ValidationError("ext", f"keys must be str, got {type(key).__name__}")
        _check_ext_trace_id(ext)
        try:
            raw = json.dumps(dict(ext), separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValidationError("ext", f"is not JSON-serialisable: {exc}") from None
    else:
        raise ValidationError("ext", f"must be a mapping, not {type(ext).__name__}")
    if len(raw) > MAX_EXT_JSON_SIZE:
        raise ValidationError(
            "ext", f"JSON is {len(raw)} bytes, over the maximum of {MAX_EXT_JSON_SIZE}"
        )
    return raw


def _check_ext_trace_id(ext: Mapping[str, Any]) -> None:
    if TRACE_ID_KEY not in ext:
        return
    value = ext[TRACE_ID_KEY]
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        raise ValidationError(
            f"ext[{TRACE_ID_KEY!r}]", f"must be a string of decimal digits, got {value!r}"
        )
    if int(value) > UINT64_MAX:
        raise ValidationError(f"ext[{TRACE_ID_KEY!r}]", f"{value} is out of the uint64 range")


def check_rdy(count: object, max_rdy_count: int = MAX_RDY_COUNT) -> int:
    if type(count) is not int:
        raise ValidationError("rdy", f"must be an int, not {type(count).__name__}")
    if not 0 <= count <= max_rdy_count:
        raise ValidationError("rdy", f"must be in 0..{max_rdy_count}, got {count}")
    return count


def check_message_id(message_id: object) -> bytes:
    if not isinstance(message_id, (bytes, bytearray, memoryview)):
        raise ValidationError("message_id", f"must be bytes, not {type(message_id).__name__}")
    raw = bytes(message_id)
    if len(raw) != MESSAGE_ID_SIZE:
        raise ValidationError("message_id", f"must be {MESSAGE_ID_SIZE} bytes, got {len(raw)}")
    return raw


def check_delay_ms(delay_ms: object, maximum: int, field: str = "delay") -> int:
    if type(delay_ms) is not int:
        raise ValidationError(
            field, f"must be an int of milliseconds, not {type(delay_ms).__name__}"
        )
    if not 0 <= delay_ms <= maximum:
        raise ValidationError(field, f"must be in 0..{maximum} ms, got {delay_ms}")
    return delay_ms
