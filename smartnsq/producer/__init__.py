"""The publish side: the :class:`Producer` (``producer.py``: lifecycle, API, the retry loop)
and its auto-batching (``batching.py``). The decisions of a publish (where it goes, its
bytes, what nsqd's answer means) are pure code in :mod:`smartnsq.publishing`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.producer.producer import DEFAULT_PUBLISH_TIMEOUT as DEFAULT_PUBLISH_TIMEOUT
    from smartnsq.producer.producer import Producer as Producer
    from smartnsq.producer.producer import ProducerStats as ProducerStats
    from smartnsq.publishing.result import PublishResult as PublishResult

# Loaded on first use (PEP 562): importing one part of the package loads only what it needs.
_LAZY = {
    "DEFAULT_PUBLISH_TIMEOUT": "smartnsq.producer.producer",
    "Producer": "smartnsq.producer.producer",
    "ProducerStats": "smartnsq.producer.producer",
    "PublishResult": "smartnsq.publishing.result",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
