"""Read one split ``[start, end)`` of a partition, exactly once, in offset order.

A Spark task calls ``read_split`` with the split the planner cut. It fetches
stored batches (``application/vnd.ring.batches``: the bytes the broker keeps,
no per-record work on the broker) from the split's replicas first and any
other broker after, verifies each batch's CRC, and yields, per fetch answer,
the ``Piece``s of stored batches holding exactly the offsets of the split:
the first batch of an answer may start below the requested offset and the
last may run past ``end``, so both are cut. A piece is decoded only when it
is used, column by column for Arrow (``sparkio.schema.to_arrow``) or as
``ring.log.batch.Record``s for the RDD, so no per-record object is made on
the DataFrame path. Offsets the brokers no longer hold
(retention, truncation) are data loss: an error, or a skip when the query
set ``failOnDataLoss=false``. Offsets the planner saw committed but the
serving replica does not have yet (a follower catching up after a failover)
are waited for, up to ``poll_timeout_ms``.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator, NamedTuple

import msgpack

from ring import errors
from ring.log import batch as batchfmt
from ring.log.batch import BatchHeader, Record, header_pairs
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


class Piece(NamedTuple):
    """Records ``lo <= i < hi`` of one stored batch (its payload still as stored)."""

    header: BatchHeader
    payload: memoryview  # compressed as header.codec says
    lo: int
    hi: int

    @property
    def first(self) -> int:
        return self.header.base_offset + self.lo

    @property
    def last(self) -> int:
        return self.header.base_offset + self.hi - 1

    def items(self) -> list:
        """The records as stored: ``[timestamp_delta, key, value, headers]`` each."""
        raw = batchfmt.decompress(self.header.codec, self.payload)
        try:
            items = msgpack.unpackb(raw, raw=False, use_list=True, strict_map_key=True)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise errors.CorruptBatch(f"batch payload is not a record list: {exc}") from None
        if len(items) != self.header.record_count:
            raise errors.CorruptBatch("record count does not match the header")
        return items if self.lo == 0 and self.hi == len(items) else items[self.lo:self.hi]

    def records(self) -> list[Record]:
        base, first_ts = self.first, self.header.first_timestamp
        return [Record(base + i, first_ts + it[0], it[1], it[2], header_pairs(it[3]) if it[3] else None)
                for i, it in enumerate(self.items())]


def decode_answer(resp: Response, offset: int, end: int) -> list[Piece]:
    """The pieces of a fetch answer's stored batches with ``offset <= record offset < end``."""
    ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != CT_BATCHES:
        raise errors.Unavailable(f"{resp.url} answered a fetch with {ctype or 'no content type'}, "
                                 f"not {CT_BATCHES}")
    out: list[Piece] = []
    body = memoryview(resp.body)
    for h, pos in batchfmt.scan(body):
        if h.next_offset <= offset:
            continue
        if h.base_offset >= end:
            break
        lo, hi = max(offset - h.base_offset, 0), min(end, h.next_offset) - h.base_offset
        out.append(Piece(h, body[pos + batchfmt.HEADER_SIZE: pos + h.size], lo, hi))
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
) -> Iterator[list[Piece]]:
    """Yield the split's records in offset order, as the pieces of one fetch answer at a time."""
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
        pieces = decode_answer(resp, offset, end) if resp is not None else []
        if pieces:
            first, last = pieces[0].first, pieces[-1].last
            if first != offset:
                # The broker skipped offsets: they were removed under our feet.
                if fail_on_data_loss:
                    raise data_loss(split.topic, split.partition, offset, first, first)
            # Stored batches of one answer follow each other without a gap.
            assert all(a.last + 1 == b.first for a, b in zip(pieces, pieces[1:])), "holes inside a fetch answer"
            yield pieces
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


def read_records(client: BrokerClient, split: OffsetRange, **kw) -> Iterator[list[Record]]:
    """``read_split`` as lists of ``Record``, one per fetch answer."""
    for pieces in read_split(client, split, **kw):
        yield [r for piece in pieces for r in piece.records()]
