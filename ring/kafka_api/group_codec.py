"""The request and answer bodies of Kafka's classic consumer-group APIs, at the versions served.

FindCoordinator (v0-4), JoinGroup (v2-5), SyncGroup (v0-3), Heartbeat (v0-3), LeaveGroup (v0-3),
OffsetCommit (v2-7) and OffsetFetch (v1-5), and the admin APIs DescribeGroups (v0-4), ListGroups
(v0-2) and DeleteGroups (v0-1): what Kafka 4.x clients negotiate with a broker serving
these ranges (Kafka 4.0 dropped JoinGroup v0-1, OffsetCommit v0-1 and OffsetFetch v0). Of them only
FindCoordinator v3-4 are flexible versions (compact fields, tagged fields, response header v1).

``read_*`` parse a request body into a plain value (``Reader`` raises ``Malformed`` at the first
field that does not fit the frame); ``*_answer`` build an answer body. No decision is made here:
that is the coordinator's (``ring.groups.classic``) and the handlers' (``groups``).
"""

from __future__ import annotations

from typing import NamedTuple

from ring.kafka_api.wire import Reader, Writer

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 15, 16, 42

VERSIONS = {FIND_COORDINATOR: (0, 4), JOIN_GROUP: (2, 5), SYNC_GROUP: (0, 3), HEARTBEAT: (0, 3),
            LEAVE_GROUP: (0, 3), OFFSET_COMMIT: (2, 7), OFFSET_FETCH: (1, 5), DESCRIBE_GROUPS: (0, 4),
            LIST_GROUPS: (0, 2), DELETE_GROUPS: (0, 1)}
# The first flexible version of each (only FindCoordinator's are served).
FLEXIBLE_FROM = {FIND_COORDINATOR: 3, JOIN_GROUP: 6, SYNC_GROUP: 4, HEARTBEAT: 4, LEAVE_GROUP: 4,
                 OFFSET_COMMIT: 8, OFFSET_FETCH: 6, DESCRIBE_GROUPS: 5, LIST_GROUPS: 3, DELETE_GROUPS: 2}
# DescribeGroups v3+'s authorized_operations when the client did not ask for them (or, here, always:
# the listener has no per-group authorization to report).
AUTHORIZED_OPERATIONS_UNKNOWN = -(1 << 31)


def _bytes(r: Reader) -> bytes:
    b = r.nullable_bytes()
    return b"" if b is None else bytes(b)


# --- FindCoordinator ---------------------------------------------------------------------------


class FindCoordinator(NamedTuple):
    key_type: int  # 0 group, 1 transaction
    keys: list[str]


def read_find_coordinator(version: int, r: Reader) -> FindCoordinator:
    if version >= 4:
        key_type = r.int8()
        keys = r.compact_array(Reader.compact_string) or []
    elif version == 3:
        keys = [r.compact_string()]
        key_type = r.int8()
    else:
        keys = [r.string()]
        key_type = r.int8() if version >= 1 else 0
    if version >= 3:
        r.tagged_fields()
    return FindCoordinator(key_type, keys)


class CoordinatorFound(NamedTuple):
    key: str
    node_id: int
    host: str
    port: int
    error: int
    message: str | None


def find_coordinator_answer(version: int, found: list[CoordinatorFound]) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)  # throttle_time_ms
    if version >= 4:
        w.compact_array_len(len(found))
        for c in found:
            w.compact_string(c.key).int32(c.node_id).compact_string(c.host).int32(c.port)
            w.int16(c.error).compact_string(c.message).tagged_fields()
        return bytes(w.tagged_fields().buf)
    assert len(found) == 1, found
    c = found[0]
    w.int16(c.error)
    if version >= 3:
        w.compact_string(c.message).int32(c.node_id).compact_string(c.host).int32(c.port)
        return bytes(w.tagged_fields().buf)
    if version >= 1:
        w.nullable_string(c.message)
    return bytes(w.int32(c.node_id).string(c.host).int32(c.port).buf)


