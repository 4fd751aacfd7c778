"""Anti-entropy decisions: checksums of committed offset ranges, and what a comparison means.

Replicas hold the very same bytes for every committed batch (the leader
stamps a batch once; followers store it as it came), so the checksum of the
batches in an offset range is comparable across replicas. The leader cuts
its committed range (below its high watermark) at its segment boundaries
(``leader_ranges``); a follower checksums the same ranges of its own log
(``range_sums``), and ``plan`` says what to do with the two lists: the first
range where the follower's copy is unreadable or differs from the leader's
readable one is where the follower cuts its log and refetches from
(replication refills it), and a range the leader cannot read while the
follower can means the leader's copy is the damaged one (the leader hands
its partition over and repairs as a follower). Reading goes through a
callable with the log's ``read`` contract (whole, CRC-checked batches;
StorageError on a damaged one), so this module does no I/O of its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ring.errors import OffsetOutOfRange, StorageError
from ring.log import batch as batchfmt

Reader = Callable[[int, int, int], bytes]  # (offset, max_bytes, upto) -> stored batches


@dataclass(frozen=True)
class RangeSum:
    base: int
    end: int
    digest: str | None  # hex; None: this replica could not read the range whole

    def to_wire(self) -> list[Any]:
        return [self.base, self.end, self.digest]


@dataclass(frozen=True)
class Plan:
    truncate_at: int | None = None  # the follower cuts its log here and refetches
    leader_damaged_at: int | None = None  # the leader's copy of this range is unreadable
    checked: int = 0  # ranges compared


def leader_ranges(segment_bases: Sequence[int], start: int, hw: int, ranges_max: int) -> list[tuple[int, int]]:
    """[base, end) ranges covering [start, hw), cut at segment boundaries, the newest ``ranges_max``."""
    if hw <= start:
        return []
    cuts = sorted({b for b in segment_bases if start < b < hw} | {start, hw})
    spans = list(zip(cuts, cuts[1:]))
    return spans[-ranges_max:]


def range_sum(read: Reader, base: int, end: int, chunk_bytes: int) -> RangeSum:
    """The checksum of the batches of [base, end) as this replica stores them."""
    h = hashlib.blake2b(digest_size=16)
    offset = base
    try:
        while offset < end:
            data = read(offset, chunk_bytes, end)
            if not data:
                return RangeSum(base, end, None)  # a damaged batch ended the read early
            last = offset
            for header, _ in batchfmt.scan(data, verify=False):
                last = header.next_offset
            if last <= offset:
                return RangeSum(base, end, None)
            h.update(data)
            offset = last
    except (StorageError, OffsetOutOfRange):
        return RangeSum(base, end, None)
    return RangeSum(base, end, h.hexdigest() if offset == end else None)


def range_sums(read: Reader, spans: Sequence[tuple[int, int]], start: int, end: int,
               chunk_bytes: int) -> list[RangeSum]:
    """Checksums of the spans this replica holds whole (within [start, end))."""
    return [range_sum(read, b, e, chunk_bytes) for b, e in spans if start <= b and e <= end]


def plan(leader: Sequence[RangeSum], mine: Sequence[RangeSum]) -> Plan:
    """Compare range by range (same bounds only), oldest first; the first disagreement decides."""
    theirs = {(r.base, r.end): r.digest for r in leader}
    checked = 0
    for r in sorted(mine, key=lambda r: r.base):
        if (r.base, r.end) not in theirs:
            continue
        checked += 1
        d = theirs[(r.base, r.end)]
        if d is None and r.digest is not None:
            return Plan(leader_damaged_at=r.base, checked=checked)
        if d is not None and r.digest != d:
            return Plan(truncate_at=r.base, checked=checked)
    return Plan(checked=checked)


def sums_from_wire(w: Any, ranges_max: int) -> list[RangeSum]:
    """Parse a peer's list; anything malformed raises ValueError."""
    if type(w) is not list or len(w) > ranges_max:
        raise ValueError("checksums must be a list of at most ranges_max ranges")
    out = []
    for x in w:
        if (type(x) is not list or len(x) != 3 or type(x[0]) is not int or type(x[1]) is not int
                or not 0 <= x[0] < x[1] or not (x[2] is None or (type(x[2]) is str and len(x[2]) == 32))):
            raise ValueError("a checksum range must be [base, end, hex digest or null]")
        out.append(RangeSum(x[0], x[1], x[2]))
    return out
