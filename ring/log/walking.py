"""Walking a segment file's batches from a position, and the index entries a walk makes.

``walk`` yields each batch's header and position, checking CRCs when asked
(recovery) and raising ``CorruptBatch`` at the first bad one;
``check_identity`` checks the two header fields outside the CRC (the base
offset the log expects, the epoch its history names). ``Tracker`` decides
where index entries go (every ``index_interval_bytes``), for live appends
and rebuilds alike, and ``Walk`` collects the entries of a rebuild.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator

from ring.errors import CorruptBatch
from ring.log import batch
from ring.log.batch import HEADER_SIZE, BatchHeader

# Bytes read at once when walking a segment (recovery, index rebuilds).
WALK_CHUNK_BYTES = 256 * 1024
TIMESTAMP_MIN = -(2**63)

# Epoch a batch at a given offset must carry; None when unknown (no check).
EpochOf = Callable[[int], "int | None"]
# (position, offset) of a bad batch -> its header when the walk may go on past it (recovery keeps it).
StepPast = Callable[[int, int], "BatchHeader | None"]


class Tracker:
    """Running state of a segment's tail that decides when to add index entries."""

    __slots__ = ("interval", "since_index", "max_timestamp")

    def __init__(self, interval: int, since_index: int = 0, max_timestamp: int = TIMESTAMP_MIN) -> None:
        self.interval = interval
        self.since_index = since_index
        self.max_timestamp = max_timestamp

    def observe(self, pos: int, h: BatchHeader, last_time_ts: int | None) -> tuple[bool, int | None]:
        """Batch ``h`` goes at ``pos``: (add an offset entry for it?, timestamp of a time entry or None)."""
        add, ts = False, None
        if pos > 0 and self.since_index >= self.interval:
            add, self.since_index = True, 0
            if last_time_ts is None or self.max_timestamp > last_time_ts:
                ts = self.max_timestamp
        self.since_index += h.size
        self.max_timestamp = max(self.max_timestamp, h.max_timestamp)
        return add, ts


class Walk:
    """The index entries of a segment being walked from its start (``Segment.rebuild``): offset
    entries (``okeys`` relative offset -> ``ovals`` position), time entries (``tkeys`` timestamp ->
    ``tvals`` relative offset), the offset after the last batch indexed and the position after it."""

    __slots__ = ("base", "tracker", "okeys", "ovals", "tkeys", "tvals", "end", "good_pos")

    def __init__(self, base: int, tracker: Tracker) -> None:
        self.base, self.tracker = base, tracker
        self.okeys: list[int] = []
        self.ovals: list[int] = []
        self.tkeys: list[int] = []
        self.tvals: list[int] = []
        self.end, self.good_pos = base, 0

    def index(self, h: BatchHeader, pos: int) -> None:
        """Batch ``h`` is at ``pos``, after the ones indexed."""
        add, ts = self.tracker.observe(pos, h, self.tkeys[-1] if self.tkeys else None)
        if add:
            self.okeys.append(self.end - self.base)
            self.ovals.append(pos)
            if ts is not None:
                self.tkeys.append(ts)
                self.tvals.append(self.end - self.base)
        self.end, self.good_pos = self.end + h.record_count, pos + h.size

    def close(self, end: int) -> None:
        """A closed segment ends at offset ``end``: the closing time-index entry."""
        self.end = end
        if not self.tvals or self.tvals[-1] < end - self.base:
            self.tkeys.append(self.tracker.max_timestamp)
            self.tvals.append(end - self.base)


def walk(fd: int, pos: int, end: int, verify: bool, chunk: int = WALK_CHUNK_BYTES) -> Iterator[tuple[BatchHeader, int]]:
    """(header, position) of each batch in file bytes [pos, end); CorruptBatch at the first bad one.

    With ``verify`` every batch's CRC is checked (the whole batch is read);
    without, only the headers are parsed.
    """
    buf, buf_pos = b"", pos
    while pos < end:
        off = pos - buf_pos
        if len(buf) - off < HEADER_SIZE:
            buf, buf_pos, off = os.pread(fd, min(chunk, end - pos), pos), pos, 0
        h = batch.read_header(buf, off)
        if pos + h.size > end:
            raise CorruptBatch(f"truncated batch at position {pos}")
        if verify:
            if len(buf) - off < h.size:
                buf, buf_pos, off = os.pread(fd, max(chunk, h.size), pos), pos, 0
            batch.check(buf, off)
        yield h, pos
        pos += h.size


def check_identity(h: BatchHeader, expected_base: int, epoch_of: EpochOf | None) -> None:
    """The two header fields outside the CRC must be what the log says they are."""
    if h.base_offset != expected_base:
        raise CorruptBatch(f"batch has base offset {h.base_offset} where {expected_base} was due")
    if epoch_of is not None:
        # By its last offset: the history's first entry may begin inside the
        # batch that holds the log start offset.
        epoch = epoch_of(h.last_offset)
        if epoch is not None and epoch != h.leader_epoch:
            raise CorruptBatch(
                f"batch at offset {h.base_offset} has leader epoch {h.leader_epoch}, the history says {epoch}"
            )
