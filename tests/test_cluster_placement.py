"""Placement from gossiped state (pure): the ring, preference lists, what a broker holds,
catalogue reconciling, and when a starting broker has joined."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ring.catalog import TopicConfig
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.node import placement


def ep(name: str, ordinal: int, status: str = "normal", token: int | None = None) -> EndpointState:
    return EndpointState(name, broker_token(ordinal) if token is None else token, f"{name}:1", f"{name}:2",
                         generation=1, status=status)


def test_ring_holds_every_broker_but_removed_ones() -> None:
    eps = [ep("ring-0", 0), ep("ring-1", 1, "joining"), ep("ring-2", 2, "leaving"), ep("ring-3", 3, "removed")]
    ring = placement.placement_ring(eps)
    assert [n for _, n in ring.brokers] == ["ring-0", "ring-1", "ring-2"]


def test_a_token_clash_keeps_the_smaller_name_on_every_broker() -> None:
    a, b = ep("ring-a", 0, token=42), ep("ring-b", 1, token=42)
    assert [n for _, n in placement.placement_ring([b, a]).brokers] == ["ring-a"]
    assert placement.placement_ring([a, b]) == placement.placement_ring([b, a])


def test_three_brokers_each_lead_a_third_and_hold_everything() -> None:
    ring = placement.placement_ring([ep(f"ring-{i}", i) for i in range(3)])
    cfg = TopicConfig("t", partitions=6, replication_factor=3)
    lists = placement.preference_lists(ring, cfg)
    assert all(len(set(r)) == 3 for r in lists)
    leaders = [r[0] for r in lists]
    assert sorted(leaders) == ["ring-0", "ring-0", "ring-1", "ring-1", "ring-2", "ring-2"]
    for name in ("ring-0", "ring-1", "ring-2"):
        assert set(placement.held(ring, cfg, name)) == set(range(6))


def test_rf_is_capped_at_the_ring_and_a_lone_broker_holds_all() -> None:
    ring = placement.placement_ring([ep("solo", 0)])
    cfg = TopicConfig("t", partitions=4, replication_factor=3)
    assert placement.held(ring, cfg, "solo") == {p: ["solo"] for p in range(4)}
    assert placement.held(ring, cfg, "other") == {}


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 7), st.integers(1, 5), st.integers(1, 16))
def test_every_partition_is_held_by_exactly_rf_capped_brokers(size: int, rf: int, partitions: int) -> None:
    eps = [ep(f"b-{i}", i) for i in range(size)]
    ring = placement.placement_ring(eps)
    cfg = TopicConfig("topic", partitions=partitions, replication_factor=rf)
    holders: dict[int, set[str]] = {p: set() for p in range(partitions)}
    for e in eps:
        for p, replicas in placement.held(ring, cfg, e.name).items():
            assert e.name in replicas
            holders[p].add(e.name)
    assert all(len(h) == min(rf, size) for h in holders.values())


def test_catalog_change_adds_removes_and_replaces_new_incarnations() -> None:
    old = TopicConfig("a", created_ms=1)
    kept = TopicConfig("b", created_ms=2)
    local = {"a": old, "b": kept, "gone": TopicConfig("gone", created_ms=3)}
    live = {"a": TopicConfig("a", partitions=2, created_ms=9).to_json(), "b": kept.to_json(),
            "new": TopicConfig("new", created_ms=5).to_json(), "bad": {"partitions": -1}}
    change = placement.catalog_change(local, live)
    assert change.remove == ["a", "gone"]
    assert [c.name for c in change.add] == ["a", "new"] and change.add[0].partitions == 2
    assert placement.catalog_change({"b": kept}, {"b": kept.to_json()}) == placement.CatalogChange([], [], [], [])


def test_catalog_change_updates_settings_and_never_shrinks_partitions() -> None:
    local = TopicConfig("a", partitions=3, created_ms=1)
    grown = local.changed({"partitions": 5, "retention_ms": 1000})
    change = placement.catalog_change({"a": local}, {"a": grown.to_json()})
    assert (change.remove, change.add, change.update, change.regrow) == ([], [], [grown], [])
    assert grown.base_partitions == 3
    # A later retention change made from the old count (last writer wins) keeps the grown count.
    stale = local.changed({"retention_ms": 2000})
    change = placement.catalog_change({"a": grown}, {"a": stale.to_json()})
    kept = TopicConfig("a", partitions=5, base_partitions=3, retention_ms=2000, created_ms=1)
    assert change.update == [kept] and change.regrow == [kept]
    assert placement.catalog_change({"a": grown}, {"a": grown.to_json()}) == placement.CatalogChange([], [], [], [])


def test_an_unreadable_gossiped_config_never_removes_a_local_topic() -> None:
    kept = TopicConfig("b", created_ms=2)
    bad = {**kept.to_json(), "partitions": -1, "created_ms": 99}  # a buggy or newer peer's config
    assert placement.catalog_change({"b": kept}, {"b": bad}) == placement.CatalogChange([], [], [], [])


def test_joined() -> None:
    assert placement.joined(False, False, False, 0.0, 5.0)  # no seeds but itself: a cluster of one
    assert not placement.joined(True, False, True, 99.0, 5.0)  # never heard from anyone
    assert placement.joined(True, True, True, 0.0, 5.0)  # every seed known
    assert not placement.joined(True, True, False, 1.0, 5.0)  # a seed unknown: wait a little
    assert placement.joined(True, True, False, 5.0, 5.0)  # ... but not forever
