"""The request and answer bodies of Kafka's topic admin APIs, at the versions served.

CreateTopics (v2-7, flexible from v5) and DeleteTopics (v1-6, flexible from v4): what Kafka 4.x
clients negotiate (Kafka 4.0 dropped CreateTopics v0-1 and DeleteTopics v0). CreateTopics v7 answers
each new topic's id and DeleteTopics v6 names topics by name or by id: a topic id is 16 bytes, ring's
``TopicConfig.id`` decoded (``topic_id_bytes``). CreatePartitions (v0-3, flexible from v2),
DescribeConfigs (v1-4, flexible from v4; Kafka 4.0 dropped v0), AlterConfigs (v0-2, flexible from v2)
and IncrementalAlterConfigs (v0-1, flexible from v1): every version Kafka 4.x clients send.

``read_*`` parse a request body into a plain value (``Reader`` raises ``Malformed`` at the first field
that does not fit the frame); ``*_answer`` build an answer body. No decision is made here: that is the
broker's, through the handlers (``topics``).
"""

from __future__ import annotations

import base64
from typing import Callable, NamedTuple, TypeVar

from ring.kafka_api.wire import Reader, Writer

T = TypeVar("T")

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37
DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
VERSIONS = {CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 6), CREATE_PARTITIONS: (0, 3), DESCRIBE_CONFIGS: (1, 4),
            ALTER_CONFIGS: (0, 2), INCREMENTAL_ALTER_CONFIGS: (0, 1)}
FLEXIBLE_FROM = {CREATE_TOPICS: 5, DELETE_TOPICS: 4, CREATE_PARTITIONS: 2, DESCRIBE_CONFIGS: 4, ALTER_CONFIGS: 2,
                 INCREMENTAL_ALTER_CONFIGS: 1}
NO_TOPIC_ID = bytes(16)  # Kafka's zero UUID: no id
# DescribeConfigs' sources: set for the topic, set when the broker started, a default.
CONFIG_SOURCE_TOPIC, CONFIG_SOURCE_STATIC_BROKER, CONFIG_SOURCE_DEFAULT = 1, 4, 5
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4  # the config APIs' resource types


def topic_id_bytes(topic_id: str) -> bytes:
    """The 16 bytes of ring's topic id (22 characters of unpadded base64url)."""
    raw = base64.urlsafe_b64decode(topic_id + "==")
    assert len(raw) == 16, topic_id
    return raw


def _array(r: Reader, flexible: bool, item: Callable[[Reader], T]) -> list[T]:
    """An array (compact in a flexible version); null reads as empty."""
    return (r.compact_array(item) if flexible else r.array(item)) or []


def _string(r: Reader, flexible: bool) -> str:
    return r.compact_string() if flexible else r.string()


def _nullable_string(r: Reader, flexible: bool) -> str | None:
    return r.compact_nullable_string() if flexible else r.nullable_string()


def _head(w: Writer, flexible: bool, n: int) -> Writer:
    return w.compact_array_len(n) if flexible else w.array_len(n)


def _put_string(w: Writer, flexible: bool, s: str | None) -> Writer:
    return w.compact_string(s) if flexible else w.nullable_string(s)


# --- CreateTopics ------------------------------------------------------------------------------


class NewTopic(NamedTuple):
    name: str
    partitions: int  # -1: the broker's default
    replication_factor: int  # -1: the broker's default
    assignments: list[tuple[int, list[int]]]  # (partition, broker ids): a manual placement
    configs: list[tuple[str, str | None]]  # (name, value) as Kafka names them


class CreateTopics(NamedTuple):
    topics: list[NewTopic]
    timeout_ms: int
    validate_only: bool


def read_create_topics(version: int, r: Reader) -> CreateTopics:
    flex = version >= FLEXIBLE_FROM[CREATE_TOPICS]

    def tagged(r: Reader) -> None:
        if flex:
            r.tagged_fields()

    def assignment(r: Reader) -> tuple[int, list[int]]:
        p, ids = r.int32(), _array(r, flex, Reader.int32)
        tagged(r)
        return p, ids

    def config(r: Reader) -> tuple[str, str | None]:
        name, value = _string(r, flex), _nullable_string(r, flex)
        tagged(r)
        return name, value

    def topic(r: Reader) -> NewTopic:
        name, partitions, rf = _string(r, flex), r.int32(), r.int16()
        t = NewTopic(name, partitions, rf, _array(r, flex, assignment), _array(r, flex, config))
        tagged(r)
        return t

    topics = _array(r, flex, topic)
    timeout_ms, validate_only = r.int32(), r.boolean()
    tagged(r)
    return CreateTopics(topics, timeout_ms, validate_only)


