"""pynsq benchmark worker (tornado ``nsq.Reader`` / ``nsq.Writer``): one workload, one JSON
result line (see ``_worker.py``).

Used the way pynsq's documentation shows, with its defaults except ``max_in_flight``:

* consume: ``nsq.Reader(message_handler=..., max_in_flight=2500)``; the handler is a plain
  function returning True (pynsq then sends FIN) - cheaper for pynsq than a coroutine
  handler, which it also accepts;
* publish: ``Writer.pub`` / ``Writer.mpub`` with a callback ``(conn, data)`` that publishes the
  next message (pub1: one in flight; pub100: ``--concurrency`` callback chains; mpub100:
  ``--mpub-window`` chains of MPUB).

The IOLoop is started as ``nsq.run()`` does (without its signal handlers).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import nsq
import tornado.ioloop
from _worker import (
    BODY,
    CONSUME_WORKLOADS,
    PUBLISH_WORKLOADS,
    Meter,
    Result,
    emit,
    parse_args,
    percentiles,
    refuse_unsupported,
)
from nsq.version import __version__

Callback = Callable[[Any, Any], None]


class Failed(Exception):
    pass


class Run:
    """Runs the IOLoop until ``finish`` or ``fail`` is called, or the timeout."""

    def __init__(self, timeout: float) -> None:
        self.loop = tornado.ioloop.IOLoop.current()
        self.error: BaseException | None = None
        self.loop.call_later(timeout, self.fail, Failed(f"timed out after {timeout} s"))

    def finish(self) -> None:
        self.loop.add_callback(self.loop.stop)

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.loop.add_callback(self.loop.stop)

    def start(self) -> None:
        self.loop.start()
        if self.error is not None:
            raise self.error


def consume(args: Any, result: Result) -> None:
    run = Run(args.timeout)
    meter = Meter(args.cluster_pid)
    expected = args.messages
    received = 0

    def handler(message: nsq.Message) -> bool:
        nonlocal received
        received += 1
        if received == expected:
            meter.stop()
            run.finish()
        return True

    meter.start()
    targets = {"nsqd_tcp_addresses": args.nsqd} if args.nsqd else {}
    if args.lookupd:
        targets["lookupd_http_addresses"] = args.lookupd
    reader = nsq.Reader(
        topic=args.topic,
        channel=args.channel,
        message_handler=handler,
        max_in_flight=args.max_in_flight,
        **targets,
    )
    try:
        run.start()
    finally:
        reader.close()
    meter.fill(result, received)


def chains(
    send: Callable[[Callback], None],
    count: int,
    width: int,
    done: Callable[[], None],
    fail: Callable[[BaseException], None],
    latencies: list[int] | None = None,
) -> None:
    """``count`` sends, ``width`` in flight: each answer's callback sends the next one."""
    remaining = count
    answered = 0
    clock = time.perf_counter_ns
    sent_at = 0  # latencies are recorded with one chain only: when its send left

    def callback(conn: Any, data: Any) -> None:
        nonlocal remaining, answered, sent_at
        if isinstance(data, Exception):
            fail(data)
            return
        if latencies is not None:
            latencies.append(clock() - sent_at)
        answered += 1
        if remaining > 0:
            remaining -= 1
            if latencies is not None:
                sent_at = clock()
            send(callback)
        elif answered == count:
            done()

    for _ in range(min(width, count)):
        remaining -= 1
        sent_at = clock()
        send(callback)


def publish(args: Any, result: Result) -> None:
    writer = nsq.Writer(args.nsqd)
    topic = args.topic
    batch = [BODY] * args.batch
    latencies: list[int] = []
    meter = Meter(args.cluster_pid)
    run = Run(args.timeout)
    loop = run.loop

    def pub(callback: Callback) -> None:
        writer.pub(topic, BODY, callback=callback)

    def mpub(callback: Callback) -> None:
        writer.mpub(topic, batch, callback=callback)

    def phase(messages: int, then: Callable[[], None]) -> None:
        if args.workload == "pub1":
            chains(pub, messages, 1, then, run.fail, latencies)
        elif args.workload == "pub100":
            chains(pub, messages, args.concurrency, then, run.fail)
        else:
            chains(mpub, max(1, messages // args.batch), args.mpub_window, then, run.fail)

    def measured_done() -> None:
        meter.stop()
        run.finish()

    def measure() -> None:
        latencies.clear()
        meter.start()
        phase(args.messages, measured_done)

    def when_connected() -> None:
        if not writer.conns:
            loop.call_later(0.01, when_connected)
            return
        phase(args.warmup, measure)

    loop.add_callback(when_connected)
    try:
        run.start()
    finally:
        for conn in list(writer.conns.values()):
            conn.close()
    meter.fill(result, args.messages)
    result.latency_us = percentiles(latencies)


def main() -> int:
    args = parse_args("pynsq", CONSUME_WORKLOADS + PUBLISH_WORKLOADS)
    refuse_unsupported(args, "pynsq", "Writer")
    result = Result("pynsq", __version__, args.workload)
    (consume if args.workload == "consume" else publish)(args, result)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
