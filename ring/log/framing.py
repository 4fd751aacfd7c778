"""Framing a produce request's records into stored batches, per partition.

A request's records are grouped by partition (their key's, or one partition
for them all) and cut into batches no bigger than ``BATCH_BYTES_MAX``; an
idempotent producer's batches carry its id and each batch's first sequence.
Pure: the partition an unkeyed request goes to and the time records are
stamped with are arguments.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ring import limits
from ring.errors import BadRequest, UnknownPartition
from ring.hashing import partition_for_key
from ring.log import batch as batchfmt

BATCH_RECORD_BYTES_MAX = limits.BATCH_BYTES_MAX - batchfmt.HEADER_SIZE  # records' stored bytes in one batch


def choose_partition(topic: str, partitions: int, partition: int | None, key: bytes | None,
                     unkeyed: Callable[[], int]) -> int:
    """The partition a request goes to: the one asked for, its key's, or ``unkeyed()``'s."""
    if partition is not None:
        if not 0 <= partition < partitions:
            raise UnknownPartition(f"topic {topic!r} has partitions 0..{partitions - 1}, not {partition}",
                                   topic=topic, partition=partition)
        return partition
    if key is not None:
        return partition_for_key(key, partitions)
    # No key: round-robin, one partition per request so a request stays one batch.
    return unkeyed()


def group(topic: str, partitions: int, partition: int | None, records: Sequence[batchfmt.RecordIn],
          keyed: bool, producer: tuple[int, int] | None, unkeyed: Callable[[], int]) -> dict[int, Sequence[int]]:
    """Partition -> the indexes of the records that go to it, in request order."""
    pinned = None
    if producer is not None:
        if producer[1] + len(records) > 2**31 - 1:
            raise BadRequest("sequence + records must stay below 2**31")
        pinned = partition if partition is not None else partition_for_key(b"%d" % producer[0], partitions)
    if not keyed or partition is not None:
        target = partition if partition is not None or records[0][1] is not None else pinned
        return {choose_partition(topic, partitions, target, records[0][1], unkeyed): range(len(records))}
    by_key: dict[int, list[int]] = {}
    unkeyed_target: int | None = None
    for i, rec in enumerate(records):
        if rec[1] is not None:
            p = partition_for_key(rec[1], partitions)
        else:
            if unkeyed_target is None:
                unkeyed_target = pinned if pinned is not None else choose_partition(
                    topic, partitions, None, None, unkeyed)
            p = unkeyed_target
        by_key.setdefault(p, []).append(i)
    return dict(by_key)


def frame(groups: dict[int, Sequence[int]], records: Sequence[batchfmt.RecordIn], sizes: list[int],
          values_are_json: bool, producer: tuple[int, int] | None, codec: int,
          now_ms: int, sequences_contiguous: bool = False) -> dict[int, list[bytearray]]:
    """Partition -> the stored batches its records (``groups``' indexes) are framed into; an idempotent
    ``producer``'s batches say whether its sequences must have no gap (``batch.SEQUENCES_CONTIGUOUS``)."""
    if len(groups) == 1 and producer is None and sum(sizes) <= BATCH_RECORD_BYTES_MAX:
        ((p, _),) = groups.items()  # one batch of them all, as they are
        return {p: [batchfmt.encode(records, now_ms=now_ms, codec=codec, values_are_json=values_are_json)]}
    framed: dict[int, list[bytearray]] = {}
    for p, idx in groups.items():
        seq = -1 if producer is None else producer[1]
        framed[p] = []
        for chunk in cut(idx, sizes):
            framed[p].append(batchfmt.encode([records[i] for i in chunk], now_ms=now_ms, codec=codec,
                                             values_are_json=values_are_json,
                                             producer_id=-1 if producer is None else producer[0],
                                             base_sequence=seq,
                                             sequences_contiguous=sequences_contiguous and producer is not None))
            seq += len(chunk) if producer is not None else 0
    return framed


def cut(indexes: Sequence[int], sizes: list[int]) -> list[Sequence[int]]:
    """Split record indexes into runs whose stored size fits in one batch: slices of ``indexes``
    (of a ``range``, ranges: no integer object per record)."""
    budget = BATCH_RECORD_BYTES_MAX
    chunks: list[Sequence[int]] = []
    start = used = 0
    for n, i in enumerate(indexes):
        if n > start and used + sizes[i] > budget:
            chunks.append(indexes[start:n])
            start, used = n, 0
        used += sizes[i]
    chunks.append(indexes[start:])
    return chunks
