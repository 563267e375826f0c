"""The source's write-ahead journal (plain files, no Spark): records survive reopening,
a torn tail is cut off, damage elsewhere is an error, trimming drops whole segments, one
reader at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartnsq.spark.journal import Journal, JournalError


def _records(first: int, count: int) -> list[tuple[int, bytes]]:
    return [(seq, f"payload-{seq}".encode() * (seq % 3 + 1)) for seq in range(first, first + count)]


def _append(journal: Journal, first: int, count: int) -> None:
    journal.append(first, [payload for _, payload in _records(first, count)])


def test_records_survive_reopening(tmp_path: Path) -> None:
    with Journal(tmp_path) as journal:
        assert journal.open() == []
        _append(journal, 1, 10)
        _append(journal, 11, 5)
    with Journal(tmp_path) as journal:
        assert journal.open() == _records(1, 15)
        assert journal.last_seq == 15
        _append(journal, 16, 1)  # goes on in a new segment
    with Journal(tmp_path) as journal:
        assert journal.open() == _records(1, 16)


def test_sequence_numbers_only_grow(tmp_path: Path) -> None:
    with Journal(tmp_path) as journal:
        journal.open()
        _append(journal, 5, 2)
        with pytest.raises(JournalError, match="does not follow"):
            _append(journal, 6, 1)
        journal.append(9, [])  # nothing to write


def test_a_torn_last_block_is_cut_off(tmp_path: Path) -> None:
    with Journal(tmp_path) as journal:
        journal.open()
        _append(journal, 1, 2)
        _append(journal, 3, 1)
    segment = next(tmp_path.glob("*.journal"))
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-4])  # a crash in the middle of the last write
    with Journal(tmp_path) as journal:
        assert journal.open() == _records(1, 2)
    assert len(segment.read_bytes()) < len(whole)
    with Journal(tmp_path) as journal:  # and the file was repaired, not only skipped
        assert journal.open() == _records(1, 2)


def test_damage_before_the_last_segment_is_an_error(tmp_path: Path) -> None:
    with Journal(tmp_path, segment_bytes=1) as journal:  # one segment per append
        journal.open()
        _append(journal, 1, 2)
        _append(journal, 3, 2)
    first = sorted(tmp_path.glob("*.journal"))[0]
    data = bytearray(first.read_bytes())
    data[10] ^= 0xFF
    first.write_bytes(bytes(data))
    with Journal(tmp_path) as journal, pytest.raises(JournalError, match="damaged"):
        journal.open()


def test_trim_drops_segments_once_all_their_records_are_committed(tmp_path: Path) -> None:
    with Journal(tmp_path, segment_bytes=1) as journal:
        journal.open()
        for first in (1, 4, 7):
            _append(journal, first, 3)
        assert journal.segments == 3
        journal.trim(5)  # 4..6 is not all committed: its segment stays
        assert journal.segments == 2
        journal.trim(9)
        assert journal.segments == 0
        _append(journal, 10, 1)
    with Journal(tmp_path) as journal:
        assert journal.open() == _records(10, 1)


def test_one_reader_at_a_time(tmp_path: Path) -> None:
    with Journal(tmp_path) as journal:
        journal.open()
        with pytest.raises(JournalError, match="in use by another reader"):
            Journal(tmp_path).open()
    with Journal(tmp_path) as again:  # the lock went with the first one
        assert again.open() == []


def test_without_sync(tmp_path: Path) -> None:
    with Journal(tmp_path, sync=False) as journal:
        journal.open()
        _append(journal, 1, 2)
    with Journal(tmp_path) as journal:
        assert journal.open() == _records(1, 2)
