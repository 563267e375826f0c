"""The dead-letter file: one JSON line per message a consumer gave up on, with enough of
the message (ids, attempts, ext headers, body) to inspect or republish it later."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from smartnsq.consumer.message import Message
from smartnsq.errors import ValidationError

__all__ = ["check_dead_letter_path", "dead_letter_record", "write_dead_letter"]

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


def check_dead_letter_path(path: object) -> Path:
    """``dead_letter_path`` as a ``Path``, refused (ValidationError) where no line could ever
    be appended: not a path, a directory, a file in a directory that does not exist (the
    writer creates no directories) or under a regular file, or one this process may not
    write. Nothing is created: the file is made by the first dead letter."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValidationError("dead_letter_path", f"must be a path, not {path!r}")
    file = Path(path)
    if file.is_dir():
        raise ValidationError("dead_letter_path", f"{str(file)!r} is a directory, not a file")
    directory = file.parent
    if not directory.is_dir():
        # the nearest ancestor that exists says why: missing, or a regular file
        blocker = next((step for step in (directory, *directory.parents) if step.exists()), None)
        if blocker is not None and not blocker.is_dir():
            reason = f"{str(blocker)!r} is a file, not a directory"
        else:
            reason = f"its directory {str(directory)!r} does not exist"
        raise ValidationError("dead_letter_path", f"{str(file)!r} cannot be written: {reason}")
    writable = file if file.exists() else directory
    if not os.access(writable, os.W_OK):
        raise ValidationError(
            "dead_letter_path",
            f"{str(file)!r} cannot be written: no write permission on {str(writable)!r}",
        )
    return file


def write_dead_letter(message: Message, path: Path, attempts_run: int | None = None) -> bool:
    """Append ``message`` to the dead-letter file at ``path``; returns whether it was
    written. A file that cannot be written (a full disk, permissions changed since the
    consumer was made) is logged as an error: the consumer then requeues the message
    rather than finish it unrecorded."""
    line = json.dumps(dead_letter_record(message, attempts_run=attempts_run)) + "\n"
    try:
        with path.open("a", encoding="utf-8") as out:
            out.write(line)
    except OSError as exc:
        log.error(
            "%s: cannot write the dead-letter file %s: %s; message %s is requeued, not "
            "finished (given up again when it comes back)",
            message.topic,
            path,
            exc,
            message.id.hex(),
        )
        return False
    return True