# --- JoinGroup ---------------------------------------------------------------------------------


class JoinGroup(NamedTuple):
    group: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (name, metadata), in the member's order of preference


def read_join_group(version: int, r: Reader) -> JoinGroup:
    group, session, rebalance, member = r.string(), r.int32(), r.int32(), r.string()
    instance = r.nullable_string() if version >= 5 else None
    ptype = r.string()
    protocols = r.array(lambda r: (r.string(), _bytes(r))) or []
    return JoinGroup(group, session, rebalance, member, instance, ptype, protocols)


def join_group_answer(version: int, error: int, generation: int, protocol: str, leader: str, member_id: str,
                      members: list[tuple[str, bytes]]) -> bytes:
    w = Writer().int32(0).int16(error).int32(generation).string(protocol).string(leader).string(member_id)
    w.array_len(len(members))
    for mid, metadata in members:
        w.string(mid)
        if version >= 5:
            w.nullable_string(None)  # group_instance_id: members are dynamic
        w.nullable_bytes(metadata)
    return bytes(w.buf)


# --- SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------------------


class SyncGroup(NamedTuple):
    group: str
    generation: int
    member_id: str
    instance_id: str | None
    assignments: list[tuple[str, bytes]]  # (member id, assignment): the leader's, empty from the others


def read_sync_group(version: int, r: Reader) -> SyncGroup:
    group, generation, member = r.string(), r.int32(), r.string()
    instance = r.nullable_string() if version >= 3 else None
    assignments = r.array(lambda r: (r.string(), _bytes(r))) or []
    return SyncGroup(group, generation, member, instance, assignments)


def sync_group_answer(version: int, error: int, assignment: bytes) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)
    return bytes(w.int16(error).nullable_bytes(assignment).buf)


class Heartbeat(NamedTuple):
    group: str
    generation: int
    member_id: str
    instance_id: str | None


def read_heartbeat(version: int, r: Reader) -> Heartbeat:
    group, generation, member = r.string(), r.int32(), r.string()
    return Heartbeat(group, generation, member, r.nullable_string() if version >= 3 else None)


def heartbeat_answer(version: int, error: int) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)
    return bytes(w.int16(error).buf)


class LeaveGroup(NamedTuple):
    group: str
    members: list[tuple[str, str | None]]  # (member id, group instance id)


def read_leave_group(version: int, r: Reader) -> LeaveGroup:
    group = r.string()
    if version >= 3:
        return LeaveGroup(group, r.array(lambda r: (r.string(), r.nullable_string())) or [])
    return LeaveGroup(group, [(r.string(), None)])


def leave_group_answer(version: int, error: int, members: list[tuple[str, str | None, int]]) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)
    w.int16(error)
    if version >= 3:
        w.array_len(len(members))
        for mid, instance, code in members:
            w.string(mid).nullable_string(instance).int16(code)
    return bytes(w.buf)


# --- OffsetCommit, OffsetFetch -------------------------------------------------------------------


class OffsetCommit(NamedTuple):
    group: str
    generation: int  # -1 (with member id ""): a commit of a consumer outside the group's membership
    member_id: str
    instance_id: str | None
    topics: list[tuple[str, list[tuple[int, int, str | None]]]]  # topic, [(partition, offset, metadata)]


def read_offset_commit(version: int, r: Reader) -> OffsetCommit:
    group, generation, member = r.string(), r.int32(), r.string()
    instance = r.nullable_string() if version >= 7 else None
    if version <= 4:
        r.int64()  # retention_time_ms: offsets are kept as ring keeps them (GROUP_OFFSETS_RETENTION_MS)

    def partition(r: Reader) -> tuple[int, int, str | None]:
        p, offset = r.int32(), r.int64()
        if version >= 6:
            r.int32()  # committed_leader_epoch: not kept
        return p, offset, r.nullable_string()

    topics = r.array(lambda r: (r.string(), r.array(partition) or [])) or []
    return OffsetCommit(group, generation, member, instance, topics)


