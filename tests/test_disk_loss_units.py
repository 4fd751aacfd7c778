"""A replica that lost its disk, as pure decisions and steps on real logs (see test_disk_loss.py for brokers).

* a candidate counts a vote only from the incarnation it recorded; a vote from another
  (a wiped disk) counts as refused and is named in ``lost_state``; an unrecorded voter is learned;
* a broker asked for a vote on a partition it holds no replica of answers with its directory's
  incarnation: a candidate that recorded another one for it names it as having lost its state;
* a blank replica (its own state gone) grants nothing, and votes again once it caught up;
* a leader does not count a follower acking from a new incarnation for acknowledgements or the
  high watermark (not even what its old directory acknowledged) until it has caught up, then records
  it, and its followers keep that record from the sync;
* the new fields are appended to the wire arrays: frames and replies without them still decode.
"""

from __future__ import annotations

from pathlib import Path

import random

import msgpack
import pytest

from ring.errors import BadRequest
from ring.log.datadir import DataDir
from ring.node.elections import Elections
from ring.replication import election as e
from ring.replication import protocol, state, steps
from tests.test_repair_units import mk, put, replica

VOTERS = frozenset({"a", "b", "c"})


def reply(voter: str, granted: bool, incarnation: str, epoch: int = 4, reason: str = e.GRANTED) -> e.VoteReply:
    return e.VoteReply("t", 0, epoch, voter, granted, reason if granted else e.BEHIND, False, 0, incarnation)


def test_a_vote_from_another_incarnation_counts_as_refused_and_names_the_voter() -> None:
    t = e.Tally("a", VOTERS, 4, known={"a": "ia", "b": "ib", "c": "ic"})
    t.add(reply("b", True, "ib-new"))
    assert not t.won and t.lost_state == {"b"} and "b" in t.refused
    t.add(reply("c", True, "ic"))
    assert t.won and t.learned == {}


def test_an_unrecorded_voter_is_learned_and_an_old_release_reply_counts() -> None:
    t = e.Tally("a", VOTERS, 4, known={"a": "ia"})
    t.add(reply("b", True, "ib"))
    assert t.won and t.learned == {"b": "ib"}
    old = e.Tally("a", VOTERS, 4, known={"a": "ia", "b": "ib"})
    old.add(reply("b", True, ""))  # a reply from an older release names no incarnation
    assert old.won and not old.lost_state


def test_a_lost_state_refusal_is_named_even_without_a_record() -> None:
    t = e.Tally("a", VOTERS, 4)
    t.add(e.VoteReply("t", 0, 4, "b", False, e.LOST_STATE, False, 0, "ib"))
    assert t.lost_state == {"b"} and not t.won


def test_an_unclean_round_records_a_blank_voters_grant_even_without_a_record_of_it(tmp_path: Path) -> None:
    """A blank replica asked in an unclean round grants saying its state is gone, and a candidate that
    never recorded its incarnation counts the vote as unclean: the win is recorded as one, with what
    it gave up (before, such a grant counted as a clean one and nothing was recorded)."""
    b = replica(mk(tmp_path / "b"), "b", 0)
    b.incarnation = "ib-new"
    steps.restore(b, clean=True, lost=True)
    assert b.blank
    got = steps.on_vote_request(b, e.VoteRequest("t", 0, 5, "a", 0, 0, unclean=True), leader_alive=False)
    assert got.granted and got.reason == e.LOST_STATE and got.incarnation == "ib-new"
    t = e.Tally("a", VOTERS, 5, known={"a": "ia"}, unclean=True)
    t.add(got)
    assert t.won and t.unclean_votes == {"b"} and t.learned == {}
    clean = e.Tally("a", VOTERS, 5, known={"a": "ia"})
    clean.add(got)  # the same grant in a clean round does not count
    assert not clean.won and clean.lost_state == {"b"}


