"""The append-only log of one partition replica: segments, offsets, retention, durability.

A directory holds segments named by base offset (``segment.py``), their
indexes (``index.py``) and four small state files: the log start offset
(moved by ``truncate_before``, one of the calls in ``rewrites.py``), the recovery point (segments before it are
known to be on disk), the leader-epoch history, and the clean-shutdown marker
that ``close`` writes and opening removes. Opening recovers (``recovery.py``).

The leader appends unstamped batches (``append``, ``append_batches``: each
gets its base offset and epoch in place, and a turn's batches go in one
write); a follower appends the leader's stamped batches as they are
(``append_replicated``). Neither fsyncs: the broker calls ``sync``
(fsync policy ``always``, after a group of appends) or ``maybe_sync`` (policy
``interval``). Reads return stored batches as bytes, whole and CRC-checked.

Synchronous: the broker calls it from its event loop, and every call is
bounded (one pread per segment touched plus at most one index interval of
header walking). The one exception to single-threaded use is ``sync``, which
may run in a worker thread while the loop goes on appending (group commit).
Time comes only from the injected clock. Errors: bad input from a client or peer is ``CorruptBatch`` /
``Conflict`` / ``OffsetOutOfRange``; damage found on our own disk is
``StorageError`` (a read never hands out a damaged batch).
"""

from __future__ import annotations

import bisect
import os
import threading
from pathlib import Path

from ring.clock import Clock
from ring.errors import Conflict, CorruptBatch, OffsetOutOfRange, StorageError
from ring.log import batch, replicated
from ring.log.batch import BatchHeader
from ring.log.checkpoint import LeaderEpochCache, read_offset, write_offset
from ring.log.config import LogConfig
from ring.log.fsync import fsync_dir, mkdir_durable, start_writeback, write_atomically
from ring.log.index import REL_OFFSET_MAX
from ring.log.recovery import damaged_key, open_segments, rebuild_epochs, remove_strays
from ring.log.rewrites import LOG_START_OFFSET_FILE, Rewrites
from ring.log.segment import Segment

CLEAN_SHUTDOWN_FILE = "clean-shutdown"
RECOVERY_POINT_FILE = "recovery-point-offset"
LEADER_EPOCH_FILE = "leader-epoch-checkpoint"


