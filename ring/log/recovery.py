"""Opening a partition directory after a clean stop or a crash.

What is trusted and what is checked:

* Segments wholly before the *recovery point* (the base offset of the oldest
  segment not yet known to be on disk, a checkpoint written by ``sync``) are
  trusted: they were fsynced, and only their indexes are sanity-checked
  (rebuilt when missing or unsound).
* After an unclean stop every segment from the recovery point on, and always
  the last one, is walked with CRC, base-offset and epoch checks, and the
  indexes of the walked segments are rebuilt.
* A bad batch whose frame still holds is *damage inside the log*: its length
  leads to a whole, CRC-valid batch with the offset and epoch due after its
  record count (or, closing a segment, to the next segment's base offset), so
  only its payload, CRC, stamped offset or epoch can be wrong; or its length
  is one flipped bit away from one that makes its bytes pass the CRC and
  leads on so. It is kept, the walk goes on past it, and its offset is
  reported (``Recovered.damaged``): the replica is marked damaged there and
  a repair mends it in place from another replica's whole copy
  (``ring.repair.mend``). Its header's max timestamp goes into the time
  index as it reads: a flip in that very field can mislead time lookups in
  that segment until its indexes are built again (a crash, or a lost index). Cutting there would drop the whole batches above
  it, which can be the only whole copies of a batch another replica holds
  damaged.
* A bad batch the walk cannot step past (its header does not parse, its bytes
  run past the end, or its length or record count leads nowhere whole) is
  cut with everything after it (the file is truncated there and later
  segments are deleted): nothing tells where the log would go on. That is a
  torn tail, written when the broker stopped and never durable, unless the
  batch is whole with a failing CRC below a newer epoch the leader-epoch
  history begins at its end (an epoch is begun with no batch only over a
  synced log): then it is damage all the same, and the key ``(that epoch,
  its end)`` is saved (``DAMAGED_KEY_FILE``): a replica's votes go on
  counting that batch until its log holds it again, as after a repair's cut.
* After a clean stop (``close`` left a marker) even the last segment is
  trusted; it is still walked from its last index entry to find the log end,
  and a tail that does not parse falls back to the full check.

Stray files are removed first: temporary files of interrupted atomic writes,
index files without their segment, and empty segment files that are not the
last. A crash can only leave a torn or corrupt suffix of what was not yet
synced, so cutting a torn tail never loses synced data; a cut for damage may
have, and says so.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ring import limits
from ring.errors import CorruptBatch
from ring.log import batch
from ring.log.checkpoint import LeaderEpochCache, read_key, write_key
from ring.log.fsync import TMP_SUFFIX, fsync_dir
from ring.log.segment import LOG_SUFFIX, Segment
from ring.log.walking import EpochOf, StepPast, check_identity, walk

log = logging.getLogger("ring.log")

DAMAGED_KEY_FILE = "damaged-log-key"  # (epoch, end) a cut for damage took away, until the owner takes it
_SEGMENT_FILE = re.compile(r"(\d{20})(\.log|\.index|\.timeindex)")


@dataclass
class Recovered:
    segments: list[Segment]
    bytes_cut: int = 0
    walked: list[Segment] = field(default_factory=list)  # checked from disk: sync them
    files_removed: bool = False
    damaged: list[tuple[int, int]] = field(default_factory=list)  # [offset, next) of damaged batches kept


def remove_strays(directory: Path) -> tuple[list[int], bool]:
    """Delete leftovers; returns (sorted base offsets of segments to open, whether anything was removed)."""
    logs: dict[int, int] = {}
    others: list[tuple[int, Path]] = []
    removed = False
    for entry in os.scandir(directory):
        if entry.name.endswith(TMP_SUFFIX):
            os.unlink(entry.path)
            removed = True
            continue
        m = _SEGMENT_FILE.fullmatch(entry.name)
        if not m:
            continue
        if m.group(2) == LOG_SUFFIX:
            logs[int(m.group(1))] = entry.stat().st_size
        else:
            others.append((int(m.group(1)), Path(entry.path)))
    bases = sorted(logs)
    for base in bases[:-1]:
        if logs[base] == 0:  # a segment is only created to receive a batch at once
            for path in Segment.paths(directory, base):
                path.unlink(missing_ok=True)
            bases.remove(base)
            removed = True
    for base, path in others:
        if base not in bases:
            path.unlink(missing_ok=True)  # an empty segment's went with it above
            removed = True
    return bases, removed


def open_segments(
    directory: Path,
    bases: list[int],
    interval: int,
    clean: bool,
    recovery_point: int,
    epoch_of: EpochOf | None,
) -> Recovered:
    """Open the segments named by ``bases`` (sorted), checking and cutting as the module says."""
    out = Recovered([])
    if not bases:
        return out
    check_from = bases[-1] + 1 if clean else min(recovery_point, bases[-1])
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        next_base = None if last else bases[i + 1]
        if base < check_from:
            if not last:
                out.segments.append(Segment.load(directory, base, interval, next_base))
                continue
            try:
                out.segments.append(Segment.load(directory, base, interval, None))
                continue
            except CorruptBatch:
                pass  # a tail that does not parse despite the marker: check it fully
        fd, size = Segment.open_file(directory, base)
        seg, bad = Segment.rebuild(directory, base, fd, size, interval, True, epoch_of, None,
                                   _stepper(directory, fd, size, next_base, epoch_of, out.damaged))
        out.segments.append(seg)
        out.walked.append(seg)
        if bad is None and next_base is not None and seg.end_offset != next_base:
            bad = size  # the next segment does not continue this one: drop what follows
        if bad is None:
            if not last:
                seg.close_for_appends()
            continue
        lost = _lost_to_cut(fd, size, bad, seg.end_offset, epoch_of)
        if lost is not None:
            _save_damaged_key(directory, lost, seg.end_offset)
        out.bytes_cut += size - bad
        seg.truncate_at(bad, seg.end_offset)
        for later in reversed(bases[i + 1 :]):
            for path in Segment.paths(directory, later):
                if path.suffix == LOG_SUFFIX and path.exists():
                    out.bytes_cut += path.stat().st_size
                path.unlink(missing_ok=True)
        out.files_removed = True
        break
    return out


def _stepper(directory: Path, fd: int, size: int, next_base: int | None, epoch_of: EpochOf | None,
             damaged: list[tuple[int, int]]) -> StepPast:
    """``Segment.rebuild``'s ``step_past`` for this segment: a bad batch whose frame holds is kept (its
    offset noted in ``damaged``) for a repair to mend in place."""

    def step_past(pos: int, offset: int) -> batch.BatchHeader | None:
        h = _frame_holds(fd, size, pos, offset, next_base, epoch_of)
        if h is not None:
            damaged.append((offset, offset + h.record_count))
            log.error("%s: a damaged batch at offset %d inside the log, whole batches after it: kept, "
                      "to be mended from another replica", directory, offset)
        return h

    return step_past


def _frame_holds(fd: int, size: int, pos: int, offset: int, next_base: int | None,
                 epoch_of: EpochOf | None) -> batch.BatchHeader | None:
    """The header of the bad batch at file position ``pos`` (offset ``offset``) when the log's frame runs on
    past it (``_leads_on``); its bad bytes may lie anywhere else (payload, CRC, the stamped offset or
    epoch). A length with one bit flipped is put right when the one length a bit away from it makes the
    batch's bytes pass their CRC and the frame hold: the header returned has it. Any other bad length, or a
    flipped record count, leads nowhere whole, and then None: the walk cannot tell where the log goes on,
    nor a torn tail from damage."""
    raw = os.pread(fd, batch.HEADER_SIZE, pos)
    if len(raw) < batch.HEADER_SIZE:
        return None
    h = batch.BatchHeader._make(batch.HEADER.unpack(raw))
    if h.magic != batch.MAGIC or h.record_count < 1:
        return None
    if _leads_on(fd, size, pos, h, offset, next_base, epoch_of):
        return h
    for bit in range(32):
        fixed = h._replace(length=h.length ^ (1 << bit))
        if not batch.HEADER_SIZE <= fixed.size <= min(size - pos, limits.BATCH_BYTES_MAX):
            continue  # (no stored batch is longer: the reads to try stay bounded)
        try:
            batch.check_crc(memoryview(os.pread(fd, fixed.size, pos)), 0, fixed)
        except CorruptBatch:
            continue
        return fixed if _leads_on(fd, size, pos, fixed, offset, next_base, epoch_of) else None
    return None


def _leads_on(fd: int, size: int, pos: int, h: batch.BatchHeader, offset: int, next_base: int | None,
              epoch_of: EpochOf | None) -> bool:
    """Whether the length of the batch ``h`` at ``pos`` (offset ``offset``) lands on a whole, CRC-valid batch
    with the offset and epoch due after its record count (or, at the end of a closed segment, on the next
    segment's base offset)."""
    end, after = pos + h.size, offset + h.record_count
    if h.size < batch.HEADER_SIZE or end > size:
        return False
    if end == size:
        return after == next_base
    try:
        nh = batch.read_header(os.pread(fd, batch.HEADER_SIZE, end))
        if end + nh.size > size:
            return False
        batch.check(os.pread(fd, nh.size, end))
        check_identity(nh, after, epoch_of)
    except CorruptBatch:
        return False
    return True


def _lost_to_cut(fd: int, size: int, bad: int, offset: int, epoch_of: EpochOf | None) -> tuple[int, int] | None:
    """The key (last epoch, end) the cut at the bad batch at file position ``bad`` (offset ``offset``) takes
    away when that is damage, not a torn tail. The walk could not step past it (``_frame_holds``): nothing
    whole follows it where its length leads. It is damage only when it is whole (its extent inside the
    file), its stamp holds and its CRC fails, below a newer epoch the history begins at its end: an epoch is
    begun with no batch only once the log below it is synced (steps.win, steps._progress). None otherwise."""
    try:
        h = batch.read_header(os.pread(fd, batch.HEADER_SIZE, bad))
    except CorruptBatch:
        return None
    if bad + h.size > size or h.base_offset != offset or epoch_of is None:
        return None
    try:
        batch.check_crc(memoryview(os.pread(fd, h.size, bad)), 0, h)
        return None  # the bytes the CRC covers are whole: its epoch was refused, and nothing follows it
    except CorruptBatch:
        pass
    begun = epoch_of(h.next_offset) or 0
    return (begun, h.next_offset) if begun > h.leader_epoch else None


def _save_damaged_key(directory: Path, key: tuple[int, int], offset: int) -> None:
    """Keep what a cut for damage takes away (the largest such key, should it happen again first)."""
    had = read_key(directory / DAMAGED_KEY_FILE)
    log.error("%s: a damaged batch at offset %d ends the log (an epoch %d begins at %d after it); "
              "cutting there to fetch it from a peer", directory, offset, key[0], key[1])
    if had is None or had < key:
        write_key(directory / DAMAGED_KEY_FILE, key)


def damaged_key(directory: Path) -> tuple[int, int] | None:
    """The key a cut for damage took away from the log in ``directory`` (None: none, or taken)."""
    return read_key(directory / DAMAGED_KEY_FILE)


def forget_damaged_key(directory: Path) -> None:
    """The log's owner keeps the damaged key with its own state from here on."""
    path = directory / DAMAGED_KEY_FILE
    if path.exists():
        path.unlink()
        fsync_dir(directory)


def rebuild_epochs(path: Path, segments: list[Segment]) -> LeaderEpochCache:
    """The epoch history as the batch headers tell it (when its checkpoint is lost)."""
    entries: list[tuple[int, int]] = []
    for seg in segments:
        try:
            for h, _ in walk(seg.fd, 0, seg.size, verify=False):
                if not entries or h.leader_epoch > entries[-1][0]:
                    entries.append((h.leader_epoch, h.base_offset))
        except CorruptBatch:
            break  # reads will report the damage; the history covers what parses
    cache = LeaderEpochCache(path, entries)
    cache.persist()
    return cache

