"""gnsq benchmark worker (gevent ``gnsq.Consumer`` / ``gnsq.Producer``): one workload, one
JSON result line (see ``_worker.py``).

Used the way gnsq's documentation shows, with its defaults except ``max_in_flight``:

* consume: ``gnsq.Consumer(..., max_in_flight=2500)`` with a handler connected to
  ``on_message``; gnsq finishes the message when the handler returns;
* publish: the blocking ``Producer.publish`` / ``Producer.multipublish`` (pub1: one loop;
  pub100: ``--concurrency`` greenlets sharing the producer; mpub100: ``--mpub-window``
  greenlets).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import gevent
import gnsq
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
from gevent.event import Event


def consume(args: Any, result: Result) -> None:
    meter = Meter(args.cluster_pid)
    expected = args.messages
    received = 0
    done = Event()

    def handler(consumer: gnsq.Consumer, message: gnsq.Message) -> None:
        nonlocal received
        received += 1
        if received == expected:
            meter.stop()
            done.set()

    meter.start()
    consumer = gnsq.Consumer(
        args.topic,
        args.channel,
        nsqd_tcp_addresses=args.nsqd or [],
        lookupd_http_addresses=args.lookupd or [],
        max_in_flight=args.max_in_flight,
    )
    consumer.on_message.connect(handler, weak=False)
    try:
        consumer.start(block=False)
        if not done.wait(args.timeout):
            raise SystemExit(f"gnsq consume: {received} of {expected} after {args.timeout} s")
    finally:
        consumer.close()
    meter.fill(result, received)


def _run(send: Callable[[], Any], count: int, width: int, latencies: list[int] | None) -> None:
    """``count`` blocking sends by ``width`` greenlets sharing the producer."""
    remaining = count
    clock = time.perf_counter_ns

    def publisher() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            if latencies is None:
                send()
            else:
                t0 = clock()
                send()
                latencies.append(clock() - t0)

    if width == 1:
        publisher()
        return
    greenlets = [gevent.spawn(publisher) for _ in range(min(width, count))]
    gevent.joinall(greenlets, raise_error=True)


def publish(args: Any, result: Result) -> None:
    producer = gnsq.Producer(args.nsqd)
    topic = args.topic
    batch = [BODY] * args.batch
    latencies: list[int] = []
    meter = Meter(args.cluster_pid)

    def pub() -> Any:
        return producer.publish(topic, BODY)

    def mpub() -> Any:
        return producer.multipublish(topic, batch)

    def phase(messages: int) -> None:
        if args.workload == "pub1":
            _run(pub, messages, 1, latencies)
        elif args.workload == "pub100":
            _run(pub, messages, args.concurrency, None)
        else:
            _run(mpub, max(1, messages // args.batch), args.mpub_window, None)

    producer.start()
    try:
        phase(args.warmup)
        latencies.clear()
        meter.start()
        with gevent.Timeout(args.timeout):
            phase(args.messages)
        meter.stop()
    finally:
        producer.close()
    meter.fill(result, args.messages)
    result.latency_us = percentiles(latencies)


def main() -> int:
    args = parse_args("gnsq", CONSUME_WORKLOADS + PUBLISH_WORKLOADS)
    refuse_unsupported(args, "gnsq", "Producer")
    result = Result("gnsq", gnsq.__version__, args.workload)
    (consume if args.workload == "consume" else publish)(args, result)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
