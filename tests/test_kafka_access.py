"""Per-API authorization on the Kafka listener (ring.kafka_api.access): each handler served in this process
through ``apis.handle`` on a lone broker, for a client token with limited grants set in ``auth.CURRENT`` as
the listener sets it, and the answer awaited after the request was taken in (as the listener awaits it).
Each API answers a refused topic, group or request with Kafka's authorization codes, and writes, creates,
deletes or commits nothing for it; the topics allowed in the same request are served as without auth."""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator

import pytest
from kafka.protocol.admin import (AlterConfigsRequest, AlterConfigsResponse, CreatePartitionsRequest,
                                  CreatePartitionsResponse, CreateTopicsRequest,
                                  CreateTopicsResponse, DeleteGroupsRequest, DeleteGroupsResponse,
                                  DeleteTopicsRequest, DeleteTopicsResponse, DescribeConfigsRequest,
                                  DescribeConfigsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
                                  IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
                                  ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.consumer import (FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
                                     OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse)
from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                           JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                           OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
                                           OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from ring import auth
from ring.catalog import TopicConfig, with_defaults
from ring.cluster.node import ClusterBroker
from ring.groups.service import Groups
from ring.kafka_api import apis, errors, topic_codec
from ring.kafka_api import group_codec as gc
from ring.kafka_api.records import encode_batch
from ring.kafka_api.wire import Quiet, Reader, RequestHeader
from ring.produce import Produce, Records
from ring.replication.intake import results_of
from tests.support import lone_broker

NONE, DENIED = errors.NONE, errors.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED, CLUSTER_DENIED = errors.GROUP_AUTHORIZATION_FAILED, errors.CLUSTER_AUTHORIZATION_FAILED


def token_of(name: str, *grants: tuple[str, str]) -> auth.Principal:
    """The principal a client authenticates as with a token whose tokens-file lines give ``grants``
    ((permissions, topics) each)."""
    token = f"token-of-{name}"
    table = auth.TokenTable.parse("\n".join(auth.file_line(token, name, perms, topics) for perms, topics in grants))
    found = table.authenticate(token)
    assert found is not None
    return found


class Ring:
    """A lone broker and its groups, and Kafka requests handled for a principal."""

    def __init__(self, broker: ClusterBroker) -> None:
        self.broker = broker
        self.groups = Groups(broker)

    async def call(self, who: auth.Principal | None, api_key: int, version: int, request: Any,
                   response: Any) -> Any:
        body = bytes(request.encode(version=version))
        cell = [who] if who is not None else None
        reset = auth.CURRENT.set(cell)
        try:
            answer = apis.handle(self.broker, RequestHeader(api_key, version, 7, "test-client"), Reader(body),
                                 self.groups)
        finally:
            auth.CURRENT.reset(reset)
            if cell:
                cell[0] = None  # the request is taken in: what is awaited acts for nobody (as a served request)
        if isinstance(answer, Quiet):
            answer = answer.work
        if not isinstance(answer, (bytes, bytearray)):
            answer = await answer
        return response.decode(bytes(answer), version=version)

    async def topic(self, name: str, partitions: int = 1, records: int = 0) -> None:
        await self.broker.add_topic(TopicConfig(name=name, partitions=partitions, replication_factor=1))
        for p in range(partitions):
            for _ in range(records):
                await results_of(name, self.broker.intake.produce(
                    Produce(name, Records([(None, None, b"v", None)], [1], False, False), p)))

    def end(self, topic: str, partition: int = 0) -> int:
        return self.broker._parts[topic][partition].log.end_offset

    def exists(self, topic: str) -> bool:
        return topic in self.broker.catalog


@pytest.fixture
async def ring(tmp_path) -> AsyncIterator[Ring]:
    broker = await lone_broker(tmp_path / "b", "never")
    try:
        yield Ring(broker)
    finally:
        await broker.close()


def codes(topics: Any, partitions: str = "partitions", code: str = "error_code") -> dict[tuple[str, int], int]:
    out = {}
    for t in topics:
        name = getattr(t, "name", None) or getattr(t, "topic", None)
        for p in getattr(t, partitions):
            index = next(getattr(p, f) for f in ("partition_index", "index", "partition") if hasattr(p, f))
            out[(name, index)] = getattr(p, code)
    return out


# --- records: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch ---------------------------------------------


def produce_request(*topics: str) -> ProduceRequest:
    t = ProduceRequest.TopicProduceData
    batch = bytes(encode_batch(0, 0, [(1_700_000_000_000, b"k", b"v", [])]))
    return ProduceRequest(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
        t(name=name, partition_data=[t.PartitionProduceData(index=0, records=batch)]) for name in topics])


