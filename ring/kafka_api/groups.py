"""Kafka's classic consumer-group APIs on the listener: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit and OffsetFetch, and the admin APIs ListGroups, DescribeGroups and DeleteGroups,
each parsed (``group_codec``), carried out by ring's group
coordinator (``ring.groups.membership`` through ``Groups.membership``) and answered with Kafka's codes.

A group's coordinator is the broker ring's groups pick (the leader of the group's ``__offsets``
partition); FindCoordinator names that broker's Kafka listener, and any other broker answers the
group APIs NOT_COORDINATOR, so the client finds the coordinator again. ListGroups answers the groups this
broker coordinates (an admin client asks every broker and joins the answers); ring's own (HTTP) groups
are listed and described too, with the protocol type "ring". Every error of the broker
is answered with a code (``code_of_group``), never by closing the connection.
"""

from __future__ import annotations

from typing import Any

from ring import auth, limits
from ring.errors import BadRequest, Conflict, Forbidden, NotFound, RingError, Unavailable
from ring.group_requests import CommitOffsets, validate_name
from ring.groups import classic
from ring.groups.membership import DEAD, NOT_COORDINATOR, UNKNOWN_PARTITION
from ring.kafka_api import access, errors
from ring.kafka_api import group_codec as gc
from ring.kafka_api.cluster import kafka_brokers, node_id
from ring.kafka_api.wire import Reader, RequestHeader

OUTCOMES = {
    classic.OK: errors.NONE,
    classic.UNKNOWN_MEMBER: errors.UNKNOWN_MEMBER_ID,
    classic.ILLEGAL_GENERATION: errors.ILLEGAL_GENERATION,
    classic.REBALANCE_IN_PROGRESS: errors.REBALANCE_IN_PROGRESS,
    classic.INCONSISTENT_PROTOCOL: errors.INCONSISTENT_GROUP_PROTOCOL,
    classic.MEMBER_ID_REQUIRED: errors.MEMBER_ID_REQUIRED,
    classic.GROUP_FULL: errors.GROUP_MAX_SIZE_REACHED,
    classic.INVALID_SESSION_TIMEOUT: errors.INVALID_SESSION_TIMEOUT,
    classic.INVALID_REQUEST: errors.INVALID_REQUEST,
    NOT_COORDINATOR: errors.NOT_COORDINATOR,
    UNKNOWN_PARTITION: errors.UNKNOWN_TOPIC_OR_PARTITION,
}


def code_of_group(exc: RingError) -> int:
    """A broker error met serving a group request: not coordinating it here (the client finds the
    coordinator again), a group id ring does not take, a client that may not use groups (``access``), or
    anything else retriable at the coordinator."""
    if isinstance(exc, Forbidden):
        return errors.code_of(exc)
    if isinstance(exc, Unavailable):
        return errors.NOT_COORDINATOR
    if isinstance(exc, BadRequest):
        return errors.INVALID_GROUP_ID
    return errors.COORDINATOR_NOT_AVAILABLE


async def _guarded(group: str, work: Any, failed: Any, refused: Forbidden | None) -> bytes:
    """``work()``'s answer, or ``failed(code)`` for a client ``refused`` the group APIs
    (``access.group_refused``, read while the request was taken in), a group id ring refuses or a broker
    error."""
    try:
        if refused is not None:
            raise refused
        validate_name(group, "group")
        return await work()
    except RingError as exc:
        return failed(code_of_group(exc))


# --- FindCoordinator ---------------------------------------------------------------------------


async def _find_one(groups: Any, key_type: int, key: str, refused: Forbidden | None) -> gc.CoordinatorFound:
    if key_type != 0:  # transactions: none are served
        return gc.CoordinatorFound(key, -1, "", -1, errors.INVALID_REQUEST, "only group coordinators are served")
    if refused is not None:
        return gc.CoordinatorFound(key, -1, "", -1, errors.GROUP_AUTHORIZATION_FAILED, refused.message[:200])
    try:
        validate_name(key, "group")
        remote = await groups.coord.locate(key)
    except RingError as exc:
        code = errors.INVALID_GROUP_ID if isinstance(exc, BadRequest) else errors.COORDINATOR_NOT_AVAILABLE
        return gc.CoordinatorFound(key, -1, "", -1, code, exc.message[:200])
    name = groups.broker.config.name if remote is None else remote.name
    addr = kafka_brokers(groups.broker).get(name)
    if addr is None:
        return gc.CoordinatorFound(key, -1, "", -1, errors.COORDINATOR_NOT_AVAILABLE,
                                   f"the coordinator {name} has no Kafka listener")
    return gc.CoordinatorFound(key, node_id(name), addr[0], addr[1], errors.NONE, None)


