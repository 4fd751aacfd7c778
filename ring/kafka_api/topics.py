"""Kafka's CreateTopics and DeleteTopics on the listener: each request parsed (``topic_codec``), carried out by
the broker's own topic create and delete (what ``POST /v1/topics`` and ``DELETE /v1/topics/{topic}`` call),
and each topic's outcome answered with Kafka's codes.

ring has no controller: the broker that receives the request carries it out, as it would over HTTP, and
gossip takes the change to the others (Metadata names the receiving broker as the controller). A new topic
is a ``TopicConfig`` built by ``TopicConfig.from_request`` from what Kafka's request says, so the same checks
refuse the same settings; Kafka's topic configs map to ring's settings by ``CONFIGS``, and any other is
refused INVALID_CONFIG naming it. A manual replica assignment is refused: ring places partitions on its
token ring. ``validate_only`` checks everything a create checks, the topic's absence too, and changes
nothing. ``timeout_ms`` bounds the wait for the new partitions' leaders (0: answered once the topic is
created, as Kafka answers once creation is triggered).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Awaitable, Callable, TypeVar

from ring import auth, limits
from ring.catalog import INTERNAL_TOPICS, TopicConfig, check_not_internal, check_replicas_placeable, validate_topic_name
from ring.errors import BadRequest, Conflict, InvalidTopicName, RingError, Unavailable
from ring.kafka_api import access, errors
from ring.kafka_api import topic_codec as tc
from ring.kafka_api.wire import Reader
from ring.offsets import is_integer
from ring.replication.protocol import needed_acks

T = TypeVar("T")
A = TypeVar("A")


class InvalidConfig(BadRequest):
    """A Kafka topic config ring does not have, or a value it cannot take."""

    code = "invalid_config"


def _integer(name: str, value: str) -> int:
    if not is_integer(value) or len(value) > 20:
        raise InvalidConfig(f"{name} must be an integer, not {value[:40]!r}", field=name)
    return int(value)


def _boolean(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise InvalidConfig(f"{name} must be true or false, not {value[:40]!r}", field=name)
    return value.lower() == "true"


_COMPRESSIONS = {"uncompressed": "none", "zstd": "zstd", "lz4": "lz4"}


def _compression(name: str, value: str) -> str:
    if value not in _COMPRESSIONS:
        raise InvalidConfig(f"{name} {value[:40]!r} is not one ring stores: {', '.join(_COMPRESSIONS)} "
                            "(what a producer sends in any of Kafka's codecs is stored so)", field=name)
    return _COMPRESSIONS[value]


def _cleanup_policy(name: str, value: str) -> None:
    if value != "delete":
        raise InvalidConfig(f"{name} {value[:40]!r}: ring keeps no compacted topics, only 'delete'", field=name)


def consistency_for(min_insync: int, rf: int) -> str:
    """The consistency level that has ``min_insync`` of ``rf`` replicas hold a record before acks=all is
    answered: 1 is ``one``, a majority ``quorum``, every replica ``all``; any other count has no level."""
    for level in ("one", "quorum", "all"):
        if needed_acks(level, rf) == min_insync:
            return level
    raise InvalidConfig(f"min.insync.replicas={min_insync} on {rf} replica{'s' if rf != 1 else ''}: ring's "
                        f"consistency levels have 1 (one), {needed_acks('quorum', rf)} (quorum) or {rf} (all) "
                        "replicas hold a record before acks=all is answered", field="min.insync.replicas")


# Kafka's topic config -> (ring's setting, the value's parser, ring's value -> Kafka's). cleanup.policy
# has no setting: "delete" is what ring does. min.insync.replicas is the topic's consistency (what acks=all
# waits for), as a count of the replicas (those the ring places today) that must hold a record.
CONFIGS: dict[str, tuple[str, Callable[[str, str], Any], Callable[[TopicConfig], str]]] = {
    "retention.ms": ("retention_ms", _integer, lambda c: str(c.retention_ms)),
    "retention.bytes": ("retention_bytes", _integer, lambda c: str(c.retention_bytes)),
    "segment.bytes": ("segment_bytes", _integer, lambda c: str(c.segment_bytes)),
    "compression.type": ("compression", _compression,
                         lambda c: "uncompressed" if c.compression == "none" else c.compression),
    "unclean.leader.election.enable": ("unclean_leader_election", _boolean,
                                       lambda c: str(c.unclean_leader_election).lower()),
    "cleanup.policy": ("", _cleanup_policy, lambda c: "delete"),
    "min.insync.replicas": ("consistency", _integer,  # a count; ``topic_config`` maps it to a level
                            lambda c: str(needed_acks(c.consistency, c.replication_factor))),
}
_KAFKA_NAME = {setting: name for name, (setting, _, _) in CONFIGS.items() if setting}


def topic_config(broker: Any, t: tc.NewTopic) -> TopicConfig:
    """The config of a topic Kafka's request asks for, checked as ``POST /v1/topics`` checks its body;
    ``BadRequest`` (its ``field`` ring's setting) or ``InvalidConfig`` (its ``field`` Kafka's config) else."""
    if t.assignments:
        raise BadRequest("manual replica assignments are not taken: ring places each partition on its token "
                         "ring (give num_partitions and replication_factor, or -1 for the defaults)")
    body: dict[str, Any] = {"name": t.name}
    if t.partitions != -1:  # -1: the broker's default
        body["partitions"] = t.partitions
    if t.replication_factor != -1:
        body["replication_factor"] = t.replication_factor
    for name, value in t.configs:
        if name not in CONFIGS:
            raise InvalidConfig(f"unknown or unsupported topic config {name[:80]!r}: ring takes "
                                f"{', '.join(CONFIGS)}", field=name)
        setting, parse, _ = CONFIGS[name]
        if value is None:  # Kafka's null: the default
            continue
        if setting in body:
            raise InvalidConfig(f"{name} is given twice", field=name)
        parsed = parse(name, value)
        if setting:
            body[setting] = parsed
    min_insync = body.pop("consistency", None)
    cfg = TopicConfig.from_request(body, now_ms=broker.clock.wall_ms())
    check_not_internal(cfg.name, "create")
    if "replication_factor" in body:
        check_replicas_placeable(cfg, broker.brokers_placed())
    if min_insync is not None:
        rf = min(cfg.replication_factor, broker.brokers_placed())
        cfg = dataclasses.replace(cfg, consistency=consistency_for(min_insync, rf))
    return cfg


def failure(exc: RingError) -> tuple[int, str]:
    """Kafka's code and message for what refused a topic's create, change or delete."""
    field = exc.extra.get("field")
    internal = isinstance(exc, BadRequest) and exc.extra.get("topic") in INTERNAL_TOPICS  # check_not_internal's
    if isinstance(exc, InvalidConfig):
        code = errors.INVALID_CONFIG
    elif isinstance(exc, InvalidTopicName) or internal:
        code = errors.INVALID_TOPIC_EXCEPTION
    elif isinstance(exc, BadRequest) and field == "partitions":
        code = errors.INVALID_PARTITIONS
    elif isinstance(exc, BadRequest) and field == "replication_factor":
        code = errors.INVALID_REPLICATION_FACTOR
    elif isinstance(exc, BadRequest) and field in _KAFKA_NAME:  # a config's value out of ring's range
        return errors.INVALID_CONFIG, f"{_KAFKA_NAME[field]}: {exc.message}"[:500]
    elif isinstance(exc, BadRequest):
        code = errors.INVALID_REQUEST
    elif isinstance(exc, Conflict):  # the name taken, or the cluster at TOPICS_MAX
        code = errors.TOPIC_ALREADY_EXISTS if "topic" in exc.extra else errors.POLICY_VIOLATION
    elif isinstance(exc, Unavailable):  # not joined yet, the name's old topic still being deleted: retry
        code = errors.REQUEST_TIMED_OUT
    else:
        code = errors.code_of(exc)
    return code, exc.message[:500]


def _created(broker: Any, cfg: TopicConfig, given: set[str]) -> tc.TopicCreated:
    placed = dataclasses.replace(cfg, replication_factor=min(cfg.replication_factor, broker.brokers_placed()))
    return tc.TopicCreated(cfg.name, errors.NONE, None, tc.topic_id_bytes(cfg.id), cfg.partitions,
                           placed.replication_factor,
                           [(name, show(placed), name in given) for name, (_, _, show) in CONFIGS.items()])


async def _create_one(broker: Any, t: tc.NewTopic, validate_only: bool, deadline: float) -> tc.TopicCreated:
    try:
        cfg = topic_config(broker, t)
        if validate_only:
            if cfg.name in broker.catalog or cfg.name in broker.membership.topics():
                raise Conflict(f"topic {cfg.name!r} already exists", topic=cfg.name)
            if len(broker.catalog) >= limits.TOPICS_MAX:
                raise Conflict(f"the cluster already holds the maximum of {limits.TOPICS_MAX} topics")
            return _created(broker, cfg, {name for name, _ in t.configs})._replace(topic_id=tc.NO_TOPIC_ID)
        wait_ms = int(min(max(0.0, deadline - broker.clock.monotonic()) * 1000, limits.LEADER_WAIT_MS))
        await broker.add_topic(cfg, leaders_wait_ms=wait_ms)
        cfg = broker.catalog.get(cfg.name)  # as created: its id
    except RingError as exc:
        code, message = failure(exc)
        return tc.TopicCreated(t.name, code, message)
    return _created(broker, cfg, {name for name, _ in t.configs})


def create_topics(broker: Any, version: int, r: Reader) -> Any:
    req = tc.read_create_topics(version, r)
    refused = access.refusals(access.principal(), auth.ADMIN, (t.name for t in req.topics))

    async def answer() -> bytes:
        deadline = broker.clock.monotonic() + max(0, req.timeout_ms) / 1000

        async def create(t: tc.NewTopic) -> tc.TopicCreated:
            if t.name in refused:
                return tc.TopicCreated(t.name, errors.TOPIC_AUTHORIZATION_FAILED, refused[t.name].message)
            return await _create_one(broker, t, req.validate_only, deadline)

        results = await each_topic_once(req.topics, lambda t: t.name, create,
                                        lambda t, code, message: tc.TopicCreated(t.name, code, message))
        return tc.create_topics_answer(version, results)
    return answer()


async def each_topic_once(items: list[T], name_of: Callable[[T], str], serve: Callable[[T], Awaitable[A]],
                          refuse: Callable[[T, int, str], A]) -> list[A]:
    """A topic admin request's answers, one per topic name, in the request's order: ``serve``'s, but for a
    topic past ``KAFKA_TOPICS_PER_REQUEST_MAX`` or named more than once, INVALID_REQUEST (``refuse``)."""
    most = limits.KAFKA_TOPICS_PER_REQUEST_MAX
    named = Counter(name_of(item) for item in items)
    out: list[A] = []
    answered: set[str] = set()
    for i, item in enumerate(items):
        name = name_of(item)
        if name in answered:
            continue
        answered.add(name)
        if i >= most:
            out.append(refuse(item, errors.INVALID_REQUEST, f"at most {most} topics a request"))
        elif named[name] > 1:
            out.append(refuse(item, errors.INVALID_REQUEST, "the topic is named more than once"))
        else:
            out.append(await serve(item))
    return out


# --- DeleteTopics ------------------------------------------------------------------------------


def _named(broker: Any, name: str | None, topic_id: bytes) -> str | None:
    """The topic a DeleteTopics entry names, by its name or (v6) its id; None for an id no topic has."""
    if name:
        return name
    return next((cfg.name for cfg in broker.catalog if tc.topic_id_bytes(cfg.id) == topic_id), None)


async def _delete_one(broker: Any, name: str | None, topic_id: bytes, by_id: bool) -> tc.TopicDeleted:
    """Delete topic ``name``; ``by_id``: only while it is still the topic of ``topic_id`` (one deleted and
    created again meanwhile is another topic)."""
    if name is None:
        return tc.TopicDeleted(None, topic_id, errors.UNKNOWN_TOPIC_ID, "no topic has this id")
    try:
        check_not_internal(validate_topic_name(name), "delete")
        now_id = tc.topic_id_bytes(broker.catalog.get(name).id)
        if by_id and now_id != topic_id:
            return tc.TopicDeleted(None, topic_id, errors.UNKNOWN_TOPIC_ID, "no topic has this id")
        topic_id = now_id
        await broker.delete_topic(name)
    except RingError as exc:
        code, message = failure(exc)
        return tc.TopicDeleted(name, topic_id, code, message)
    return tc.TopicDeleted(name, topic_id, errors.NONE, None)


def _refused(who: access.Who, given: str | None, name: str, topic_id: bytes) -> tc.TopicDeleted:
    """A delete the client may not make; a topic it named by id keeps its name from a client that may not
    describe it."""
    if given or access.describe_refused(who, name) is None:
        return tc.TopicDeleted(name, topic_id, errors.TOPIC_AUTHORIZATION_FAILED, f"admin on {name!r} is needed"[:500])
    return tc.TopicDeleted(None, topic_id, errors.TOPIC_AUTHORIZATION_FAILED, "admin on the topic is needed")


def delete_topics(broker: Any, version: int, r: Reader) -> Any:
    req = tc.read_delete_topics(version, r)
    most = limits.KAFKA_TOPICS_PER_REQUEST_MAX
    who = access.principal()
    named = [(given, _named(broker, given, topic_id), topic_id) for given, topic_id in req.topics[:most]]
    refused = access.refusals(who, auth.ADMIN, (name for _, name, _ in named if name is not None))

    async def answer() -> bytes:
        # (timeout_ms is not needed: a delete is answered once it is gossiped, which does not wait on leaders)
        results = [_refused(who, given, name, topic_id) if name in refused
                   else await _delete_one(broker, name, topic_id, not given) for given, name, topic_id in named]
        results += [tc.TopicDeleted(name, topic_id, errors.INVALID_REQUEST, f"at most {most} topics a request")
                    for name, topic_id in req.topics[most:]]
        return tc.delete_topics_answer(version, results)
    return answer()


HANDLERS = {tc.CREATE_TOPICS: create_topics, tc.DELETE_TOPICS: delete_topics}
