"""What a broker decides about each of its partition replicas on every election tick, synchronously.

``Watch`` keeps a few timers per replica and, given the broker's view of the
cluster (``View``: who is alive, who claims to lead what, who is still
catching up), decides on each ``tick``:

* for a follower: whether its leader is lost (``election.leader_lost``: down
  by gossip, or its replication link to us closed for ``LINK_LOSS_GRACE_MS``,
  which a killed or stopped leader's is within seconds; not while a live
  broker claims the partition at our epoch or later, since that leader's
  link will sync us), and when this replica's turn to stand
  has come (``election.stand_delay_s``, and only if a majority of its
  voters is alive): an ``Action("stand")``;
* for a leader: stepping down when a live broker claims the partition at a
  newer epoch, moving the voter set one step toward the preference list
  (``placement.next_voters``; a replica joins once it holds everything
  committed), and handing the partition over (``election.transfer_target``,
  or any caught-up voter when our copy is damaged or our clock is out of
  bounds): an ``Action("hand_off")``.

A broker whose clock is out of bounds (``View.clock_usable``) never stands
and is never a target of a hand-over; nor does a replica a repair cut back
below what it acknowledged (``Replica.vote_key``), until it holds that again,
nor one whose data directory lost its state (``Replica.blank``), until it has
caught up from a leader.

It changes replicas only through ``steps`` (adopting an epoch, saving voters)
and returns what to do: stand, hand over, or carry out a change
(``Action("changed")``: relink, wake waiters); ``ring.node.elections``
carries the actions out.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Iterable

from ring import limits
from ring.gossip import leaders
from ring.node import placement
from ring.node.members import View  # the cluster as gossip shows it at one moment
from ring.replication import election, state, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")

Key = tuple[str, int]


@dataclass
class Timers:
    """What the watch remembers about one replica between ticks (seconds on the broker's clock)."""

    leader: str | None = None  # the leader as last seen, to notice a change
    voted_at: float | None = None  # when we last granted a real vote
    generation: int | None = None  # that leader's generation then
    unclaimed_since: float | None = None
    leaderless_since: float | None = None
    stand_at: float | None = None  # when this replica's turn to stand comes, as the view was last seen
    next_try: float = 0.0
    retry_s: float = limits.ELECTION_RETRY_MS / 1000
    led_since: float = 0.0
    standing: bool = False
    handing: bool = False
    handoff_next: float = 0.0


@dataclass(frozen=True)
class Action:
    kind: str  # "stand", "hand_off" or "changed"
    rep: Replica
    target: str | None = None  # hand_off: to whom


@dataclass
class Settings:
    rank_step_s: float = limits.ELECTION_RANK_STEP_MS / 1000
    unclean_fallback_s: float = limits.ELECTION_UNCLEAN_FALLBACK_MS / 1000
    claim_grace_s: float = limits.LEADER_CLAIM_GRACE_MS / 1000
    min_lead_s: float = limits.HANDOFF_MIN_LEAD_MS / 1000
    handoff_retry_s: float = limits.HANDOFF_RETRY_MS / 1000
    retry_s: float = limits.ELECTION_RETRY_MS / 1000
    retry_max_s: float = limits.ELECTION_RETRY_MS_MAX / 1000


@dataclass
class Watch:
    name: str
    rng: random.Random
    settings: Settings = field(default_factory=Settings)
    timers: dict[Key, Timers] = field(default_factory=dict)
    # The broker is stopping (controlled shutdown): it hands every partition it leads to a caught-up
    # follower at once, and neither stands nor takes a partition over.
    stopping: bool = False
    # Stopping: the (partition, follower) hand-offs that did not happen (refused, or not caught up in
    # time): not tried again during this shutdown, so a stop ends once nothing more can move.
    refused: set[tuple[Key, str]] = field(default_factory=set)

    def timer(self, rep: Replica, now: float) -> Timers:
        key = (rep.topic, rep.index)
        t = self.timers.get(key)
        if t is None:
            t = self.timers[key] = Timers(led_since=now, retry_s=self.settings.retry_s)
        return t

    # --- the tick ----------------------------------------------------------------------------

    def tick(self, now: float, reps: Iterable[Replica], view: View, every: bool = True) -> list[Action]:
        """What to do about ``reps``; ``every``: they are all the broker holds (forget the others' timers)."""
        claims = view.claims()
        out: list[Action] = []
        held: set[Key] = set()
        for rep in reps:
            held.add((rep.topic, rep.index))
            t = self.timer(rep, now)
            if rep.is_leader:
                self._as_leader(rep, t, claims, view, now, out)
            else:
                self._as_follower(rep, t, claims, view, now, out)
        if every:
            for key in [k for k in self.timers if k not in held]:
                del self.timers[key]
        return out

    def steady(self, rep: Replica, now: float, view: View) -> bool:
        """Whether nothing about ``rep`` can change until the view or the replica does: a follower of a
        live, claiming leader that did not just vote, or the natural leader with its placed voters,
        its copy undamaged and its clock in bounds. A replica that is not steady waits on a timer (or
        on its followers' answers) and is looked at again then."""
        t = self.timers.get((rep.topic, rep.index))
        if t is None or t.standing or t.handing:
            return False
        if rep.is_leader:
            return (rep.voters == rep.replicas and rep.replicas[0] == self.name and rep.damaged_at is None
                    and view.clock_usable(self.name))
        voted = t.voted_at is not None and now - t.voted_at < self.settings.claim_grace_s
        return t.leaderless_since is None and t.unclaimed_since is None and not voted

    def eligible(self, rep: Replica, name: str, view: View) -> bool:
        if not view.clock_usable(name):
            return False
        if name == self.name:
            return rep.caught_up and rep.damaged_at is None
        return (rep.topic, rep.index) not in view.behind(name)

    def lost(self, rep: Replica, t: Timers, claims: dict[str, dict[Key, int]], view: View, now: float) -> bool:
        """Whether ``rep`` has no live leader (updating the timers that tell)."""
        if rep.leader != t.leader:
            t.leader, t.generation, t.unclaimed_since = rep.leader, view.generation(rep.leader), now
        key = (rep.topic, rep.index)
        claimed = rep.leader is not None and claims.get(rep.leader, {}).get(key, -1) >= rep.epoch
        if claimed:
            t.unclaimed_since = None
        elif t.unclaimed_since is None:
            t.unclaimed_since = now
        restarted = t.generation is not None and view.generation(rep.leader) != t.generation
        alive = rep.leader is not None and view.alive(rep.leader) and view.reachable(rep.leader)
        lost = election.leader_lost(rep.leader, self.name, alive,
                                    restarted, claimed, now - (t.unclaimed_since or now), self.settings.claim_grace_s)
        if lost:
            best = leaders.leader_from_claims(claims, key, view.alive)
            if best is not None and best[1] >= rep.epoch and best[0] not in (rep.leader, self.name):
                return False  # a newer leader exists: its link will sync us
        return lost

    def _as_follower(self, rep: Replica, t: Timers, claims: dict[str, dict[Key, int]], view: View, now: float,
                     out: list[Action]) -> None:
        if not self.lost(rep, t, claims, view, now):
            t.leaderless_since = None
            return
        if t.leaderless_since is None:
            t.leaderless_since = now
            if rep.leader is not None:
                log.info("%s/%d: leader %s of epoch %d is lost", rep.topic, rep.index, rep.leader, rep.epoch)
        s = self.settings
        delay = election.stand_delay_s(self.name, rep.replicas, rep.voters, view.alive,
                                       lambda n: self.eligible(rep, n, view), s.rank_step_s, s.unclean_fallback_s)
        t.stand_at = None if delay is None else t.leaderless_since + delay
        if t.standing or now < t.next_try or self.name not in rep.voters or not view.clock_usable(self.name):
            return  # (a broker whose clock is out of bounds never stands, not even as the last resort)
        if self.stopping:
            return  # it hands its partitions over: it takes none
        if t.voted_at is not None and now - t.voted_at < self.settings.claim_grace_s:
            return  # we just voted: give that candidate time to win and sync us
        if rep.key < rep.vote_key:
            return  # cut below what we acknowledged (repair): our own vote would refuse us, even as last resort
        if rep.blank:
            return  # our state was lost: we may lack what was acknowledged, and nobody would count our vote
        if t.stand_at is None or now < t.stand_at:
            return
        if sum(1 for v in rep.voters if view.alive(v)) < election.majority(len(rep.voters)):
            return  # no majority can answer: no election (committed reads still work)
        t.standing = True
        out.append(Action("stand", rep))

    def _as_leader(self, rep: Replica, t: Timers, claims: dict[str, dict[Key, int]], view: View, now: float,
                   out: list[Action]) -> None:
        if t.leader != self.name:
            t.leader, t.led_since, t.leaderless_since = self.name, now, None
        best = leaders.leader_from_claims(claims, (rep.topic, rep.index), view.alive)
        if best is not None and best[1] > rep.epoch:
            steps.adopt_epoch(rep, best[1])
            out.append(Action("changed", rep))
            return
        settled = rep.voters == rep.replicas  # the voter set is the preference list: no step
        filled_to = max(rep.hw, rep.epoch_start)
        # One step at a time, and only once a majority holds the current set (the step before is committed).
        voters = rep.voters if settled or not rep.voters_committed() else placement.next_voters(
            rep.voters, rep.replicas, self.name, lambda r: view.alive(r) and rep.follower_ends.get(r, -1) >= filled_to)
        if voters != rep.voters:
            log.info("%s/%d: voters %s -> %s", rep.topic, rep.index, ",".join(rep.voters), ",".join(voters))
            rep.set_voters(voters)
            state.save_state(rep)
            out.append(Action("changed", rep, target="voters"))
        if t.handing or (now < t.handoff_next and not self.stopping) or not rep.voters_committed():
            return  # (a successor needs a majority of the voters to know them: hand over once it does)
        must_go = rep.damaged_at is not None or not view.clock_usable(self.name)
        if settled and rep.replicas[0] == self.name and not must_go and not self.stopping:
            return  # the natural leader, placed, undamaged, its clock in bounds: nobody to hand over to
        target = self.stopping_target(rep, view) if self.stopping and not must_go else \
            self._handoff_target(rep, t, view, now, must_go)
        if target is not None:
            t.handing = True
            out.append(Action("hand_off", rep, target))

    def stopping_target(self, rep: Replica, view: View) -> str | None:
        """Stopping: the first voter in preference order that is up, eligible and holds everything
        committed (the hand-off then waits, appends frozen, until it holds the whole log)."""
        committed, key = max(rep.hw, rep.epoch_start), (rep.topic, rep.index)
        return next((r for r in election.candidate_order(rep.replicas, rep.voters)
                     if r != self.name and (key, r) not in self.refused and view.up(r) and self.eligible(rep, r, view)
                     and (rep.follower_ends.get(r) or 0) >= committed), None)

    def _handoff_target(self, rep: Replica, t: Timers, view: View, now: float, must_go: bool) -> str | None:
        acked = rep.follower_ends.get
        if must_go:  # our copy is damaged, or our clock is out of bounds: any caught-up voter will do
            return next((r for r in election.candidate_order(rep.replicas, rep.voters)
                         if r != self.name and view.up(r) and self.eligible(rep, r, view)
                         and (acked(r) or 0) >= rep.log.end_offset), None)
        return election.transfer_target(self.name, rep.replicas, rep.voters, view.up,
                                        lambda n: self.eligible(rep, n, view), acked, max(rep.hw, rep.epoch_start),
                                        now - t.led_since, self.settings.min_lead_s)

    def wake_at(self, rep: Replica, now: float) -> float | None:
        """The next moment a decision about ``rep`` could change while the view and the replica stay as
        they are: when one of its timers runs out (None: none runs)."""
        t = self.timers.get((rep.topic, rep.index))
        if t is None:
            return now
        s = self.settings
        times = [t.voted_at + s.claim_grace_s if t.voted_at is not None else None]
        if rep.is_leader:
            times += [t.handoff_next, t.led_since + s.min_lead_s]
        else:
            times.append(t.unclaimed_since + s.claim_grace_s if t.unclaimed_since is not None else None)
            if t.leaderless_since is not None:
                times += [t.next_try, t.stand_at]
        future = [x for x in times if x is not None and x > now]
        return min(future) if future else None

    # --- what the driver reports back --------------------------------------------------------

    def stood(self, rep: Replica, won: bool, now: float) -> None:
        """A candidacy of ``rep`` ended."""
        t = self.timer(rep, now)
        t.standing = False
        if won:
            t.leader, t.led_since = self.name, now
            t.retry_s = self.settings.retry_s
        else:
            t.next_try = now + t.retry_s * (0.5 + self.rng.random())
            t.retry_s = min(t.retry_s * 2, self.settings.retry_max_s)

    def deferred(self, rep: Replica, now: float) -> None:
        """``rep``'s turn to stand came while the broker ran as many candidacies as it may: it stands
        on a later tick, without a retry's back-off."""
        self.timer(rep, now).standing = False

    def handed(self, rep: Replica, now: float) -> None:
        """A handover of ``rep`` ended (done or not)."""
        t = self.timer(rep, now)
        t.handing = False
        t.handoff_next = now + self.settings.handoff_retry_s

    def voter_view(self, rep: Replica, view: View, now: float) -> bool:
        """Whether ``rep`` still follows (or is) a live leader, or just voted for a candidate that may
        have won: what a pre-vote respects."""
        t = self.timer(rep, now)
        if t.voted_at is not None and now - t.voted_at < self.settings.claim_grace_s:
            return True
        return rep.is_leader or not self.lost(rep, t, view.claims(), view, now)

    def voted(self, rep: Replica, granted_real_vote: bool, now: float) -> None:
        """We granted a real vote: give that candidate time to win (and sync us) before standing ourselves,
        and refuse pre-votes meanwhile."""
        if granted_real_vote:
            t = self.timer(rep, now)
            t.leaderless_since, t.voted_at = now, now

    def may_take_over(self, rep: Replica, sender: str, epoch: int, now: float) -> bool:
        """``sender``, leading ``epoch``, asks us to take the partition over: stand at once if we can (not
        while our own copy is damaged or cut back for repair: the sender's count of our log is older)."""
        t = self.timer(rep, now)
        if rep.leader != sender or rep.epoch != epoch or not rep.aligned or not rep.caught_up or t.standing \
                or rep.damaged_at is not None or self.stopping:
            return False
        t.standing = True
        return True
