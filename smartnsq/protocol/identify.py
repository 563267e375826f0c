"""IDENTIFY: the request a client sends and the feature negotiation nsqd answers with
(``protocolV2.IDENTIFY`` in ``nsqd/protocol_v2.go``, nsqio/nsq v1.3.0; youzan/nsq
0.3.7-HA.1.13.0 in ``nsqdserver/protocol_v2.go``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from smartnsq.errors import ProtocolError, ValidationError
from smartnsq.protocol import commands
from smartnsq.protocol.validation import MAX_DESIRED_TAG_LENGTH, MAX_RDY_COUNT

__all__ = ["IdentifyRequest", "IdentifyResponse", "is_youzan_version", "keeps_rdy_count"]

MAX_HEARTBEAT_INTERVAL_MS = 60_000
MAX_OUTPUT_BUFFER_SIZE = 64 * 1024
MAX_OUTPUT_BUFFER_TIMEOUT_MS = 1000
MAX_MSG_TIMEOUT_MS = 15 * 60 * 1000
MAX_DEFLATE_LEVEL = 6


def is_youzan_version(version: str) -> bool:
    """youzan HA nodes report versions such as ``0.3.7-HA.1.13.0`` (to IDENTIFY and to
    nsqlookupd alike)."""
    return "-HA." in version


# nsqd before 0.2.29 took one off a client's RDY count for every message it sent, so a client
# had to send the count again as it ran low; since then (nsqio/nsq v1.3.0 and youzan/nsq
# 0.3.7-HA.1.13.0 alike, nsqd/client_v2.go SendingMessage) it counts the message in flight
# and keeps the count as the client sent it.
_RDY_KEPT_SINCE = (0, 2, 29)


def keeps_rdy_count(version: str) -> bool:
    """Whether an nsqd of ``version`` (what IDENTIFY reports: ``1.3.0``,
    ``0.3.7-HA.1.13.0``) keeps a client's RDY count as sent. False for a version it cannot
    read: the client then refreshes the count as it runs low, which every version takes."""
    parts = version.split("-", 1)[0].split(".")[:3]
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return False
    return (int(parts[0]), int(parts[1]), int(parts[2])) >= _RDY_KEPT_SINCE


def _check_int(name: str, value: object) -> int:
    if type(value) is not int:
        raise ValidationError(name, f"must be an int, not {type(value).__name__}")
    return value


@dataclass(frozen=True)
class IdentifyRequest:
    """What the client tells nsqd about itself. Durations are in milliseconds, as on the wire.

    ``None`` means "not sent, use the server's default". ``deflate_level`` is always sent with
    ``deflate`` because youzan nsqd treats a missing level as level 0 (``nsqd/client_v2.go``,
    ``Identify``).
    """

    client_id: str
    hostname: str
    user_agent: str
    heartbeat_interval: int = 30_000
    output_buffer_size: int | None = None
    output_buffer_timeout: int | None = None
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: int | None = None
    extend_support: bool | None = None
    desired_tag: str | None = None
    ext_filter: Mapping[str, Any] | None = None
    feature_negotiation: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        hb = _check_int("heartbeat_interval", self.heartbeat_interval)
        if hb not in (-1, 0) and not 1000 <= hb <= MAX_HEARTBEAT_INTERVAL_MS:
            raise ValidationError(
                "heartbeat_interval", f"must be -1, 0 or 1000..{MAX_HEARTBEAT_INTERVAL_MS} ms"
            )
        if self.output_buffer_size is not None:
            size = _check_int("output_buffer_size", self.output_buffer_size)
            if size not in (-1, 0) and not 64 <= size <= MAX_OUTPUT_BUFFER_SIZE:
                raise ValidationError(
                    "output_buffer_size", f"must be -1, 0 or 64..{MAX_OUTPUT_BUFFER_SIZE} bytes"
                )
        if self.output_buffer_timeout is not None:
            timeout = _check_int("output_buffer_timeout", self.output_buffer_timeout)
            if timeout not in (-1, 0) and not 1 <= timeout <= MAX_OUTPUT_BUFFER_TIMEOUT_MS:
                raise ValidationError(
                    "output_buffer_timeout",
                    f"must be -1, 0 or 1..{MAX_OUTPUT_BUFFER_TIMEOUT_MS} ms",
                )
        if self.snappy and self.deflate:
            raise ValidationError("deflate", "snappy and deflate cannot both be enabled")
        level = _check_int("deflate_level", self.deflate_level)
        if not 1 <= level <= MAX_DEFLATE_LEVEL:
            raise ValidationError("deflate_level", f"must be 1..{MAX_DEFLATE_LEVEL}")
        rate = _check_int("sample_rate", self.sample_rate)
        if not 0 <= rate <= 99:
            raise ValidationError("sample_rate", "must be 0..99")
        if self.msg_timeout is not None:
            mt = _check_int("msg_timeout", self.msg_timeout)
            if mt != 0 and not 1000 <= mt <= MAX_MSG_TIMEOUT_MS:
                raise ValidationError("msg_timeout", f"must be 0 or 1000..{MAX_MSG_TIMEOUT_MS} ms")
        if self.desired_tag is not None and (
            not isinstance(self.desired_tag, str) or len(self.desired_tag) > MAX_DESIRED_TAG_LENGTH
        ):
            raise ValidationError(
                "desired_tag", f"must be a str of at most {MAX_DESIRED_TAG_LENGTH} characters"
            )
        if self.ext_filter is not None:
            _check_ext_filter(self.ext_filter)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "user_agent": self.user_agent,
            "feature_negotiation": self.feature_negotiation,
            "heartbeat_interval": self.heartbeat_interval,
            "tls_v1": self.tls_v1,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "sample_rate": self.sample_rate,
        }
        if self.deflate:
            data["deflate_level"] = self.deflate_level
        if self.output_buffer_size is not None:
            data["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            data["output_buffer_timeout"] = self.output_buffer_timeout
        if self.msg_timeout is not None:
            data["msg_timeout"] = self.msg_timeout
        if self.extend_support is not None:
            data["extend_support"] = self.extend_support
        if self.desired_tag:
            data["desired_tag"] = self.desired_tag
        if self.ext_filter is not None:
            data["ext_filter"] = dict(self.ext_filter)
        data.update(self.extra)
        return data

    def encode(self) -> bytes:
        return commands.identify(self.to_json())

    @functools.cached_property
    def encoded(self) -> bytes:
        """:meth:`encode`, once: the connections of one config share their request."""
        return self.encode()


@functools.lru_cache(maxsize=64)
def _decode_shared(data: bytes) -> IdentifyResponse:
    # A few nsqd nodes answer a process; a bad answer raises, and is not kept.
    return IdentifyResponse._parse(data)


def _check_ext_filter(ext_filter: Mapping[str, Any]) -> None:
    if not isinstance(ext_filter, Mapping):
        raise ValidationError("ext_filter", "must be a mapping")
    kind = ext_filter.get("type")
    if kind not in (1, 2, 3, 4):
        raise ValidationError("ext_filter.type", "must be 1 (exact), 2 (regexp), 3 (glob) or 4")
    key = ext_filter.get("filter_ext_key")
    if not isinstance(key, str) or not key:
        raise ValidationError("ext_filter.filter_ext_key", "must be a non-empty str")
    if kind == 4:
        if key not in ("any", "all"):
            raise ValidationError("ext_filter.filter_ext_key", "must be 'any' or 'all' for type 4")
        if not ext_filter.get("filter_data_list"):
            raise ValidationError("ext_filter.filter_data_list", "must not be empty for type 4")
    elif not ext_filter.get("filter_data"):
        raise ValidationError("ext_filter.filter_data", "must be a non-empty str")


@dataclass(frozen=True)
class IdentifyResponse:
    """nsqd's feature negotiation answer. The upgrade flags say what the server switches on."""

    max_rdy_count: int = MAX_RDY_COUNT
    version: str = ""
    max_msg_timeout: int = MAX_MSG_TIMEOUT_MS
    msg_timeout: int = 60_000
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int = MAX_DEFLATE_LEVEL
    snappy: bool = False
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    desired_tag: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_youzan(self) -> bool:
        """A youzan HA nsqd, by its version (see :func:`is_youzan_version`)."""
        return is_youzan_version(self.version)

    @property
    def keeps_rdy_count(self) -> bool:
        """This nsqd keeps a client's RDY count as sent (see :func:`keeps_rdy_count`)."""
        return keeps_rdy_count(self.version)

    @classmethod
    def decode(cls, data: bytes) -> IdentifyResponse | None:
        """Parse the answer; None when negotiation is off (plain ``OK``, or anything not JSON).

        An nsqd gives every connection the same answer: the same bytes decode to one
        shared response (read-only, ``raw`` too), not a copy per connection."""
        if not data.startswith(b"{"):
            return None
        if cls is not IdentifyResponse:
            return cls._parse(data)
        return _decode_shared(bytes(data))

    @classmethod
    def _parse(cls, data: bytes) -> IdentifyResponse:
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise ProtocolError(f"IDENTIFY answer is not valid JSON: {data[:80]!r}") from exc
        if not isinstance(obj, dict):
            raise ProtocolError("IDENTIFY answer is not a JSON object")
        kwargs: dict[str, Any] = {}
        for name, kind in (
            ("max_rdy_count", int),
            ("version", str),
            ("max_msg_timeout", int),
            ("msg_timeout", int),
            ("tls_v1", bool),
            ("deflate", bool),
            ("deflate_level", int),
            ("max_deflate_level", int),
            ("snappy", bool),
            ("sample_rate", int),
            ("auth_required", bool),
            ("output_buffer_size", int),
            ("output_buffer_timeout", int),
            ("desired_tag", str),
        ):
            if name in obj:
                value = obj[name]
                if not isinstance(value, kind):
                    raise ProtocolError(
                        f"IDENTIFY answer field {name} has type {type(value).__name__}"
                    )
                kwargs[name] = value
        return cls(raw=MappingProxyType(obj), **kwargs)

    def to_json(self) -> dict[str, Any]:
        """The answer as youzan nsqd writes it (key order as it sends it; desired_tag only
        when set)."""
        data: dict[str, Any] = {
            "max_rdy_count": self.max_rdy_count,
            "version": self.version,
            "max_msg_timeout": self.max_msg_timeout,
            "msg_timeout": self.msg_timeout,
            "tls_v1": self.tls_v1,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "max_deflate_level": self.max_deflate_level,
            "snappy": self.snappy,
            "sample_rate": self.sample_rate,
            "auth_required": self.auth_required,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout,
        }
        if self.desired_tag:
            data["desired_tag"] = self.desired_tag
        return data

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()
