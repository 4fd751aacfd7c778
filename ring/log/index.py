"""Sparse indexes beside each segment: offset -> file position, and timestamp -> offset.

Both are append-only files of fixed-size big-endian entries, mirrored in two
parallel in-memory arrays (compact: 4 or 8 bytes an entry) so a lookup is one
``bisect`` (O(log n)) and never touches the disk. An index holds a file
descriptor only while it is written (the active segment, or until a rolled
segment is synced), so a long log does not use three descriptors a segment. Offsets are stored relative to the segment's base offset
(4 bytes suffice because a segment holds at most 2**32 offsets; the log rolls
before that).

* Offset index (``.index``): ``(relative offset u32, position u32)``, one entry
  per ``index_interval_bytes`` of log, pointing at a batch start. A lookup
  returns the greatest entry at or below the wanted offset; the reader walks
  batch headers from there, so it scans at most one interval.
* Time index (``.timeindex``): ``(timestamp i64, relative offset u32)``. An
  entry ``(ts, rel)`` promises that every record in the segment *before*
  ``base + rel`` has a timestamp ``<= ts``. Entries are added beside offset
  index entries when that running maximum grew, and once more when the segment
  is closed (``rel`` = one past its last offset), so the last entry of a closed
  segment carries the segment's largest timestamp (retention reads it).

An index is only a cache of what the segment holds: when one is missing or
fails validation, the segment rebuilds it by walking its batches.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from pathlib import Path
from typing import Iterable

from ring.log.fsync import TMP_SUFFIX, write_all

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
REL_OFFSET_MAX = 2**32 - 1
POSITION_MAX = 2**32 - 1


class _IndexFile:
    """An append-only file of (key, value) entries with the keys sorted."""

    entry: struct.Struct
    key_type: str  # array typecodes
    value_type = "I"

    def __init__(self, path: Path, keys: Iterable[int], values: Iterable[int]) -> None:
        self.path = path
        self.keys = array(self.key_type, keys)
        self.values = array(self.value_type, values)
        self._fd = -1

    def _writable(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    @classmethod
    def read_entries(cls, path: Path) -> tuple[array, array] | None:
        """Entries stored in ``path``; None if the file is missing or not whole entries."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % cls.entry.size:
            return None
        pairs = list(cls.entry.iter_unpack(data))
        return array(cls.key_type, [p[0] for p in pairs]), array(cls.value_type, [p[1] for p in pairs])

    @classmethod
    def create(cls, path: Path, keys: list[int], values: list[int]) -> "_IndexFile":
        """Write the given entries atomically (no fsync: the segment syncs when it must)."""
        tmp = path.with_name(path.name + TMP_SUFFIX)
        data = b"".join(cls.entry.pack(k, v) for k, v in zip(keys, values))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return cls(path, keys, values)

    def __len__(self) -> int:
        return len(self.keys)

    def _append(self, key: int, value: int) -> None:
        write_all(self._writable(), self.entry.pack(key, value))
        self.keys.append(key)
        self.values.append(value)

    def truncate(self, count: int) -> None:
        """Keep only the first ``count`` entries, on disk and in memory."""
        if count < len(self.keys):
            del self.keys[count:]
            del self.values[count:]
            os.ftruncate(self._writable(), count * self.entry.size)

    def sync(self) -> None:
        os.fsync(self._writable())

    def dup_fd(self) -> int:
        return os.dup(self._writable())

    def close(self) -> None:
        """Release the descriptor (reopened if the index is written again)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class OffsetIndex(_IndexFile):
    """keys: relative offsets of batch starts; values: their file positions."""

    entry = OFFSET_ENTRY
    key_type = "I"

    def append(self, rel_offset: int, position: int) -> None:
        assert not self.keys or (rel_offset > self.keys[-1] and position > self.values[-1])
        assert 0 <= rel_offset <= REL_OFFSET_MAX and 0 <= position <= POSITION_MAX
        self._append(rel_offset, position)

    def lookup(self, rel_offset: int) -> tuple[int, int]:
        """(relative offset, position) of the last entry at or below ``rel_offset``; (0, 0) if none."""
        i = bisect.bisect_right(self.keys, rel_offset) - 1
        return (self.keys[i], self.values[i]) if i >= 0 else (0, 0)

    def truncate_from(self, rel_offset: int) -> None:
        """Drop entries at or after ``rel_offset`` (the log is cut there)."""
        self.truncate(bisect.bisect_left(self.keys, rel_offset))

    @staticmethod
    def valid(keys: array, values: array, segment_bytes: int) -> bool:
        return all(
            k1 < k2 and p1 < p2 for k1, k2, p1, p2 in zip(keys, keys[1:], values, values[1:])
        ) and (not values or (values[0] > 0 and values[-1] < segment_bytes))


class TimeIndex(_IndexFile):
    """keys: running maximum timestamps; values: relative offsets they hold before."""

    entry = TIME_ENTRY
    key_type = "q"

    def append(self, timestamp: int, rel_offset: int) -> None:
        assert not self.keys or (timestamp >= self.keys[-1] and rel_offset > self.values[-1])
        self._append(timestamp, rel_offset)

    @property
    def last_timestamp(self) -> int | None:
        return self.keys[-1] if self.keys else None

    def rel_before(self, timestamp: int) -> int:
        """A relative offset before which every record is older than ``timestamp`` (0 if none known)."""
        i = bisect.bisect_left(self.keys, timestamp) - 1
        return self.values[i] if i >= 0 else 0

    def truncate_from(self, rel_offset: int) -> None:
        """Drop entries that speak of offsets at or after ``rel_offset``."""
        self.truncate(bisect.bisect_left(self.values, rel_offset))

    @staticmethod
    def valid(keys: array, values: array, rel_end: int, closed: bool) -> bool:
        """Sorted, within the segment, and (for a closed segment) ending with the closing entry."""
        if not all(t1 <= t2 and r1 < r2 for t1, t2, r1, r2 in zip(keys, keys[1:], values, values[1:])):
            return False
        if values and not (0 < values[0] and values[-1] <= rel_end):
            return False
        return not closed or (bool(values) and values[-1] == rel_end)
