"""The stream reader's write-ahead journal: received messages, written (and by default
fsync'ed) before they are finished on nsqd, kept until Spark has committed the micro-batch
that holds them.

A directory of segment files named after their first sequence number. Each record is
``[u32 length][u32 crc32][u64 seq][payload]`` (little endian; length and crc cover seq and
payload). Sequence numbers only grow. A record torn by a crash can only be at the end of the
last segment: it is cut off when the journal is opened (its message was never finished, so
nsqd delivers it again). Damage anywhere else raises :class:`JournalError`.

One reader at a time: the directory is locked (``flock``) while open; the lock goes with the
process. Plain file I/O, no Spark, no asyncio.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from smartnsq.errors import NSQError

__all__ = ["Framed", "Journal", "JournalError"]

_HEAD = struct.Struct("<II")
_SEQ = struct.Struct("<Q")
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

    def append(self, records: Iterable[tuple[int, bytes]]) -> None:
        """Write records (sequence numbers above every one written before), then flush and,
        with ``sync``, fsync: when this returns they survive a crash."""
        self.write(self.frame(records))

    def frame(self, records: Iterable[tuple[int, bytes]]) -> Framed:
        """Encode records for :meth:`write` (pure CPU: callers may do it on another thread
        than the write, whose system calls release the GIL)."""
        chunks = []
        first = last = None
        previous = self._framed_last
        for seq, payload in records:
            if seq <= previous:
                raise JournalError(f"sequence number {seq} does not follow {previous}")
            body = _SEQ.pack(seq) + payload
            chunks.append(_HEAD.pack(len(body), zlib.crc32(body)))
            chunks.append(body)
            if first is None:
                first = seq
            last = previous = seq
        if first is None or last is None:
            return Framed(0, 0, b"")
        self._framed_last = last
        return Framed(first, last, b"".join(chunks))

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
            end = position + _HEAD.size
            if end <= len(data):
                length, crc = _HEAD.unpack_from(data, position)
                body = data[end : end + length]
                if len(body) == length >= _SEQ.size and zlib.crc32(body) == crc:
                    yield _SEQ.unpack_from(body)[0], body[_SEQ.size :]
                    position = end + length
                    continue
            if not last:
                raise JournalError(f"{path} is damaged at byte {position}")
            # A write torn by a crash: its messages were never finished on nsqd.
            with open(path, "r+b") as handle:
                handle.truncate(position)
            return


def _sync_directory(directory: Path) -> None:
    """Make created and removed file names durable (fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
