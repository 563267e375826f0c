"""What a publish asks for (a message or an MPUB batch), as a value, and the checks and
conversions of the arguments that make one.

A :class:`PublishRequest` never changes once made: the router, the codec and the publish flow
each return what they decide about it (a route, the bytes to send, the state of its tries in
:class:`~smartnsq.publishing.flow.Publish`) and leave it as it was asked.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.protocol.validation import MAX_DPUB_DELAY_MS, check_trace_id, encode_ext

__all__ = [
    "NO_KEY",
    "PublishRequest",
    "batch_extras",
    "batch_request",
    "delay_to_ms",
    "ext_with_trace_id",
    "message_request",
    "new_trace_ids",
    "plain_request",
    "single_request",
]

# No sharding key was given (None cannot say so: it is refused as a key, not ignored).
NO_KEY: Any = object()


class PublishRequest(NamedTuple):
    """One publish as it was asked: the topic, the bodies (one for PUB, PUB_TRACE, PUB_EXT
    and DPUB; a batch for the MPUB commands), the command, where it must go (an explicit
    ``partition``, a sharding ``key``, or the ``address`` of the classic nsqd a batch was
    grouped for), the trace ids, the encoded ext headers and the DPUB delay.
    ``auto_trace``: traced by the producer's trace switch, not by the caller (classic nsqd
    has no tracing, so such a publish goes there untraced).

    A value, immutable at run time (a named tuple: assigning a field raises), its lists
    never modified. The hot path makes one with :func:`new_request`, which skips the named
    tuple's Python ``__new__`` (a tenth of a publish's own work).
    """

    topic: str
    command: str
    bodies: list[bytes]
    partition: int | None = None
    key: Any = NO_KEY
    trace_ids: list[int] | None = None
    exts: list[bytes | None] | None = None
    delay_ms: int | None = None
    auto_trace: bool = False
    address: str | None = None

    @property
    def batch(self) -> bool:
        return self.command.startswith("M")

    @property
    def movable(self) -> bool:
        """Neither a partition nor a key binds it: any writable partition will do."""
        return self.partition is None and self.key is NO_KEY


_tuple_new = tuple.__new__


def plain_request(
    topic: str, body: bytes, partition: int | None = None, key: Any = NO_KEY
) -> PublishRequest:
    """The request of a plain PUB (the hot path): built by tuple's own ``__new__``."""
    return _tuple_new(
        PublishRequest, (topic, "PUB", [body], partition, key, None, None, None, False, None)
    )


def single_request(topic: str, body: bytes, trace_ids: list[int] | None) -> PublishRequest:
    """An unkeyed PUB, or with ``trace_ids`` (one) a PUB_TRACE the trace switch traced."""
    if trace_ids is None:
        return plain_request(topic, body)
    return PublishRequest(topic, "PUB_TRACE", [body], trace_ids=trace_ids, auto_trace=True)


def message_request(
    topic: str,
    body: bytes,
    *,
    partition: int | None = None,
    key: Any = NO_KEY,
    trace_id: int | None = None,
    ext: Mapping[str, Any] | None = None,
    delay: float | None = None,
    switched_trace_id: Callable[[], int] | None = None,
) -> PublishRequest:
    """The request of ``publish()`` (``body``, ``partition`` and ``key`` checked already):
    PUB_TRACE with a ``trace_id``, PUB_EXT with an ``ext`` header (carrying the trace id as
    ``##trace_id`` when there is one), DPUB with a ``delay``. ``switched_trace_id`` (the trace
    switch is on for the topic) gives the trace id of a publish that names none and has no
    delay."""
    trace_ids: list[int] | None = None
    auto_trace = False
    command = "PUB"
    if trace_id is not None:
        trace_ids = [check_trace_id(trace_id)]
        command = "PUB_TRACE"
    elif delay is None and switched_trace_id is not None:
        trace_ids = [switched_trace_id()]
        command = "PUB_TRACE"
        auto_trace = True
    exts: list[bytes | None] | None = None
    if ext is not None:
        encoded = encode_ext(ext)
        if trace_ids is not None:
            # PUB_EXT carries a trace id in its header (and is answered with a receipt)
            encoded, trace = ext_with_trace_id(encoded, trace_ids[0], auto_trace)
            trace_ids = [trace]
        exts = [encoded]
        command = "PUB_EXT"
    delay_ms = None
    if delay is not None:
        if trace_id is not None or ext is not None:
            raise UnsupportedFeatureError("delay cannot be combined with trace_id or ext")
        delay_ms = delay_to_ms(delay)
        command = "DPUB"
    return PublishRequest(
        topic, command, [body], partition, key, trace_ids, exts, delay_ms, auto_trace
    )


