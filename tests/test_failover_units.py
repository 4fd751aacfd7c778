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


# -- the watch: what a broker decides on each tick -------------------------------------------


class Seen:
    """A View as plain data: who is alive and up, generations, claims, replicas still catching up."""

    def __init__(self, alive=("a", "b", "c"), up=None, claims=None, behind=None, generations=None,
                 clock_out=()) -> None:
        self._alive, self._up = set(alive), set(up if up is not None else alive)
        self._claims, self._behind = claims or {}, behind or {}
        self._gens = generations or {}
        self._clock_out = set(clock_out)

    def alive(self, name):
        return name in self._alive

    def up(self, name):
        return name in self._up

    def generation(self, name):
        return self._gens.get(name, 1)

    def claims(self):
        return self._claims

    def behind(self, name):
        return self._behind.get(name, set())

    def clock_usable(self, name):
        return name not in self._clock_out

    def reachable(self, name):
        return True


def _replica(tmp_path, me: str, leader: str | None, epoch: int = 1):
    import random

    from ring.clock import ManualClock
    from ring.log import FsyncPolicy, LogConfig, PartitionLog
    from ring.replication.replica import Replica

    log = PartitionLog(tmp_path / me, LogConfig(segment_bytes=4096, fsync=FsyncPolicy("never")), ManualClock())
    rep = Replica("t", 0, log, me, ["a", "b", "c"], epoch=epoch)
    rep.leader, rep.aligned = leader, leader is not None
    from ring.node.watch import Watch
    return rep, Watch(me, random.Random(1))


def test_a_follower_stands_in_its_turn_once_its_leader_is_down(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "a")
    c, wc = _replica(tmp_path, "c", "a")
    alive = Seen(claims={"a": {("t", 0): 1}})
    assert wb.tick(0.0, [b], alive) == [] and wc.tick(0.0, [c], alive) == []
    down = Seen(alive=("b", "c"))
    assert [a.kind for a in wb.tick(10.0, [b], down)] == ["stand"]  # b is next in line: at once
    assert wc.tick(10.0, [c], down) == []  # c waits its rank's step
    assert [a.kind for a in wc.tick(11.6, [c], down)] == ["stand"]
    wb.stood(b, won=False, now=11.6)
    assert wb.tick(11.7, [b], down) == []  # retries after a backoff


def test_no_stand_without_a_live_majority_nor_right_after_voting(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "a")
    assert wb.tick(10.0, [b], Seen(alive=("b",))) == []  # alone: no election can win
    wb.voted(b, granted_real_vote=True, now=20.0)
    assert wb.tick(21.0, [b], Seen(alive=("b", "c"))) == []  # the candidate we voted for may have won
    assert wb.voter_view(b, Seen(alive=("b", "c")), 21.0)  # and pre-votes are refused meanwhile
    assert [a.kind for a in wb.tick(23.5, [b], Seen(alive=("b", "c")))] == ["stand"]


def test_a_restarted_leader_is_lost_at_once_and_a_newer_claim_waits_for_its_sync(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "a")
    wb.tick(0.0, [b], Seen(claims={"a": {("t", 0): 1}}))
    restarted = Seen(generations={"a": 2}, behind={"a": {("t", 0)}})  # a crashed and came back, catching up
    assert [a.kind for a in wb.tick(0.1, [b], restarted)] == ["stand"]
    c, wc = _replica(tmp_path, "c", "a")
    newer = Seen(alive=("b", "c"), claims={"b": {("t", 0): 2}})
    assert wc.tick(10.0, [c], newer) == []  # b leads epoch 2: its link will sync c


