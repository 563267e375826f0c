"""smartnsq startup worker: what a short-lived process pays, measured from inside one fresh
process; one JSON line on stdout (see ``bench/startup.py``).

Standard library only before smartnsq is imported, and as little of it as can be: what this
worker imports first is in every figure it reports (the interpreter's own is not: ``rss_*``
figures have the RSS before the import beside them).

Modes:

* ``first TARGET ADDRESS TOPIC KEY``: import smartnsq, then ``async with Producer(...)`` (so
  ``start()``) and one ``publish(topic, body, sharding_key=KEY)`` (no key: ``-``) awaited
  until nsqd's answer; TARGET is ``lookupd`` or ``nsqd``. Reports the import, the start and
  the first publish, each from the one before, in milliseconds.
* ``rss-import``: the RSS before and after importing smartnsq's Producer and Consumer.
* ``rss-consume LOOKUPD TOPIC CHANNEL MESSAGES MAX_IN_FLIGHT``: a Consumer receives MESSAGES
  (an async handler; each finished on return); the RSS after import, at the end, and the
  peak (VmHWM).
* ``rss-publish LOOKUPD TOPIC MESSAGES``: a Producer publishes MESSAGES, 100 at a time
  (unkeyed); the RSS after import, at the end, and the peak.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import json  # noqa: E402 - smartnsq imports json too; time is taken first
import os  # noqa: E402
import sys  # noqa: E402

BODY = b"x" * 100
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def peak() -> int:
    """VmHWM: the largest RSS so far."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def emit(result: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def first(target: str, address: str, topic: str, key: str) -> None:
    began = time.perf_counter()
    import asyncio

    import smartnsq

    producer_class = smartnsq.Producer
    imported = time.perf_counter()

    async def main() -> tuple[float, float]:
        made = time.perf_counter()
        async with producer_class(**{target: [address]}) as producer:
            started = time.perf_counter()
            await producer.publish(topic, BODY, sharding_key=None if key == "-" else key)
            answered = time.perf_counter()
        return (started - made) * 1000, (answered - started) * 1000

    start_ms, publish_ms = asyncio.run(main())
    emit(
        {
            "import_ms": (imported - began) * 1000,
            "start_ms": start_ms,
            "publish_ms": publish_ms,
            "first_ms": start_ms + publish_ms,
            "worker_ms": (imported - STARTED) * 1000 + start_ms + publish_ms,
        }
    )


def rss_import() -> None:
    before = rss()
    import smartnsq

    smartnsq.Producer, smartnsq.Consumer  # noqa: B018 - the lazy attributes load the clients
    emit({"rss_before": before, "rss_after": rss()})


def rss_consume(lookupd: str, topic: str, channel: str, messages: int, in_flight: int) -> None:
    before = rss()
    import asyncio

    from smartnsq import Consumer

    imported = rss()

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        received = 0

        async def handler(message: object) -> None:
            nonlocal received
            received += 1
            if received == messages and not done.done():
                done.set_result(None)

        consumer = Consumer(
            topic, channel, lookupd=[lookupd], handler=handler, max_in_flight=in_flight
        )
        async with consumer:
            await asyncio.wait_for(done, 300)
            result["rss_end"] = rss()

    result: dict[str, object] = {"rss_before": before, "rss_imported": imported}
    asyncio.run(main())
    result["rss_peak"] = peak()
    emit(result)


def rss_publish(lookupd: str, topic: str, messages: int) -> None:
    before = rss()
    import asyncio

    from smartnsq import Producer

    imported = rss()
    result: dict[str, object] = {"rss_before": before, "rss_imported": imported}

    async def main() -> None:
        async with Producer(lookupd=[lookupd]) as producer:

            async def publisher(count: int) -> None:
                for _ in range(count):
                    await producer.publish(topic, BODY)

            await asyncio.gather(*(publisher(n) for n in _split(messages, 100)))
            result["rss_end"] = rss()

    asyncio.run(main())
    result["rss_peak"] = peak()
    emit(result)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "first":
        first(*rest)
    elif mode == "rss-import":
        rss_import()
    elif mode == "rss-consume":
        lookupd, topic, channel, messages, in_flight = rest
        rss_consume(lookupd, topic, channel, int(messages), int(in_flight))
    elif mode == "rss-publish":
        lookupd, topic, messages = rest
        rss_publish(lookupd, topic, int(messages))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
