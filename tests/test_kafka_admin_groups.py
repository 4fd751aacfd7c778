"""Kafka's group admin APIs through ring's Kafka listener (ring.kafka_api.groups: ListGroups, DescribeGroups,
DeleteGroups): kafka-python's own ``KafkaAdminClient`` and ``KafkaConsumer`` on a real 3-broker ring, each
broker with its own listener, and raw frames for the answers of a broker that does not coordinate a group."""

from __future__ import annotations

import socket
import struct
from typing import Any, Iterator

import pytest

from tests.brokers import TestCluster
from tests.support import wait_for
from tests.test_cli_commands import cli
from tests.test_kafka_groups import call, produce, read_records

pytestmark = pytest.mark.integration

TOPIC, GROUP = "adm", "adm-group"


@pytest.fixture(scope="module")
def ring(kafka_cluster: TestCluster) -> TestCluster:
    return kafka_cluster


@pytest.fixture(scope="module")
def admin(ring: TestCluster) -> Iterator[Any]:
    from kafka import KafkaAdminClient

    a = KafkaAdminClient(bootstrap_servers=ring.kafka_bootstrap.split(","), request_timeout_ms=30000)
    yield a
    a.close()


def consumer(ring: TestCluster, group: str, reset: str = "earliest") -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(TOPIC, bootstrap_servers=ring.kafka_bootstrap.split(","), group_id=group,
                         client_id="adm-client", enable_auto_commit=False, auto_offset_reset=reset,
                         session_timeout_ms=6000, heartbeat_interval_ms=200)


def listed(admin: Any) -> dict[str, str]:
    """Group id -> protocol type, from every broker's ListGroups (kafka-python asks each and joins them)."""
    return {g["group_id"]: g["protocol_type"] for g in admin.list_groups()}


def committed(admin: Any, group: str) -> dict[int, int]:
    from kafka import TopicPartition

    offsets = admin.list_group_offsets({group: [TopicPartition(TOPIC, p) for p in range(2)]})[group]
    return {tp.partition: o.offset for tp, o in offsets.items()}


def test_a_kafka_group_is_listed_described_refused_deletion_while_in_use_then_deleted(ring, admin):
    assert ring[0].http.create_topic(TOPIC, partitions=2).status == 201
    produce(ring, {0: 3, 1: 3}, topic=TOPIC)
    kc = consumer(ring, GROUP)
    assert read_records(kc, 6) == [(p, o) for p in range(2) for o in range(3)]
    kc.commit()

    assert listed(admin)[GROUP] == "consumer"
    # Each broker lists the groups it coordinates: the admin client's union names the group once.
    assert [g["group_id"] for g in admin.list_groups()].count(GROUP) == 1
    doc = admin.describe_groups([GROUP])[GROUP]
    assert (doc["error"], doc["group_state"], doc["protocol_type"], doc["protocol_data"]) == (
        None, "Stable", "consumer", "range")
    [member] = doc["members"]
    assert member["client_id"] == "adm-client" and member["member_id"].startswith("adm-client-")
    assert member["client_host"] == "/127.0.0.1"
    assert member["member_metadata"]["topics"] == [TOPIC]
    assert member["member_assignment"]["assigned_partitions"] == [{"topic": TOPIC, "partitions": [0, 1]}]

    assert admin.delete_groups([GROUP]) == {GROUP: "NonEmptyGroupError"}
    assert committed(admin, GROUP) == {0: 3, 1: 3}  # nothing changed
    assert admin.describe_groups([GROUP])[GROUP]["members"][0]["member_id"] == member["member_id"]

    kc.close()  # leaves the group
    doc = admin.describe_groups([GROUP])[GROUP]
    assert (doc["error"], doc["group_state"], doc["members"]) == (None, "Empty", [])
    assert listed(admin)[GROUP] == ""  # committed offsets, no members

    assert admin.delete_groups([GROUP]) == {GROUP: "OK"}
    assert committed(admin, GROUP) == {0: -1, 1: -1}
    assert GROUP not in listed(admin)
    assert admin.describe_groups([GROUP])[GROUP]["group_state"] == "Dead"
    assert ring[1].http.get(f"/v1/groups/{GROUP}").status == 404  # the same group over HTTP
    assert admin.delete_groups([GROUP]) == {GROUP: "GroupIdNotFoundError"}

    again = consumer(ring, GROUP)  # no offsets: it starts from auto_offset_reset, the start of each partition
    assert read_records(again, 6) == [(p, o) for p in range(2) for o in range(3)]
    again.close()


