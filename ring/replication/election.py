"""Leader elections as pure decisions: ballots, votes, who stands when, and when a leader counts as lost.

Theory of operation. Every partition replica keeps a ``Ballot`` (the newest
epoch it has seen and whom it voted for in it), persisted before any answer
that depends on it. A replica that sees no live leader (``leader_lost``)
waits its turn (``stand_delay_s``: the first live, caught-up voter in
preference order at once, each later one a step later, so the natural order
wins the race and a replica that came back from an unclean shutdown only
stands when nobody caught up is alive). It then asks every voter for a
*pre-vote*: "would you vote for me at epoch+1?". Nobody changes state for a
pre-vote, and a voter that still follows a live leader says no, so a replica
cut off from the others cannot depose a working leader by bumping epochs.
With a majority of pre-votes the candidate moves to epoch+1, votes for
itself (persisted) and asks for real votes. A voter grants at most one vote
per epoch, only to a candidate in its own voter set whose (last epoch, end
offset) is at least its own, compared lexicographically (``up_to_date``), and
persists the grant before answering. A majority of the voter set, the
candidate included, makes it the leader of the new epoch (``Tally``).

A voter's durable state can be lost with its disk: a replica that forgot its
ballot and what it acknowledged must not vote as if it were whole. Every
data directory carries an incarnation id, every reply names the voter's,
and a candidate counts a vote only from a voter whose incarnation matches
the one it recorded (``Tally.known``; a voter it has no record of, on a new
partition or state written by an older release, is learned from its
reply). A granted vote from another incarnation is a replica that lost its
state (``Tally.lost_state``): it counts as refused.

Any message with a higher epoch makes a replica adopt that epoch; a leader
that adopts one steps down at once and stops acknowledging. A leadership
transfer (the current leader hands a partition back to its natural leader,
``transfer_target``) skips the pre-vote, since the leader itself asked.

Wire forms are msgpack arrays::

    ["vote", topic, partition, epoch, candidate, last_epoch, end_offset, flags]   flags: 1 pre-vote, 2 transfer,
                                                                                   4 unclean
    ["voted", topic, partition, epoch, voter, granted, reason, pre, log_start, incarnation]

(the last two appended: a reply without them, from an older release, still
decodes, and counts as from an unknown incarnation).

A reply names whether it answers a pre-vote, so a late pre-vote reply is
never counted as a vote.

An unclean election (the topic's ``unclean_leader_election``, or an
operator's one-shot command for the partition) is the one exception to the
rule on lost state, chosen for availability: its requests carry the
``unclean`` flag, a replica that lost its state judges them as any voter
does (it holds nothing, so it refuses no candidate for being behind) and
grants saying its state is gone (reason ``lost_state``), and the candidate
counts such votes as unclean (``Tally.unclean_votes``), whether or not it
recorded that voter's incarnation. The voters that
still hold their state judge as always, and a candidate one of them finds
behind it does not win (``Tally.outranked``), so the most up-to-date live
replica that answers wins; what the lost voters held beyond its log is
lost, and the winner records from which offset (``steps.win``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ring import limits
from ring.errors import BadRequest

LogKey = tuple[int, int]  # (epoch of the last entry or begun epoch, log end offset)

# Why a vote was refused (or "granted").
GRANTED = "granted"
STALE_EPOCH = "stale_epoch"  # the request's epoch is not newer than the voter's
ALREADY_VOTED = "already_voted"  # the voter granted this epoch to another candidate
BEHIND = "behind"  # the candidate's log is less up to date than the voter's
LEADER_ALIVE = "leader_alive"  # pre-vote: the voter still follows a live leader
NOT_A_VOTER = "not_a_voter"  # the candidate is not in the voter's voter set (or the voter holds no replica)
# The voter lost its state (a new data directory) and has not caught up since: it votes for nobody.
# (A broker of an older release takes this reply as malformed, which counts as no answer: no vote.)
LOST_STATE = "lost_state"
REASONS = (GRANTED, STALE_EPOCH, ALREADY_VOTED, BEHIND, LEADER_ALIVE, NOT_A_VOTER, LOST_STATE)

PRE_VOTE = 1
TRANSFER = 2
UNCLEAN = 4

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


def majority(n: int) -> int:
    assert n >= 1, n
    return n // 2 + 1


def up_to_date(candidate: LogKey, voter: LogKey) -> bool:
    """Raft's rule: the later last epoch wins; with equal epochs, the longer log."""
    return candidate >= voter


