"""OffsetForLeaderEpoch (ring.kafka_api.epochs): where a leader epoch ended, as Kafka's
``LeaderEpochFileCache.endOffsetFor`` answers it, over the log's epoch history; its bodies at every served
version against kafka-python's protocol classes (generated from Kafka's schemas); its answers from a
broker with a Kafka listener, including the current-leader-epoch checks; and bodies that lie about their
lengths, which close the connection."""

from __future__ import annotations

import logging
import struct
from typing import NamedTuple

import pytest
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from ring.kafka_api import apis, epochs
from ring.kafka_api.errors import (FENCED_LEADER_EPOCH, NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_LEADER_EPOCH,
                                   UNKNOWN_TOPIC_OR_PARTITION)
from ring.kafka_api.wire import Malformed, Reader
from ring.log.checkpoint import LeaderEpochCache
from tests.test_kafka_listener import API_VERSIONS, closed_by_broker, connect, frame, read_answer

KEY = epochs.OFFSET_FOR_LEADER_EPOCH
VERSIONS = list(range(epochs.VERSIONS[0], epochs.VERSIONS[1] + 1))
Topic = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
Partition = Topic.OffsetForLeaderPartition


# --- the epoch history's answer ------------------------------------------------------------------


@pytest.mark.parametrize("epoch, expected", [
    (-1, (-1, -1)),  # no epoch asked for
    (1, (1, 40)),  # older than every epoch kept (the log was truncated from the start): the first one's start
    (3, (3, 100)),  # an epoch that wrote offsets 40..99: the next one's start
    (4, (3, 100)),  # an epoch nobody wrote in: the largest below it, and where that ended
    (5, (5, 130)),
    (7, (7, 150)),  # the latest: the log end
    (8, (-1, -1)),  # newer than the latest: not known here
])
def test_an_epochs_end_is_the_next_epochs_start_or_the_log_end(tmp_path, epoch, expected):
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint", [(3, 40), (5, 100), (7, 130)])
    assert cache.epoch_end(epoch, 150) == expected


def test_an_empty_history_knows_no_epoch(tmp_path):
    assert LeaderEpochCache(tmp_path / "leader-epoch-checkpoint", []).epoch_end(0, 0) == (-1, -1)


# --- bodies --------------------------------------------------------------------------------------


def request() -> OffsetForLeaderEpochRequest:
    return OffsetForLeaderEpochRequest(replica_id=-1, topics=[
        Topic(topic="clicks", partitions=[Partition(partition=0, current_leader_epoch=7, leader_epoch=5),
                                          Partition(partition=2, current_leader_epoch=-1, leader_epoch=0)]),
        Topic(topic="views", partitions=[]),
    ])


