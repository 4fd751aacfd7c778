"""Repairing a damaged replica in place: each stored batch that fails its check is replaced by a whole copy
of the same batch from another replica, and every other batch stays where it is.

Cutting the log at the damaged batch and refetching from the leader would
throw away the whole batches above it, and those can be the last whole
copies of acknowledged batches: when bits flip on two replicas of a
partition, each in a different batch, every batch still has a whole copy
somewhere, but a cut follower drops its copy of the batch the leader's log
has damaged, and nobody holds it any more. Mending one batch at a time
from whichever replica holds it whole loses nothing that was anywhere.

These are the synchronous steps; a driver runs them (``ring.repair.driver``
on a broker, tests/sim/disk.py in the simulation), fetching the copy from
a peer between them (``GET /peer/v1/replicas/{topic}/{partition}``, which
serves a stored batch only if it reads whole). The same batch on two
replicas is the same bytes (a follower stores its leader's batches as sent),
named by its offsets and its leader epoch; ``PartitionLog.mend`` writes a
copy only over a stored batch of the same offsets, epoch and length.
"""

from __future__ import annotations

import logging

from ring import limits
from ring.errors import CorruptBatch, OffsetOutOfRange, RingError, StorageError
from ring.log import batch as batchfmt
from ring.replication.replica import Replica

log = logging.getLogger("ring.repair")


def scan(rep: Replica, offset: int, max_bytes: int = limits.REPAIR_CHUNK_BYTES) -> tuple[int, bool]:
    """One chunk of ``rep``'s log read with its checks from ``offset``: (where the next chunk begins, whether
    the batch there failed its check). The scan is over when it reaches the log's end."""
    offset = min(max(offset, rep.log.start_offset), rep.log.end_offset)
    try:
        data = rep.log.read(offset, max_bytes)
    except StorageError:
        return offset, True
    except OffsetOutOfRange:  # cut meanwhile: start again from where the log is
        return rep.log.start_offset, False
    for h, _ in batchfmt.scan(data, verify=False):
        offset = h.next_offset
    return offset, False


def sources(rep: Replica) -> list[str]:
    """The brokers to ask for a whole copy, in turn: the leader first, then the other replicas."""
    names = [rep.leader] if rep.leader is not None and rep.leader != rep.self_name else []
    return names + [n for n in sorted(set(rep.replicas) | set(rep.voters)) if n != rep.self_name and n not in names]


def cut_away(rep: Replica) -> bool:
    """Whether the damaged batch is no longer in the log (a new leader's sync cut the tail holding it):
    nothing is left to mend or to cut, and the replica counts as repaired."""
    return rep.damaged_at is not None and rep.damaged_at >= rep.log.end_offset


def put(rep: Replica, offset: int, data: bytes) -> bool:
    """Write ``data`` (a peer's stored batch holding ``offset``) over this replica's damaged copy; whether it
    did. A copy that is not whole, or not the same batch, changes nothing. The caller made sure no fsync
    runs on the log."""
    if rep.deleted:
        return False
    try:
        h = batchfmt.read_header(data)
        if not h.base_offset <= offset < h.next_offset:
            raise CorruptBatch(f"it holds offsets {h.base_offset}-{h.last_offset}")
        rep.log.mend(data[:h.size])
    except RingError as exc:
        log.warning("%s/%d: the copy of offset %d is no use: %s", rep.topic, rep.index, offset, exc.message)
        return False
    rep.sums = None  # digests taken over the damaged bytes no longer describe this log
    log.warning("%s/%d: batch %d-%d mended in place from a whole copy", rep.topic, rep.index, h.base_offset,
                h.last_offset)
    return True
