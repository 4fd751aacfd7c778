"""A replica placed elsewhere that still counts itself a voter stays open until it learns the set
without it: a leader links to the voters it removed until they acknowledge the new set, and the
follower closes once it has (``NodeCore.keep``). Closing earlier would take a vote from elections
that need it (as in the simulation's seed 1221: four voters, one closed and one never told it was
one, and no candidate could reach three)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import msgpack

from ring.catalog import Catalog, TopicConfig
from ring.clock import ManualClock
from ring.gossip.state import ClusterState, TopicEntry
from ring.gossip.state import EndpointState
from ring.hashing import broker_token
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log.datadir import CATALOG_FILE
from ring.node import placement
from ring.node.core import NodeCore
from ring.node.gossip_steps import STATE_FILE
from ring.node.members import Members
from ring.node.ready import FromFollower, FromLeader, PlacementChanged
from ring.replication import protocol
from ring.replication.replica import Replica
from ring.replication.steps import save_state
from tests.support import _cluster_broker

T0 = 1_700_000_000_000


def replica(tmp_path: Path, name: str, replicas: list[str], voters: list[str]) -> Replica:
    log = PartitionLog(tmp_path / name, LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, name, replicas)
    rep.voters = list(voters)
    return rep


def node(name: str, rep: Replica) -> NodeCore:
    members = Members(EndpointState(name, 0, f"{name}:1", f"{name}:2", generation=1), [], random.Random(1))
    return NodeCore(name, lambda t, p: rep if p == 0 else None, lambda: [rep], True, random.Random(2), members)


def test_a_leader_links_to_a_voter_it_removed_until_the_voter_acknowledges_the_set_without_it(
        tmp_path: Path) -> None:
    rep = replica(tmp_path, "a", ["a", "b"], ["a", "b", "c"])
    rep.lead()
    core = node("a", rep)
    assert core.step(0.0, PlacementChanged()).links == {"b", "c"}
    rep.set_voters(["a", "b"])
    assert rep.leaving == {"c"} and rep.linked() == ["a", "b", "c"]
    core.step(0.1, PlacementChanged())
    assert set(core.links.links) == {"b", "c"}  # c is still told what the voters are
    core.step(0.2, FromFollower("c", protocol.FollowerAck("t", 0, rep.epoch, 0, 0, rep.voters_seq - 1)))
    assert rep.leaving == {"c"}  # it acknowledged an older set
    core.step(0.3, FromFollower("c", protocol.FollowerAck("t", 0, rep.epoch, 0, 0, rep.voters_seq)))
    assert rep.leaving == set() and set(core.links.links) == {"b"}


def test_a_replica_placed_elsewhere_stays_open_while_it_votes_and_closes_once_its_leader_leaves_it_out(
        tmp_path: Path) -> None:
    rep = replica(tmp_path, "c", ["a", "b"], ["a", "b", "c"])
    rep.leader = None
    core = node("c", rep)
    assert core.keep(rep, 0.0)  # a voter: closing it would take a vote away
    sync = protocol.Sync("t", 0, 2, 0, 0, 0, 0, ((2, 0),), ("a", "b", "c"), 1)
    ready = core.step(0.1, FromLeader("a", sync))
    assert not ready.reconcile and core.keep(rep, 0.1)
    ready = core.step(0.2, FromLeader("a", dataclasses.replace(sync, voters=("a", "b"), voters_seq=2)))
    assert ready.reconcile and not core.keep(rep, 0.2)  # out of the set: close, after the ack
    assert [(dst, a.voters_seq) for dst, a in ready.sends] == [("a", 2)]
    learner = replica(tmp_path, "d", ["a", "b"], ["a", "b"])
    learner.leader = None
    assert not node("d", learner).keep(learner, 0.0)


def test_a_broker_that_starts_opens_the_partitions_placed_elsewhere_it_still_votes_for(tmp_path: Path) -> None:
    """As it opens, a broker opens the partitions whose saved voter set names it, placed on it or not:
    after a restart its vote is still one its leader's elections count (the simulation's seed 876: four
    voters, one restarted without opening the partition, one never told it was one, and no candidate
    could reach three). A partition placed elsewhere whose saved voters leave it out stays closed."""
    names = ["ring-0", "ring-1", "ring-2"]
    cfg = TopicConfig.from_request({"name": "t", "partitions": 8, "replication_factor": 1}, now_ms=T0)
    state = ClusterState({n: EndpointState(n, broker_token(i), f"{n}:1", f"{n}:2", generation=1, status="normal")
                          for i, n in enumerate(names)}, {"t": TopicEntry(T0, "ring-1", cfg.to_json())})
    (tmp_path / STATE_FILE).write_bytes(msgpack.packb(state.to_wire()))
    catalog = Catalog()
    catalog.add(cfg)
    (tmp_path / CATALOG_FILE).write_bytes(catalog.dumps())
    members = Members(EndpointState("x", 0, "x:1", "x:2", generation=1), [], random.Random(1))
    members.restore(state, None, 0.0)
    lists = placement.preference_lists(members.ring, cfg)
    here = [p for p, placed in enumerate(lists) if "ring-0" in placed]
    voting, other = [p for p, placed in enumerate(lists) if "ring-0" not in placed][:2]
    for p, voters in ((voting, [lists[voting][0], "ring-0"]), (other, [lists[other][0]])):
        rep = replica(tmp_path / "topics" / "t", str(p), lists[p], voters)
        save_state(rep)
        rep.log.close()
    broker = _cluster_broker(tmp_path, "always")
    broker.open()
    try:
        assert sorted(r.index for r in broker.replicas()) == sorted([*here, voting])
        assert broker.replica("t", voting).voters == [lists[voting][0], "ring-0"]
    finally:
        asyncio.run(broker.close())
