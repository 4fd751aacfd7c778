"""Kafka's DescribeConfigs, IncrementalAlterConfigs, AlterConfigs and CreatePartitions on the listener: a
topic's settings read and changed through the broker's own topic change (what ``PATCH /v1/topics/{topic}``
calls), each resource's outcome answered with Kafka's codes. They serve ``kafka-topics.sh --describe`` and
``--alter --partitions``, ``kafka-configs.sh`` and the admin clients' ``describeConfigs``,
``incrementalAlterConfigs``, the legacy ``alterConfigs`` and ``createPartitions``.

A topic's configs are those of ``topics.CONFIGS`` (Kafka's names for ring's settings). Each is answered with
its source: set for the topic when it differs from ring's default, else the default. ``segment.bytes`` is
read-only (fixed when the topic is created) and ``cleanup.policy`` is ``delete`` alone. Changing a config is
a change of the topic's settings gossiped to every broker; deleting one sets ring's default again; APPEND and
SUBTRACT apply to the one list config, ``cleanup.policy``, and only leave it ``delete``. The legacy AlterConfigs
replaces the whole set: what it does not name goes back to ring's default (``segment.bytes`` aside). A broker resource
(this broker's node id, or the empty name for the cluster's defaults) describes the defaults topics are
created with, read-only: ring's broker settings are fixed when ``ring serve`` starts. CreatePartitions grows
a topic's partition count as ``PATCH`` does; a count no higher than today's is INVALID_PARTITIONS, a manual
assignment INVALID_REPLICA_ASSIGNMENT (ring places partitions on its token ring). ``validate_only`` checks
everything a change checks and changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ring import auth, limits
from ring.catalog import (CONSISTENCY_DEFAULT, REPLICATION_FACTOR_DEFAULT, TopicConfig, check_not_internal,
                          validate_topic_name)
from ring.errors import BadRequest, RingError
from ring.kafka_api import access, errors
from ring.kafka_api import topic_codec as tc
from ring.kafka_api.cluster import node_id
from ring.kafka_api.topics import CONFIGS, InvalidConfig, consistency_for, each_topic_once, failure
from ring.kafka_api.wire import Reader
from ring.replication.protocol import needed_acks

BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7  # Kafka's ConfigType

# Kafka's topic config -> (its type, read-only here, what it does in ring).
_ABOUT: dict[str, tuple[int, bool, str]] = {
    "retention.ms": (LONG, False, "How long a record is kept before retention may delete its segment; -1 keeps "
                                  "records forever."),
    "retention.bytes": (LONG, False, "The bytes a partition keeps before retention deletes its oldest segments; "
                                     "-1: no size limit."),
    "segment.bytes": (INT, True, "The size at which a partition's log starts a new segment; fixed when the topic "
                                 "is created."),
    "compression.type": (STRING, False, "How ring stores the records it is sent: uncompressed, zstd or lz4."),
    "unclean.leader.election.enable": (BOOLEAN, False, "Whether a partition whose voters holding what was "
                                                       "acknowledged are gone elects its most up-to-date live "
                                                       "replica anyway."),
    "cleanup.policy": (LIST, False, "delete: ring keeps no compacted topics."),
    "min.insync.replicas": (INT, False, "The replicas that hold a record before acks=all is answered: the "
                                        "topic's consistency level (one, quorum or all)."),
}
assert set(_ABOUT) == set(CONFIGS)
_DEFAULT = TopicConfig("-")  # ring's default settings


def _placed(broker: Any, cfg: TopicConfig) -> TopicConfig:
    """``cfg`` with the replication factor its partitions have today (no more than the brokers placed)."""
    return dataclasses.replace(cfg, replication_factor=min(cfg.replication_factor, broker.brokers_placed()))


def _entry(name: str, value: str, source: int, documentation: bool) -> tc.ConfigEntry:
    kind, read_only, about = _ABOUT[name]
    return tc.ConfigEntry(name, value, read_only, source, kind, about if documentation else None)


def topic_configs(broker: Any, cfg: TopicConfig, keys: list[str] | None, documentation: bool) -> list[tc.ConfigEntry]:
    """The topic's configs as Kafka names them (those of ``keys``, when given), each with its source."""
    placed = _placed(broker, cfg)
    out = []
    for name, (setting, _, show) in CONFIGS.items():
        if keys is not None and name not in keys:
            continue
        own = bool(setting) and getattr(cfg, setting) != getattr(_DEFAULT, setting)
        out.append(_entry(name, show(placed), tc.CONFIG_SOURCE_TOPIC if own else tc.CONFIG_SOURCE_DEFAULT,
                          documentation))
    return out


