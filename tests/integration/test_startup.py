"""A short-lived process loads only what its first publish needs: no OpenTelemetry unless the
application uses it, no httpx (nor httpcore, anyio) for a plain-http nsqlookupd, no tenacity,
no compression library unless negotiated. Each check runs in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# What none of the checks below may load.
HEAVY = ("opentelemetry", "httpx", "httpcore", "anyio", "h11", "tenacity", "snappy", "cramjam")

FIRST_PUBLISH = """
import asyncio, sys
from smartnsq.testing import Cluster

async def main():
    async with Cluster(nodes=1) as youzan, Cluster(classic=True, nodes=1) as classic:
        await youzan.create_topic("orders", 2, 1, channels=["billing"])
        import smartnsq
        async with smartnsq.Producer(lookupd=[youzan.lookupd_url]) as producer:
            await producer.publish("orders", b"first", sharding_key="k")
        producer = smartnsq.Producer(nsqd=classic.nsqd_addresses)  # not started: the publish
        await producer.publish("orders", b"first")
        await producer.close()
        consumer = smartnsq.Consumer("orders", "billing", lookupd=[youzan.lookupd_url])
        async with asyncio.timeout(10):
            async for message in consumer:
                break
        await consumer.close()

asyncio.run(main())
print(sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:])))
"""


def _run(code: str, *names: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *names],
        capture_output=True,
        text=True,
        timeout=60,
        # the providers the environment may name are the test's to choose
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_the_first_publish_and_consume_load_nothing_heavy() -> None:
    assert _run(FIRST_PUBLISH, *HEAVY) == "[]"


TELEMETRY = """
import sys
from smartnsq.client.telemetry import Telemetry
telemetry = Telemetry("producer")
print(telemetry.tracing, telemetry.metering, "opentelemetry" in sys.modules)
"""

PROVIDER_SET = """
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
metrics.set_meter_provider(MeterProvider())
"""

API_ONLY = """
from opentelemetry import metrics, trace
"""


@pytest.mark.parametrize(
    ("before", "env", "expected"),
    [
        ("", {}, "False False False"),
        (API_ONLY, {}, "False False True"),  # the API's proxy providers: nothing recorded
        (PROVIDER_SET, {}, "True True True"),
        (
            "",
            {
                "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider",
                "OTEL_PYTHON_METER_PROVIDER": "sdk_meter_provider",
            },
            "True True True",
        ),
    ],
    ids=["nothing", "api-only", "provider-set", "provider-named"],
)
def test_opentelemetry_is_loaded_only_when_something_records(
    before: str, env: dict[str, str], expected: str
) -> None:
    assert _run(before + TELEMETRY, env=env) == expected
