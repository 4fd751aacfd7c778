"""Candidacies and hand-offs of one broker's partition replicas, and its side of other brokers' votes.

``Elections`` runs ``Watch`` (``ring.node.watch``: what to do about each
replica on a tick, from the broker's view of the cluster) and carries its
actions through as message exchanges, without waiting on anything:

* stand: a pre-vote round for epoch+1, then a real one, each a
  ``VoteRequest`` to every other live voter, counted as answers are stepped
  (``answered``) and given up after ``VOTE_REQUEST_TIMEOUT_S``; at most
  ``CANDIDACIES_MAX`` at once (the replicas whose turn comes beyond that
  wait in ``deferred``, in order, and stand as candidacies end, each looked
  at again then: not on every tick meanwhile). A majority
  makes the replica leader (``steps.win``): its links sync the followers and
  its claim is announced to every peer at once;
* hand over: stop appending (``frozen``), wait until the target holds the
  whole log (checked on every answer from it and every tick), send it a
  ``Transfer`` (stand now, skipping the pre-vote), and wait until this
  replica is deposed; after ``HANDOFF_CATCHUP_MS`` without catching up, or
  ``2 * VOTE_REQUEST_TIMEOUT_S`` after the transfer, go on leading;
* the voter's side: ``vote_asked`` judges a vote (the ballot is saved before
  the answer is returned), ``transfer_asked`` starts a candidacy for a
  leader that asks us to take over.

Messages leave through ``send`` (the core's Ready), changes through
``changed``; ``won`` and ``lost`` count the candidacies that ran a real
round.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

from ring import limits
from ring.node.watch import Action, View, Watch
from ring.replication import election, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")

Key = tuple[str, int]
VOTE_TIMEOUT_S = limits.VOTE_REQUEST_TIMEOUT_S


class Transfer(NamedTuple):
    """To the replica a leader hands ``topic``/``partition`` over to: stand now (the leader of ``epoch`` asks)."""
    topic: str
    partition: int
    epoch: int


@dataclass
class Candidacy:
    rep: Replica
    req: election.VoteRequest
    tally: election.Tally
    deadline: float
    waiting: set[str] = field(default_factory=set)  # voters asked and not answered yet


@dataclass
class Handoff:
    rep: Replica
    target: str
    epoch: int
    deadline: float
    sent: bool = False


class Elections:
    def __init__(self, name: str, rng: random.Random, replica: Callable[[str, int], Replica | None],
                 send: Callable[[str, object], None], changed: Callable[[Replica], None],
                 resync: Callable[[Replica], None], announce: Callable[[], None],
                 look: Callable[[Key], None] = lambda key: None) -> None:
        """``look``: have the next tick look at a replica (one that left ``deferred`` without standing)."""
        self.name = name
        self.watch = Watch(name, rng)
        self.replica = replica
        self.send = send
        self.changed = changed
        self.resync = resync
        self.announce = announce
        self.look = look
        self.candidacies: dict[Key, Candidacy] = {}
        self.deferred: dict[Key, Replica] = {}  # whose turn to stand came at the limit, in order
        self._filling = False
        self.handoffs: dict[Key, Handoff] = {}
        self.counts = {"won": 0, "lost": 0}
        self.incarnation = ""  # this broker's data directory's (``NodeCore``'s): a vote answered without a replica

    # --- the tick --------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A candidacy or a hand-off runs (it has deadlines: tick often)."""
        return bool(self.candidacies or self.handoffs or self.deferred)

    def tick(self, now: float, reps: Iterable[Replica], view: View, every: bool = True) -> None:
        for action in self.watch.tick(now, reps, view, every):
            self._act(now, action, view)
        for key in [k for k, c in self.candidacies.items() if now >= c.deadline]:
            if key in self.candidacies:
                self._end(key, now, False, view)
        for key in list(self.handoffs):
            self.progress(key, now)

    def _act(self, now: float, action: Action, view: View) -> None:
        rep = action.rep
        if action.kind == "stand":
            key = (rep.topic, rep.index)
            if len(self.candidacies) < limits.CANDIDACIES_MAX:
                self.deferred.pop(key, None)
                self.stand(now, rep, view)
            else:
                self.deferred[key] = rep  # (one already waiting keeps its place)
                self.watch.deferred(rep, now)
        elif action.kind == "hand_off":
            assert action.target is not None
            rep.frozen = True
            log.info("%s/%d: handing leadership of epoch %d over to %s", rep.topic, rep.index, rep.epoch,
                     action.target)
            self.handoffs[(rep.topic, rep.index)] = Handoff(
                rep, action.target, rep.epoch, now + limits.HANDOFF_CATCHUP_MS / 1000)
        else:
            self.changed(rep)
            if action.target == "voters":
                self.resync(rep)

    def _fill(self, now: float, view: View) -> None:
        """Candidacies ended: the replicas waiting in ``deferred`` stand in their place, in order, each
        if its turn still stands now (one that no longer stands is looked at on the next tick)."""
        if self._filling:
            return  # (a candidacy that ends as it starts: the loop below goes on)
        self._filling = True
        try:
            while self.deferred and len(self.candidacies) < limits.CANDIDACIES_MAX:
                key = next(iter(self.deferred))
                rep = self.deferred.pop(key)
                if self.replica(*key) is not rep:
                    continue
                actions = self.watch.tick(now, [rep], view, every=False)
                if not actions:
                    self.look(key)
                for action in actions:
                    self._act(now, action, view)
        finally:
            self._filling = False

    # --- standing for election ---------------------------------------------------------------

    def stand(self, now: float, rep: Replica, view: View, transfer: bool = False) -> None:
        """A pre-vote round (a real one at once for a transfer)."""
        key = (rep.topic, rep.index)
        if self.name not in rep.voters or key in self.candidacies:
            self.watch.stood(rep, False, now)
            return
        self._round(now, rep, view, pre=not transfer, transfer=transfer)

    def _round(self, now: float, rep: Replica, view: View, pre: bool, transfer: bool = False) -> None:
        key, voters = (rep.topic, rep.index), frozenset(rep.voters)
        req = steps.vote_request(rep, pre=pre, transfer=transfer)
        if not pre:
            self.changed(rep)
        tally = election.Tally(self.name, voters, req.epoch, req.pre, known=dict(rep.incarnations),
                               unclean=req.unclean)
        c = self.candidacies[key] = Candidacy(rep, req, tally, now + VOTE_TIMEOUT_S)
        for v in sorted(voters - {self.name}):
            if view.alive(v):
                c.waiting.add(v)
                self.send(v, req)
        self._count(key, now, view)

    def answered(self, now: float, peer: str, req: election.VoteRequest, reply: election.VoteReply | None,
                 view: View) -> None:
        """A voter's answer to ``req`` (None: none came)."""
        key = (req.topic, req.partition)
        c = self.candidacies.get(key)
        if c is None or c.req != req:
            return  # a late answer to a round that ended
        c.waiting.discard(peer)
        if reply is not None and (reply.topic, reply.partition) == key:
            c.tally.add(reply)
        self._count(key, now, view)

    def _count(self, key: Key, now: float, view: View) -> None:
        c = self.candidacies[key]
        rep, tally = c.rep, c.tally
        if self.replica(*key) is not rep:
            self._end(key, now, False, view)
        elif tally.newest_epoch > rep.epoch:
            steps.adopt_epoch(rep, tally.newest_epoch)
            self.changed(rep)
            self._end(key, now, False, view)
        elif tally.won and c.req.pre:
            if self.name not in rep.voters:  # a sync moved the voter set meanwhile, without us
                self._end(key, now, False, view)
                return
            del self.candidacies[key]
            self._round(now, rep, view, pre=False)  # the real round (the pre-vote passed)
        elif tally.won:
            won = steps.win(rep, c.req.epoch, tally.log_start, tally.learned, frozenset(tally.unclean_votes))
            if won:
                self.changed(rep)
                self.resync(rep)
                self.announce()
            self._end(key, now, won, view)
        elif tally.lost or not c.waiting:
            self._end(key, now, False, view)

    def _end(self, key: Key, now: float, won: bool, view: View) -> None:
        c = self.candidacies.pop(key)
        lost_state = frozenset(c.tally.lost_state)
        # (a round that found none, with voters not answering, keeps what the last whole one found)
        if not won and (lost_state or not c.waiting) and lost_state != c.rep.lost_state \
                and self.replica(*key) is c.rep:
            if lost_state:  # (logged when it changes, not on every round)
                log.error("%s/%d: no eligible leader: %s lost their state, and without them no majority of "
                          "voters holding what was acknowledged is alive; waiting for one of them to return",
                          c.rep.topic, c.rep.index, ",".join(sorted(lost_state)))
            steps.no_eligible_leader(c.rep, lost_state)
            self.changed(c.rep)
        self.watch.stood(c.rep, won, now)
        if not c.req.pre:
            self.counts["won" if won else "lost"] += 1
        self._fill(now, view)

    # --- handing a partition over -------------------------------------------------------------

    def progress(self, key: Key, now: float) -> None:
        """Where a hand-off stands: send the transfer once the target caught up; end it when done or late."""
        h = self.handoffs.get(key)
        if h is None:
            return
        rep = h.rep
        done = not rep.is_leader or rep.epoch != h.epoch or self.replica(*key) is not rep
        if not done and not h.sent and rep.follower_ends.get(h.target, -1) >= rep.log.end_offset:
            self.send(h.target, Transfer(rep.topic, rep.index, h.epoch))
            h.sent, h.deadline = True, now + 2 * VOTE_TIMEOUT_S
        elif not done and now >= h.deadline:
            if not h.sent:
                log.info("%s/%d: %s did not catch up in time; keeping the lead", rep.topic, rep.index, h.target)
            done = True
        if done:
            self._handed(key, now)

    def transfer_answered(self, now: float, key: Key, epoch: int, started: bool) -> None:
        h = self.handoffs.get(key)
        if h is not None and h.epoch == epoch and not started:
            self._handed(key, now)  # the target would not stand: go on leading

    def _handed(self, key: Key, now: float) -> None:
        h = self.handoffs.pop(key)
        if h.rep.is_leader:
            h.rep.frozen = False
            if self.watch.stopping:
                self.watch.refused.add((key, h.target))  # did not happen: try another follower, or none
        self.watch.handed(h.rep, now)
        self.changed(h.rep)  # produces waiting for the hand-off go on, here or at the new leader

    # --- the voter's side -----------------------------------------------------------------------

    def vote_asked(self, now: float, req: election.VoteRequest, view: View) -> election.VoteReply:
        rep = self.replica(req.topic, req.partition)
        if rep is None or rep.deleted:
            # (with this directory's incarnation: a candidate that recorded another one for us names us
            # as having lost our state, ``election.Tally``; one that recorded none just counts a refusal)
            return election.VoteReply(req.topic, req.partition, 0, self.name, False, election.NOT_A_VOTER, req.pre,
                                      incarnation=self.incarnation)
        before = (rep.leader, rep.epoch)
        reply = steps.on_vote_request(rep, req, self.watch.voter_view(rep, view, now))
        self.watch.voted(rep, reply.granted and not req.pre, now)
        if (rep.leader, rep.epoch) != before:
            self.changed(rep)
        return reply

    def transfer_asked(self, now: float, sender: str, t: Transfer, view: View) -> bool:
        """``sender``, leading ``t.epoch``, asks us to take the partition over: stand at once if we can."""
        rep = self.replica(t.topic, t.partition)
        if rep is None or not view.clock_usable(self.name) or \
                not self.watch.may_take_over(rep, sender, t.epoch, now):
            return False
        self.stand(now, rep, view, transfer=True)
        return True
