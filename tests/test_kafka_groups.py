"""Kafka consumer groups through ring's Kafka listener (ring.kafka_api.groups, ring.groups.membership):
real librdkafka and kafka-python consumers on a real 3-broker ring, each broker with its own listener,
and raw frames for what no client sends. One cluster for the module."""

from __future__ import annotations

import socket
import struct
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.brokers import TestCluster
from tests.test_cli_commands import cli
from tests.support import wait_for

pytestmark = pytest.mark.integration

PARTITIONS, FIRST = 4, 10  # FIRST records in each partition before any commit


@pytest.fixture(scope="module")
def ring(kafka_cluster: TestCluster) -> TestCluster:
    return kafka_cluster


def produce(c: TestCluster, counts: dict[int, int], topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": c.kafka_bootstrap, "acks": "all"})
    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=f"{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0


def consumer(c: TestCluster, group: str, strategy: str = "range") -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": c.kafka_bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 200,
                     "partition.assignment.strategy": strategy})


def pump(consumers: dict[str, Any], seen: dict[str, list[tuple[int, int]]], until: Any, what: str) -> None:
    """Poll every consumer in turn (noting the records each reads) until ``until()``."""
    def step() -> Any:
        for name, c in consumers.items():
            m = c.poll(0.05)
            if m is not None and m.error() is None:
                seen[name].append((m.partition(), m.offset()))
        return until()
    wait_for(what, step, timeout_s=40, interval_s=0)


def read_records(kc: Any, n: int) -> list[tuple[int, int]]:
    """(partition, offset) of the first ``n`` records kafka-python's consumer ``kc`` polls, sorted."""
    got: list[tuple[int, int]] = []

    def more() -> bool:
        for batch in kc.poll(timeout_ms=200).values():
            got.extend((m.partition, m.offset) for m in batch)
        return len(got) >= n
    wait_for(f"{n} records through kafka-python's group consumer", more, timeout_s=40, interval_s=0)
    return sorted(got)


def held(c: Any) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def describe(c: TestCluster, group: str) -> dict[str, Any]:
    r = c[1].http.get(f"/v1/groups/{group}")  # any broker: it relays to the coordinator
    assert r.status == 200, r.body
    return r.json()


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_two_consumers_split_rebalance_and_a_new_one_resumes_from_the_commits(ring, strategy):
    from confluent_kafka import TopicPartition

    group, topic = f"billing-{strategy}", f"orders-{strategy}"
    assert ring[0].http.create_topic(topic, partitions=PARTITIONS).status == 201
    produce(ring, {p: FIRST for p in range(PARTITIONS)}, topic)
    a, b = consumer(ring, group, strategy), consumer(ring, group, strategy)
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": [], "c": []}
    a.subscribe([topic])
    pump({"a": a}, seen, lambda: held(a) == set(range(PARTITIONS)), "the first consumer gets all 4")
    b.subscribe([topic])
    pump({"a": a, "b": b}, seen, lambda: len(held(a)) == len(held(b)) == 2 and not held(a) & held(b),
         "two consumers split the 4 partitions")
    b.close()  # LeaveGroup: a gets all back
    pump({"a": a}, seen, lambda: held(a) == set(range(PARTITIONS)), "the other gets all 4 back")
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    pump({"a": a}, seen, lambda: [tp.offset for tp in a.position(tps)] == [FIRST] * PARTITIONS,
         "a reads every partition to its end")
    assert all(tp.error is None for tp in a.commit(asynchronous=False))
    a.close()

    doc = describe(ring, group)
    assert {(o["partition"], o["committed"]) for o in doc["offsets"]} == {(p, FIRST) for p in range(PARTITIONS)}
    produce(ring, {p: 5 for p in range(PARTITIONS)}, topic)
    c = consumer(ring, group, strategy)
    c.subscribe([topic])
    new = {(p, o) for p in range(PARTITIONS) for o in range(FIRST, FIRST + 5)}
    pump({"c": c}, seen, lambda: len(seen["c"]) >= len(new), "the new consumer reads what was not committed")
    pump({"c": c}, seen, lambda: True, "one more poll round")
    assert sorted(seen["c"]) == sorted(new)  # none read twice after the commit, none missed
    doc = describe(ring, group)
    assert doc["state"] == "stable" and [len(m["assignment"]) for m in doc["members"]] == [PARTITIONS]
    assert doc["members"][0]["topics"] == [topic] and doc["kafka"]["protocol"] == strategy
    shown = cli(ring[0].url, "groups", "describe", group)  # ring groups describe, as a shell runs it
    assert shown.returncode == 0 and doc["members"][0]["member"] in shown.stdout.decode()
    listed = ring[0].http.get("/v1/groups").json()["groups"]
    assert [g["state"] for g in listed if g["group"] == group] == ["stable"]

    # ring groups reset applies: the member's generation ends, it joins again and reads from the reset offsets
    r = ring[2].http.request("PUT", f"/v1/groups/{group}/offsets/{topic}", json_body={"to": "earliest"})
    assert r.status == 200, r.body
    pump({"c": c}, seen, lambda: seen["c"].count((0, 0)) == 1 and (0, FIRST + 4) in seen["c"][-30:],
         "the consumer reads partition 0 again from its start")
    c.close()


