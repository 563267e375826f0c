"""Message tracing (PUB_TRACE switch, the smartnsq.trace log) and OpenTelemetry spans and
metrics, checked with opentelemetry-sdk's in-memory exporters."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from smartnsq import errors as e
from smartnsq.client.telemetry import Telemetry
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.message import Message
from smartnsq.producer.producer import Producer
from smartnsq.routing.sharding import Sharder
from smartnsq.testing import Cluster


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with Cluster(nodes=2) as c:
        await c.create_topic("orders", 2, 2, channels=["c"])
        await c.create_topic("ordered", 2, 1, ordered=True, channels=["c"])
        await c.create_topic("ext", 1, 1, ext=True, channels=["c"])
        yield c


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def meters() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def _metrics(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    found: dict[str, Any] = {}
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = metric.data
    return found


def _sum(points: Any) -> float:
    return sum(point.value for point in points.data_points)


# --------------------------------------------------------------------------- trace switch


async def test_trace_switch_per_producer_and_topic(cluster: Cluster) -> None:
    async with Producer(lookupd=[cluster.lookupd_url], trace=True) as producer:
        traced = await producer.publish("orders", b"a", partition=0)
        assert traced.internal_id is not None
        assert traced.trace_id is not None
        assert cluster.messages("orders", 0)[-1].trace_id == traced.trace_id
        producer.set_trace(False, topic="orders")
        assert not producer.tracing("orders")
        plain = await producer.publish("orders", b"b", partition=0)
        assert plain.internal_id is None
        producer.set_trace(True, topic="orders")
        batch = await producer.publish_many("orders", [b"c", b"d"], partition=1)
        assert all(r.trace_id for r in batch)
        producer.set_trace(False)
        assert not producer.tracing("orders")
        explicit = await producer.publish("orders", b"e", trace_id=5)
        assert explicit.trace_id == 5  # an explicit trace id always traces


async def test_keyed_trace_id_is_the_key_hash(cluster: Cluster) -> None:
    async with Producer(lookupd=[cluster.lookupd_url], trace=True, trace_key_hash=True) as p:
        result = await p.publish("orders", b"k", sharding_key="customer-9")
        assert result.trace_id == (Sharder("java").hash32("customer-9") or 0) & 0xFFFFFFFF


async def test_classic_nsqd_falls_back_to_plain_publish() -> None:
    async with (
        Cluster(classic=True) as cluster,
        Producer(nsqd=cluster.nsqd_addresses, trace=True) as producer,
    ):
        result = await producer.publish("events", b"x")
        assert result.internal_id is None
        with pytest.raises(e.UnsupportedFeatureError):
            await producer.publish("events", b"x", trace_id=3)


async def test_trace_log_lines(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    seen: list[Message] = []
    async with Consumer(
        "ordered",
        "c",
        lookupd=[cluster.lookupd_url],
        handler=seen.append,
        ordered=True,
        max_in_flight=2,
    ):
        async with Producer(lookupd=[cluster.lookupd_url]) as producer:
            result = await producer.publish("ordered", b"x", partition=1, trace_id=777)
            await producer.publish("ordered", b"untraced", partition=1)
        await cluster.wait_for(lambda: len(seen) == 2)
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    publish = [r for r in records if r.nsq["event"] == "publish"]  # type: ignore[attr-defined]
    consume = [r for r in records if r.nsq["event"] == "consume"]  # type: ignore[attr-defined]
    assert len(publish) == 1
    assert publish[0].getMessage().startswith("publish topic=ordered partition=1 internal_id=")
    fields = publish[0].nsq  # type: ignore[attr-defined]
    assert fields["trace_id"] == 777
    assert (fields["offset"], fields["size"]) == (result.offset, result.size)
    assert fields["nsqd"] == result.address
    assert len(consume) == 1  # the untraced message is logged at DEBUG only
    fields = consume[0].nsq  # type: ignore[attr-defined]
    assert fields["trace_id"] == 777
    assert fields["internal_id"] == result.internal_id
    assert fields["offset"] == result.offset  # ordered subscriptions carry the position
    assert fields["attempts"] == 1
    assert fields["local"].startswith("127.0.0.1:")
    assert fields["nsqd"] == result.address
    assert isinstance(fields["timestamp"], int)


# --------------------------------------------------------------------------- OpenTelemetry


async def test_spans_metrics_and_context_propagation(
    cluster: Cluster,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    meters: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, exporter = spans
    meter_provider, reader = meters
    got: list[Message] = []

    async def handle(message: Message) -> None:
        await asyncio.sleep(0)
        got.append(message)
        if message.body == b"fails once" and message.attempts == 1:
            raise RuntimeError("boom")

    otel: dict[str, Any] = {"tracer_provider": provider, "meter_provider": meter_provider}
    async with (
        Consumer(
            "ext",
            "c",
            lookupd=[cluster.lookupd_url],
            handler=handle,
            requeue_delay=0,
            backoff=False,
            **otel,
        ),
        Producer(lookupd=[cluster.lookupd_url], **otel) as producer,
    ):
        await producer.publish("ext", b"hello", ext={"k": "v"})
        await producer.publish("ext", b"fails once")
        await cluster.wait_for(lambda: len(got) == 3)

    finished = exporter.get_finished_spans()
    sends = [s for s in finished if s.name == "send ext"]
    processes = [s for s in finished if s.name == "process ext"]
    assert len(sends) == 2
    assert len(processes) == 3
    send = sends[0]
    assert send.kind == SpanKind.PRODUCER
    assert send.attributes is not None
    assert send.attributes["messaging.system"] == "nsq"
    assert send.attributes["messaging.destination.name"] == "ext"
    assert send.attributes["messaging.destination.partition.id"] == "0"
    assert send.attributes["server.address"] == "127.0.0.1"
    process = processes[0]
    assert process.kind == SpanKind.CONSUMER
    assert process.attributes is not None
    assert process.attributes["messaging.consumer.group.name"] == "c"
    # messaging.message.id: see test_send_and_process_spans_name_a_message_alike
    # the consumer continued the producer's trace (traceparent carried in the ext header)
    assert process.context.trace_id == send.context.trace_id
    assert process.parent is not None
    assert process.parent.span_id == send.context.span_id
    assert "traceparent" in (got[0].ext or {})
    assert got[0].ext is not None
    assert got[0].ext["k"] == "v"
    failed = [s for s in processes if s.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1
    assert failed[0].attributes is not None
    assert failed[0].attributes["error.type"] == "RuntimeError"

    metrics = _metrics(reader)
    assert _sum(metrics["messaging.client.sent.messages"]) == 2
    assert _sum(metrics["messaging.client.consumed.messages"]) == 3
    assert _sum(metrics["smartnsq.messages.finished"]) == 2
    assert _sum(metrics["smartnsq.messages.requeued"]) == 1
    durations = metrics["messaging.process.duration"].data_points
    assert sum(point.count for point in durations) == 3
    assert "smartnsq.messages.in_flight" in metrics


async def test_send_and_process_spans_name_a_message_alike(
    cluster: Cluster, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """One form of messaging.message.id on both sides (it was the internal id in decimal on
    send, the 16-byte id in hex on process), and a traced message's NSQ trace id, which
    travels on plain topics too, as the conversation id of both: a backend can join them."""
    provider, exporter = spans
    got: list[Message] = []
    async with (
        Consumer(
            "orders",
            "c",
            lookupd=[cluster.lookupd_url],
            handler=got.append,
            tracer_provider=provider,
        ),
        Producer(lookupd=[cluster.lookupd_url], tracer_provider=provider) as producer,
    ):
        result = await producer.publish("orders", b"traced", partition=1, trace_id=77)
        await cluster.wait_for(lambda: len(got) == 1)
    finished = exporter.get_finished_spans()
    (send,) = [s for s in finished if s.name == "send orders"]
    (process,) = [s for s in finished if s.name == "process orders"]
    assert send.attributes is not None
    assert process.attributes is not None
    assert send.attributes["messaging.message.id"] == str(result.internal_id)
    assert process.attributes["messaging.message.id"] == str(result.internal_id)
    assert send.attributes["messaging.message.conversation_id"] == "77"
    assert process.attributes["messaging.message.conversation_id"] == "77"
    assert process.attributes["messaging.destination.partition.id"] == "1"


async def test_retries_are_span_events_and_errors_are_recorded(
    cluster: Cluster,
    spans: tuple[TracerProvider, InMemorySpanExporter],
    meters: tuple[MeterProvider, InMemoryMetricReader],
) -> None:
    provider, exporter = spans
    meter_provider, reader = meters
    async with Producer(
        lookupd=[cluster.lookupd_url], tracer_provider=provider, meter_provider=meter_provider
    ) as producer:
        await producer.publish("orders", b"warm", partition=0)  # caches the layout
        leader = cluster.leader("orders", 0)
        await cluster.move_leader("orders", 0, to_node=1 - leader)  # type: ignore[operator]
        result = await producer.publish("orders", b"after the move", partition=0)
        assert result.tries == 2
        with pytest.raises(e.NSQError):
            await producer.publish("orders", b"x" * (1024 * 1024 + 1))
    sends = [s for s in exporter.get_finished_spans() if s.name == "send orders"]
    retried = sends[1]
    assert [event.name for event in retried.events] == ["retry"]
    assert retried.events[0].attributes is not None
    assert retried.events[0].attributes["error.type"] == "E_FAILED_ON_NOT_LEADER"
    metrics = _metrics(reader)
    assert _sum(metrics["smartnsq.publish.retries"]) == 1
    assert _sum(metrics["messaging.client.sent.messages"]) == 2


def test_no_sdk_means_no_instrumentation() -> None:
    telemetry = Telemetry("producer")
    assert not telemetry.enabled
    assert telemetry.start_send("t", 1) is None
