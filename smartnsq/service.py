"""Running clients as a service: until SIGINT or SIGTERM, then drained.

What asyncio users of other clients write by hand (aiokafka's examples, faust's worker,
pynsq's ``nsq.run()``): start the clients, wait for Ctrl-C or for the process manager's
SIGTERM (Docker, Kubernetes, systemd), then close them in order (consumers drain first, so
their handlers can still publish; producers then send what they hold). Signal handlers are
installed only while :func:`serve` runs, and the previous ones are put back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from smartnsq.errors import ValidationError

__all__ = ["serve"]

log = logging.getLogger("smartnsq.service")

#: What :func:`serve` stops on by default.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Client(Protocol):
    async def start(self) -> Any: ...

    async def close(self) -> None: ...


async def serve(
    *clients: _Client,
    signals: Sequence[signal.Signals] = STOP_SIGNALS,
    stop: asyncio.Event | None = None,
) -> signal.Signals | None:
    """Start ``clients`` (Producers and Consumers, in any number), run until one of
    ``signals`` arrives (or ``stop`` is set), then close them: the consumers first, each
    draining (its handlers finish their messages), then the producers. Returns the signal
    that stopped it (None when ``stop`` did).

    A consumer that stops by itself (a fatal server error) stops the service too: the others
    are closed, then its error is raised. Call it from the main thread (signal handlers can be
    installed only there), typically as the end of ``main()`` under ``asyncio.run(main())``;
    the process then exits normally (status 0) after a drain.
    """
    if not clients:
        raise ValidationError("clients", "serve() needs at least one client")
    loop = asyncio.get_running_loop()
    stopping = stop if stop is not None else asyncio.Event()
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not received:
            log.info("%s received: stopping (draining the consumers)", sig.name)
        received.append(sig)
        stopping.set()

    consumers = [c for c in clients if hasattr(c, "join")]
    producers = [c for c in clients if not hasattr(c, "join")]
    with _signal_handlers(loop, signals, on_signal):
        try:
            for client in (*producers, *consumers):
                await client.start()
            failure = await _until_stopped(stopping, consumers)
        finally:
            # Consumers first: their handlers may still publish through the producers.
            for client in (*consumers, *producers):
                try:
                    await client.close()
                except Exception:
                    log.exception("closing %r failed", client)
    if failure is not None:
        raise failure
    return received[0] if received else None


async def _until_stopped(stopping: asyncio.Event, consumers: list[Any]) -> BaseException | None:
    """Wait for the stop event or for a consumer to end by itself; return its error."""
    waiter = asyncio.ensure_future(stopping.wait())
    joins = [asyncio.ensure_future(consumer.join()) for consumer in consumers]
    try:
        done, _ = await asyncio.wait([waiter, *joins], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, *joins):
            task.cancel()
        await asyncio.gather(waiter, *joins, return_exceptions=True)
    for task in joins:
        if task in done and not task.cancelled():
            error: BaseException | None = task.exception()
            if error is not None:
                return error
    return None


@contextlib.contextmanager
def _signal_handlers(
    loop: asyncio.AbstractEventLoop,
    signals: Sequence[signal.Signals],
    callback: Callable[[signal.Signals], None],
) -> Iterator[None]:
    """``callback(sig)`` on the loop for each of ``signals`` while the block runs; the
    previous handlers afterwards."""
    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in signals:
            previous[sig] = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, callback, sig)
            except NotImplementedError:  # Windows: no add_signal_handler
                signal.signal(sig, _threadsafe(loop, callback, sig))
        yield
    finally:
        for sig, handler in previous.items():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)


def _threadsafe(
    loop: asyncio.AbstractEventLoop,
    callback: Callable[[signal.Signals], None],
    sig: signal.Signals,
) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        loop.call_soon_threadsafe(callback, sig)

    return handler
