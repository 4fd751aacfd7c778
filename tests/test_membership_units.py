"""Membership decisions: removed brokers, the grace period, voter sets that move one member at a time,
and the partition maps every broker gossips (who leads what, who is still catching up, whom it removed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ring import limits
from ring.gossip import leaders
from ring.gossip import state as gossip_state
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.node import placement

SETTINGS = settings(max_examples=60, deadline=None)


def ep(name: str, generation: int = 1, status: str = "normal") -> EndpointState:
    ordinal = int(name.rpartition("-")[2])
    return EndpointState(name, broker_token(ordinal), f"h:{ordinal}", f"h:{ordinal + 1}", generation, 1, status)


def test_a_removal_holds_for_the_generation_it_names_and_earlier_only() -> None:
    eps = [ep("ring-0"), ep("ring-1", generation=5), ep("ring-2")]
    assert placement.removed_brokers(eps, [{}, {"ring-1": 5}]) == {"ring-1"}
    assert placement.removed_brokers(eps, [{"ring-1": 4}]) == set()  # it restarted since: it joins again
    assert placement.removed_brokers(eps, [{"ring-9": 1}, {"ring-2": 7}]) == {"ring-2"}
    ring = placement.placement_ring(eps, {"ring-1"})
    assert [n for _, n in ring.brokers] == ["ring-0", "ring-2"]


def test_a_decommission_holds_for_the_data_directory_it_names_over_restarts() -> None:
    """A decommissioned broker restarted on its data directory (a new generation, the same incarnation)
    stays off the ring; started on an empty one (a new incarnation) it joins as a new broker. A removal
    for being down past the grace period names a generation only: a restart joins again."""
    def with_dir(e: EndpointState, incarnation: str) -> EndpointState:
        e.extra["incarnation"] = incarnation
        return e

    eps = [with_dir(ep("ring-0"), "a0"), with_dir(ep("ring-1", generation=9), "b1"), with_dir(ep("ring-2"), "c2")]
    assert placement.removed_brokers(eps, [{"ring-1": 5}], [{"ring-1": "b1"}]) == {"ring-1"}
    assert placement.removed_brokers(eps, [{"ring-1": 5}], [{"ring-1": "b0"}]) == set()  # a new disk
    assert placement.removed_brokers(eps, [{"ring-1": 5}], [{}]) == set()  # past the grace period only
    assert placement.removed_brokers([ep("ring-1", generation=9)], [{}], [{"ring-1": "b1"}]) == set()
    assert leaders.decode_decommissioned({"ring-1": "b1", "x": 5, 3: "y"}) == {"ring-1": "b1"}


def test_grace_counts_continuous_downtime() -> None:
    assert placement.past_grace({"a": 0.0, "b": 250.0}, 300.0, 300.0) == ["a"]
    assert placement.past_grace({}, 1e9, 300.0) == []


def test_voters_take_in_a_filled_replica_then_let_the_displaced_one_go() -> None:
    old, new = ["a", "b", "c"], ["a", "d", "b"]
    filled = {"a", "b"}
    step = placement.next_voters(old, new, "a", filled.__contains__)
    assert step == ["a", "b", "c"]  # d is not filled yet: nothing changes
    filled.add("d")
    step = placement.next_voters(step, new, "a", filled.__contains__)
    assert step == ["a", "d", "b", "c"]
    step = placement.next_voters(step, new, "a", filled.__contains__)
    assert step == ["a", "d", "b"]
    assert placement.next_voters(step, new, "a", filled.__contains__) == step
    # the leader itself is never dropped: it hands the partition over first
    assert placement.next_voters(["x", "a"], ["a"], "x", lambda n: True) == ["a", "x"]


def majority(n: int) -> int:
    return n // 2 + 1


@SETTINGS
@given(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=5, unique=True),
       st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=5, unique=True), st.data())
def test_voter_sets_change_one_member_at_a_time_and_reach_the_preference_list(old, new, data) -> None:
    leader = data.draw(st.sampled_from(old))
    voters, filled = list(old), set()
    for _ in range(12):
        filled |= data.draw(st.sets(st.sampled_from(new), max_size=2))
        nxt = placement.next_voters(voters, new, leader, filled.__contains__)
        assert len(set(nxt) ^ set(voters)) <= 1, (voters, nxt)
        assert leader in nxt
        # every majority of the new set overlaps every majority of the old one
        assert len(set(nxt) & set(voters)) >= majority(len(voters)) + majority(len(nxt)) - len(set(nxt) | set(voters))
        assert all(v in filled or v in old for v in nxt)  # only filled replicas join
        voters = nxt
    filled = set(new)
    for _ in range(12):
        voters = placement.next_voters(voters, new, leader, filled.__contains__)
    assert set(voters) == set(new) | ({leader} if leader not in new else set())


def test_leads_round_trip_and_spill_long_topics() -> None:
    leads = {("orders", p): 3 + p % 2 for p in range(1000)} | {("t", 0): 1}
    doc = leaders.encode_leads(leads)
    assert all(len(v.encode()) <= limits.GOSSIP_STRING_BYTES_MAX for v in doc.values())
    assert len(doc) == 2 and doc["@1"].startswith("@orders ")  # spilled, named again
    assert leaders.decode_leads(doc) == leads
    parts = {("a", 1), ("b.c", 7), ("12.5", 3)}  # a topic may be named like an item
    assert leaders.decode_partitions(leaders.encode_partitions(parts)) == parts
    assert leaders.decode_removed({"ring-1": 5, "x": "nope", 3: 4}) == {"ring-1": 5}


def test_a_broker_leading_thousands_of_topics_claims_every_one_within_the_gossip_limits() -> None:
    # One key per topic would stop at GOSSIP_MAP_KEYS_MAX (256) topics: the rest would go
    # unclaimed, and their followers would depose the leader over and over.
    long_name = "x" * limits.TOPIC_NAME_BYTES_MAX
    leads = {(f"topic-{i}", p): i % 7 for i in range(3000) for p in (i % 3, 3 + i % 3)}
    leads |= {(long_name, p): 9 for p in range(limits.TOPIC_PARTITIONS_MAX)}
    doc = leaders.encode_leads(leads)
    assert len(doc) <= limits.GOSSIP_MAP_KEYS_MAX
    assert all(len(v.encode()) <= limits.GOSSIP_STRING_BYTES_MAX for v in doc.values())
    assert leaders.decode_leads(doc) == leads
    assert gossip_state.plain({"leads": doc}, "extra") == {"leads": doc}  # what a peer's gossip check accepts
    behind = set(leads)
    assert leaders.decode_partitions(leaders.encode_partitions(behind)) == behind


def test_gossiped_maps_never_raise_on_garbage() -> None:
    for junk in (None, [], "x", {"t": 5}, {"@0": "1.x 2. .3 4.5"}, {5: "1.2"}, {"@0": "@ 1.2 @@ 3"}, {"@0": 7}):
        leaders.decode_leads(junk)
        leaders.decode_partitions(junk)
        leaders.decode_removed(junk)
        leaders.decode_decommissioned(junk)
    assert leaders.decode_leads({"@0": "@t 1.x 2. .3 4.5", "t": "@u 1.1"}) == {("t", 4): 5}
    assert leaders.decode_partitions({"@0": "1 @t 2 x @ 3"}) == {("t", 2)}


def test_the_newest_live_claim_names_the_leader() -> None:
    claims = {"a": {("t", 0): 3}, "b": {("t", 0): 4}, "c": {("t", 1): 9}}
    alive = {"a", "c"}.__contains__
    assert leaders.leader_from_claims(claims, ("t", 0), alive) == ("a", 3)  # b claims newer but is down
    assert leaders.leader_from_claims(claims, ("t", 0), lambda n: True) == ("b", 4)
    assert leaders.leader_from_claims(claims, ("t", 2), lambda n: True) is None
