"""Kafka's topic admin APIs through ring's Kafka listener (ring.kafka_api.topics: CreateTopics, DeleteTopics;
ring.kafka_api.configs: DescribeConfigs, IncrementalAlterConfigs, CreatePartitions): confluent-kafka's
(librdkafka's) ``AdminClient`` and kafka-python's ``KafkaAdminClient``, unchanged, on a real 3-broker ring,
each broker with its own listener; what they create, change and delete is seen over HTTP on every broker,
and what they may not change is left as it was."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ring.catalog import TopicConfig
from ring.kafka_api.topic_codec import topic_id_bytes
from tests.brokers import TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ring(kafka_cluster: TestCluster) -> TestCluster:
    return kafka_cluster


@pytest.fixture(scope="module")
def admin(ring: TestCluster) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": ring.kafka_bootstrap})


def outcome(future: Any) -> Any:
    """What an admin future holds, or the KafkaError it failed with."""
    from confluent_kafka import KafkaException

    try:
        return future.result(timeout=30)
    except KafkaException as exc:
        return exc.args[0]


def error_of(future: Any) -> Any:
    """The KafkaError an admin future failed with (None: it succeeded)."""
    from confluent_kafka import KafkaError

    got = outcome(future)
    return got if isinstance(got, KafkaError) else None


def absent_everywhere(ring: TestCluster, name: str) -> bool:
    return all(b.http.get(f"/v1/topics/{name}").status == 404 for b in ring)


def test_confluent_creates_a_topic_http_sees_and_a_produce_right_after_is_acknowledged(ring, admin):
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import NewTopic

    new = NewTopic("made-by-kafka", num_partitions=3, replication_factor=3, config={"retention.ms": "3600000"})
    # (operation_timeout left at librdkafka's 0: answered once the topic is created, its leaders or not)
    assert error_of(admin.create_topics([new])["made-by-kafka"]) is None
    for b in ring:  # the create is answered once every live broker has the topic
        doc = b.http.describe("made-by-kafka")
        assert (len(doc["partitions"]), doc["replication_factor"], doc["retention_ms"]) == (3, 3, 3600000)

    delivered: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": ring.kafka_bootstrap, "acks": "all"})
    producer.produce("made-by-kafka", key=b"k-1", value=b"first",
                     on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())) if err is None
                     else pytest.fail(str(err)))
    assert producer.flush(30) == 0
    [(p, offset)] = delivered
    r = ring[1].http.fetch("made-by-kafka", p, offset=offset)
    assert r.status == 200, r.body
    assert [(rec["key"], rec["value"]) for rec in r.json()["records"]] == [("k-1", "first")]

    again = error_of(admin.create_topics([NewTopic("made-by-kafka", num_partitions=1)])["made-by-kafka"])
    assert again.code() == KafkaError.TOPIC_ALREADY_EXISTS
    assert len(ring[0].http.describe("made-by-kafka")["partitions"]) == 3  # unchanged


def test_confluent_unknown_config_and_validate_only_create_nothing(ring, admin):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    bad = NewTopic("bad-config", num_partitions=1, config={"message.timestamp.type": "LogAppendTime"})
    err = error_of(admin.create_topics([bad])["bad-config"])
    assert err.code() == KafkaError.INVALID_CONFIG and "message.timestamp.type" in err.str()
    assert absent_everywhere(ring, "bad-config")

    checked = NewTopic("only-checked", num_partitions=2, config={"retention.ms": "60000"})
    assert error_of(admin.create_topics([checked], validate_only=True)["only-checked"]) is None
    assert absent_everywhere(ring, "only-checked")
    over = NewTopic("only-checked", num_partitions=2, replication_factor=4)  # more replicas than brokers
    err = error_of(admin.create_topics([over], validate_only=True)["only-checked"])
    assert err.code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert absent_everywhere(ring, "only-checked")


def test_min_insync_replicas_sets_what_acks_all_waits_for(ring, admin):
    """min.insync.replicas is the topic's consistency as a count of replicas: 1 is one, a majority quorum,
    every replica all; any other count is INVALID_CONFIG naming the counts ring has, nothing created. The
    answer (kafka-python, v7) gives the count back."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic
    from kafka import KafkaAdminClient

    for count, rf, level in (("1", 3, "one"), ("2", 3, "quorum"), ("3", 3, "all"), ("1", 2, "one"),
                             ("2", 2, "quorum")):
        name = f"insync-{count}-of-{rf}"
        new = NewTopic(name, num_partitions=1, replication_factor=rf, config={"min.insync.replicas": count})
        assert error_of(admin.create_topics([new])[name]) is None
        assert ring[1].http.describe(name)["consistency"] == level, name
    for count in ("0", "4", "-1", "two"):
        name = f"insync-bad-{count}"
        new = NewTopic(name, num_partitions=1, replication_factor=3, config={"min.insync.replicas": count})
        err = error_of(admin.create_topics([new])[name])
        assert err.code() == KafkaError.INVALID_CONFIG and "min.insync.replicas" in err.str(), err.str()
        assert absent_everywhere(ring, name)

    a = KafkaAdminClient(bootstrap_servers=ring.kafka_bootstrap.split(","), request_timeout_ms=30000)
    try:
        [t] = a.create_topics({"insync-shown": {"num_partitions": 1, "replication_factor": 3,
                                                "configs": {"min.insync.replicas": "3"}}})["topics"]
        assert t["error_code"] == 0 and t["configs"]["min.insync.replicas"]["value"] == "3"
        [d] = a.create_topics({"insync-default": {"num_partitions": 1, "replication_factor": 3}})["topics"]
        assert d["configs"]["min.insync.replicas"]["value"] == "2"  # quorum, ring's default, on 3 replicas
    finally:
        a.close()
    assert ring[0].http.describe("insync-shown")["consistency"] == "all"


