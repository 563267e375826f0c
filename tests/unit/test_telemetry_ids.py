"""The send and process spans name a message in one form (smartnsq.telemetry): the internal
id in decimal on youzan, the 16-character id on classic, and a traced message's NSQ trace id
as the conversation id of both."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from smartnsq.client.telemetry import describe_process, end_send_span, message_id
from smartnsq.publishing.result import PublishResult

YOUZAN_ID = (2).to_bytes(8, "big") + (0x4D).to_bytes(8, "big")


def _spans() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def _message(**fields: Any) -> Any:
    base = {
        "id": YOUZAN_ID,
        "internal_id": 2,
        "trace_id": 0x4D,
        "partition": 1,
        "attempts": 1,
        "address": "127.0.0.1:4150",
    }
    return SimpleNamespace(**{**base, **fields})


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_message_id_is_the_internal_id_or_the_classic_text() -> None:
    assert message_id(YOUZAN_ID, 2) == "2"
    assert message_id(b"0a1b2c3d4e5f6071", None) == "0a1b2c3d4e5f6071"


def test_send_and_process_spans_agree() -> None:
    tracer, exporter = _spans()
    end_send_span(
        tracer.start_span("send t"),
        [PublishResult("t", 1, "127.0.0.1:4150", internal_id=2, trace_id=0x4D, tries=2)],
    )
    span = tracer.start_span("process t")
    describe_process(span, _message())
    span.end()
    send, process = (_attributes(s) for s in exporter.get_finished_spans())
    for key in (
        "messaging.message.id",
        "messaging.message.conversation_id",
        "messaging.destination.partition.id",
        "server.address",
        "server.port",
    ):
        assert send[key] == process[key], key
    assert send["messaging.message.id"] == "2"
    assert send["messaging.message.conversation_id"] == "77"
    assert send["messaging.nsq.tries"] == 2
    assert process["messaging.nsq.attempts"] == 1


def test_untraced_and_classic_messages() -> None:
    tracer, exporter = _spans()
    span = tracer.start_span("process t")
    describe_process(span, _message(trace_id=0))
    span.end()
    span = tracer.start_span("process t")
    describe_process(
        span, _message(id=b"0a1b2c3d4e5f6071", internal_id=None, trace_id=None, partition=None)
    )
    span.end()
    end_send_span(tracer.start_span("send t"), [PublishResult("t", None, "127.0.0.1:4150")])
    untraced, classic, send = (_attributes(s) for s in exporter.get_finished_spans())
    assert "messaging.message.conversation_id" not in untraced
    assert classic["messaging.message.id"] == "0a1b2c3d4e5f6071"
    assert "messaging.destination.partition.id" not in classic
    assert "messaging.message.id" not in send  # a plain publish learns no id


def test_a_batch_names_no_single_message() -> None:
    tracer, exporter = _spans()
    results = [PublishResult("t", 0, "127.0.0.1:4150", internal_id=i, trace_id=9) for i in (5, 6)]
    end_send_span(tracer.start_span("send t"), results)
    (send,) = (_attributes(s) for s in exporter.get_finished_spans())
    assert "messaging.message.id" not in send
    assert send["messaging.destination.partition.id"] == "0"
