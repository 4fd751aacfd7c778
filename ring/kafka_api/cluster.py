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

from ring.catalog import INTERNAL_TOPICS, validate_topic_name, with_defaults
from ring.errors import Conflict, RingError
from ring.kafka_api import errors
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


async def metadata(broker: Any, version: int, r: Reader) -> bytes:
    topics = r.array(Reader.string)
    auto_create = r.boolean() if version >= 4 else True
    # (v8's include_*_authorized_operations are not read: no operations are answered)
    brokers = kafka_brokers(broker)
    names = [cfg.name for cfg in broker.catalog] if topics is None else topics
    if topics is not None and auto_create and broker.config.auto_create:
        await _create_missing(broker, topics)
    w = Writer()
    if version >= 3:
        w.int32(0)  # throttle_time_ms
    w.array_len(len(brokers))
    for name, (host, port) in sorted(brokers.items()):
        w.int32(node_id(name)).string(host).int32(port).nullable_string(None)  # rack
    if version >= 2:
        w.nullable_string(CLUSTER_ID)
    w.int32(node_id(broker.config.name))  # controller_id: none is needed; this broker is as good as any
    w.array_len(len(names))
    for name in names:
        _topic(broker, version, w, name, brokers)
    if version >= 8:
        w.int32(-2**31)  # cluster_authorized_operations: not asked for
    return bytes(w.buf)


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


def _topic(broker: Any, version: int, w: Writer, name: str, brokers: dict[str, tuple[str, int]]) -> None:
    try:
        validate_topic_name(name)
        cfg = broker.catalog.get(name)
    except RingError as exc:
        w.int16(errors.code_of(exc)).string(name).boolean(False).array_len(0)
        if version >= 8:
            w.int32(-2**31)
        return
    w.int16(errors.NONE).string(name).boolean(name in INTERNAL_TOPICS)
    w.array_len(cfg.partitions)
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
        _ids(w, replicas)
        _ids(w, up)  # isr: the replicas alive and listening
        if version >= 5:
            _ids(w, [n for n in replicas if n not in brokers])  # offline_replicas
    if version >= 8:
        w.int32(-2**31)  # topic_authorized_operations: not asked for


def _ids(w: Writer, names: list[str]) -> None:
    w.array_len(len(names))
    for n in names:
        w.int32(node_id(n))
