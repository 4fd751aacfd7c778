"""The pure cores of consumer groups: sticky assignment, the group state machine, the offsets codec, replay.

Unit cases for the rules and bounded hypothesis properties: every partition
has exactly one owner that subscribes to its topic, loads differ by at most
one when subscriptions agree, a rebalance moves only what it must, and a
shard rebuilt from the records a coordinator wrote equals the coordinator's
own state (what failover relies on).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring import limits
from ring.errors import BadRequest, Conflict, CorruptBatch
from ring.groups import codec, delivery
from ring.groups.assignment import assign, moved
from ring.errors import Overloaded
from ring.groups.group import Commit, Drop, Group, Member, Rebalance, MemberSpec, State
from ring.groups.shard import Shard
from ring.log import batch as batchfmt

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def loads(a: dict[str, list]) -> list[int]:
    return sorted(len(v) for v in a.values())


# --- assignment ---------------------------------------------------------------------------------


def test_even_spread_and_extra_members_get_nothing() -> None:
    a = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 8}, {})
    assert loads(a) == [2, 3, 3]
    a = assign({m: ["t"] for m in "abcde"}, {"t": 3}, {})
    assert loads(a) == [0, 0, 1, 1, 1]
    assert sorted(tp for tps in a.values() for tp in tps) == [("t", 0), ("t", 1), ("t", 2)]


def test_a_joining_member_takes_only_its_share() -> None:
    before = assign({"a": ["t"], "b": ["t"]}, {"t": 12}, {})
    after = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 12}, before)
    assert loads(after) == [4, 4, 4]
    assert moved(before, after) == 4  # exactly what c took
    assert all(set(after[m]) <= set(before[m]) for m in "ab")


def test_a_leaving_member_hands_on_only_its_partitions() -> None:
    before = assign({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": 9}, {})
    after = assign({"a": ["t"], "b": ["t"]}, {"t": 9}, before)
    assert moved(before, after) == 3
    assert all(set(before[m]) <= set(after[m]) for m in "ab")


def test_members_only_get_topics_they_subscribe_to() -> None:
    a = assign({"a": ["x"], "b": ["x", "y"], "c": ["y"]}, {"x": 2, "y": 4}, {})
    assert all(t == "x" for t, _ in a["a"]) and all(t == "y" for t, _ in a["c"])
    assert sum(map(len, a.values())) == 6


def test_a_topic_without_partitions_yet_assigns_nothing() -> None:
    assert assign({"a": ["nope"]}, {}, {}) == {"a": []}


members_st = st.dictionaries(st.sampled_from([f"m{i}" for i in range(8)]),
                             st.sets(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=3).map(sorted),
                             min_size=1, max_size=6)
counts_st = st.fixed_dictionaries({"x": st.integers(0, 12), "y": st.integers(0, 5), "z": st.integers(0, 3)})


@PROPS
@given(members_st, counts_st, members_st, counts_st)
def test_assignment_invariants(members: dict, counts: dict, members2: dict, counts2: dict) -> None:
    first = assign(members, counts, {})
    second = assign(members2, counts2, first)
    for m_set, c, a in ((members, counts, first), (members2, counts2, second)):
        owners = [tp for tps in a.values() for tp in tps]
        wanted = {(t, p) for ts in m_set.values() for t in ts for p in range(c[t])}
        assert sorted(owners) == sorted(wanted)  # each partition exactly once
        assert all(t in m_set[m] for m, tps in a.items() for t, _ in tps)  # only subscribed topics
        assert set(a) == set(m_set)
    assert assign(members2, counts2, second) == second  # stable: nothing moves without a change


@PROPS
@given(st.integers(1, 8), st.integers(0, 40), st.integers(1, 8))
def test_same_subscriptions_balance_within_one_and_move_little(n: int, partitions: int, n2: int) -> None:
    a = assign({f"m{i}": ["t"] for i in range(n)}, {"t": partitions}, {})
    b = assign({f"m{i}": ["t"] for i in range(n2)}, {"t": partitions}, a)
    for x in (a, b):
        assert loads(x)[-1] - loads(x)[0] <= 1
    # What must move: the partitions of members that left, plus what new members take.
    must = sum(len(a[f"m{i}"]) for i in range(n2, n)) + sum(len(b[f"m{i}"]) for i in range(n, n2))
    assert moved(a, b) <= must + n2  # at most one extra per member to even out the remainder


# --- the group state machine --------------------------------------------------------------------


def joined(g: Group, member: str, topics=("t",), counts=None, now=0.0) -> Rebalance | None:
    ev = g.propose_join(member, topics, 10_000, None, "earliest", counts or {"t": 4}, now, 1000)
    if ev is not None:
        g.apply(ev, now)
    return ev


def test_join_bumps_the_generation_and_a_repeated_join_is_a_heartbeat() -> None:
    g = Group("g")
    assert joined(g, "a").generation == 1
    assert joined(g, "a", now=5.0) is None
    assert g.generation == 1 and g.members["a"].last_seen == 5.0
    assert joined(g, "b").generation == 2
    assert sorted(len(m.spec.assignment) for m in g.members.values()) == [2, 2]


def test_stale_generation_and_unknown_member_are_409_with_rejoin() -> None:
    g = Group("g")
    joined(g, "a")
    joined(g, "b")
    with pytest.raises(Conflict) as info:
        g.member("a", 1, 0.0)
    assert info.value.extra["rejoin"] and info.value.extra["reason"] == "stale_generation"
    assert info.value.extra["generation"] == 2
    with pytest.raises(Conflict) as info:
        g.member("zed", None, 0.0)
    assert info.value.extra["reason"] == "unknown_member"


def test_commits_only_of_held_partitions_and_only_by_members() -> None:
    g = Group("g")
    joined(g, "a")
    joined(g, "b")
    mine = g.members["a"].spec.assignment[0]
    theirs = g.members["b"].spec.assignment[0]
    ev = g.propose_commit("a", 2, [(mine[0], mine[1], 7)], 0.0, 1)
    g.apply(ev, 0.0)
    assert g.committed[mine] == 7
    with pytest.raises(Conflict) as info:
        g.propose_commit("a", 2, [(theirs[0], theirs[1], 7)], 0.0, 1)
    assert info.value.extra["reason"] == "not_assigned"
    with pytest.raises(Conflict):
        g.propose_commit(None, None, [("t", 0, 1)], 0.0, 1)  # the group has members


def test_a_group_is_deleted_only_without_members_and_its_offsets_go_in_replay_too() -> None:
    live = Shard(0, 0)
    g = live.group("g")
    assert g.propose_drop(1) is None  # never used: nothing to delete
    written = []
    for ev in (g.propose_join("a", ["t"], 10_000, None, "earliest", {"t": 2}, 0.0, 1),):
        written.append(live.records_for("g", [ev], 1))
        g.apply(ev, 0.0)
    ev = g.propose_commit("a", 1, [("t", 0, 5)], 0.0, 2)
    written.append(live.records_for("g", [ev], 2))
    g.apply(ev, 0.0)
    with pytest.raises(Conflict) as info:
        g.propose_drop(3)
    assert info.value.extra["reason"] == "group_not_empty" and g.committed == {("t", 0): 5}
    ev = g.propose_leave("a", 4, {"t": 2})
    written.append(live.records_for("g", [ev], 4))
    g.apply(ev, 0.0)
    drop = g.propose_drop(5)
    assert drop == Drop(5)
    written.append(live.records_for("g", [drop], 5))
    g.apply(drop, 0.0)
    assert g.dropped and g.committed == {} and g.committed_at(("t", 0)) is None
    assert g.propose_drop(6) is None  # deleted already
    replayed = Shard(0, 0)
    replayed.replay_batches(_log_of(written), 0, 0.0)
    r = replayed.groups["g"]
    assert r.dropped and r.committed == {} and r.generation == g.generation == 2  # generations are never reused
    assert live.checkpoint_records(7) == ([], ["g"])  # the next checkpoint leaves it out


def test_a_stale_generation_commits_what_the_member_held_all_along() -> None:
    g = Group("g")
    joined(g, "a")  # generation 1: a holds every partition
    joined(g, "b")  # generation 2: b takes a share
    kept = g.members["a"].spec.assignment[0]
    gone = g.members["b"].spec.assignment[0]
    ev = g.propose_commit("a", 1, [(kept[0], kept[1], 7)], 0.0, 1)  # a never lost it: accepted
    g.apply(ev, 0.0)
    assert g.committed[kept] == 7
    with pytest.raises(Conflict) as info:  # it moved to b: a's offset is not the group's any more
        g.propose_commit("a", 1, [(gone[0], gone[1], 7), (kept[0], kept[1], 8)], 0.0, 1)
    assert info.value.extra["rejoin"] and info.value.extra["reason"] == "stale_generation"
    g.apply(g.propose_leave("b", 1000, {"t": 4}), 0.0)  # generation 3: gone is back with a, held since 3 only
    assert gone in g.members["a"].spec.assignment
    with pytest.raises(Conflict):
        g.propose_commit("a", 2, [(gone[0], gone[1], 7)], 0.0, 1)
    with pytest.raises(Conflict):  # a generation the group never reached
        g.propose_commit("a", 9, [(kept[0], kept[1], 9)], 0.0, 1)
    assert g.propose_commit("a", 3, [(gone[0], gone[1], 7)], 0.0, 1).offsets == ((gone[0], gone[1], 7),)


def test_positions_survive_a_rebalance_only_where_the_partition_stayed() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    for tp in g.members["a"].spec.assignment:
        g.members["a"].positions[tp] = 5
    joined(g, "b", counts={"t": 2})
    kept = g.members["a"].spec.assignment
    assert len(kept) == 1 and g.members["a"].positions == {kept[0]: 5}
    commit = g.propose_poll_commit(g.members["a"], 2)
    assert commit is not None and commit.offsets == ((kept[0][0], kept[0][1], 5),)


def test_an_implicit_commit_never_moves_an_offset_back() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 1})
    g.apply(Commit((("t", 0, 9),), 1), 0.0)
    g.members["a"].positions[("t", 0)] = 4
    assert g.propose_poll_commit(g.members["a"], 2) is None


def test_a_reset_drops_read_positions() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 1})
    g.members["a"].positions[("t", 0)] = 40
    g.apply(g.propose_reset([("t", 0, 3)], 5), 0.0)
    assert g.committed[("t", 0)] == 3 and g.members["a"].positions == {}
    assert g.start_offset(g.members["a"], ("t", 0)) == 3


def handed(g: Group, member: str, *reads: tuple[str, int, int, int]) -> str:
    """A poll answer handed to ``member`` (reads: topic, partition, start, end); its token."""
    answer = delivery.answer(g.generation, g.resets, reads)
    g.hand_out(g.members[member], answer)
    return answer.token


def test_a_position_moves_only_with_the_answer_acknowledged() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    a = g.members["a"]
    a.positions.update({("t", 0): 0, ("t", 1): 0})  # where reading starts (the poller pins it)
    first = handed(g, "a", ("t", 0, 0, 20), ("t", 1, 0, 5))
    assert a.positions == {("t", 0): 0, ("t", 1): 0}  # handed out is not acknowledged
    lost = handed(g, "a", ("t", 0, 0, 20), ("t", 1, 0, 7))  # read again after no acknowledgement
    assert g.acknowledge(a, first) and a.positions == {("t", 0): 20, ("t", 1): 5}
    assert not g.acknowledge(a, first)  # once
    assert g.acknowledge(a, lost) and a.positions == {("t", 0): 20, ("t", 1): 5}  # known, but its starts moved on
    assert not g.acknowledge(a, "A" * delivery.TOKEN_CHARS) and not g.acknowledge(a, None)
    commit = g.propose_poll_commit(a, 2)
    assert commit is not None and commit.offsets == (("t", 0, 20), ("t", 1, 5))


def test_acknowledging_applies_only_where_the_answer_still_starts() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    a = g.members["a"]
    a.positions.update({("t", 0): 10, ("t", 1): 10})
    token = handed(g, "a", ("t", 0, 10, 15), ("t", 1, 10, 12))
    a.positions[("t", 1)] = 11  # another answer moved it meanwhile
    assert g.acknowledge(a, token) and a.positions == {("t", 0): 15, ("t", 1): 11}


def test_a_reset_forgets_answers_and_tokens_name_the_state_they_came_from() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 1})
    a = g.members["a"]
    a.positions[("t", 0)] = 0
    before = handed(g, "a", ("t", 0, 0, 20))
    g.apply(g.propose_reset([("t", 0, 0)], 5), 0.0)
    assert a.answers == {} and not g.acknowledge(a, before)
    after = handed(g, "a", ("t", 0, 0, 20))  # the same records, handed out after the reset
    assert after != before and g.acknowledge(a, after) and a.positions == {("t", 0): 20}
    assert delivery.answer(1, 0, [("t", 0, 0, 20)]).token == delivery.answer(1, 0, [("t", 0, 0, 20), ("t", 1, 3, 3)]).token


def test_a_seek_outranks_answers_handed_out_before_it() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    a = g.members["a"]
    a.positions.update({("t", 0): 0, ("t", 1): 0})
    both = handed(g, "a", ("t", 0, 0, 10), ("t", 1, 0, 10))
    only_1 = handed(g, "a", ("t", 1, 0, 7))
    g.seek("a", None, [("t", 1, 0)], 0.0)  # the client read partition 1 again from 0 (a pause, say)
    assert only_1 not in a.answers
    assert g.acknowledge(a, both) and a.positions == {("t", 0): 10, ("t", 1): 0}


def test_answers_out_at_once_are_bounded_oldest_first() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 1})
    a = g.members["a"]
    a.positions[("t", 0)] = 0
    tokens = [handed(g, "a", ("t", 0, 0, n)) for n in range(1, limits.GROUP_POLL_ANSWERS_UNACKED_MAX + 2)]
    assert list(a.answers) == tokens[1:]
    assert handed(g, "a") and len(a.answers) == limits.GROUP_POLL_ANSWERS_UNACKED_MAX  # an empty answer: none kept
    assert not g.acknowledge(a, tokens[0]) and g.acknowledge(a, tokens[-1]) and a.positions == {("t", 0): len(tokens)}


@pytest.mark.parametrize("brokers", [3, 12])
def test_a_member_polling_every_broker_in_turn_has_each_answer_acknowledged(brokers: int) -> None:
    """PolarStreams' consumers poll every broker in turn, each broker answering from the partitions it
    leads, and acknowledge a broker's answer by their next poll there (its connection): the answers of
    all the other brokers are handed out in between. None is forgotten before it is acknowledged."""
    g = Group("g")
    joined(g, "a", counts={"t": brokers})
    a = g.members["a"]
    a.positions.update({("t", p): 0 for p in range(brokers)})
    last: dict[int, str] = {}
    for _ in range(3):
        for p in range(brokers):  # broker p leads partition p
            if p in last:
                assert g.acknowledge(a, last[p]), f"the answer of broker {p} was forgotten"
            start = g.start_offset(a, ("t", p))
            last[p] = handed(g, "a", ("t", p, start, start + 10))
    assert a.positions == {("t", p): 20 for p in range(brokers)}


def test_an_answer_acknowledged_after_a_rebalance_moves_only_partitions_still_held() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    g.members["a"].positions.update({("t", 0): 0, ("t", 1): 0})
    token = handed(g, "a", ("t", 0, 0, 4), ("t", 1, 0, 6))
    joined(g, "b", counts={"t": 2})
    a = g.members["a"]
    (kept,) = a.spec.assignment
    assert g.acknowledge(a, token) and a.positions == {kept: 4 if kept == ("t", 0) else 6}


@pytest.mark.parametrize("raw", ["short", "A" * 21 + "!", 12, "A" * 23])
def test_a_malformed_token_is_400(raw) -> None:
    with pytest.raises(BadRequest):
        delivery.parse_token(raw)
    assert delivery.parse_token("") is None and delivery.parse_token(None) is None


def test_expiry_spares_a_member_that_is_polling() -> None:
    g = Group("g")
    joined(g, "a")
    joined(g, "b")
    g.members["a"].polling = 1
    assert g.expired(11.0) == ["b"]
    ev = g.propose_expire(11.0, 2, {"t": 4})
    g.apply(ev, 11.0)
    assert list(g.members) == ["a"] and len(g.members["a"].spec.assignment) == 4 and g.generation == 3


def test_more_partitions_rebalance_the_group() -> None:
    g = Group("g")
    joined(g, "a", counts={"t": 2})
    joined(g, "b", counts={"t": 2})
    assert g.propose_refresh({"t": 2}, 5) is None
    ev = g.propose_refresh({"t": 4}, 5)
    assert ev is not None
    g.apply(ev, 0.0)
    assert sorted(len(m.spec.assignment) for m in g.members.values()) == [2, 2]


def test_group_members_are_bounded() -> None:
    g = Group("g")
    for i in range(limits.GROUP_MEMBERS_MAX):
        g.members[f"m{i}"] = Member(MemberSpec(f"m{i}", ("t",), 10_000, None, "earliest", ()), 0.0)
    with pytest.raises(Overloaded):
        g.propose_join("one-more", ["t"], 10_000, None, "earliest", {"t": 1}, 0.0, 1)


# --- codec and replay ---------------------------------------------------------------------------


SPEC = MemberSpec("c-1", ("clicks", "views"), 10_000, "host-a", "latest", (("clicks", 0), ("views", 3)))
EVENTS = [
    Rebalance(3, (SPEC,), (("clicks", 1), ("views", 4)), 111),
    Commit((("clicks", 0, 42), ("views", 3, 7)), 222),
    Commit((("clicks", 0, 0),), 223, reset=True),
    State(4, (SPEC,), (("clicks", 1),), (("clicks", 0, 5),), 333),
    Drop(444),
]


@pytest.mark.parametrize("event", EVENTS)
def test_codec_round_trips(event) -> None:
    assert codec.decode(codec.encode(event)) == event


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x93\xa6commit\x01\x00", b"\x94\xa4nope\x01\x00\x00",
                                 codec.encode(EVENTS[0])[:-3]])
def test_codec_refuses_garbage(raw: bytes) -> None:
    with pytest.raises(CorruptBatch):
        codec.decode(raw)


def test_checkpoint_pointer_header() -> None:
    assert codec.checkpoint_of([(codec.CHECKPOINT_HEADER, b"123")]) == 123
    assert codec.checkpoint_of([("other", b"7"), (codec.CHECKPOINT_HEADER, b"-1")]) is None
    assert codec.checkpoint_of(None) is None


def _log_of(records_by_batch: list[list]) -> bytes:
    out, offset = bytearray(), 0
    for recs in records_by_batch:
        b = batchfmt.encode(recs, now_ms=1)
        batchfmt.stamp(b, 0, offset, 1)
        offset += len(recs)
        out += b
    return bytes(out)


def test_replay_equals_the_state_it_was_written_from() -> None:
    live = Shard(0, 0)
    written = []
    g = live.group("g")
    for i, member in enumerate(["a", "b", "c"]):
        ev = g.propose_join(member, ["t"], 10_000, None, "earliest", {"t": 6}, 0.0, i)
        written.append(live.records_for("g", [ev], i))
        g.apply(ev, 0.0)
    held = g.members["b"].spec.assignment[0]
    ev = g.propose_commit("b", 3, [(held[0], held[1], 17)], 0.0, 9)
    written.append(live.records_for("g", [ev], 9))
    g.apply(ev, 0.0)
    # A checkpoint, then one more commit pointing at it.
    cp_records, _ = live.checkpoint_records(10)
    written.append(cp_records)
    live.checkpointed(sum(map(len, written[:-1])), [], 10)
    ev = g.propose_leave("c", 11, {"t": 6})
    written.append(live.records_for("g", [ev], 11))
    g.apply(ev, 0.0)

    data = _log_of(written)
    replayed = Shard(0, 0)
    assert replayed.replay_batches(data, 0, 0.0) == sum(map(len, written))
    r = replayed.groups["g"]
    assert (r.generation, r.committed, r.partitions) == (g.generation, g.committed, g.partitions)
    assert {m: x.spec for m, x in r.members.items()} == {m: x.spec for m, x in g.members.items()}
    # From the checkpoint alone (what a new coordinator does) the result is the same.
    _, last = batchfmt.decode(data[-len(_log_of([written[-1]])):], verify=False)
    pointer = codec.checkpoint_of(last[-1].headers)
    assert pointer == sum(map(len, written[:-2]))
    from_cp = Shard(0, 0)
    from_cp.replay_batches(data, pointer, 0.0)
    c = from_cp.groups["g"]
    assert (c.generation, c.committed) == (g.generation, g.committed)
    assert {m: x.spec for m, x in c.members.items()} == {m: x.spec for m, x in g.members.items()}


def test_replay_skips_damaged_records() -> None:
    data = _log_of([[(1, b"g", b"\xc1garbage", None)], [(1, b"g", codec.encode(EVENTS[1]), None)]])
    s = Shard(0, 0)
    s.replay_batches(data, 0, 0.0)
    assert s.skipped == 1 and s.groups["g"].committed[("clicks", 0)] == 42


ops_st = st.lists(st.tuples(st.sampled_from(["join", "leave", "commit", "expire", "grow", "reset"]),
                            st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 50)), max_size=25)


@PROPS
@given(ops_st)
def test_generations_only_grow_and_replay_matches(ops) -> None:
    live = Shard(0, 0)
    g = live.group("g")
    counts = {"t": 3}
    log_records = []
    now = 0.0
    for op, member, n in ops:
        now += 1.0
        try:
            if op == "join":
                ev = g.propose_join(member, ["t"], 10_000, None, "earliest", counts, now, int(now))
            elif op == "leave":
                ev = g.propose_leave(member, int(now), counts)
            elif op == "commit":
                held = g.members[member].spec.assignment if member in g.members else ()
                ev = g.propose_commit(member, g.generation, [(t, p, n) for t, p in held[:1]] or [("t", 0, n)],
                                      now, int(now))
            elif op == "expire":
                now += 11.0
                ev = g.propose_expire(now, int(now), counts)
            elif op == "grow":
                counts = {"t": counts["t"] + 1}
                ev = g.propose_refresh(counts, int(now))
            else:
                ev = g.propose_reset([("t", 0, n)], int(now))
        except Conflict:
            continue
        if ev is None:
            continue
        before = g.generation
        log_records.append(live.records_for("g", [ev], int(now)))
        g.apply(ev, now)
        assert g.generation >= before
        owners = [tp for m in g.members.values() for tp in m.spec.assignment]
        assert len(owners) == len(set(owners))
    if not log_records:
        return
    replayed = Shard(0, 0)
    replayed.replay_batches(_log_of(log_records), 0, now)
    r = replayed.groups["g"]
    assert (r.generation, r.committed) == (g.generation, g.committed)
    assert {m: x.spec for m, x in r.members.items()} == {m: x.spec for m, x in g.members.items()}


# --- auto partitions ----------------------------------------------------------------------------


def test_demand_is_the_largest_group_per_topic() -> None:
    from ring.groups.autogrow import demand

    assert demand([[["a"], ["a", "b"]], [["a"], ["a"], ["a"]], [["b"]]]) == {"a": 3, "b": 1}


def test_auto_topics_grow_after_the_grace_only() -> None:
    from ring.groups.autogrow import AutoGrowth

    g = AutoGrowth(grace_ms=1000)
    assert g.observe({"t": 5}, {"t": 3}, ["t"], 0) == {}
    assert g.observe({"t": 5}, {"t": 3}, ["t"], 500) == {}
    assert g.observe({"t": 3}, {"t": 3}, ["t"], 900) == {}  # a member came back: the wait starts over
    assert g.observe({"t": 5}, {"t": 3}, ["t"], 1000) == {}
    assert g.observe({"t": 5}, {"t": 3}, ["t"], 2000) == {"t": 5}
    assert g.observe({"t": 5, "u": 9}, {"t": 3, "u": 1}, ["t"], 9000) == {}  # u is not auto; t restarts
    assert g.observe({"t": 2 * limits.TOPIC_PARTITIONS_MAX}, {"t": 3}, ["t"], 20_000) == {
        "t": limits.TOPIC_PARTITIONS_MAX}
