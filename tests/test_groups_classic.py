"""Kafka's classic group membership (ring.groups.classic) as scripted scenarios on the pure core: joins,
the leader's sync, rebalances on join, leave and expiry, fencing by a reset, and hostile joins refused
with nothing kept."""

from __future__ import annotations

from ring import limits
from ring.groups import classic as c

PROTOCOLS = [("range", b"sub-r"), ("roundrobin", b"sub-rr")]


def join(g: c.ClassicGroup, member_id: str, now: float, new_id: str = "", protocols=PROTOCOLS,
         session_ms: int = 10_000) -> c.JoinAnswer:
    return g.join(member_id, new_id, True, "client", session_ms, 30_000, "consumer", protocols, now)


def drain(g: c.ClassicGroup) -> dict[str, object]:
    out = dict(g.outbox)
    g.outbox.clear()
    return out


def test_a_first_member_is_told_its_id_then_leads_a_group_of_one():
    g = c.ClassicGroup("g")
    first = join(g, "", 0.0, new_id="client-1")
    assert (first.outcome, first.member_id) == (c.MEMBER_ID_REQUIRED, "client-1")
    assert g.members == {} and "client-1" in g.pending
    a = join(g, "client-1", 0.1)
    assert (a.outcome, a.generation, a.leader, a.protocol) == (c.OK, 1, "client-1", "range")
    assert a.members == (("client-1", b"sub-r"),)
    assert g.sync("client-1", 1, [("client-1", b"all")], 0.2) == c.SyncAnswer(c.OK, b"all")
    assert g.state == c.STABLE and g.heartbeat("client-1", 1, 0.3) == c.OK


def stable_pair() -> c.ClassicGroup:
    g = c.ClassicGroup("g")
    join(g, "", 0, new_id="a")
    join(g, "a", 0)
    g.sync("a", 1, [("a", b"A-all")], 0)
    join(g, "", 1, new_id="b")
    assert join(g, "b", 1).outcome == c.WAIT  # b waits for a to join again
    assert g.heartbeat("a", 1, 1.5) == c.REBALANCE_IN_PROGRESS
    answer = join(g, "a", 2)  # a's join completes the rebalance: both are answered
    assert (answer.outcome, answer.generation, answer.leader) == (c.OK, 2, "a")
    assert [m for m, _ in answer.members] == ["a", "b"]
    waiting = drain(g)
    assert waiting["b"] == c.JoinAnswer(c.OK, 2, "range", "a", "b", ())
    assert g.sync("b", 2, [], 2.1) == c.SyncAnswer(c.WAIT)
    assert g.sync("a", 2, [("a", b"A"), ("b", b"B")], 2.2) == c.SyncAnswer(c.OK, b"A")
    assert drain(g) == {"b": c.SyncAnswer(c.OK, b"B")}
    return g


def test_a_second_member_makes_the_first_join_again_and_the_leader_assigns_both():
    g = stable_pair()
    assert g.state == c.STABLE and g.generation == 2


def test_a_leave_rebalances_and_the_other_gets_everything_back():
    g = stable_pair()
    assert g.leave("b", 3) == c.OK
    assert g.heartbeat("a", 2, 3.1) == c.REBALANCE_IN_PROGRESS
    answer = join(g, "a", 3.2)
    assert (answer.outcome, answer.generation, [m for m, _ in answer.members]) == (c.OK, 3, ["a"])
    assert g.leave("b", 3.3) == c.UNKNOWN_MEMBER


def test_a_silent_member_is_dropped_at_its_session_timeout():
    g = stable_pair()
    g.heartbeat("a", 2, 9)
    assert g.tick(11) == []  # b last seen at 2.2: 8.8 s ago
    assert g.tick(12.3) == ["b"] and g.state == c.PREPARING


def test_a_member_that_does_not_join_again_by_the_rebalance_deadline_is_dropped():
    g = stable_pair()
    join(g, "", 3, new_id="c")
    assert join(g, "c", 3).outcome == c.WAIT
    join(g, "a", 4)
    for now in (10, 19, 28):  # b heartbeats (told a rebalance is on) but does not join
        assert g.heartbeat("b", 2, now) == c.REBALANCE_IN_PROGRESS
        g.tick(now)
    assert drain(g) == {}  # b has until 3 + 30 s
    g.tick(33.1)
    answers = drain(g)
    assert set(answers) == {"a", "c"} and g.generation == 3 and set(g.members) == {"a", "c"}


def test_stale_and_unknown_syncs_commits_and_heartbeats_are_refused():
    g = stable_pair()
    assert g.sync("nobody", 2, [("nobody", b"x")], 3) == c.SyncAnswer(c.UNKNOWN_MEMBER)
    assert g.sync("a", 1, [("a", b"x")], 3) == c.SyncAnswer(c.ILLEGAL_GENERATION)
    assert g.members["a"].assignment == b"A"  # nothing taken
    assert g.heartbeat("b", 7, 3) == c.ILLEGAL_GENERATION
    assert g.check_commit("a", 2, 3) == c.OK
    assert g.check_commit("a", 1, 3) == c.ILLEGAL_GENERATION
    assert g.check_commit("", -1, 3) == c.ILLEGAL_GENERATION  # the group has members
    assert c.ClassicGroup("h").check_commit("", -1, 3) == c.OK