@pytest.mark.parametrize("version", VERSIONS)
def test_every_served_version_reads_what_the_client_sent_and_answers_what_it_decodes(version):
    r = Reader(bytes(request().encode(version=version)))
    assert epochs.read_request(version, r) == [("clicks", [(0, 7, 5), (2, -1, 0)]), ("views", [])]
    assert r.left == 0, "the whole body was read"
    body = epochs.answer(version, [("clicks", [epochs.EpochEnded(0, NONE, 5, 1234),
                                               epochs.EpochEnded(2, FENCED_LEADER_EPOCH, -1, -1)]),
                                   ("views", [])])
    answer = OffsetForLeaderEpochResponse.decode(body, version=version)
    assert answer.throttle_time_ms == 0
    assert [(t.topic, [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions])
            for t in answer.topics] == [("clicks", [(0, 0, 5, 1234), (2, FENCED_LEADER_EPOCH, -1, -1)]),
                                        ("views", [])]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_truncated_or_lying_body_is_malformed(version):
    whole = bytes(request().encode(version=version))
    head = 4 if version >= 3 else 0  # replica_id
    # The topics' count: a classic int32 or a compact (unsigned varint) one; 2**31 - 1 entries claimed.
    absurd = whole[:head] + (b"\xff\xff\xff\xff\x07" + whole[head + 1:] if version >= epochs.FLEXIBLE_FROM
                             else struct.pack(">i", 2**31 - 1) + whole[head + 4:])
    for body in [whole[:cut] for cut in (0, 3, len(whole) // 2, len(whole) - 1)] + [absurd]:
        with pytest.raises(Malformed):
            epochs.read_request(version, Reader(body))


def test_the_flexible_version_is_flexible_and_the_others_not():
    assert [apis.flexible(KEY, v) for v in VERSIONS] == [v >= 4 for v in VERSIONS]
    assert apis.SERVED[KEY][:2] == epochs.VERSIONS


# --- a broker's answers --------------------------------------------------------------------------


class Listener(NamedTuple):
    bootstrap: str  # a broker's Kafka listener, HOST:PORT


def ask(kafka, version: int, topics: list) -> list:
    """[(topic, [(partition, error, leader epoch, end offset)])] answered for ``topics`` by the listener of
    ``kafka`` (a broker or a ``Listener``)."""
    body = bytes(OffsetForLeaderEpochRequest(replica_id=-1, topics=[
        Topic(topic=t, partitions=[Partition(partition=p, current_leader_epoch=c, leader_epoch=e) for p, c, e in ps])
        for t, ps in topics]).encode(version=version))
    with connect(kafka) as s:
        s.sendall(frame(KEY, version, 9, body, flexible=version >= epochs.FLEXIBLE_FROM))
        corr, answer = read_answer(s)
    assert corr == 9
    if version >= epochs.FLEXIBLE_FROM:
        answer = answer[1:]  # the response header's tagged fields
    decoded = OffsetForLeaderEpochResponse.decode(answer, version=version)
    return [(t.topic, [(p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions])
            for t in decoded.topics]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_leader_answers_its_epochs_end_and_checks_the_current_epoch(kafka, version):
    topic = f"epochs-{version}"
    assert kafka.http.create_topic(topic, partitions=1).status == 201
    assert kafka.http.produce(topic, [{"n": i} for i in range(5)], partition=0).status == 200
    epoch = kafka.http.describe(topic)["partitions"][0]["epoch"]
    assert epoch >= 1
    assert ask(kafka, version, [(topic, [(0, epoch, epoch), (0, -1, epoch - 1), (0, -1, epoch + 1),
                                         (0, epoch - 1, epoch), (0, epoch + 1, epoch), (1, -1, epoch)]),
                                ("no-such-topic", [(0, -1, epoch)])]) == [
        (topic, [(0, NONE, epoch, 5),  # the latest epoch ends at the log end
                 (0, NONE, epoch - 1, 0),  # older than any epoch of the log: where the first began
                 (0, NONE, -1, -1),  # an epoch newer than the leader's
                 (0, FENCED_LEADER_EPOCH, -1, -1), (0, UNKNOWN_LEADER_EPOCH, -1, -1),
                 (1, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)]),
        ("no-such-topic", [(0, UNKNOWN_TOPIC_OR_PARTITION, -1, -1)])]


@pytest.mark.parametrize("version", [3, 4])  # the last classic version and the flexible one
def test_a_truncated_or_lying_request_closes_the_connection_and_the_listener_serves_on(kafka, version):
    whole = bytes(request().encode(version=version))
    flexible = version >= epochs.FLEXIBLE_FROM
    absurd = whole[:4] + (b"\xff\xff\xff\xff\x07" + whole[5:] if flexible else struct.pack(">i", 2**31 - 1) + whole[8:])
    for body in [whole[:cut] for cut in (0, 3, len(whole) // 2, len(whole) - 1)] + [absurd]:
        with connect(kafka) as s:
            s.sendall(frame(KEY, version, 3, body, flexible=flexible))
            assert closed_by_broker(s)
    with connect(kafka) as s:
        s.sendall(frame(API_VERSIONS, 0, 5))
        assert read_answer(s)[0] == 5


def test_a_request_naming_more_partitions_than_a_fetch_may_closes_the_connection(kafka):
    """OffsetForLeaderEpoch and ListOffsets are bounded as a fetch is (``KAFKA_FETCH_PARTITIONS_MAX``): past it
    the request is refused whole and its connection closed; at it, every partition is answered."""
    from kafka.protocol.consumer import ListOffsetsRequest

    from ring import limits

    def epochs_request(n: int) -> bytes:
        return bytes(OffsetForLeaderEpochRequest(replica_id=-1, topics=[Topic(topic="bounded", partitions=[
            Partition(partition=i, current_leader_epoch=-1, leader_epoch=0) for i in range(n)])]).encode(version=3))

    def offsets_request(n: int) -> bytes:
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
        return bytes(ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
            name="bounded", partitions=[part(partition_index=i, current_leader_epoch=-1, timestamp=-1)
                                        for i in range(n)])]).encode(version=5))

    most = limits.KAFKA_FETCH_PARTITIONS_MAX
    for key, version, make in ((KEY, 3, epochs_request), (2, 5, offsets_request)):
        with connect(kafka) as s:
            s.sendall(frame(key, version, 9, make(most)))
            assert read_answer(s)[0] == 9
        with connect(kafka) as s:
            s.sendall(frame(key, version, 9, make(most + 1)))
            assert closed_by_broker(s)


def client_log(name: str) -> tuple[logging.Logger, list[str]]:
    """A logger to hand librdkafka (its debug lines), and the list its lines land in."""
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(name)
    logger.addHandler(Lines())
    logger.setLevel(logging.DEBUG)
    return logger, lines


# --- Metadata's epochs, and Fetch's and ListOffsets' checks of them ------------------------------


def roundtrip(kafka, key: int, version: int, request, response_class) -> object:
    with connect(kafka) as s:
        s.sendall(frame(key, version, 11, bytes(request.encode(version=version))))
        corr, answer = read_answer(s)
    assert corr == 11
    return response_class.decode(answer, version=version)


def test_metadata_answers_the_leaders_epoch_and_fetch_and_list_offsets_check_the_one_a_client_names(kafka):
    from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    assert kafka.http.create_topic("epoch-checked", partitions=1).status == 201
    assert kafka.http.produce("epoch-checked", [{"n": i} for i in range(3)], partition=0).status == 200
    epoch = kafka.http.describe("epoch-checked")["partitions"][0]["epoch"]
    md = roundtrip(kafka, 3, 8, MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="epoch-checked")],
                                                allow_auto_topic_creation=False), MetadataResponse)
    assert [(p.partition_index, p.leader_epoch) for p in md.topics[0].partitions] == [(0, epoch)]

    def fetched(current: int, topic: str = "epoch-checked", partition: int = 0) -> tuple[int, int]:
        fp = FetchRequest.FetchTopic.FetchPartition(partition=partition, current_leader_epoch=current, fetch_offset=0,
                                                    log_start_offset=-1, partition_max_bytes=1 << 20)
        answer = roundtrip(kafka, 1, 11, FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic, partitions=[fp])],
            forgotten_topics_data=[], rack_id=""), FetchResponse)
        (p,) = answer.responses[0].partitions
        return p.error_code, p.high_watermark

    def listed(current: int, topic: str = "epoch-checked", partition: int = 0) -> tuple[int, int]:
        error, offset, answered_epoch = list_offsets(kafka, topic, partition, -1, current)
        assert answered_epoch == (epoch if error == NONE else -1)
        return error, offset

    for check in (fetched, listed):
        assert check(-1) == (NONE, 3) and check(epoch) == (NONE, 3)
        assert check(epoch - 1) == (FENCED_LEADER_EPOCH, -1)
        assert check(epoch + 1) == (UNKNOWN_LEADER_EPOCH, -1)
        # Where no epoch is known there is nothing to check: the read says what it finds.
        assert check(epoch, "no-such-topic")[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert check(epoch, "epoch-checked", 7)[0] == UNKNOWN_TOPIC_OR_PARTITION


def list_offsets(kafka, topic: str, partition: int, timestamp: int, current: int = -1) -> tuple[int, int, int]:
    """(error, offset, leader epoch) of one partition's ListOffsets v5 answer."""
    from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

    lp = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=partition,
                                                                  current_leader_epoch=current, timestamp=timestamp)
    answer = roundtrip(kafka, 2, 5, ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[
        ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[lp])]), ListOffsetsResponse)
    (p,) = answer.topics[0].partitions
    return p.error_code, p.offset, p.leader_epoch


