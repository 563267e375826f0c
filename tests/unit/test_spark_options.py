"""The nsq data source's options and columns, checked when a query is planned (no Spark
session needed): each mistake names the option or column."""

from __future__ import annotations

import ssl

import pytest
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from smartnsq.errors import ValidationError
from smartnsq.spark.options import SinkOptions, SourceOptions
from smartnsq.spark.schema import check_sink_schema

LOOKUPD = {"lookupd": "http://127.0.0.1:4161"}


def test_sink_defaults_and_spelling() -> None:
    options = SinkOptions.parse({**LOOKUPD, "TOPIC": "orders", "maxbatch": "200", "trace": "true"})
    assert options.topic == "orders"
    assert options.max_batch == 200
    assert options.trace is True
    arguments = options.producer_arguments()
    assert arguments["lookupd"] == ["http://127.0.0.1:4161"]
    assert arguments["sharding"] == "java"
    assert arguments["publish_timeout"] == 120.0  # the Producer's own default
    assert "nsqd" not in arguments


def test_spark_own_options_are_accepted() -> None:
    SinkOptions.parse({**LOOKUPD, "topic": "t", "path": "x", "checkpointLocation": "/c"})


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"topic": "t"}, "lookupd"),  # no target
        ({**LOOKUPD, "nsqd": "127.0.0.1:4150", "topic": "t"}, "lookupd"),  # two targets
        ({**LOOKUPD, "topic": "bad topic!"}, "topic"),
        ({**LOOKUPD, "topic": "t", "sharding": "crc32"}, "sharding"),
        ({**LOOKUPD, "topic": "t", "maxBatch": "0"}, "maxBatch"),
        ({**LOOKUPD, "topic": "t", "maxBatch": "many"}, "maxBatch"),
        ({**LOOKUPD, "topic": "t", "linger": "-1"}, "linger"),
        ({**LOOKUPD, "topic": "t", "publishTimeout": "nan"}, "publishTimeout"),
        ({**LOOKUPD, "topic": "t", "trace": "maybe"}, "trace"),
        ({**LOOKUPD, "topic": "t", "compression": "zstd"}, "compression"),
        ({**LOOKUPD, "topic": "t", "tlsCertFile": "c.pem"}, "tlsKeyFile"),
        ({**LOOKUPD, "topic": "t", "shardingKey": "x"}, "shardingkey"),  # unknown option
    ],
)
def test_sink_option_errors_name_the_option(options: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        SinkOptions.parse(options)
    assert raised.value.field == field


def test_tls_options_build_a_context_where_the_client_runs() -> None:
    plain = SinkOptions.parse({**LOOKUPD, "topic": "t", "tls": "true"}).connect
    assert plain.client_arguments()["tls"] is True
    insecure = SinkOptions.parse({**LOOKUPD, "topic": "t", "tlsInsecure": "true"}).connect
    context = insecure.client_arguments()["tls"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_NONE
    assert SinkOptions.parse({**LOOKUPD, "topic": "t"}).connect.client_arguments()["tls"] is False


def test_source_options() -> None:
    options = SourceOptions.parse(
        {
            **LOOKUPD,
            "topic": "t",
            "channel": "c",
            "partitions": "2, 0,2",
            "maxInFlight": "5000",
            "maxMessagesPerTrigger": "1000",
            "authSecret": "s3cret",
        }
    )
    assert options.partitions == (0, 2)
    arguments = options.consumer_arguments()
    assert arguments["partitions"] == [0, 2]
    assert arguments["max_in_flight"] == 5000
    assert SourceOptions.parse({**LOOKUPD, "topic": "t", "channel": "c"}).max_in_flight == 10_000
    assert arguments["auth_secret"] == "s3cret"
    assert arguments["msg_timeout"] == 60.0
    assert options.max_messages_per_trigger == 1000
    assert options.journal is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"topic": "t"}, "channel"),
        ({"channel": "c"}, "topic"),
        ({"topic": "t", "channel": "c", "ordered": "true", "mode": "hold"}, "journal"),
        ({"topic": "t", "channel": "c", "mode": "kafka"}, "mode"),
        ({"topic": "t", "channel": "c", "mode": "journal"}, "journal"),
        ({"topic": "t", "channel": "c", "mode": "offsets", "journal": "/j"}, "journal"),
        ({"topic": "t", "channel": "c", "mode": "offsets", "maxInFlight": "10"}, "maxInFlight"),
        (
            {"topic": "t", "channel": "c", "mode": "hold", "startingOffsets": "earliest"},
            "startingOffsets",
        ),
        (
            {"topic": "t", "channel": "c", "journal": "/j", "failOnDataLoss": "false"},
            "failOnDataLoss",
        ),
        ({"topic": "t", "channel": "c", "startingOffsets": "first"}, "startingOffsets"),
        ({"topic": "t", "channel": "c", "startingOffsets": '{"u": {"0": 1}}'}, "startingOffsets"),
        ({"topic": "t", "channel": "c", "startingOffsets": '{"t": {"0": -3}}'}, "startingOffsets"),
        ({"topic": "t", "channel": "c", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"topic": "t", "channel": "c", "endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets"),
        (
            {"topic": "t", "channel": "c", "startingOffsets": "latest", "startingTimestamp": "1"},
            "startingTimestamp",
        ),
        ({"topic": "t", "channel": "c", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"topic": "t", "channel": "c", "partitions": "a"}, "partitions"),
        ({"topic": "t", "channel": "c", "partitions": "-1"}, "partitions"),
        ({"topic": "t", "channel": "c", "maxInFlight": "0"}, "maxInFlight"),
        ({"topic": "t", "channel": "c", "msgTimeout": "0"}, "msgTimeout"),
        ({"topic": "t", "channel": "c", "maxBatch": "10"}, "maxbatch"),  # a sink option
    ],
)
def test_source_option_errors_name_the_option(options: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse({**LOOKUPD, **options})
    assert raised.value.field == field


def test_reading_modes() -> None:
    base = {**LOOKUPD, "topic": "t", "channel": "c"}
    auto = SourceOptions.parse(base)
    assert auto.mode is None
    assert auto.reading_mode(youzan=True) == "offsets"
    assert auto.reading_mode(youzan=False) == "hold"
    assert SourceOptions.parse({**base, "journal": "/j"}).reading_mode(youzan=True) == "journal"
    assert SourceOptions.parse({**base, "mode": "hold"}).reading_mode(youzan=True) == "hold"
    assert SourceOptions.parse({**base, "ordered": "true"}).reading_mode(youzan=True) == "offsets"
    # Options of the mode that does not apply are refused once the cluster is known.
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse({**base, "maxInFlight": "100"}).reading_mode(youzan=True)
    assert raised.value.field == "maxInFlight"
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse({**base, "startingOffsets": "earliest"}).reading_mode(youzan=False)
    assert raised.value.field == "startingOffsets"
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse({**base, "ordered": "true"}).reading_mode(youzan=False)
    assert raised.value.field == "journal"
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse({**base, "mode": "offsets"}).reading_mode(youzan=False)
    assert raised.value.field == "mode"
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse(
            {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c", "mode": "offsets"}
        )
    assert raised.value.field == "mode"


def test_offsets_mode_options() -> None:
    options = SourceOptions.parse(
        {
            **LOOKUPD,
            "topic": "t",
            "channel": "c",
            "startingOffsets": '{"t": {"0": 42, "1": -2, "2": -1}}',
            "endingOffsets": "latest",
            "failOnDataLoss": "false",
            "maxOffsetsPerTrigger": "4096",
        }
    )
    assert options.starting is not None
    assert options.starting.kind == "offsets"
    assert dict(options.starting.offsets) == {0: 42, 1: -2, 2: -1}
    assert options.ending is not None
    assert options.ending.kind == "latest"
    assert options.fail_on_data_loss is False
    assert options.max_offsets_per_trigger == 4096
    stamped = SourceOptions.parse(
        {**LOOKUPD, "topic": "t", "channel": "c", "startingTimestamp": "1700000000000"}
    )
    assert stamped.starting is not None
    assert stamped.starting.kind == "timestamp"
    assert stamped.starting.timestamp_ms == 1_700_000_000_000


def test_ordered_needs_lookupd() -> None:
    with pytest.raises(ValidationError) as raised:
        SourceOptions.parse(
            {
                "nsqd": "127.0.0.1:4150",
                "topic": "t",
                "channel": "c",
                "ordered": "true",
                "journal": "/tmp/j",
            }
        )
    assert raised.value.field == "ordered"


def _schema(**columns: object) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])  # type: ignore[arg-type]


