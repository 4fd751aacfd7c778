"""What a follower's log takes from its leader: a run of stamped batches that continues it.

Every batch is checked (CRC, size) before any is written, so a refused run
changes nothing: each must start where the one before ended (the first at
the log's end) with a leader epoch no lower than the one before (the first
no lower than the log's newest). A log that holds nothing and starts inside
the first batch (a replica started again at its leader's log start, which a
truncation may put inside a batch) takes that batch whole, from its base.
"""

from __future__ import annotations

from ring.errors import Conflict, CorruptBatch
from ring.log import batch
from ring.log.batch import BatchHeader


def check_continues(view: memoryview, end_offset: int, latest_epoch: int, start_offset: int,
                    empty: bool) -> tuple[list[tuple[BatchHeader, int]], int | None]:
    """(header, byte position) of each batch in ``view``, and the base offset the log must restart at
    first (None: it continues at ``end_offset``). ``CorruptBatch`` or ``Conflict`` when it does not
    continue a log ending at ``end_offset`` in epoch ``latest_epoch``."""
    headers: list[tuple[BatchHeader, int]] = []
    expected, epoch, pos = end_offset, latest_epoch, 0
    rebase: int | None = None
    while pos < len(view):
        try:
            h = batch.check(view, pos)
        except CorruptBatch as exc:
            raise CorruptBatch(f"replicated batch at byte {pos}: {exc.message}") from None
        if pos == 0 and empty and h.base_offset < expected == start_offset < h.next_offset:
            rebase = h.base_offset
        elif h.base_offset != expected:
            raise Conflict(
                f"replicated batch at byte {pos} starts at offset {h.base_offset},"
                f" expected {expected} (the next offset of this log)",
                expected_offset=expected, got_offset=h.base_offset,
            )
        if h.leader_epoch < epoch:
            raise Conflict(
                f"replicated batch at offset {h.base_offset} has leader epoch {h.leader_epoch},"
                f" expected at least {epoch}",
                expected_epoch=epoch, got_epoch=h.leader_epoch,
            )
        headers.append((h, pos))
        expected, epoch, pos = h.next_offset, h.leader_epoch, pos + h.size
    return headers, rebase