def test_an_unknown_group_is_described_dead(admin):
    doc = admin.describe_groups(["never-used"])["never-used"]
    assert (doc["error"], doc["group_state"], doc["protocol_type"], doc["members"]) == (None, "Dead", "", [])
    assert "never-used" not in listed(admin)


def test_a_group_of_ring_consumers_is_listed_described_and_deleted_over_http_once_empty(ring, admin):
    group = "adm-ring-group"
    assert ring[0].http.create_topic("adm-ring", partitions=1).status == 201
    r = ring[0].http.post(f"/v1/groups/{group}/members", json_body={"consumer": "c1", "topics": ["adm-ring"]})
    assert r.status == 200, r.body
    r = ring[1].http.post(f"/v1/groups/{group}/offsets", json_body={
        "consumer": "c1", "offsets": [{"topic": "adm-ring", "partition": 0, "offset": 0}]})
    assert r.status == 200, r.body
    assert listed(admin)[group] == "ring"
    doc = admin.describe_groups([group])[group]
    assert (doc["group_state"], doc["protocol_type"], [m["member_id"] for m in doc["members"]]) == (
        "Stable", "ring", ["c1"])
    assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
    refused = ring[2].http.delete(f"/v1/groups/{group}")  # any broker: it relays to the coordinator
    assert (refused.status, refused.json().get("reason")) == (409, "group_not_empty")
    assert [m["member"] for m in ring[0].http.get(f"/v1/groups/{group}").json()["members"]] == ["c1"]
    refused_by_cli = cli(ring[1].url, "groups", "delete", group)  # ring groups delete, as a shell runs it
    assert refused_by_cli.returncode != 0 and "has members (1)" in refused_by_cli.stderr.decode()

    assert ring[0].http.delete(f"/v1/groups/{group}/members/c1").status == 200
    assert admin.describe_groups([group])[group]["group_state"] == "Empty"
    r = ring[2].http.delete(f"/v1/groups/{group}")
    assert (r.status, r.json()) == (200, {"deleted": group})
    assert admin.describe_groups([group])[group]["group_state"] == "Dead"  # both fronts: one delete
    assert group not in listed(admin)
    assert ring[2].http.delete(f"/v1/groups/{group}").status == 404
    r = ring[0].http.post(f"/v1/groups/{group}/offsets", json_body={  # a commit makes it again ...
        "offsets": [{"topic": "adm-ring", "partition": 0, "offset": 1}]})
    assert r.status == 200, r.body
    deleted = cli(ring[1].url, "groups", "delete", group)  # ... and the command deletes it
    assert deleted.returncode == 0 and f"deleted group {group}" in deleted.stdout.decode()
    assert admin.describe_groups([group])[group]["group_state"] == "Dead"