def test_sink_columns() -> None:
    options = SinkOptions.parse({**LOOKUPD, "topic": "t"})
    columns = check_sink_schema(
        _schema(
            body=StringType(),
            sharding_key=LongType(),
            trace_id=LongType(),
            ext=MapType(StringType(), StringType()),
            delay_ms=IntegerType(),
        ),
        options,
    )
    assert columns.body_is_text
    assert columns.sharding_key
    assert columns.trace_id
    assert columns.ext
    assert columns.delay_ms
    assert not columns.partition
    binary = check_sink_schema(_schema(body=BinaryType(), partition=IntegerType()), options)
    assert not binary.body_is_text
    assert binary.partition
    # both columns: each row fills one of them at most (checked per row, by the writer)
    both = check_sink_schema(
        _schema(body=BinaryType(), sharding_key=LongType(), partition=IntegerType()), options
    )
    assert both.sharding_key
    assert both.partition


@pytest.mark.parametrize(
    ("columns", "field", "options"),
    [
        ({"payload": StringType()}, "body", {}),
        ({"body": DoubleType()}, "body", {}),
        ({"body": StringType(), "sharding_key": DoubleType()}, "sharding_key", {}),
        ({"body": StringType(), "sharding_key": BinaryType()}, "sharding_key", {}),
        ({"body": StringType(), "partition": StringType()}, "partition", {}),
        ({"body": StringType(), "ext": MapType(StringType(), LongType())}, "ext", {}),
        ({"body": StringType(), "topic": LongType()}, "topic", {}),
        ({"body": StringType(), "extra": LongType()}, "extra", {}),
        ({"body": StringType()}, "topic", {"topic": None}),
        ({"body": StringType(), "partition": IntegerType()}, "partition", {"nsqd": "h:1"}),
    ],
)
def test_sink_column_errors_name_the_column(
    columns: dict[str, object], field: str, options: dict[str, str | None]
) -> None:
    settings: dict[str, str | None] = {**LOOKUPD, "topic": "t", **options}
    if "nsqd" in options:
        settings.pop("lookupd")
    parsed = SinkOptions.parse({k: v for k, v in settings.items() if v is not None})
    with pytest.raises(ValidationError) as raised:
        check_sink_schema(_schema(**columns), parsed)
    assert raised.value.field == field


def test_binary_keys_with_murmur3() -> None:
    options = SinkOptions.parse({**LOOKUPD, "topic": "t", "sharding": "murmur3"})
    assert check_sink_schema(_schema(body=BinaryType(), sharding_key=BinaryType()), options)
