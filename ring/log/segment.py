"""One segment of a partition log: a file of whole record batches and its two indexes.

A segment is named by the base offset of its first batch. Only the last
segment of a log (the active one) is appended to; the others are immutable
until retention deletes them whole. Bytes go in through ``os.write`` on an
``O_APPEND`` descriptor and come out through ``os.pread``, so the reader never
disturbs the writer's position and never copies through a Python buffer.

Reading walks batch *headers* from the nearest offset-index entry (at most
``index_interval_bytes``) and then returns a run of whole batches exactly as
stored, after checking each one's CRC, that base offsets follow one another,
and that each epoch matches the epoch history: a damaged batch is never handed
out. Nothing here decodes records except ``first_record_at_or_after`` (time
lookups need the record timestamps).

``Tracker`` (``walking.py``) decides where index entries go. Live appends and
rebuilds both use it, so an index rebuilt after a crash is the one the
appends would have made.
"""

from __future__ import annotations

import os
from pathlib import Path

from ring.errors import CorruptBatch
from ring.log import batch
from ring.log.batch import HEADER_SIZE, BatchHeader
from ring.log.fsync import write_all
from ring.log.index import REL_OFFSET_MAX, OffsetIndex, TimeIndex
from ring.log.walking import TIMESTAMP_MIN, WALK_CHUNK_BYTES, EpochOf, StepPast, Tracker, Walk, check_identity, walk

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        fd: int,
        size: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        end_offset: int,
        tracker: Tracker,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.fd = fd
        self.size = size
        self.offset_index = offset_index
        self.time_index = time_index
        self.end_offset = end_offset  # next offset after this segment's last batch
        self.tracker = tracker

    # --- naming and opening --------------------------------------------------

    @staticmethod
    def paths(directory: Path, base_offset: int) -> tuple[Path, Path, Path]:
        name = segment_name(base_offset)
        return (
            directory / (name + LOG_SUFFIX),
            directory / (name + INDEX_SUFFIX),
            directory / (name + TIMEINDEX_SUFFIX),
        )

    @property
    def path(self) -> Path:
        return self.paths(self.directory, self.base_offset)[0]

    @classmethod
    def create(cls, directory: Path, base_offset: int, interval: int) -> "Segment":
        log_path, index_path, time_path = cls.paths(directory, base_offset)
        fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        return cls(
            directory, base_offset, fd, 0,
            OffsetIndex.create(index_path, [], []), TimeIndex.create(time_path, [], []),
            base_offset, Tracker(interval),
        )

    @classmethod
    def open_file(cls, directory: Path, base_offset: int) -> tuple[int, int]:
        """(descriptor, size) of an existing segment file."""
        fd = os.open(cls.paths(directory, base_offset)[0], os.O_RDWR | os.O_APPEND)
        return fd, os.fstat(fd).st_size

    @classmethod
    def load(cls, directory: Path, base_offset: int, interval: int, end_offset: int | None) -> "Segment":
        """Open a segment whose bytes are trusted, reusing its indexes when they are sound.

        ``end_offset`` is known for a closed segment (the next one's base);
        for the active one it is found by walking from the last index entry.
        Raises CorruptBatch when the active segment's tail does not parse.
        """
        fd, size = cls.open_file(directory, base_offset)
        seg = None
        try:
            seg = cls._from_index_files(directory, base_offset, fd, size, interval, end_offset)
        except CorruptBatch:
            if end_offset is None:
                os.close(fd)
                raise
        if seg is None:
            seg, bad = cls.rebuild(directory, base_offset, fd, size, interval, False, None, end_offset)
            if bad is not None and end_offset is None:
                seg.close()
                raise CorruptBatch(f"segment {base_offset} does not parse at position {bad}")
        return seg

    @classmethod
    def _from_index_files(
        cls, directory: Path, base: int, fd: int, size: int, interval: int, end_offset: int | None
    ) -> "Segment | None":
        _, index_path, time_path = cls.paths(directory, base)
        offsets = OffsetIndex.read_entries(index_path)
        times = TimeIndex.read_entries(time_path)
        if offsets is None or times is None or not OffsetIndex.valid(*offsets, size):
            return None
        start_rel, start_pos = (offsets[0][-1], offsets[1][-1]) if offsets[0] else (0, 0)
        if start_pos < size:
            first = batch.read_header(os.pread(fd, HEADER_SIZE, start_pos))
            if first.base_offset != base + start_rel:
                return None
        elif size:
            return None
        if end_offset is not None:  # closed: the closing time entry gives the largest timestamp
            if not size or not TimeIndex.valid(*times, end_offset - base, closed=True):
                return None
            tracker = Tracker(interval, size - start_pos, times[0][-1])
        else:  # active: walk the tail past the last index entry
            tracker = Tracker(interval, size - start_pos, TIMESTAMP_MIN)
            end_offset = base + start_rel if size else base
            for h, pos in walk(fd, start_pos, size, verify=False):
                if h.base_offset != end_offset:
                    raise CorruptBatch(f"segment {base}: offset {h.base_offset} where {end_offset} was due")
                end_offset = h.next_offset
                tracker.max_timestamp = max(tracker.max_timestamp, h.max_timestamp)
            if times[0]:
                tracker.max_timestamp = max(tracker.max_timestamp, times[0][-1])
            if not TimeIndex.valid(*times, end_offset - base, closed=False):
                return None
        return cls(
            directory, base, fd, size, OffsetIndex(index_path, *offsets), TimeIndex(time_path, *times),
            end_offset, tracker,
        )

    @classmethod
    def rebuild(
        cls,
        directory: Path,
        base: int,
        fd: int,
        size: int,
        interval: int,
        verify: bool,
        epoch_of: EpochOf | None,
        closed_end: int | None,
        step_past: StepPast | None = None,
    ) -> tuple["Segment", int | None]:
        """Walk the segment and rewrite both indexes; (segment, position of the first bad batch or None).

        With ``verify``, CRCs are checked (recovery); a bad batch ends the walk
        and the caller decides whether to cut, unless ``step_past`` (given its
        position and offset) returns a header to index it by and walk on past
        it. ``closed_end`` (a closed segment's end offset) adds the closing
        time-index entry.
        """
        w = Walk(base, Tracker(interval))
        bad = None
        while bad is None and w.good_pos < size:
            try:
                for h, pos in walk(fd, w.good_pos, size, verify):
                    check_identity(h, w.end, epoch_of)
                    w.index(h, pos)
                break
            except CorruptBatch:
                h = step_past(w.good_pos, w.end) if step_past is not None else None
                if h is None:
                    bad = w.good_pos
                else:  # (its header's max timestamp is taken as it is); reads past it start after it
                    w.index(h, w.good_pos)
                    w.tracker.since_index = w.tracker.interval
        if closed_end is not None:
            w.close(closed_end)
        _, index_path, time_path = cls.paths(directory, base)
        seg = cls(
            directory, base, fd, size,
            OffsetIndex.create(index_path, w.okeys, w.ovals), TimeIndex.create(time_path, w.tkeys, w.tvals),
            w.end, w.tracker,
        )
        return seg, bad

    # --- writing ---------------------------------------------------------------

    @property
    def max_timestamp(self) -> int:
        """Largest record timestamp in the segment (TIMESTAMP_MIN when empty)."""
        return self.tracker.max_timestamp

    def append(self, data: bytes | bytearray | memoryview, headers: list[tuple[BatchHeader, int]]) -> None:
        """Write whole, already checked batches at the end; ``headers`` holds (header, position in data)."""
        assert headers and headers[0][0].base_offset == self.end_offset
        assert headers[-1][0].next_offset - self.base_offset <= REL_OFFSET_MAX
        try:
            write_all(self.fd, data)
        except OSError:
            os.ftruncate(self.fd, self.size)  # leave no partial batch behind
            raise
        observe, last_ts = self.tracker.observe, self.time_index.last_timestamp
        for h, rel_pos in headers:
            add, ts = observe(self.size + rel_pos, h, last_ts)
            if add:
                rel = h.base_offset - self.base_offset
                self.offset_index.append(rel, self.size + rel_pos)
                if ts is not None:
                    self.time_index.append(ts, rel)
                    last_ts = ts
        self.size += len(data)
        self.end_offset = headers[-1][0].next_offset

    def close_for_appends(self) -> None:
        """The log rolled past this segment: add the closing time entry (see index.py)."""
        rel_end = self.end_offset - self.base_offset
        if not self.time_index.values or self.time_index.values[-1] < rel_end:
            self.time_index.append(self.tracker.max_timestamp, rel_end)

    def truncate_at(self, pos: int, offset: int) -> None:
        """Cut the segment at batch boundary ``pos`` (offset ``offset``) and make it appendable."""
        assert 0 <= pos <= self.size and self.base_offset <= offset <= self.end_offset
        os.ftruncate(self.fd, pos)
        rel = offset - self.base_offset
        self.offset_index.truncate_from(rel)
        self.time_index.truncate_from(rel)
        self.size, self.end_offset = pos, offset
        # Everything before the last offset entry is covered by the last time
        # entry (Tracker adds them together); only the rest needs a walk.
        _, start_pos = self.offset_index.lookup(REL_OFFSET_MAX)
        last_ts = self.time_index.last_timestamp
        self.tracker = Tracker(self.tracker.interval, pos - start_pos, TIMESTAMP_MIN if last_ts is None else last_ts)
        for h, _ in walk(self.fd, start_pos, pos, verify=False):
            self.tracker.max_timestamp = max(self.tracker.max_timestamp, h.max_timestamp)

    def mend(self, h: BatchHeader, data: bytes | bytearray | memoryview) -> None:
        """Write ``data``, a whole copy of the stored batch ``h`` describes, over that batch, synced.

        The batches below it lead to its position (a walk of their headers
        from the index entry below); the stored batch must take exactly
        ``h.size`` bytes (the next batch, or the segment's end, begins there),
        else CorruptBatch and nothing is written. The descriptor appends only,
        so the write goes through one of its own.
        """
        assert self.base_offset <= h.base_offset < h.next_offset <= self.end_offset
        rel, pos = self.offset_index.lookup(h.base_offset - self.base_offset)
        at = self.base_offset + rel
        while at < h.base_offset:
            below = batch.read_header(os.pread(self.fd, HEADER_SIZE, pos))
            check_identity(below, at, None)
            pos, at = pos + below.size, below.next_offset
        end = pos + h.size
        if at != h.base_offset or end > self.size:
            raise CorruptBatch(f"no stored batch at offset {h.base_offset} takes {h.size} bytes")
        if end < self.size:
            check_identity(batch.read_header(os.pread(self.fd, HEADER_SIZE, end)), h.next_offset, None)
        elif h.next_offset != self.end_offset:
            raise CorruptBatch(f"the stored batch at offset {h.base_offset} is not {h.size} bytes long")
        fd = os.open(self.path, os.O_WRONLY)
        try:
            if os.pwrite(fd, data, pos) != h.size:
                raise OSError(f"short write over the batch at offset {h.base_offset}")
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self.tracker.max_timestamp = max(self.tracker.max_timestamp, h.max_timestamp)

    def sync(self, indexes: bool) -> None:
        os.fdatasync(self.fd)
        if indexes:
            self.offset_index.sync()
            self.time_index.sync()

    def release_index_fds(self) -> None:
        """A synced closed segment's indexes are only read: free their descriptors."""
        self.offset_index.close()
        self.time_index.close()

    def dup_index_fds(self) -> list[int]:
        """Duplicates of the index descriptors, for an fsync that must outlive a concurrent close."""
        return [self.offset_index.dup_fd(), self.time_index.dup_fd()]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.offset_index.close()
        self.time_index.close()

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.offset_index.delete()
        self.time_index.delete()

    # --- reading ---------------------------------------------------------------

    def _lookup_chunk(self) -> int:
        return min(WALK_CHUNK_BYTES, max(4096, 2 * self.tracker.interval + HEADER_SIZE))

    def find_position(self, offset: int) -> tuple[int, BatchHeader]:
        """(position, header) of the batch holding ``offset``; CorruptBatch if the walk breaks."""
        assert self.base_offset <= offset < self.end_offset
        rel, pos = self.offset_index.lookup(offset - self.base_offset)
        expected = self.base_offset + rel
        for h, p in walk(self.fd, pos, self.size, verify=False, chunk=self._lookup_chunk()):
            check_identity(h, expected, None)
            if h.next_offset > offset:
                return p, h
            expected = h.next_offset
        raise CorruptBatch(f"segment {self.base_offset} ends before offset {offset}")

    def read(
        self, pos: int, first_base: int, max_bytes: int, upto: int, must_take_one: bool, epoch_of: EpochOf
    ) -> tuple[bytes, int, bool]:
        """Whole checked batches from ``pos`` (whose base offset is ``first_base``).

        Stops before a batch at or past ``upto``, before ``max_bytes`` would be
        exceeded (unless ``must_take_one`` and nothing is taken yet), and before
        a damaged batch; a damaged first batch raises CorruptBatch when
        ``must_take_one``. Returns (bytes, next offset, reached the segment end).
        """
        avail = self.size - pos
        if avail <= 0:
            return b"", first_base, True
        buf = os.pread(self.fd, min(avail, max(max_bytes, HEADER_SIZE)), pos)
        return self._take(buf, 0, len(buf), pos, first_base, upto, must_take_one, epoch_of)

    def read_at(self, offset: int, max_bytes: int, upto: int, epoch_of: EpochOf) -> tuple[bytes, int, bool]:
        """``read`` from the batch holding ``offset`` (found as ``find_position`` finds it), taking at
        least that batch: one pread from the index entry below it when the walk to it and the answer
        fit in one (a tail read, a replication frame), two otherwise."""
        assert self.base_offset <= offset < self.end_offset
        rel, at = self.offset_index.lookup(offset - self.base_offset)
        want = max(max_bytes, HEADER_SIZE)
        chunk = self._lookup_chunk()
        buf = os.pread(self.fd, min(self.size - at, chunk + want), at)
        off, expected = 0, self.base_offset + rel
        while len(buf) - off >= HEADER_SIZE and off <= chunk:
            h = batch.read_header(buf, off)  # CorruptBatch: the walk breaks, as in find_position
            check_identity(h, expected, None)
            if h.next_offset > offset:
                end = off + min(self.size - at - off, want)
                if end > len(buf):
                    break  # the answer goes past what was read: read it on its own
                return self._take(buf, off, end, at + off, h.base_offset, upto, True, epoch_of)
            if at + off + h.size > self.size:
                raise CorruptBatch(f"truncated batch at position {at + off}")
            off, expected = off + h.size, h.next_offset
        pos, h = self.find_position(offset)
        return self.read(pos, h.base_offset, max_bytes, upto, True, epoch_of)

    def _take(self, buf: bytes, start: int, stop: int, pos: int, first_base: int, upto: int, must_take_one: bool,
              epoch_of: EpochOf) -> tuple[bytes, int, bool]:
        """The checked batches of ``buf[start:stop]``, which holds the segment's bytes from ``pos``."""
        view = memoryview(buf)
        off, expected = start, first_base
        while stop - off >= HEADER_SIZE:
            try:
                h = batch.read_header(buf, off)
                check_identity(h, expected, epoch_of)
                if h.base_offset >= upto:
                    break
                if off + h.size > stop:
                    if off > start or not must_take_one:
                        break
                    if pos + h.size > self.size:
                        raise CorruptBatch(f"truncated batch at position {pos}")
                    whole = os.pread(self.fd, h.size, pos)
                    batch.check(whole)
                    return whole, h.next_offset, pos + h.size == self.size
                batch.check_crc(view, off, h)
            except CorruptBatch:
                if off > start or not must_take_one:
                    break
                raise
            off += h.size
            expected = h.next_offset
        taken = buf if (start, off) == (0, len(buf)) else buf[start:off]
        return taken, expected, pos + off - start == self.size

    def first_record_at_or_after(self, timestamp: int, min_offset: int, upto: int) -> int | None:
        """Offset of the first record in [min_offset, upto) with a timestamp >= ``timestamp``."""
        rel = self.time_index.rel_before(timestamp)
        rel, pos = self.offset_index.lookup(rel)
        expected = self.base_offset + rel
        for h, p in walk(self.fd, pos, self.size, verify=False):
            check_identity(h, expected, None)
            expected = h.next_offset
            if h.base_offset >= upto:
                return None
            if h.max_timestamp < timestamp or h.next_offset <= min_offset:
                continue
            _, records = batch.decode(os.pread(self.fd, h.size, p))
            for r in records:
                if min_offset <= r.offset < upto and r.timestamp >= timestamp:
                    return r.offset
        return None
