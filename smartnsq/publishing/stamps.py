"""Sequence stamps: what lets an ordered consumer drop a message stored twice (pure).

nsqd checks nothing about a publish: a try whose answer was lost and that is sent again may
be stored twice, and a try held by a half-open link may be stored after the client gave up
on it. Kafka's idempotent producer (a producer id and a per-partition sequence the broker
checks), Pulsar's sequence ids and NATS JetStream's ``Nats-Msg-Id`` solve this on the
server. Here both ends are the client's: on a youzan ext topic the producer writes one ext
header key into every message bound to a partition (a sharding key or an explicit
partition), and the ordered consumer reads it back (:mod:`smartnsq.flow.replays`).

The key is :data:`STAMP_KEY`, its value the text ``"<producer>:<seq>:<floor>"``:

* ``producer``: the producer's id, 16 hex digits drawn when the Producer is made (a new one
  per Producer, so a restarted process starts a new sequence);
* ``seq``: the message's number in its partition, from 1, in the order ``publish()`` was
  called; every try of a publish carries the same number (an MPUB's messages take
  consecutive ones);
* ``floor``: when the try was sent, every number below it was settled by the producer:
  acknowledged, or given up on. A copy of such a message that is delivered after this one
  is a duplicate or a late one, never news.

The key does not start with ``##`` (nsqd keeps those for itself: youzan/nsq
``internal/ext/ext.go``) and its value is a string, as nsqd's filters expect of ext values.
"""

from __future__ import annotations

import json
from typing import NamedTuple

__all__ = ["STAMP_KEY", "Stamp", "parse_stamp", "stamp_header", "stamped_header"]

STAMP_KEY = "smartnsq.seq"
_NEEDLE = b'"smartnsq.seq"'
_PREFIX = b'{"smartnsq.seq":"'


class Stamp(NamedTuple):
    """A message's stamp: its producer, its number in its partition and the floor below
    which that producer had settled every number when it sent it."""

    producer: str
    seq: int
    floor: int


def stamp_header(producer: str, seq: int, floor: int) -> bytes:
    """The ext header of a message that carries nothing but its stamp."""
    return b'{"smartnsq.seq":"%s:%d:%d"}' % (producer.encode(), seq, floor)


def stamped_header(header: bytes | None, producer: str, seq: int, floor: int) -> bytes:
    """An encoded ext header (a caller's, or None) with the stamp in it, replacing any stamp
    it carried (a header copied from a consumed message keeps its own producer's)."""
    if not header or header == b"{}":
        return stamp_header(producer, seq, floor)
    fields = json.loads(header)
    fields[STAMP_KEY] = f"{producer}:{seq}:{floor}"
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode()


def parse_stamp(ext_raw: bytes | None) -> Stamp | None:
    """The stamp in a message's JSON ext header, or None (no stamp, or one that does not
    parse: such a message is handled as an unstamped one)."""
    if not ext_raw or _NEEDLE not in ext_raw:
        return None
    if ext_raw.startswith(_PREFIX):
        # The header the producer writes: read without a JSON parser.
        end = ext_raw.find(b'"', len(_PREFIX))
        text = ext_raw[len(_PREFIX) : end].decode("ascii", "replace") if end > 0 else ""
    else:
        try:
            fields = json.loads(ext_raw)
        except ValueError:
            return None
        value = fields.get(STAMP_KEY) if isinstance(fields, dict) else None
        if not isinstance(value, str):
            return None
        text = value
    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        return None
    try:
        seq, floor = int(parts[1]), int(parts[2])
    except ValueError:
        return None
    if seq < 1 or floor < 1 or floor > seq:
        return None
    return Stamp(parts[0], seq, floor)