def test_kafka_python_group_consumer_commits_and_resumes(ring):
    from kafka import KafkaConsumer

    assert ring[0].http.create_topic("kp", partitions=2).status == 201
    produce(ring, {0: 3, 1: 3}, topic="kp")

    def read(n: int) -> list[tuple[int, int]]:
        kc = KafkaConsumer("kp", bootstrap_servers=ring.kafka_bootstrap.split(","), group_id="kp-group",
                           enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=6000,
                           heartbeat_interval_ms=200)
        got = read_records(kc, n)
        kc.poll(timeout_ms=500)  # nothing more
        kc.commit()
        kc.close()
        return got

    assert read(6) == [(p, o) for p in range(2) for o in range(3)]
    produce(ring, {0: 2, 1: 1}, topic="kp")
    assert read(3) == [(0, 3), (0, 4), (1, 3)]
    assert {(o["partition"], o["committed"]) for o in describe(ring, "kp-group")["offsets"]} == {(0, 5), (1, 4)}


# --- raw frames -----------------------------------------------------------------------------------


def call(addr: tuple[str, int], request: Any, version: int, response: Any, flexible: bool = False) -> Any:
    """One request (header v2 and its answer's header v1 when ``flexible``) on a connection of its own."""
    body = bytes(request.encode(version=version))
    head = struct.pack(">hhih", request.API_KEY, version, 7, 4) + b"test" + (b"\x00" if flexible else b"")
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
        size = struct.unpack(">i", _exactly(s, 4))[0]
        data = _exactly(s, size)
    assert struct.unpack(">i", data[:4])[0] == 7
    if flexible:
        assert data[4] == 0, "a response header v1 with no tagged fields"
    return response.decode(data[5 if flexible else 4:], version=version)


def _exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"closed after {len(out)} of {n} bytes"
        out += chunk
    return out


def test_hostile_joins_and_syncs_get_their_error_codes_and_nothing_is_kept(ring):
    from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                               JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                               OffsetCommitRequest, OffsetCommitResponse, SyncGroupRequest,
                                               SyncGroupResponse)
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    from ring import limits

    group = "hostile"
    addrs = [("127.0.0.1", int(a.rpartition(":")[2])) for a in ring.kafka_bootstrap.split(",")]
    found = call(addrs[0], FindCoordinatorRequest(key=group, key_type=0), 2, FindCoordinatorResponse)
    assert found.error_code == 0
    coord = (found.host, found.port)
    other = next(a for a in addrs if a != coord)
    most = limits.KAFKA_FIND_COORDINATOR_KEYS_MAX
    many = call(other, FindCoordinatorRequest(key_type=0, coordinator_keys=[group] * (most + 1)), 4,
                FindCoordinatorResponse, flexible=True)
    assert [(c.error_code, c.port) for c in many.coordinators] == [(0, found.port)] * most + [(42, -1)]
    txn = call(other, FindCoordinatorRequest(key_type=1, coordinator_keys=["t"]), 4, FindCoordinatorResponse,
               flexible=True)
    assert [c.error_code for c in txn.coordinators] == [42]  # INVALID_REQUEST: no transaction coordinators
    proto = JoinGroupRequest.JoinGroupRequestProtocol

    def join(member_id: str, metadata: bytes = b"\x00\x00") -> Any:
        return call(coord, JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000,
                                            member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                            protocols=[proto(name="range", metadata=metadata)]), 5,
                    JoinGroupResponse)

    def sync(member_id: str, generation: int) -> Any:
        a = SyncGroupRequest.SyncGroupRequestAssignment
        return call(coord, SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                                            group_instance_id=None,
                                            assignments=[a(member_id=member_id, assignment=b"mine")]), 3,
                    SyncGroupResponse)

    def nothing_kept() -> None:
        assert ring[0].http.get(f"/v1/groups/{group}").status == 404

    assert join("", b"x" * (limits.KAFKA_GROUP_METADATA_BYTES_MAX + 1)).error_code == 42  # INVALID_REQUEST
    nothing_kept()
    enormous = join("m" * 32_767)  # the longest a string can be
    assert (enormous.error_code, enormous.member_id) == (25, "")  # UNKNOWN_MEMBER_ID, not echoed
    nothing_kept()
    assert sync("nobody", 1).error_code == 25
    nothing_kept()

    first = join("")
    assert first.error_code == 79  # MEMBER_ID_REQUIRED, with the id to join with
    joined = join(first.member_id)
    assert (joined.error_code, joined.generation_id, joined.leader) == (0, 1, first.member_id)
    assert sync(first.member_id, 7).error_code == 22  # ILLEGAL_GENERATION
    assert sync(first.member_id, 1).error_code == 0
    hb = HeartbeatRequest(group_id=group, generation_id=1, member_id=first.member_id, group_instance_id=None)
    assert call(other, hb, 3, HeartbeatResponse).error_code == 16  # NOT_COORDINATOR: find it again
    assert call(coord, hb, 3, HeartbeatResponse).error_code == 0
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    commit = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=1, member_id=first.member_id,
                                 group_instance_id=None, topics=[t(name="no-such-topic", partitions=[
                                     t.OffsetCommitRequestPartition(partition_index=0, committed_offset=5,
                                                                    committed_leader_epoch=-1,
                                                                    committed_metadata="")])])
    answer = call(coord, commit, 7, OffsetCommitResponse)
    assert [p.error_code for p in answer.topics[0].partitions] == [3]  # UNKNOWN_TOPIC_OR_PARTITION
    assert describe(ring, group)["offsets"] == []  # nothing committed
    assert describe(ring, group)["members"][0]["member"] == first.member_id
    refused = ring[0].http.post(f"/v1/groups/{group}/members", json_body={"consumer": "c", "topics": ["t"]})
    assert (refused.status, refused.json().get("reason")) == (409, "kafka_group")  # one kind of member a group
    ident = LeaveGroupRequest.MemberIdentity
    left = call(coord, LeaveGroupRequest(group_id=group, members=[ident(member_id=first.member_id)]), 3,
                LeaveGroupResponse)
    assert left.error_code == 0 and [m.error_code for m in left.members] == [0]
    nothing_kept()


