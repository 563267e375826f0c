"""OpenTelemetry spans and metrics for the clients (``opentelemetry-api`` only).

Spans follow the messaging semantic conventions: ``send {topic}`` (PRODUCER) per publish,
with retries as events, and ``process {topic}`` (CONSUMER) per handled message. On ext topics
the producer carries the W3C ``traceparent`` in the ext header and the consumer continues
that trace.

Both spans name a message the same way, so a trace backend can join them:
``messaging.message.id`` is youzan's internal id in decimal (as the ``smartnsq.trace`` log
writes it; on classic nsqd the consumer's 16-character id, which a classic publish never
learns), and a traced message's NSQ trace id (PUB_TRACE: it travels on every topic, where the
W3C context travels only on ext topics) is ``messaging.message.conversation_id`` on both.

Whether anything is recorded is decided once, when a client is built: with no provider given
and no SDK installed (the API's proxy providers), every hook is skipped, so uninstrumented
applications pay nothing on the hot path, nor at import: ``opentelemetry`` is loaded only
when a provider is given, when the application has loaded the API (only through it can the
application or an SDK set a global provider), or when ``OTEL_PYTHON_TRACER_PROVIDER`` /
``OTEL_PYTHON_METER_PROVIDER`` name one (what opentelemetry-api reads when none is set).
Otherwise the API would answer with its proxy provider: nothing to record.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from smartnsq._version import __version__

if TYPE_CHECKING:
    from opentelemetry.metrics import Observation
    from opentelemetry.trace import Span, Tracer

    from smartnsq.consumer.message import Message
    from smartnsq.publishing.result import PublishResult

__all__ = ["Telemetry", "describe_process", "end_send_span", "message_id"]

SYSTEM = "nsq"


# The variables opentelemetry-api's get_tracer_provider / get_meter_provider load a provider
# from when none is set (opentelemetry.environment_variables).
_TRACER_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"
_METER_PROVIDER_VARIABLE = "OTEL_PYTHON_METER_PROVIDER"


def _api_in_use(module: str, variable: str) -> bool:
    """Whether a global provider can be set: the API's module is loaded (only through it can
    an application or an SDK set one), or the environment names one."""
    return module in sys.modules or variable in os.environ


def _tracing_configured(provider: Any) -> bool:
    if provider is not None:
        return True
    if not _api_in_use("opentelemetry.trace", _TRACER_PROVIDER_VARIABLE):
        return False
    from opentelemetry import trace

    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def _metrics_configured(provider: Any) -> bool:
    if provider is not None:
        return True
    if not _api_in_use("opentelemetry.metrics", _METER_PROVIDER_VARIABLE):
        return False
    from opentelemetry import metrics

    name = type(metrics.get_meter_provider()).__name__
    return name not in ("_ProxyMeterProvider", "NoOpMeterProvider")


def server_attributes(address: str | None) -> dict[str, Any]:
    if not address:
        return {}
    host, _, port = address.rpartition(":")
    attributes: dict[str, Any] = {"server.address": host.strip("[]")}
    if port.isdigit():
        attributes["server.port"] = int(port)
    return attributes


class Telemetry:
    """The instruments of one client (``component`` is "producer" or "consumer")."""

    def __init__(
        self,
        component: str,
        *,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        self.tracing = _tracing_configured(tracer_provider)
        self.metering = _metrics_configured(meter_provider)
        self.enabled = self.tracing or self.metering
        self.tracer: Tracer | None = None
        if self.tracing:
            from opentelemetry import trace

            self.tracer = trace.get_tracer("smartnsq", __version__, tracer_provider=tracer_provider)
        self._counters: dict[str, Any] = {}
        self._duration: Any = None
        self._meter: Any = None
        if self.metering:
            from opentelemetry import metrics

            meter = metrics.get_meter("smartnsq", __version__, meter_provider=meter_provider)
            self._meter = meter
            names = {
                "producer": {
                    "published": ("messaging.client.sent.messages", "Messages published"),
                    "publish_errors": ("smartnsq.publish.errors", "Publishes that failed"),
                    "retries": ("smartnsq.publish.retries", "Publish attempts retried"),
                },
                "consumer": {
                    "consumed": ("messaging.client.consumed.messages", "Messages received"),
                    "finished": ("smartnsq.messages.finished", "Messages finished (FIN)"),
                    "requeued": ("smartnsq.messages.requeued", "Messages requeued (REQ)"),
                    "given_up": ("smartnsq.messages.given_up", "Messages past max_attempts"),
                },
            }[component]
            for key, (name, description) in names.items():
                self._counters[key] = meter.create_counter(
                    name, unit="{message}", description=description
                )
            if component == "consumer":
                self._duration = meter.create_histogram(
                    "messaging.process.duration", unit="s", description="Handler duration"
                )

    # ------------------------------------------------------------------ metrics

    def count(self, name: str, value: int = 1, attributes: Mapping[str, Any] | None = None) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.add(value, attributes)

    def handler_duration(self, seconds: float, attributes: Mapping[str, Any]) -> None:
        if self._duration is not None:
            self._duration.record(seconds, attributes)

    def in_flight_gauge(self, read: Callable[[], int], attributes: Mapping[str, Any]) -> None:
        """Report ``read()`` as the in-flight gauge (observed when metrics are collected)."""
        if self._meter is None:
            return
        from opentelemetry.metrics import Observation

        def observe(options: Any) -> Iterable[Observation]:
            return [Observation(read(), dict(attributes))]

        self._meter.create_observable_up_down_counter(
            "smartnsq.messages.in_flight",
            callbacks=[observe],
            unit="{message}",
            description="Messages received and not yet answered",
        )

    # ------------------------------------------------------------------ spans

    def start_send(self, topic: str, batch: int) -> Span | None:
        if self.tracer is None:
            return None
        from opentelemetry.trace import SpanKind

        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
        }
        if batch > 1:
            attributes["messaging.batch.message_count"] = batch
        return self.tracer.start_span(
            f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes
        )

    def start_process(
        self, topic: str, channel: str, carrier: Mapping[str, Any] | None
    ) -> tuple[Span, object] | None:
        """Start the consumer span (continuing a trace carried in the ext header) and make it
        current; returns (span, token to detach) or None."""
        if self.tracer is None:
            return None
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind

        parent = propagate.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"process {topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": topic,
                "messaging.consumer.group.name": channel,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        return span, token

    # The three below run only with a span, so with opentelemetry loaded.

    @staticmethod
    def detach(token: object) -> None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]

    @staticmethod
    def inject(carrier: MutableMapping[str, Any], span: Span) -> None:
        """Write ``traceparent`` (and friends) for ``span`` into ``carrier``."""
        from opentelemetry import propagate, trace

        propagate.inject(carrier, context=trace.set_span_in_context(span))

    @staticmethod
    def fail(span: Span, error: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", error_type(error))
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))


def message_id(raw_id: bytes, internal_id: int | None) -> str:
    """``messaging.message.id``: youzan's internal id in decimal, what a traced publish learns
    from its receipt too; on classic nsqd the message id's 16 characters."""
    if internal_id is not None:
        return str(internal_id)
    return raw_id.decode("ascii", "replace")