@dataclass(frozen=True)
class Ballot:
    epoch: int = 0
    voted_for: str | None = None


@dataclass(frozen=True)
class VoteRequest:
    topic: str
    partition: int
    epoch: int  # the epoch the candidate stands for
    candidate: str
    last_epoch: int
    end_offset: int
    pre: bool = False
    transfer: bool = False
    unclean: bool = False  # an unclean election: voters that lost their state vote too

    @property
    def key(self) -> LogKey:
        return (self.last_epoch, self.end_offset)

    def to_wire(self) -> list[Any]:
        flags = (PRE_VOTE if self.pre else 0) | (TRANSFER if self.transfer else 0) | (UNCLEAN if self.unclean else 0)
        return ["vote", self.topic, self.partition, self.epoch, self.candidate, self.last_epoch,
                self.end_offset, flags]


@dataclass(frozen=True)
class VoteReply:
    topic: str
    partition: int
    epoch: int  # the voter's epoch after judging (a candidate behind it adopts it)
    voter: str
    granted: bool
    reason: str
    pre: bool = False  # the answer to a pre-vote
    # The voter's log start offset: a winner moves up to the largest of its voters' (a truncate is
    # answered once a majority holds its start, so one of them does).
    log_start: int = 0
    incarnation: str = ""  # the voter's data directory's incarnation ("": an older release's reply)

    def to_wire(self) -> list[Any]:
        return ["voted", self.topic, self.partition, self.epoch, self.voter, self.granted, self.reason, self.pre,
                self.log_start, self.incarnation]


def _int(v: Any, what: str, lo: int, hi: int) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"malformed vote: {what} must be an integer in [{lo}, {hi}]")
    return v


def _name(v: Any, what: str) -> str:
    if type(v) is not str or not v or len(v) > 253:
        raise BadRequest(f"malformed vote: {what} must be a non-empty string of at most 253 characters")
    return v


def request_from_wire(w: Any) -> VoteRequest:
    if type(w) is not list or len(w) != 8 or w[0] != "vote":
        raise BadRequest("malformed vote: not a vote request array")
    if type(w[1]) is not str or not w[1] or len(w[1]) > 249:
        raise BadRequest("malformed vote: topic must be a non-empty string")
    flags = _int(w[7], "flags", 0, PRE_VOTE | TRANSFER | UNCLEAN)
    return VoteRequest(w[1], _int(w[2], "partition", 0, _INT32_MAX), _int(w[3], "epoch", 1, _INT32_MAX),
                       _name(w[4], "candidate"), _int(w[5], "last_epoch", -1, _INT32_MAX),
                       _int(w[6], "end_offset", 0, _INT64_MAX), bool(flags & PRE_VOTE), bool(flags & TRANSFER),
                       bool(flags & UNCLEAN))


def reply_from_wire(w: Any) -> VoteReply:
    # 8: from a broker that sends no start; 9: no incarnation
    if type(w) is not list or len(w) not in (8, 9, 10) or w[0] != "voted":
        raise BadRequest("malformed vote: not a vote reply array")
    if type(w[1]) is not str or not w[1] or type(w[5]) is not bool or w[6] not in REASONS or type(w[7]) is not bool:
        raise BadRequest("malformed vote: topic, granted, reason or pre")
    log_start = _int(w[8], "log_start", 0, _INT64_MAX) if len(w) >= 9 else 0
    incarnation = w[9] if len(w) == 10 else ""
    if type(incarnation) is not str or len(incarnation) > limits.INCARNATION_CHARS_MAX:
        raise BadRequest("malformed vote: incarnation must be a string of at most "
                         f"{limits.INCARNATION_CHARS_MAX} characters")
    return VoteReply(w[1], _int(w[2], "partition", 0, _INT32_MAX), _int(w[3], "epoch", 0, _INT32_MAX),
                     _name(w[4], "voter"), w[5], w[6], w[7], log_start, incarnation)