def find_coordinator(groups: Any, header: RequestHeader, r: Reader) -> Any:
    req = gc.read_find_coordinator(header.api_version, r)
    refused = access.group_refused(access.principal())

    async def answer() -> bytes:
        most = limits.KAFKA_FIND_COORDINATOR_KEYS_MAX
        found = [await _find_one(groups, req.key_type, k, refused) for k in req.keys[:most]]
        found += [gc.CoordinatorFound(k[:255], -1, "", -1, errors.INVALID_REQUEST, f"at most {most} keys a request")
                  for k in req.keys[most:]]
        return gc.find_coordinator_answer(header.api_version, found)
    return answer()


# --- membership -------------------------------------------------------------------------------


def join_group(groups: Any, header: RequestHeader, r: Reader) -> Any:
    v = header.api_version
    req = gc.read_join_group(v, r)

    async def work() -> bytes:
        a = await groups.membership.join(req.group, req.member_id, v >= 4, header.client_id or "consumer",
                                         req.session_timeout_ms, req.rebalance_timeout_ms, req.protocol_type,
                                         req.protocols, header.client_host)
        return gc.join_group_answer(v, OUTCOMES[a.outcome], a.generation, a.protocol, a.leader, a.member_id,
                                    list(a.members))
    return _guarded(req.group, work, lambda code: gc.join_group_answer(v, code, -1, "", "", req.member_id[:255], []),
                    access.group_refused(access.principal()))


def sync_group(groups: Any, header: RequestHeader, r: Reader) -> Any:
    v = header.api_version
    req = gc.read_sync_group(v, r)

    async def work() -> bytes:
        a = await groups.membership.sync(req.group, req.generation, req.member_id, req.assignments)
        return gc.sync_group_answer(v, OUTCOMES[a.outcome], a.assignment)
    return _guarded(req.group, work, lambda code: gc.sync_group_answer(v, code, b""),
                    access.group_refused(access.principal()))


def heartbeat(groups: Any, header: RequestHeader, r: Reader) -> Any:
    v = header.api_version
    req = gc.read_heartbeat(v, r)

    async def work() -> bytes:
        outcome = await groups.membership.heartbeat(req.group, req.generation, req.member_id)
        return gc.heartbeat_answer(v, OUTCOMES[outcome])
    return _guarded(req.group, work, lambda code: gc.heartbeat_answer(v, code),
                    access.group_refused(access.principal()))


def leave_group(groups: Any, header: RequestHeader, r: Reader) -> Any:
    v = header.api_version
    req = gc.read_leave_group(v, r)

    async def work() -> bytes:
        outcomes = [OUTCOMES[o] for o in await groups.membership.leave(req.group, [m for m, _ in req.members])]
        top = outcomes[0] if v < 3 and outcomes else errors.NONE
        return gc.leave_group_answer(v, top, [(m, i, c) for (m, i), c in zip(req.members, outcomes)])
    return _guarded(req.group, work, lambda code: gc.leave_group_answer(v, code, []),
                    access.group_refused(access.principal()))


# --- offsets ----------------------------------------------------------------------------------


def offset_commit(groups: Any, header: RequestHeader, r: Reader) -> Any:
    """A topic the client may not consume (``access``) is answered TOPIC_AUTHORIZATION_FAILED, none of its
    partitions committed; the others are committed as if it were not named."""
    v = header.api_version
    req = gc.read_offset_commit(v, r)
    who = access.principal()
    refused = access.refusals(who, auth.CONSUME, (t for t, _ in req.topics))
    commit = CommitOffsets(req.group, req.member_id or None, None if req.generation < 0 else req.generation,
                           tuple((t, p, o) for t, parts in req.topics if t not in refused for p, o, _ in parts))

    def answer(codes: dict[tuple[str, int], int]) -> bytes:
        return gc.offset_commit_answer(v, [(t, [(p, codes[(t, p)]) for p, _, _ in parts]) for t, parts in req.topics])

    named = [(t, p) for t, parts in req.topics for p, _, _ in parts]

    async def work() -> bytes:
        outcomes = await groups.membership.commit(commit)
        codes = {tp: OUTCOMES[o] for tp, o in outcomes.items()}
        codes.update({(t, p): errors.TOPIC_AUTHORIZATION_FAILED for t, p in named if t in refused})
        return answer(codes)
    return _guarded(req.group, work, lambda code: answer({tp: code for tp in named}), access.group_refused(who))


