"""A peer's new claims or behind-set move only the partitions whose entries changed (``Members.moved``):
the elections look at those, not at every replica, which they do when a peer's status, generation or
clock changes (``Members.signature``)."""

from __future__ import annotations

import random

from ring.gossip import leaders
from ring.gossip.state import EndpointState
from ring.node.members import Members


def test_new_claims_move_the_partitions_they_changed_and_leave_the_signature() -> None:
    members = Members(EndpointState("a", 0, "a:1", "a:2", generation=1), [], random.Random(1))
    b = EndpointState("b", 0, "b:1", "b:2", generation=1, status="normal",
                      extra={"leads": leaders.encode_leads({("t", 0): 1, ("t", 1): 1})})
    members.gossip.state.endpoints["b"] = b
    signature = members.signature(0.0)
    assert members.moved() == {("t", 0), ("t", 1)} and members.moved() == set()
    members.gossip.state.endpoints["b"] = b.bumped(extra={
        "leads": leaders.encode_leads({("t", 0): 1, ("t", 1): 2, ("u", 0): 1}),
        "behind": leaders.encode_partitions({("t", 2)})})
    assert members.signature(0.0) == signature
    assert members.moving() and members.moved() == {("t", 1), ("u", 0), ("t", 2)}
    assert not members.moving()
    members.gossip.state.endpoints["b"] = members.gossip.state.endpoints["b"].bumped(generation=2)
    assert members.signature(0.0) != signature  # a restart: every replica is looked at