def end_send_span(span: Span, results: Sequence[PublishResult]) -> None:
    """Describe the accepted publish on its ``send`` span (partition, message id, NSQ trace
    id, nsqd, tries) and end it."""
    first = results[0]
    if first.partition is not None:
        span.set_attribute("messaging.destination.partition.id", str(first.partition))
    if first.internal_id is not None and len(results) == 1:
        span.set_attribute("messaging.message.id", str(first.internal_id))
    if first.trace_id and len(results) == 1:
        span.set_attribute("messaging.message.conversation_id", str(first.trace_id))
    for key, value in server_attributes(first.address).items():
        span.set_attribute(key, value)
    span.set_attribute("messaging.nsq.tries", first.tries)
    span.end()


def describe_process(span: Span, message: Message) -> None:
    """Describe a delivered message on its ``process`` span, in the form the ``send`` span
    uses: partition, message id, NSQ trace id (when traced), attempts, nsqd."""
    if message.partition is not None:
        span.set_attribute("messaging.destination.partition.id", str(message.partition))
    span.set_attribute("messaging.message.id", message_id(message.id, message.internal_id))
    if message.trace_id:
        span.set_attribute("messaging.message.conversation_id", str(message.trace_id))
    span.set_attribute("messaging.nsq.attempts", message.attempts)
    for key, value in server_attributes(message.address).items():
        span.set_attribute(key, value)


def error_type(error: BaseException) -> str:
    """The NSQ code for server errors, else the exception class name."""
    code = getattr(error, "code", None)
    return code if isinstance(code, str) and code else type(error).__name__
