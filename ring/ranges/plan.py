"""What a partition's leader does with its ranges, as pure functions of its log and catalogue.

* ``next_ranges``: the offsets of new ranges. A range is cut from committed
  closed segments (below the high watermark), starting where the catalogue's
  last range ends, and ends where a local segment ends, so ranges follow one
  another with no gap and no overlap.
* ``holder_changes``: for one range, the brokers to copy it to (placed there
  and not holding it) and the holders to let go: at once when they left the
  ring, otherwise only once every placed broker holds a verified copy, so a
  range never has fewer copies than before while it moves.
* ``held_changes``: what a leader's audit does with what one broker says it
  holds: holders that lost or spoiled a copy leave the range's holders, a
  sound copy of a range short of holders becomes a holder, and a copy is let
  go only once every offset in it is in safe ranges held by others (or below
  the partition's start), so an audit never drops a copy the leader's
  catalogue has not caught up with, nor the last one of its offsets.
* ``trim_point``: how far the replicas' local logs may start, given how far
  the ranges are safe in the catalogue of every voter: the oldest closed
  segments wholly below that go, as long as ``local_retention_bytes`` stay.
* ``retention_start``: the partition's start offset by retention over the
  whole partition (the ranges below the local log, then the local closed
  segments), by age against ``now_ms`` and by size, as ``PartitionLog``
  applies it to a log that is all local.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, NamedTuple, Sequence

from ring.ranges.catalogue import Catalogue, Range


class SegmentInfo(NamedTuple):
    """A closed segment of the local log."""

    base: int
    end: int
    size: int
    max_timestamp: int


def next_ranges(cat: Catalogue, closed: Sequence[SegmentInfo], local_start: int, hw: int,
                count_max: int) -> list[tuple[int, int, int]]:
    """(base, end, newest timestamp) of up to ``count_max`` new ranges, oldest first."""
    begin = max(cat.covered_end, local_start)
    out = []
    for s in closed:
        if s.end > hw or len(out) >= count_max:
            break
        if s.end <= begin:
            continue
        out.append((max(s.base, begin), s.end, s.max_timestamp))
        begin = s.end
    return out


def holder_changes(r: Range, placed: Sequence[str], on_ring: Collection[str]) -> tuple[list[str], list[str]]:
    """(brokers to copy ``r`` to, holders to let go)."""
    copy_to = [b for b in placed if b not in r.holders]
    off_ring = [h for h in r.holders if h not in on_ring]
    extra = [h for h in r.holders if h in on_ring and h not in placed]
    return copy_to, off_ring + (extra if not copy_to else [])


class HeldChanges(NamedTuple):
    """What an audit changes for one broker (``held_changes``), as range bases."""

    spoiled: list[int]  # the broker holds no sound copy any more: it leaves the holders
    adopted: list[int]  # a sound copy of a range short of holders: the broker becomes one
    let_go: list[int]  # copies the broker drops


def held_changes(cat: Catalogue, name: str, held: Mapping[int, tuple[int, str]],
                 in_flight: Callable[[int], bool]) -> HeldChanges:
    """``held``: base -> (end, checksum) of the copies ``name`` holds; ``in_flight(base)``: a copy of
    that range to ``name`` is under way."""
    out = HeldChanges([], [], [])
    for r in cat.ranges:
        if name in r.holders and held.get(r.base) != (r.end, r.checksum):
            out.spoiled.append(r.base)
    for base, (end, checksum) in held.items():
        r = cat.get(base)
        if r is not None and name in r.holders or in_flight(base):
            continue
        if r is not None and (r.end, r.checksum) == (end, checksum) and not r.safe:
            out.adopted.append(base)
        elif _safe_elsewhere(cat, name, base, end):
            out.let_go.append(base)
    return out


def _safe_elsewhere(cat: Catalogue, name: str, base: int, end: int) -> bool:
    """Whether every offset of ``[base, end)`` at or past the start is in a safe range that other
    brokers than ``name`` hold."""
    at = max(base, cat.start)
    while at < end:
        r = cat.find(at)
        if r is None or not r.safe or len([h for h in r.holders if h != name]) < r.copies:
            return False
        at = r.end
    return True


def trim_point(closed: Sequence[SegmentInfo], log_size: int, local_retention_bytes: int,
               safe_end: int) -> int | None:
    """The new local log start (a closed segment's end), or None to keep the log as it is.

    ``safe_end``: offsets below it are in safe ranges in every voter's catalogue.
    """
    if local_retention_bytes < 0:
        return None
    keep, new = log_size, None
    for s in closed:
        if s.end > safe_end or keep - s.size < local_retention_bytes:
            break
        keep -= s.size
        new = s.end
    return new


def retention_start(cat: Catalogue, closed: Sequence[SegmentInfo], local_start: int, log_size: int, hw: int,
                    retention_ms: int, retention_bytes: int, now_ms: int | None) -> int | None:
    """The partition's new start offset, or None when retention moves nothing.

    ``now_ms`` None: no retention by age (the clock may not be used).
    """
    remote = [(r.size, r.max_timestamp, r.end) for r in cat.ranges if cat.start < r.end <= local_start]
    pieces = remote + [(s.size, s.max_timestamp, s.end) for s in closed if local_start < s.end <= hw]
    total = sum(p[0] for p in remote) + log_size
    n = 0
    if retention_ms >= 0 and now_ms is not None:
        while n < len(pieces) and now_ms - pieces[n][1] > retention_ms:
            total -= pieces[n][0]
            n += 1
    if retention_bytes >= 0:
        while n < len(pieces) and total - pieces[n][0] >= retention_bytes:
            total -= pieces[n][0]
            n += 1
    if not n:
        return None
    return pieces[n - 1][2]