async def test_produce_writes_only_the_topics_the_token_may_produce_to(ring):
    await ring.topic("ok-1")
    await ring.topic("theirs")
    who = token_of("alice", ("produce", "ok-*"), ("consume", "theirs"))
    answer = await ring.call(who, apis.PRODUCE, 8, produce_request("ok-1", "theirs", "ok-new", "new-theirs"),
                             ProduceResponse)
    assert codes(answer.responses, "partition_responses") == {
        ("ok-1", 0): NONE, ("theirs", 0): DENIED, ("ok-new", 0): NONE, ("new-theirs", 0): DENIED}
    assert (ring.end("ok-1"), ring.end("theirs"), ring.end("ok-new")) == (1, 0, 1)
    assert not ring.exists("new-theirs"), "a produce refused does not auto-create its topic"
    # Without a principal (no tokens) everything is written, as before.
    answer = await ring.call(None, apis.PRODUCE, 8, produce_request("theirs"), ProduceResponse)
    assert codes(answer.responses, "partition_responses") == {("theirs", 0): NONE}
    assert ring.end("theirs") == 1


def fetch_request(*topics: str) -> FetchRequest:
    fp = FetchRequest.FetchTopic.FetchPartition
    return FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="", topics=[
                            FetchRequest.FetchTopic(topic=name, partitions=[fp(
                                partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                                partition_max_bytes=1 << 20)]) for name in topics])


def list_offsets_request(*topics: str) -> ListOffsetsRequest:
    t = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        t(name=name, partitions=[t.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)])
        for name in topics])


def epochs_request(*topics: str, epoch: int = 0) -> OffsetForLeaderEpochRequest:
    t = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    return OffsetForLeaderEpochRequest(replica_id=-1, topics=[
        t(topic=name, partitions=[t.OffsetForLeaderPartition(partition=0, current_leader_epoch=-1, leader_epoch=epoch)])
        for name in topics])


async def test_reads_answer_each_topic_the_token_may_not_consume_refused(ring):
    await ring.topic("ok-1", records=2)
    await ring.topic("theirs", records=2)
    who = token_of("bob", ("consume", "ok-*"), ("produce", "theirs"))

    fetched = await ring.call(who, apis.FETCH, 11, fetch_request("ok-1", "theirs"), FetchResponse)
    by_topic = {t.topic: t.partitions[0] for t in fetched.responses}
    assert (by_topic["ok-1"].error_code, by_topic["ok-1"].high_watermark) == (NONE, 2)
    assert by_topic["ok-1"].records, "the allowed topic's records are answered"
    assert (by_topic["theirs"].error_code, by_topic["theirs"].high_watermark) == (DENIED, -1)
    assert not by_topic["theirs"].records

    listed = await ring.call(who, apis.LIST_OFFSETS, 5, list_offsets_request("ok-1", "theirs"), ListOffsetsResponse)
    assert codes(listed.topics) == {("ok-1", 0): NONE, ("theirs", 0): DENIED}
    assert codes(listed.topics, code="offset") == {("ok-1", 0): 2, ("theirs", 0): -1}

    epoch = ring.broker.leader_epoch_of("ok-1", 0)
    ended = await ring.call(who, 23, 4, epochs_request("ok-1", "theirs", epoch=epoch), OffsetForLeaderEpochResponse)
    assert codes(ended.topics) == {("ok-1", 0): NONE, ("theirs", 0): DENIED}
    assert codes(ended.topics, code="end_offset") == {("ok-1", 0): 2, ("theirs", 0): -1}

    for request, response, key, version in ((fetch_request("theirs"), FetchResponse, apis.FETCH, 11),
                                            (list_offsets_request("theirs"), ListOffsetsResponse, apis.LIST_OFFSETS, 5),
                                            (epochs_request("theirs", epoch=ring.broker.leader_epoch_of("theirs", 0)),
                                             OffsetForLeaderEpochResponse, 23, 4)):
        answer = await ring.call(None, key, version, request, response)  # no tokens: served as before
        topics = answer.responses if key == apis.FETCH else answer.topics
        assert set(codes(topics).values()) == {NONE}, key