def test_a_reset_fences_the_generation_and_every_member_joins_again():
    g = stable_pair()
    g.fence(5)
    assert g.check_commit("a", 2, 5.1) == c.ILLEGAL_GENERATION
    assert g.heartbeat("b", 2, 5.1) == c.ILLEGAL_GENERATION
    join(g, "a", 5.2)
    answer = join(g, "b", 5.3)
    assert answer.outcome == c.OK and answer.generation == 4


def test_hostile_joins_are_refused_with_nothing_kept():
    g = c.ClassicGroup("g")
    huge = [("range", b"x" * (limits.KAFKA_GROUP_METADATA_BYTES_MAX + 1))]
    assert join(g, "", 0, new_id="m", protocols=huge).outcome == c.INVALID_REQUEST
    many = [(f"p{i}", b"") for i in range(limits.KAFKA_GROUP_PROTOCOLS_MAX + 1)]
    assert join(g, "", 0, new_id="m", protocols=many).outcome == c.INVALID_REQUEST
    assert join(g, "m" * 100_000, 0).outcome == c.UNKNOWN_MEMBER  # an id never handed out
    assert join(g, "", 0, new_id="m", session_ms=10).outcome == c.INVALID_SESSION_TIMEOUT
    assert g.idle() and g.generation == 0
    join(g, "", 0, new_id="a")
    join(g, "a", 0)
    assert join(g, "", 0, new_id="x", protocols=[("cooperative-sticky", b"")]).outcome == c.INCONSISTENT_PROTOCOL
    assert g.pending == {}


def test_a_leader_that_does_not_sync_in_time_is_dropped_and_the_rest_rebalance():
    g = c.ClassicGroup("g")
    join(g, "", 0, new_id="a")
    join(g, "a", 0)
    join(g, "", 0, new_id="b")
    join(g, "b", 0)  # waits for a
    join(g, "a", 1)  # completes: a leads generation 2, and never syncs
    drain(g)
    assert g.sync("b", 2, [], 1.5) == c.SyncAnswer(c.WAIT)
    for now in (10, 20, 30):  # a heartbeats: alive, but its assignment never comes
        assert g.heartbeat("a", 2, now) == c.OK
        g.tick(now)
    assert "a" in g.members
    g.tick(31.1)  # a's rebalance timeout (30 s) from the completion at 1
    assert "a" not in g.members and g.state == c.PREPARING
    assert drain(g) == {"b": c.SyncAnswer(c.REBALANCE_IN_PROGRESS)}  # b joins again and leads


def test_a_leaders_assignments_over_their_bound_are_refused_and_a_full_group_takes_no_one_more(monkeypatch):
    g = c.ClassicGroup("g")
    join(g, "", 0, new_id="a")
    join(g, "a", 0)
    too_much = [("a", b"x" * (limits.KAFKA_GROUP_ASSIGNMENT_BYTES_MAX + 1))]
    assert g.sync("a", 1, too_much, 1) == c.SyncAnswer(c.INVALID_REQUEST)
    assert g.state == c.COMPLETING and g.members["a"].assignment == b""
    monkeypatch.setattr(limits, "GROUP_MEMBERS_MAX", 2)
    assert join(g, "", 2, new_id="b").outcome == c.MEMBER_ID_REQUIRED  # b's id is held for it
    assert join(g, "", 2, new_id="x").outcome == c.GROUP_FULL


def test_a_kafka_group_with_members_keeps_its_offsets_however_long_since_its_last_commit():
    # Kafka expires a group's offsets only once it has been empty for the retention period: a group of
    # Kafka consumers that reads on without committing keeps what it committed.
    from ring.groups.group import Group
    from ring.groups.shard import Shard

    now_ms = 10 * limits.GROUP_OFFSETS_RETENTION_MS
    shard = Shard(0, now_ms)
    for name in ("kafka", "idle"):
        shard.groups[name] = Group(name)  # used long ago: its last commit is older than the retention
    live = shard.classic["kafka"] = c.ClassicGroup("kafka")
    join(live, "", 0, new_id="a")
    join(live, "a", 0)
    _, forgotten = shard.checkpoint_records(now_ms)
    assert forgotten == ["idle"]
    live.members.clear()  # its last member gone: the retention counts from when it was last in use
    assert shard.checkpoint_records(now_ms + limits.GROUP_OFFSETS_RETENTION_MS)[1] == ["idle"]
    assert shard.checkpoint_records(now_ms + limits.GROUP_OFFSETS_RETENTION_MS + 1)[1] == ["idle", "kafka"]
