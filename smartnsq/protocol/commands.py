"""Encoders for every client command (``protocolV2.Exec`` and the command handlers in
``nsqd/protocol_v2.go`` of nsqio/nsq v1.3.0, ``nsqdserver/protocol_v2.go`` of youzan/nsq
0.3.7-HA.1.13.0).

Each function validates its arguments (raising :class:`~smartnsq.errors.ValidationError`
before anything is produced) and returns the complete command as one ``bytes`` object, ready
to be written atomically. FIN, REQ and TOUCH take the raw 16-byte message id: on youzan nsqd
it is binary (8-byte internal id + 8-byte trace id) and may contain ``\\n`` or spaces, which
the server handles by reading fixed byte offsets, so it must never be split.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.protocol._build import speedups
from smartnsq.protocol.validation import (
    MAX_BODY_SIZE,
    MAX_DPUB_DELAY_MS,
    MAX_MSG_SIZE,
    MAX_RDY_COUNT,
    MAX_REQ_DELAY_MS,
    check_bodies,
    check_body,
    check_channel,
    check_delay_ms,
    check_message_id,
    check_partition,
    check_rdy,
    check_topic,
    check_trace_id,
    encode_ext,
)

__all__ = [
    "CLS",
    "MAGIC_V2",
    "MAX_TIMESTAMP_SECONDS",
    "NOP",
    "StartPosition",
    "auth",
    "cls",
    "dpub",
    "fin",
    "identify",
    "mpub",
    "mpub_ext",
    "mpub_ext_head",
    "mpub_ext_with_head",
    "mpub_head",
    "mpub_trace",
    "mpub_with_head",
    "nop",
    "pub",
    "pub_ext",
    "pub_ext_head",
    "pub_ext_with_head",
    "pub_head",
    "pub_trace",
    "pub_with_head",
    "rdy",
    "req",
    "sub",
    "sub_advanced",
    "sub_ordered",
    "touch",
]

MAGIC_V2 = b"  V2"
NOP = b"NOP\n"
CLS = b"CLS\n"

_pack_u32 = struct.Struct(">I").pack
_pack_u16 = struct.Struct(">H").pack
_pack_u64 = struct.Struct(">Q").pack


def nop() -> bytes:
    return NOP


def cls() -> bytes:
    return CLS


def _line(*parts: str | int) -> bytes:
    return (" ".join(str(p) for p in parts) + "\n").encode()


def _with_body(line: bytes, body: bytes) -> bytes:
    return b"".join((line, _pack_u32(len(body)), body))


def _partition_suffix(partition: int | None) -> bytes:
    if partition is None:
        return b"\n"
    return b" %d\n" % check_partition(partition)


def identify(data: Mapping[str, Any]) -> bytes:
    """``IDENTIFY\\n[size][JSON]``. ``data`` is the JSON object (see ``protocol.identify``)."""
    if not isinstance(data, Mapping):
        raise ValidationError("identify", "must be a mapping")
    body = json.dumps(dict(data), separators=(",", ":")).encode()
    if len(body) > MAX_BODY_SIZE:
        raise ValidationError("identify", f"JSON is over {MAX_BODY_SIZE} bytes")
    return _with_body(b"IDENTIFY\n", body)


def auth(secret: bytes | str) -> bytes:
    """``AUTH\\n[size][secret]``; send only when IDENTIFY answered ``auth_required``."""
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValidationError("auth_secret", "must be a non-empty str or bytes")
    return _with_body(b"AUTH\n", bytes(secret))


def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    """``SUB <topic> <channel>[ <partition>]``. Partition-aware clients always send it."""
    head = f"SUB {check_topic(topic)} {check_channel(channel)}".encode()
    return head + _partition_suffix(partition)


def sub_ordered(topic: str, channel: str, partition: int) -> bytes:
    """``SUB_ORDERED <topic> <channel> <partition>`` (the wire name; SUB_ORDER does not exist).

    nsqd would take the command without a partition (the one the node leads); ordered
    consumption is per partition, so the partition is required here."""
    return _line(
        "SUB_ORDERED", check_topic(topic), check_channel(channel), check_partition(partition)
    )


@dataclass(frozen=True)
class StartPosition:
    """A position in a youzan partition's queue, as nsqd reads it: the body of
    ``POST /channel/setoffset`` (``Admin.seek``) and SUB_ADVANCED's start position (honoured
    for a channel's first client only). ``str()`` gives the wire form ``<kind>:<value>``,
    :meth:`text` the documented form that :meth:`parse` reads.

    - :meth:`queue_offset` (``offset:N``, wire ``virtual_queue``): a byte offset in the
      queue; one inside a message starts at the next message.
    - :meth:`message_count` (``message:N``, wire ``msgcount``): the N-th message, from 1.
    - :meth:`timestamp` (``timestamp:T``): the first message published at or after that unix
      second. nsqd finds positions by the second: a fraction (``time.time()``) is dropped.
      nsqd multiplies the second by 10^9 in a signed 64-bit integer, so seconds past
      :data:`MAX_TIMESTAMP_SECONDS` (2262) are refused here: such a value, in milliseconds
      say, would wrap round in nsqd and move the channel to a position nobody asked for.
    - :meth:`earliest` (byte offset 0: the queue's first message) and :meth:`latest` /
      :meth:`end` (``special:-1``: after the last message).

    Positions before the queue land on its first message. nsqd moves a position past the
    queue's end to the end, without an error: ``Admin.seek`` says where each partition went.
    The constructor takes any wire form as is (``StartPosition("msgcount", 0)``, which nsqd
    reads as the first message); the named constructors and :meth:`parse` refuse message 0.
    """

    kind: str
    value: int

    _KINDS = ("timestamp", "virtual_queue", "msgcount", "special")
    # Text forms parse() reads besides the wire kinds: earliest, latest, offset:N, message:N.
    _ALIASES = {"offset": "virtual_queue", "message": "msgcount"}
    _TEXT = {"virtual_queue": "offset", "msgcount": "message", "timestamp": "timestamp"}

    def __post_init__(self) -> None:
        if self.kind not in self._KINDS:
            raise ValidationError("start.kind", f"must be one of {', '.join(self._KINDS)}")
        if type(self.value) is not int:
            raise ValidationError("start.value", "must be an int")
        if self.kind == "special" and self.value != -1:
            raise ValidationError("start.value", "special positions only allow -1 (end)")
        if self.kind != "special" and self.value < 0:
            raise ValidationError("start.value", f"must be >= 0, got {self.value}")
        if self.value > _INT64_MAX:
            raise ValidationError("start.value", "must fit in a signed 64-bit integer")
        if self.kind == "timestamp":
            _check_seconds(self.value, "start.value")

    @classmethod
    def timestamp(cls, unix_seconds: float) -> StartPosition:
        """The first message published at or after ``unix_seconds`` (an int, or a float such
        as ``time.time()``: nsqd works in whole seconds, so the fraction is dropped). Seconds,
        not milliseconds: a value past :data:`MAX_TIMESTAMP_SECONDS` raises ValidationError."""
        if type(unix_seconds) is float:
            if not math.isfinite(unix_seconds) or unix_seconds < 0:
                raise ValidationError(
                    "start.value", f"timestamp: must be unix seconds >= 0, got {unix_seconds}"
                )
            return cls("timestamp", math.floor(unix_seconds))
        if type(unix_seconds) is not int:
            kind = type(unix_seconds).__name__
            raise ValidationError(
                "start.value", f"timestamp: must be unix seconds (int or float), not {kind}"
            )
        return cls("timestamp", unix_seconds)

    @classmethod
    def queue_offset(cls, offset: int) -> StartPosition:
        return cls("virtual_queue", offset)

    @classmethod
    def message_count(cls, count: int) -> StartPosition:
        """The ``count``-th message of the partition, from 1 (the first message)."""
        if type(count) is int and count == 0:
            raise ValidationError(
                "start.value",
                "message counts start at 1 (the first message); the queue's start is earliest",
            )
        return cls("msgcount", count)

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls("virtual_queue", 0)

    @classmethod
    def latest(cls) -> StartPosition:
        return cls("special", -1)

    @classmethod
    def end(cls) -> StartPosition:
        return cls("special", -1)

    @classmethod
    def parse(cls, text: str) -> StartPosition:
        """A position written as text: ``earliest``, ``latest``, ``offset:N``, ``message:N``
        (N from 1), ``timestamp:T`` (unix seconds, a fraction dropped, or an ISO 8601 time
        with its UTC offset), or a wire form (``virtual_queue:N``, ``msgcount:N``,
        ``special:-1``)."""
        if not isinstance(text, str):
            raise ValidationError("position", "must be a str")
        word = text.strip()
        if word in ("earliest", "latest"):
            return cls.earliest() if word == "earliest" else cls.latest()
        kind, sep, value = word.partition(":")
        kind = cls._ALIASES.get(kind, kind)
        if not sep or kind not in cls._KINDS:
            raise ValidationError(
                "position",
                f"{text!r}: expected earliest, latest, offset:N, message:N or timestamp:T",
            )
        if kind == "timestamp" and not _is_integer(value):
            seconds = _decimal_seconds(value)
            if seconds is None:
                seconds = _iso_seconds(value)
                if seconds > MAX_TIMESTAMP_SECONDS:
                    raise ValidationError(
                        "position", f"{text!r} is after the last second nsqd can take (2262)"
                    )
            return cls("timestamp", _check_seconds(seconds, "position"))
        if not _is_integer(value):
            raise ValidationError("position", f"{text!r}: {value!r} is not an integer")
        if kind == "timestamp":
            _check_seconds(int(value), "position")
        if kind == "msgcount" and int(value) == 0:
            raise ValidationError(
                "position",
                f"{text!r}: messages count from 1 (message:1 is the first); the queue's "
                "start is earliest",
            )
        return cls(kind, int(value))

    def text(self) -> str:
        """The documented form, which :meth:`parse` reads back: ``earliest``, ``latest``,
        ``offset:N``, ``message:N`` or ``timestamp:T``."""
        if self.kind == "special":
            return "latest"
        if self.kind == "virtual_queue" and self.value == 0:
            return "earliest"
        return f"{self._TEXT[self.kind]}:{self.value}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


_INT64_MAX = (1 << 63) - 1
#: The last unix second nsqd can take as a timestamp position (2262-04-11): youzan nsqd's
#: ``SearchLogByMsgTimestamp`` (consistence/nsqd_coordinator.go, youzan/nsq 0.3.7-HA.1.13.0)
#: multiplies the second by 10^9 in an int64, refuses a product that wrapped below zero
#: ("Invalid timestamp") and searches for one that wrapped to another positive value.
MAX_TIMESTAMP_SECONDS = _INT64_MAX // 1_000_000_000


def _check_seconds(seconds: int, field: str) -> int:
    """``seconds`` when nsqd can represent it as a timestamp position; else ValidationError,
    naming the unit a too large value was probably given in."""
    if seconds <= MAX_TIMESTAMP_SECONDS:
        return seconds
    unit, per_second = "nanoseconds", 10**9
    if seconds <= MAX_TIMESTAMP_SECONDS * 10**3:
        unit, per_second = "milliseconds", 10**3
    elif seconds <= MAX_TIMESTAMP_SECONDS * 10**6:
        unit, per_second = "microseconds", 10**6
    raise ValidationError(
        field,
        f"timestamp {seconds} is not unix seconds nsqd can take (at most "
        f"{MAX_TIMESTAMP_SECONDS}, in 2262); in {unit}? divide by {per_second}",
    )


def _is_integer(text: str) -> bool:
    digits = text[1:] if text[:1] == "-" else text
    return digits.isascii() and digits.isdigit()


def _decimal_seconds(text: str) -> int | None:
    """Whole unix seconds of a decimal number of seconds (``1795765880.5``), None if
    ``text`` is not one."""
    whole, dot, fraction = text.partition(".")
    if not dot or not (whole or fraction) or not (whole + fraction).isascii():
        return None
    if not (whole + fraction).isdigit():
        return None
    return int(whole or "0")


def _iso_seconds(text: str) -> int:
    """Unix seconds of an ISO 8601 time that states its UTC offset (``Z`` allowed)."""
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise ValidationError(
            "position", f"timestamp {text!r}: expected unix seconds or an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        raise ValidationError("position", f"timestamp {text!r} has no UTC offset (add Z or +HH:MM)")
    return math.floor(moment.timestamp())


def sub_advanced(
    topic: str, channel: str, partition: int, start: StartPosition | None = None
) -> bytes:
    """``SUB_ADVANCED <topic> <channel> <partition>[ <type>:<value>]``."""
    parts: list[str | int] = [
        "SUB_ADVANCED",
        check_topic(topic),
        check_channel(channel),
        check_partition(partition),
    ]
    if start is not None:
        if not isinstance(start, StartPosition):
            raise ValidationError("start", "must be a StartPosition")
        parts.append(str(start))
    return _line(*parts)


def pub(
    topic: str, body: bytes | str, partition: int | None = None, *, max_msg_size: int = MAX_MSG_SIZE
) -> bytes:
    """``PUB <topic>[ <partition>]\\n[size][body]``."""
    data = check_body(body, max_msg_size)
    return pub_with_head(pub_head(topic, partition), data)


def pub_head(topic: str, partition: int | None = None) -> bytes:
    """``PUB <topic>[ <partition>]\\n``, validated: a producer keeps it per destination and
    frames each checked body with :func:`pub_with_head`."""
    return b"PUB " + check_topic(topic).encode() + _partition_suffix(partition)


def pub_with_head(head: bytes, body: bytes) -> bytes:
    """A PUB from :func:`pub_head` and a body already checked by ``check_body``."""
    return b"".join((head, _pack_u32(len(body)), body))


def _mpub_frame(
    head: bytes, elements: Sequence[bytes], max_body_size: int, unit: str = "bytes"
) -> bytes:
    if speedups is not None:  # the compiled twin: one preallocated frame, one copy per body
        frame: bytes | None = speedups.mpub_frame(head, elements, max_body_size, unit)
        if frame is not None:  # None: not a list of bytes, the reference below takes it
            return frame
    return pure_mpub_frame(head, elements, max_body_size, unit)


def pure_mpub_frame(
    head: bytes, elements: Sequence[bytes], max_body_size: int, unit: str = "bytes"
) -> bytes:
    """The MPUB frame: ``head``, ``[size][count]``, then ``[size][element]`` each."""
    sizes = list(map(len, elements))
    size = 4 + 4 * len(sizes) + sum(sizes)
    if size > max_body_size:
        raise ValidationError(
            "bodies", f"batch is {size} {unit}, over the maximum of {max_body_size}"
        )
    # [size][count] then [size][element] each, interleaved without a Python-level loop
    framed = chain.from_iterable(zip(map(_pack_u32, sizes), elements, strict=True))
    return b"".join((head, _pack_u32(size), _pack_u32(len(sizes)), *framed))


def mpub(
    topic: str,
    bodies: Iterable[bytes | str],
    partition: int | None = None,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
    max_body_size: int = MAX_BODY_SIZE,
) -> bytes:
    """``MPUB <topic>[ <partition>]\\n[size][count]([msg size][msg])*``."""
    data = check_bodies(bodies, max_msg_size, max_body_size)
    return mpub_with_head(mpub_head(topic, partition), data, max_body_size)


def mpub_head(topic: str, partition: int | None = None) -> bytes:
    """``MPUB <topic>[ <partition>]\\n``, validated, for :func:`mpub_with_head`."""
    return b"MPUB " + check_topic(topic).encode() + _partition_suffix(partition)


def mpub_with_head(
    head: bytes, bodies: Sequence[bytes], max_body_size: int = MAX_BODY_SIZE
) -> bytes:
    """An MPUB from :func:`mpub_head` and bodies each already checked by ``check_body`` (as
    ``check_bodies`` does): a producer checks a batch once, not on every attempt. Only the
    frame's size is checked here, with ``check_bodies``' message."""
    return _mpub_frame(head, bodies, max_body_size, "bytes on the wire")


def pub_trace(
    topic: str,
    body: bytes | str,
    trace_id: int,
    partition: int | None = None,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
) -> bytes:
    """``PUB_TRACE <topic> <partition>\\n[size][uint64 trace id][body]``; answered by a receipt."""
    data = check_body(body, max_msg_size - 8)
    head = b"PUB_TRACE " + check_topic(topic).encode() + _partition_suffix(partition)
    return b"".join((head, _pack_u32(len(data) + 8), _pack_u64(check_trace_id(trace_id)), data))


def mpub_trace(
    topic: str,
    bodies: Iterable[bytes | str],
    trace_ids: Iterable[int],
    partition: int | None = None,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
    max_body_size: int = MAX_BODY_SIZE,
) -> bytes:
    """``MPUB_TRACE``: each element is ``[uint64 trace id][payload]``."""
    data = check_bodies(bodies, max_msg_size - 8, max_body_size)
    ids = [check_trace_id(t) for t in trace_ids]
    if len(ids) != len(data):
        raise ValidationError("trace_ids", f"{len(ids)} trace ids for {len(data)} bodies")
    head = b"MPUB_TRACE " + check_topic(topic).encode() + _partition_suffix(partition)
    return _mpub_frame(
        head, [_pack_u64(t) + b for t, b in zip(ids, data, strict=True)], max_body_size
    )


def _ext_element(ext: Mapping[str, Any] | bytes | None, body: bytes) -> bytes:
    return _raw_ext_element(None if ext is None else encode_ext(ext), body)


def _raw_ext_element(raw: bytes | None, body: bytes) -> bytes:
    """``[uint16 json len][json][body]`` from JSON already checked by ``encode_ext``."""
    raw = b"" if raw is None else raw
    return b"".join((_pack_u16(len(raw)), raw, body))


def pub_ext(
    topic: str,
    body: bytes | str,
    ext: Mapping[str, Any] | bytes,
    partition: int | None = None,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
) -> bytes:
    """``PUB_EXT <topic> <partition>\\n[size][uint16 json len][json][body]``.

    The reply is a trace receipt when ``ext`` carries a valid ``##trace_id``, otherwise ``OK``.
    ``ext`` must be a JSON object (nsqd refuses an empty header with E_INVALID_JSON_HEADER
    and takes any other JSON value; both are refused here before sending).
    """
    data = check_body(body, max_msg_size)
    return pub_ext_with_head(pub_ext_head(topic, partition), data, encode_ext(ext))


def pub_ext_head(topic: str, partition: int | None = None) -> bytes:
    """``PUB_EXT <topic>[ <partition>]\n``, validated, for :func:`pub_ext_with_head`."""
    return b"PUB_EXT " + check_topic(topic).encode() + _partition_suffix(partition)


def pub_ext_with_head(head: bytes, body: bytes, raw_ext: bytes) -> bytes:
    """A PUB_EXT from :func:`pub_ext_head`, a body checked by ``check_body`` and an ext
    header already encoded (JSON text): the frame as :func:`pub_ext` makes it."""
    element = _raw_ext_element(raw_ext, body)
    return b"".join((head, _pack_u32(len(element)), element))


def mpub_ext(
    topic: str,
    bodies: Iterable[bytes | str],
    exts: Iterable[Mapping[str, Any] | bytes | None],
    partition: int | None = None,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
    max_body_size: int = MAX_BODY_SIZE,
) -> bytes:
    """``MPUB_EXT``: each element is ``[uint16 json len][json][payload]`` (len 0 = no header)."""
    data = check_bodies(bodies, max_msg_size, max_body_size)
    headers = list(exts)
    if len(headers) != len(data):
        raise ValidationError("exts", f"{len(headers)} ext headers for {len(data)} bodies")
    head = mpub_ext_head(topic, partition)
    return _mpub_frame(
        head, [_ext_element(e, b) for e, b in zip(headers, data, strict=True)], max_body_size
    )


def mpub_ext_head(topic: str, partition: int | None = None) -> bytes:
    """``MPUB_EXT <topic>[ <partition>]\\n``, validated, for :func:`mpub_ext_with_head`."""
    return b"MPUB_EXT " + check_topic(topic).encode() + _partition_suffix(partition)


def mpub_ext_with_head(
    head: bytes,
    bodies: Sequence[bytes],
    raw_exts: Sequence[bytes | None],
    max_body_size: int = MAX_BODY_SIZE,
) -> bytes:
    """An MPUB_EXT from :func:`mpub_ext_head`, bodies checked by ``check_bodies`` and ext
    headers already encoded by ``encode_ext`` (None: no header), one per body. Only the
    frame's size is checked here."""
    if len(raw_exts) != len(bodies):
        raise ValidationError("exts", f"{len(raw_exts)} ext headers for {len(bodies)} bodies")
    return _mpub_frame(head, list(map(_raw_ext_element, raw_exts, bodies)), max_body_size)


def dpub(
    topic: str,
    body: bytes | str,
    delay_ms: int,
    *,
    max_msg_size: int = MAX_MSG_SIZE,
    max_delay_ms: int = MAX_DPUB_DELAY_MS,
) -> bytes:
    """``DPUB <topic> <defer ms>\\n[size][body]`` (classic nsqd only; youzan rejects it)."""
    data = check_body(body, max_msg_size)
    line = _line("DPUB", check_topic(topic), check_delay_ms(delay_ms, max_delay_ms))
    return _with_body(line, data)


def rdy(count: int, max_rdy_count: int = MAX_RDY_COUNT) -> bytes:
    """``RDY <count>``."""
    return b"RDY %d\n" % check_rdy(count, max_rdy_count)


def fin(message_id: bytes) -> bytes:
    """``FIN <16-byte id>\\n``: exactly 21 bytes."""
    if type(message_id) is bytes and len(message_id) == 16:  # the id of a decoded frame
        return b"FIN " + message_id + b"\n"
    return b"FIN " + check_message_id(message_id) + b"\n"


def req(message_id: bytes, delay_ms: int = 0, *, max_delay_ms: int = MAX_REQ_DELAY_MS) -> bytes:
    """``REQ <16-byte id> <delay ms>\\n``."""
    delay = check_delay_ms(delay_ms, max_delay_ms)
    return b"REQ " + check_message_id(message_id) + b" %d\n" % delay


def touch(message_id: bytes) -> bytes:
    """``TOUCH <16-byte id>\\n``: exactly 23 bytes."""
    return b"TOUCH " + check_message_id(message_id) + b"\n"


# The compiled twin, where it was built (and SMARTNSQ_PURE is not set): the same bytes.
pure_fin = fin
if speedups is not None:
    fin = speedups.fin