def messages(votes: Mapping[str, Sequence[VoteRequest]]) -> Iterator[tuple[str, tuple[VoteRequest, ...]]]:
    """The vote requests for each peer in messages of at most VOTES_PER_MESSAGE_MAX (``POST
    /peer/v1/votes``), in order: (peer, requests) per message."""
    n = limits.VOTES_PER_MESSAGE_MAX
    for peer, reqs in votes.items():
        for i in range(0, len(reqs), n):
            yield peer, tuple(reqs[i:i + n])


# -- the voter's rule ----------------------------------------------------------


@dataclass(frozen=True)
class Voter:
    """What a voter knows when a request arrives."""

    name: str
    ballot: Ballot
    key: LogKey
    voters: frozenset[str]
    leader_alive: bool  # it follows (or is) a leader it considers alive
    leading: bool  # it is the partition's leader


@dataclass(frozen=True)
class Verdict:
    reply: VoteReply
    ballot: Ballot | None  # persist this before sending the reply (None: unchanged)
    step_down: bool  # the voter led an older epoch: it stops leading now


def judge_vote(me: Voter, req: VoteRequest) -> Verdict:
    ballot = me.ballot

    def answer(granted: bool, reason: str, new: Ballot | None = None, step_down: bool = False) -> Verdict:
        epoch = (new or ballot).epoch
        reply = VoteReply(req.topic, req.partition, epoch, me.name, granted, reason, req.pre)
        return Verdict(reply, new if new != ballot else None, step_down)

    if req.candidate not in me.voters or me.name not in me.voters:
        return answer(False, NOT_A_VOTER)
    if req.pre:
        if req.epoch <= ballot.epoch:
            return answer(False, STALE_EPOCH)
        if me.leader_alive and not req.transfer:
            return answer(False, LEADER_ALIVE)
        if not up_to_date(req.key, me.key):
            return answer(False, BEHIND)
        return answer(True, GRANTED)
    if req.epoch < ballot.epoch:
        return answer(False, STALE_EPOCH)
    new = ballot if req.epoch == ballot.epoch else Ballot(req.epoch, None)
    step_down = me.leading and req.epoch > ballot.epoch
    if new.voted_for not in (None, req.candidate):
        return answer(False, ALREADY_VOTED, new, step_down)
    if not up_to_date(req.key, me.key):
        return answer(False, BEHIND, new, step_down)
    return answer(True, GRANTED, Ballot(req.epoch, req.candidate), step_down)


# -- the candidate's count -----------------------------------------------------


@dataclass
class Tally:
    """Votes for one candidacy round; the candidate's own vote counts."""

    me: str
    voters: frozenset[str]
    epoch: int
    pre: bool = False
    granted: set[str] = field(default_factory=set)
    refused: set[str] = field(default_factory=set)
    newest_epoch: int = 0  # the highest epoch a voter answered with
    log_start: int = 0  # the largest log start offset a voter that granted its vote holds
    # Each voter's incarnation as the candidate recorded it (absent: none recorded, learned from its reply).
    known: Mapping[str, str] = field(default_factory=dict)
    learned: dict[str, str] = field(default_factory=dict)  # incarnations of granting voters not recorded
    lost_state: set[str] = field(default_factory=set)  # voters that answered from another incarnation
    unclean: bool = False  # an unclean election: votes from voters that lost their state count
    unclean_votes: set[str] = field(default_factory=set)  # such votes counted (only when ``unclean``)
    outranked: bool = False  # an unclean round: a voter holding its state is more up to date (it must win)

    def __post_init__(self) -> None:
        assert self.me in self.voters, (self.me, self.voters)
        self.granted.add(self.me)

    def add(self, reply: VoteReply) -> None:
        if reply.voter not in self.voters or reply.voter == self.me or reply.pre != self.pre:
            return
        self.newest_epoch = max(self.newest_epoch, reply.epoch)
        recorded = self.known.get(reply.voter)
        # Its state is gone: it says so (a blank replica's reply), or its incarnation is not the one recorded.
        other = reply.reason == LOST_STATE or bool(reply.incarnation and recorded is not None
                                                   and reply.incarnation != recorded)
        if other and not (self.unclean and reply.granted):
            # Its disk was lost or replaced: what it acknowledged and voted is gone, so is its vote.
            self.lost_state.add(reply.voter)
            self.granted.discard(reply.voter)
            self.refused.add(reply.voter)
            return
        if reply.granted and reply.epoch <= self.epoch:
            if other:  # an unclean election counts it (its new incarnation is recorded once it caught up)
                self.unclean_votes.add(reply.voter)
            elif reply.incarnation and recorded is None:
                self.learned[reply.voter] = reply.incarnation
            self.granted.add(reply.voter)
            self.refused.discard(reply.voter)
            self.log_start = max(self.log_start, reply.log_start)
        elif reply.voter not in self.granted:
            self.refused.add(reply.voter)
            self.outranked = self.outranked or self.unclean and reply.reason == BEHIND

    @property
    def won(self) -> bool:
        return len(self.granted) >= majority(len(self.voters)) and not self.outranked

    @property
    def lost(self) -> bool:
        """No majority is possible any more, a voter is in a newer epoch, or (unclean) one outranks it."""
        return self.newest_epoch > self.epoch or self.outranked \
            or len(self.refused) > len(self.voters) - majority(len(self.voters))