def test_a_kafka_join_to_a_group_of_ring_consumers_is_refused(ring):
    from kafka.protocol.consumer.group import JoinGroupRequest, JoinGroupResponse
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    assert ring[0].http.create_topic("ring-only", partitions=1).status == 201
    r = ring[0].http.post("/v1/groups/ring-group/members", json_body={"consumer": "c", "topics": ["ring-only"]})
    assert r.status == 200, r.body
    bootstrap = ("127.0.0.1", int(ring.kafka_bootstrap.split(",")[0].rpartition(":")[2]))
    found = call(bootstrap, FindCoordinatorRequest(key="ring-group", key_type=0), 2, FindCoordinatorResponse)
    proto = JoinGroupRequest.JoinGroupRequestProtocol
    req = JoinGroupRequest(group_id="ring-group", session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                           group_instance_id=None, protocol_type="consumer",
                           protocols=[proto(name="range", metadata=b"")])
    assert call((found.host, found.port), req, 3, JoinGroupResponse).error_code == 23  # INCONSISTENT_GROUP_PROTOCOL
    assert [m["member"] for m in describe(ring, "ring-group")["members"]] == ["c"]


@pytest.fixture
def own(tmp_path: Path) -> Iterator[TestCluster]:
    """A cluster of the test's own, for a test that kills a broker."""
    c = TestCluster(tmp_path, size=3, kafka=True).start()
    yield c
    c.kill()


def test_a_consumer_follows_its_group_to_a_new_coordinator_when_the_old_one_dies(own):
    """On a cluster of its own: it kills a broker. The membership is the coordinator's alone; the committed offsets
    are in __offsets, so the consumer joins again at the new coordinator and goes on from its commits."""
    from confluent_kafka import KafkaException, TopicPartition

    ring = own
    topic, group = "fo", "fo-group"
    assert ring[0].http.create_topic(topic, partitions=2).status == 201
    produce(ring, {0: 5, 1: 5}, topic)
    x = consumer(ring, group)
    seen: dict[str, list[tuple[int, int]]] = {"x": []}
    x.subscribe([topic])
    pump({"x": x}, seen, lambda: len(seen["x"]) == 10, "x reads the first 10")
    assert all(tp.error is None for tp in x.commit(asynchronous=False))
    old = describe(ring, group)["coordinator"]
    next(m for m in ring if m.name == old).kill()
    produce(ring, {0: 5, 1: 5}, topic)
    pump({"x": x}, seen, lambda: len(set(seen["x"])) == 20, "x reads the next 10 through the new coordinator")

    tps = [TopicPartition(topic, p) for p in range(2)]

    def commit() -> bool:
        """Refused (UNKNOWN_MEMBER_ID) until x has joined at the new coordinator, which polling does."""
        m = x.poll(0.05)
        if m is not None and m.error() is None:
            seen["x"].append((m.partition(), m.offset()))
        return all(tp.error is None for tp in x.commit(offsets=[TopicPartition(topic, p, 10) for p in range(2)],
                                                       asynchronous=False))
    wait_for("x's commit at the new coordinator", commit, timeout_s=40, interval_s=0, errors=(KafkaException,))
    assert [tp.offset for tp in x.committed(tps, timeout=10)] == [10, 10]  # OffsetFetch at the new coordinator
    x.close()
    assert sorted(set(seen["x"])) == [(p, o) for p in range(2) for o in range(10)]  # none missed
    # Read again at most what was read after the last commit, before the rejoin at the new coordinator
    # assigned the partitions afresh from the committed offsets (at-least-once, as in Kafka).
    assert all(o >= 5 for (p, o), n in Counter(seen["x"]).items() if n > 1)
    alive = next(m for m in ring if m.name != old)
    doc = alive.http.get(f"/v1/groups/{group}").json()
    assert doc["coordinator"] != old and {(o["partition"], o["committed"]) for o in doc["offsets"]} == {(0, 10),
                                                                                                      (1, 10)}