class TopicCreated(NamedTuple):
    """One topic's outcome: ``error`` 0 with the topic's settings, or an error and its message."""

    name: str
    error: int
    message: str | None
    topic_id: bytes = NO_TOPIC_ID
    partitions: int = -1
    replication_factor: int = -1
    configs: list[tuple[str, str, bool]] | None = None  # (name, value, set for this topic); None: not given


def create_topics_answer(version: int, topics: list[TopicCreated]) -> bytes:
    flex = version >= FLEXIBLE_FROM[CREATE_TOPICS]
    w = Writer().int32(0)  # throttle_time_ms
    _head(w, flex, len(topics))
    for t in topics:
        _put_string(w, flex, t.name)
        if version >= 7:
            w.raw(t.topic_id)
        w.int16(t.error)
        _put_string(w, flex, t.message)
        if not flex:
            continue
        w.int32(t.partitions).int16(t.replication_factor)
        if t.configs is None:
            w.compact_array_len(-1)
        else:
            w.compact_array_len(len(t.configs))
            for name, value, own in t.configs:
                w.compact_string(name).compact_string(value).boolean(False)  # read_only
                w.int8(CONFIG_SOURCE_TOPIC if own else CONFIG_SOURCE_DEFAULT).boolean(False).tagged_fields()
        w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


# --- DeleteTopics ------------------------------------------------------------------------------


class DeleteTopics(NamedTuple):
    topics: list[tuple[str | None, bytes]]  # (name, id): v6 names a topic by either (the other null or zero)
    timeout_ms: int


def read_delete_topics(version: int, r: Reader) -> DeleteTopics:
    flex = version >= FLEXIBLE_FROM[DELETE_TOPICS]
    if version >= 6:
        def state(r: Reader) -> tuple[str | None, bytes]:
            name, topic_id = r.compact_nullable_string(), r.uuid()
            r.tagged_fields()
            return name, topic_id
        topics = _array(r, flex, state)
    else:
        topics = [(name, NO_TOPIC_ID) for name in _array(r, flex, lambda r: _string(r, flex))]
    timeout_ms = r.int32()
    if flex:
        r.tagged_fields()
    return DeleteTopics(topics, timeout_ms)


class TopicDeleted(NamedTuple):
    name: str | None
    topic_id: bytes
    error: int
    message: str | None


def delete_topics_answer(version: int, topics: list[TopicDeleted]) -> bytes:
    flex = version >= FLEXIBLE_FROM[DELETE_TOPICS]
    w = Writer().int32(0)  # throttle_time_ms
    _head(w, flex, len(topics))
    for t in topics:
        if version >= 6:
            w.compact_string(t.name).raw(t.topic_id)
        else:
            _put_string(w, flex, t.name or "")
        w.int16(t.error)
        if version >= 5:
            w.compact_string(t.message)
        if flex:
            w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


# --- CreatePartitions --------------------------------------------------------------------------


class NewPartitions(NamedTuple):
    name: str
    count: int  # the partition count asked for
    assignments: list[list[int]] | None  # broker ids per new partition: a manual placement (None: none given)


class CreatePartitions(NamedTuple):
    topics: list[NewPartitions]
    timeout_ms: int
    validate_only: bool


def read_create_partitions(version: int, r: Reader) -> CreatePartitions:
    flex = version >= FLEXIBLE_FROM[CREATE_PARTITIONS]

    def assignment(r: Reader) -> list[int]:
        ids = _array(r, flex, Reader.int32)
        if flex:
            r.tagged_fields()
        return ids

    def topic(r: Reader) -> NewPartitions:
        name, count = _string(r, flex), r.int32()
        assignments = r.compact_array(assignment) if flex else r.array(assignment)
        if flex:
            r.tagged_fields()
        return NewPartitions(name, count, assignments)

    topics = _array(r, flex, topic)
    timeout_ms, validate_only = r.int32(), r.boolean()
    if flex:
        r.tagged_fields()
    return CreatePartitions(topics, timeout_ms, validate_only)


def create_partitions_answer(version: int, results: list[tuple[str, int, str | None]]) -> bytes:
    """``results``: (topic, error code, message) per topic."""
    flex = version >= FLEXIBLE_FROM[CREATE_PARTITIONS]
    w = Writer().int32(0)  # throttle_time_ms
    _head(w, flex, len(results))
    for name, error, message in results:
        _put_string(w, flex, name)
        w.int16(error)
        _put_string(w, flex, message)
        if flex:
            w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


# --- DescribeConfigs ---------------------------------------------------------------------------


class ConfigsAsked(NamedTuple):
    resource_type: int
    name: str
    keys: list[str] | None  # None: every config


