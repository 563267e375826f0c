"""The client-side message trace log (youzan design): logger ``smartnsq.trace``, one line
per event, ``key=value`` pairs, the same fields also attached to the record as ``nsq``.

* ``publish``: for traced publishes (those answered with a receipt): topic, partition,
  internal id, trace id, disk queue offset, size, nsqd address.
* ``consume``: topic, channel, partition, internal id, trace id, offset and size (ordered or
  advanced subscriptions), timestamp, consumer local address, nsqd address, attempts. Traced
  messages (non-zero trace id) are logged at INFO, the others at DEBUG.

Enable it like any logger, e.g. ``logging.getLogger("smartnsq.trace").setLevel("INFO")``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.consumer.message import Message
    from smartnsq.publishing.result import PublishResult

__all__ = ["TRACE_LOGGER", "format_fields", "log_consume", "log_publish"]

TRACE_LOGGER = logging.getLogger("smartnsq.trace")


def format_fields(event: str, fields: dict[str, Any]) -> str:
    parts = [event]
    for key, value in fields.items():
        if value is None:
            continue
        text = str(value)
        if not text or " " in text or "=" in text:
            text = repr(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def log_publish(result: PublishResult) -> None:
    if not TRACE_LOGGER.isEnabledFor(logging.INFO):
        return
    fields = {
        "topic": result.topic,
        "partition": result.partition,
        "internal_id": result.internal_id,
        "trace_id": result.trace_id,
        "offset": result.offset,
        "size": result.size,
        "nsqd": result.address,
    }
    TRACE_LOGGER.info(
        format_fields("publish", fields), extra={"nsq": {"event": "publish", **fields}}
    )


def log_consume(message: Message, local_address: str) -> None:
    level = logging.INFO if message.trace_id else logging.DEBUG
    if not TRACE_LOGGER.isEnabledFor(level):
        return
    fields = {
        "topic": message.topic,
        "channel": message.channel,
        "partition": message.partition,
        "internal_id": message.internal_id,
        "trace_id": message.trace_id,
        "offset": message.offset,
        "size": message.raw_size,
        "timestamp": message.timestamp,
        "local": local_address,
        "nsqd": message.address,
        "attempts": message.attempts,
    }
    TRACE_LOGGER.log(
        level, format_fields("consume", fields), extra={"nsq": {"event": "consume", **fields}}
    )
