"""The consumer-group APIs' bodies (ring.kafka_api.group_codec) against kafka-python's own protocol classes:
every request a client sends at every served version parses to what it said, and every answer built here
decodes in the client to what was meant."""

from __future__ import annotations

import pytest
from kafka.protocol.consumer.group import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest,
                                           JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
                                           OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
                                           OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from ring.kafka_api import group_codec as gc
from ring.kafka_api.wire import Malformed, Reader


def versions(api: int) -> list[int]:
    low, high = gc.VERSIONS[api]
    return list(range(low, high + 1))


def parsed(read, version: int, request) -> object:
    body = bytes(request.encode(version=version))
    r = Reader(body)
    value = read(version, r)
    assert r.left == 0, "the whole body was read"
    return value


@pytest.mark.parametrize("version", versions(gc.FIND_COORDINATOR))
def test_find_coordinator(version):
    if version >= 4:
        req = FindCoordinatorRequest(key_type=0, coordinator_keys=["g-1", "g-2"])
    else:
        req = FindCoordinatorRequest(key="g-1", key_type=0)
    got = parsed(gc.read_find_coordinator, version, req)
    assert got == gc.FindCoordinator(0, ["g-1", "g-2"] if version >= 4 else ["g-1"])
    found = [gc.CoordinatorFound("g-1", 17, "127.0.0.1", 9092, 0, None)]
    if version >= 4:
        found.append(gc.CoordinatorFound("g-2", -1, "", -1, 15, "no leader"))
    answer = FindCoordinatorResponse.decode(gc.find_coordinator_answer(version, found), version=version)
    if version >= 4:
        assert [(c.key, c.node_id, c.host, c.port, c.error_code, c.error_message) for c in answer.coordinators] == [
            ("g-1", 17, "127.0.0.1", 9092, 0, None), ("g-2", -1, "", -1, 15, "no leader")]
    else:
        assert (answer.error_code, answer.node_id, answer.host, answer.port) == (0, 17, "127.0.0.1", 9092)


@pytest.mark.parametrize("version", versions(gc.JOIN_GROUP))
def test_join_group(version):
    proto = JoinGroupRequest.JoinGroupRequestProtocol
    req = JoinGroupRequest(group_id="g", session_timeout_ms=45000, rebalance_timeout_ms=300000, member_id="m-1",
                           group_instance_id=None, protocol_type="consumer",
                           protocols=[proto(name="range", metadata=b"\x00\x01r"),
                                      proto(name="roundrobin", metadata=b"")])
    assert parsed(gc.read_join_group, version, req) == gc.JoinGroup(
        "g", 45000, 300000, "m-1", None, "consumer", [("range", b"\x00\x01r"), ("roundrobin", b"")])
    body = gc.join_group_answer(version, 0, 3, "range", "m-1", "m-2", [("m-1", b"a"), ("m-2", b"bb")])
    answer = JoinGroupResponse.decode(body, version=version)
    assert (answer.error_code, answer.generation_id, answer.protocol_name, answer.leader, answer.member_id) == (
        0, 3, "range", "m-1", "m-2")
    assert [(m.member_id, bytes(m.metadata)) for m in answer.members] == [("m-1", b"a"), ("m-2", b"bb")]


@pytest.mark.parametrize("version", versions(gc.SYNC_GROUP))
def test_sync_group(version):
    a = SyncGroupRequest.SyncGroupRequestAssignment
    req = SyncGroupRequest(group_id="g", generation_id=4, member_id="m-1", group_instance_id=None,
                           assignments=[a(member_id="m-1", assignment=b"x"), a(member_id="m-2", assignment=b"")])
    assert parsed(gc.read_sync_group, version, req) == gc.SyncGroup("g", 4, "m-1", None,
                                                                    [("m-1", b"x"), ("m-2", b"")])
    answer = SyncGroupResponse.decode(gc.sync_group_answer(version, 27, b"\x00\x03"), version=version)
    assert (answer.error_code, bytes(answer.assignment)) == (27, b"\x00\x03")