def batch_extras(
    count: int,
    *,
    trace: bool = False,
    trace_ids: Sequence[int] | None = None,
    exts: Sequence[Mapping[str, Any] | None] | None = None,
    switched: bool = False,
) -> tuple[list[int] | None, list[bytes | None] | None, bool]:
    """The trace ids and encoded ext headers of a batch of ``count`` messages
    (``publish_many``'s ``trace``, ``trace_ids`` and ``exts``; ``switched``: the trace switch
    is on for the topic), checked, and whether the trace ids came from the switch."""
    ids: list[int] | None = None
    if trace_ids is not None:
        if len(trace_ids) != count:
            raise ValidationError("trace_ids", f"{len(trace_ids)} trace ids for {count} bodies")
        ids = [check_trace_id(t) for t in trace_ids]
    if exts is not None:
        if ids is not None or trace:
            raise UnsupportedFeatureError("MPUB cannot carry both trace ids and ext headers")
        if len(exts) != count:
            raise ValidationError("exts", f"{len(exts)} ext headers for {count} bodies")
        return None, [None if e is None else encode_ext(e) for e in exts], False
    auto = switched and not trace and ids is None
    if ids is None and (trace or auto):
        ids = new_trace_ids(count)
    return ids, None, auto


def batch_request(
    topic: str,
    bodies: list[bytes],
    *,
    partition: int | None = None,
    key: Any = NO_KEY,
    address: str | None = None,
    trace_ids: list[int] | None = None,
    exts: list[bytes | None] | None = None,
    auto_trace: bool = False,
) -> PublishRequest:
    """An MPUB request: MPUB_EXT with ext headers, MPUB_TRACE with trace ids."""
    command = "MPUB_EXT" if exts is not None else "MPUB" if trace_ids is None else "MPUB_TRACE"
    return PublishRequest(
        topic, command, bodies, partition, key, trace_ids, exts, None, auto_trace, address
    )


def delay_to_ms(delay: float) -> int:
    """A DPUB delay in seconds, checked, as nsqd's milliseconds."""
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ValidationError("delay", f"must be seconds >= 0, got {delay!r}")
    ms = round(delay * 1000)
    if ms > MAX_DPUB_DELAY_MS:
        raise ValidationError("delay", f"must be at most {MAX_DPUB_DELAY_MS // 1000} s")
    return ms


def ext_with_trace_id(ext: bytes, trace_id: int, generated: bool) -> tuple[bytes, int]:
    """The ext header carrying ``trace_id`` as ``##trace_id``. A header that has one already
    keeps it when ``trace_id`` was generated (the trace switch), and must agree with an
    explicit ``trace_id``."""
    header = json.loads(ext)
    present = header.get("##trace_id")
    if present is not None:
        if generated:
            return ext, int(present)
        if present != str(trace_id):
            raise ValidationError(
                "ext", f"its ##trace_id {present!r} differs from trace_id={trace_id}"
            )
        return ext, trace_id
    header["##trace_id"] = str(trace_id)
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode(), trace_id


def new_trace_ids(count: int) -> list[int]:
    """Random 64-bit trace ids, one per message."""
    return [random.getrandbits(64) for _ in range(count)]
