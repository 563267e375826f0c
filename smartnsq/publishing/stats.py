"""The Producer's counters (``producer.stats()``), kept as publishes end: pure data."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

from smartnsq.protocol.validation import checked_size
from smartnsq.publishing.result import PublishResult

__all__ = ["ProducerStats"]


@dataclass(slots=True)
class ProducerStats:
    """Counters since the producer was created (``producer.stats()`` returns a snapshot).

    A *publish* is one request to nsqd: one ``publish()``, one ``publish_many()`` batch, or
    one auto-batched MPUB (``linger=``); its messages are counted apart.
    """

    published: int = 0  # messages nsqd acknowledged
    publishes: int = 0  # publishes acknowledged (an MPUB counts once)
    published_bytes: int = 0  # body bytes of the acknowledged messages
    retries: int = 0  # tries after a publish's first (failovers, lost connections...)
    # messages sent again after a try of theirs went unanswered: each may be stored twice
    # (on youzan ext topics an ordered consumer drops the copy by its sequence stamp)
    resent_in_doubt: int = 0
    # publishes that raised once sent (routing, connecting and waiting for a leader count as
    # sending): not those refused before, for their arguments or a feature their server lacks
    failures: int = 0
    failed_messages: int = 0  # the messages of those publishes
    connections: int = 0  # open publishing connections, when the snapshot was taken
    per_partition: dict[int | None, int] = field(default_factory=dict)  # messages; None: classic

    def acknowledged(self, bodies: list[bytes], results: list[PublishResult]) -> None:
        """Count one publish nsqd acknowledged (its bodies, their results)."""
        count = len(results)
        self.published += count
        self.publishes += 1
        self.published_bytes += len(bodies[0]) if count == 1 else _size(bodies)
        partition = results[0].partition
        per_partition = self.per_partition
        per_partition[partition] = per_partition.get(partition, 0) + count

    def failed(self, messages: int) -> None:
        """Count one publish of ``messages`` messages that raised."""
        self.failures += 1
        self.failed_messages += messages

    def snapshot(self, connections: int) -> ProducerStats:
        """A copy for the caller, with the open connections counted now."""
        copy = dataclasses.replace(self, connections=connections)
        copy.per_partition = dict(self.per_partition)
        return copy


def _size(bodies: list[bytes]) -> int:
    """The bytes of a batch's bodies together (compiled: no Python call per body)."""
    size = checked_size(bodies, sys.maxsize)
    return size if size >= 0 else sum(map(len, bodies))
