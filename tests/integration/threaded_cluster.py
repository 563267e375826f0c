"""The embedded cluster on its own event loop in a background thread, for tests of blocking
code (the sync facade, scripts in subprocesses, forked children).

The cluster is an asyncio emulator: it must keep running while the test's thread blocks, and
its state must only be touched on its loop. Everything here goes through that loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from smartnsq.testing import Cluster

T = TypeVar("T")

_TIMEOUT = 30.0


class ThreadedCluster:
    """``with ThreadedCluster(nodes=3) as tc: tc.run(tc.cluster.create_topic(...))``.

    ``run(coro)`` runs a coroutine on the cluster's loop, ``call(fn, *args)`` a function
    (reads like ``cluster.messages(topic)``), ``wait_for(predicate)`` evaluates the predicate
    on the cluster's loop until it holds (bounded).
    """

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="test-cluster-loop", daemon=True)
        self._cluster: Cluster | None = None

    def _main(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("the cluster is not started")
        return self._cluster

    @property
    def lookupd_url(self) -> str:
        return self.call(lambda: self.cluster.lookupd_url)

    @property
    def nsqd_addresses(self) -> list[str]:
        return self.call(lambda: self.cluster.nsqd_addresses)

    def start(self) -> ThreadedCluster:
        self._thread.start()

        async def start() -> Cluster:
            return await Cluster(**self._options).start()

        self._cluster = self.run(start())
        return self

    def stop(self) -> None:
        if self._cluster is not None:
            self.run(self._cluster.stop())
            self._cluster = None
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_TIMEOUT)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = _TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        async def invoke() -> T:
            return fn(*args)

        return self.run(invoke())

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        self.run(self.cluster.wait_for(predicate, timeout), timeout + 5.0)

    def __enter__(self) -> ThreadedCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