@pytest.mark.parametrize("version", range(apis.SERVED[3][0], apis.SERVED[3][1] + 1))
def test_metadata_at_every_served_version_decodes_in_the_client(kafka, version):
    """Every Metadata version a client may ask, v9 flexible (librdkafka trusts leader epochs from v9 only)."""
    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from ring.kafka_api.cluster import node_id

    assert kafka.http.create_topic(f"described-{version}", partitions=2).status == 201
    names = [f"described-{version}", f"not-described-{version}"]
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names],
                              allow_auto_topic_creation=False)
    flexible = apis.flexible(3, version)
    with connect(kafka) as s:
        s.sendall(frame(3, version, 12, bytes(request.encode(version=version)), flexible=flexible))
        corr, answer = read_answer(s)
    assert corr == 12
    md = MetadataResponse.decode(answer[1:] if flexible else answer, version=version)
    me = node_id("ring-0")
    assert [(b.node_id, f"{b.host}:{b.port}") for b in md.brokers] == [(me, kafka.bootstrap)]
    epoch = kafka.http.describe(names[0])["partitions"][0]["epoch"]
    described, unknown = md.topics
    assert (described.name, described.error_code) == (names[0], NONE)
    assert [(p.partition_index, p.error_code, p.leader_id, p.replica_nodes, p.isr_nodes) for p in described.partitions] == [
        (0, NONE, me, [me], [me]), (1, NONE, me, [me], [me])]
    if version >= 7:
        assert [p.leader_epoch for p in described.partitions] == [epoch, epoch]
    if version >= 4:  # (below, a request asks for a missing topic to be created: the fixture's broker does)
        assert (unknown.name, unknown.error_code, unknown.partitions) == (names[1], UNKNOWN_TOPIC_OR_PARTITION, [])