# --- Metadata ------------------------------------------------------------------------------------------------


def metadata_request(topics: list[str] | None, create: bool) -> MetadataRequest:
    named = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    return MetadataRequest(topics=named, allow_auto_topic_creation=create, include_cluster_authorized_operations=False,
                           include_topic_authorized_operations=False)


@pytest.mark.parametrize("version", [4, 9])
async def test_metadata_describes_what_the_token_holds_and_creates_only_what_it_may_produce_to(ring, version):
    await ring.topic("read-1", partitions=2)
    await ring.topic("other")
    who = token_of("carol", ("produce", "mine-*"), ("consume", "read-*"))

    async def metadata(topics: list[str] | None, create: bool) -> dict[str, tuple[int, int]]:
        answer = await ring.call(who, apis.METADATA, version, metadata_request(topics, create), MetadataResponse)
        return {t.name: (t.error_code, len(t.partitions)) for t in answer.topics}

    made = with_defaults("x", 0).partitions  # an auto-created topic's
    assert await metadata(["mine-new", "read-new", "other", "read-1"], True) == {
        "mine-new": (NONE, made), "read-new": (DENIED, 0), "other": (DENIED, 0), "read-1": (NONE, 2)}
    assert ring.exists("mine-new") and not ring.exists("read-new")
    # Not asked to create: a missing topic the token holds a permission on is unknown, as without auth.
    assert await metadata(["read-new", "other"], False) == {
        "read-new": (errors.UNKNOWN_TOPIC_OR_PARTITION, 0), "other": (DENIED, 0)}
    # Every topic, as GET /v1/topics lists every topic to any token.
    everything = await metadata(None, False)
    assert {name: everything[name] for name in ("read-1", "other", "mine-new")} == {
        "read-1": (NONE, 2), "other": (NONE, 1), "mine-new": (NONE, made)}
    # No tokens: a topic named is created and described whatever it is.
    answer = await ring.call(None, apis.METADATA, version, metadata_request(["read-new", "other"], True),
                             MetadataResponse)
    assert {t.name: t.error_code for t in answer.topics} == {"read-new": NONE, "other": NONE}
    assert ring.exists("read-new")


# --- CreateTopics, DeleteTopics, InitProducerId -------------------------------------------------------------


