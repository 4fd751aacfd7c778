"""One consumer group as a deterministic state machine: members, generations, assignment, committed offsets.

Theory of operation. What must survive the coordinator is kept as events in
the offsets topic, and ``apply`` is the only way persisted state changes, so a
coordinator that replays the log (``codec``) ends in the state the old one had:

* ``Members``: a rebalance happened. The full membership (each member's
  topics, session timeout, client label and assignment) under a new
  generation.
* ``Commit``: committed offsets moved (``reset`` when an operator moved them,
  which also drops every member's uncommitted read position there).
* ``State``: the whole group at once (checkpoints; see ``coordinator``).
* ``Drop``: the group is forgotten (empty and unused for too long).

Every change a client asks for is first *proposed* (``propose_*``: validate
against the current state, return the event or None when nothing changes);
the driver persists the event and only then applies it, one at a time per
offsets partition, so an acknowledged change is in the log and the log's
order is the order of application. Liveness is not persisted: members'
``last_seen`` (any request counts as a heartbeat), read ``positions``
(where the member's next poll starts: past what it acknowledged receiving,
committed or not) and the poll ``answers`` it has not acknowledged
(``delivery``) live only here; a replayed member starts a fresh session.

Generations: a join of a new member (or a known one with other topics), a
leave, a session timeout, or a change in the partitions of a subscribed topic
bumps the generation and reassigns with ``assignment.assign`` (sticky). A
member keeps its read positions only for partitions it holds without a break,
so a partition that moved is read from its committed offset by its new owner.
A poll that names a generation other than the current one, a request from
an unknown member, or a commit of a partition the member does not hold, is
refused with 409 and ``rejoin: true``. A commit naming an older generation
is accepted for partitions the member has held without a break since that
generation (``Member.since``): nobody else can have read them meanwhile, so
a rebalance elsewhere in the group does not throw away a member's progress. Time is passed in (``now``: monotonic
seconds, ``now_ms``: wall milliseconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Union

from ring import limits
from ring.errors import BadRequest, Conflict, Overloaded
from ring.groups.assignment import TopicPartition, assign
from ring.groups.delivery import Answer

RESET_POLICIES = ("earliest", "latest")


# --- events (what the offsets topic holds) ------------------------------------------------


@dataclass(frozen=True)
class MemberSpec:
    """A member as persisted: who it is, what it reads, and what it was given."""

    id: str
    topics: tuple[str, ...]
    session_timeout_ms: int
    client: str | None
    reset: str  # where a partition without a committed offset starts: earliest | latest
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class Members:
    generation: int
    members: tuple[MemberSpec, ...]
    partitions: tuple[tuple[str, int], ...]  # topic -> partition count the assignment was made for
    ts_ms: int


@dataclass(frozen=True)
class Commit:
    offsets: tuple[tuple[str, int, int], ...]  # (topic, partition, next offset to read)
    ts_ms: int
    reset: bool = False


@dataclass(frozen=True)
class State:
    generation: int
    members: tuple[MemberSpec, ...]
    partitions: tuple[tuple[str, int], ...]
    committed: tuple[tuple[str, int, int], ...]
    ts_ms: int  # when the group was last used (a commit or a membership change)


@dataclass(frozen=True)
class Drop:
    ts_ms: int


Event = Union[Members, Commit, State, Drop]


# --- live state ----------------------------------------------------------------------------


@dataclass
class Member:
    spec: MemberSpec
    last_seen: float  # monotonic seconds of its last request
    positions: dict[TopicPartition, int] = field(default_factory=dict)  # acknowledged read positions
    polling: int = 0  # polls of this member running now (one at a time; see the driver)
    # The generation since which it has held each partition without a break, as far as this
    # state knows (a replayed member: from the generation replay found it in).
    since: dict[TopicPartition, int] = field(default_factory=dict)
    answers: dict[str, Answer] = field(default_factory=dict)  # token -> poll answer not acknowledged, oldest first

    @property
    def id(self) -> str:
        return self.spec.id

    def expired(self, now: float) -> bool:
        return self.polling == 0 and now - self.last_seen > self.spec.session_timeout_ms / 1000


class Group:
    def __init__(self, name: str) -> None:
        self.name = name
        self.generation = 0
        self.members: dict[str, Member] = {}
        self.partitions: dict[str, int] = {}  # what the current assignment was made for
        self.committed: dict[TopicPartition, int] = {}
        self.used_ms = 0  # wall time of the last persisted change
        self.dropped = False
        self.resets = 0  # resets applied here: a poll token names the state it was handed out in

    # --- applying persisted events --------------------------------------------------------

    def apply(self, event: Event, now: float) -> None:
        if isinstance(event, Commit):
            for topic, p, offset in event.offsets:
                self.committed[(topic, p)] = offset
                if event.reset:
                    for m in self.members.values():
                        m.positions.pop((topic, p), None)
            if event.reset:  # answers handed out before it acknowledge nothing after it
                self.resets += 1
                for m in self.members.values():
                    m.answers.clear()
        elif isinstance(event, Members):
            self._set_members(event.generation, event.members, event.partitions, now)
        elif isinstance(event, State):
            self._set_members(event.generation, event.members, event.partitions, now)
            self.committed = {(t, p): o for t, p, o in event.committed}
        else:
            assert isinstance(event, Drop), event
            self.members, self.partitions, self.committed = {}, {}, {}  # the generation stays: never reused
            self.used_ms, self.dropped = event.ts_ms, True
            return
        self.dropped = False
        self.used_ms = max(self.used_ms, event.ts_ms)

    def _set_members(self, generation: int, specs: Iterable[MemberSpec], partitions: Iterable[tuple[str, int]],
                     now: float) -> None:
        old = self.members
        self.members = {}
        for spec in specs:
            prev = old.get(spec.id)
            if prev is None:
                self.members[spec.id] = Member(spec, now, since={tp: generation for tp in spec.assignment})
                continue
            kept = set(spec.assignment) & set(prev.spec.assignment)
            positions = {tp: o for tp, o in prev.positions.items() if tp in kept}
            since = {tp: prev.since.get(tp, generation) if tp in kept else generation for tp in spec.assignment}
            self.members[spec.id] = Member(spec, prev.last_seen, positions, prev.polling, since, prev.answers)
        self.generation = generation
        self.partitions = dict(partitions)

    def snapshot(self, ts_ms: int | None = None) -> State:
        return State(self.generation, tuple(m.spec for m in self.members.values()),
                     tuple(sorted(self.partitions.items())),
                     tuple(sorted((t, p, o) for (t, p), o in self.committed.items())),
                     self.used_ms if ts_ms is None else ts_ms)

    # --- membership proposals -------------------------------------------------------------

    def propose_join(self, member_id: str, topics: Iterable[str], session_timeout_ms: int, client: str | None,
                     reset: str, partitions: Mapping[str, int], now: float, now_ms: int) -> Members | None:
        """None when ``member_id`` is already a member with these topics (a heartbeat)."""
        topics_t = tuple(sorted(set(topics)))
        assert topics_t and reset in RESET_POLICIES
        current = self.members.get(member_id)
        if current is not None:
            current.last_seen = now
            if current.spec.topics == topics_t and current.spec.session_timeout_ms == session_timeout_ms:
                return self.propose_refresh(partitions, now_ms)
        elif len(self.members) >= limits.GROUP_MEMBERS_MAX:
            raise Overloaded(f"group {self.name!r} already has {limits.GROUP_MEMBERS_MAX} members",
                             group=self.name)
        specs = {m.id: m.spec for m in self.members.values()}
        specs[member_id] = MemberSpec(member_id, topics_t, session_timeout_ms, client, reset, ())
        return self._rebalance(specs, partitions, now_ms)

    def propose_leave(self, member_id: str, now_ms: int, partitions: Mapping[str, int]) -> Members | None:
        if member_id not in self.members:
            return None
        specs = {m.id: m.spec for m in self.members.values() if m.id != member_id}
        return self._rebalance(specs, partitions, now_ms)

    def expired(self, now: float) -> list[str]:
        return sorted(m.id for m in self.members.values() if m.expired(now))

    def propose_expire(self, now: float, now_ms: int, partitions: Mapping[str, int]) -> Members | None:
        gone = set(self.expired(now))
        if not gone:
            return None
        specs = {m.id: m.spec for m in self.members.values() if m.id not in gone}
        return self._rebalance(specs, partitions, now_ms)

    def subscribed(self) -> set[str]:
        return {t for m in self.members.values() for t in m.spec.topics}

    def propose_refresh(self, partitions: Mapping[str, int], now_ms: int) -> Members | None:
        """A rebalance when a subscribed topic's partition count is not what the assignment was made for."""
        if not self.members:
            return None
        wanted = {t: partitions.get(t, 0) for t in self.subscribed()}
        if wanted == {t: self.partitions.get(t, 0) for t in wanted}:
            return None
        return self._rebalance({m.id: m.spec for m in self.members.values()}, partitions, now_ms)

    def _rebalance(self, specs: Mapping[str, MemberSpec], partitions: Mapping[str, int], now_ms: int) -> Members:
        topics = {t for s in specs.values() for t in s.topics}
        counts = {t: partitions.get(t, 0) for t in topics}
        previous = {m.id: m.spec.assignment for m in self.members.values()}
        result = assign({i: s.topics for i, s in specs.items()}, counts, previous)
        members = tuple(MemberSpec(s.id, s.topics, s.session_timeout_ms, s.client, s.reset, tuple(result[i]))
                        for i, s in sorted(specs.items()))
        return Members(self.generation + 1, members, tuple(sorted(counts.items())), now_ms)

    # --- checks and offsets ---------------------------------------------------------------

    def member(self, member_id: str, generation: int | None, now: float) -> Member:
        """The member, touched (a heartbeat); 409 with ``rejoin`` when it must join again."""
        m = self.members.get(member_id)
        if m is None:
            raise Conflict(f"{member_id!r} is not a member of group {self.name!r} (generation {self.generation}); "
                           "join again", group=self.name, consumer=member_id, generation=self.generation,
                           reason="unknown_member", rejoin=True)
        if generation is not None and generation != self.generation:
            raise Conflict(f"generation {generation} of group {self.name!r} is stale: the group is at generation "
                           f"{self.generation}; join again", group=self.name, consumer=member_id,
                           generation=self.generation, reason="stale_generation", rejoin=True)
        m.last_seen = now
        return m

    def holding(self, member_id: str, generation: int | None, tps: Iterable[TopicPartition], now: float) -> Member:
        """The member, which holds every one of ``tps`` now (and, if ``generation`` is an older one,
        has held them since); 409 with ``rejoin`` otherwise."""
        tps = list(tps)
        m = self.member(member_id, None, now)
        if generation is not None and generation != self.generation and (
                generation > self.generation or any(m.since.get(tp, generation + 1) > generation for tp in tps)):
            self.member(member_id, generation, now)  # 409: stale, and a partition may have moved meanwhile
        held = set(m.spec.assignment)
        foreign = sorted({tp for tp in tps if tp not in held})
        if foreign:
            raise Conflict(f"{member_id!r} does not hold {', '.join(f'{t}/{p}' for t, p in foreign[:5])} in "
                           f"generation {self.generation} of group {self.name!r}; join again",
                           group=self.name, consumer=member_id, generation=self.generation,
                           reason="not_assigned", rejoin=True)
        return m

    def propose_commit(self, member_id: str | None, generation: int | None,
                       offsets: Iterable[tuple[str, int, int]], now: float, now_ms: int) -> Commit:
        """A member's explicit commit: only partitions it holds now, and under an older generation
        only those it has held since. Without a member, only an empty group."""
        items = tuple(offsets)
        if member_id is None:
            if self.members:
                raise Conflict(f"group {self.name!r} has members: commits must name the consumer",
                               group=self.name, generation=self.generation, reason="group_active")
        else:
            self.holding(member_id, generation, [(t, p) for t, p, _ in items], now)
        for t, p, o in items:
            if type(o) is not int or o < 0 or type(p) is not int or p < 0:
                raise BadRequest(f"bad offset {o!r} for {t}/{p}: offsets and partitions are non-negative integers")
        return Commit(items, now_ms)

    def propose_poll_commit(self, m: Member, now_ms: int) -> Commit | None:
        """``m``'s positions (what it acknowledged), where they are past what is committed
        (an implicit commit never moves an offset back: an explicit commit or a reset may have)."""
        held = set(m.spec.assignment)
        moves = tuple(sorted((t, p, o) for (t, p), o in m.positions.items()
                             if (t, p) in held and o > self.committed.get((t, p), -1)))
        return Commit(moves, now_ms) if moves else None

    def hand_out(self, m: Member, answer: Answer) -> None:
        """``answer`` went out to ``m``: kept until acknowledged, or until newer ones push it out of
        a partition: at most ``GROUP_POLL_ANSWERS_UNACKED_MAX`` answers remembered read a partition,
        the oldest forgotten there first. Bounded per partition, not per member: a PolarStreams
        consumer has one answer out per broker it polls, each of other partitions."""
        if not answer.reads:
            return  # handed out nothing: there is nothing to acknowledge
        m.answers.pop(answer.token, None)
        tps = {(t, p) for t, p, _, _ in answer.reads}
        readers: dict[TopicPartition, int] = {}
        pushed_out: dict[str, set[TopicPartition]] = {}
        for token in reversed(list(m.answers)):  # newest first
            for t, p, _, _ in m.answers[token].reads:
                if (t, p) in tps:
                    readers[(t, p)] = n = readers.get((t, p), 0) + 1
                    if n >= limits.GROUP_POLL_ANSWERS_UNACKED_MAX:  # with ``answer``, one too many
                        pushed_out.setdefault(token, set()).add((t, p))
        for token, gone in pushed_out.items():
            _forget_reads(m, token, gone)
        m.answers[answer.token] = answer

    def acknowledge(self, m: Member, token: str | None) -> bool:
        """The client got the answer named ``token``: ``m``'s positions move to its ends, where they
        still are at its starts and ``m`` holds the partition. False for a token not (or no longer) known."""
        answer = m.answers.pop(token, None) if token else None
        if answer is None:
            return False
        held = set(m.spec.assignment)
        for t, p, start, end in answer.reads:
            if (t, p) in held and self.start_offset(m, (t, p)) == start:
                m.positions[(t, p)] = end
        return True

    def propose_reset(self, offsets: Iterable[tuple[str, int, int]], now_ms: int) -> Commit:
        return Commit(tuple(offsets), now_ms, reset=True)

    def seek(self, member_id: str, generation: int | None, positions: Iterable[tuple[str, int, int]],
             now: float) -> Member:
        """Set where the member's next poll reads partitions it holds (Kafka's seek): not persisted,
        like every read position; its committed offsets stay. Answers handed out before it no longer
        move those partitions when acknowledged: the seek says where reading goes on."""
        items = list(positions)
        m = self.holding(member_id, generation, [(t, p) for t, p, _ in items], now)
        for t, p, o in items:
            if type(o) is not int or o < 0:
                raise BadRequest(f"bad position {o!r} for {t}/{p}: a non-negative integer")
        m.positions.update({(t, p): o for t, p, o in items})
        sought = {(t, p) for t, p, _ in items}
        for token in list(m.answers):
            _forget_reads(m, token, sought)
        return m

    def start_offset(self, m: Member, tp: TopicPartition) -> int | None:
        """Where ``m`` reads ``tp`` next: its position, else the committed offset, else None (its reset policy)."""
        if tp in m.positions:
            return m.positions[tp]
        return self.committed.get(tp)

    def forgettable(self, now_ms: int) -> bool:
        """Empty and unused for ``GROUP_OFFSETS_RETENTION_MS``: the next checkpoint leaves it out."""
        return not self.members and now_ms - self.used_ms > limits.GROUP_OFFSETS_RETENTION_MS

    def state(self) -> str:
        if not self.members:
            return "empty"
        return "stable"


def _forget_reads(m: Member, token: str, tps: set[TopicPartition]) -> None:
    """Acknowledging ``m``'s answer ``token`` no longer moves ``tps``; an answer left with nothing goes."""
    answer = m.answers[token]
    rest = tuple(r for r in answer.reads if (r[0], r[1]) not in tps)
    if not rest:
        del m.answers[token]
    elif len(rest) != len(answer.reads):
        m.answers[token] = Answer(token, rest)
