"""Topic ids without brokers: the catalogue's ids (new per incarnation, derived for configs stored
without one), the offsets records that carry them (and old records without them), and a group that
never applies an offset committed for another topic of the same name."""

from __future__ import annotations

import pytest

from ring.catalog import Catalog, TopicConfig, derived_id
from ring.errors import BadRequest, TopicRecreated
from ring.groups import codec
from ring.groups.group import Commit, Forget, Group, Rebalance, MemberSpec, State
from ring.node.placement import catalog_change

A, B = "A" * 22, "B" * 22


def test_a_config_stored_without_an_id_gets_one_derived_from_name_and_creation() -> None:
    old = {"name": "t", "partitions": 2, "created_ms": 5}
    cfg = TopicConfig.from_json(old)
    assert cfg.id == derived_id("t", 5) == TopicConfig.from_json(old).id and len(cfg.id) == 22
    assert TopicConfig.from_json({**old, "created_ms": 6}).id != cfg.id  # another incarnation
    stored = TopicConfig.from_json({**old, "id": A})
    assert stored.id == A and TopicConfig.from_json(stored.to_json()) == stored
    assert Catalog.loads(Catalog({"t": stored}, 3).dumps()).get("t").id == A
    with pytest.raises(BadRequest):
        TopicConfig.from_json({**old, "id": "not an id"})


def test_an_id_is_not_a_setting_a_client_may_give_or_change() -> None:
    with pytest.raises(BadRequest, match="unknown topic settings: id"):
        TopicConfig.from_request({"name": "t", "id": A}, now_ms=1)
    cfg = TopicConfig.from_json({"name": "t", "created_ms": 1, "id": A})
    with pytest.raises(BadRequest):
        cfg.changed({"id": B})
    assert cfg.changed({"retention_ms": 1000}).id == A


def test_another_id_gossiped_is_a_new_incarnation() -> None:
    local = {"t": TopicConfig.from_json({"name": "t", "created_ms": 1, "id": A})}
    same = catalog_change(local, {"t": local["t"].to_json()})
    assert same.remove == [] and same.add == []
    new = catalog_change(local, {"t": {**local["t"].to_json(), "id": B}})
    assert new.remove == ["t"] and [c.id for c in new.add] == [B]


def test_offsets_records_carry_ids_in_a_header_and_old_records_still_read() -> None:
    spec = MemberSpec("m", ("t",), 10_000, None, "earliest", (("t", 0),))
    events = [Commit((("t", 0, 10),), 7, False, (("t", A),)), Rebalance(2, (spec,), (("t", 1),), 7, (("t", A),)),
              State(2, (spec,), (("t", 1),), (("t", 0, 10),), 7, (("t", A),), (("t", B),)), Forget((("t", A),), 8)]
    for e in events:
        header = codec.ids_header(e)
        assert codec.decode(codec.encode(e), [header] if header else None) == e
    old = codec.decode(codec.encode(events[0]))  # no header: written by a release without ids
    assert old == Commit((("t", 0, 10),), 7, False, ())


def group_with_offset(tid: str | None) -> Group:
    g = Group("g")
    g.apply(Commit((("t", 0, 10),), 1, False, (("t", tid),) if tid else ()), 0.0)
    return g


def test_an_offset_committed_for_another_id_never_applies() -> None:
    g = group_with_offset(A)
    g.see_topics({"t": A})
    assert g.committed_at(("t", 0)) == 10
    g.see_topics({"t": B})  # deleted and created again; the delete itself went unseen
    assert g.committed_at(("t", 0)) is None
    g.apply(Commit((("t", 1, 3),), 2, False, (("t", B),)), 0.0)  # a commit for the new topic drops the old ones
    assert g.committed == {("t", 1): 3} and g.topic_ids == {"t": B}


def test_forgetting_a_deleted_topic_is_idempotent_and_spares_a_newer_one() -> None:
    g = group_with_offset(A)
    forget = g.propose_forget([("t", A)], 5)
    assert forget == Forget((("t", A),), 5)
    g.apply(forget, 0.0)
    assert g.committed == {} and g.propose_forget([("t", A)], 6) is None
    g.apply(forget, 0.0)  # replayed twice: nothing more
    assert g.committed == {}
    newer = group_with_offset(B)
    assert newer.propose_forget([("t", A)], 5) is None
    newer.apply(Forget((("t", A),), 5), 0.0)
    assert newer.committed == {("t", 0): 10}


def test_offsets_without_an_id_are_taken_for_the_topic_as_it_is_and_go_with_its_delete() -> None:
    g = group_with_offset(None)
    g.see_topics({"t": B})
    assert g.committed_at(("t", 0)) == 10
    g.apply(Commit((("t", 1, 4),), 2, False, (("t", B),)), 0.0)  # adopted by the first commit with an id
    assert g.committed == {("t", 0): 10, ("t", 1): 4}
    legacy = group_with_offset(None)
    legacy.apply(legacy.propose_forget([("t", A)], 3), 0.0)
    assert legacy.committed == {}


def test_a_member_given_an_older_topic_is_refused_until_it_joins_again() -> None:
    g = Group("g")
    g.see_topics({"t": A})
    g.apply(g.propose_join("m", ["t"], 10_000, None, "earliest", {"t": 1}, 0.0, 1), 0.0)
    g.acknowledge(g.member("m", None, 0.0), None)
    g.members["m"].positions[("t", 0)] = 10
    g.see_topics({"t": B})
    with pytest.raises(TopicRecreated) as err:
        g.member("m", None, 0.0)
    assert err.value.extra["topic_id"] == B and err.value.extra["stale_topic_id"] == A and err.value.extra["rejoin"]
    with pytest.raises(TopicRecreated):
        g.propose_commit("m", None, [("t", 0, 12)], 0.0, 2)
    rejoin = g.propose_join("m", ["t"], 10_000, None, "earliest", {"t": 1}, 0.0, 3)
    assert rejoin is not None and rejoin.ids == (("t", B),)
    g.apply(rejoin, 0.0)
    g.rejoined(g.members["m"])
    m = g.member("m", None, 0.0)
    assert m.positions == {} and g.start_offset(m, ("t", 0)) is None  # the reset policy decides
