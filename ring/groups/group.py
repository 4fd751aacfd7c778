"""One consumer group as a deterministic state machine: members, generations, assignment, committed offsets.

Theory of operation. What must survive the coordinator is kept as events in
the offsets topic, and ``apply`` is the only way persisted state changes, so a
coordinator that replays the log (``codec``) ends in the state the old one had:

* ``Rebalance``: a rebalance happened. The full membership (each member's
  topics, session timeout, client label and assignment) under a new
  generation.
* ``Commit``: committed offsets moved (``reset`` when an operator moved them,
  which also drops every member's uncommitted read position there).
* ``State``: the whole group at once (checkpoints; see ``coordinator``).
* ``Drop``: the group is forgotten: deleted by an operator (``propose_drop``) while it has no
  members; its committed offsets go, its generation stays (never reused).
* ``Forget``: a topic was deleted: its committed offsets go (as Kafka's do).

Topic ids. A topic deleted and created again is a new topic with a new id
(``ring.catalog``). ``Commit`` and ``State`` record the id each topic's
offsets were committed for, ``Rebalance`` and ``State`` the ids the assignment
was made for. The coordinator tells the group the catalogue's ids
(``see_topics``, not persisted) before each use, and a committed offset of
another id never applies (``committed_at``: the member starts by its reset
policy), however the delete was missed. A member assigned an older id of a
topic is refused with 409 ``topic_recreated`` (``rejoin``) until it joins
again, which rebalances it onto the new topic with fresh positions. Offsets
committed by a release without ids carry none: they are taken for the
topic as it is when first read, and a ``Forget`` of the topic drops them.

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
from ring.errors import Conflict, Overloaded, TopicRecreated
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
class Rebalance:
    generation: int
    members: tuple[MemberSpec, ...]
    partitions: tuple[tuple[str, int], ...]  # topic -> partition count the assignment was made for
    ts_ms: int
    ids: tuple[tuple[str, str], ...] = ()  # topic -> the id the assignment was made for


@dataclass(frozen=True)
class Commit:
    offsets: tuple[tuple[str, int, int], ...]  # (topic, partition, next offset to read)
    ts_ms: int
    reset: bool = False
    ids: tuple[tuple[str, str], ...] = ()  # topic -> the id its offsets are committed for


@dataclass(frozen=True)
class State:
    generation: int
    members: tuple[MemberSpec, ...]
    partitions: tuple[tuple[str, int], ...]
    committed: tuple[tuple[str, int, int], ...]
    ts_ms: int  # when the group was last used (a commit or a membership change)
    ids: tuple[tuple[str, str], ...] = ()  # topic -> the id its committed offsets are for
    assigned_ids: tuple[tuple[str, str], ...] = ()  # topic -> the id the assignment was made for


@dataclass(frozen=True)
class Drop:
    ts_ms: int


@dataclass(frozen=True)
class Forget:
    """Topics deleted: (topic, id) pairs whose committed offsets go."""

    topics: tuple[tuple[str, str], ...]
    ts_ms: int


Event = Union[Rebalance, Commit, State, Drop, Forget]


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
    # topic -> the id of the topic it was given (at its join, or when an assignment first gave it the topic)
    ids: dict[str, str] = field(default_factory=dict)

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
        self.topic_ids: dict[str, str] = {}  # topic -> the id its committed offsets are for (none: unknown)
        self.assigned_ids: dict[str, str] = {}  # topic -> the id the assignment was made for
        self.current_ids: dict[str, str] = {}  # topic -> its id in the catalogue now (``see_topics``)
        self.used_ms = 0  # wall time of the last persisted change
        self.dropped = False
        self.resets = 0  # resets applied here: a poll token names the state it was handed out in

    # --- applying persisted events --------------------------------------------------------

    def apply(self, event: Event, now: float) -> None:
        if isinstance(event, Commit):
            for topic, tid in event.ids:
                if self.topic_ids.get(topic, tid) != tid:  # another topic of that name: its offsets go
                    self._drop_topic(topic)
                self.topic_ids[topic] = tid
            for topic, p, offset in event.offsets:
                self.committed[(topic, p)] = offset
                if event.reset:
                    for m in self.members.values():
                        m.positions.pop((topic, p), None)
            if event.reset:  # answers handed out before it acknowledge nothing after it
                self.resets += 1
                for m in self.members.values():
                    m.answers.clear()
        elif isinstance(event, Rebalance):
            self._set_members(event.generation, event.members, event.partitions, event.ids, now)
        elif isinstance(event, State):
            self._set_members(event.generation, event.members, event.partitions, event.assigned_ids, now)
            self.committed = {(t, p): o for t, p, o in event.committed}
            self.topic_ids = dict(event.ids)
        elif isinstance(event, Forget):
            for topic, tid in event.topics:
                if self.topic_ids.get(topic, tid) == tid:
                    self._drop_topic(topic)
        else:
            assert isinstance(event, Drop), event
            self.members, self.partitions, self.committed = {}, {}, {}  # the generation stays: never reused
            self.topic_ids, self.assigned_ids = {}, {}
            self.used_ms, self.dropped = event.ts_ms, True
            return
        self.dropped = False
        self.used_ms = max(self.used_ms, event.ts_ms)

    def _drop_topic(self, topic: str) -> None:
        """Every committed offset and read position of ``topic`` goes (it was deleted)."""
        self.committed = {tp: o for tp, o in self.committed.items() if tp[0] != topic}
        self.topic_ids.pop(topic, None)
        for m in self.members.values():
            m.positions = {tp: o for tp, o in m.positions.items() if tp[0] != topic}

    def _set_members(self, generation: int, specs: Iterable[MemberSpec], partitions: Iterable[tuple[str, int]],
                     ids: Iterable[tuple[str, str]], now: float) -> None:
        old = self.members
        ids = dict(ids)
        # A topic created again since the last assignment: nothing read of the old one carries over.
        recreated = {t for t, tid in ids.items() if self.assigned_ids.get(t, tid) != tid}
        self.members = {}
        for spec in specs:
            prev = old.get(spec.id)
            if prev is None:
                self.members[spec.id] = Member(spec, now, since={tp: generation for tp in spec.assignment},
                                               ids={t: ids[t] for t in spec.topics if t in ids})
                continue
            kept = {tp for tp in set(spec.assignment) & set(prev.spec.assignment) if tp[0] not in recreated}
            positions = {tp: o for tp, o in prev.positions.items() if tp in kept}
            since = {tp: prev.since.get(tp, generation) if tp in kept else generation for tp in spec.assignment}
            answers = {} if recreated else prev.answers
            told = {t: prev.ids.get(t, ids.get(t)) for t in spec.topics if t in prev.ids or t in ids}
            self.members[spec.id] = Member(spec, prev.last_seen, positions, prev.polling, since, answers,
                                           {t: i for t, i in told.items() if i is not None})
        self.generation = generation
        self.partitions = dict(partitions)
        self.assigned_ids = ids

    def snapshot(self, ts_ms: int | None = None) -> State:
        return State(self.generation, tuple(m.spec for m in self.members.values()),
                     tuple(sorted(self.partitions.items())),
                     tuple(sorted((t, p, o) for (t, p), o in self.committed.items())),
                     self.used_ms if ts_ms is None else ts_ms,
                     tuple(sorted(self.topic_ids.items())), tuple(sorted(self.assigned_ids.items())))

    # --- topic ids ------------------------------------------------------------------------

    def see_topics(self, ids: Mapping[str, str]) -> None:
        """The catalogue's id of each topic (those it holds): what committed offsets and assignments are
        checked against. Not persisted: the coordinator says it before each use."""
        self.current_ids = dict(ids)

    def _ids_of(self, topics: Iterable[str]) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((t, self.current_ids[t]) for t in set(topics) if t in self.current_ids))

    def _stale(self, ids: Mapping[str, str], topic: str) -> bool:
        """``ids`` names another topic of that name than the catalogue now holds (unknown: not stale)."""
        held, now = ids.get(topic), self.current_ids.get(topic)
        return held is not None and now is not None and held != now

    def committed_at(self, tp: TopicPartition) -> int | None:
        """The committed offset of ``tp``, unless it was committed for another topic of that name."""
        return None if self._stale(self.topic_ids, tp[0]) else self.committed.get(tp)

    def rejoined(self, m: Member) -> None:
        """``m`` joined again and is told the topics as the assignment has them: its next request is not
        refused for a topic created again before."""
        m.ids = {t: self.assigned_ids[t] for t in m.spec.topics if t in self.assigned_ids}

    def propose_forget(self, gone: Iterable[tuple[str, str]], now_ms: int) -> Forget | None:
        """Forget the offsets of deleted topics ((topic, id) pairs); None when the group holds none."""
        held = {t for t, _ in self.committed}
        topics = tuple(sorted((t, tid) for t, tid in gone if t in held and self.topic_ids.get(t, tid) == tid))
        return Forget(topics, now_ms) if topics else None

    # --- membership proposals -------------------------------------------------------------

    def propose_join(self, member_id: str, topics: Iterable[str], session_timeout_ms: int, client: str | None,
                     reset: str, partitions: Mapping[str, int], now: float, now_ms: int) -> Rebalance | None:
        """None when ``member_id`` is already a member with these topics (a heartbeat)."""
        topics_t = tuple(sorted(set(topics)))
        assert topics_t and reset in RESET_POLICIES
        current = self.members.get(member_id)
        if current is not None:
            current.last_seen = now
            if current.spec.topics == topics_t and current.spec.session_timeout_ms == session_timeout_ms:
                if any(self._stale(self.assigned_ids, t) or self._stale(current.ids, t) for t in topics_t):
                    return self._rebalance({m.id: m.spec for m in self.members.values()}, partitions, now_ms)
                return self.propose_refresh(partitions, now_ms)
        elif len(self.members) >= limits.GROUP_MEMBERS_MAX:
            raise Overloaded(f"group {self.name!r} already has {limits.GROUP_MEMBERS_MAX} members",
                             group=self.name)
        specs = {m.id: m.spec for m in self.members.values()}
        specs[member_id] = MemberSpec(member_id, topics_t, session_timeout_ms, client, reset, ())
        return self._rebalance(specs, partitions, now_ms)

    def propose_leave(self, member_id: str, now_ms: int, partitions: Mapping[str, int]) -> Rebalance | None:
        if member_id not in self.members:
            return None
        specs = {m.id: m.spec for m in self.members.values() if m.id != member_id}
        return self._rebalance(specs, partitions, now_ms)

    def propose_drop(self, now_ms: int) -> Drop | None:
        """Delete the group and its committed offsets; 409 ``group_not_empty`` while it has members, None
        when there is nothing to delete (it was never used, or is dropped already)."""
        if self.members:
            raise Conflict(f"group {self.name!r} has members ({len(self.members)}); it can be deleted once "
                           "they have left", group=self.name, reason="group_not_empty")
        if self.dropped or (self.generation == 0 and not self.committed):
            return None
        return Drop(now_ms)

    def expired(self, now: float) -> list[str]:
        return sorted(m.id for m in self.members.values() if m.expired(now))

    def propose_expire(self, now: float, now_ms: int, partitions: Mapping[str, int]) -> Rebalance | None:
        gone = set(self.expired(now))
        if not gone:
            return None
        specs = {m.id: m.spec for m in self.members.values() if m.id not in gone}
        return self._rebalance(specs, partitions, now_ms)

    def subscribed(self) -> set[str]:
        return {t for m in self.members.values() for t in m.spec.topics}

    def propose_refresh(self, partitions: Mapping[str, int], now_ms: int) -> Rebalance | None:
        """A rebalance when a subscribed topic's partition count is not what the assignment was made for."""
        if not self.members:
            return None
        wanted = {t: partitions.get(t, 0) for t in self.subscribed()}
        if wanted == {t: self.partitions.get(t, 0) for t in wanted}:
            return None
        return self._rebalance({m.id: m.spec for m in self.members.values()}, partitions, now_ms)

    def _rebalance(self, specs: Mapping[str, MemberSpec], partitions: Mapping[str, int], now_ms: int) -> Rebalance:
        topics = {t for s in specs.values() for t in s.topics}
        counts = {t: partitions.get(t, 0) for t in topics}
        previous = {m.id: m.spec.assignment for m in self.members.values()}
        result = assign({i: s.topics for i, s in specs.items()}, counts, previous)
        members = tuple(MemberSpec(s.id, s.topics, s.session_timeout_ms, s.client, s.reset, tuple(result[i]))
                        for i, s in sorted(specs.items()))
        return Rebalance(self.generation + 1, members, tuple(sorted(counts.items())), now_ms, self._ids_of(topics))

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
        for t in m.spec.topics:
            if self._stale(m.ids, t):
                old, new = m.ids[t], self.current_ids[t]
                raise TopicRecreated(f"topic {t!r} was deleted and created again: {member_id!r} of group "
                                     f"{self.name!r} was assigned topic id {old}, the topic is now {new}; join "
                                     "again to read the new topic from where its reset policy says",
                                     group=self.name, consumer=member_id, generation=self.generation, topic=t,
                                     topic_id=new, stale_topic_id=old, rejoin=True)
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
        # The front checked them (``ring.group_requests``); Kafka's membership passes only what it took.
        assert all(type(p) is int and p >= 0 and type(o) is int and o >= 0 for _, p, o in items), items
        return Commit(items, now_ms, ids=self._ids_of(t for t, _, _ in items))

    def propose_poll_commit(self, m: Member, now_ms: int) -> Commit | None:
        """``m``'s positions (what it acknowledged), where they are past what is committed
        (an implicit commit never moves an offset back: an explicit commit or a reset may have)."""
        held = set(m.spec.assignment)
        moves = tuple(sorted((t, p, o) for (t, p), o in m.positions.items()
                             if (t, p) in held and o > (self.committed_at((t, p)) or -1)))
        return Commit(moves, now_ms, ids=self._ids_of(t for t, _, _ in moves)) if moves else None

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
        items = tuple(offsets)
        return Commit(items, now_ms, reset=True, ids=self._ids_of(t for t, _, _ in items))

    def seek(self, member_id: str, generation: int | None, positions: Iterable[tuple[str, int, int]],
             now: float) -> Member:
        """Set where the member's next poll reads partitions it holds (Kafka's seek): not persisted,
        like every read position; its committed offsets stay. Answers handed out before it no longer
        move those partitions when acknowledged: the seek says where reading goes on."""
        items = list(positions)
        m = self.holding(member_id, generation, [(t, p) for t, p, _ in items], now)
        assert all(type(o) is int and o >= 0 for _, _, o in items), items  # the front checked them
        m.positions.update({(t, p): o for t, p, o in items})
        sought = {(t, p) for t, p, _ in items}
        for token in list(m.answers):
            _forget_reads(m, token, sought)
        return m

    def start_offset(self, m: Member, tp: TopicPartition) -> int | None:
        """Where ``m`` reads ``tp`` next: its position, else the committed offset, else None (its reset policy)."""
        if tp in m.positions:
            return m.positions[tp]
        return self.committed_at(tp)

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