# --- a consumer through a leader change ----------------------------------------------------------


def test_a_consumer_checks_its_position_with_the_new_leader_and_reads_on_with_nothing_lost_or_twice(tmp_path):
    """Only a partition's leader answers OffsetForLeaderEpoch (the others NOT_LEADER_OR_FOLLOWER). Metadata
    answers each partition's leader epoch: when the leader of a partition a confluent-kafka consumer reads
    is killed, the client learns the new leader's epoch, asks it with OffsetForLeaderEpoch
    where the epoch of the records it read ended (KIP-320), and reads on from its position: every record,
    in order, none twice. ListOffsets then answers each offset with the epoch of the batch holding it: the
    first leader's for the earliest and for a record it wrote (found by timestamp), the new leader's for
    the latest."""
    from confluent_kafka import Consumer, TopicPartition

    from tests.support import wait_for
    from tests.test_kafka_listener import kafka_cluster, led_topic, produce_keyed

    cluster, bootstraps = kafka_cluster(tmp_path)
    try:
        leaders = led_topic(cluster, bootstraps, "epoch-change", 1)
        victim = cluster.member(leaders[0])
        survivor = next(m for m in cluster if m is not victim)
        first_epoch = survivor.http.describe("epoch-change")["partitions"][0]["epoch"]
        landed = produce_keyed(",".join(bootstraps), "epoch-change", 100)
        for member, bootstrap in zip(cluster, bootstraps):  # only the leader answers where an epoch ended
            answered = ask(Listener(bootstrap), 4, [("epoch-change", [(0, -1, first_epoch)])])
            assert answered == [("epoch-change", [(0, NONE, first_epoch, 100) if member is victim else
                                                  (0, NOT_LEADER_OR_FOLLOWER, -1, -1)])]

        logger, lines = client_log("test.librdkafka.epochs")
        consumer = Consumer({"bootstrap.servers": ",".join(bootstraps), "group.id": "unused-no-commits",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 200, "debug": "protocol,metadata",
                             "topic.metadata.refresh.interval.ms": 1000}, logger=logger)
        got: list[tuple[int, bytes | None]] = []

        def read(count: int) -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append((msg.offset(), msg.value()))
            return len(got) >= count

        try:
            consumer.assign([TopicPartition("epoch-change", 0, 0)])
            wait_for("the first 100 records", lambda: read(100), interval_s=0)
            assert not any("OffsetForLeaderEpochRequest" in line for line in lines)  # no leader change yet
            victim.kill()
            wait_for("a new leader", lambda: (lambda p: p["leader"] not in (None, victim.name)
                                              and p["epoch"] > first_epoch)(
                survivor.http.describe("epoch-change")["partitions"][0]), timeout_s=60)
            more = produce_keyed(",".join(b for b, m in zip(bootstraps, cluster) if m is not victim),
                                 "epoch-change", 100)
            landed.update(more)
            wait_for("the next 100 records", lambda: read(200), timeout_s=90, interval_s=0)
            for _ in range(4):  # anything more would be a record read twice
                read(201)
        finally:
            consumer.close()
        assert [offset for offset, _ in got] == list(range(200))
        assert [value for _, value in got] == [landed[(0, offset)][2] for offset in range(200)]
        asked = [line for line in lines if "OffsetForLeaderEpochRe" in line]
        assert any("Sent OffsetForLeaderEpochRequest" in line for line in asked), [line for line in lines if "poch" in line][-40:]
        assert any("Received OffsetForLeaderEpochResponse" in line for line in asked), asked

        now = survivor.http.describe("epoch-change")["partitions"][0]
        leader = Listener(next(b for b, m in zip(bootstraps, cluster) if m.name == now["leader"]))
        stamped = 1_700_000_000_050  # the 51st record's timestamp (produce_keyed's)
        assert [list_offsets(leader, "epoch-change", 0, at) for at in (-2, stamped, -1)] == [
            (NONE, 0, first_epoch), (NONE, 50, first_epoch), (NONE, 200, now["epoch"])]
    finally:
        cluster.kill()


