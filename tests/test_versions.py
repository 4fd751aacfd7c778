"""Peer-protocol versions without brokers: ranges and the cluster's version, the subprotocols a link
offers, and the previous version's forms read back by the previous release's own decoders (loaded
from this repository's history, commit ``PREVIOUS``)."""

from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
import types
from pathlib import Path

import msgpack
import pytest

from ring.catalog import TopicConfig, derived_id
from ring.replication import election, protocol, versions

PREVIOUS = "78fa6b8"  # the previous release
ROOT = Path(__file__).resolve().parent.parent


def _previous(module: str) -> types.ModuleType:
    """A module of the previous release, loaded beside this one's (its imports resolve to this release's
    modules, which keep the names it uses)."""
    path = module.replace(".", "/") + ".py"
    run = subprocess.run(["git", "-C", str(ROOT), "show", f"{PREVIOUS}:{path}"], capture_output=True, text=True)
    if run.returncode != 0:
        pytest.fail(f"this test reads {path} of commit {PREVIOUS} from git history, which is missing here "
                    f"(a shallow clone? fetch the full history): {run.stderr.strip()}")
    spec = importlib.util.spec_from_loader(f"previous_{module.replace('.', '_')}", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses look their module up)
    exec(compile(run.stdout, f"{PREVIOUS}:{path}", "exec"), mod.__dict__)
    return mod


def test_a_broker_gossiping_no_range_speaks_the_oldest_version() -> None:
    assert versions.parse_range(None) == versions.parse_range("garbage") == versions.parse_range("5-4") == (3, 3)
    assert versions.parse_range(versions.advertised()) == (3, 4)
    assert versions.cluster_version([(3, 4), (3, 4), (3, 4)]) == 4
    assert versions.cluster_version([(3, 4), (3, 3), (3, 4)]) == 3
    assert versions.cluster_version([(3, 4), (3, 9)]) == 4  # never above what this broker speaks
    assert versions.cluster_version([]) == 4


def test_a_leader_offers_every_version_up_to_the_clusters_highest_first() -> None:
    assert versions.offered(4) == ("ring-replication.4", "ring-replication.3") == versions.spoken()
    assert versions.offered(3) == ("ring-replication.3",)
    assert versions.version_of("ring-replication.3") == 3 and versions.version_of(protocol.SUBPROTOCOL) == 4
    assert versions.version_of("ring-replication.2") is None and versions.version_of(None) is None


SYNC = protocol.Sync("t", 1, 7, 10, 3, 0, 12, ((1, 0), (7, 3)), ("b0", "b1", "b2"), 2,
                     (("b0", "i0"), ("b1", "i1")))
ACK = protocol.FollowerAck("t", 1, 7, 12, 0, 2, "i1")


def test_version_3_frames_are_read_by_the_previous_release_and_by_this_one_without_incarnations() -> None:
    old = _previous("ring.replication.protocol")
    assert old.SUBPROTOCOL == versions.subprotocol(3)
    for frame in (SYNC, ACK, protocol.Hw("t", 1, 7, 10, 0), protocol.Reject("t", 1, 7, 5, protocol.GAP),
                  protocol.Append("t", 1, 7, 10, 10, b"x" * 40)):
        raw = versions.encode(frame, 3)
        back = old.decode(raw, 1 << 20)
        assert back.to_wire()[0] == frame.to_wire()[0]  # the same kind of frame, whatever each release calls it
        ours = protocol.decode(raw, 1 << 20)
        if isinstance(frame, protocol.Sync):
            assert ours == protocol.Sync(*[getattr(frame, f) for f in (
                "topic", "partition", "epoch", "hw", "epoch_start", "log_start", "log_end", "history", "voters",
                "voters_seq")])
        elif isinstance(frame, protocol.FollowerAck):
            assert ours == protocol.FollowerAck("t", 1, 7, 12, 0, 2, "")
        elif not isinstance(frame, protocol.Append):
            assert ours == frame
    # Version 4 keeps the incarnations, which the previous release cannot read.
    assert protocol.decode(versions.encode(SYNC, 4), 1 << 20) == SYNC
    with pytest.raises(Exception, match="malformed"):
        old.decode(versions.encode(ACK, 4), 1 << 20)


def test_version_3_vote_replies_are_read_by_the_previous_release_a_lost_state_as_a_refusal() -> None:
    old = _previous("ring.replication.election")
    lost = election.VoteReply("t", 1, 7, "b1", False, election.LOST_STATE, False, 5, "i1")
    granted = election.VoteReply("t", 1, 7, "b1", True, election.GRANTED, False, 5, "i1")
    for reply in (lost, granted):
        wire = msgpack.unpackb(msgpack.packb(versions.vote_reply_wire(reply, 3)), raw=False)
        back = old.reply_from_wire(wire)
        assert (back.granted, back.log_start) == (reply.granted, 5)
        assert back.reason == (election.NOT_A_VOTER if reply is lost else election.GRANTED)
        assert old.NOT_A_VOTER == election.NOT_A_VOTER  # a refusal the previous release knows
        assert election.reply_from_wire(wire).incarnation == ""
    with pytest.raises(Exception, match="malformed"):
        old.reply_from_wire(versions.vote_reply_wire(lost, 4))


def test_a_topic_created_while_the_cluster_speaks_3_keeps_its_derived_id_after_the_upgrade() -> None:
    old = _previous("ring.catalog")
    cfg = TopicConfig.from_request({"name": "t", "partitions": 2}, now_ms=1234)
    mixed = versions.new_topic(cfg, 3, random.Random(1))
    assert mixed.id == derived_id("t", 1234)
    wire = versions.topic_wire(mixed.to_json(), 3)
    assert "id" not in wire
    assert old.TopicConfig.from_json(wire).name == "t"  # the previous release reads it
    assert TopicConfig.from_json(wire).id == mixed.id  # and this one derives the same id, then and after
    assert TopicConfig.from_json(versions.topic_wire(mixed.to_json(), 4)).id == mixed.id
    upgraded = versions.new_topic(cfg, 4, random.Random(1))
    assert upgraded.id != derived_id("t", 1234) and versions.topic_wire(upgraded.to_json(), 4)["id"] == upgraded.id
    # The previous release reads a config with an id by dropping it: one it writes back (a change made on
    # it) names none, so only the derived id survives a config going through it.
    assert "id" not in old.TopicConfig.from_json(upgraded.to_json()).to_json()
    assert TopicConfig.from_json(old.TopicConfig.from_json(wire).to_json()).id == mixed.id


def test_the_cluster_speaks_what_every_known_member_does_and_a_peer_is_answered_in_what_it_speaks() -> None:
    from ring.gossip.state import EndpointState
    from ring.node.members import Members

    members = Members(EndpointState("a", 0, "a:1", "a:2", generation=1), [], random.Random(1))
    assert members.protocol_version() == 4 and members.version_for("a") == 4
    assert members.version_for("b") == 3 and members.version_for(None) == 3  # not heard of: maybe older
    new = EndpointState("b", 0, "b:1", "b:2", generation=1, status="normal", extra={"protocol": "3-4"})
    members.gossip.state.endpoints["b"] = new
    assert members.protocol_version() == 4 and members.version_for("b") == 4
    members.gossip.state.endpoints["c"] = EndpointState("c", 0, "c:1", "c:2", generation=1, status="normal")
    assert members.protocol_version() == 3 and members.version_for("b") == 3  # c: the previous release
    members.gossip.state.endpoints["c"] = members.gossip.state.endpoints["c"].bumped(extra={"protocol": "3-4"})
    assert members.protocol_version() == 4  # raised once the last one speaks it