def test_a_leader_steps_down_for_a_newer_claim_and_hands_back_to_the_natural_leader(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "b", epoch=3)
    b.lead()
    acts = wb.tick(0.0, [b], Seen(claims={"c": {("t", 0): 4}}))
    assert [a.kind for a in acts] == ["changed"] and not b.is_leader and b.epoch == 4
    b2, wb2 = _replica(tmp_path, "b2", "b2", epoch=3)
    b2.replicas = b2.voters = ["a", "b2", "c"]
    b2.lead()
    assert wb2.tick(0.0, [b2], Seen(alive=("a", "b2", "c"))) == []  # a has acknowledged nothing yet
    b2.set_follower_end("a", 0)
    assert wb2.tick(1.0, [b2], Seen(alive=("a", "b2", "c"))) == []  # led too briefly
    assert wb2.tick(4.0, [b2], Seen(alive=("a", "b2", "c"))) == []  # no majority is known to hold its voter set
    b2.voters_known.add("a")  # a acknowledged the set (an ack's voters_seq)
    acts = wb2.tick(4.1, [b2], Seen(alive=("a", "b2", "c")))
    assert [(a.kind, a.target) for a in acts] == [("hand_off", "a")]
    assert wb2.tick(5.0, [b2], Seen(alive=("a", "b2", "c"))) == []  # one handover at a time
    wb2.handed(b2, 5.0)
    assert wb2.tick(6.0, [b2], Seen(alive=("a", "b2", "c"))) == []  # and a pause before the next


def test_a_replica_cut_below_what_it_acknowledged_never_stands_until_it_holds_it_again(tmp_path) -> None:
    """Its own vote would refuse its log: standing as the last resort, it could win with voters as short
    as its cut log and drop batches its ack committed (the simulation's bit flips find that)."""
    from ring.log import batch as batchfmt

    b, wb = _replica(tmp_path, "b", "a")
    for _ in range(3):
        b.log.append(batchfmt.encode([(None, None, b"v", None)], now_ms=1), 1)
    b.vouched = (1, 5)  # a repair cut it back from offset 5
    down = Seen(alive=("b", "c"))
    assert wb.tick(10.0, [b], down) == [] and wb.tick(30.0, [b], down) == []  # not even as the last resort
    for _ in range(2):
        b.log.append(batchfmt.encode([(None, None, b"v", None)], now_ms=1), 1)
    assert [a.kind for a in wb.tick(30.1, [b], down)] == ["stand"]  # it holds what it vouched for again


def test_a_broker_whose_clock_is_out_of_bounds_never_stands_and_hands_its_partitions_over(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "a")
    down = Seen(alive=("b", "c"), clock_out=("b",))
    assert wb.tick(10.0, [b], down) == [] and wb.tick(30.0, [b], down) == []  # not even as the last resort
    assert [a.kind for a in wb.tick(30.1, [b], Seen(alive=("b", "c")))] == ["stand"]  # back within bounds
    a, wa = _replica(tmp_path, "a", "a", epoch=2)
    a.lead()
    from ring.log import batch as batchfmt
    a.log.append(batchfmt.encode([(None, None, b"v", None)], now_ms=1), a.epoch)
    assert wa.tick(0.0, [a], Seen()) == []  # the natural leader keeps its partition
    assert wa.tick(0.1, [a], Seen(clock_out=("a",))) == []  # no follower holds everything yet
    a.set_follower_end("b", a.log.end_offset)
    a.voters_known.add("b")
    acts = wa.tick(0.2, [a], Seen(clock_out=("a",)))
    assert [(x.kind, x.target) for x in acts] == [("hand_off", "b")]  # at once, whatever the lead time


def test_leadership_is_not_handed_back_to_a_natural_leader_whose_clock_is_out_of_bounds(tmp_path) -> None:
    b, wb = _replica(tmp_path, "b", "b", epoch=3)
    b.lead()
    b.set_follower_end("a", 0)
    b.voters_known.add("a")
    assert wb.tick(0.0, [b], Seen(clock_out=("a",))) == []
    assert wb.tick(10.0, [b], Seen(clock_out=("a",))) == []
    assert [(x.kind, x.target) for x in wb.tick(20.0, [b], Seen())] == [("hand_off", "a")]