@pytest.mark.slow
def test_a_consumer_past_what_an_unclean_leader_holds_reads_on_from_where_its_epoch_ended(tmp_path):
    """The scenario of tests/test_unclean_election.py with a confluent-kafka consumer: it read every
    record the leader L acknowledged with F2 while F1 was paused; L dies, F2 comes back empty and an
    operator elects F1, whose log ends where its pause began. Asked where the consumer's epoch ended,
    F1 answers its own log's end: the client sees the truncation and reads on from there, so the
    records written after the election are read, each once (without epochs its fetch past F1's end
    would be out of range, and its reset policy, latest here, would decide what it skips)."""
    from confluent_kafka import Consumer, TopicPartition

    from tests.brokers import TestCluster
    from tests.support import wait_for
    from tests.test_disk_loss import TOPIC, acknowledge_without, in_sync_cluster, produce, wipe_and_restart
    from tests.test_unclean_election import REFUSED_WITHIN_S

    started: list[TestCluster] = []
    bootstrap_of: dict[str, str] = {}

    def make(size: int, *args: str) -> TestCluster:
        from ring.localcluster import free_port

        c = TestCluster(tmp_path / "cluster", size, args=list(args))
        for b in c.local.brokers:
            bootstrap_of[b.name] = f"127.0.0.1:{free_port()}"
            b.args += ["--kafka-listen", bootstrap_of[b.name]]
        started.append(c)
        return c.start()

    logger, lines = client_log("test.librdkafka.truncation")
    try:
        c, lead, f1, f2, acked, created_s = in_sync_cluster(make)
        f1.pause()
        try:
            acknowledge_without(c, lead, acked)
            consumer = Consumer({"bootstrap.servers": bootstrap_of[lead.name], "group.id": "unused-no-commits",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 200, "debug": "protocol",
                                 "auto.offset.reset": "latest", "topic.metadata.refresh.interval.ms": 1000},
                                logger=logger)
            got: list[tuple[int, bytes | None]] = []

            def read(count: int) -> bool:
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    got.append((msg.offset(), msg.value()))
                return len(got) >= count

            consumer.assign([TopicPartition(TOPIC, 0, 0)])
            wait_for("every acknowledged record", lambda: read(len(acked)), interval_s=0)
            lead.kill()
            wipe_and_restart(f2, created_s, wait=False)
        finally:
            f1.resume()
        f2.local.wait_ready()
        wait_for("writes refused as no_eligible_leader", lambda: (lambda s, d: s == 503 and d.get("error") == (
            "no_eligible_leader"))(*produce(f1, ["probe"])), REFUSED_WITHIN_S, 0.3)
        r = f2.http.post(f"/v1/topics/{TOPIC}/partitions/0/unclean-election")
        assert r.status == 200 and r.json()["leader"] == f1.name, r.body
        lost_from = r.json()["state"]["unclean_elections"][0]["from_offset"]
        assert 2 <= lost_from < len(acked)
        written = []
        for n in range(5):
            status, doc = produce(f1, [f"new-{n}"])
            assert status == 200, doc
            written.append((doc["base_offset"], f'"new-{n}"'.encode()))
        assert [offset for offset, _ in written] == list(range(lost_from, lost_from + 5))
        before = len(got)
        wait_for("the records written after the election", lambda: read(before + 5), timeout_s=90, interval_s=0)
        for _ in range(10):  # anything more would be a record read twice
            read(before + 6)
        consumer.close()
        assert [offset for offset, _ in got[:before]] == sorted(acked)
        assert got[before:] == written
        # (without epochs in Metadata the client never asks, and nothing but the race between its reset
        # and the writes above decides whether it reads them)
        assert any("Sent OffsetForLeaderEpochRequest" in line for line in lines)
        assert any("Received OffsetForLeaderEpochResponse" in line for line in lines)
    finally:
        for c in started:
            c.kill()
