"""The request and answer bodies of Kafka's topic admin APIs, at the versions served.

CreateTopics (v2-7, flexible from v5) and DeleteTopics (v1-6, flexible from v4): what Kafka 4.x
clients negotiate (Kafka 4.0 dropped CreateTopics v0-1 and DeleteTopics v0). CreateTopics v7 answers
each new topic's id and DeleteTopics v6 names topics by name or by id: a topic id is 16 bytes, ring's
``TopicConfig.id`` decoded (``topic_id_bytes``).

``read_*`` parse a request body into a plain value (``Reader`` raises ``Malformed`` at the first field
that does not fit the frame); ``*_answer`` build an answer body. No decision is made here: that is the
broker's, through the handlers (``topics``).
"""

from __future__ import annotations

import base64
from typing import Callable, NamedTuple, TypeVar

from ring.kafka_api.wire import Reader, Writer

T = TypeVar("T")

CREATE_TOPICS, DELETE_TOPICS = 19, 20
VERSIONS = {CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 6)}
FLEXIBLE_FROM = {CREATE_TOPICS: 5, DELETE_TOPICS: 4}
NO_TOPIC_ID = bytes(16)  # Kafka's zero UUID: no id
CONFIG_SOURCE_TOPIC, CONFIG_SOURCE_DEFAULT = 1, 5  # DescribeConfigs' sources: set for the topic, a default


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
