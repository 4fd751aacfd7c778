"""Kafka's classic group membership for one group, as a deterministic state machine beside ring's ``Group``.

Theory of operation. In Kafka's classic protocol the coordinator does not
assign partitions: it gathers the members (JoinGroup), picks a protocol every
member supports and a leader, hands the leader every member's metadata, and
passes on the assignment the leader's own assignor computed (SyncGroup). The
states are Kafka's:

* ``empty``: no member. A join starts a rebalance.
* ``preparing``: a rebalance is gathering members. It completes when every
  member has (re)joined, or at the rebalance deadline (the largest rebalance
  timeout of the members), which drops those that did not. Completing bumps
  the generation, picks the protocol (the one supported by every member that
  the most members prefer, ties by name) and the leader (the old one if it
  rejoined, else the first to join), and answers every join waiting.
* ``completing``: waiting for the leader's SyncGroup. It answers every sync
  waiting with its member's assignment and makes the group ``stable``. A
  leader that does not sync by the deadline is dropped and a new rebalance
  begins.
* ``stable``: members heartbeat within their session timeout; a member
  silent longer is dropped and a rebalance begins, as does a join of a new
  member, a known member's join with other metadata or from the leader, and a
  leave. Heartbeats during a rebalance answer ``rebalance_in_progress``, so
  members join again.

What is waited on is not held here: a join or sync that must wait returns
``WAIT`` and its answer is put in ``outbox`` (member id, ``JoinAnswer`` or
``SyncAnswer``) when it is decided; the driver (``membership``) drains it after
every step and answers the requests waiting. Time is passed in (``now``,
monotonic seconds); nothing here reads a clock or touches the log.

Membership is not persisted: committed offsets are, in ring's ``Group`` (its
``Commit`` events), which is what OffsetCommit and OffsetFetch read and
write. A new coordinator starts with no members; the members' next requests
are answered ``unknown_member`` or ``not_coordinator`` and they join again,
as Kafka clients do after a coordinator moves. A reset of the committed
offsets (``ring groups reset``) ``fence``\\ s the group: the generation moves on
at once, so a commit of the old generation (a member's commit of its old
position as it gives its partitions up) is refused, and every member joins
again and reads from the reset offsets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NamedTuple

from ring import limits

EMPTY, PREPARING, COMPLETING, STABLE = "empty", "preparing", "completing", "stable"

# Outcomes, named as Kafka's errors (``ring.kafka_api.errors`` maps them to codes).
OK = "ok"
WAIT = "wait"
UNKNOWN_MEMBER = "unknown_member"
ILLEGAL_GENERATION = "illegal_generation"
REBALANCE_IN_PROGRESS = "rebalance_in_progress"
INCONSISTENT_PROTOCOL = "inconsistent_group_protocol"
MEMBER_ID_REQUIRED = "member_id_required"
GROUP_FULL = "group_max_size_reached"
INVALID_SESSION_TIMEOUT = "invalid_session_timeout"
INVALID_REQUEST = "invalid_request"  # metadata or assignments over their limits, a negative offset


class JoinAnswer(NamedTuple):
    outcome: str
    generation: int = -1
    protocol: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # to the leader: every member's metadata for the protocol


class SyncAnswer(NamedTuple):
    outcome: str
    assignment: bytes = b""


@dataclass
class ClassicMember:
    id: str
    client_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    last_seen: float
    joining: bool = False  # a join of this member waits for the rebalance to complete
    syncing: bool = False  # a sync of this member waits for the leader's
    assignment: bytes = b""
    client_host: str = ""  # where its connection came from, as Kafka shows it ("/127.0.0.1"); for views only

    def expired(self, now: float) -> bool:
        return not self.joining and not self.syncing and now - self.last_seen > self.session_timeout_ms / 1000


def check_protocols(protocols: list[tuple[str, bytes]]) -> str | None:
    """Why a member's protocol list is refused (too many, or metadata too large), or None."""
    if not protocols or len(protocols) > limits.KAFKA_GROUP_PROTOCOLS_MAX:
        return f"a join names {len(protocols)} protocols (1-{limits.KAFKA_GROUP_PROTOCOLS_MAX})"
    if len({name for name, _ in protocols}) != len(protocols):
        return "a join names a protocol twice"
    for name, metadata in protocols:
        if len(name) > limits.KAFKA_GROUP_PROTOCOL_NAME_MAX or len(metadata) > limits.KAFKA_GROUP_METADATA_BYTES_MAX:
            return (f"protocol {name[:40]!r}: names up to {limits.KAFKA_GROUP_PROTOCOL_NAME_MAX} characters and "
                    f"metadata up to {limits.KAFKA_GROUP_METADATA_BYTES_MAX} bytes")
    return None


