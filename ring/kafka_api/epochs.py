"""OffsetForLeaderEpoch (v2-4), and the leader-epoch checks of Metadata's readers.

A client that read records of leader epoch E asks, after a leader change, where E ended in the new
leader's log (KIP-320); a position past that end was cut from the log with an old leader's
unacknowledged tail, and the client resets it. ring keeps the history a leader's log was written in
(``ring.log.checkpoint.LeaderEpochCache``), and ``broker.epoch_end`` answers from it on the partition's
leader (``ring.replication.reads.epoch_end``), as Kafka's ``LeaderEpochFileCache.endOffsetFor`` does: the
largest epoch at or below E with the start of the next, the log end for the latest, -1 and -1 for one
newer than the latest. A broker that does not lead answers NOT_LEADER_OR_FOLLOWER, and the client asks
the leader Metadata names.

Metadata answers each partition's leader epoch (``broker.leader_epoch_of``), and a request naming a
``current_leader_epoch`` (OffsetForLeaderEpoch, Fetch v9+, ListOffsets v4+; -1: no check) is refused
per partition with FENCED_LEADER_EPOCH when it is older than the epoch the answering broker knows and
UNKNOWN_LEADER_EPOCH when it is newer (``reads.check_leader_epoch``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ring import auth, limits
from ring.errors import BadRequest, RingError
from ring.kafka_api import access, errors
from ring.kafka_api.wire import Reader, Writer
from ring.offsets import EpochEnd
from ring.replication.reads import check_leader_epoch

OFFSET_FOR_LEADER_EPOCH = 23
VERSIONS = (2, 4)
FLEXIBLE_FROM = 4


class EpochEnded(NamedTuple):
    """One partition's answer: its error code, the epoch found and where it ended (-1, -1 for none)."""

    partition: int
    error: int
    leader_epoch: int
    end_offset: int


def read_request(version: int, r: Reader) -> list[tuple[str, list[tuple[int, int, int]]]]:
    """[(topic, [(partition, current_leader_epoch, leader_epoch)])] of a request body."""
    flex = version >= FLEXIBLE_FROM
    if version >= 3:
        r.int32()  # replica_id: -1 from consumers (a follower's asking is ring's own replication)

    def partition(r: Reader) -> tuple[int, int, int]:
        p, current, epoch = r.int32(), r.int32(), r.int32()
        if flex:
            r.tagged_fields()
        return p, current, epoch

    def topic(r: Reader) -> tuple[str, list[tuple[int, int, int]]]:
        name = r.compact_string() if flex else r.string()
        parts = (r.compact_array(partition) if flex else r.array(partition)) or []
        if flex:
            r.tagged_fields()
        return name, parts

    topics = (r.compact_array(topic) if flex else r.array(topic)) or []
    if flex:
        r.tagged_fields()
    return topics


def answer(version: int, topics: list[tuple[str, list[EpochEnded]]]) -> bytes:
    flex = version >= FLEXIBLE_FROM
    w = Writer().int32(0)  # throttle_time_ms
    w.compact_array_len(len(topics)) if flex else w.array_len(len(topics))
    for name, parts in topics:
        w.compact_string(name) if flex else w.string(name)
        w.compact_array_len(len(parts)) if flex else w.array_len(len(parts))
        for e in parts:
            w.int16(e.error).int32(e.partition).int32(e.leader_epoch).int64(e.end_offset)
            if flex:
                w.tagged_fields()
        if flex:
            w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


def ended(broker: Any, topic: str, partition: int, current: int, epoch: int) -> EpochEnded:
    try:
        found, end = broker.epoch_end(EpochEnd(topic, partition, current, epoch))
    except RingError as exc:
        return EpochEnded(partition, errors.code_of(exc), -1, -1)
    return EpochEnded(partition, errors.NONE, found, end)


def handle(broker: Any, version: int, r: Reader) -> bytes:
    topics = read_request(version, r)
    check_partition_count(topics, "OffsetForLeaderEpoch")
    refused = access.refusals(access.principal(), auth.CONSUME, (name for name, _ in topics))
    return answer(version, [(name, [EpochEnded(p, errors.code_of(refused[name]), -1, -1) if name in refused
                                    else ended(broker, name, p, current, epoch) for p, current, epoch in parts])
                            for name, parts in topics])


def check_partition_count(topics: list[tuple[str, list]], api: str) -> None:
    """A request naming more partitions than ``KAFKA_FETCH_PARTITIONS_MAX`` is refused whole, as a fetch is:
    each partition costs a lookup and an answer."""
    n = sum(len(parts) for _, parts in topics)
    if n > limits.KAFKA_FETCH_PARTITIONS_MAX:
        raise BadRequest(f"{api} of {n} partitions (at most {limits.KAFKA_FETCH_PARTITIONS_MAX})")


def check_current(broker: Any, topic: str, partition: int, current: int) -> None:
    """Fetch's and ListOffsets' check of the leader epoch a client names against the one this broker
    knows (and answers in Metadata). A partition this broker knows no epoch of (an unknown topic or
    partition, one without a leader yet) is not checked: the read itself answers what it finds."""
    known = broker.leader_epoch_of(topic, partition) if current >= 0 else -1
    if known >= 0:
        check_leader_epoch(topic, partition, current, known)
