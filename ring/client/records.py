"""The values the client hands back: where a produced record landed, and
fetched records with the position to fetch from next.

Fetch answers arrive as stored batches (``application/vnd.ring.batches``);
``decode_fetch`` checks every batch's CRC, decodes it with the log's own
``ring.log.batch`` functions, and keeps the records in
``[offset, high_watermark)``, at most ``max_records`` of them. A record's
headers are ``(name, value)`` pairs in the producer's order (a name may
repeat); a record without a value (a tombstone) has ``value`` None.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import orjson

from ring.log import batch as batchfmt
from ring.log.batch import Header

# What ``produce`` takes as headers: (name, value) pairs, in order, names may
# repeat; or a dict. Values are bytes, str (UTF-8) or None.
Headers = Sequence[tuple[str, bytes | str | None]] | dict[str, bytes | str | None]


class RecordMetadata(NamedTuple):
    """Where an acknowledged record is stored, and its timestamp (ms since the epoch)."""

    topic: str
    partition: int
    offset: int
    timestamp: int = -1


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch
    key: bytes | None
    value: bytes | None  # None: a record without a value (a tombstone)
    headers: list[Header] | None  # (name, value) pairs in order; a name may repeat
    value_is_json: bool  # produced as JSON (``json=`` or a JSON body)

    def json(self) -> Any:
        """The value parsed as JSON."""
        return orjson.loads(self.value)

class FetchResult(NamedTuple):
    topic: str
    partition: int
    records: list[ConsumerRecord]
    next_offset: int  # fetch from here to continue
    high_watermark: int  # offsets below it are committed (held by a majority)
    broker: str  # URL of the replica that answered


def decode_fetch(topic: str, partition: int, data: bytes, offset: int | None, high_watermark: int,
                 max_records: int, next_offset_hint: int | None) -> tuple[list[ConsumerRecord], int]:
    """Records at/above ``offset`` and below ``high_watermark``, and the next offset."""
    start = -1 if offset is None else offset
    out = [ConsumerRecord(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers, is_json)
           # CRC-checked here too: end-to-end integrity
           for r, is_json in batchfmt.records_between(data, start, high_watermark, max_records, verify=True)]
    if out:
        return out, out[-1].offset + 1
    if offset is not None:
        return out, offset
    return out, next_offset_hint or 0