async def test_configs_are_described_and_changed_and_partitions_grown_only_with_permission_on_the_topic(ring):
    """Every served version of DescribeConfigs, IncrementalAlterConfigs, AlterConfigs and CreatePartitions, in
    kafka-python's encoding of Kafka's own schemas: a topic the token may not describe or change answers
    TOPIC_AUTHORIZATION_FAILED and stays as it was."""
    await ring.topic("cfg-mine")
    await ring.topic("cfg-theirs")
    who = token_of("fay", ("admin", "cfg-mine"))
    asked = DescribeConfigsRequest.DescribeConfigsResource
    for version in range(1, 5):
        describe = DescribeConfigsRequest(include_synonyms=True, include_documentation=True, resources=[
            asked(resource_type=2, resource_name=name, configuration_keys=None) for name in ("cfg-mine", "cfg-theirs")])
        answer = await ring.call(who, topic_codec.DESCRIBE_CONFIGS, version, describe, DescribeConfigsResponse)
        assert {r.resource_name: r.error_code for r in answer.results} == {"cfg-mine": NONE, "cfg-theirs": DENIED}
        mine = next(r for r in answer.results if r.resource_name == "cfg-mine")
        assert {c.name: c.value for c in mine.configs}["cleanup.policy"] == "delete"
        assert all([s.name for s in c.synonyms] == [c.name] for c in mine.configs)

    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    config = resource.AlterableConfig
    for version in range(2):
        retention = 3_600_000 + version
        alter = IncrementalAlterConfigsRequest(validate_only=False, resources=[resource(
            resource_type=2, resource_name=name, configs=[config(name="retention.ms", config_operation=0,
                                                                 value=str(retention))])
            for name in ("cfg-mine", "cfg-theirs")])
        answer = await ring.call(who, topic_codec.INCREMENTAL_ALTER_CONFIGS, version, alter,
                                 IncrementalAlterConfigsResponse)
        assert {r.resource_name: r.error_code for r in answer.responses} == {"cfg-mine": NONE, "cfg-theirs": DENIED}
        assert ring.broker.catalog.get("cfg-mine").retention_ms == retention
    legacy = AlterConfigsRequest.AlterConfigsResource
    for version in range(3):
        retention = 7_200_000 + version
        alter = AlterConfigsRequest(validate_only=False, resources=[legacy(
            resource_type=2, resource_name=name, configs=[legacy.AlterableConfig(name="retention.ms",
                                                                                value=str(retention))])
            for name in ("cfg-mine", "cfg-theirs")])
        answer = await ring.call(who, topic_codec.ALTER_CONFIGS, version, alter, AlterConfigsResponse)
        assert {r.resource_name: r.error_code for r in answer.responses} == {"cfg-mine": NONE, "cfg-theirs": DENIED}
        assert ring.broker.catalog.get("cfg-mine").retention_ms == retention
    assert ring.broker.catalog.get("cfg-theirs").retention_ms == TopicConfig("-").retention_ms

    grow = CreatePartitionsRequest.CreatePartitionsTopic
    for version in range(4):
        count = 2 + version
        request = CreatePartitionsRequest(timeout_ms=5000, validate_only=False, topics=[
            grow(name=name, count=count, assignments=None) for name in ("cfg-mine", "cfg-theirs")])
        answer = await ring.call(who, topic_codec.CREATE_PARTITIONS, version, request, CreatePartitionsResponse)
        assert {r.name: r.error_code for r in answer.results} == {"cfg-mine": NONE, "cfg-theirs": DENIED}
        assert ring.broker.catalog.get("cfg-mine").partitions == count
    assert ring.broker.catalog.get("cfg-theirs").partitions == 1


async def test_topics_are_created_and_deleted_only_with_admin_on_their_names(ring):
    await ring.topic("victim")
    await ring.topic("adm-old")
    who = token_of("dave", ("admin", "adm-*"), ("produce,consume", "victim"))
    new = CreateTopicsRequest.CreatableTopic
    create = CreateTopicsRequest(timeout_ms=0, validate_only=False, topics=[
        new(name=name, num_partitions=1, replication_factor=-1, assignments=[], configs=[])
        for name in ("adm-new", "x-new")])
    answer = await ring.call(who, topic_codec.CREATE_TOPICS, 5, create, CreateTopicsResponse)
    assert {t.name: t.error_code for t in answer.topics} == {"adm-new": NONE, "x-new": DENIED}
    assert ring.exists("adm-new") and not ring.exists("x-new")

    delete = DeleteTopicsRequest(topic_names=["adm-old", "victim"], timeout_ms=1000)
    answer = await ring.call(who, topic_codec.DELETE_TOPICS, 5, delete, DeleteTopicsResponse)
    assert {t.name: t.error_code for t in answer.responses} == {"adm-old": NONE, "victim": DENIED}
    assert ring.exists("victim")

    # By id (v6): refused, and the name is not told to a token holding nothing on the topic.
    victim_id = uuid.UUID(bytes=topic_codec.topic_id_bytes(ring.broker.catalog.get("victim").id))
    state = DeleteTopicsRequest.DeleteTopicState
    by_id = DeleteTopicsRequest(topics=[state(name=None, topic_id=victim_id)], timeout_ms=1000)
    stranger = token_of("erin", ("admin", "adm-*"))
    answer = await ring.call(stranger, topic_codec.DELETE_TOPICS, 6, by_id, DeleteTopicsResponse)
    assert [(t.name, t.error_code) for t in answer.responses] == [(None, DENIED)]
    answer = await ring.call(who, topic_codec.DELETE_TOPICS, 6, by_id, DeleteTopicsResponse)
    assert [(t.name, t.error_code) for t in answer.responses] == [("victim", DENIED)]
    assert ring.exists("victim")
    answer = await ring.call(None, topic_codec.DELETE_TOPICS, 5, DeleteTopicsRequest(topic_names=["victim"],
                                                                                     timeout_ms=1000),
                             DeleteTopicsResponse)
    assert [(t.name, t.error_code) for t in answer.responses] == [("victim", NONE)]


