"""A partition's catalogue of ranges: a plain value with a merge rule (no I/O).

Each ``Range`` is the offsets ``[base, end)`` of one partition as stored
batches (``size`` bytes, the ``checksum`` of those bytes, the newest record
timestamp in them), the number of holders it should have (``copies``) and
the brokers holding a verified copy (``holders``). Only a partition's leader
changes a range; every change carries the leader's epoch and the next number
of the catalogue's change counter (``version``), so two catalogues of the
same partition merge without asking which is newer:

* ``start`` is the larger of the two (the partition's start offset as the
  leader moved it by retention or truncation: offsets below are gone);
* of ranges that overlap (the same range before and after a change, or
  two leaders' cuts of the same offsets), the ones with the larger version
  win: they are kept greedily from the largest version down, so the newest
  change stands and the offsets stay covered once;
* ranges that end at or below ``start`` go.

The merge is commutative and idempotent, so the leader can hand its
catalogue to the replicas in any order, as often as it likes, and take
theirs back in the answer (a new leader learns what the old one wrote).

A range is *safe* once it has ``copies`` holders: the replicas may then drop
their own copy of its offsets (``safe_through``). ``earliest`` is where the
partition starts for a reader, given where a replica's local log starts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Any, Iterable

import msgpack

from ring import limits

CHECKSUM_HEX = 40  # blake2b, 20 bytes (ring.ranges.copier)
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


@dataclass(frozen=True)
class Range:
    base: int
    end: int
    size: int  # bytes of its stored batches
    checksum: str
    max_timestamp: int  # newest record timestamp in it (ms)
    copies: int  # holders it should have
    holders: tuple[str, ...] = ()  # verified copies, sorted
    version: tuple[int, int] = (0, 0)  # (leader epoch, change number) of its last change

    @property
    def safe(self) -> bool:
        return 0 < self.copies <= len(self.holders)

    def to_wire(self) -> list[Any]:
        return [self.base, self.end, self.size, self.checksum, self.max_timestamp, self.copies,
                list(self.holders), self.version[0], self.version[1]]

    @classmethod
    def from_wire(cls, w: Any) -> Range:
        if type(w) is not list or len(w) != 9:
            raise ValueError("a range is [base, end, size, checksum, max_timestamp, copies, holders, epoch, seq]")
        base, end, size, checksum, max_ts, copies, holders, epoch, seq = w
        if not all(type(v) is int for v in (base, end, size, max_ts, copies, epoch, seq)):
            raise ValueError("a range's offsets, size, timestamp, copies and version are integers")
        if not 0 <= base < end <= _INT64_MAX or size < 0 or not 0 <= copies <= limits.RANGE_COPIES_MAX \
                or epoch < 0 or seq < 0 or not _INT64_MIN <= max_ts <= _INT64_MAX:
            raise ValueError(f"range {base}-{end}: offsets, size, copies or version out of bounds")
        if type(checksum) is not str or len(checksum) != CHECKSUM_HEX or not _is_hex(checksum):
            raise ValueError(f"range {base}-{end}: the checksum must be {CHECKSUM_HEX} hex characters")
        if type(holders) is not list or len(holders) > limits.RANGE_COPIES_MAX or \
                not all(type(h) is str and 0 < len(h) <= limits.BROKER_NAME_BYTES_MAX for h in holders) or \
                len(set(holders)) != len(holders):
            raise ValueError(f"range {base}-{end}: holders must be distinct broker names")
        return cls(base, end, size, checksum, max_ts, copies, tuple(sorted(holders)), (epoch, seq))


def _is_hex(s: str) -> bool:
    return all(c in "0123456789abcdef" for c in s)


class Catalogue:
    """The ranges of one partition, sorted by base offset and never overlapping."""

    __slots__ = ("start", "ranges", "seq", "_bases")

    def __init__(self, start: int = 0, ranges: Iterable[Range] = (), seq: int = 0) -> None:
        self.start = start
        self.ranges: list[Range] = sorted(ranges, key=lambda r: r.base)
        self.seq = seq
        self._bases = [r.base for r in self.ranges]
        for a, b in zip(self.ranges, self.ranges[1:]):
            assert a.end <= b.base, (a, b)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Catalogue):
            return NotImplemented
        return (self.start, self.ranges, self.seq) == (other.start, other.ranges, other.seq)

    def __repr__(self) -> str:
        return f"Catalogue(start={self.start}, seq={self.seq}, ranges={[(r.base, r.end) for r in self.ranges]})"

    def __len__(self) -> int:
        return len(self.ranges)

    # --- lookups ---------------------------------------------------------------------

    def find(self, offset: int) -> Range | None:
        """The range holding ``offset`` (at or past ``start``), or None."""
        if offset < self.start:
            return None
        i = bisect.bisect_right(self._bases, offset) - 1
        if i >= 0 and offset < self.ranges[i].end:
            return self.ranges[i]
        return None

    def get(self, base: int) -> Range | None:
        i = bisect.bisect_left(self._bases, base)
        return self.ranges[i] if i < len(self.ranges) and self.ranges[i].base == base else None

    @property
    def covered_end(self) -> int:
        """Where the next range begins: the last one's end (``start`` with none)."""
        return self.ranges[-1].end if self.ranges else self.start

    def safe_through(self, offset: int) -> int:
        """The end of the run of contiguous safe ranges from the one holding ``offset`` (``offset``
        when no safe range holds it): the offsets below it may leave the replicas."""
        r = self.find(offset)
        end = offset
        i = bisect.bisect_right(self._bases, offset) - 1
        while r is not None and r.safe and r.base <= end:
            end = r.end
            i += 1
            r = self.ranges[i] if i < len(self.ranges) else None
        return end

    def earliest(self, local_start: int) -> int:
        """Where a reader finds the partition's first offset, for a replica whose log starts at
        ``local_start``: the first range of the contiguous run that reaches it, else ``local_start``."""
        i = bisect.bisect_left(self._bases, local_start) - 1
        if i < 0 or self.ranges[i].end < local_start:
            return local_start
        while i > 0 and self.ranges[i - 1].end == self.ranges[i].base:
            i -= 1
        return min(local_start, max(self.start, self.ranges[i].base))

    def bytes_below(self, offset: int) -> int:
        """Bytes of the ranges wholly below ``offset``."""
        return sum(r.size for r in self.ranges if r.end <= offset)

    # --- changes (the leader's) ----------------------------------------------------------

    def copy(self) -> Catalogue:
        return Catalogue(self.start, self.ranges, self.seq)

    def _next(self, epoch: int) -> tuple[int, int]:
        self.seq += 1
        return (epoch, self.seq)

    def add(self, r: Range, epoch: int) -> Range:
        """A new range at the end (the leader cut it from its log)."""
        assert r.base >= self.covered_end or not self.ranges, (r, self.covered_end)
        if len(self.ranges) >= limits.RANGES_PER_PARTITION_MAX:
            raise ValueError(f"a partition holds at most {limits.RANGES_PER_PARTITION_MAX} ranges")
        r = replace(r, version=self._next(epoch))
        self.ranges.append(r)
        self._bases.append(r.base)
        return r

    def set_holders(self, base: int, holders: Iterable[str], epoch: int, copies: int | None = None) -> Range:
        """The range at ``base`` with these holders (and, given, this many copies wanted)."""
        i = bisect.bisect_left(self._bases, base)
        r = self.ranges[i]
        assert r.base == base
        r = replace(r, holders=tuple(sorted(set(holders))), copies=r.copies if copies is None else copies,
                    version=self._next(epoch))
        self.ranges[i] = r
        return r

    def move_start(self, start: int) -> list[Range]:
        """The partition starts at ``start`` (never back); returns the ranges that went."""
        if start <= self.start:
            return []
        self.start = start
        gone = [r for r in self.ranges if r.end <= start]
        if gone:
            self.ranges = self.ranges[len(gone):]
            self._bases = self._bases[len(gone):]
        self.seq += 1
        return gone

    # --- merging -----------------------------------------------------------------------

    def merge(self, other: Catalogue) -> Catalogue:
        """The catalogue that knows what both know (see the module's docstring)."""
        start = max(self.start, other.start)
        candidates = {r for r in (*self.ranges, *other.ranges) if r.end > start}
        kept: list[Range] = []
        bases: list[int] = []
        for r in sorted(candidates, key=_rank, reverse=True):
            i = bisect.bisect_left(bases, r.base)
            if (i > 0 and kept[i - 1].end > r.base) or (i < len(kept) and r.end > kept[i].base):
                continue  # overlaps a newer range
            kept.insert(i, r)
            bases.insert(i, r.base)
        return Catalogue(start, kept, max(self.seq, other.seq))

    # --- wire and disk -----------------------------------------------------------------

    def to_wire(self) -> list[Any]:
        return [self.start, self.seq, [r.to_wire() for r in self.ranges]]

    @classmethod
    def from_wire(cls, w: Any) -> Catalogue:
        """Parse a peer's (or a file's) catalogue; ValueError on anything malformed."""
        if type(w) is not list or len(w) != 3 or type(w[0]) is not int or type(w[1]) is not int \
                or type(w[2]) is not list:
            raise ValueError("a catalogue is [start, seq, ranges]")
        if not 0 <= w[0] <= _INT64_MAX or not 0 <= w[1] <= _INT64_MAX:
            raise ValueError("a catalogue's start and seq are non-negative int64")
        if len(w[2]) > limits.RANGES_PER_PARTITION_MAX:
            raise ValueError(f"a catalogue lists at most {limits.RANGES_PER_PARTITION_MAX} ranges")
        ranges = sorted((Range.from_wire(x) for x in w[2]), key=lambda r: r.base)
        for a, b in zip(ranges, ranges[1:]):
            if a.end > b.base:
                raise ValueError(f"ranges {a.base}-{a.end} and {b.base}-{b.end} overlap")
        return cls(w[0], ranges, w[1])

    def dumps(self) -> bytes:
        return msgpack.packb(self.to_wire(), use_bin_type=True)

    @classmethod
    def loads(cls, data: bytes) -> Catalogue:
        try:
            w = msgpack.unpackb(data, raw=False, max_array_len=max(16, limits.RANGES_PER_PARTITION_MAX),
                                max_map_len=0, max_str_len=4096, max_bin_len=0, max_ext_len=0)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ValueError(f"not a msgpack catalogue: {exc}") from None
        return cls.from_wire(w)


def _rank(r: Range) -> tuple[Any, ...]:
    """Newest change first; equal versions (never from one leader) break ties the same way everywhere."""
    return (r.version, r.base, r.end, r.checksum, r.holders, r.size, r.copies, r.max_timestamp)