def test_min_insync_replicas_counts_map_to_levels_on_any_factor():
    from ring.kafka_api.topics import InvalidConfig, consistency_for

    assert [consistency_for(n, 5) for n in (1, 3, 5)] == ["one", "quorum", "all"]
    assert consistency_for(1, 1) == "one" and consistency_for(2, 2) == "quorum"
    for n, rf in ((2, 5), (4, 5), (0, 3), (6, 5), (2, 1)):
        with pytest.raises(InvalidConfig, match=r"min\.insync\.replicas="):
            consistency_for(n, rf)


def test_confluent_deletes_a_topic_and_a_missing_one_is_unknown(ring, admin):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    assert error_of(admin.create_topics([NewTopic("doomed", num_partitions=2)], operation_timeout=10)["doomed"]) is None
    assert ring[2].http.get("/v1/topics/doomed").status == 200
    assert error_of(admin.delete_topics(["doomed"], operation_timeout=10)["doomed"]) is None
    wait_for("the delete known everywhere", lambda: absent_everywhere(ring, "doomed"), 30)  # (gossip takes it)
    err = error_of(admin.delete_topics(["doomed"])["doomed"])
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_kafka_python_creates_with_an_id_and_deletes_by_it(ring):
    """kafka-python negotiates the highest versions (CreateTopics v7, DeleteTopics v6: flexible, with ids)."""
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    a = KafkaAdminClient(bootstrap_servers=ring.kafka_bootstrap.split(","), request_timeout_ms=30000)
    try:
        result = a.create_topics({"kp-topic": {"num_partitions": 2, "replication_factor": 2,
                                               "configs": {"retention.bytes": "1048576",
                                                           "compression.type": "zstd"}}}, timeout_ms=10000)
        [t] = result["topics"]
        assert (t["name"], t["error_code"], t["num_partitions"], t["replication_factor"]) == ("kp-topic", 0, 2, 2)
        assert t["configs"]["retention.bytes"]["value"] == "1048576"
        doc = ring[1].http.describe("kp-topic")
        assert (len(doc["partitions"]), doc["replication_factor"], doc["retention_bytes"], doc["compression"]) == (
            2, 2, 1048576, "zstd")
        topic_id = uuid.UUID(t["topic_id"])
        assert topic_id == uuid.UUID(bytes=topic_id_bytes(doc["id"]))  # ring's topic id, as a Kafka UUID
        with pytest.raises(TopicAlreadyExistsError):
            a.create_topics({"kp-topic": {"num_partitions": 2}})

        deleted = a.delete_topics([topic_id], timeout_ms=10000)
        assert [(d["name"], d["error_code"]) for d in deleted["topics"]] == [("kp-topic", 0)]
        wait_for("the delete known everywhere", lambda: absent_everywhere(ring, "kp-topic"), 30)
        gone = a.delete_topics([topic_id, "kp-topic"], raise_errors=False)
        assert [d["error_code"] for d in gone["topics"]] == [100, 3]  # UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_OR_PARTITION
    finally:
        a.close()