async def test_init_producer_id_needs_produce_on_some_topic(ring):
    request = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000)
    for who, expected in ((token_of("reader", ("consume", "*")), CLUSTER_DENIED),
                          (token_of("writer", ("produce", "logs-*")), NONE), (None, NONE)):
        answer = await ring.call(who, apis.INIT_PRODUCER_ID, 2, request, InitProducerIdResponse)
        assert answer.error_code == expected, who
        assert (answer.producer_id >= 0) == (expected == NONE)


# --- groups ----------------------------------------------------------------------------------------------------


def commit_request(group: str, offsets: dict[str, int]) -> OffsetCommitRequest:
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                               retention_time_ms=-1, topics=[t(name=name, partitions=[t.OffsetCommitRequestPartition(
                                   partition_index=0, committed_offset=o, committed_leader_epoch=-1,
                                   committed_metadata=None)]) for name, o in offsets.items()])


def offset_fetch_request(group: str, topics: list[str] | None) -> OffsetFetchRequest:
    t = OffsetFetchRequest.OffsetFetchRequestTopic
    return OffsetFetchRequest(group_id=group, topics=None if topics is None else [
        t(name=name, partition_indexes=[0]) for name in topics])


async def committed(ring: Ring, who: auth.Principal | None, group: str,
                    topics: list[str] | None) -> dict[tuple[str, int], tuple[int, int]]:
    answer = await ring.call(who, gc.OFFSET_FETCH, 5, offset_fetch_request(group, topics), OffsetFetchResponse)
    assert answer.error_code == NONE
    return {k: (c, codes(answer.topics, code="committed_offset")[k]) for k, c in codes(answer.topics).items()}


async def test_offsets_are_committed_and_fetched_only_for_topics_the_token_may_consume(ring):
    await ring.topic("ok-1", records=5)
    await ring.topic("theirs", records=5)
    who = token_of("frank", ("consume", "ok-*"), ("produce", "theirs"))
    answer = await ring.call(who, gc.OFFSET_COMMIT, 7, commit_request("g", {"ok-1": 3, "theirs": 4}),
                             OffsetCommitResponse)
    assert codes(answer.topics) == {("ok-1", 0): NONE, ("theirs", 0): DENIED}
    assert await committed(ring, None, "g", ["ok-1", "theirs"]) == {("ok-1", 0): (NONE, 3), ("theirs", 0): (NONE, -1)}

    answer = await ring.call(None, gc.OFFSET_COMMIT, 7, commit_request("g", {"theirs": 4}), OffsetCommitResponse)
    assert codes(answer.topics) == {("theirs", 0): NONE}
    assert await committed(ring, who, "g", ["theirs", "ok-1"]) == {("theirs", 0): (DENIED, -1), ("ok-1", 0): (NONE, 3)}
    # Every committed partition: the topics the token may not consume are left out.
    assert await committed(ring, who, "g", None) == {("ok-1", 0): (NONE, 3)}
    assert await committed(ring, None, "g", None) == {("ok-1", 0): (NONE, 3), ("theirs", 0): (NONE, 4)}