def test_a_broker_without_the_replica_is_named_by_a_candidate_that_recorded_another_incarnation() -> None:
    # b came back on a new directory ("ib-new") and no longer holds the partition (placed elsewhere)
    b = Elections("b", random.Random(1), lambda topic, p: None, lambda dst, m: None, lambda rep: None,
                  lambda rep: None, lambda: None)
    b.incarnation = "ib-new"
    answer = b.vote_asked(0.0, e.VoteRequest("t", 0, 4, "a", 3, 10), view=None)  # (no replica: no view needed)
    assert not answer.granted and answer.reason == e.NOT_A_VOTER and answer.incarnation == "ib-new"
    recorded = e.Tally("a", VOTERS, 4, known={"a": "ia", "b": "ib", "c": "ic"})
    recorded.add(answer)
    assert recorded.lost_state == {"b"} and "b" in recorded.refused
    never = e.Tally("a", VOTERS, 4, known={"a": "ia", "c": "ic"})  # b never acked: nothing of it was lost
    never.add(answer)
    assert not never.lost_state and "b" in never.refused and never.learned == {}


def test_wire_forms_carry_incarnations_and_older_forms_still_decode() -> None:
    r = reply("b", True, "ib")
    assert e.reply_from_wire(msgpack.unpackb(msgpack.packb(r.to_wire()))) == r
    assert e.reply_from_wire(r.to_wire()[:9]).incarnation == ""
    with pytest.raises(BadRequest):
        e.reply_from_wire([*r.to_wire()[:9], 5])
    with pytest.raises(BadRequest):
        e.reply_from_wire([*r.to_wire()[:9], "x" * 65])
    ack = protocol.FollowerAck("t", 0, 3, 10, 0, 1, "ib")
    assert protocol.decode(protocol.encode(ack), 1 << 20) == ack
    assert protocol.decode(msgpack.packb(ack.to_wire()[:7]), 1 << 20).incarnation == ""
    sync = protocol.Sync("t", 0, 3, 5, 5, 0, 10, ((1, 0), (3, 5)), ("a", "b", "c"), 2, (("a", "ia"), ("b", "ib")))
    assert protocol.decode(protocol.encode(sync), 1 << 20) == sync
    assert protocol.decode(msgpack.packb(sync.to_wire()[:11]), 1 << 20).incarnations == ()
    for bad in ("z=iz", "a=ia\na=ib", "a", "a=" + "x" * 65):  # not a voter, twice, no id, too long
        with pytest.raises(BadRequest):
            protocol.decode(msgpack.packb([*sync.to_wire()[:11], bad]), 1 << 20)


def test_a_data_directory_keeps_its_incarnation_and_a_new_one_is_fresh(tmp_path: Path) -> None:
    d = DataDir(tmp_path / "d")
    d.open()
    first = d.incarnation
    assert first and d.fresh
    d.close(clean=True)
    again = DataDir(tmp_path / "d")
    again.open()
    assert again.incarnation == first and not again.fresh
    again.close(clean=True)
    wiped = DataDir(tmp_path / "w")
    wiped.open()
    assert wiped.incarnation != first


def _leader_and_follower(tmp_path: Path):
    """a leads epoch 2 over 5 records held by b and c (all recorded), hw 5."""
    a = replica(mk(tmp_path / "a"), "a", 1)
    a.incarnation = "ia"
    put(a.log, 1, 5)
    a.voted_for = "a"
    a.incarnations = {"a": "ia", "b": "ib", "c": "ic"}
    assert steps.win(a, 1)
    for f in ("b", "c"):
        cur = protocol.SendCursor(1.0)
        steps.on_answer(a, cur, f, protocol.FollowerAck("t", 0, 1, 5, 0, 0, f"i{f}"), 0.0)
    assert a.hw == 5
    return a


def _ack(a, follower: str, end: int, incarnation: str) -> bool:
    """An ack stepped as the node core steps it; whether the record changed."""
    frame = protocol.FollowerAck("t", 0, a.epoch, end, 0, a.voters_seq, incarnation)
    changed = steps.note_incarnation(a, follower, frame)
    steps.on_answer(a, protocol.SendCursor(1.0), follower, frame, 0.0)
    return steps.note_incarnation(a, follower, frame) or changed


def test_a_leader_counts_a_wiped_follower_for_nothing_until_it_caught_up(tmp_path: Path) -> None:
    a = _leader_and_follower(tmp_path)
    put(a.log, 1, 3)  # offsets 5-7, not yet acknowledged by anyone
    a.set_durable(a.log.end_offset)
    assert not _ack(a, "b", 0, "ib-new")  # b lost its disk and starts again, empty
    assert a.renewed == {"b": "ib-new"} and a.lost_voters() == ["b"] and a.follower_ends["b"] == 0  # not its old 5
    assert _ack(a, "b", 8, "ib-new")  # it has everything committed (hw is 5): admitted on that ack
    assert a.renewed == {} and a.incarnations["b"] == "ib-new"
    assert state.load_full_state(a.log.directory).incarnations["b"] == "ib-new"
    assert a.hw == 8