@pytest.mark.parametrize("version", versions(gc.HEARTBEAT))
def test_heartbeat(version):
    req = HeartbeatRequest(group_id="g", generation_id=2, member_id="m-1", group_instance_id=None)
    assert parsed(gc.read_heartbeat, version, req) == gc.Heartbeat("g", 2, "m-1", None)
    assert HeartbeatResponse.decode(gc.heartbeat_answer(version, 22), version=version).error_code == 22


@pytest.mark.parametrize("version", versions(gc.LEAVE_GROUP))
def test_leave_group(version):
    if version >= 3:
        ident = LeaveGroupRequest.MemberIdentity
        req = LeaveGroupRequest(group_id="g", members=[ident(member_id="m-1", group_instance_id=None),
                                                       ident(member_id="m-2", group_instance_id="i")])
        want = [("m-1", None), ("m-2", "i")]
    else:
        req = LeaveGroupRequest(group_id="g", member_id="m-1")
        want = [("m-1", None)]
    assert parsed(gc.read_leave_group, version, req) == gc.LeaveGroup("g", want)
    answer = LeaveGroupResponse.decode(gc.leave_group_answer(version, 0, [("m-1", None, 0), ("m-2", "i", 25)]),
                                       version=version)
    assert answer.error_code == 0
    if version >= 3:
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in answer.members] == [
            ("m-1", None, 0), ("m-2", "i", 25)]


@pytest.mark.parametrize("version", versions(gc.OFFSET_COMMIT))
def test_offset_commit(version):
    t = OffsetCommitRequest.OffsetCommitRequestTopic
    p = t.OffsetCommitRequestPartition
    req = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=5, member_id="m-1",
                              group_instance_id=None, retention_time_ms=-1,
                              topics=[t(name="clicks", partitions=[
                                  p(partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                                    committed_metadata="meta"),
                                  p(partition_index=3, committed_offset=0, committed_leader_epoch=-1,
                                    committed_metadata=None)])])
    assert parsed(gc.read_offset_commit, version, req) == gc.OffsetCommit(
        "g", 5, "m-1", None, [("clicks", [(0, 42, "meta"), (3, 0, None)])])
    answer = OffsetCommitResponse.decode(gc.offset_commit_answer(version, [("clicks", [(0, 0), (3, 22)])]),
                                         version=version)
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in answer.topics] == [
        ("clicks", [(0, 0), (3, 22)])]


@pytest.mark.parametrize("version", versions(gc.OFFSET_FETCH))
def test_offset_fetch(version):
    t = OffsetFetchRequest.OffsetFetchRequestTopic
    req = OffsetFetchRequest(group_id="g", topics=[t(name="clicks", partition_indexes=[0, 1, 2])])
    assert parsed(gc.read_offset_fetch, version, req) == gc.OffsetFetch("g", [("clicks", [0, 1, 2])])
    if version >= 2:  # null topics: every partition the group has an offset in
        assert parsed(gc.read_offset_fetch, version, OffsetFetchRequest(group_id="g", topics=None)) == \
            gc.OffsetFetch("g", None)
    body = gc.offset_fetch_answer(version, 0, [("clicks", [(0, 42, 0), (1, -1, 0), (2, -1, 3)])])
    answer = OffsetFetchResponse.decode(body, version=version)
    assert [(t.name, [(p.partition_index, p.committed_offset, p.error_code) for p in t.partitions])
            for t in answer.topics] == [("clicks", [(0, 42, 0), (1, -1, 0), (2, -1, 3)])]


def test_a_body_that_lies_about_its_lengths_is_malformed():
    proto = JoinGroupRequest.JoinGroupRequestProtocol
    body = bytes(JoinGroupRequest(group_id="g", session_timeout_ms=1, rebalance_timeout_ms=1, member_id="",
                                  protocol_type="consumer", protocols=[proto(name="range", metadata=b"abc")])
                 .encode(version=4))
    with pytest.raises(Malformed):
        gc.read_join_group(4, Reader(body[:-1]))  # the metadata's length runs past the frame
    with pytest.raises(Malformed):
        gc.read_offset_fetch(5, Reader(b"\x00\x01g\x7f\xff\xff\xff"))  # two billion topics in no bytes
