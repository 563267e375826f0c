"""The embedded cluster's error, in a module of its own so that every part of the emulator
(and the container clusters, which derive from it) can raise it without importing the rest.
:mod:`smartnsq.testing.cluster` re-exports it."""

from __future__ import annotations

__all__ = ["ClusterError"]


class ClusterError(RuntimeError):
    """A fault-injection or topology request the emulated cluster cannot honour."""