async def test_group_apis_need_consume_on_some_topic(ring):
    await ring.topic("ok-1")
    producer = token_of("gina", ("produce", "*"))
    consumer = token_of("hank", ("consume", "ok-*"))
    proto = JoinGroupRequest.JoinGroupRequestProtocol

    def join() -> JoinGroupRequest:
        return JoinGroupRequest(group_id="grp", session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                                group_instance_id=None, protocol_type="consumer",
                                protocols=[proto(name="range", metadata=b"\x00\x00")])

    requests = [
        (gc.FIND_COORDINATOR, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=["grp"]), FindCoordinatorResponse,
         lambda a: {c.error_code for c in a.coordinators}),
        (gc.JOIN_GROUP, 5, join(), JoinGroupResponse, lambda a: {a.error_code}),
        (gc.SYNC_GROUP, 3, SyncGroupRequest(group_id="grp", generation_id=1, member_id="m", group_instance_id=None,
                                            assignments=[]), SyncGroupResponse, lambda a: {a.error_code}),
        (gc.HEARTBEAT, 3, HeartbeatRequest(group_id="grp", generation_id=1, member_id="m", group_instance_id=None),
         HeartbeatResponse, lambda a: {a.error_code}),
        (gc.LEAVE_GROUP, 3, LeaveGroupRequest(group_id="grp", members=[
            LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id=None)]), LeaveGroupResponse,
         lambda a: {a.error_code}),
        (gc.OFFSET_COMMIT, 7, commit_request("grp", {"ok-1": 1}), OffsetCommitResponse,
         lambda a: set(codes(a.topics).values())),
        (gc.OFFSET_FETCH, 5, offset_fetch_request("grp", ["ok-1"]), OffsetFetchResponse,
         lambda a: {a.error_code, *codes(a.topics).values()}),
    ]
    for key, version, request, response, errors_of in requests:
        assert errors_of(await ring.call(producer, key, version, request, response)) == {GROUP_DENIED}, key
        assert GROUP_DENIED not in errors_of(await ring.call(consumer, key, version, request, response)), key
    assert await committed(ring, None, "grp", ["ok-1"]) == {("ok-1", 0): (NONE, 1)}, "only the consumer's commit"


async def test_groups_are_listed_and_described_to_any_token_and_deleted_only_by_an_admin_of_every_topic(ring):
    await ring.topic("adm-1", records=2)
    await ring.call(None, gc.OFFSET_COMMIT, 7, commit_request("doomed", {"adm-1": 1}), OffsetCommitResponse)
    nobody = auth.Principal("nobody")  # authenticated, no grant at all
    listed = await ring.call(nobody, gc.LIST_GROUPS, 2, ListGroupsRequest(), ListGroupsResponse)
    assert listed.error_code == NONE and "doomed" in {g.group_id for g in listed.groups}
    described = await ring.call(nobody, gc.DESCRIBE_GROUPS, 4, DescribeGroupsRequest(
        groups=["doomed"], include_authorized_operations=False), DescribeGroupsResponse)
    assert [(g.group_id, g.error_code) for g in described.groups] == [("doomed", NONE)]

    delete = DeleteGroupsRequest(groups_names=["doomed", "never-was"])
    for who in (token_of("ivy", ("admin", "adm-*")), token_of("jack", ("produce,consume", "*"))):
        answer = await ring.call(who, gc.DELETE_GROUPS, 1, delete, DeleteGroupsResponse)
        assert [(r.group_id, r.error_code) for r in answer.results] == [("doomed", GROUP_DENIED),
                                                                         ("never-was", GROUP_DENIED)]
    assert await committed(ring, None, "doomed", ["adm-1"]) == {("adm-1", 0): (NONE, 1)}, "not deleted"
    answer = await ring.call(token_of("root", ("admin", "*")), gc.DELETE_GROUPS, 1, delete, DeleteGroupsResponse)
    assert [(r.group_id, r.error_code) for r in answer.results] == [("doomed", NONE),
                                                                     ("never-was", errors.GROUP_ID_NOT_FOUND)]
    assert await committed(ring, None, "doomed", ["adm-1"]) == {("adm-1", 0): (NONE, -1)}
