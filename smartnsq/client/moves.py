"""Channel moves announced within one process: when this process's ``Admin.seek`` moves a
channel, the consumers of this process that read it hear of it at once, so an ordered one
checks its order anew from the new position instead of taking the replayed messages for
replays or for an order violation. (A move made elsewhere, by another process or the CLI,
shows in the deliveries themselves: see :mod:`smartnsq.flow.ordering`.)

Listeners are plain callables called in the announcing thread; a consumer's listener hands
the news over to its own event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

__all__ = ["MoveListener", "announce", "listen"]

#: Called with the partitions moved (None: classic nsqd, which has no partitions).
MoveListener = Callable[[Sequence[int | None]], None]

_lock = threading.Lock()
_listeners: dict[tuple[str, str], list[MoveListener]] = {}


def listen(topic: str, channel: str, listener: MoveListener) -> Callable[[], None]:
    """Hear of the moves of ``channel`` of ``topic``; returns the function that stops it."""
    key = (topic, channel)
    with _lock:
        _listeners.setdefault(key, []).append(listener)

    def stop() -> None:
        with _lock:
            listeners = _listeners.get(key)
            if listeners is not None and listener in listeners:
                listeners.remove(listener)
                if not listeners:
                    del _listeners[key]

    return stop


def announce(topic: str, channel: str, partitions: Sequence[int | None]) -> None:
    """``channel`` of ``topic`` was moved on ``partitions``: tell whoever listens."""
    with _lock:
        listeners = list(_listeners.get((topic, channel), ()))
    for listener in listeners:
        listener(partitions)