def broker_configs(broker: Any, keys: list[str] | None, documentation: bool) -> list[tc.ConfigEntry]:
    """The settings topics are created with, and this broker's id, read-only."""
    default, static = tc.CONFIG_SOURCE_DEFAULT, tc.CONFIG_SOURCE_STATIC_BROKER
    auto_create = broker.config.auto_create
    rows = [
        ("broker.id", str(node_id(broker.config.name)), static, INT, "This broker's node id (from its name)."),
        ("num.partitions", str(limits.TOPIC_PARTITIONS_DEFAULT), default, INT, "A new topic's partitions."),
        ("default.replication.factor", str(REPLICATION_FACTOR_DEFAULT), default, INT, "A new topic's replicas."),
        ("auto.create.topics.enable", str(auto_create).lower(), default if auto_create else static, BOOLEAN,
         "Whether a produce or a Metadata request creates a topic that does not exist (ring serve "
         "--no-auto-create turns it off)."),
        ("min.insync.replicas", str(needed_acks(CONSISTENCY_DEFAULT, REPLICATION_FACTOR_DEFAULT)), default, INT,
         "A new topic's consistency: a quorum of its replicas."),
        ("log.retention.ms", str(_DEFAULT.retention_ms), default, LONG, "A new topic's retention.ms."),
        ("log.retention.bytes", str(_DEFAULT.retention_bytes), default, LONG, "A new topic's retention.bytes."),
        ("log.segment.bytes", str(_DEFAULT.segment_bytes), default, INT, "A new topic's segment.bytes."),
        ("compression.type", "uncompressed", default, STRING, "A new topic's compression.type."),
        ("unclean.leader.election.enable", "false", default, BOOLEAN, "A new topic's unclean.leader.election.enable."),
    ]
    return [tc.ConfigEntry(name, value, True, source, kind, about if documentation else None)
            for name, value, source, kind, about in rows if keys is None or name in keys]


def _unsupported(kind: int) -> tuple[int, str]:
    return errors.INVALID_REQUEST, (f"resource type {kind} is not served: ring has topic configs (2) and its "
                                    "brokers' defaults (4)")


def _describe_one(broker: Any, who: access.Who, res: tc.ConfigsAsked, documentation: bool) -> tc.ConfigsDescribed:
    def failed(code: int, message: str) -> tc.ConfigsDescribed:
        return tc.ConfigsDescribed(res.resource_type, res.name, code, message[:500], [])

    if res.resource_type == tc.RESOURCE_BROKER:
        mine = str(node_id(broker.config.name))
        if res.name not in ("", mine):
            return failed(errors.INVALID_REQUEST, f"this is broker {mine}: ask it for its own configs ({res.name!r} "
                                                  "named another), or give an empty name for the defaults")
        return tc.ConfigsDescribed(res.resource_type, res.name, errors.NONE, None,
                                   broker_configs(broker, res.keys, documentation))
    if res.resource_type != tc.RESOURCE_TOPIC:
        return failed(*_unsupported(res.resource_type))
    refused = access.describe_refused(who, res.name)
    if refused is not None:
        return failed(errors.TOPIC_AUTHORIZATION_FAILED, refused.message)
    try:
        cfg = broker.catalog.get(validate_topic_name(res.name))
    except RingError as exc:
        return failed(*failure(exc))  # (an unknown topic: UNKNOWN_TOPIC_OR_PARTITION)
    return tc.ConfigsDescribed(res.resource_type, res.name, errors.NONE, None,
                               topic_configs(broker, cfg, res.keys, documentation))