@dataclass
class ClassicGroup:
    name: str
    generation: int = 0
    state: str = EMPTY
    protocol_type: str = ""
    protocol: str = ""
    leader: str = ""
    members: dict[str, ClassicMember] = field(default_factory=dict)  # in order of joining
    pending: dict[str, float] = field(default_factory=dict)  # ids handed out (member_id_required) -> until
    deadline: float = 0.0  # when a rebalance (preparing) or the leader's sync (completing) is due
    outbox: list[tuple[str, JoinAnswer | SyncAnswer]] = field(default_factory=list)

    # --- JoinGroup ------------------------------------------------------------------------

    def join(self, member_id: str, new_id: str, require_id: bool, client_id: str, session_timeout_ms: int,
             rebalance_timeout_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
             now: float, client_host: str = "") -> JoinAnswer:
        """A JoinGroup. ``new_id`` is the id a member joining with none gets; with ``require_id`` (v4+) it is
        handed back first (``member_id_required``) and the member joins again with it."""
        if not limits.GROUP_SESSION_TIMEOUT_MS_MIN <= session_timeout_ms <= limits.GROUP_SESSION_TIMEOUT_MS_MAX:
            return JoinAnswer(INVALID_SESSION_TIMEOUT, member_id=member_id)
        if check_protocols(protocols) is not None:
            return JoinAnswer(INVALID_REQUEST, member_id=member_id)
        if self.members and (protocol_type != self.protocol_type or not self._common(protocols)):
            return JoinAnswer(INCONSISTENT_PROTOCOL, member_id=member_id)
        self._forget_pending(now)
        known = self.members.get(member_id)
        if known is None:
            if member_id and member_id not in self.pending:
                return JoinAnswer(UNKNOWN_MEMBER)  # (an id never handed out is not echoed back)
            if len(self.members) + len(self.pending) >= limits.GROUP_MEMBERS_MAX:
                return JoinAnswer(GROUP_FULL, member_id=member_id)
            if not member_id and require_id:
                self.pending[new_id] = now + session_timeout_ms / 1000
                return JoinAnswer(MEMBER_ID_REQUIRED, member_id=new_id)
            member_id = member_id or new_id
            self.pending.pop(member_id, None)
        rebalance_timeout_ms = min(max(rebalance_timeout_ms, session_timeout_ms),
                                   limits.KAFKA_GROUP_REBALANCE_TIMEOUT_MS_MAX)
        m = ClassicMember(member_id, client_id, session_timeout_ms, rebalance_timeout_ms, tuple(protocols), now,
                          client_host=client_host)
        if known is not None:
            m.assignment = known.assignment
            if self.state in (STABLE, COMPLETING) and known.protocols == m.protocols and member_id != self.leader:
                self.members[member_id] = m  # a follower that missed its answer: the generation as it is
                return self._join_answer(m)
            if known.syncing:  # it joins again instead: its sync is answered as stale
                self.outbox.append((member_id, SyncAnswer(REBALANCE_IN_PROGRESS)))
            if known.joining:  # a second join replaces the first, which is answered as a rebalance
                self.outbox.append((member_id, JoinAnswer(REBALANCE_IN_PROGRESS, member_id=member_id)))
        self.members[member_id] = m
        self.protocol_type = protocol_type
        m.joining = True
        self._prepare(now)
        self._try_complete(now)
        if m.joining:
            return JoinAnswer(WAIT, member_id=member_id)
        return self._take_answer(member_id)

    def _common(self, protocols: list[tuple[str, bytes]] | tuple[tuple[str, bytes], ...]) -> set[str]:
        names = {n for n, _ in protocols}
        for m in self.members.values():
            names &= {n for n, _ in m.protocols}
        return names

    def _forget_pending(self, now: float) -> None:
        for mid, until in list(self.pending.items()):
            if until < now:
                del self.pending[mid]

    def _prepare(self, now: float) -> None:
        """Begin a rebalance (a rebalance already begun keeps its deadline)."""
        if self.state == PREPARING:
            return
        for m in self.members.values():
            if m.syncing:
                m.syncing = False
                self.outbox.append((m.id, SyncAnswer(REBALANCE_IN_PROGRESS)))
        self.state = PREPARING
        self.deadline = now + max((m.rebalance_timeout_ms for m in self.members.values()), default=0) / 1000

    def _try_complete(self, now: float) -> None:
        if self.state != PREPARING:
            return
        if any(not m.joining for m in self.members.values()):
            if now < self.deadline:
                return
            for m in [m for m in self.members.values() if not m.joining]:
                del self.members[m.id]  # did not join again in time
        self.generation += 1
        if not self.members:
            self.state, self.protocol, self.leader, self.protocol_type = EMPTY, "", "", ""
            return
        self.protocol = self._pick_protocol()
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self.state = COMPLETING
        self.deadline = now + max(m.rebalance_timeout_ms for m in self.members.values()) / 1000
        for m in self.members.values():
            m.assignment = b""
            m.joining = False
            m.last_seen = now
            self.outbox.append((m.id, self._join_answer(m)))

    def _pick_protocol(self) -> str:
        common = self._common(next(iter(self.members.values())).protocols)
        assert common, "every member was let in only with a protocol in common"
        votes = {name: 0 for name in common}
        for m in self.members.values():
            votes[next(n for n, _ in m.protocols if n in common)] += 1
        return max(sorted(votes), key=lambda n: votes[n])

    def _join_answer(self, m: ClassicMember) -> JoinAnswer:
        members: tuple[tuple[str, bytes], ...] = ()
        if m.id == self.leader:
            members = tuple((o.id, dict(o.protocols)[self.protocol]) for o in self.members.values())
        return JoinAnswer(OK, self.generation, self.protocol, self.leader, m.id, members)

    def _take_answer(self, member_id: str) -> JoinAnswer:
        """The join answer of ``member_id`` just put in the outbox (its join completed the rebalance)."""
        for i, (mid, answer) in enumerate(self.outbox):
            if mid == member_id and isinstance(answer, JoinAnswer):
                del self.outbox[i]
                return answer
        raise AssertionError(f"no join answer for {member_id}")

    # --- SyncGroup, Heartbeat, LeaveGroup -------------------------------------------------

    def _check(self, member_id: str, generation: int, now: float) -> tuple[str, ClassicMember | None]:
        m = self.members.get(member_id)
        if m is None:
            return UNKNOWN_MEMBER, None
        if generation != self.generation:
            return ILLEGAL_GENERATION, m
        m.last_seen = now
        return OK, m

    def sync(self, member_id: str, generation: int, assignments: list[tuple[str, bytes]], now: float) -> SyncAnswer:
        outcome, m = self._check(member_id, generation, now)
        if outcome != OK:
            return SyncAnswer(outcome)
        assert m is not None
        if self.state == PREPARING:
            return SyncAnswer(REBALANCE_IN_PROGRESS)
        if self.state == STABLE:
            return SyncAnswer(OK, m.assignment)
        if member_id != self.leader:
            m.syncing = True
            return SyncAnswer(WAIT)
        given = dict(assignments)
        if sum(len(a) for a in given.values()) > limits.KAFKA_GROUP_ASSIGNMENT_BYTES_MAX:
            return SyncAnswer(INVALID_REQUEST)
        self.state = STABLE
        for o in self.members.values():
            o.assignment = given.get(o.id, b"")
            o.last_seen = now
            if o.syncing:
                o.syncing = False
                self.outbox.append((o.id, SyncAnswer(OK, o.assignment)))
        return SyncAnswer(OK, m.assignment)

    def heartbeat(self, member_id: str, generation: int, now: float) -> str:
        outcome, _ = self._check(member_id, generation, now)
        if outcome == OK and self.state == PREPARING:
            return REBALANCE_IN_PROGRESS
        return outcome

    def leave(self, member_id: str, now: float) -> str:
        m = self.members.pop(member_id, None)
        if m is None:
            return UNKNOWN_MEMBER
        self._answer_gone(m)
        self._prepare(now)
        self._try_complete(now)
        return OK

    def _answer_gone(self, m: ClassicMember) -> None:
        if m.joining:
            self.outbox.append((m.id, JoinAnswer(UNKNOWN_MEMBER, member_id=m.id)))
        if m.syncing:
            self.outbox.append((m.id, SyncAnswer(UNKNOWN_MEMBER)))

    # --- time and resets ------------------------------------------------------------------

    def tick(self, now: float) -> list[str]:
        """Drop members whose session ran out, complete a rebalance whose deadline passed, drop a leader
        that did not sync in time; the ids dropped."""
        self._forget_pending(now)
        gone = [m for m in self.members.values() if m.expired(now)]
        if self.state == COMPLETING and now >= self.deadline:
            gone += [m for m in self.members.values() if m.id == self.leader and m not in gone]
        for m in gone:
            del self.members[m.id]
            self._answer_gone(m)
        if gone:
            self._prepare(now)
        self._try_complete(now)
        return [m.id for m in gone]

    def fence(self, now: float) -> None:
        """The committed offsets were reset: commits of the generation so far are refused from now on, and
        every member joins again (and reads from the reset offsets)."""
        if not self.members:
            return
        self.generation += 1
        self._prepare(now)

    def check_commit(self, member_id: str, generation: int, now: float) -> str:
        """Whether a commit by ``member_id`` of ``generation`` is taken: a member's of the current generation
        (not while the leader's assignment is awaited), or one outside the membership (generation -1) when
        the group has no member."""
        if generation < 0 and not member_id:
            return OK if not self.members else ILLEGAL_GENERATION
        outcome, _ = self._check(member_id, generation, now)
        if outcome == OK and self.state == COMPLETING:
            return REBALANCE_IN_PROGRESS
        return outcome

    def idle(self) -> bool:
        """Nothing here worth keeping: no member, no id handed out."""
        return not self.members and not self.pending and not self.outbox


# --- the consumer protocol's metadata, read for views only -----------------------------------------


def _strings_and_parts(data: bytes, with_parts: bool) -> list:
    """The leading (version, [topic...]) or (version, [(topic, [partition...])...]) of a consumer
    protocol subscription or assignment; [] for anything that does not parse (it is the client's)."""
    try:
        pos, out = 2, []
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(min(count, limits.GROUP_MEMBER_TOPICS_MAX * 4)):
            (n,) = struct.unpack_from(">h", data, pos)
            topic = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            if not with_parts:
                out.append(topic)
                continue
            (k,) = struct.unpack_from(">i", data, pos)
            parts = list(struct.unpack_from(f">{k}i", data, pos + 4))
            pos += 4 + 4 * k
            out.extend((topic, p) for p in parts)
        return out
    except (struct.error, UnicodeDecodeError, ValueError):
        return []


def subscription_topics(metadata: bytes) -> list[str]:
    return _strings_and_parts(metadata, False)


def assignment_partitions(assignment: bytes) -> list[tuple[str, int]]:
    return sorted(_strings_and_parts(assignment, True))
