"""Opening a partition directory after a clean stop or a crash.

What is trusted and what is checked:

* Segments wholly before the *recovery point* (the base offset of the oldest
  segment not yet known to be on disk, a checkpoint written by ``sync``) are
  trusted: they were fsynced, and only their indexes are sanity-checked
  (rebuilt when missing or unsound).
* After an unclean stop every segment from the recovery point on, and always
  the last one, is walked with CRC, base-offset and epoch checks. The first bad
  batch and everything after it is cut (the file is truncated there and later
  segments are deleted), and the indexes of the walked segments are rebuilt.
* After a clean stop (``close`` left a marker) even the last segment is
  trusted; it is still walked from its last index entry to find the log end,
  and a tail that does not parse falls back to the full check.

Stray files are removed first: temporary files of interrupted atomic writes,
index files without their segment, and empty segment files that are not the
last. A crash can only leave a torn or corrupt suffix of what was not yet
synced, so cutting at the first bad batch never loses synced data.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ring.errors import CorruptBatch
from ring.log.checkpoint import LeaderEpochCache
from ring.log.fsync import TMP_SUFFIX
from ring.log.segment import LOG_SUFFIX, EpochOf, Segment, walk

_SEGMENT_FILE = re.compile(r"(\d{20})(\.log|\.index|\.timeindex)")


@dataclass
class Recovered:
    segments: list[Segment]
    bytes_cut: int = 0
    walked: list[Segment] = field(default_factory=list)  # checked from disk: sync them
    files_removed: bool = False


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
        seg, bad = Segment.rebuild(directory, base, fd, size, interval, True, epoch_of, None)
        out.segments.append(seg)
        out.walked.append(seg)
        if bad is None and next_base is not None and seg.end_offset != next_base:
            bad = size  # the next segment does not continue this one: drop what follows
        if bad is None:
            if not last:
                seg.close_for_appends()
            continue
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

