"""Produce (v3-v8): each partition's RecordBatch v2 decoded into ring's records and handed to the
broker's intake as the HTTP front hands a produce's (``to_intake``), which appends them as the
partition's leader or forwards them to it.

acks maps to ring's consistency levels: acks=0 and acks=1 to ``one`` (acks=0 gets no answer, as in
Kafka), acks=all (-1) to the topic's own consistency (``quorum`` unless the topic says otherwise),
which keeps what Kafka's acks=all with min.insync.replicas=2 keeps on three replicas. Records keep
the partition the client chose, their timestamps (CreateTime), keys, values, null values and
headers in order. An idempotent producer's batches are judged by ring's idempotence
(``ring.replication.idempotence``) as an HTTP idempotent produce is: a retry of one of its last
batches is answered NONE with the offset it was first given, nothing written; a sequence at or below
its last that matches none of them, or one past a gap (its batches are ``SEQUENCES_CONTIGUOUS``, as Kafka
requires), OUT_OF_ORDER_SEQUENCE_NUMBER (``errors.code_of``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable

from ring import auth, limits
from ring.errors import BadRequest, CorruptBatch, PayloadTooLarge, RingError, UnknownPartition
from ring.kafka_api import access, errors, producer_ids, records
from ring.kafka_api.wire import Quiet, Reader, Writer
from ring.produce import Produce, Records
from ring.replication.intake import results_of


def consistency_of(acks: int) -> str | None:
    """ring's consistency level for Kafka's acks; None: the topic's own."""
    if acks in (0, 1):
        return "one"
    if acks == -1:
        return None
    raise BadRequest(f"acks must be 0, 1 or -1, not {acks}")


def handle(broker: Any, version: int, r: Reader) -> Any:
    transactional_id = r.nullable_string()
    acks = r.int16()
    r.int32()  # timeout_ms: ring's own delivery bounds apply
    topics = r.array(lambda r: (r.string(), r.array(lambda r: (r.int32(), r.nullable_bytes())) or [])) or []
    if transactional_id is not None:
        work = _refuse_all(topics, errors.INVALID_REQUEST)  # transactions are not served
    else:
        try:
            level = consistency_of(acks)
        except BadRequest:
            work = _refuse_all(topics, errors.INVALID_REQUEST)
        else:
            work = _produce(broker, topics, level, access.refusals(access.principal(), auth.PRODUCE,
                                                                  (name for name, _ in topics)))
    done = _answer(version, work)
    return Quiet(done) if acks == 0 else done


async def _refuse_all(topics: list, code: int) -> list:
    return [(name, [(p, code, -1) for p, _ in parts]) for name, parts in topics]


async def _produce(broker: Any, topics: list, level: str | None, refused: dict[str, RingError]) -> list:
    """Decode every partition's batches first (bounded together by REQUEST_BYTES_MAX inflated), then
    hand them over all at once: each partition's answer is its own. A topic in ``refused`` (the client may
    not produce to it: ``access``) has its partitions answered with its refusal, nothing of them written."""
    inflate_left = limits.REQUEST_BYTES_MAX
    writes: list[tuple[str, int, Any]] = []
    for name, parts in topics:
        for p, data in parts:
            if refused and name in refused:
                writes.append((name, p, _failed(refused[name])))
                continue
            try:
                if data is None:
                    raise CorruptBatch("a partition's records are null")
                recs, producer = records.decode_produced(data, inflate_left)
                inflate_left -= sum([len(r.value or b"") + len(r.key or b"") for r in recs])  # (a list: one call)
                writes.append((name, p, _written(name, to_intake(broker, name, p, recs, level, producer))))
            except RingError as exc:
                writes.append((name, p, _failed(exc)))
    results = await asyncio.gather(*(w for _, _, w in writes))
    out: dict[str, list] = {}
    for (name, p, _), (code, base) in zip(writes, results):
        out.setdefault(name, []).append((p, code, base))
    return list(out.items())


async def _failed(exc: RingError) -> tuple[int, int]:
    return errors.code_of(exc), -1


async def _written(topic: str, got: Any) -> tuple[int, int]:
    try:
        return errors.NONE, (await results_of(topic, got))[0].base_offset
    except RingError as exc:
        return errors.code_of(exc), -1


def to_intake(broker: Any, topic: str, partition: int, recs: list[records.KafkaRecord],
              level: str | None, producer: records.KafkaProducerId | None = None) -> Any:
    """Hand one partition's records to the broker as the HTTP front does (``http_api.app.produce``):
    a future of (base offset, count) (``Appending``, ``Forwarding``) or an awaitable of ``ProduceResult`` s.
    An idempotent ``producer``'s id and epoch go in as ring's producer id (``producer_ids.fold``) with its
    base sequence, so ring's idempotence judges a retry as it judges an HTTP one. Raises for records over
    ring's limits."""
    if partition < 0:
        raise UnknownPartition(f"partition {partition} of {topic!r}", topic=topic, partition=partition)
    idempotent = None
    if producer is not None:
        if producer.producer_id >= 1 << producer_ids.ID_BITS:
            raise BadRequest(f"producer id {producer.producer_id} was not handed out by InitProducerId",
                             kafka_error=errors.UNKNOWN_PRODUCER_ID)
        idempotent = (producer_ids.fold(producer.producer_id, producer.epoch), producer.base_sequence)
    ins = []
    sizes = []
    for rec in recs:
        key, value, headers = rec.key, rec.value, rec.headers or None
        if key is not None and len(key) > limits.KEY_BYTES_MAX:
            raise PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
        size = len(key or b"") + len(value or b"")
        if headers:
            size += sum(len(n) + len(v or b"") for n, v in headers)
        if size > limits.MESSAGE_BYTES_MAX:
            raise PayloadTooLarge(f"a record is over the limit of {limits.MESSAGE_BYTES_MAX} bytes")
        ins.append((rec.timestamp if rec.timestamp >= 0 else None, key, value, headers))
        sizes.append(size)
    return broker.intake.produce(Produce(topic, Records(ins, sizes, False, False), partition, None, level,
                                         idempotent, sequences_contiguous=idempotent is not None))


async def _answer(version: int, work: Awaitable[list]) -> bytes:
    topics = await work
    w = Writer().array_len(len(topics))
    for name, parts in topics:
        w.string(name).array_len(len(parts))
        for p, code, base in parts:
            w.int32(p).int16(code).int64(base).int64(-1)  # log_append_time_ms: -1, CreateTime
            if version >= 5:
                w.int64(-1)  # log_start_offset: not known here without a read
            if version >= 8:
                w.array_len(0).nullable_string(None)  # record_errors, error_message
    return bytes(w.int32(0).buf)  # throttle_time_ms