def describe_configs(broker: Any, version: int, r: Reader) -> bytes:
    req = tc.read_describe_configs(version, r)
    who = access.principal()
    most = limits.KAFKA_TOPICS_PER_REQUEST_MAX
    results = [_describe_one(broker, who, res, req.include_documentation) for res in req.resources[:most]]
    results += [tc.ConfigsDescribed(res.resource_type, res.name, errors.INVALID_REQUEST,
                                    f"at most {most} resources a request", []) for res in req.resources[most:]]
    return tc.describe_configs_answer(version, results, req.include_synonyms)


# --- IncrementalAlterConfigs -------------------------------------------------------------------


def _change(broker: Any, cfg: TopicConfig, configs: list[tuple[str, int, str | None]]) -> dict[str, Any]:
    """The body of ring's topic change that Kafka's operations on ``cfg`` ask for; InvalidConfig or BadRequest
    (its ``field`` Kafka's config) for one ring cannot take."""
    named = Counter(name for name, _, _ in configs)
    body: dict[str, Any] = {}
    for name, op, value in configs:
        if named[name] > 1:
            raise BadRequest(f"{name[:80]} is named more than once", field=name)
        if name not in CONFIGS:
            raise InvalidConfig(f"unknown or unsupported topic config {name[:80]!r}: ring takes "
                                f"{', '.join(CONFIGS)}", field=name)
        setting, parse, _ = CONFIGS[name]
        if op in (tc.OP_APPEND, tc.OP_SUBTRACT):
            if name != "cleanup.policy":
                raise InvalidConfig(f"{name} is not a list: only SET and DELETE apply to it", field=name)
            if op == tc.OP_APPEND and value is not None:
                for policy in value.split(","):
                    parse(name, policy.strip())  # (only 'delete', which it is already)
            elif op == tc.OP_SUBTRACT and value is not None and "delete" in (v.strip() for v in value.split(",")):
                raise InvalidConfig("cleanup.policy cannot lose 'delete': ring keeps no compacted topics", field=name)
            continue
        if op == tc.OP_DELETE:
            if setting:
                body[setting] = getattr(_DEFAULT, setting)
            continue
        if op != tc.OP_SET:
            raise BadRequest(f"config operation {op} is not one of SET (0), DELETE (1), APPEND (2), SUBTRACT (3)",
                             field=name)
        if value is None:
            raise BadRequest(f"a null value for {name}: DELETE sets the default", field=name)
        parsed = parse(name, value)
        if setting == "consistency":
            parsed = consistency_for(parsed, _placed(broker, cfg).replication_factor)
        if setting:
            body[setting] = parsed
    return body


def _replacing(cfg: TopicConfig, configs: list[tuple[str, int, str | None]]) -> list[tuple[str, int, str | None]]:
    """The legacy AlterConfigs' request as IncrementalAlterConfigs' operations: it replaces the topic's whole
    config set, so each config it names is set (a null: the default) and every other goes back to ring's
    default; ``segment.bytes``, fixed when the topic was created, stays (named with its value, it is no
    change)."""
    named = {name for name, _, _ in configs}
    ops = [(name, tc.OP_DELETE if value is None else tc.OP_SET, value) for name, _, value in configs
           if not (name == "segment.bytes" and value == str(cfg.segment_bytes))]
    return ops + [(name, tc.OP_DELETE, None) for name in CONFIGS if name not in named and name != "segment.bytes"]


