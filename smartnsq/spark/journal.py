"""The stream reader's write-ahead journal: received messages, written (and by default
fsync'ed) before they are finished on nsqd, kept until Spark has committed the micro-batch
that holds them.

A directory of segment files named after their first sequence number. Each write is one
block of records with consecutive sequence numbers: ``[u32 length][u32 crc32][u64 first
seq][u32 count][count x u32 payload length][payloads]`` (little endian; length and crc cover
everything after them). Sequence numbers only grow. A block torn by a crash can only be at
the end of the last segment: it is cut off when the journal is opened (its messages were
never finished, so nsqd delivers them again). Damage anywhere else raises
:class:`JournalError`.

One reader at a time: the directory is locked (``flock``) while open; the lock goes with the
process. Plain file I/O, no Spark, no asyncio.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from smartnsq.errors import NSQError

__all__ = ["Framed", "Journal", "JournalError"]

_HEAD = struct.Struct("<II")
_BLOCK = struct.Struct("<QI")
_SUFFIX = ".journal"
_LOCK = "lock"


class JournalError(NSQError):
    """The journal cannot be used: locked by another reader, damaged, or not writable."""


@dataclass(frozen=True)
class Framed:
    """Records encoded by :meth:`Journal.frame`, ready for :meth:`Journal.write`."""

    first: int
    last: int
    data: bytes


@dataclass
class _Segment:
    path: Path
    first: int
    last: int


class Journal:
    """``open()`` (returns what is kept), ``append()``, ``trim()``, ``close()``."""

    def __init__(
        self, directory: str | os.PathLike[str], *, sync: bool = True, segment_bytes: int = 64 << 20
    ) -> None:
        self.directory = Path(directory)
        self.sync = sync
        self.segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._file: BinaryIO | None = None
        self._written = 0
        self._lock: int | None = None
        self.last_seq = 0
        self._framed_last = 0

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> list[tuple[int, bytes]]:
        """Lock the directory and return the records it keeps, in sequence order."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            lock = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"cannot open the journal {self.directory}: {exc}") from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            raise JournalError(
                f"the journal {self.directory} is in use by another reader (each streaming "
                "query needs its own journal directory)"
            ) from None
        self._lock = lock
        records: list[tuple[int, bytes]] = []
        paths = sorted(self.directory.glob(f"*{_SUFFIX}"))
        for index, path in enumerate(paths):
            found = list(self._recover(path, last=index == len(paths) - 1))
            if not found:
                path.unlink()
                continue
            if records and found[0][0] <= records[-1][0]:
                raise JournalError(f"{path}: sequence numbers go backwards")
            self._segments.append(_Segment(path, found[0][0], found[-1][0]))
            records.extend(found)
        if records:
            self.last_seq = self._framed_last = records[-1][0]
        return records

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def append(self, first: int, payloads: Sequence[bytes]) -> None:
        """Write records ``first``, ``first + 1``... (above every one written before), then
        flush and, with ``sync``, fsync: when this returns they survive a crash."""
        self.write(self.frame(first, payloads))

    def frame(self, first: int, payloads: Sequence[bytes]) -> Framed:
        """Encode one block for :meth:`write` (pure CPU: callers may do it on another thread
        than the write, whose system calls release the GIL)."""
        count = len(payloads)
        if not count:
            return Framed(0, 0, b"")
        if first <= self._framed_last:
            raise JournalError(f"sequence number {first} does not follow {self._framed_last}")
        body = b"".join(
            (
                _BLOCK.pack(first, count),
                struct.pack(f"<{count}I", *map(len, payloads)),
                *payloads,
            )
        )
        last = first + count - 1
        self._framed_last = last
        return Framed(first, last, _HEAD.pack(len(body), zlib.crc32(body)) + body)

    def write(self, framed: Framed) -> None:
        """Write records encoded by :meth:`frame`, in the order they were framed."""
        if self._lock is None:
            raise JournalError("the journal is not open")
        if not framed.data:
            return
        try:
            handle = self._writable(framed.first)
            handle.write(framed.data)
            handle.flush()
            if self.sync:
                os.fsync(handle.fileno())
        except OSError as exc:
            raise JournalError(f"cannot write the journal {self.directory}: {exc}") from exc
        self._written += len(framed.data)
        self._segments[-1].last = framed.last
        self.last_seq = framed.last

    def _writable(self, first: int) -> BinaryIO:
        if self._file is not None and self._written < self.segment_bytes:
            return self._file
        if self._file is not None:
            self._file.close()
        path = self.directory / f"{first:020d}{_SUFFIX}"
        self._file = open(path, "xb")  # noqa: SIM115 - kept open across appends
        self._written = 0
        self._segments.append(_Segment(path, first, first))
        if self.sync:
            _sync_directory(self.directory)
        return self._file

    def trim(self, upto: int) -> None:
        """Forget every record with a sequence number <= ``upto``: whole segments go; the
        one being written goes too (the next append starts a new one) once it is all done."""
        kept = []
        removed = False
        for segment in self._segments:
            if segment.last > upto:
                kept.append(segment)
                continue
            if self._file is not None and segment is self._segments[-1]:
                self._file.close()
                self._file = None
            try:
                segment.path.unlink()
            except FileNotFoundError:
                pass
            removed = True
        self._segments = kept
        if removed and self.sync:
            _sync_directory(self.directory)

    @property
    def segments(self) -> int:
        return len(self._segments)

    # ------------------------------------------------------------------ reading

    def _recover(self, path: Path, *, last: bool) -> Iterator[tuple[int, bytes]]:
        data = path.read_bytes()
        position = 0
        while position < len(data):
            block = _block(data, position)
            if block is not None:
                position, first, payloads = block
                yield from enumerate(payloads, first)
                continue
            if not last:
                raise JournalError(f"{path} is damaged at byte {position}")
            # A write torn by a crash: its messages were never finished on nsqd.
            with open(path, "r+b") as handle:
                handle.truncate(position)
            return


def _block(data: bytes, position: int) -> tuple[int, int, list[bytes]] | None:
    """The block at ``position`` (the next position, its first seq, its payloads), or None
    if it is incomplete or damaged."""
    start = position + _HEAD.size
    if start > len(data):
        return None
    length, crc = _HEAD.unpack_from(data, position)
    end = start + length
    if end > len(data) or length < _BLOCK.size or zlib.crc32(data[start:end]) != crc:
        return None
    first, count = _BLOCK.unpack_from(data, start)
    offset = start + _BLOCK.size
    sizes = struct.unpack_from(f"<{count}I", data, offset)
    offset += 4 * count
    payloads = []
    for size in sizes:
        payloads.append(data[offset : offset + size])
        offset += size
    if offset != end:
        return None
    return end, first, payloads


def _sync_directory(directory: Path) -> None:
    """Make created and removed file names durable (fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