def test_a_leader_moves_its_voters_only_once_a_majority_holds_the_current_set(tmp_path) -> None:
    """Two steps from {a, b, c} to {d, a, b} pass through {d, a, b, c}: the second waits until a majority of
    the four acknowledged a sync naming it, else {b, c}, which never heard of it, could still elect a leader
    of the old set while {d, a} lead the new one (found by the simulation, seed 1360)."""
    from ring.replication import protocol, steps

    a, wa = _replica(tmp_path, "a", "a")
    a.lead()
    a.set_placement(["d", "a", "b"])
    a.set_follower_end("d", 0)  # the new replica holds everything committed
    view = Seen(alive=("a", "b", "c", "d"))

    def acked(*followers: str, seq: int) -> None:
        for f in followers:
            steps.on_answer(a, protocol.SendCursor(0.3), f, protocol.FollowerAck("t", 0, a.epoch, 0, 0, seq), 10.0)

    wa.tick(10.0, [a], view)
    assert a.voters == ["a", "b", "c"], "a step before a majority held the set it was elected with"
    acked("b", seq=0)
    wa.tick(10.1, [a], view)
    assert a.voters == ["d", "a", "b", "c"]  # d joins
    wa.tick(10.2, [a], view)
    assert a.voters == ["d", "a", "b", "c"], "c left before a majority of the four held that set"
    acked("d", "b", seq=a.voters_seq - 1)  # acks naming the set before: not counted
    wa.tick(10.3, [a], view)
    assert a.voters == ["d", "a", "b", "c"]
    acked("d", "b", seq=a.voters_seq)
    wa.tick(10.4, [a], view)
    assert a.voters == ["d", "a", "b"]


def _lost_leader_of(tmp_path, partitions: int):
    """Broker b's replicas of ``partitions`` partitions whose leader a is down, its Elections, and what
    they send."""
    import random

    from ring.clock import ManualClock
    from ring.log import FsyncPolicy, LogConfig, PartitionLog
    from ring.node.elections import Elections
    from ring.replication.replica import Replica

    reps = {}
    for p in range(partitions):
        log = PartitionLog(tmp_path / str(p), LogConfig(segment_bytes=4096, fsync=FsyncPolicy("never")), ManualClock())
        reps[p] = Replica("t", p, log, "b", ["a", "b", "c"], epoch=1)
        reps[p].leader, reps[p].aligned = "a", True
    sent: list[tuple[str, e.VoteRequest]] = []
    el = Elections("b", random.Random(1), lambda t, p: reps.get(p), lambda dst, m: sent.append((dst, m)),
                   lambda rep: None, lambda rep: None, lambda: None)
    return reps, sent, el, Seen(alive=("b", "c"))


def test_a_broker_runs_at_most_candidacies_max_at_once_and_the_rest_stand_next_without_back_off(tmp_path) -> None:
    """A thousand partitions losing their leader together: the candidacies beyond the limit wait for
    one to end instead of flooding the voters (whose answers then came after the candidacies' timeout)."""
    from ring import limits

    reps, sent, el, down = _lost_leader_of(tmp_path, limits.CANDIDACIES_MAX + 10)
    el.tick(10.0, reps.values(), down)
    first = set(el.candidacies)
    assert len(first) == limits.CANDIDACIES_MAX and len(sent) == limits.CANDIDACIES_MAX
    el.tick(10.5, reps.values(), down)
    assert set(el.candidacies) == first and len(sent) == limits.CANDIDACIES_MAX  # the rest wait
    el.tick(11.1, reps.values(), down)  # the first ones time out (and back off)
    el.tick(11.2, reps.values(), down)
    assert set(el.candidacies) == {("t", p) for p in reps} - first  # the rest stand at once


def test_a_candidacy_that_ends_makes_room_for_the_next_one_at_once(tmp_path) -> None:
    """A thousand partitions losing their leader together: a replica waiting beyond CANDIDACIES_MAX stands
    in the step that ends a candidacy, not on a later tick."""
    from ring import limits

    reps, sent, el, down = _lost_leader_of(tmp_path, limits.CANDIDACIES_MAX + 2)
    el.tick(10.0, reps.values(), down)
    assert len(el.candidacies) == limits.CANDIDACIES_MAX
    pre = sent[0][1]
    el.answered(10.1, "c", pre, e.VoteReply("t", pre.partition, 1, "c", True, e.GRANTED, pre=True), down)
    real = sent[-1][1]
    assert not real.pre and real.partition == pre.partition
    el.answered(10.2, "c", real, e.VoteReply("t", real.partition, real.epoch, "c", True, e.GRANTED), down)
    assert reps[real.partition].is_leader
    assert len(el.candidacies) == limits.CANDIDACIES_MAX  # the first one waiting took its place
    assert sent[-1][1].pre and sent[-1][1].partition == limits.CANDIDACIES_MAX
    assert list(el.deferred) == [("t", limits.CANDIDACIES_MAX + 1)]