# -- when a leader is lost, who stands, when to hand back ------------------------


def leader_lost(leader: str | None, me: str, alive: bool, generation_changed: bool, claimed: bool,
                unclaimed_for_s: float, claim_grace_s: float) -> bool:
    """Whether a replica should consider its partition leaderless.

    ``alive``: gossip does not report the leader down. ``generation_changed``:
    the leader restarted since it was followed (a restarted broker leads
    nothing until elected again). ``claimed``: the leader's gossip says it
    leads this partition at our epoch or later; a leader that stopped
    claiming it (it stepped down, or closed the partition) is lost after
    ``claim_grace_s``, which also covers gossip lagging a new leader.
    """
    if leader is None:
        return True
    if leader == me:
        return False
    if not alive or generation_changed:
        return True
    return not claimed and unclaimed_for_s >= claim_grace_s


def candidate_order(replicas: Sequence[str], voters: Iterable[str]) -> list[str]:
    """Voters in preference order (the placement's order, then voters no longer placed)."""
    vs = set(voters)
    return [r for r in replicas if r in vs] + sorted(vs - set(replicas))


def stand_delay_s(me: str, replicas: Sequence[str], voters: Iterable[str], alive: Callable[[str], bool],
                  eligible: Callable[[str], bool], rank_step_s: float, fallback_s: float) -> float | None:
    """How long after losing its leader a replica waits before standing; None: it does not stand.

    The order is the preference list over live voters. Caught-up (eligible)
    replicas stand in that order, one ``rank_step_s`` apart; a replica that
    came back from an unclean shutdown and has not caught up stands only
    ``fallback_s`` later, when no caught-up replica could win (they may all be
    behind it: the voters refuse a candidate less up to date than themselves,
    and with no leader nobody can catch up).
    """
    order = [r for r in candidate_order(replicas, voters) if alive(r)]
    if me not in order:
        return None
    ready = [r for r in order if eligible(r)]
    if me in ready:
        return ready.index(me) * rank_step_s
    if len(set(voters)) == 1:
        return 0.0  # the only replica: nobody else could be more caught up
    return fallback_s + (len(ready) + order.index(me)) * rank_step_s


def transfer_target(me: str, replicas: Sequence[str], voters: Iterable[str], up: Callable[[str], bool],
                    eligible: Callable[[str], bool], acked_end: Callable[[str], int | None], hw: int,
                    led_for_s: float, min_lead_s: float) -> str | None:
    """The replica a leader should hand its partition to, or None to keep it.

    Normally the natural leader (the first voter of the preference list) once
    it is up, caught up (not recovering from an unclean shutdown) and holds
    everything committed (acked end >= hw); a leader no longer placed on this
    partition hands it to the first such voter that is. Not before the
    leader has led ``min_lead_s``, so leadership does not flap.
    """
    if led_for_s < min_lead_s:
        return None
    order = candidate_order(replicas, voters)
    if me in replicas:
        natural = next((r for r in order if r in replicas), None)
        targets = [natural] if natural is not None and natural != me else []
    else:
        targets = [r for r in order if r in replicas]
    for r in targets:
        end = acked_end(r)
        if up(r) and eligible(r) and end is not None and end >= hw:
            return r
    return None
