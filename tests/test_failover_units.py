"""Elections as pure decisions: the voter's rule, the candidate's count, who stands when, and handing back.

Unit cases pin each rule; properties check the two that safety rests on: a
voter never grants two candidates the same epoch (whatever order requests
come in), and a granted vote always went to a log at least as up to date as
the voter's.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.errors import BadRequest
from ring.replication import election as e

SETTINGS = settings(max_examples=150, deadline=None)
VOTERS = frozenset({"a", "b", "c"})


def voter(ballot=e.Ballot(3, None), key=(3, 10), voters=VOTERS, leader_alive=False, leading=False, name="b"):
    return e.Voter(name, ballot, key, voters, leader_alive, leading)


def req(epoch=4, candidate="a", key=(3, 10), pre=False, transfer=False):
    return e.VoteRequest("t", 0, epoch, candidate, key[0], key[1], pre, transfer)


# -- the voter ---------------------------------------------------------------------


def test_up_to_date_is_lexicographic_on_last_epoch_then_end() -> None:
    assert e.up_to_date((3, 10), (3, 10))
    assert e.up_to_date((4, 0), (3, 99))
    assert not e.up_to_date((3, 9), (3, 10))
    assert not e.up_to_date((2, 99), (3, 0))


def test_a_vote_is_granted_once_per_epoch_and_saved_before_the_answer() -> None:
    v = e.judge_vote(voter(), req())
    assert v.reply.granted and v.reply.reason == e.GRANTED and v.ballot == e.Ballot(4, "a")
    again = e.judge_vote(voter(ballot=e.Ballot(4, "a")), req())  # a retried request: same answer, nothing new
    assert again.reply.granted and again.ballot is None
    other = e.judge_vote(voter(ballot=e.Ballot(4, "a")), req(candidate="c"))
    assert not other.reply.granted and other.reply.reason == e.ALREADY_VOTED and other.ballot is None


def test_a_candidate_behind_the_voter_is_refused_but_its_epoch_adopted() -> None:
    v = e.judge_vote(voter(key=(3, 11)), req(key=(3, 10)))
    assert not v.reply.granted and v.reply.reason == e.BEHIND
    assert v.ballot == e.Ballot(4, None) and v.reply.epoch == 4  # the voter moves to epoch 4 all the same


def test_stale_requests_and_strangers_are_refused() -> None:
    assert e.judge_vote(voter(ballot=e.Ballot(5, None)), req(epoch=4)).reply.reason == e.STALE_EPOCH
    assert e.judge_vote(voter(ballot=e.Ballot(5, None)), req(epoch=4)).reply.epoch == 5
    assert e.judge_vote(voter(), req(candidate="zed")).reply.reason == e.NOT_A_VOTER
    assert e.judge_vote(voter(name="zed"), req()).reply.reason == e.NOT_A_VOTER


def test_a_leader_steps_down_on_a_newer_real_vote_only() -> None:
    assert e.judge_vote(voter(leading=True, leader_alive=True), req()).step_down
    assert not e.judge_vote(voter(leading=True, leader_alive=True), req(epoch=3)).step_down
    pre = e.judge_vote(voter(leading=True, leader_alive=True), req(pre=True))
    assert not pre.step_down and not pre.reply.granted and pre.reply.reason == e.LEADER_ALIVE


def test_pre_votes_change_nothing_and_respect_a_live_leader_unless_it_asked() -> None:
    v = e.judge_vote(voter(), req(pre=True))
    assert v.reply.granted and v.ballot is None
    assert e.judge_vote(voter(leader_alive=True), req(pre=True)).reply.reason == e.LEADER_ALIVE
    assert e.judge_vote(voter(leader_alive=True), req(pre=True, transfer=True)).reply.granted
    assert e.judge_vote(voter(key=(4, 0)), req(pre=True)).reply.reason == e.BEHIND
    assert e.judge_vote(voter(ballot=e.Ballot(4, None)), req(pre=True, epoch=4)).reply.reason == e.STALE_EPOCH


_keys = st.tuples(st.integers(-1, 4), st.integers(0, 6))
_requests = st.builds(req, st.integers(1, 6), st.sampled_from(sorted(VOTERS)), _keys, st.booleans())


@SETTINGS
@given(st.lists(_requests, max_size=25), _keys)
def test_one_grant_per_epoch_and_only_to_logs_at_least_as_up_to_date(requests, my_key) -> None:
    ballot = e.Ballot(0, None)
    granted: dict[int, str] = {}
    for r in requests:
        v = e.judge_vote(voter(ballot=ballot, key=my_key), r)
        if v.ballot is not None:
            assert v.ballot.epoch >= ballot.epoch  # a ballot never goes back
            ballot = v.ballot
        if v.reply.granted and not r.pre:
            assert e.up_to_date(r.key, my_key)
            assert granted.setdefault(r.epoch, r.candidate) == r.candidate, "two candidates granted one epoch"
            assert ballot == e.Ballot(r.epoch, r.candidate)


# -- the candidate -----------------------------------------------------------------


def reply(voter_name: str, granted: bool, epoch: int = 4) -> e.VoteReply:
    return e.VoteReply("t", 0, epoch, voter_name, granted, e.GRANTED if granted else e.BEHIND)


def test_tally_needs_a_majority_of_the_voter_set_counting_itself() -> None:
    t = e.Tally("a", VOTERS, 4)
    assert not t.won and not t.lost
    t.add(reply("b", True))
    assert t.won
    t = e.Tally("a", VOTERS, 4)
    t.add(reply("b", False))
    assert not t.lost
    t.add(reply("c", False))
    assert t.lost and not t.won
    t = e.Tally("a", VOTERS, 4)
    t.add(reply("zed", True))  # not a voter: ignored
    t.add(reply("a", True))  # ourselves again: ignored
    t.add(e.VoteReply("t", 0, 3, "b", True, e.GRANTED, pre=True))  # a late answer to our pre-vote: not a vote
    assert not t.won
    t.add(reply("b", False, epoch=7))
    assert t.lost and t.newest_epoch == 7


@SETTINGS
@given(st.integers(1, 7), st.data())
def test_tally_wins_exactly_with_a_majority(n, data) -> None:
    names = [f"r{i}" for i in range(n)]
    t = e.Tally(names[0], frozenset(names), 2)
    yes = data.draw(st.sets(st.sampled_from(names)))
    for name in names:
        t.add(reply(name, name in yes, 2))
    assert t.won == (len(yes | {names[0]}) >= n // 2 + 1)


def test_wire_forms_round_trip_and_malformed_ones_are_bad_requests() -> None:
    r = req(pre=True, transfer=True)
    assert e.request_from_wire(msgpack.unpackb(msgpack.packb(r.to_wire()))) == r
    rep = reply("b", True)
    assert e.reply_from_wire(msgpack.unpackb(msgpack.packb(rep.to_wire()))) == rep
    for bad in ([], ["vote"], ["vote", "t", 0, 0, "a", 1, 2, 0], ["vote", "t", 0, 1, "", 1, 2, 0],
                ["vote", "t", 0, 1, "a", 1, -2, 0], ["vote", "t", 0, 1, "a", 1, 2, 9], "vote", None):
        with pytest.raises(BadRequest):
            e.request_from_wire(bad)
    for bad in (["voted", "t", 0, 1, "b", 1, "granted", False], ["voted", "t", 0, 1, "b", True, "why", False],
                ["voted", "t", 0, 1, "b", True, "granted"], ["voted", "t", 0, 1, "b", True, "granted", 0]):
        with pytest.raises(BadRequest):
            e.reply_from_wire(bad)


# -- when a leader is lost, who stands -------------------------------------------------


def test_leader_lost_when_unknown_down_restarted_or_no_longer_claiming() -> None:
    assert e.leader_lost(None, "b", False, False, False, 0, 3)
    assert not e.leader_lost("b", "b", True, False, False, 99, 3)  # we lead
    assert e.leader_lost("a", "b", False, False, True, 0, 3)
    assert e.leader_lost("a", "b", True, True, True, 0, 3)
    assert not e.leader_lost("a", "b", True, False, True, 99, 3)
    assert not e.leader_lost("a", "b", True, False, False, 2.9, 3)  # gossip may lag a new leader
    assert e.leader_lost("a", "b", True, False, False, 3, 3)


def test_the_first_live_caught_up_voter_stands_first_and_the_unclean_last() -> None:
    replicas = ["a", "b", "c"]
    alive = {"b", "c"}.__contains__
    step, fallback = 1.0, 5.0
    assert e.stand_delay_s("b", replicas, replicas, alive, lambda n: True, step, fallback) == 0
    assert e.stand_delay_s("c", replicas, replicas, alive, lambda n: True, step, fallback) == 1.0
    assert e.stand_delay_s("a", replicas, replicas, alive, lambda n: True, step, fallback) is None  # down
    assert e.stand_delay_s("b", replicas, ["a", "c"], alive, lambda n: True, step, fallback) is None  # no voter
    unclean = {"b"}.__contains__  # b came back from an unclean shutdown and has not caught up
    assert e.stand_delay_s("c", replicas, replicas, alive, lambda n: not unclean(n), step, fallback) == 0
    # b only if c cannot win (c may be behind b): after the fallback
    assert e.stand_delay_s("b", replicas, replicas, alive, lambda n: not unclean(n), step, fallback) == 6.0
    nobody = e.stand_delay_s("b", replicas, replicas, alive, lambda n: False, step, fallback)
    assert nobody == fallback  # nobody caught up is alive: b stands after the fallback
    assert e.stand_delay_s("c", replicas, replicas, alive, lambda n: False, step, fallback) == fallback + step
    assert e.stand_delay_s("b", ["b"], ["b"], alive, lambda n: False, step, fallback) == 0  # alone


@SETTINGS
@given(st.permutations(["a", "b", "c", "d", "e"]), st.sets(st.sampled_from("abcde")),
       st.sets(st.sampled_from("abcde")))
def test_live_replicas_stand_one_at_a_time_caught_up_ones_first(replicas, alive, clean) -> None:
    delays = {r: e.stand_delay_s(r, replicas, replicas, alive.__contains__, clean.__contains__, 1.0, 5.0)
              for r in replicas}
    standing = [r for r, d in delays.items() if d is not None]
    assert set(standing) == alive  # every live voter stands in the end: nobody waits for ever
    if alive:
        first = min(standing, key=lambda r: delays[r])
        assert len({delays[r] for r in standing}) == len(standing)  # one at a time
        if alive & clean:
            assert first in clean and delays[first] == 0
            assert all(delays[r] > delays[c] for r in alive - clean for c in alive & clean)


def test_leadership_goes_back_to_the_natural_leader_once_caught_up() -> None:
    replicas = ["a", "b", "c"]
    up = lambda n: True  # noqa: E731
    ends = {"a": 10, "c": 12}
    args = dict(up=up, eligible=lambda n: True, acked_end=ends.get, hw=12)
    assert e.transfer_target("b", replicas, replicas, **args, led_for_s=5, min_lead_s=3) is None  # a behind
    ends["a"] = 12
    assert e.transfer_target("b", replicas, replicas, **args, led_for_s=5, min_lead_s=3) == "a"
    assert e.transfer_target("b", replicas, replicas, **args, led_for_s=1, min_lead_s=3) is None  # too soon
    assert e.transfer_target("a", replicas, replicas, **args, led_for_s=5, min_lead_s=3) is None  # a leads
    assert e.transfer_target("b", replicas, replicas, up, lambda n: n != "a", ends.get, 12, 5, 3) is None
    # a leader no longer placed hands over to the first placed voter holding everything committed
    assert e.transfer_target("x", replicas, ["x", "a", "b"], up, lambda n: True, ends.get, 12, 5, 3) == "a"
