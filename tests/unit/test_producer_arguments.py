"""Producer arguments, and a publish's timeout, are checked before anything is sent."""

from __future__ import annotations

import math

import pytest

from smartnsq import Producer
from smartnsq.errors import ValidationError

LOOKUPD = ["127.0.0.1:4161"]

# Accepted before, then used as they came (a truthy string for a flag, nan as a timeout)
# or failing deep inside with a TypeError.
UNCHECKED: list[tuple[str, object]] = [
    ("retry_backoff", 5),
    ("max_msg_size", 0),
    ("max_msg_size", "5"),
    ("max_msg_size", True),
    ("max_msg_size", 1.5),
    ("max_body_size", -1),
    ("max_body_size", 1.5),
    ("trace", "yes"),
    ("trace", 1),
    ("trace_key_hash", "yes"),
    ("linger", math.nan),
    ("linger", math.inf),
    ("linger", True),
    ("request_timeout", math.nan),
    ("request_timeout", math.inf),
    ("connect_timeout", math.nan),
    ("heartbeat_interval", math.nan),
    ("lookup_manager", 5),
    ("tls", "yes"),
    ("client_id", 5),
    ("tracer_provider", 5),
]


@pytest.mark.parametrize(("field", "value"), UNCHECKED, ids=[f"{f}={v!r}" for f, v in UNCHECKED])
def test_every_argument_is_checked_when_the_producer_is_made(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as info:
        Producer(lookupd=LOOKUPD, **{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("timeout", [-1, 0, "5", math.nan, True])
async def test_a_publish_timeout_is_checked_before_anything_is_sent(timeout: object) -> None:
    # Nothing listens there: a publish that went on would fail to connect instead.
    producer = Producer(nsqd=["127.0.0.1:9"], publish_timeout=5)
    publishes = (
        lambda: producer.publish("t", b"x", timeout=timeout),  # type: ignore[arg-type]
        lambda: producer.publish_many("t", [b"x"], timeout=timeout),  # type: ignore[arg-type]
        lambda: producer.publish_many("t", [b"x"], sharding_keys=["k"], timeout=timeout),  # type: ignore[arg-type]
    )
    for publish in publishes:
        with pytest.raises(ValidationError) as info:
            await publish()
        assert info.value.field == "timeout"
    assert producer.stats().failures == 0
    await producer.close()