def coordinator_and_other(ring: TestCluster, group: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """The Kafka listener of the group's coordinator, and of another broker."""
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    addrs = [("127.0.0.1", int(a.rpartition(":")[2])) for a in ring.kafka_bootstrap.split(",")]
    found = call(addrs[0], FindCoordinatorRequest(key=group, key_type=0), 2, FindCoordinatorResponse)
    assert found.error_code == 0
    return (found.host, found.port), next(a for a in addrs if a != (found.host, found.port))


def test_a_broker_that_does_not_coordinate_the_group_answers_not_coordinator(ring):
    from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
                                      DescribeGroupsResponse)

    group = "adm-elsewhere"
    _, other = coordinator_and_other(ring, group)
    described = call(other, DescribeGroupsRequest(groups=[group], include_authorized_operations=False), 4,
                     DescribeGroupsResponse)
    assert [g.error_code for g in described.groups] == [16]  # NOT_COORDINATOR
    deleted = call(other, DeleteGroupsRequest(groups_names=[group]), 1, DeleteGroupsResponse)
    assert [(r.group_id, r.error_code) for r in deleted.results] == [(group, 16)]


@pytest.mark.parametrize("body", [
    pytest.param(struct.pack(">i", 2**30), id="group-count-past-the-frame"),
    pytest.param(struct.pack(">ih", 1, 50) + b"short", id="group-id-past-the-frame"),
])
def test_a_malformed_admin_request_closes_its_connection_and_the_next_is_answered(ring, body):
    from kafka.protocol.admin import DescribeGroupsRequest, DescribeGroupsResponse

    addr, _ = coordinator_and_other(ring, "adm-after")
    for api_key, version in ((15, 0), (42, 1)):  # DescribeGroups, DeleteGroups
        head = struct.pack(">hhih", api_key, version, 9, 4) + b"test"
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
            assert s.recv(1) == b"", "the broker closes the connection without an answer"
    answer = call(addr, DescribeGroupsRequest(groups=["adm-after"], include_authorized_operations=False), 0,
                  DescribeGroupsResponse)
    assert [(g.error_code, g.group_state) for g in answer.groups] == [(0, "Dead")]


def test_a_rebalance_is_described_as_it_goes(ring, admin):
    """Raw JoinGroup and SyncGroup frames walk a group through Kafka's states: a member's join waiting for
    another's is PreparingRebalance, a joined generation awaiting the leader's assignment
    CompletingRebalance, then Stable."""
    from kafka.protocol.consumer.group import (JoinGroupRequest, JoinGroupResponse, SyncGroupRequest,
                                               SyncGroupResponse)

    group = "adm-states"
    coord, _ = coordinator_and_other(ring, group)
    proto = JoinGroupRequest.JoinGroupRequestProtocol

    def join(member_id: str) -> JoinGroupRequest:
        return JoinGroupRequest(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=30000,
                                member_id=member_id, group_instance_id=None, protocol_type="consumer",
                                protocols=[proto(name="range", metadata=b"")])

    def state() -> str:
        return admin.describe_groups([group])[group]["group_state"]

    first = call(coord, join(""), 5, JoinGroupResponse).member_id  # MEMBER_ID_REQUIRED hands one out
    joined = call(coord, join(first), 5, JoinGroupResponse)
    assert (joined.error_code, joined.leader) == (0, first)
    assert state() == "CompletingRebalance"
    a = SyncGroupRequest.SyncGroupRequestAssignment
    synced = call(coord, SyncGroupRequest(group_id=group, generation_id=joined.generation_id, member_id=first,
                                          group_instance_id=None, assignments=[a(member_id=first, assignment=b"")]),
                  3, SyncGroupResponse)
    assert synced.error_code == 0 and state() == "Stable"
    second = call(coord, join(""), 5, JoinGroupResponse).member_id
    body = bytes(join(second).encode(version=5))
    head = struct.pack(">hhih", JoinGroupRequest.API_KEY, 5, 11, 4) + b"test"
    with socket.create_connection(coord, timeout=30) as waiting:  # answered once the first joins again
        waiting.sendall(struct.pack(">i", len(head) + len(body)) + head + body)
        wait_for("the group to prepare a rebalance", lambda: state() == "PreparingRebalance", timeout_s=20)
        assert sorted(m["member_id"] for m in admin.describe_groups([group])[group]["members"]) == sorted(
            [first, second])
    assert admin.delete_groups([group]) == {group: "NonEmptyGroupError"}
