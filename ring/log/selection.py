"""Which records of stored batches a read hands out: the records in ``[offset, high_watermark)``, at most
``max_records``, decoded (``select_records``) or left as the stored batches that hold them, read from the
batch headers alone (``select_batches``). Pure functions over the log's batch format, shared by every
reader above the log (the client fetch, group polls).
"""

from __future__ import annotations

from ring.log import batch as batchfmt
from ring.log.batch import Record


def select_records(data: bytes, offset: int, max_records: int, high_watermark: int) -> tuple[list[tuple[Record, bool]], int]:
    """Records in ``[offset, high_watermark)`` from stored batches, at most ``max_records``.

    Returns ``[(record, value_is_json)]`` and the next offset to fetch from.
    """
    out = list(batchfmt.records_between(data, offset, high_watermark, max_records, verify=False))
    next_offset = out[-1][0].offset + 1 if out else offset
    return out, next_offset


def select_batches(data: bytes, offset: int, max_records: int,
                   high_watermark: int) -> tuple[bytes | memoryview, int, int]:
    """The stored batches holding records in ``[offset, high_watermark)``, at most ``max_records`` of
    them, read from the batch headers alone: ``(batches, end, count)``. The records to hand out are
    ``offset <= o < end`` (the first batch may start below ``offset``, the last run past ``end``);
    what ``select_records`` would decode, without decoding it."""
    end, count, cut = offset, 0, 0
    for h, pos in batchfmt.scan(data, verify=False):
        if h.next_offset <= offset:
            continue
        if h.base_offset >= high_watermark or count >= max_records:
            break
        first = max(h.base_offset, offset)
        end = min(h.next_offset, high_watermark, first + max_records - count)
        count += end - first
        cut = pos + h.size
    return memoryview(data)[:cut] if cut < len(data) else data, end, count


def batches_next_offset(data: bytes, offset: int) -> int:
    """Next offset after the stored batches of a raw answer (headers only, no CRC work)."""
    next_offset = offset
    for h, _ in batchfmt.scan(data, verify=False):
        next_offset = max(next_offset, h.next_offset)
    return next_offset