def test_what_ring_cannot_create_is_answered_per_topic_with_kafkas_codes(ring):
    from kafka import KafkaAdminClient

    a = KafkaAdminClient(bootstrap_servers=ring.kafka_bootstrap.split(","), request_timeout_ms=30000)
    asked = {
        "zero-parts": ({"num_partitions": 0}, 37),  # INVALID_PARTITIONS
        "four-copies": ({"replication_factor": 4}, 38),  # INVALID_REPLICATION_FACTOR
        "placed-by-hand": ({"assignments": {0: [1, 2]}}, 42),  # INVALID_REQUEST: ring places by its ring
        "__offsets": ({}, 17),  # INVALID_TOPIC_EXCEPTION: internal
        "bad/name": ({}, 17),
        "zero-retention": ({"configs": {"retention.ms": "0"}}, 40),  # INVALID_CONFIG: ring's range
        "gzip-stored": ({"configs": {"compression.type": "gzip"}}, 40),
        "compacted": ({"configs": {"cleanup.policy": "compact"}}, 40),
    }
    try:
        result = a.create_topics({name: spec for name, (spec, _) in asked.items()}, raise_errors=False)
        got = {t["name"]: (t["error_code"], t["error_message"]) for t in result["topics"]}
        assert {name: code for name, (code, _) in got.items()} == {name: code for name, (_, code) in asked.items()}
        assert "token ring" in got["placed-by-hand"][1] and "retention.ms" in got["zero-retention"][1]
        for name in asked:
            if name != "__offsets" and "/" not in name:
                assert absent_everywhere(ring, name), name
        a.describe_groups(["any-group"])  # finding its coordinator makes the groups' internal topic
        assert ring[0].http.get("/v1/topics/__offsets").status == 200
        refused = a.delete_topics(["__offsets"], raise_errors=False)
        assert [d["error_code"] for d in refused["topics"]] == [17]
        assert ring[0].http.get("/v1/topics/__offsets").status == 200
    finally:
        a.close()


def test_timeout_ms_bounds_the_wait_for_leaders(tmp_path):
    """Partitions of a topic with one replica placed on a broker that is down get no leader: a create
    waits for them no longer than its timeout_ms (0: not at all), and is answered created."""
    import time

    from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

    from ring import limits
    from tests.test_kafka_groups import call

    c = TestCluster(tmp_path, size=3, kafka=True).start()
    try:
        c[2].kill()
        addr = ("127.0.0.1", int(c.kafka_bootstrap.split(",")[0].rpartition(":")[2]))
        t = CreateTopicsRequest.CreatableTopic

        def create(name: str, timeout_ms: int) -> tuple[float, list[int]]:
            request = CreateTopicsRequest(topics=[t(name=name, num_partitions=6, replication_factor=1, assignments=[],
                                                    configs=[])], timeout_ms=timeout_ms, validate_only=False)
            started = time.monotonic()
            answer = call(addr, request, 4, CreateTopicsResponse)
            return time.monotonic() - started, [r.error_code for r in answer.topics]

        # Both pay for the create itself, which a busy machine stretches alike; only the second also waits
        # (its timeout, then no more) for the leaders that cannot come.
        at_once, codes = create("at-once", 0)
        assert codes == [0], codes
        took, codes = create("a-second", 1000)
        assert codes == [0] and 1.0 <= took < limits.LEADER_WAIT_MS / 1000 - 0.5, took
        assert took - at_once > 0.5, (at_once, took)
        led = [p["leader"] for p in c[0].http.describe("a-second")["partitions"]]
        assert None in led and c[2].name not in led  # (those placed on the broker that is down have none)
    finally:
        c.stop()


