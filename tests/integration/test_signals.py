"""SIGTERM drains like Ctrl-C, over a real process: the blocking consumer's run() and the
asyncio helper smartnsq.serve() let the handler running at the signal finish its message,
answer it, close, and exit 0; nothing is lost (the rest stays queued). Without run() or
serve(), nothing is installed: SIGTERM keeps its default."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from smartnsq.producer.producer import Producer
from smartnsq.testing import Cluster

COUNT = 3

SYNC_CONSUMER = """
import sys, time
import smartnsq.sync

def handle(message):
    print("start", message.body.decode(), flush=True)
    time.sleep(1.0)
    print("done", message.body.decode(), flush=True)

consumer = smartnsq.sync.Consumer(
    "jobs", "workers", lookupd=[sys.argv[1]], handler=handle, max_in_flight=1
)
consumer.run()
print("run returned", flush=True)
"""

ASYNC_SERVICE = """
import asyncio, sys
import smartnsq

async def handle(message):
    print("start", message.body.decode(), flush=True)
    await asyncio.sleep(1.0)
    print("done", message.body.decode(), flush=True)

async def main():
    producer = smartnsq.Producer(lookupd=[sys.argv[1]])
    consumer = smartnsq.Consumer(
        "jobs", "workers", lookupd=[sys.argv[1]], handler=handle, max_in_flight=1
    )
    stopped_by = await smartnsq.serve(consumer, producer)
    print("serve returned", stopped_by.name, flush=True)

asyncio.run(main())
"""

SYNC_ITERATION = """
import sys, time
import smartnsq.sync

consumer = smartnsq.sync.Consumer("jobs", "workers", lookupd=[sys.argv[1]], max_in_flight=1)
for message in consumer:
    print("start", message.body.decode(), flush=True)
    time.sleep(1.0)
"""


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=1) as c:
        await c.create_topic("jobs", 1, 1, channels=["workers"])
        async with Producer(lookupd=[c.lookupd_url]) as producer:
            for i in range(COUNT):
                await producer.publish("jobs", f"m{i}")
        yield c


async def _run_until_first_message(
    cluster: Cluster, script: str, tmp_path: Path
) -> tuple[asyncio.subprocess.Process, list[str]]:
    path = tmp_path / "service.py"
    path.write_text(script)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(path),
        cluster.lookupd_url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    first = await asyncio.wait_for(process.stdout.readline(), 20)
    return process, [first.decode().strip()]


async def _stop(process: asyncio.subprocess.Process, lines: list[str]) -> tuple[int, str]:
    process.send_signal(signal.SIGTERM)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 20)
    lines += stdout.decode().split()
    assert process.returncode is not None
    return process.returncode, stderr.decode()


def _nothing_lost(cluster: Cluster) -> None:
    record = cluster.channel_record("jobs", "workers")
    first = cluster.messages("jobs")[0]
    assert first.body == b"m0"
    assert record.finished == [(0, first.internal_id)]  # handled at SIGTERM, and answered
    assert record.duplicates_finished() == []
    assert cluster.unfinished("jobs", "workers") == COUNT - 1  # the rest waits for the next run


@pytest.mark.parametrize(("script", "last"), [(SYNC_CONSUMER, "run returned")])
async def test_sigterm_drains_the_blocking_consumer(
    cluster: Cluster, tmp_path: Path, script: str, last: str
) -> None:
    process, lines = await _run_until_first_message(cluster, script, tmp_path)
    assert lines == ["start m0"]
    returncode, stderr = await _stop(process, lines)
    assert returncode == 0, stderr
    assert " ".join(lines) == f"start m0 done m0 {last}"
    await cluster.wait_for(lambda: cluster.in_flight("jobs", "workers") == 0)
    _nothing_lost(cluster)


async def test_sigterm_drains_the_asyncio_service(cluster: Cluster, tmp_path: Path) -> None:
    process, lines = await _run_until_first_message(cluster, ASYNC_SERVICE, tmp_path)
    returncode, stderr = await _stop(process, lines)
    assert returncode == 0, stderr
    assert " ".join(lines) == "start m0 done m0 serve returned SIGTERM"
    await cluster.wait_for(lambda: cluster.in_flight("jobs", "workers") == 0)
    _nothing_lost(cluster)


async def test_without_run_sigterm_keeps_its_default(cluster: Cluster, tmp_path: Path) -> None:
    """Iterating installs no handler: the program's SIGTERM is the default (killed at once)."""
    process, lines = await _run_until_first_message(cluster, SYNC_ITERATION, tmp_path)
    returncode, _ = await _stop(process, lines)
    assert returncode == -signal.SIGTERM


async def test_serve_stops_on_its_event_and_puts_the_handlers_back(cluster: Cluster) -> None:
    import smartnsq

    got: list[bytes] = []

    async def handle(message: smartnsq.Message) -> None:
        got.append(message.body)

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = asyncio.Event()
    consumer = smartnsq.Consumer("jobs", "workers", lookupd=[cluster.lookupd_url], handler=handle)
    producer = smartnsq.Producer(lookupd=[cluster.lookupd_url])
    service = asyncio.create_task(smartnsq.serve(consumer, producer, stop=stop))
    await cluster.wait_for(lambda: len(got) == COUNT)
    assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]  # serve's, meanwhile
    stop.set()
    assert await service is None
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert cluster.unfinished("jobs", "workers") == 0
    with pytest.raises(smartnsq.ClientClosedError):
        await producer.publish("jobs", b"closed")


async def test_serve_ends_with_a_consumer_that_stops_by_itself() -> None:
    import smartnsq

    async with Cluster(nodes=1) as cluster:
        await cluster.create_topic("jobs", 1, 1, ordered=True, channels=["workers"])
        # Not ordered=True on an ordered topic: nsqd refuses the subscription for good.
        consumer = smartnsq.Consumer("jobs", "workers", lookupd=[cluster.lookupd_url])
        producer = smartnsq.Producer(lookupd=[cluster.lookupd_url])
        with pytest.raises(smartnsq.OrderedSubscribeRequiredError):
            await asyncio.wait_for(smartnsq.serve(consumer, producer), 20)
        with pytest.raises(smartnsq.ClientClosedError):
            await producer.publish("jobs", b"closed")
