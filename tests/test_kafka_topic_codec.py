"""The topic admin APIs' bodies (ring.kafka_api.topic_codec: CreateTopics, DeleteTopics) against kafka-python's
own protocol classes, generated from Kafka's schemas: every request a client sends at every served version
parses to what it said, every answer built here decodes in the client to what was meant, and a body that
lies about its lengths is ``Malformed`` (the listener closes the connection)."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse

from ring.catalog import derived_id
from ring.kafka_api import apis
from ring.kafka_api import topic_codec as tc
from ring.kafka_api.wire import Malformed, Reader


def versions(api: int) -> list[int]:
    low, high = tc.VERSIONS[api]
    return list(range(low, high + 1))


def parsed(read, version: int, request) -> object:
    r = Reader(bytes(request.encode(version=version)))
    value = read(version, r)
    assert r.left == 0, "the whole body was read"
    return value


def create_request() -> CreateTopicsRequest:
    t = CreateTopicsRequest.CreatableTopic
    return CreateTopicsRequest(topics=[
        t(name="clicks", num_partitions=3, replication_factor=-1, assignments=[],
          configs=[t.CreatableTopicConfig(name="retention.ms", value="3600000"),
                   t.CreatableTopicConfig(name="cleanup.policy", value=None)]),
        t(name="placed", num_partitions=-1, replication_factor=-1,
          assignments=[t.CreatableReplicaAssignment(partition_index=0, broker_ids=[1, 2])], configs=[]),
    ], timeout_ms=1500, validate_only=True)


@pytest.mark.parametrize("version", versions(tc.CREATE_TOPICS))
def test_create_topics(version):
    assert parsed(tc.read_create_topics, version, create_request()) == tc.CreateTopics([
        tc.NewTopic("clicks", 3, -1, [], [("retention.ms", "3600000"), ("cleanup.policy", None)]),
        tc.NewTopic("placed", -1, -1, [(0, [1, 2])], []),
    ], 1500, True)
    topic_id = tc.topic_id_bytes(derived_id("clicks", 5))
    body = tc.create_topics_answer(version, [
        tc.TopicCreated("clicks", 0, None, topic_id, 3, 2, [("retention.ms", "3600000", True),
                                                             ("segment.bytes", "67108864", False)]),
        tc.TopicCreated("placed", 42, "manual replica assignments are not taken")])
    answer = CreateTopicsResponse.decode(body, version=version)
    assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
        ("clicks", 0, None), ("placed", 42, "manual replica assignments are not taken")]
    if version >= 5:
        clicks, placed = answer.topics
        assert (clicks.num_partitions, clicks.replication_factor) == (3, 2)
        assert [(c.name, c.value, c.read_only, c.config_source, c.is_sensitive) for c in clicks.configs] == [
            ("retention.ms", "3600000", False, 1, False), ("segment.bytes", "67108864", False, 5, False)]
        assert (placed.num_partitions, placed.replication_factor, placed.configs) == (-1, -1, None)
    if version >= 7:
        assert answer.topics[0].topic_id == uuid.UUID(bytes=topic_id)
        assert answer.topics[1].topic_id is None  # the zero UUID: none


@pytest.mark.parametrize("version", versions(tc.DELETE_TOPICS))
def test_delete_topics(version):
    topic_id = tc.topic_id_bytes(derived_id("clicks", 5))
    if version >= 6:
        s = DeleteTopicsRequest.DeleteTopicState
        req = DeleteTopicsRequest(topics=[s(name="clicks"), s(name=None, topic_id=uuid.UUID(bytes=topic_id))],
                                  timeout_ms=900)
        assert parsed(tc.read_delete_topics, version, req) == tc.DeleteTopics(
            [("clicks", tc.NO_TOPIC_ID), (None, topic_id)], 900)
    else:
        req = DeleteTopicsRequest(topic_names=["clicks", "gone"], timeout_ms=900)
        assert parsed(tc.read_delete_topics, version, req) == tc.DeleteTopics(
            [("clicks", tc.NO_TOPIC_ID), ("gone", tc.NO_TOPIC_ID)], 900)
    body = tc.delete_topics_answer(version, [tc.TopicDeleted("clicks", topic_id, 0, None),
                                             tc.TopicDeleted("gone", tc.NO_TOPIC_ID, 3, "unknown topic 'gone'")])
    answer = DeleteTopicsResponse.decode(body, version=version)
    assert [(t.name, t.error_code) for t in answer.responses] == [("clicks", 0), ("gone", 3)]
    if version >= 5:
        assert [t.error_message for t in answer.responses] == [None, "unknown topic 'gone'"]
    if version >= 6:
        assert [t.topic_id for t in answer.responses] == [uuid.UUID(bytes=topic_id), None]  # (zero: none)


def test_ring_topic_ids_are_kafka_uuids():
    assert len(tc.topic_id_bytes(derived_id("clicks", 5))) == 16


@pytest.mark.parametrize("version", [4, 5])
def test_a_create_that_lies_about_its_lengths_is_malformed(version):
    whole = bytes(create_request().encode(version=version))
    for cut in (1, 5, len(whole) // 2, len(whole) - 1):
        with pytest.raises(Malformed):
            tc.read_create_topics(version, Reader(whole[:cut]))
    absurd = struct.pack(">i", 2**31 - 1) + whole[4:] if version < 5 else b"\xff\xff\xff\xff\x07" + whole[1:]
    with pytest.raises(Malformed):
        tc.read_create_topics(version, Reader(absurd))


def test_the_served_ranges_and_their_flexible_versions():
    assert apis.SERVED[tc.CREATE_TOPICS][:2] == (2, 7) and apis.SERVED[tc.DELETE_TOPICS][:2] == (1, 6)
    assert [apis.flexible(tc.CREATE_TOPICS, v) for v in (4, 5)] == [False, True]
    assert [apis.flexible(tc.DELETE_TOPICS, v) for v in (3, 4)] == [False, True]