async def _alter_one(broker: Any, who: access.Who, res: tc.ConfigsAltered, validate_only: bool,
                     legacy: bool) -> tuple[int, str, int, str | None]:
    def failed(code: int, message: str) -> tuple[int, str, int, str | None]:
        return res.resource_type, res.name, code, message[:500]

    if res.resource_type == tc.RESOURCE_BROKER:
        return failed(errors.INVALID_REQUEST, "ring's broker settings are fixed when ring serve starts: change a "
                                              "topic's configs instead")
    if res.resource_type != tc.RESOURCE_TOPIC:
        return failed(*_unsupported(res.resource_type))
    refused = access.refused(who, auth.ADMIN, res.name)
    if refused is not None:
        return failed(errors.TOPIC_AUTHORIZATION_FAILED, refused.message)
    try:
        check_not_internal(validate_topic_name(res.name), "change")
        cfg = broker.catalog.get(res.name)
        body = _change(broker, cfg, _replacing(cfg, res.configs) if legacy else res.configs)
        if validate_only:
            if body:
                cfg.changed(body)
        elif body:
            await broker.change_topic(res.name, body)
    except RingError as exc:
        return failed(*failure(exc))
    return res.resource_type, res.name, errors.NONE, None


def incremental_alter_configs(broker: Any, version: int, r: Reader, api_key: int = tc.INCREMENTAL_ALTER_CONFIGS
                              ) -> Any:
    req = tc.read_incremental_alter_configs(version, r, api_key)
    who = access.principal()
    legacy = api_key == tc.ALTER_CONFIGS

    async def answer() -> bytes:
        most = limits.KAFKA_TOPICS_PER_REQUEST_MAX
        named = Counter((res.resource_type, res.name) for res in req.resources)
        results = []
        for i, res in enumerate(req.resources):
            if i >= most:
                results.append((res.resource_type, res.name, errors.INVALID_REQUEST,
                                f"at most {most} resources a request"))
            elif named[res.resource_type, res.name] > 1:
                results.append((res.resource_type, res.name, errors.INVALID_REQUEST,
                                "the resource is named more than once"))
            else:
                results.append(await _alter_one(broker, who, res, req.validate_only, legacy))
        return tc.alter_configs_answer(version, results, api_key)
    return answer()


def alter_configs(broker: Any, version: int, r: Reader) -> Any:
    """The legacy AlterConfigs: a topic's whole config set replaced (``_replacing``)."""
    return incremental_alter_configs(broker, version, r, tc.ALTER_CONFIGS)


# --- CreatePartitions --------------------------------------------------------------------------


async def _grow_one(broker: Any, who: access.Who, t: tc.NewPartitions, validate_only: bool) -> tuple[int, str | None]:
    refused = access.refused(who, auth.ADMIN, t.name)
    if refused is not None:
        return errors.TOPIC_AUTHORIZATION_FAILED, refused.message[:500]
    if t.assignments is not None:
        return errors.INVALID_REPLICA_ASSIGNMENT, ("manual replica assignments are not taken: ring places each "
                                                   "partition on its token ring (give the count alone)")
    try:
        check_not_internal(validate_topic_name(t.name), "change")
        cfg = broker.catalog.get(t.name)
        if t.count <= cfg.partitions:
            return errors.INVALID_PARTITIONS, (f"topic {t.name!r} has {cfg.partitions} partitions: the count can "
                                               f"grow, never shrink or stay (asked for {t.count})")[:500]
        body = {"partitions": t.count}
        if validate_only:
            cfg.changed(body)
        else:
            await broker.change_topic(t.name, body)
    except RingError as exc:
        return failure(exc)
    return errors.NONE, None


def create_partitions(broker: Any, version: int, r: Reader) -> Any:
    req = tc.read_create_partitions(version, r)
    who = access.principal()

    async def grow(t: tc.NewPartitions) -> tuple[str, int, str | None]:
        return (t.name, *await _grow_one(broker, who, t, req.validate_only))

    async def answer() -> bytes:
        results = await each_topic_once(req.topics, lambda t: t.name, grow,
                                        lambda t, code, message: (t.name, code, message))
        return tc.create_partitions_answer(version, results)
    return answer()


HANDLERS = {tc.DESCRIBE_CONFIGS: describe_configs, tc.INCREMENTAL_ALTER_CONFIGS: incremental_alter_configs,
            tc.ALTER_CONFIGS: alter_configs, tc.CREATE_PARTITIONS: create_partitions}
