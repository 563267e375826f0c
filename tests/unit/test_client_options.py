"""ClientOptions: the options the Producer and the Consumer share are checked in one place,
alike for both, before anything is sent."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.admin import Admin
from smartnsq.client.options import ClientOptions
from smartnsq.consumer.consumer import Consumer
from smartnsq.consumer.options import ConsumerOptions
from smartnsq.errors import ValidationError
from smartnsq.producer.options import ProducerOptions
from smartnsq.producer.producer import Producer

LOOKUPD = {"lookupd": ["http://127.0.0.1:4161"]}

BAD: list[tuple[str, dict[str, Any]]] = [
    ("compression", {**LOOKUPD, "compression": "zstd"}),
    ("deflate_level", {**LOOKUPD, "compression": "deflate", "deflate_level": 99}),
    ("heartbeat_interval", {**LOOKUPD, "heartbeat_interval": 0.2}),
    ("connect_timeout", {**LOOKUPD, "connect_timeout": 0}),
    ("lookupd", {"lookupd": ["http://127.0.0.1:4161"], "nsqd": ["127.0.0.1:4150"]}),
    ("lookupd", {}),
    ("nsqd", {"nsqd": ["http://127.0.0.1:4151"]}),
    ("address_map", {"nsqd": ["127.0.0.1:4150"], "address_map": {"a:1": "b:2"}}),
]


@pytest.mark.parametrize(("field", "options"), BAD, ids=[f for f, _ in BAD])
@pytest.mark.parametrize("client", [Producer, Consumer], ids=["producer", "consumer"])
def test_both_clients_refuse_the_same_options(
    client: Any, field: str, options: dict[str, Any]
) -> None:
    arguments = ("t", "c") if client is Consumer else ()
    with pytest.raises(ValidationError) as raised:
        client(*arguments, **options)
    assert raised.value.field == field


def test_the_options_are_kept_and_build_the_connection_settings() -> None:
    options = ConsumerOptions(
        **LOOKUPD, heartbeat_interval=5.0, client_id="me", compression="snappy", msg_timeout=30.0
    )
    config = options.connection_config
    assert (config.heartbeat_interval, config.client_id, config.compression) == (
        5.0,
        "me",
        "snappy",
    )
    assert config.msg_timeout == 30.0
    assert ProducerOptions(**LOOKUPD, request_timeout=3.0).connection_config.request_timeout == 3
    assert ClientOptions(**LOOKUPD).connection_config.request_timeout == 10.0
    targets = options.targets()
    assert targets.nsqd == []
    assert targets.lookup is not None
    assert targets.owns_lookup
    consumer = Consumer("t", "c", **LOOKUPD, heartbeat_interval=5.0)
    producer = Producer(**LOOKUPD, heartbeat_interval=5.0)
    assert consumer.options.heartbeat_interval == producer.options.heartbeat_interval == 5.0


# Each used to be reported under the name of an internal field (seeds, poll_interval,
# connections_per_key) or in milliseconds for an argument given in seconds.
NAMED: list[tuple[str, dict[str, Any], str]] = [
    ("lookupd", {"lookupd": []}, "at least one nsqlookupd address"),
    ("lookupd", {"lookupd": ["ftp://127.0.0.1:4161"]}, "scheme must be http or https"),
    ("lookupd", {"lookupd": ["http://127.0.0.1:0"]}, "port must be 1..65535"),
    ("lookupd", {"lookupd": [5]}, "non-empty str"),
    ("lookupd_poll_interval", {**LOOKUPD, "lookupd_poll_interval": 0}, "> 0 seconds"),
    ("lookupd_poll_interval", {**LOOKUPD, "lookupd_poll_interval": -1.5}, "> 0 seconds"),
    ("heartbeat_interval", {**LOOKUPD, "heartbeat_interval": 61}, "1..60 seconds, got 61"),
    ("heartbeat_interval", {**LOOKUPD, "heartbeat_interval": 0.5}, "1..60 seconds, got 0.5"),
]


@pytest.mark.parametrize(
    ("field", "options", "text"), NAMED, ids=[f"{f}-{o}"[:60] for f, o, _ in NAMED]
)
@pytest.mark.parametrize("client", [Producer, Consumer], ids=["producer", "consumer"])
def test_errors_name_the_argument_in_its_unit(
    client: Any, field: str, options: dict[str, Any], text: str
) -> None:
    arguments = ("t", "c") if client is Consumer else ()
    with pytest.raises(ValidationError) as raised:
        client(*arguments, **options)
    assert raised.value.field == field
    assert text in str(raised.value)
    assert " ms" not in str(raised.value)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2"])
def test_connections_per_partition_is_named_as_given(value: object) -> None:
    with pytest.raises(ValidationError) as raised:
        Producer(**LOOKUPD, connections_per_partition=value)  # type: ignore[arg-type]
    assert raised.value.field == "connections_per_partition"


def test_heartbeat_interval_takes_its_whole_range_in_seconds() -> None:
    for seconds in (-1, 0, 1, 1.0, 30, 60):
        assert Producer(**LOOKUPD, heartbeat_interval=seconds).heartbeat_interval == seconds


@pytest.mark.parametrize("given", ["lookupd", "nsqd_http"])
@pytest.mark.parametrize("address", ["ftp://127.0.0.1:4161", "http://127.0.0.1:0", 5])
def test_admin_names_the_addresses_argument(given: str, address: object) -> None:
    with pytest.raises(ValidationError) as raised:
        Admin(**{given: [address]})  # type: ignore[arg-type]
    assert raised.value.field == given