def test_a_topic_named_twice_too_many_topics_and_a_config_value_not_a_number_are_refused(ring):
    from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

    from ring import limits
    from tests.test_kafka_groups import call

    t = CreateTopicsRequest.CreatableTopic
    c = t.CreatableTopicConfig
    most = limits.KAFKA_TOPICS_PER_REQUEST_MAX
    topics = [t(name="twice", num_partitions=1, replication_factor=-1, assignments=[], configs=[])] * 2
    topics += [t(name="not-a-number", num_partitions=1, replication_factor=-1, assignments=[],
                 configs=[c(name="retention.ms", value="1e9")]),
               t(name="given-twice", num_partitions=1, replication_factor=-1, assignments=[],
                 configs=[c(name="retention.ms", value="60000"), c(name="retention.ms", value="70000")])]
    topics += [t(name=f"many-{i}", num_partitions=1, replication_factor=-1, assignments=[], configs=[])
               for i in range(most)]
    addr = ("127.0.0.1", int(ring.kafka_bootstrap.split(",")[0].rpartition(":")[2]))
    answer = call(addr, CreateTopicsRequest(topics=topics, timeout_ms=0, validate_only=True), 7, CreateTopicsResponse,
                  flexible=True)
    got = {r.name: r.error_code for r in answer.topics}
    assert len(answer.topics) == len(got) == 3 + most  # one answer a name
    assert (got["twice"], got["not-a-number"], got["given-twice"]) == (42, 40, 40)
    # the bound counts the entries of the request: the 4 before these and the first most - 4 of these are served
    assert [got[f"many-{i}"] for i in range(most)] == [0] * (most - 4) + [42] * 4
    assert all(absent_everywhere(ring, name) for name in ("twice", "many-0"))  # (validate_only: nothing made)


# --- DescribeConfigs, IncrementalAlterConfigs, CreatePartitions ------------------------------------------

SETTINGS = ("retention_ms", "retention_bytes", "segment_bytes", "compression", "consistency", "unclean_leader_election")


def make_topic(ring: TestCluster, name: str, **settings: Any) -> None:
    r = ring[0].http.create_topic(name, **settings)
    assert r.status in (200, 201), r.body


def settings_of(ring: TestCluster, name: str) -> list[tuple[Any, ...]]:
    """The topic's settings and partition count, as each broker describes them."""
    return [(*(doc[k] for k in SETTINGS), len(doc["partitions"])) for doc in (b.http.describe(name) for b in ring)]


def described(admin: Any, name: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    [(_, future)] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).items()
    return outcome(future)


def test_a_topics_configs_are_described_with_their_sources(ring, admin):
    from confluent_kafka.admin import ConfigSource

    make_topic(ring, "configs-described", partitions=2, retention_ms=3_600_000)
    got = described(admin, "configs-described")
    assert {name: entry.value for name, entry in got.items()} == {
        "retention.ms": "3600000", "retention.bytes": "-1", "segment.bytes": str(ring[0].http.describe(
            "configs-described")["segment_bytes"]), "compression.type": "uncompressed",
        "unclean.leader.election.enable": "false", "cleanup.policy": "delete", "min.insync.replicas": "2"}
    assert got["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value  # set for this topic
    assert not got["retention.ms"].is_default
    assert got["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value and got["retention.bytes"].is_default
    assert got["segment.bytes"].is_read_only and not got["retention.ms"].is_read_only


def test_an_unknown_topic_is_unknown_and_a_broker_describes_the_defaults(ring, admin):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource, ResourceType

    assert described(admin, "no-such-topic-here").code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    metadata = admin.list_topics(timeout=30)
    broker_id = sorted(metadata.brokers)[0]
    [(_, future)] = admin.describe_configs([ConfigResource(ResourceType.BROKER, str(broker_id))]).items()
    got = outcome(future)
    assert got["broker.id"].value == str(broker_id)
    assert got["default.replication.factor"].value == "3" and got["num.partitions"].is_read_only


def test_incremental_alter_sets_and_deletes_configs_every_broker_takes(ring, admin):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    make_topic(ring, "configs-altered", partitions=1)
    change = ConfigResource(ResourceType.TOPIC, "configs-altered", incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("min.insync.replicas", "3", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("unclean.leader.election.enable", "true", incremental_operation=AlterConfigOpType.SET)])
    [(_, future)] = admin.incremental_alter_configs([change]).items()
    assert outcome(future) is None
    for b in ring:  # gossiped to every broker
        wait_for("the change on every broker",
                 lambda b=b: b.http.describe("configs-altered")["retention_ms"] == 7_200_000)
        doc = b.http.describe("configs-altered")
        assert (doc["consistency"], doc["unclean_leader_election"]) == ("all", True)
    assert described(admin, "configs-altered")["min.insync.replicas"].value == "3"

    back = ConfigResource(ResourceType.TOPIC, "configs-altered", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    [(_, future)] = admin.incremental_alter_configs([back]).items()
    assert outcome(future) is None
    got = described(admin, "configs-altered")
    assert got["retention.ms"].is_default and got["retention.ms"].value == str(
        ring[0].http.describe("configs-altered")["retention_ms"])


@pytest.mark.parametrize("name, op, value", [
    ("segment.bytes", "SET", "1048576"),  # fixed when the topic is created
    ("cleanup.policy", "SET", "compact"),
    ("message.timestamp.type", "SET", "LogAppendTime"),
    ("retention.ms", "SET", "soon"),
    ("retention.ms", "APPEND", "1"),
    ("min.insync.replicas", "SET", "4"),
])
def test_a_config_ring_cannot_take_is_refused_and_nothing_changes(ring, admin, name, op, value):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic = "configs-refused"
    if ring[0].http.get(f"/v1/topics/{topic}").status == 404:
        make_topic(ring, topic, partitions=1)
    before = settings_of(ring, topic)
    change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),  # (valid, not applied)
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType[op])])
    [(_, future)] = admin.incremental_alter_configs([change]).items()
    err = outcome(future)
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err
    assert settings_of(ring, topic) == before


