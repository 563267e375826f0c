"""smartnsq benchmark worker: one workload, one JSON result line (see ``_worker.py``).

Used the way its documentation shows: ``Producer.publish`` awaited (sequentially, or by
``--concurrency`` tasks sharing one producer), ``Producer.publish_many`` for batches,
``Producer(linger=...)`` for auto-batching, ``smartnsq.sync.Producer.publish`` called
sequentially (``--blocking``), and ``Consumer(handler=async fn)`` whose handler returning
finishes the message. ``--nsqd`` for classic nsqd, ``--lookupd`` for youzan.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _worker import (
    BODY,
    CONSUME_WORKLOADS,
    PUBLISH_WORKLOADS,
    Meter,
    Result,
    emit,
    parse_args,
    percentiles,
    run_loop,
    settle_gc,
)

import smartnsq
from smartnsq import Consumer, Message, Producer


def _targets(args: Any) -> dict[str, list[str]]:
    return {"nsqd": args.nsqd} if args.nsqd else {"lookupd": args.lookupd}


async def consume(args: Any, result: Result) -> None:
    expected = args.messages
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    received = 0
    handler: Callable[[Message], Any]

    async def async_handler(message: Message) -> None:
        nonlocal received
        received += 1
        if received == expected:
            done.set_result(None)

    counter = itertools.count(1)  # next() is atomic: the plain handler runs in threads

    def plain_handler(message: Message) -> None:
        if next(counter) == expected:
            loop.call_soon_threadsafe(done.set_result, None)

    handler = plain_handler if args.handler == "plain" else async_handler

    settle_gc(args.gc)
    meter = Meter(args.cluster_pid)
    meter.start()
    consumer = Consumer(
        args.topic,
        args.channel,
        handler=handler,
        max_in_flight=args.max_in_flight,
        ordered=args.ordered,
        **_targets(args),
    )
    try:
        await consumer.start()
        await asyncio.wait_for(done, args.timeout)
        meter.stop()
        stats = consumer.stats()
    finally:
        await consumer.close()
    meter.fill(result, expected)
    result.extra = {"finished": stats.finished, "connections": stats.connections}
    result.extra["handler"] = args.handler
    result.extra["ordered"] = args.ordered


async def _sequential(publish: Callable[[], Awaitable[Any]], count: int, lat: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(count):
        t0 = clock()
        await publish()
        lat.append(clock() - t0)


async def _concurrent(publish: Callable[[], Awaitable[Any]], count: int, workers: int) -> None:
    remaining = count

    async def publisher() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await publish()

    await asyncio.gather(*(publisher() for _ in range(workers)))


async def publish(args: Any, result: Result) -> None:
    linger = args.linger if args.workload == "pub100" else None
    max_batch = args.max_batch if linger is not None else args.batch
    producer = Producer(**_targets(args), linger=linger, max_batch=max_batch)
    topic = args.topic
    batch = [BODY] * args.batch

    def pub() -> Awaitable[Any]:
        return producer.publish(topic, BODY)

    def mpub() -> Awaitable[Any]:
        return producer.publish_many(topic, batch)

    latencies: list[int] = []

    async def run(messages: int) -> None:
        if args.workload == "pub1":
            await _sequential(pub, messages, latencies)
        elif args.workload == "pub100":
            await _concurrent(pub, messages, args.concurrency)
        else:
            batches = max(1, messages // args.batch)
            await _concurrent(mpub, batches, args.mpub_window)

    meter = Meter(args.cluster_pid)
    async with producer:
        await run(args.warmup)
        latencies.clear()
        settle_gc(args.gc)
        sent = producer.stats().publishes  # with auto-batching: how many MPUBs it sent
        meter.start()
        await asyncio.wait_for(run(args.messages), args.timeout)
        meter.stop()
        if linger is not None:
            result.extra["mpub_batches"] = producer.stats().publishes - sent
    meter.fill(result, args.messages)
    result.latency_us = percentiles(latencies)
    if linger is not None:
        result.extra["linger"] = linger
        result.extra["max_batch"] = max_batch


def publish_blocking(args: Any, result: Result) -> None:
    """pub1 through ``smartnsq.sync.Producer``: one blocking publish after the other from
    this thread, as a plain Python service publishes. Its loop thread runs the loop the
    worker was asked for."""
    if args.workload != "pub1" or args.linger is not None:
        raise SystemExit("--blocking: pub1 only, without --linger")
    os.environ["SMARTNSQ_UVLOOP"] = "1" if args.loop == "uvloop" else "0"
    from smartnsq import sync

    producer = sync.Producer(**_targets(args))
    topic = args.topic
    latencies: list[int] = []
    clock = time.perf_counter_ns

    def run(messages: int) -> None:
        for _ in range(messages):
            t0 = clock()
            producer.publish(topic, BODY)
            latencies.append(clock() - t0)

    meter = Meter(args.cluster_pid)
    with producer:
        run(args.warmup)
        latencies.clear()
        settle_gc(args.gc)
        meter.start()
        run(args.messages)
        meter.stop()
    meter.fill(result, args.messages)
    result.latency_us = percentiles(latencies)
    result.extra["blocking"] = True


def _compiled_modules() -> list[str]:
    """The smartnsq modules loaded from compiled extensions."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("smartnsq") and (getattr(module, "__file__", "") or "").endswith(".so")
    )


def main() -> int:
    args = parse_args("smartnsq", CONSUME_WORKLOADS + PUBLISH_WORKLOADS)
    result = Result("smartnsq", smartnsq.__version__, args.workload)
    if args.blocking:
        publish_blocking(args, result)
    else:
        work = consume if args.workload == "consume" else publish
        run_loop(work(args, result), args.loop)
    result.extra["loop"] = args.loop
    result.extra["gc"] = args.gc
    result.extra["smartnsq_file"] = smartnsq.__file__
    result.extra["compiled"] = _compiled_modules()
    result.extra["env_pure"] = os.environ.get("SMARTNSQ_PURE", "")
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