class DescribeConfigs(NamedTuple):
    resources: list[ConfigsAsked]
    include_synonyms: bool
    include_documentation: bool


def read_describe_configs(version: int, r: Reader) -> DescribeConfigs:
    flex = version >= FLEXIBLE_FROM[DESCRIBE_CONFIGS]

    def resource(r: Reader) -> ConfigsAsked:
        kind, name = r.int8(), _string(r, flex)
        keys = (r.compact_array if flex else r.array)(lambda r: _string(r, flex))
        if flex:
            r.tagged_fields()
        return ConfigsAsked(kind, name, keys)

    resources = _array(r, flex, resource)
    synonyms = r.boolean()  # (v1+)
    documentation = r.boolean() if version >= 3 else False
    if flex:
        r.tagged_fields()
    return DescribeConfigs(resources, synonyms, documentation)


class ConfigEntry(NamedTuple):
    name: str
    value: str | None
    read_only: bool
    source: int  # CONFIG_SOURCE_*
    config_type: int  # Kafka's ConfigType: 1 boolean, 2 string, 3 int, 5 long, 7 list
    documentation: str | None


class ConfigsDescribed(NamedTuple):
    """One resource's outcome: ``error`` 0 with its configs, or an error and its message."""

    resource_type: int
    name: str
    error: int
    message: str | None
    configs: list[ConfigEntry]


def describe_configs_answer(version: int, results: list[ConfigsDescribed], include_synonyms: bool) -> bytes:
    flex = version >= FLEXIBLE_FROM[DESCRIBE_CONFIGS]
    w = Writer().int32(0)  # throttle_time_ms
    _head(w, flex, len(results))
    for res in results:
        w.int16(res.error)
        _put_string(w, flex, res.message)
        w.int8(res.resource_type)
        _put_string(w, flex, res.name)
        _head(w, flex, len(res.configs))
        for c in res.configs:
            _put_string(w, flex, c.name)
            _put_string(w, flex, c.value)
            w.boolean(c.read_only).int8(c.source).boolean(False)  # is_sensitive
            synonyms = [c] if include_synonyms else []
            _head(w, flex, len(synonyms))
            for s in synonyms:
                _put_string(w, flex, s.name)
                _put_string(w, flex, s.value)
                w.int8(s.source)
                if flex:
                    w.tagged_fields()
            if version >= 3:
                w.int8(c.config_type)
                _put_string(w, flex, c.documentation)
            if flex:
                w.tagged_fields()
        if flex:
            w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)


# --- IncrementalAlterConfigs -------------------------------------------------------------------

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


class ConfigsAltered(NamedTuple):
    resource_type: int
    name: str
    configs: list[tuple[str, int, str | None]]  # (config, operation, value)


class IncrementalAlterConfigs(NamedTuple):
    resources: list[ConfigsAltered]
    validate_only: bool


def read_incremental_alter_configs(version: int, r: Reader, api_key: int = INCREMENTAL_ALTER_CONFIGS
                                   ) -> IncrementalAlterConfigs:
    """IncrementalAlterConfigs' request; with ``api_key`` ALTER_CONFIGS, the legacy AlterConfigs' (the same
    but for the operation, which it has not: each config it names is read as SET)."""
    flex = version >= FLEXIBLE_FROM[api_key]
    legacy = api_key == ALTER_CONFIGS

    def config(r: Reader) -> tuple[str, int, str | None]:
        name = _string(r, flex)
        op = OP_SET if legacy else r.int8()
        value = _nullable_string(r, flex)
        if flex:
            r.tagged_fields()
        return name, op, value

    def resource(r: Reader) -> ConfigsAltered:
        kind, name = r.int8(), _string(r, flex)
        altered = ConfigsAltered(kind, name, _array(r, flex, config))
        if flex:
            r.tagged_fields()
        return altered

    resources = _array(r, flex, resource)
    validate_only = r.boolean()
    if flex:
        r.tagged_fields()
    return IncrementalAlterConfigs(resources, validate_only)


def alter_configs_answer(version: int, results: list[tuple[int, str, int, str | None]],
                         api_key: int = INCREMENTAL_ALTER_CONFIGS) -> bytes:
    """``results``: (resource type, resource name, error code, message) per resource (the answer of either
    AlterConfigs API, ``api_key``)."""
    flex = version >= FLEXIBLE_FROM[api_key]
    w = Writer().int32(0)  # throttle_time_ms
    _head(w, flex, len(results))
    for kind, name, error, message in results:
        w.int16(error)
        _put_string(w, flex, message)
        w.int8(kind)
        _put_string(w, flex, name)
        if flex:
            w.tagged_fields()
    if flex:
        w.tagged_fields()
    return bytes(w.buf)
