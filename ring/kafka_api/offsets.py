"""ListOffsets (v1-v5): a partition's earliest offset, its latest (the high watermark: where a
consumer that starts at the end reads from) or the first offset at or after a timestamp, by
``broker.offsets`` (as the HTTP front's GET .../offsets), which asks the partition's leader or a
replica when this broker holds none.

Answers (v4+) carry the leader epoch of the batch holding the offset, the latest epoch for the log end
(-1 for an offset held only in ranges below the local log), which a client keeps with its position and
checks after a leader change with OffsetForLeaderEpoch; never the record's timestamp (-1). A
``current_leader_epoch`` (v4+) is checked as OffsetForLeaderEpoch checks it (``epochs.check_current``). When every record is older than
the timestamp asked for, the answer is the high watermark, where Kafka answers -1: both send a
consumer to the end.
"""

from __future__ import annotations

from typing import Any

from ring import auth
from ring.errors import BadRequest, RingError
from ring.kafka_api import access, epochs, errors
from ring.kafka_api.wire import Reader, Writer
from ring.offsets import EARLIEST, LATEST, At, OffsetsAt

_EARLIEST, _LATEST = -2, -1


def list_offsets(broker: Any, version: int, r: Reader) -> Any:
    r.int32()  # replica_id
    if version >= 2:
        r.int8()  # isolation_level: the same offsets either way

    def partition(r: Reader) -> tuple[int, int, int]:
        p = r.int32()
        current = r.int32() if version >= 4 else -1
        return p, current, r.int64()

    topics = r.array(lambda r: (r.string(), r.array(partition) or [])) or []
    epochs.check_partition_count(topics, "ListOffsets")
    return _list_offsets(broker, version, topics,
                         access.refusals(access.principal(), auth.CONSUME, (t for t, _ in topics)))


async def _list_offsets(broker: Any, version: int, topics: list, refused: dict[str, RingError]) -> bytes:
    """Each partition's offset; a topic in ``refused`` (the client may not consume it: ``access``) is not
    looked up, its partitions answer the refusal."""
    w = Writer()
    if version >= 2:
        w.int32(0)  # throttle_time_ms
    w.array_len(len(topics))
    for topic, parts in topics:
        w.string(topic).array_len(len(parts))
        for p, current, timestamp in parts:
            code, offset, epoch = errors.NONE, -1, -1
            try:
                if refused and topic in refused:
                    code = errors.code_of(refused[topic])
                else:
                    epochs.check_current(broker, topic, p, current)
                    offset, epoch = await _offset(broker, topic, p, timestamp)
            except RingError as exc:
                code = errors.code_of(exc)
            w.int32(p).int16(code).int64(-1).int64(offset)  # the found record's timestamp: not known here
            if version >= 4:
                w.int32(epoch)
    return bytes(w.buf)


async def _offset(broker: Any, topic: str, partition: int, timestamp: int) -> tuple[int, int]:
    """Earliest (-2), latest (-1) or the first offset at or after a timestamp (ms), and its leader epoch."""
    at: At
    if timestamp == _EARLIEST:
        at = EARLIEST
    elif timestamp == _LATEST:
        at = LATEST
    elif timestamp >= 0:
        at = timestamp
    else:
        raise BadRequest(f"timestamp {timestamp} is not served (-2 earliest, -1 latest, or ms since the epoch)")
    found = await broker.offsets(OffsetsAt(topic, partition, at))
    return int(found["offset"]), int(found.get("leader_epoch", -1))
