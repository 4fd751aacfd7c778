"""Anti-entropy decisions: checksums of committed offset ranges, and what a comparison means.

Replicas hold the very same bytes for every committed batch (the leader
stamps a batch once; followers store it as it came), so the checksum of the
batches in an offset range is comparable across replicas. The checksum is
taken over the batches' headers only: reading a batch checks its CRC against
its payload (a damaged one makes the range unreadable), and the header holds
that CRC beside the offset and epoch, so two readable copies with the same
headers hold the same bytes, and hashing 54 bytes per batch instead of all of
them makes a round cost about one CRC pass over what it reads.

Committed bytes do not change until the log is cut, so ``Digests`` keeps
where each range's hash stood (a ``blake2b`` state per range end): the next
round reads only the bytes past it, and a range is read in full again only
once its last full read is older than ``reread_s`` (scrubbing: damage on disk
under a remembered digest is found by then). The replica drops its
``Digests`` whenever its log is cut. The leader cuts
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

# 20-byte digests (40 hex characters). A digest of any other length is refused as
# malformed, so a broker never compares unlike checksums and cuts a healthy log.
DIGEST_BYTES = 20
DIGEST_HEX = 2 * DIGEST_BYTES
# Range ends remembered per range base: the leader's own round and each
# follower's request end at slightly different high watermarks.
MARKS_PER_RANGE_MAX = 4


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


def _new_hash() -> Any:
    return hashlib.blake2b(digest_size=DIGEST_BYTES)


class RangeHasher:
    """The checksum of the batches of [base, end), taken one read at a time (``step``),
    from ``base`` or from a remembered (offset, hash state) inside the range."""

    def __init__(self, base: int, end: int, resume: tuple[int, Any] | None = None, verified_s: float = 0.0) -> None:
        self.base, self.end = base, end
        self.offset, self.hash = resume if resume is not None else (base, _new_hash())
        self.verified_s = verified_s  # when the bytes from ``base`` were last all read
        self.result: RangeSum | None = None if self.offset < end else RangeSum(base, end, self.hash.hexdigest())

    def step(self, read: Reader, chunk_bytes: int) -> bool:
        """Read and hash one chunk; True once ``result`` is set."""
        if self.result is not None:
            return True
        try:
            data = read(self.offset, chunk_bytes, self.end)
            last = self.offset
            if data:
                for header, pos in batchfmt.scan(data, verify=False):
                    self.hash.update(data[pos:pos + batchfmt.HEADER_SIZE])
                    last = header.next_offset
        except (StorageError, OffsetOutOfRange):
            last = self.offset
        if last <= self.offset:  # a damaged batch ended the read early, or the range is gone
            self.result = RangeSum(self.base, self.end, None)
        elif last >= self.end:
            self.result = RangeSum(self.base, self.end, self.hash.hexdigest() if last == self.end else None)
        self.offset = last
        return self.result is not None


def range_sum(read: Reader, base: int, end: int, chunk_bytes: int) -> RangeSum:
    """The checksum of the batches of [base, end) as this replica stores them."""
    hasher = RangeHasher(base, end)
    while not hasher.step(read, chunk_bytes):
        pass
    assert hasher.result is not None
    return hasher.result


def range_sums(read: Reader, spans: Sequence[tuple[int, int]], start: int, end: int,
               chunk_bytes: int) -> list[RangeSum]:
    """Checksums of the spans this replica holds whole (within [start, end))."""
    return [range_sum(read, b, e, chunk_bytes) for b, e in spans if start <= b and e <= end]


class Digests:
    """Where the hash of each range stood at the ends already read, for one replica's log."""

    def __init__(self, reread_s: float) -> None:
        self.reread_s = reread_s
        self._marks: dict[int, list[tuple[int, Any, float]]] = {}  # base -> [(end, hash state, verified_s)]
        self.bytes_skipped = 0  # not needed: for tests, and for telling the cache works

    def hasher(self, base: int, end: int, now_s: float) -> RangeHasher:
        """A hasher for [base, end) resuming at the furthest fresh mark not past ``end``."""
        best = None
        for mark in self._marks.get(base, ()):
            if mark[0] <= end and now_s - mark[2] < self.reread_s and (best is None or mark[0] > best[0]):
                best = mark
        if best is None:
            return RangeHasher(base, end, verified_s=now_s)
        self.bytes_skipped += best[0] - base
        return RangeHasher(base, end, (best[0], best[1].copy()), best[2])

    def done(self, hasher: RangeHasher) -> None:
        """Remember a finished, readable range's hash; an unreadable one forgets the range."""
        r = hasher.result
        assert r is not None
        if r.digest is None:
            self._marks.pop(r.base, None)
            return
        marks = [m for m in self._marks.get(r.base, ()) if m[0] != r.end]
        marks.append((r.end, hasher.hash.copy(), hasher.verified_s))
        marks.sort(key=lambda m: m[0])
        self._marks[r.base] = marks[-MARKS_PER_RANGE_MAX:]

    def keep_only(self, bases: set[int]) -> None:
        """Forget ranges that no longer exist (segments removed by retention)."""
        for base in [b for b in self._marks if b not in bases]:
            del self._marks[base]


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
                or not 0 <= x[0] < x[1] or not (x[2] is None or (type(x[2]) is str and len(x[2]) == DIGEST_HEX))):
            raise ValueError("a checksum range must be [base, end, hex digest or null]")
        out.append(RangeSum(x[0], x[1], x[2]))
    return out
