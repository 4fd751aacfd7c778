"""InitProducerId (v0-5): idempotent Kafka producers get a producer id, and their ids and epochs are
carried in ring's stored batch headers.

A Kafka producer is known by a producer id (int64) and an epoch (int16); ring's batch header has one
producer id field, which ring's idempotence (``ring.replication.idempotence``) keys its table on. The
two are folded into it: ``stored = id << 15 | epoch`` (epochs are 0..32767, as Kafka's), so a producer
that bumps its epoch and starts its sequences again from 0 (the Java client does so itself after an
uncertain failure) is a new producer to the table rather than a retry of its first batches. Ids handed
out here are below 2**48, so the folded id stays a non-negative int64, as the header wants.

Ids are drawn at random, as ``ring.client``'s HTTP producers draw theirs, from the broker's random
source: no broker or front has to agree with another on them, and two producers meet on an id with the
chance of two 48-bit draws meeting. As Kafka does for a producer without a transactional id, every
InitProducerId answers a new id at epoch 0, including one naming the id and epoch it had (KIP-360's
bump). A transactional id is refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which both the Java
client and librdkafka treat as fatal at once, with no retries: ring serves no transactions. A client
that may produce to no topic is answered CLUSTER_AUTHORIZATION_FAILED (``access``).
"""

from __future__ import annotations

from typing import Any

from ring.kafka_api import access, errors
from ring.kafka_api.wire import Reader, Writer

VERSIONS = (0, 5)
FLEXIBLE_FROM = 2
ID_BITS = 48
EPOCH_BITS = 15
EPOCH_MAX = (1 << EPOCH_BITS) - 1


def fold(producer_id: int, epoch: int) -> int:
    """The producer id ring stores for Kafka's (id, epoch)."""
    assert 0 <= producer_id < 1 << ID_BITS and 0 <= epoch <= EPOCH_MAX
    return producer_id << EPOCH_BITS | epoch


def unfold(stored: int) -> tuple[int, int]:
    """Kafka's (id, epoch) of a stored producer id; (-1, -1) for none."""
    if stored < 0:
        return -1, -1
    return stored >> EPOCH_BITS, stored & EPOCH_MAX


def read_request(version: int, r: Reader) -> tuple[str | None, int, int, int]:
    """(transactional id, transaction timeout ms, producer id, producer epoch) of a request body."""
    flexible = version >= FLEXIBLE_FROM
    tid = r.compact_nullable_string() if flexible else r.nullable_string()
    timeout_ms = r.int32()
    pid, epoch = (r.int64(), r.int16()) if version >= 3 else (-1, -1)
    if flexible:
        r.tagged_fields()
    return tid, timeout_ms, pid, epoch


def answer(version: int, error: int, producer_id: int, epoch: int) -> bytes:
    w = Writer().int32(0).int16(error).int64(producer_id).int16(epoch)  # throttle_time_ms first
    if version >= FLEXIBLE_FROM:
        w.tagged_fields()
    return bytes(w.buf)


def handle(broker: Any, version: int, r: Reader) -> bytes:
    tid, _, _, _ = read_request(version, r)
    if tid is not None:
        return answer(version, errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
    if not access.may_produce_somewhere(access.principal()):
        return answer(version, errors.CLUSTER_AUTHORIZATION_FAILED, -1, -1)
    return answer(version, errors.NONE, broker.rng.getrandbits(ID_BITS), 0)
