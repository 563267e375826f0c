"""The dead-letter file: one JSON line per message a consumer gave up on, with enough of
the message (ids, attempts, ext headers, body) to inspect or republish it later."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from smartnsq.consumer.message import Message

__all__ = ["dead_letter_record", "write_dead_letter"]

log = logging.getLogger("smartnsq.consumer")


def dead_letter_record(
    message: Message, given_up_at: float | None = None, attempts_run: int | None = None
) -> dict[str, Any]:
    """The JSON-ready record of ``message``; a body that is not UTF-8 keeps its bytes as
    backslash escapes rather than failing the write. ``attempts`` is nsqd's count of the
    message's deliveries, ``attempts_run`` how many times the handler ran on it (one less
    when it arrived past ``max_attempts``)."""
    return {
        "topic": message.topic,
        "channel": message.channel,
        "partition": message.partition,
        "id": message.id.hex(),
        "internal_id": message.internal_id,
        "trace_id": message.trace_id,
        "attempts": message.attempts,
        "attempts_run": message.attempts if attempts_run is None else attempts_run,
        "timestamp": message.timestamp,
        "ext": message.ext,
        "body": message.body.decode("utf-8", "backslashreplace"),
        "given_up_at": time.time() if given_up_at is None else given_up_at,
    }


def write_dead_letter(message: Message, path: Path, attempts_run: int | None = None) -> bool:
    """Append ``message`` to the dead-letter file at ``path``. A file that cannot be
    written is logged as an error (the message is still given up on: retrying forever
    because a disk is full would stall the whole consumer); returns whether it was written."""
    line = json.dumps(dead_letter_record(message, attempts_run=attempts_run)) + "\n"
    try:
        with path.open("a", encoding="utf-8") as out:
            out.write(line)
    except OSError as exc:
        log.error("%s: cannot write the dead-letter file %s: %s", message.topic, path, exc)
        return False
    return True
