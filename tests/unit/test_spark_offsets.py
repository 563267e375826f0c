"""The offsets mode's positions and caps (pure): Spark offsets as JSON per partition, and
Kafka's rateLimit spreading a cap over the partitions."""

from __future__ import annotations

import pytest

from smartnsq.errors import ValidationError
from smartnsq.spark.offsets import (
    EARLIEST,
    LATEST,
    cap_messages,
    offsets_from_spark,
    offsets_to_spark,
    parse_position,
    rate_limit,
)


def test_spark_offsets_round_trip() -> None:
    spark = offsets_to_spark("t", {1: 40, 0: 0})
    assert spark == {"t": {"0": 0, "1": 40}}
    assert offsets_from_spark(spark, "t", "start") == {0: 0, 1: 40}
    assert offsets_from_spark('{"t": {"3": 7}}', "t", "start") == {3: 7}


@pytest.mark.parametrize(
    "value",
    [{"seq": 3}, {"u": {"0": 1}}, {"t": {"x": 1}}, {"t": {"0": -1}}, {"t": {"0": 1.5}}, "not json"],
)
def test_bad_spark_offsets(value: object) -> None:
    with pytest.raises(ValidationError) as raised:
        offsets_from_spark(value, "t", "start")
    assert raised.value.field == "start"


def test_positions() -> None:
    assert parse_position("startingOffsets", " earliest ", "t").at(3) == EARLIEST
    assert parse_position("startingOffsets", "latest", "t").at(3) == LATEST
    position = parse_position("startingOffsets", '{"t": {"0": 5, "1": -2}}', "t")
    assert (position.at(0), position.at(1), position.at(2)) == (5, EARLIEST, None)


def test_rate_limit_spreads_the_cap_in_proportion() -> None:
    start = {0: 0, 1: 100, 2: 500}
    end = {0: 3000, 1: 1100, 2: 500}
    # 4000 to read (3000 + 1000 + 0); a cap of 400 gives 300 and 100.
    assert rate_limit(400, start, end) == {0: 300, 1: 200, 2: 500}
    # Never past the end; a cap above what there is reads it all.
    assert rate_limit(10_000, start, end) == end
    # A partition whose share is below one still gets one (Kafka: no starving).
    assert rate_limit(10, {0: 0, 1: 0}, {0: 100_000, 1: 10}) == {0: 9, 1: 1}
    # Nothing to read.
    assert rate_limit(5, {0: 7}, {0: 7}) == {0: 7}


def test_cap_messages_turns_message_shares_into_offsets() -> None:
    start = {0: 0, 1: 0}
    end = {0: 100 * 50, 1: 1000 * 10}  # 50 messages of 100 bytes, 10 of 1000
    capped = cap_messages(30, start, end, {0: 100.0, 1: 1000.0})
    assert capped == {0: 25 * 100, 1: 5 * 1000}  # 30 messages, spread 50:10
    # A partition without an average size is not capped.
    assert cap_messages(30, start, end, {0: 100.0})[1] == end[1]
    assert cap_messages(1000, start, end, {0: 100.0, 1: 1000.0}) == end
