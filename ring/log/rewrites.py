"""The calls that change what a partition log holds other than by appending: retention, truncation at
either end, a restart past the end, and mending one damaged batch in place.

A part of ``PartitionLog`` (``partition.py``), kept in a module of its own:
it works on the log's segment list under the same lock that ``sync`` takes
from another thread. The log start offset is saved before any file goes, so
a crash between the two never makes a deleted record readable again; a cut
at the end is synced before it returns.
"""

from __future__ import annotations

import bisect
import threading
from pathlib import Path
from typing import Callable, Iterable

from ring.errors import Conflict, CorruptBatch, OffsetOutOfRange, StorageError
from ring.log import batch, retention
from ring.log.batch import BatchHeader
from ring.log.checkpoint import LeaderEpochCache, write_offset
from ring.log.config import LogConfig
from ring.log.segment import Segment

LOG_START_OFFSET_FILE = "log-start-offset"


class Rewrites:
    directory: Path
    config: LogConfig
    end_offset: int
    _segments: list[Segment]
    _bases: list[int]
    _pending: list[Segment]
    _start_offset: int
    _size_bytes: int
    _dir_dirty: bool
    _epochs: LeaderEpochCache
    _lock: threading.RLock
    _check_open: Callable[[], None]
    _replace_all_with_empty: Callable[[int], None]
    _damaged: Callable[[Segment, int, CorruptBatch], StorageError]
    sync: Callable[[], None]

    def enforce_retention(self, now_ms: int | None, upto: int | None = None) -> int:
        """Delete whole closed segments past ``retention_ms`` (by their newest record, against
        ``now_ms``; None: no time-based retention, the clock is not to be trusted) or beyond
        ``retention_bytes``; returns how many. With ``upto`` (the high watermark), only segments
        wholly below it go. The new start offset is saved before the files go.
        """
        self._check_open()
        limit = self.end_offset if upto is None else upto
        closed = [s for s in self._segments[:-1] if s.end_offset <= limit]
        n = retention.expired(closed, self._start_offset, self._size_bytes, self.config.retention_ms,
                              self.config.retention_bytes, now_ms)
        if n and closed[n - 1].end_offset > self._start_offset:
            self._save_start(closed[n - 1].end_offset)
        self._delete_oldest(n)
        return n

    def truncate_before(self, offset: int) -> None:
        """Make ``offset`` the log start offset (Kafka deleteRecords); durable across reopen."""
        self._check_open()
        if offset > self.end_offset:
            raise OffsetOutOfRange(
                f"cannot delete records before offset {offset}: the log ends at {self.end_offset}",
                earliest=self._start_offset, latest=self.end_offset,
            )
        if offset <= self._start_offset:
            return
        self._save_start(offset)
        n = 0
        while n < len(self._segments) - 1 and self._segments[n].end_offset <= offset:
            n += 1
        self._delete_oldest(n)

    def _save_start(self, offset: int) -> None:
        """The log starts at ``offset`` from now on, on disk first: after a crash, segments whose
        deletion did not reach the disk stay below it, never readable again."""
        write_offset(self.directory / LOG_START_OFFSET_FILE, offset)
        self._start_offset = offset
        self._epochs.truncate_from_start(offset)

    def _drop(self, segments: Iterable[Segment]) -> None:
        """Delete ``segments``' files and forget them (the caller holds the lock and takes them off
        the list)."""
        for seg in segments:
            self._size_bytes -= seg.size
            if seg in self._pending:
                self._pending.remove(seg)
            seg.delete()
        self._dir_dirty = True

    def _delete_oldest(self, n: int) -> None:
        if not n:
            return
        with self._lock:
            victims = self._segments[:n]
            del self._segments[:n], self._bases[:n]
            self._drop(victims)
        if self._bases[0] > self._start_offset:
            self._start_offset = self._bases[0]
            self._epochs.truncate_from_start(self._start_offset)

    def restart_at(self, offset: int) -> None:
        """Drop every record and the epoch history; the log continues empty at ``offset`` (at or past
        its end): a replica whose leader's log starts beyond everything this one holds."""
        self._check_open()
        if offset < self.end_offset:
            raise OffsetOutOfRange(f"cannot restart the log at {offset}: it ends at {self.end_offset}",
                                   earliest=self._start_offset, latest=self.end_offset)
        self._replace_all_with_empty(offset)
        self._epochs.truncate_from_end(0)
        self.sync()

    def forget_epochs_at_end(self) -> None:
        """Forget the epochs the history begins at the log end, with no batch of them (saved before
        returning): what ``restart_at(end_offset)`` does to an empty log, without replacing its files."""
        self._check_open()
        self._epochs.truncate_from_end(self.end_offset)

    def mend(self, data: bytes | bytearray | memoryview) -> BatchHeader:
        """Replace the stored copy of one batch with ``data``, a whole copy of the same batch from another
        replica (repair of a damaged batch in place: every other batch stays), synced before returning.

        CorruptBatch if ``data`` is not one whole batch, Conflict if it is not
        the batch stored here (its offsets are not this log's, its epoch not
        the one the history gives them), StorageError if the stored batch
        cannot be found or takes another length.
        """
        self._check_open()
        h = batch.check(data)
        if h.size != len(data):
            raise CorruptBatch(f"expected one batch of {h.size} bytes, got {len(data)} bytes")
        i = bisect.bisect_right(self._bases, h.base_offset) - 1
        if i < 0 or h.next_offset > self._segments[i].end_offset or h.next_offset <= self._start_offset:
            raise Conflict(f"offsets {h.base_offset}-{h.last_offset} are not one stored batch of this log")
        epoch = self._epochs.epoch_at(h.last_offset)
        if epoch is not None and epoch != h.leader_epoch:
            raise Conflict(f"batch at offset {h.base_offset} has leader epoch {h.leader_epoch}, the history says {epoch}")
        seg = self._segments[i]
        with self._lock:
            try:
                seg.mend(h, data)
            except CorruptBatch as exc:
                raise self._damaged(seg, h.base_offset, exc) from None
            except OSError as exc:
                raise StorageError(f"writing to {self.directory}: {exc}") from exc
        return h

    def truncate_after(self, offset: int) -> None:
        """Remove every record at offsets >= ``offset`` (replica repair), synced before returning.

        An ``offset`` inside a batch is rounded DOWN to that batch's base
        offset: batches are never split, so the whole batch goes. Truncating
        below the log start offset empties the log and restarts it there.
        """
        self._check_open()
        if offset >= self.end_offset:
            return
        if offset < self._start_offset:
            cut = offset
        else:
            i = bisect.bisect_right(self._bases, offset) - 1
            seg = self._segments[i]
            try:
                pos, h = seg.find_position(offset)
            except CorruptBatch as exc:
                raise self._damaged(seg, offset, exc) from None
            cut = h.base_offset
        if cut < self._start_offset:
            self._replace_all_with_empty(cut)
        else:
            with self._lock:
                self._drop(reversed(self._segments[i + 1 :]))
                del self._segments[i + 1 :], self._bases[i + 1 :]
                if seg in self._pending:
                    self._pending.remove(seg)
                self._size_bytes -= seg.size - pos
                seg.truncate_at(pos, cut)
                self._dir_dirty = True
        self._epochs.truncate_from_end(cut)
        self.sync()  # outside the lock: a sync running in another thread takes it to finish
