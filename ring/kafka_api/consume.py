"""Fetch (v4-v11): ring's stored batches read through the broker
(``broker.fetch``, answered at once or awaited, as the HTTP front's fetch reads them) and answered as Kafka
RecordBatch v2 with the same offsets.

A fetch reads every partition it names at once. When that finds nothing and the client would wait
(max_wait_ms), it long-polls all of them, each on its own partition's waiter, and reads them all
again as soon as one has records or the wait ends: min_bytes is taken as 1 (any record ends the
wait). The answer holds each partition's whole batches from the one holding the fetch offset, up
to the partition's max bytes (at least one batch, as Kafka does), high watermark and log start.
Fetch sessions (KIP-227) are not kept: every answer's session id is 0, so clients send full
fetches. Isolation levels read the same records: ring has no transactions, its last stable offset
is its high watermark. A ``current_leader_epoch`` (v9+) is checked per partition as OffsetForLeaderEpoch
checks it (``epochs.check_current``).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from ring import answer_budget, auth, limits
from ring.errors import BadRequest, RingError
from ring.fetch import Fetch
from ring.kafka_api import access, epochs, errors, records
from ring.kafka_api.wire import Reader, Writer
from ring.replication.reads import StoredRead, settled

class _Wanted(NamedTuple):
    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int  # -1: unchecked (``epochs.check_current``)


def _fetch_partition(version: int):
    def read(r: Reader) -> tuple[int, int, int, int]:
        p = r.int32()
        current = r.int32() if version >= 9 else -1
        offset = r.int64()
        if version >= 5:
            r.int64()  # log_start_offset: a follower's, unused
        return p, offset, r.int32(), current
    return read


def fetch(broker: Any, version: int, r: Reader) -> Any:
    r.int32()  # replica_id: -1 for consumers
    max_wait_ms = min(max(r.int32(), 0), limits.LONG_POLL_WAIT_MS_MAX)
    r.int32()  # min_bytes: taken as 1
    max_bytes = r.int32()
    r.int8()  # isolation_level: the same records either way
    if version >= 7:
        r.int32()  # session_id
        r.int32()  # session_epoch
    read_partition = _fetch_partition(version)
    topics = r.array(lambda r: (r.string(), r.array(read_partition) or [])) or []
    # (v7's forgotten topics and v11's rack_id follow: without sessions, nothing to forget)
    wanted = [_Wanted(t, *part) for t, parts in topics for part in parts]
    if len(wanted) > limits.KAFKA_FETCH_PARTITIONS_MAX:
        raise BadRequest(f"a fetch of {len(wanted)} partitions (at most {limits.KAFKA_FETCH_PARTITIONS_MAX})")
    refused = access.refusals(access.principal(), auth.CONSUME, (t for t, _ in topics))
    return _fetch(broker, version, wanted, max_wait_ms, max_bytes, refused)


async def _fetch(broker: Any, version: int, wanted: list[_Wanted], max_wait_ms: int, max_bytes: int,
                 refused: dict[str, RingError]) -> bytes:
    got = await _read_all(broker, wanted, max(max_bytes, 1), refused)
    if max_wait_ms and not any(isinstance(g, StoredRead) and g.data for g in got):
        waits = [asyncio.ensure_future(_waited(broker, w, max_wait_ms))
                 for w, g in zip(wanted, got) if isinstance(g, StoredRead)]
        if waits:
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            got = await _read_all(broker, wanted, max(max_bytes, 1), refused)
    return _fetch_answer(version, wanted, got)


async def _waited(broker: Any, w: _Wanted, max_wait_ms: int) -> StoredRead:
    """A long poll on one partition (its errors stay in its task)."""
    return await settled(broker.fetch(Fetch(w.topic, w.partition, w.offset, 1, max_wait_ms)))


async def _read_all(broker: Any, wanted: list[_Wanted], max_bytes: int,
                    refused: dict[str, RingError]) -> list[StoredRead | RingError]:
    """Each partition's read, at once (a partition another broker must answer is awaited), within the
    fetch's max bytes and FETCH_BYTES_MAX: once they are reached, the partitions after answer their
    high watermark and no records (the first always gets a batch, as in Kafka). A topic in ``refused``
    (the client may not consume it: ``access``) is not read: its partitions answer the refusal."""
    budget = answer_budget.budget_of(broker)
    out: list[StoredRead | RingError] = []
    left = min(max_bytes, limits.FETCH_BYTES_MAX)
    for w in wanted:
        if refused and w.topic in refused:
            out.append(refused[w.topic])
            continue
        try:
            epochs.check_current(broker, w.topic, w.partition, w.current_leader_epoch)
            ask = budget.grant(max(1, min(w.max_bytes, left)))
            result = broker.fetch(Fetch(w.topic, w.partition, w.offset, ask))
            if not isinstance(result, StoredRead):
                result = await result
            if left <= 0:
                result = result._replace(data=b"")  # (read for its high watermark and log start)
            left -= len(result.data)
            out.append(result)
        except RingError as exc:
            out.append(exc)
    return out


def _fetch_answer(version: int, wanted: list[_Wanted], got: list[StoredRead | RingError]) -> bytes:
    w = Writer().int32(0)  # throttle_time_ms
    if version >= 7:
        w.int16(errors.NONE).int32(0)  # error_code, session_id: no session
    by_topic: dict[str, list[tuple[_Wanted, StoredRead | RingError]]] = {}
    for want, g in zip(wanted, got):
        by_topic.setdefault(want.topic, []).append((want, g))
    w.array_len(len(by_topic))
    for topic, parts in by_topic.items():
        w.string(topic).array_len(len(parts))
        for want, g in parts:
            w.int32(want.partition)
            if isinstance(g, RingError):
                w.int16(errors.code_of(g)).int64(-1).int64(-1)  # error, high watermark, last stable offset
                if version >= 5:
                    w.int64(-1)
                w.array_len(0)  # aborted_transactions
                if version >= 11:
                    w.int32(-1)  # preferred_read_replica
                w.nullable_bytes(None)
                continue
            w.int16(errors.NONE).int64(g.high_watermark).int64(g.high_watermark)
            if version >= 5:
                w.int64(g.earliest_offset)
            w.array_len(0)
            if version >= 11:
                w.int32(-1)
            w.nullable_bytes(records.from_stored(g.data) if g.data else b"")
    return bytes(w.buf)
