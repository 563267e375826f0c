"""The offsets mode's planning on the driver, with the leaders' answers stubbed (no Spark
session, no cluster): initial offsets, caps, Trigger.AvailableNow's target, new partitions,
data loss, the input partitions and what they know of their starts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from smartnsq.errors import DataLossError, ValidationError
from smartnsq.protocol.commands import StartPosition
from smartnsq.protocol.offsets import PartitionOffsets
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.range_source import NsqRangeBatchReader, NsqRangeStreamReader
from smartnsq.spark.schema import SOURCE_SCHEMA


class StubPlanner:
    """What the leaders would say: per partition (start, end, channel position)."""

    def __init__(self, queues: Mapping[int, tuple[int, int, int]]) -> None:
        self.state = dict(queues)
        self.missing: set[int] = set()  # partitions whose leader has no such channel
        self.seeks: list[dict[int, int]] = []
        self.located: list[tuple[int, StartPosition]] = []
        self.closed = False

    def queues(self) -> dict[int, PartitionOffsets]:
        out = {}
        for partition, (start, end, position) in self.state.items():
            if partition in self.missing:
                out[partition] = PartitionOffsets(partition, "h:1", start, end, None, None)
                continue
            depth = (end - position) // 100  # 100-byte messages
            out[partition] = PartitionOffsets(partition, "h:1", start, end, position, depth)
        return out

    def seek(self, offsets: Mapping[int, int]) -> None:
        self.seeks.append(dict(offsets))
        for partition, offset in offsets.items():
            start, end, _ = self.state[partition]
            self.state[partition] = (start, end, offset)

    def locate(self, partition: int, position: StartPosition) -> int:
        self.located.append((partition, position))
        return 300

    def close(self) -> None:
        self.closed = True


def _options(**extra: str) -> SourceOptions:
    return SourceOptions.parse(
        {"lookupd": "http://127.0.0.1:4161", "topic": "t", "channel": "c", **extra}
    )


def _stream(planner: StubPlanner, **extra: str) -> NsqRangeStreamReader:
    reader = NsqRangeStreamReader(_options(**extra), SOURCE_SCHEMA)
    reader._planner = planner  # type: ignore[assignment]
    return reader


def _spark(offsets: dict[int, int]) -> dict[str, Any]:
    return {"t": {str(p): o for p, o in offsets.items()}}


def test_initial_offsets_are_resolved_once_and_the_channel_moved_there() -> None:
    planner = StubPlanner({0: (0, 1000, 1000), 1: (200, 500, 500)})
    reader = _stream(planner, startingOffsets="earliest")
    assert reader.initialOffset() == _spark({0: 0, 1: 200})
    planner.state[0] = (0, 5000, 1000)  # more published: asked again, the same answer
    assert reader.initialOffset() == _spark({0: 0, 1: 200})
    assert planner.seeks == [{0: 0, 1: 200}]
    latest = _stream(StubPlanner({0: (0, 1000, 0)}), startingOffsets="latest")
    assert latest.initialOffset() == _spark({0: 1000})


def test_a_first_run_starts_at_the_channel_by_default(caplog: pytest.LogCaptureFixture) -> None:
    # The channel holds a backlog on partition 0 (consumed up to 300) and partition 1 (none
    # of it consumed); partition 2 has no such channel: nsqd would create it at the end.
    planner = StubPlanner({0: (0, 1000, 300), 1: (100, 800, 100), 2: (0, 500, 0)})
    planner.missing = {2}
    reader = _stream(planner)
    with caplog.at_level(logging.INFO, logger="smartnsq.spark"):
        assert reader.initialOffset() == _spark({0: 300, 1: 100, 2: 500})
    assert planner.seeks == [{0: 300, 1: 100, 2: 500}]
    [record] = [r for r in caplog.records if "first run" in r.getMessage()]
    assert record.levelno == logging.INFO
    text = record.getMessage()
    for part in ("t/c", "channel's position", "partition 0 at 300", "partition 1 at 100"):
        assert part in text
    assert "partition 2 at 500 (queue 0..500, no channel yet" in text


def test_starting_json_and_timestamp() -> None:
    planner = StubPlanner({0: (0, 1000, 0), 1: (0, 800, 0)})
    reader = _stream(planner, startingOffsets='{"t": {"0": 130, "1": -1}}')
    assert reader.initialOffset() == _spark({0: 130, 1: 800})
    missing = _stream(
        StubPlanner({0: (0, 1000, 0), 1: (0, 800, 0)}), startingOffsets='{"t": {"0": 1}}'
    )
    with pytest.raises(ValidationError, match="partition 1"):
        missing.initialOffset()
    stamped = _stream(StubPlanner({0: (0, 1000, 0)}), startingTimestamp="1700000000999")
    assert stamped.initialOffset() == _spark({0: 300})
    assert stamped._planner.located == [(0, StartPosition.timestamp(1_700_000_000))]  # type: ignore[union-attr]


def test_latest_offsets_caps_and_partitions() -> None:
    planner = StubPlanner({0: (0, 10_000, 0), 1: (0, 2_000, 0)})
    reader = _stream(planner)
    assert reader.latestOffset(_spark({0: 0, 1: 0}), ReadAllAvailable()) == _spark(
        {0: 10_000, 1: 2_000}
    )
    # 60 messages of 100 bytes, spread 100:20 over the partitions
    assert reader.latestOffset(_spark({0: 0, 1: 0}), ReadMaxRows(60)) == _spark({0: 5000, 1: 1000})
    capped = _stream(planner, maxOffsetsPerTrigger="1200")
    assert capped.latestOffset(_spark({0: 0, 1: 0}), ReadAllAvailable()) == _spark(
        {0: 1000, 1: 200}
    )
    parts = reader.partitions(_spark({0: 0, 1: 2000}), _spark({0: 5000, 1: 2000}))
    assert [(p.partition, p.start, p.end, p.start_is_boundary) for p in parts] == [  # type: ignore[attr-defined]
        (0, 0, 5000, True)  # 0: the queue's start, seen in /stats; partition 1: nothing
    ]
    inside = reader.partitions(_spark({0: 5000}), _spark({0: 7000}))
    assert inside[0].start_is_boundary is False  # type: ignore[attr-defined] # a capped end


def test_a_new_partition_is_read_from_its_start() -> None:
    planner = StubPlanner({0: (0, 1000, 1000), 1: (0, 300, 0)})
    reader = _stream(planner)
    assert reader.latestOffset(_spark({0: 1000}), ReadAllAvailable()) == _spark({0: 1000, 1: 300})


def test_available_now_stops_at_the_ends_it_first_saw() -> None:
    planner = StubPlanner({0: (0, 1000, 0)})
    reader = _stream(planner)
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset(_spark({0: 0}), ReadMaxRows(5)) == _spark({0: 500})
    planner.state[0] = (0, 9000, 500)  # published after the query started
    assert reader.latestOffset(_spark({0: 500}), ReadAllAvailable()) == _spark({0: 1000})


def test_a_queue_that_lost_what_was_planned_is_data_loss() -> None:
    planner = StubPlanner({0: (0, 800, 800)})  # the stream had planned up to 1000
    with pytest.raises(DataLossError, match="ends at 800, before the stream's offset 1000"):
        _stream(planner).latestOffset(_spark({0: 1000}), ReadAllAvailable())
    reader = _stream(planner, failOnDataLoss="false")
    end = reader.latestOffset(_spark({0: 1000}), ReadAllAvailable())
    assert end == _spark({0: 800})  # going on from the queue's end
    assert reader.partitions(_spark({0: 1000}), end) == []


def test_batch_reads_between_positions() -> None:
    options = _options(endingOffsets='{"t": {"0": 700, "1": -1}}')
    reader = NsqRangeBatchReader(options, SOURCE_SCHEMA)
    planner = StubPlanner({0: (100, 1000, 0), 1: (0, 400, 0)})
    reader._planner = planner  # type: ignore[assignment]
    parts = reader.partitions()
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 100, 700), (1, 0, 400)]  # type: ignore[attr-defined]
    assert planner.closed  # the driver's planner is done once the ranges are known
    backwards = NsqRangeBatchReader(
        _options(startingOffsets='{"t": {"0": 900}}', endingOffsets='{"t": {"0": 700}}'),
        SOURCE_SCHEMA,
    )
    backwards._planner = StubPlanner({0: (0, 1000, 0)})  # type: ignore[assignment]
    with pytest.raises(ValidationError, match="before its start"):
        backwards.partitions()
    with pytest.raises(ValidationError, match="latest would read nothing"):
        NsqRangeBatchReader(_options(startingOffsets="latest"), SOURCE_SCHEMA)


def test_the_pickled_reader_leaves_the_driver_state_behind() -> None:
    import pickle

    reader = _stream(StubPlanner({0: (0, 1000, 0)}))
    reader.initialOffset()
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._planner is None
    assert copy._boundaries == {}
