"""Which closed segments of a log retention deletes: a pure choice over their sizes, ends and newest
timestamps.

Whole segments go, oldest first: those already below the log start, then
those whose newest record is older than ``retention_ms`` (against the time
given; None: no time-based retention, the clock may not be used), then as
many as it takes to bring the log within ``retention_bytes``. A negative
bound is off.
"""

from __future__ import annotations

from typing import Sequence

from ring.log.segment import Segment


def expired(closed: Sequence[Segment], start_offset: int, size_bytes: int, retention_ms: int,
            retention_bytes: int, now_ms: int | None) -> int:
    """How many of ``closed`` (the log's closed segments, oldest first, of ``size_bytes`` in all)
    retention deletes."""
    n = 0
    while n < len(closed) and closed[n].end_offset <= start_offset:
        n += 1
    if retention_ms >= 0 and now_ms is not None:
        while n < len(closed) and now_ms - closed[n].max_timestamp > retention_ms:
            n += 1
    if retention_bytes >= 0:
        excess = size_bytes - sum(s.size for s in closed[:n]) - retention_bytes
        while n < len(closed) and excess - closed[n].size >= 0:
            excess -= closed[n].size
            n += 1
    return n
