"""Offset ranges and how to cut them into Spark splits: pure arithmetic.

An ``OffsetRange`` is a half-open interval ``[start, end)`` of one partition of
one topic, plus the broker URLs to try first when reading it. ``split_ranges``
is the offset-range calculator: it follows Kafka's KafkaOffsetRangeCalculator
(cut every range into pieces of at most ``max_records``, then split the big
ranges in proportion to their size until there are ``min_partitions`` pieces)
and, unlike Kafka's, keeps cutting the largest piece when rounding left the
total short, so "at least min(min_partitions, total records) splits" always
holds. ``rate_limit`` spreads a per-trigger record budget over partitions in
proportion to their backlog, exactly (the sum never exceeds the budget) and
without starving small partitions. No I/O here: the planner and the tests
feed numbers in and read numbers out.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence


@dataclass(frozen=True, order=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # first offset read
    end: int  # first offset not read
    # Broker URLs to try first for this partition (its replicas when known);
    # the reader falls back to every other broker it was given.
    urls: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        assert 0 <= self.start <= self.end, f"bad range {self.start}..{self.end}"

    @property
    def size(self) -> int:
        return self.end - self.start

    def cut(self, parts: int) -> list["OffsetRange"]:
        """``parts`` contiguous pieces whose sizes differ by at most one.

        The earlier pieces are the smaller ones, like Kafka's
        getDividedPartition, where the last piece absorbs the rounding.
        """
        assert parts >= 1
        parts = min(parts, max(self.size, 1))
        out, start, remaining = [], self.start, self.size
        for i in range(parts):
            n = remaining // (parts - i)
            remaining -= n
            out.append(OffsetRange(self.topic, self.partition, start, start + n, self.urls))
            start += n
        assert start == self.end
        return out


def _part_count(size: int, total: int, min_parts: int) -> int:
    # Kafka rounds half up (Math.round); so does int(x + 0.5) for x >= 0.
    return max(int(size / total * min_parts + 0.5), 1)


def split_ranges(
    ranges: Iterable[OffsetRange],
    min_partitions: int | None = None,
    max_records: int | None = None,
) -> list[OffsetRange]:
    """Splits covering every non-empty range exactly once, in input order.

    Guarantees: no split is empty; no split holds more than ``max_records``;
    there are at least ``min(min_partitions, total records)`` splits; a range
    is only cut when one of the two options asks for it.
    """
    assert min_partitions is None or min_partitions >= 1
    assert max_records is None or max_records >= 1
    pieces = [r for r in ranges if r.size > 0]
    if max_records is not None:
        pieces = [p for r in pieces for p in r.cut(-(-r.size // max_records))]
    if min_partitions is None or len(pieces) >= min_partitions:
        return pieces

    # Proportional split, as Kafka: ranges that would get a single part stay
    # whole and are left out of the proportion given to the others.
    total = sum(p.size for p in pieces)
    whole = {i for i, p in enumerate(pieces) if _part_count(p.size, total, min_partitions) == 1}
    split_total = total - sum(pieces[i].size for i in whole)
    split_min = max(min_partitions - len(whole), 1)
    out: list[list[OffsetRange]] = [
        [p] if i in whole else p.cut(_part_count(p.size, split_total, split_min))
        for i, p in enumerate(pieces)
    ]

    # Rounding can leave the count short of min_partitions: cut the range
    # whose pieces are largest once more, until reached or all are single
    # records. Bounded: each step adds one split and splits <= total records.
    count = sum(len(g) for g in out)
    heap = [(-max(s.size for s in g), i) for i, g in enumerate(out)]
    heapq.heapify(heap)
    while count < min_partitions and heap:
        neg, i = heapq.heappop(heap)
        if -neg <= 1:
            break
        group = out[i]
        original = OffsetRange(group[0].topic, group[0].partition, group[0].start, group[-1].end, group[0].urls)
        out[i] = original.cut(len(group) + 1)
        count += 1
        heapq.heappush(heap, (-max(s.size for s in out[i]), i))
    return [s for g in out for s in g]


PartitionKey = tuple[str, int]


def rate_limit(
    start: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    max_records: int,
) -> dict[PartitionKey, int]:
    """End offsets that read at most ``max_records`` records in total.

    Every partition with a backlog first gets one record (so a small partition
    is never starved behind a big one; when the budget is smaller than the
    number of such partitions, the largest backlogs win), then the rest of the
    budget is shared in proportion to the remaining backlogs, the leftover of
    the floor division going to the largest remainders. The sum is exactly
    ``min(max_records, total backlog)``. Partitions without a backlog keep
    ``latest``.
    """
    assert max_records >= 1
    backlog = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] - start[tp] > 0}
    total = sum(backlog.values())
    out = dict(latest)
    if total <= max_records:
        return out
    # Stable order: biggest backlog first, ties by partition key.
    order = sorted(backlog, key=lambda tp: (-backlog[tp], tp))
    share = {tp: 0 for tp in order}
    for tp in order[:max_records]:
        share[tp] = 1
    budget = max_records - sum(share.values())
    rest = {tp: backlog[tp] - share[tp] for tp in order}
    rest_total = sum(rest.values())
    if budget > 0:
        for tp in order:
            share[tp] += rest[tp] * budget // rest_total
        left = max_records - sum(share.values())
        by_remainder = sorted(order, key=lambda tp: (-(rest[tp] * budget % rest_total), tp))
        for tp in by_remainder:
            if left == 0:
                break
            if share[tp] < backlog[tp]:
                share[tp] += 1
                left -= 1
    assert sum(share.values()) == max_records
    for tp in order:
        assert share[tp] <= backlog[tp]
        out[tp] = start[tp] + share[tp]
    return out


def describe_splits(splits: Sequence[OffsetRange]) -> str:
    """One line per split, for logs and the example's output."""
    return "\n".join(f"{s.topic}/{s.partition} [{s.start}, {s.end}) {s.size} records" for s in splits)
