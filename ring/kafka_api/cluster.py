"""Metadata: the brokers with a Kafka listener, and each topic's partitions with leader, replicas and
in-sync replicas, by ring's placement and the leaders gossip names.

Kafka names brokers by int32 node ids; ring by names. A broker's node id is a pure function of its
name (``node_id``), so every broker answers the same ids without agreeing on anything. Each broker
gossips the address of its Kafka listener (``KAFKA_EXTRA`` in its gossip entry); the brokers listed
are the live ones that gossip one. A partition whose leader is unknown, or has no Kafka listener,
is answered LEADER_NOT_AVAILABLE, and the client asks again.

Each partition's leader epoch is the one this broker knows (``broker.leader_epoch_of``: its own
replica's, else the leader's claim in gossip); a client checks its position with OffsetForLeaderEpoch
(``epochs.py``) when it changes, and names it as ``current_leader_epoch`` in Fetch and ListOffsets.
"""

from __future__ import annotations

import zlib
from typing import Any

from ring import auth
from ring.catalog import INTERNAL_TOPICS, validate_topic_name, with_defaults
from ring.errors import Conflict, RingError
from ring.kafka_api import access, errors
from ring.kafka_api.wire import Reader, Writer

KAFKA_EXTRA = "kafka"  # the gossip extra holding a broker's advertised Kafka HOST:PORT
CLUSTER_ID = "ring"


def node_id(name: str) -> int:
    """A broker's Kafka node id: the CRC-32 of its name, in 31 bits (ids are non-negative int32)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def kafka_brokers(broker: Any) -> dict[str, tuple[str, int]]:
    """Name -> (host, port) of every live broker that gossips a Kafka listener."""
    out = {}
    for name, addr in broker.membership.gossiped(KAFKA_EXTRA).items():
        host, _, port = str(addr).rpartition(":")
        if host and port.isdigit():
            out[name] = (host.strip("[]"), int(port))
    return out


FLEXIBLE_FROM = 9  # Metadata v9: compact strings and arrays, tagged fields (librdkafka trusts epochs from v9 only)


def read_request(version: int, r: Reader) -> tuple[list[str] | None, bool]:
    """(the topics asked for, None for every one; whether a missing one may be created) of a request body.
    (v8's include_*_authorized_operations are not used: no operations are answered.)"""
    if version < FLEXIBLE_FROM:
        topics = r.array(Reader.string)
        return topics, r.boolean() if version >= 4 else True

    def topic(r: Reader) -> str:
        name = r.compact_string()
        r.tagged_fields()
        return name

    topics = r.compact_array(topic)
    auto_create = r.boolean()
    r.boolean()  # include_cluster_authorized_operations
    r.boolean()  # include_topic_authorized_operations
    r.tagged_fields()
    return topics, auto_create


def metadata(broker: Any, version: int, r: Reader) -> Any:
    topics, auto_create = read_request(version, r)
    return _metadata(broker, version, topics, auto_create and broker.config.auto_create, access.principal())


async def _metadata(broker: Any, version: int, topics: list[str] | None, create: bool, who: access.Who) -> bytes:
    brokers = kafka_brokers(broker)
    names = [cfg.name for cfg in broker.catalog] if topics is None else topics
    refused = {} if topics is None or who is None else _refusals(broker, topics, who, create)
    if topics is not None and create:
        await _create_missing(broker, [t for t in topics if t not in refused])
    return answer(broker, version, brokers, names, refused)


def _refusals(broker: Any, topics: list[str], who: access.Who, create: bool) -> dict[str, RingError]:
    """The topics a request names that are answered TOPIC_AUTHORIZATION_FAILED (``access``): one the client
    holds no permission on, and one that would be created without produce on it."""
    out: dict[str, RingError] = {}
    for name in topics:
        no = access.describe_refused(who, name)
        if no is None and create and name not in broker.catalog and name not in INTERNAL_TOPICS:
            no = access.refused(who, auth.PRODUCE, name)
        if no is not None:
            out[name] = no
    return out


def answer(broker: Any, version: int, brokers: dict[str, tuple[str, int]], names: list[str],
           refused: dict[str, RingError] | None = None) -> bytes:
    """``refused``: the names answered with their refusal's code, not described."""
    flex = version >= FLEXIBLE_FROM
    w = Writer()
    if version >= 3:
        w.int32(0)  # throttle_time_ms
    _count(w, len(brokers), flex)
    for name, (host, port) in sorted(brokers.items()):
        w.int32(node_id(name))
        _text(w, host, flex).int32(port)
        _text(w, None, flex)  # rack
        if flex:
            w.tagged_fields()
    if version >= 2:
        _text(w, CLUSTER_ID, flex)
    w.int32(node_id(broker.config.name))  # controller_id: none is needed; this broker is as good as any
    _count(w, len(names), flex)
    for name in names:
        _topic(broker, version, w, name, brokers, refused.get(name) if refused else None)
    if version >= 8:
        w.int32(-2**31)  # cluster_authorized_operations: not asked for
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


def _count(w: Writer, n: int, flex: bool) -> Writer:
    return w.compact_array_len(n) if flex else w.array_len(n)


def _text(w: Writer, s: str | None, flex: bool) -> Writer:
    return w.compact_string(s) if flex else w.nullable_string(s)


async def _create_missing(broker: Any, topics: list[str]) -> None:
    """Kafka creates a topic a client asks metadata of when auto-creation is on; so does ring's produce."""
    for name in topics:
        if name in broker.catalog or name in INTERNAL_TOPICS:
            continue
        try:
            validate_topic_name(name)
            await broker.add_topic(with_defaults(name, broker.clock.wall_ms()))
        except Conflict:
            pass  # created meanwhile
        except RingError:
            pass  # answered with its topic below (invalid name, not joined yet: unknown)


def _topic(broker: Any, version: int, w: Writer, name: str, brokers: dict[str, tuple[str, int]],
           refused: RingError | None) -> None:
    flex = version >= FLEXIBLE_FROM
    try:
        if refused is not None:
            raise refused
        validate_topic_name(name)
        cfg = broker.catalog.get(name)
    except RingError as exc:
        w.int16(errors.code_of(exc))
        _text(w, name, flex).boolean(False)
        _count(w, 0, flex)
        if version >= 8:
            w.int32(-2**31)
        if flex:
            w.tagged_fields()
        return
    w.int16(errors.NONE)
    _text(w, name, flex).boolean(name in INTERNAL_TOPICS)
    _count(w, cfg.partitions, flex)
    for p in range(cfg.partitions):
        leader = broker.leader_of(name, p)
        replicas = list(broker.preference_list(cfg, p))
        if leader is not None and leader not in replicas:
            replicas.insert(0, leader)
        up = [n for n in replicas if n in brokers]
        known = leader is not None and leader in brokers
        w.int16(errors.NONE if known else errors.LEADER_NOT_AVAILABLE).int32(p)
        w.int32(node_id(leader) if known else -1)
        if version >= 7:
            w.int32(broker.leader_epoch_of(name, p) if known else -1)  # leader_epoch
        _ids(w, replicas, flex)
        _ids(w, up, flex)  # isr: the replicas alive and listening
        if version >= 5:
            _ids(w, [n for n in replicas if n not in brokers], flex)  # offline_replicas
        if flex:
            w.tagged_fields()
    if version >= 8:
        w.int32(-2**31)  # topic_authorized_operations: not asked for
    if flex:
        w.tagged_fields()


def _ids(w: Writer, names: list[str], flex: bool) -> None:
    _count(w, len(names), flex)
    for n in names:
        w.int32(node_id(n))