def offset_fetch(groups: Any, header: RequestHeader, r: Reader) -> Any:
    """A topic named that the client may not consume (``access``) has its partitions answered
    TOPIC_AUTHORIZATION_FAILED; a fetch of every committed partition (no topics named) leaves its
    topics out."""
    v = header.api_version
    req = gc.read_offset_fetch(v, r)
    who = access.principal()
    refused = access.refusals(who, auth.CONSUME, (t for t, _ in req.topics or []))

    async def work() -> bytes:
        asked = req.topics if not refused else [(t, parts) for t, parts in req.topics if t not in refused]
        found = await groups.membership.committed(req.group, asked)
        if req.topics is None and who is not None:
            hidden = access.refusals(who, auth.CONSUME, (t for t, _ in found))
            found = [(t, parts) for t, parts in found if t not in hidden]
        answered = [(t, [(p, o, errors.NONE) for p, o in parts]) for t, parts in found]
        if refused:  # in the request's order, each refused topic's partitions answered with the refusal
            rest = iter(answered)
            answered = [(t, [(p, -1, errors.TOPIC_AUTHORIZATION_FAILED) for p in parts]) if t in refused
                        else next(rest) for t, parts in req.topics]
        return gc.offset_fetch_answer(v, errors.NONE, answered)

    def failed(code: int) -> bytes:
        topics = [(t, [(p, -1, code) for p in parts]) for t, parts in req.topics or []]
        return gc.offset_fetch_answer(v, code, topics)
    return _guarded(req.group, work, failed, access.group_refused(who))


# --- admin: ListGroups, DescribeGroups, DeleteGroups -------------------------------------------

KAFKA_STATES = {classic.EMPTY: "Empty", classic.STABLE: "Stable", classic.PREPARING: "PreparingRebalance",
                classic.COMPLETING: "CompletingRebalance", DEAD: "Dead"}


def list_groups(groups: Any, header: RequestHeader, r: Reader) -> Any:
    v = header.api_version

    async def answer() -> bytes:
        try:
            listed = await groups.membership.listed()
        except RingError:
            return gc.list_groups_answer(v, errors.COORDINATOR_NOT_AVAILABLE, [])
        return gc.list_groups_answer(v, errors.NONE, [(g.name, g.protocol_type) for g in listed])
    return answer()


async def _describe_one(groups: Any, group: str) -> gc.DescribedGroup:
    try:
        validate_name(group, "group")
        view = await groups.membership.described(group)
    except RingError as exc:
        return gc.DescribedGroup(code_of_group(exc), group, "", "", "", [])
    return gc.DescribedGroup(errors.NONE, group, KAFKA_STATES[view.state], view.protocol_type, view.protocol,
                             view.members)


def describe_groups(groups: Any, header: RequestHeader, r: Reader) -> Any:
    req = gc.read_describe_groups(header.api_version, r)

    async def answer() -> bytes:
        most = limits.KAFKA_GROUPS_PER_REQUEST_MAX
        described = [await _describe_one(groups, g) for g in req.groups[:most]]
        described += [gc.DescribedGroup(errors.INVALID_REQUEST, g, "", "", "", []) for g in req.groups[most:]]
        return gc.describe_groups_answer(header.api_version, described)
    return answer()


async def _delete_one(groups: Any, group: str) -> int:
    try:
        await groups.delete(group)
    except NotFound:
        return errors.GROUP_ID_NOT_FOUND
    except Conflict as exc:
        return errors.NON_EMPTY_GROUP if exc.extra.get("reason") == "group_not_empty" else code_of_group(exc)
    except RingError as exc:
        return code_of_group(exc)
    return errors.NONE


def delete_groups(groups: Any, header: RequestHeader, r: Reader) -> Any:
    """Only a client with admin on every topic (``access``) deletes a group; any other's are answered
    GROUP_AUTHORIZATION_FAILED."""
    names = gc.read_delete_groups(header.api_version, r)
    allowed = access.may_delete_groups(access.principal())

    async def answer() -> bytes:
        most = limits.KAFKA_GROUPS_PER_REQUEST_MAX
        results = [(g, await _delete_one(groups, g) if allowed else errors.GROUP_AUTHORIZATION_FAILED)
                   for g in names[:most]]
        results += [(g, errors.INVALID_REQUEST) for g in names[most:]]
        return gc.delete_groups_answer(header.api_version, results)
    return answer()


HANDLERS = {gc.FIND_COORDINATOR: find_coordinator, gc.JOIN_GROUP: join_group, gc.SYNC_GROUP: sync_group,
            gc.HEARTBEAT: heartbeat, gc.LEAVE_GROUP: leave_group, gc.OFFSET_COMMIT: offset_commit,
            gc.OFFSET_FETCH: offset_fetch, gc.LIST_GROUPS: list_groups, gc.DESCRIBE_GROUPS: describe_groups,
            gc.DELETE_GROUPS: delete_groups}