def offset_commit_answer(version: int, topics: list[tuple[str, list[tuple[int, int]]]]) -> bytes:
    w = Writer()
    if version >= 3:
        w.int32(0)
    w.array_len(len(topics))
    for topic, parts in topics:
        w.string(topic).array_len(len(parts))
        for p, code in parts:
            w.int32(p).int16(code)
    return bytes(w.buf)


class OffsetFetch(NamedTuple):
    group: str
    topics: list[tuple[str, list[int]]] | None  # None: every partition the group has an offset in


def read_offset_fetch(version: int, r: Reader) -> OffsetFetch:
    group = r.string()
    topics = r.array(lambda r: (r.string(), r.array(Reader.int32) or []))
    if topics is None and version < 2:
        topics = []
    return OffsetFetch(group, topics)


def offset_fetch_answer(version: int, error: int, topics: list[tuple[str, list[tuple[int, int, int]]]]) -> bytes:
    """``topics``: [(topic, [(partition, committed offset or -1, error)])]."""
    w = Writer()
    if version >= 3:
        w.int32(0)
    w.array_len(len(topics))
    for topic, parts in topics:
        w.string(topic).array_len(len(parts))
        for p, offset, code in parts:
            w.int32(p).int64(offset)
            if version >= 5:
                w.int32(-1)  # committed_leader_epoch: not kept
            w.nullable_string("").int16(code)  # metadata: not kept
    if version >= 2:
        w.int16(error)
    return bytes(w.buf)


# --- the admin APIs: ListGroups, DescribeGroups, DeleteGroups -------------------------------------


def list_groups_answer(version: int, error: int, groups: list[tuple[str, str]]) -> bytes:
    """``groups``: [(group id, protocol type)]. (The request of v0-2 has no fields.)"""
    w = Writer()
    if version >= 1:
        w.int32(0)
    w.int16(error).array_len(len(groups))
    for group, protocol_type in groups:
        w.string(group).string(protocol_type)
    return bytes(w.buf)


class DescribeGroups(NamedTuple):
    groups: list[str]
    include_authorized_operations: bool


def read_describe_groups(version: int, r: Reader) -> DescribeGroups:
    groups = r.array(Reader.string) or []
    return DescribeGroups(groups, r.boolean() if version >= 3 else False)


class DescribedGroup(NamedTuple):
    error: int
    group: str
    state: str  # Kafka's names: Empty, Stable, PreparingRebalance, CompletingRebalance, Dead
    protocol_type: str
    protocol: str
    members: list[tuple[str, str, str, bytes, bytes]]  # (member id, client id, client host, metadata, assignment)


def describe_groups_answer(version: int, groups: list[DescribedGroup]) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)
    w.array_len(len(groups))
    for g in groups:
        w.int16(g.error).string(g.group).string(g.state).string(g.protocol_type).string(g.protocol)
        w.array_len(len(g.members))
        for member_id, client_id, host, metadata, assignment in g.members:
            w.string(member_id)
            if version >= 4:
                w.nullable_string(None)  # group_instance_id: members are dynamic
            w.string(client_id).string(host).nullable_bytes(metadata).nullable_bytes(assignment)
        if version >= 3:
            w.int32(AUTHORIZED_OPERATIONS_UNKNOWN)
    return bytes(w.buf)


def read_delete_groups(version: int, r: Reader) -> list[str]:
    return r.array(Reader.string) or []


def delete_groups_answer(version: int, results: list[tuple[str, int]]) -> bytes:
    """``results``: [(group id, error code)]."""
    w = Writer().int32(0).array_len(len(results))
    for group, code in results:
        w.string(group).int16(code)
    return bytes(w.buf)
