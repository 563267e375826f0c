"""The embedded cluster's logs: the MPUB batch append stores what one append per message
stores, and wakes each channel once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from smartnsq.testing.state import Channel, PartitionLog, Record

FIELDS = ("index", "trace_id", "body", "ext_version", "ext_raw", "offset", "raw_size", "tag")
BODIES = [b"m" * size for size in (1, 2, 100, 7, 4096)]


def _log(kind: str) -> PartitionLog:
    if kind == "classic":
        return PartitionLog(None, ext=False, classic=True, topic_name="t")
    return PartitionLog(3, ext=kind == "youzan-ext", classic=False, topic_name="t")


def _fields(record: Record) -> tuple[object, ...]:
    return tuple(getattr(record, name) for name in FIELDS)


@pytest.mark.parametrize("kind", ["youzan", "youzan-ext", "classic"])
def test_extend_stores_what_append_stores(kind: str) -> None:
    reference, batched = _log(kind), _log(kind)
    for body in [b"first", *BODIES]:
        reference.append(body)
    batched.append(b"first")
    batched.extend(BODIES)
    assert [_fields(r) for r in batched.records] == [_fields(r) for r in reference.records]
    assert batched.end_offset == reference.end_offset
    for mine, theirs in zip(batched.records, reference.records, strict=True):
        if kind == "classic":
            # [ms timestamp << 22 | sequence] as 16 hex digits: only the sequence is fixed.
            assert mine.internal_id & 0x3FFFFF == theirs.internal_id & 0x3FFFFF
            assert mine.id == b"%016x" % mine.internal_id
        else:
            assert (mine.internal_id, mine.id) == (theirs.internal_id, theirs.id)


def test_extend_wakes_each_channel_once() -> None:
    log = PartitionLog(0, ext=False, classic=False, topic_name="t")
    woken: list[Callable[[], None]] = []
    for name in ("a", "b"):
        log.channels[name] = Channel(
            name, log, start_index=0, schedule=woken.append, clock=lambda: 0.0, record=None
        )
    log.extend(BODIES)
    assert woken == [log.channels["a"].pump, log.channels["b"].pump]
    assert [r.internal_id for r in log.records] == list(range(2, 2 + len(BODIES)))
