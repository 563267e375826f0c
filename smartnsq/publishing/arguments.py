"""A publish's arguments, checked, and the request they make (pure): what ``publish()`` and
``publish_many()`` of both producers (asyncio and ``smartnsq.sync``) ask, refused before
anything is sent when it is wrong. The trace switch (``Producer.set_trace``) is part of it:
it decides whether a publish is traced."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from smartnsq.errors import ValidationError
from smartnsq.protocol.validation import check_bodies, check_body, check_partition, check_topic
from smartnsq.publishing.request import (
    NO_KEY,
    PublishRequest,
    batch_extras,
    batch_request,
    message_request,
)
from smartnsq.routing.sharding import Sharder

__all__ = ["PublishArguments", "TraceSwitch", "check_publish_timeout"]

_new_request = tuple.__new__


def check_publish_timeout(name: str, value: object) -> float:
    """A publish's bound, in seconds: a number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValidationError(name, "must be > 0 seconds")
    return float(value)


class TraceSwitch:
    """Whether publishes are traced (PUB_TRACE with a generated trace id): for every topic
    (``default``), or per topic."""

    __slots__ = ("default", "topics")

    def __init__(self, default: bool = False) -> None:
        self.default = default
        self.topics: dict[str, bool] = {}

    def set(self, enabled: bool, topic: str | None = None) -> None:
        if topic is None:
            self.default = bool(enabled)
            self.topics.clear()
        else:
            self.topics[check_topic(topic)] = bool(enabled)

    def on(self, topic: str) -> bool:
        return self.topics.get(topic, self.default)


class PublishArguments:
    """Checks a producer's publishes: bodies against ``max_msg_size`` and ``max_body_size``,
    keys against the ``sharder`` (their type, before anything is sent), the trace ``switch``
    (a keyed publish's generated trace id is its key's hash with ``trace_key_hash``, as
    youzan go-nsq does)."""

    __slots__ = ("max_body_size", "max_msg_size", "sharder", "switch", "trace_key_hash")

    def __init__(
        self,
        *,
        max_msg_size: int,
        max_body_size: int,
        sharder: Sharder,
        trace_key_hash: bool = False,
        switch: TraceSwitch | None = None,
    ) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self.sharder = sharder
        self.trace_key_hash = trace_key_hash
        self.switch = switch if switch is not None else TraceSwitch()

    def message(
        self,
        topic: str,
        body: bytes | str,
        partition: int | None = None,
        sharding_key: Any = None,
        trace_id: int | None = None,
        ext: Mapping[str, Any] | None = None,
        delay: float | None = None,
        timeout: float | None = None,
    ) -> tuple[PublishRequest, float | None]:
        """``publish()``'s request, and its own time bound (None: ``publish_timeout``)."""
        check_topic(topic)
        data = check_body(body, self.max_msg_size)  # what body() checks, without its call
        if timeout is not None:
            timeout = check_publish_timeout("timeout", timeout)
        if partition is None and sharding_key is None:
            key = NO_KEY
        else:
            partition, key = self.binding(partition, sharding_key)
        switch = self.switch
        if (
            trace_id is None
            and ext is None
            and delay is None
            and not switch.topics.get(topic, switch.default)
        ):
            # plain_request's tuple, made here: a call less per publish
            fields = (topic, "PUB", [data], partition, key, None, None, None, False, None)
            return _new_request(PublishRequest, fields), timeout
        traced = switch.topics.get(topic, switch.default)
        request = message_request(
            topic,
            data,
            partition=partition,
            key=key,
            trace_id=trace_id,
            ext=ext,
            delay=delay,
            switched_trace_id=self._trace_ids(key) if traced else None,
        )
        return request, timeout

    def body(self, topic: str, body: bytes | str) -> bytes:
        """A publish's topic checked, and its body as the bytes to send (what an auto-batched
        publish needs of its arguments, when it names nothing else)."""
        check_topic(topic)
        return check_body(body, self.max_msg_size)

    def batch(
        self,
        topic: str,
        bodies: Iterable[bytes | str],
        partition: int | None = None,
        sharding_key: Any = None,
        trace: bool = False,
        trace_ids: Sequence[int] | None = None,
        exts: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> PublishRequest:
        """``publish_many()``'s request (one MPUB to one partition); ``topic`` checked
        already (by publish_many, before it chooses this path)."""
        data = check_bodies(list(bodies), self.max_msg_size, self.max_body_size)
        partition, key = self.binding(partition, sharding_key)
        ids, encoded, auto = batch_extras(
            len(data), trace=trace, trace_ids=trace_ids, exts=exts, switched=self.switch.on(topic)
        )
        return batch_request(
            topic, data, partition=partition, key=key, trace_ids=ids, exts=encoded, auto_trace=auto
        )

    def binding(self, partition: int | None, key: Any) -> tuple[int | None, Any]:
        """A publish's explicit partition or sharding key, checked (``NO_KEY``: none)."""
        if partition is not None and key is not None:
            raise ValidationError("partition", "give a partition or a sharding_key, not both")
        if partition is not None:
            return check_partition(partition), NO_KEY
        if key is not None:
            self.sharder.partition_for(key, 1)  # the key's type is checked now
            return None, key
        return None, NO_KEY

    def _trace_ids(self, key: Any) -> Callable[[], int]:
        def trace_id() -> int:
            if key is not NO_KEY and self.trace_key_hash:
                # youzan go-nsq traces a keyed publish with the key's hash
                hashed = self.sharder.hash32(key)
                if hashed is not None:
                    return hashed & 0xFFFFFFFF
            return random.getrandbits(64)

        return trace_id
