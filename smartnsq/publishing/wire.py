"""A publish on the wire (pure, no I/O): which command the server can take (and what it
refuses), the request as bytes, and nsqd's answer as :class:`PublishResult` values. The
request is never changed: each step returns what it decided.

Two caches keep the hot path short: the head of a PUB to one (topic, partition) is encoded
once, and a plain ``OK`` to one (topic, partition, address) is answered with the same
immutable result each time.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from smartnsq.errors import UnsupportedFeatureError, ValidationError
from smartnsq.protocol import commands
from smartnsq.protocol.responses import OK, TraceReceipt
from smartnsq.protocol.validation import MAX_BODY_SIZE, MAX_MSG_SIZE
from smartnsq.publishing.request import PublishRequest
from smartnsq.publishing.result import PublishResult
from smartnsq.publishing.routes import Route
from smartnsq.publishing.stamps import Stamp, stamped_header

__all__ = ["DISK_OVERHEAD", "Inject", "PublishCodec"]

# On-disk size of a youzan message beyond its body (length + header), for batch offsets; an
# ext topic adds one byte (the ext header's length, for an empty header).
DISK_OVERHEAD = 4 + 26
# Entries a codec caches at most (heads, results): a bound against unbounded topic names.
_CACHE_LIMIT = 4096

# Writes the trace context of a span (``traceparent``) into an ext header.
Inject = Callable[[MutableMapping[str, Any], Any], None]

_SINGLE = ("PUB", "PUB_TRACE", "PUB_EXT")
_pack_u32 = struct.Struct(">I").pack
_join = b"".join
_EXT_HEADS = "PUB_EXT"
_MPUB_EXT_HEADS = "MPUB_EXT"


class PublishCodec:
    """Encodes the attempts of a producer's publishes and decodes nsqd's answers.

    ``inject`` (OpenTelemetry's, from the Producer) writes a recording span's context into
    the ext header of a single message on an ext topic, so the consumer continues the trace;
    without it spans do not travel.
    """

    __slots__ = (
        "_ext_heads",
        "_inject",
        "_ok_results",
        "_pub_heads",
        "max_body_size",
        "max_msg_size",
    )

    def __init__(
        self,
        *,
        max_msg_size: int = MAX_MSG_SIZE,
        max_body_size: int = MAX_BODY_SIZE,
        inject: Inject | None = None,
    ) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._inject = inject
        self._pub_heads: dict[tuple[str, int | None], bytes] = {}
        self._ext_heads: dict[tuple[str, str, int | None], bytes] = {}
        self._ok_results: dict[tuple[str, int | None, str], PublishResult] = {}

    # ------------------------------------------------------------------ what the server takes

    @staticmethod
    def fit(request: PublishRequest, route: Route, youzan: bool) -> tuple[str, list[int] | None]:
        """The command and trace ids that the server of ``route`` takes for ``request``
        (``youzan`` says whether it is a youzan nsqd): a publish traced only by the trace
        switch goes untraced to classic nsqd. Every refusal of what a server cannot take lives
        here: it raises :class:`UnsupportedFeatureError`, before anything is sent."""
        command, trace_ids = request.command, request.trace_ids
        if youzan:
            if command == "DPUB":
                raise UnsupportedFeatureError(
                    "youzan nsqd has no deferred publish (DPUB); delay consumption with a "
                    "requeue delay instead"
                )
            if request.exts is not None and route.youzan and not route.ext_topic:
                raise UnsupportedFeatureError(
                    f"topic {request.topic!r} is not an ext topic (created without "
                    "extend=true); it cannot carry ext headers"
                )
            return command, trace_ids
        if request.auto_trace:
            command, trace_ids = ("MPUB" if request.batch else "PUB"), None
        if command not in ("PUB", "MPUB", "DPUB"):
            feature = "ext headers" if request.exts is not None else "trace ids"
            raise UnsupportedFeatureError(f"classic nsqd {route.address} has no {feature}")
        if request.partition is not None:
            raise UnsupportedFeatureError(f"classic nsqd {route.address} has no partitions")
        return command, trace_ids

    # ------------------------------------------------------------------ requests

    def prepare(
        self,
        request: PublishRequest,
        route: Route,
        youzan: bool,
        span: Any = None,
        stamp: Stamp | None = None,
        seqs: Sequence[int] | None = None,
    ) -> tuple[str, bytes, list[int] | None]:
        """One try of ``request`` on ``route`` (``youzan``: its server is a youzan nsqd): the
        command, its bytes and the trace ids they carry (see :meth:`fit`). On ext topics, a
        recording ``span`` travels in the ext header (W3C traceparent): the message goes as
        PUB_EXT; so does a ``stamp`` (:mod:`smartnsq.publishing.stamps`; the first message's,
        an MPUB's others take ``seqs``, or the numbers after it), unless it would make a
        message too big."""
        if (
            stamp is None
            and request.command == "PUB"
            and span is None
            and (youzan or request.partition is None)
        ):
            # The common case, which every server takes: nothing to fit, the head cached;
            # framed here as commands.pub_with_head does (two calls less per publish).
            head = self._pub_heads.get((request.topic, route.partition))
            body = request.bodies[0]
            if head is None:
                return "PUB", self._pub(request.topic, route.partition, body), None
            return "PUB", _join((head, _pack_u32(len(body)), body)), None
        command, trace_ids = self.fit(request, route, youzan)
        if stamp is not None and youzan and route.ext_topic:
            stamped = self._stamped(request, route, command, trace_ids, span, stamp, seqs)
            if stamped is not None:
                return stamped
        header = self._span_header(request, route, command, trace_ids, span)
        if header is not None:
            data = commands.pub_ext(
                request.topic,
                request.bodies[0],
                header,
                route.partition,
                max_msg_size=self.max_msg_size,
            )
            return "PUB_EXT", data, trace_ids
        return command, self.encode(request, route.partition, command, trace_ids), trace_ids

    def _span_header(
        self,
        request: PublishRequest,
        route: Route,
        command: str,
        trace_ids: list[int] | None,
        span: Any,
    ) -> dict[str, Any] | None:
        """The ext header of a single message that carries a recording ``span`` (its own
        header, the trace context and its trace id), or None when it carries none."""
        if (
            span is None
            or not route.ext_topic
            or self._inject is None
            or command not in _SINGLE
            or not span.is_recording()
        ):
            return None
        header: dict[str, Any] = {}
        if request.exts is not None and request.exts[0]:
            header.update(json.loads(request.exts[0]))
        self._inject(header, span)
        if trace_ids is not None:
            header["##trace_id"] = str(trace_ids[0])
        return header

    def _stamped(
        self,
        request: PublishRequest,
        route: Route,
        command: str,
        trace_ids: list[int] | None,
        span: Any,
        stamp: Stamp,
        seqs: Sequence[int] | None = None,
    ) -> tuple[str, bytes, list[int] | None] | None:
        """The try with its stamp in the ext header of each message: PUB_EXT for a single
        message (a trace id goes in the header: nsqd answers with the receipt), MPUB_EXT for
        a batch; None where a stamp does not fit (an MPUB_TRACE, whose receipts need the
        command; a message the header would take past ``max_msg_size``)."""
        producer, seq, floor = stamp
        bodies = request.bodies
        if command in _SINGLE:
            header = self._span_header(request, route, command, trace_ids, span)
            if header is not None:
                raw: bytes | None = json.dumps(header, separators=(",", ":")).encode()
            elif trace_ids is not None:
                raw = b'{"##trace_id":"%d"}' % trace_ids[0]
            else:
                raw = request.exts[0] if request.exts is not None else None
            raw = stamped_header(raw, producer, seq, floor)
            body = bodies[0]
            if 2 + len(raw) + len(body) > self.max_msg_size:
                return None
            data = commands.pub_ext_with_head(self._head(_EXT_HEADS, route), body, raw)
            return "PUB_EXT", data, trace_ids
        if command not in ("MPUB", "MPUB_EXT"):
            return None
        exts = request.exts if request.exts is not None else [None] * len(bodies)
        numbers = seqs if seqs is not None else range(seq, seq + len(bodies))
        raws = [
            stamped_header(ext, producer, number, floor)
            for ext, number in zip(exts, numbers, strict=True)
        ]
        limit = self.max_msg_size - 2
        if any(len(r) + len(b) > limit for r, b in zip(raws, bodies, strict=True)):
            return None
        head = self._head(_MPUB_EXT_HEADS, route)
        try:
            data = commands.mpub_ext_with_head(head, bodies, raws, self.max_body_size)
        except ValidationError:
            return None  # the headers take the batch past max_body_size
        return "MPUB_EXT", data, None

    def _head(self, kind: str, route: Route) -> bytes:
        """The cached head of a PUB_EXT or MPUB_EXT to ``route``'s (topic, partition)."""
        key = (kind, route.pool_topic, route.partition)
        head = self._ext_heads.get(key)
        if head is None:
            make = commands.pub_ext_head if kind == _EXT_HEADS else commands.mpub_ext_head
            head = make(route.pool_topic, route.partition)
            if len(self._ext_heads) < _CACHE_LIMIT:
                self._ext_heads[key] = head
        return head

    def _pub(self, topic: str, partition: int | None, body: bytes) -> bytes:
        # the body was checked by publish(); the head is the same for every PUB here
        head = self._pub_heads.get((topic, partition))
        if head is None:
            head = commands.pub_head(topic, partition)
            if len(self._pub_heads) < _CACHE_LIMIT:
                self._pub_heads[(topic, partition)] = head
        return commands.pub_with_head(head, body)

    def encode(
        self,
        request: PublishRequest,
        partition: int | None,
        command: str | None = None,
        trace_ids: list[int] | None = None,
    ) -> bytes:
        """``request`` as the bytes of ``command`` with ``trace_ids`` (by default its own
        command and trace ids), to ``partition``."""
        topic = request.topic
        bodies = request.bodies
        if command is None:
            command, trace_ids = request.command, request.trace_ids
        limits = {"max_msg_size": self.max_msg_size}
        if command == "PUB":
            return self._pub(topic, partition, bodies[0])
        if command == "PUB_TRACE" and trace_ids is not None:
            return commands.pub_trace(topic, bodies[0], trace_ids[0], partition, **limits)
        if command == "PUB_EXT" and request.exts is not None:
            ext = request.exts[0]
            return commands.pub_ext(topic, bodies[0], ext or b"{}", partition, **limits)
        if command == "DPUB" and request.delay_ms is not None:
            return commands.dpub(topic, bodies[0], request.delay_ms, **limits)
        if command == "MPUB":
            # bodies checked by publish_many() or, batched, by publish() and the batcher
            head = commands.mpub_head(topic, partition)
            return commands.mpub_with_head(head, bodies, self.max_body_size)
        if command == "MPUB_TRACE" and trace_ids is not None:
            # checked again: a trace id takes 8 bytes of each message's max_msg_size
            batch_limits = {**limits, "max_body_size": self.max_body_size}
            return commands.mpub_trace(topic, bodies, trace_ids, partition, **batch_limits)
        if command == "MPUB_EXT" and request.exts is not None:
            # bodies checked and ext headers encoded by publish_many()
            head = commands.mpub_ext_head(topic, partition)
            return commands.mpub_ext_with_head(head, bodies, request.exts, self.max_body_size)
        raise ValidationError("command", f"cannot encode {command}")

    # ------------------------------------------------------------------ answers

    def results(
        self,
        request: PublishRequest,
        route: Route,
        frame: bytes,
        tries: int,
        trace_ids: list[int] | None = None,
    ) -> list[PublishResult]:
        """nsqd's answer ``frame`` to the ``tries``-th try, which sent ``trace_ids`` (None:
        the request's own): one result per message."""
        topic, partition, address = request.topic, route.partition, route.address
        if frame == OK:
            if tries == 1:
                # Results are immutable: a plain acknowledgement is the same value each time.
                key = (topic, partition, address)
                result = self._ok_results.get(key)
                if result is None:
                    result = PublishResult(topic, partition, address)
                    if len(self._ok_results) < _CACHE_LIMIT:
                        self._ok_results[key] = result
            else:
                result = PublishResult(topic, partition, address, tries=tries)
            return [result] * len(request.bodies)
        receipt = TraceReceipt.decode(frame)
        if not request.batch:
            return [
                PublishResult(
                    topic,
                    partition,
                    address,
                    receipt.internal_id,
                    receipt.trace_id,
                    receipt.offset,
                    receipt.size,
                    tries,
                )
            ]
        # MPUB_TRACE answers for the batch: the first id and offset, the total size. An
        # atomic batch takes consecutive ids; offsets follow from each message's disk size,
        # and are given only when they add up to the receipt's size.
        sizes = [DISK_OVERHEAD + (1 if route.ext_topic else 0) + len(b) for b in request.bodies]
        exact = sum(sizes) == receipt.size
        trace_ids = trace_ids or request.trace_ids or [0] * len(request.bodies)
        results = []
        offset = receipt.offset
        for i, size in enumerate(sizes):
            results.append(
                PublishResult(
                    topic,
                    partition,
                    address,
                    receipt.internal_id + i,
                    trace_ids[i],
                    offset if exact or i == 0 else None,
                    size if exact else None,
                    tries,
                )
            )
            offset += size
        return results