def test_create_partitions_grows_a_topic_and_refuses_to_shrink_it(ring, admin):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewPartitions

    make_topic(ring, "grown-by-kafka", partitions=2)
    [(_, future)] = admin.create_partitions([NewPartitions("grown-by-kafka", 5)], validate_only=True).items()
    assert outcome(future) is None
    assert len(ring[0].http.describe("grown-by-kafka")["partitions"]) == 2  # validated only
    [(_, future)] = admin.create_partitions([NewPartitions("grown-by-kafka", 5)]).items()
    assert outcome(future) is None
    for b in ring:
        wait_for("the partitions on every broker",
                 lambda b=b: len(b.http.describe("grown-by-kafka")["partitions"]) == 5)
    assert len(admin.list_topics("grown-by-kafka", timeout=30).topics["grown-by-kafka"].partitions) == 5

    for count in (3, 5):
        [(_, future)] = admin.create_partitions([NewPartitions("grown-by-kafka", count)]).items()
        assert outcome(future).code() == KafkaError.INVALID_PARTITIONS
    [(_, future)] = admin.create_partitions([NewPartitions("grown-by-kafka", 7, replica_assignment=[[1], [2]])]).items()
    assert outcome(future).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    [(_, future)] = admin.create_partitions([NewPartitions("not-a-topic-at-all", 7)]).items()
    assert outcome(future).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert len(ring[0].http.describe("grown-by-kafka")["partitions"]) == 5


def test_validate_only_changes_nothing_and_the_offsets_topic_is_not_changed(ring, admin):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, ResourceType

    make_topic(ring, "configs-validated", partitions=1)
    before = settings_of(ring, "configs-validated")
    change = ConfigResource(ResourceType.TOPIC, "configs-validated", incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    [(_, future)] = admin.incremental_alter_configs([change], validate_only=True).items()
    assert outcome(future) is None
    assert settings_of(ring, "configs-validated") == before

    internal = ConfigResource(ResourceType.TOPIC, "__offsets", incremental_configs=[
        ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    [(_, future)] = admin.incremental_alter_configs([internal]).items()
    assert outcome(future).code() == KafkaError.TOPIC_EXCEPTION
    [(_, future)] = admin.create_partitions([NewPartitions("__offsets", 1000)]).items()
    assert outcome(future).code() == KafkaError.TOPIC_EXCEPTION


def test_the_legacy_alter_configs_replaces_the_whole_set(ring, admin):
    """AlterConfigs (librdkafka's ``alter_configs``) sets what it names and puts every other config back to
    ring's default, as Kafka does; a value ring cannot take changes nothing."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource, ResourceType

    make_topic(ring, "configs-replaced", partitions=1, retention_ms=3_600_000, unclean_leader_election=True)
    default = TopicConfig("-")  # ring's defaults
    [(_, future)] = admin.alter_configs([ConfigResource(ResourceType.TOPIC, "configs-replaced",
                                                        set_config={"retention.bytes": "1048576"})]).items()
    assert outcome(future) is None
    wait_for("the change on every broker", lambda: all(
        b.http.describe("configs-replaced")["retention_bytes"] == 1_048_576 for b in ring))
    doc = ring[0].http.describe("configs-replaced")
    assert (doc["retention_ms"], doc["unclean_leader_election"]) == (default.retention_ms, False)  # not named
    before = settings_of(ring, "configs-replaced")
    [(_, future)] = admin.alter_configs([ConfigResource(ResourceType.TOPIC, "configs-replaced",
                                                        set_config={"compression.type": "gzip"})]).items()
    assert outcome(future).code() == KafkaError.INVALID_CONFIG
    assert settings_of(ring, "configs-replaced") == before
