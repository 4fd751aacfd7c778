"""Key -> partition: Lamping & Veach's jump consistent hash over murmur3(key).

Jump hash walks a pseudo-random sequence of bucket "jumps" determined by the
key alone and returns the last one below the bucket count, so growing a topic
from P to P+1 partitions moves exactly the keys whose next jump is P — about
1/(P+1) of them — and moves them only to the new partition. The loop is the
published C++ reference: the LCG step is exact integer arithmetic mod 2**64,
and the jump uses IEEE doubles like the reference, so producers written in
other languages that use a standard jump hash over the same murmur3 token put
a key in the same partition.
"""

from __future__ import annotations

from ring.hashing.murmur import RING_SIZE, token

_LCG_MULTIPLIER = 2862933555777941757
_TWO_POW_31 = float(1 << 31)


def jump_hash(key_hash: int, buckets: int) -> int:
    """Bucket in [0, buckets) of ``key_hash`` (read as unsigned 64-bit)."""
    if not isinstance(buckets, int) or buckets < 1:
        raise ValueError(f"buckets must be an int >= 1, got {buckets!r}")
    key = key_hash % RING_SIZE
    bucket, jump = -1, 0
    # Terminates: every jump is strictly larger than the previous bucket, and
    # the expected number of steps is ln(buckets) + 1.
    while jump < buckets:
        bucket = jump
        key = (key * _LCG_MULTIPLIER + 1) % RING_SIZE
        jump = int((bucket + 1) * (_TWO_POW_31 / float((key >> 33) + 1)))
    return bucket


def partition_for_key(key: bytes, partitions: int) -> int:
    """Partition of a record key in a topic with ``partitions`` partitions."""
    return jump_hash(token(key), partitions)
