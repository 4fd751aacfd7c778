"""Read one split ``[start, end)`` of a partition, exactly once, in offset order.

A Spark task calls ``read_split`` with the split the planner cut. It fetches
stored batches (``application/vnd.ring.batches``: the bytes the broker keeps,
no per-record work on the broker) from the split's replicas first and any
other broker after, verifies each batch's CRC, and yields lists of
``ring.log.batch.Record`` holding exactly the offsets of the split: the first
batch of an answer may start below the requested offset and the last may run
past ``end``, so both are trimmed. Offsets the brokers no longer hold
(retention, truncation) are data loss: an error, or a skip when the query
set ``failOnDataLoss=false``. Offsets the planner saw committed but the
serving replica does not have yet (a follower catching up after a failover)
are waited for, up to ``poll_timeout_ms``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import msgpack

from ring import errors
from ring.log import batch as batchfmt
from ring.log.batch import Record, header_pairs
from sparkio.client import CT_BATCHES, H_HIGH_WATERMARK, BrokerClient, Response
from sparkio.ranges import OffsetRange

# How long one fetch long-polls when the serving replica is behind the split.
_CATCH_UP_WAIT_MS = 250


class DataLoss(errors.OffsetOutOfRange):
    """Offsets a query asked for are gone from every broker."""

    code = "data_loss"


def data_loss(topic: str, partition: int, start: int, end: int, earliest: int) -> DataLoss:
    return DataLoss(
        f"data loss: offsets {start}..{end - 1} of {topic}/{partition} are no longer on the brokers "
        f"(earliest offset is {earliest}; removed by retention or truncation). "
        "Set the option failOnDataLoss=false to skip them.",
        topic=topic, partition=partition, earliest=earliest,
    )


def decode_answer(resp: Response, offset: int, end: int) -> list[Record]:
    """Records of a fetch answer with ``offset <= record.offset < end``."""
    ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    out: list[Record] = []
    if ctype == CT_BATCHES:
        for h, pos in batchfmt.scan(resp.body):
            if h.next_offset <= offset:
                continue
            if h.base_offset >= end:
                break
            _, records = batchfmt.decode(resp.body, pos, verify=False)  # scan checked the CRC
            out.extend(r for r in records if offset <= r.offset < end)
        return out
    # A broker that only speaks msgpack answers with decoded records.
    doc = msgpack.unpackb(resp.body, raw=False, strict_map_key=False)
    for r in doc.get("records", []):
        if offset <= r["offset"] < end:
            out.append(Record(r["offset"], r["timestamp"], r.get("key"), r.get("value"), header_pairs(r.get("headers"))))
    return out


def read_split(
    client: BrokerClient,
    split: OffsetRange,
    *,
    fail_on_data_loss: bool = True,
    fetch_max_bytes: int,
    poll_timeout_ms: int,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[list[Record]]:
    """Yield the split's records in offset order, in chunks of one fetch each."""
    offset, end = split.start, split.end
    stalled_since: float | None = None
    wait_ms = 0
    while offset < end:
        try:
            resp = client.fetch(split.topic, split.partition, offset, max_bytes=fetch_max_bytes,
                                wait_ms=wait_ms, prefer=split.urls)
        except errors.OffsetOutOfRange as exc:
            earliest = exc.extra.get("earliest")
            if isinstance(earliest, int) and earliest > offset:
                if fail_on_data_loss:
                    raise data_loss(split.topic, split.partition, offset, min(earliest, end), earliest) from None
                offset = min(earliest, end)
                continue
            resp = None  # above this replica's log end: it is behind; wait below
        records = decode_answer(resp, offset, end) if resp is not None else []
        if records:
            first, last = records[0].offset, records[-1].offset
            if first != offset:
                # The broker skipped offsets: they were removed under our feet.
                if fail_on_data_loss:
                    raise data_loss(split.topic, split.partition, offset, first, first)
            # Offsets within an answer are strictly increasing; equal span
            # and count means no holes.
            assert last - first + 1 == len(records), "holes inside a fetch answer"
            yield records
            offset = last + 1
            stalled_since, wait_ms = None, 0
            continue
        hw = resp.header_int(H_HIGH_WATERMARK) if resp is not None else None
        now = monotonic()
        if stalled_since is None:
            stalled_since = now
        elif (now - stalled_since) * 1000 > poll_timeout_ms:
            raise errors.Unavailable(
                f"{split.topic}/{split.partition}: offsets {offset}..{end - 1} were committed when the "
                f"query was planned but no broker served them within {poll_timeout_ms} ms "
                f"(high watermark seen: {hw})")
        wait_ms = _CATCH_UP_WAIT_MS
        if resp is None:  # a 416 does not long-poll: pause here instead
            sleep(_CATCH_UP_WAIT_MS / 1000)