class PartitionLog(Rewrites):
    def __init__(self, directory: str | Path, config: LogConfig, clock: Clock) -> None:
        self.directory = Path(directory)
        self.config = config
        self._clock = clock
        self._closed = False
        self._pending: list[Segment] = []  # rolled but not yet fsynced
        self._dir_dirty = False
        self._unsynced_bytes = 0
        self._written_bytes = 0  # appended in this run, ever growing
        self._writeback_from = 0  # _written_bytes when writeback was last started
        self._last_sync = clock.monotonic()
        # Guards the segment list and counters against a sync() in another thread.
        self._lock = threading.RLock()
        self._sync_lock = threading.Lock()  # one sync at a time
        mkdir_durable(self.directory)
        self._open()

    # --- opening ---------------------------------------------------------------

    def _open(self) -> None:
        d = self.directory
        marker = d / CLEAN_SHUTDOWN_FILE
        bases, removed = remove_strays(d)
        self.clean_shutdown = marker.exists() or not bases
        if marker.exists():
            marker.unlink()  # a crash from here on must not look clean
            fsync_dir(d)
        self._recovery_point = read_offset(d / RECOVERY_POINT_FILE) or 0
        epochs = LeaderEpochCache.load(d / LEADER_EPOCH_FILE)
        got = open_segments(
            d, bases, self.config.index_interval_bytes, self.clean_shutdown, self._recovery_point,
            epochs.epoch_at if epochs is not None else None,
        )
        self.recovered_bytes_cut = got.bytes_cut
        self._segments = got.segments
        self._dir_dirty = removed or got.files_removed
        self._start_offset = read_offset(d / LOG_START_OFFSET_FILE) or 0
        if not self._segments:
            self._segments = [Segment.create(d, self._start_offset, self.config.index_interval_bytes)]
            self._dir_dirty = True
        self._bases = [s.base_offset for s in self._segments]
        self._size_bytes = sum(s.size for s in self._segments)
        self._epochs = epochs if epochs is not None else rebuild_epochs(d / LEADER_EPOCH_FILE, self._segments)
        self._start_offset = max(self._start_offset, self._bases[0])
        # The first damaged batch recovery kept inside the log (above its start), for a repair to mend.
        self.recovered_damage = next((max(o, self._start_offset) for o, n in got.damaged
                                      if n > self._start_offset), None)
        if self._start_offset > self.end_offset:
            # The start checkpoint is past what survived a crash: nothing below it may come back.
            self._replace_all_with_empty(self._start_offset)
        # A cut for damage took durable data: the newest epoch does not move down over it (the key would
        # claim that epoch over a log missing what it had; the owner vouches for that key instead).
        self._epochs.truncate_from_end(self.end_offset, keep_latest=damaged_key(d) is None)
        self._epochs.truncate_from_start(self._start_offset)
        # What recovery walked came from the page cache, maybe not from disk: sync it now.
        self._pending = [s for s in got.walked if s in self._segments[:-1]]
        if not self.clean_shutdown or self._dir_dirty:
            self.sync()

    def _replace_all_with_empty(self, offset: int) -> None:
        with self._lock:
            self._drop(reversed(self._segments))
            self._segments = [Segment.create(self.directory, offset, self.config.index_interval_bytes)]
            self._bases = [offset]
            self._size_bytes = 0
            self._start_offset = offset
            self._dir_dirty = True
        write_offset(self.directory / LOG_START_OFFSET_FILE, offset)

    # --- state -----------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """Earliest offset still held (the log start offset)."""
        return self._start_offset

    @property
    def end_offset(self) -> int:
        """Log end offset: the offset the next record gets."""
        return self._segments[-1].end_offset

    @property
    def size_bytes(self) -> int:
        return self._size_bytes

    @property
    def unsynced_bytes(self) -> int:
        """Bytes appended since the last fsync."""
        return self._unsynced_bytes

    @property
    def max_timestamp(self) -> int | None:
        """The newest record timestamp in the log (ms), None when it holds none."""
        stamps = [seg.max_timestamp for seg in self._segments
                  if seg.end_offset > max(seg.base_offset, self._start_offset)]
        return max(stamps) if stamps else None

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def latest_epoch(self) -> int:
        """Newest leader epoch in the history, -1 for a log never written."""
        return self._epochs.latest_epoch

    def epochs(self) -> list[tuple[int, int]]:
        """Leader-epoch history: (epoch, first offset written in it), oldest first."""
        return self._epochs.entries()

    def epoch_at(self, offset: int) -> int:
        """Leader epoch of the batch holding ``offset`` (the latest for the log end), -1 where none is known
        (below the history's first entry)."""
        epoch = self._epochs.epoch_at(offset)
        return -1 if epoch is None else epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, the offset where it ended), (-1, -1) if none: what repair compares."""
        return self._epochs.end_offset_for(epoch, self.end_offset)

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as Kafka's OffsetForLeaderEpoch answers them (``LeaderEpochCache.epoch_end``)."""
        return self._epochs.epoch_end(epoch, self.end_offset)

    def _check_open(self) -> None:
        assert not self._closed, "the log is closed"

    def segment_bases(self) -> list[int]:
        """Base offset of every segment, oldest first (anti-entropy compares replicas segment by segment)."""
        return list(self._bases)

    def closed_segments(self) -> list[tuple[int, int, int, int]]:
        """(base offset, end offset, bytes, newest record timestamp) of every segment but the active one,
        oldest first (ring.ranges cuts ranges at their ends)."""
        return [(s.base_offset, s.end_offset, s.size, s.max_timestamp) for s in self._segments[:-1]]

    def begin_epoch(self, epoch: int) -> None:
        """Record that leader epoch ``epoch`` begins at the log end, before any batch of it.

        A newly elected leader does this at once (and a follower when it
        reaches that offset), so the history shows the epoch even while no
        batch carries it: elections and repair compare histories.
        """
        self._check_open()
        if epoch < self._epochs.latest_epoch:
            raise Conflict(f"leader epoch {epoch} is older than this log's epoch {self._epochs.latest_epoch}",
                           expected_epoch=self._epochs.latest_epoch, got_epoch=epoch)
        self._epochs.assign(epoch, self.end_offset)

    # --- appending ---------------------------------------------------------------

    def append(self, batch_buf: bytearray, leader_epoch: int, *, checked: bool = False) -> BatchHeader:
        """Leader path: stamp one batch with the next offset and ``leader_epoch``, and write it.

        ``checked``: the caller verified this buffer's CRC itself (the produce
        decoders do, on every batch a client or peer sends; ``batch.encode``
        builds a valid one), so it is not computed a second time here.
        """
        if not checked:
            batch.check(batch_buf)
        return self.append_batches([batch_buf], leader_epoch)[0]

    def append_batches(self, batch_bufs: list[bytearray], leader_epoch: int) -> list[BatchHeader]:
        """Leader path: stamp batches whose CRCs were checked with the next offsets and ``leader_epoch``,
        and write them all at once (one write per segment touched); their headers as written."""
        self._check_open()
        if leader_epoch < self._epochs.latest_epoch:
            raise Conflict(
                f"leader epoch {leader_epoch} is older than this log's epoch {self._epochs.latest_epoch}",
                expected_epoch=self._epochs.latest_epoch, got_epoch=leader_epoch,
            )
        base, pos = self.end_offset, 0
        placed: list[tuple[BatchHeader, int]] = []
        for buf in batch_bufs:
            # Stamped before its header is read (once): a buffer refused here is written nowhere.
            batch.stamp(buf, 0, base, leader_epoch)
            h = batch.read_header(buf)
            if h.size != len(buf):
                raise CorruptBatch(f"expected one batch of {h.size} bytes, got {len(buf)} bytes")
            placed.append((h, pos))
            base, pos = h.next_offset, pos + h.size
        data = batch_bufs[0] if len(batch_bufs) == 1 else b"".join(batch_bufs)
        self._write(memoryview(data), placed)
        return [h for h, _ in placed]

    def append_replicated(self, data: bytes | bytearray | memoryview) -> int:
        """Follower path: whole stamped batches that continue this log (``replicated.check_continues``:
        all are checked before any is written); returns the new end offset. A batch taken whole below
        this empty log's start leaves its start offset where it is."""
        self._check_open()
        view = memoryview(data)
        headers, rebase = replicated.check_continues(view, self.end_offset, self._epochs.latest_epoch,
                                                     self._start_offset, empty=not self._size_bytes)
        if rebase is not None:
            self._rebase_empty(rebase)
        self._write(view, headers)
        return self.end_offset

    def _rebase_empty(self, base: int) -> None:
        """This empty log's one segment begins at ``base`` instead, below the start offset, which
        stays (a crash before the batch is written reopens it empty at its start again)."""
        with self._lock:
            self._drop(self._segments)
            self._segments = [Segment.create(self.directory, base, self.config.index_interval_bytes)]
            self._bases = [base]
        self._epochs.truncate_from_end(base)

    def _write(self, view: memoryview, headers: list[tuple[BatchHeader, int]]) -> None:
        """Write checked batches, rolling segments as needed; one os.write per segment touched."""
        i = 0
        with self._lock:
            try:
                while i < len(headers):
                    first = headers[i][0]
                    active = self._maybe_roll(first.size, first.record_count)
                    room = self.config.segment_bytes - active.size
                    j, used = i + 1, first.size
                    while j < len(headers) and used + headers[j][0].size <= room and (
                        headers[j][0].next_offset - active.base_offset <= REL_OFFSET_MAX
                    ):
                        used += headers[j][0].size
                        j += 1
                    for h, _ in headers[i:j]:
                        self._epochs.assign(h.leader_epoch, h.base_offset)  # history first, then data
                    start = headers[i][1]
                    active.append(view[start : start + used], [(h, p - start) for h, p in headers[i:j]])
                    self._size_bytes += used
                    self._unsynced_bytes += used
                    self._written_bytes += used
                    i = j
            except OSError as exc:
                raise StorageError(f"writing to {self.directory}: {exc}") from exc

    def _maybe_roll(self, size: int, record_count: int) -> Segment:
        active = self._segments[-1]
        full = active.size + size > self.config.segment_bytes
        if active.size and (full or active.end_offset + record_count - active.base_offset > REL_OFFSET_MAX):
            active.close_for_appends()
            self._pending.append(active)
            active = Segment.create(self.directory, active.end_offset, self.config.index_interval_bytes)
            self._segments.append(active)
            self._bases.append(active.base_offset)
            self._dir_dirty = True
        return active

    # --- reading -----------------------------------------------------------------

    def _check_range(self, offset: int) -> None:
        if not self._start_offset <= offset <= self.end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is out of range: this log holds offsets"
                f" {self._start_offset} (earliest) to {self.end_offset} (latest, exclusive)",
                earliest=self._start_offset, latest=self.end_offset,
            )

    def _damaged(self, seg: Segment, offset: int, exc: CorruptBatch) -> StorageError:
        return StorageError(
            f"stored data of segment {seg.path.name} is damaged near offset {offset}: {exc.message}",
            offset=offset, segment=seg.base_offset,
        )

    def read(self, offset: int, max_bytes: int, upto: int | None = None) -> bytes:
        """Stored batches from the one holding ``offset``, whole and checked.

        At least one batch when any is below ``upto`` (the high watermark;
        default the log end), else batches up to ``max_bytes`` in total; none
        whose base offset is ``>= upto``. Raises OffsetOutOfRange outside
        [start_offset, end_offset] and StorageError when the batch at
        ``offset`` is damaged on disk (a damaged later batch just ends the read).
        """
        self._check_open()
        self._check_range(offset)
        hw = self.end_offset if upto is None else min(upto, self.end_offset)
        if offset >= hw:
            return b""
        i = bisect.bisect_right(self._bases, offset) - 1
        seg = self._segments[i]
        parts: list[bytes] = []
        budget, pos, first_base = max_bytes, -1, -1
        while True:
            try:
                if pos < 0:  # the segment holding ``offset``: found and read together
                    data, next_offset, at_end = seg.read_at(offset, budget, hw, self._epochs.epoch_at)
                else:
                    data, next_offset, at_end = seg.read(pos, first_base, budget, hw, not parts,
                                                         self._epochs.epoch_at)
            except CorruptBatch as exc:
                raise self._damaged(seg, offset, exc) from None
            if data:
                parts.append(data)
                budget -= len(data)
            i += 1
            if not at_end or next_offset >= hw or budget <= 0 or i == len(self._segments):
                break
            seg, pos, first_base = self._segments[i], 0, next_offset
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def offset_for_timestamp(self, timestamp_ms: int, upto: int | None = None) -> int | None:
        """Earliest offset (below ``upto``, default the log end) whose record timestamp is >= ``timestamp_ms``."""
        self._check_open()
        hw = self.end_offset if upto is None else min(upto, self.end_offset)
        for seg in self._segments:
            if seg.base_offset >= hw:
                break
            if seg.end_offset <= self._start_offset or seg.max_timestamp < timestamp_ms:
                continue
            try:
                found = seg.first_record_at_or_after(timestamp_ms, self._start_offset, hw)
            except CorruptBatch as exc:
                raise self._damaged(seg, seg.base_offset, exc) from None
            if found is not None:
                return found
        return None

    # --- durability ----------------------------------------------------------------

    def sync(self) -> None:
        """fsync what was appended: rolled segments and their indexes, the directory, the active segment.

        Everything appended before the call is durable when it returns. This
        one method may run in another thread while the owner thread goes on
        appending and reading (group commit: the event loop is never blocked
        by a disk flush): it takes a snapshot under a short lock, then fsyncs
        duplicated descriptors, so segments deleted meanwhile are harmless.
        """
        with self._sync_lock:
            with self._lock:
                if self._closed:  # e.g. a sync queued in a thread before the log was abandoned
                    raise StorageError(f"the log in {self.directory} is closed: nothing was synced")
                pending, self._pending = self._pending, []
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                active = self._segments[-1]
                counted = self._unsynced_bytes
                log_fds = [os.dup(active.fd)] + [os.dup(s.fd) for s in pending]
                index_fds = [fd for s in pending for fd in s.dup_index_fds()]
            try:
                for fd in log_fds[1:] + index_fds:
                    os.fsync(fd)
                if dir_dirty:
                    fsync_dir(self.directory)
                os.fdatasync(log_fds[0])  # the active segment's indexes are rebuilt after a crash
                if self._recovery_point != active.base_offset and not self._closed:
                    write_offset(self.directory / RECOVERY_POINT_FILE, active.base_offset)
                    self._recovery_point = active.base_offset
            except OSError as exc:
                with self._lock:
                    self._pending[:0] = [seg for seg in pending if seg in self._segments]
                    self._dir_dirty |= dir_dirty
                raise StorageError(f"fsync in {self.directory}: {exc}") from exc
            finally:
                for fd in log_fds + index_fds:
                    os.close(fd)
            with self._lock:
                self._unsynced_bytes = max(0, self._unsynced_bytes - counted)
                self._last_sync = self._clock.monotonic()
                for seg in pending:
                    if seg in self._segments[:-1]:
                        seg.release_index_fds()

    def writeback_due(self, min_bytes: int) -> bool:
        """Whether ``min_bytes`` or more were appended since writeback last started."""
        return self._written_bytes - self._writeback_from >= min_bytes

    def start_writeback(self) -> bool:
        """Have the kernel start writing the active segment to disk, without waiting (``fsync.start_writeback``).

        Like ``sync`` it may run in another thread beside appends: a duplicated
        descriptor taken under the lock. Rolled segments are left to the next sync.
        """
        with self._lock:
            if self._closed:
                return False
            fd = os.dup(self._segments[-1].fd)
            self._writeback_from = self._written_bytes
        try:
            return start_writeback(fd)
        finally:
            os.close(fd)

    def maybe_sync(self) -> bool:
        """Sync if the fsync policy asks for it now; returns whether it synced.

        ``always``: whenever anything is unsynced. ``interval``: when something
        is unsynced and the interval has passed since the last sync (monotonic
        clock). ``never``: not at all (``sync`` and ``close`` still do).
        """
        self._check_open()
        policy = self.config.fsync
        if policy.mode == "never" or not (self._unsynced_bytes or self._pending):
            return False
        if policy.mode == "interval" and (self._clock.monotonic() - self._last_sync) * 1000 < policy.interval_ms:
            return False
        self.sync()
        return True

    def close(self) -> None:
        """Sync everything and leave the clean-shutdown marker."""
        if self._closed:
            return
        self.sync()
        with self._lock:
            self._segments[-1].sync(indexes=True)
            for seg in self._segments:
                seg.close()
            self._closed = True
        write_atomically(self.directory / CLEAN_SHUTDOWN_FILE, b"")

    def abandon(self) -> None:
        """Drop the file handles without syncing or the marker: what a crash leaves (tests, failed disks)."""
        with self._lock:
            if not self._closed:
                for seg in self._segments:
                    seg.close()
                self._closed = True