def test_a_renewed_follower_acks_do_not_move_the_high_watermark(tmp_path: Path) -> None:
    a = _leader_and_follower(tmp_path)
    put(a.log, 1, 3)  # offsets 5-7
    a.set_durable(a.log.end_offset)
    _ack(a, "c", 5, "ic")
    a.follower_ends.pop("b")
    a.renewed["b"] = "ib-new"  # b answered from a new directory and has not caught up
    a.refresh()
    before = a.hw
    frame = protocol.FollowerAck("t", 0, a.epoch, 8, 0, a.voters_seq, "ib-new")
    steps.on_answer(a, protocol.SendCursor(1.0), "b", frame, 0.0)  # counted only by note_incarnation's say
    assert a.voter_ends()[1] == 0 and a.hw == before


def test_a_follower_keeps_its_leaders_record_and_its_own_incarnation(tmp_path: Path) -> None:
    a = _leader_and_follower(tmp_path)
    b = replica(mk(tmp_path / "b2"), "b", 0)
    b.incarnation = "ib-new"
    steps.on_sync(b, "a", steps.sync_frame(a))
    assert b.incarnations == {"a": "ia", "b": "ib-new", "c": "ic"}
    assert state.load_full_state(b.log.directory).incarnations == b.incarnations


def test_a_blank_replica_grants_nothing_until_it_caught_up(tmp_path: Path) -> None:
    a = _leader_and_follower(tmp_path)
    b = replica(mk(tmp_path / "b2"), "b", 0)
    b.incarnation = "ib-new"
    steps.restore(b, clean=True, lost=True)
    assert b.blank and not b.caught_up
    req = e.VoteRequest("t", 0, 5, "c", 0, 0)
    got = steps.on_vote_request(b, req, leader_alive=False)
    assert not got.granted and got.reason == e.LOST_STATE and got.incarnation == "ib-new" and b.voted_for is None
    steps.on_sync(b, "a", steps.sync_frame(a))
    assert b.blank  # synced, not yet caught up
    end = steps.on_append(b, "a", protocol.Append("t", 0, a.epoch, 0, a.hw, a.log.read(0, 1 << 20, upto=None)))
    assert end == a.log.end_offset and not b.blank and b.caught_up
    assert not state.load_full_state(b.log.directory).blank
    assert steps.on_vote_request(b, e.VoteRequest("t", 0, 5, "c", 1, end), leader_alive=False).granted


def test_a_blank_replica_stays_blank_across_a_restart_until_it_caught_up(tmp_path: Path) -> None:
    b = replica(mk(tmp_path / "b"), "b", 0)
    b.incarnation = "ib-new"
    steps.restore(b, clean=True, lost=True)
    again = replica(b.log, "b", 0)  # restarted: the directory is no longer new
    again.incarnation = "ib-new"
    steps.restore(again, clean=True, lost=False)
    assert again.blank and state.load_full_state(b.log.directory).blank


def test_a_replica_that_is_its_partitions_only_voter_is_never_blank(tmp_path: Path) -> None:
    """RF 1, or a broker alone: nobody else holds the partition, so there is nobody to wait for."""
    b = replica(mk(tmp_path / "b"), "b", 0)
    b.replicas = ["b"]
    b.incarnation = "ib-new"
    steps.restore(b, clean=True, lost=True)
    assert not b.blank and b.caught_up and not state.load_full_state(b.log.directory).blank


def test_a_saved_state_without_incarnations_loads_and_one_with_them_round_trips(tmp_path: Path) -> None:
    b = replica(mk(tmp_path / "b"), "b", 3)
    state.save_state(b)
    assert state.load_full_state(b.log.directory).incarnations == {}
    b.incarnations = {"a": "ia", "b": "ib"}
    state.save_state(b)
    assert state.load_full_state(b.log.directory).incarnations == {"a": "ia", "b": "ib"}
    b.incarnation = "ib"
    steps.restore(b, clean=True)
    assert b.incarnations == {"a": "ia", "b": "ib"} and not b.blank
