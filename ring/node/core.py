"""The node core: everything one broker decides between the pure protocol cores, as one state machine.

Theory of operation. The pure cores decide single questions: ``protocol``
(a follower's verdict on a frame, the high watermark, the leader's send
cursor), ``steps`` (what a replica does with one frame or vote),
``election`` (votes, tallies, who stands when), ``watch`` (what a broker
decides about each replica on a tick). ``NodeCore`` holds what sits between
them on one broker: the leader's replication links and their scheduling
(``links.py``), the follower's answers and the durability each one waits
for (``follower_steps.py``), the produces waiting for acknowledgements with
their deadlines (``waiters.py``), candidacies and hand-offs
(``elections.py``), where a produce goes and whether this broker may take
it (``route_steps.py``), and the membership rules over gossip
(``members.py``, stepped by ``gossip_steps.py``). Elections look at every
replica only when the view they decide on changed (``Members.signature``:
a peer's status, generation or clock); otherwise only at the replicas whose
state changed, whose entries in peers' claims or behind-sets changed
(``Members.moved``), and those waiting on a timer, at the moment it runs
out, so an idle broker with thousands of partitions ticks about once a
gossip round.

A driver feeds it messages (``ready.py``) with ``step(now, message)``, ticks
it with ``tick(now, wall_ms)`` no later than the ``next_tick_at`` of the
last Ready, and carries out each Ready through ``executor.py``, in the
order ``ready.py`` writes down: persist, then send and release. The core reads and writes the logs
and replica state files itself (the real, synchronous log code), and never
awaits, opens a socket or reads a clock; it draws random numbers only from
the seeded source it is given: the same inputs give the same outputs, which is what lets the simulation (tests/sim) run it
under a seeded network, disk and clock.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Callable, Iterable

from ring import limits
from ring.errors import RingError
from ring.gossip import leaders
from ring.gossip.core import GOSSIP_INTERVAL_S
from ring.node import ready as msg
from ring.node.elections import Elections
from ring.node.follower_steps import FollowerSteps
from ring.node.gossip_steps import GossipSteps
from ring.node.links import Key, Links
from ring.node.members import Members, View
from ring.node.ready import Ready
from ring.node.route_steps import LINK_LOSS_GRACE_S, RouteSteps
from ring.node.waiters import AckWaiters
from ring.replication import state, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.node")

ELECTION_TICK_S = limits.ELECTION_TICK_MS / 1000
CLAIM_GRACE_S = limits.LEADER_CLAIM_GRACE_MS / 1000
UNPLACED_VOTER_GRACE_S = limits.UNPLACED_VOTER_GRACE_MS / 1000


class NodeCore(GossipSteps, FollowerSteps, RouteSteps):
    def __init__(self, name: str, replica: Callable[[str, int], Replica | None],
                 replicas: Callable[[], Iterable[Replica]], durable_at_once: bool, rng: random.Random,
                 members: Members, incarnation: str = "") -> None:
        """``replica`` and ``replicas`` look up the broker's open replicas; ``durable_at_once``: the fsync
        policy makes an append durable without an fsync of its own (``interval`` or ``never``); ``rng``
        is the seeded random source; ``members`` the membership rules over gossip (``members.py``);
        ``incarnation`` the broker's data directory's (what it answers a vote for a partition it does not hold with)."""
        self.name = name
        self.replica = replica
        self.replicas = replicas
        self.durable_at_once = durable_at_once
        self.members = members
        self.links = Links(name, replica)
        self.acks = AckWaiters()
        self.elections = Elections(name, rng, replica, self._send, self._changed, self._resync_rep, self._announce,
                                   self._look_soon)
        self.elections.incarnation = incarnation
        self._next_election_tick = 0.0
        self._next_gossip = 0.0
        # Elections look at every replica only when the view changed (``Members.signature``); else at
        # the ones whose state changed since (``_dirty``), whose claims moved (``Members.moved``) and
        # the ones waiting on a timer (``_active``).
        self._signature: tuple | None = None
        self._dirty: set[Key] = set()
        self._active: set[Key] = set()
        self._publish_due = True  # our claims or behind-set may have changed
        self._relink: set[Key] = set()  # partitions whose leadership changed: their links follow at the step's end
        # Replication links from leaders into this broker: how many are open, and since when none is.
        self._inbound: dict[str, int] = {}
        self._inbound_down: dict[str, float] = {}
        self._view: View | None = None
        # Replicas placed elsewhere that still vote here, and since when a newer leader that does not
        # replicate to us claims them (after UNPLACED_VOTER_GRACE_S they close: that leader's voters leave
        # us out).
        self._superseded: dict[Key, float] = {}
        self.closing = False
        self._now = 0.0  # of the step or tick running
        self._ready = Ready()
        # Replica state files (ballots, epochs, voters) go in the Ready of the step that changed them
        # once whoever steps the core carries every Ready out (its pump sets this): ``defer_state``.
        self.carries_writes = False
        self._stepping = False
        self._states: dict[Replica, None] = {}
        self.load_extra: dict[str, Any] = {}  # the host's part of this broker's gossiped load (its ranges)
        self._handlers: dict[type, Callable[[float, Any], None]] = {
            msg.Appended: self._appended, msg.AwaitAcks: self._await_acks,
            msg.AwaitStart: self._await_start, msg.Durable: self._durable,
            msg.SyncFailed: self._sync_failed, msg.LinkUp: self._link_up, msg.LinkDown: self._link_down,
            msg.FromFollower: self._from_follower, msg.Flush: self._flush,
            msg.PlacementChanged: self._placement_changed, msg.Resync: self._resync, msg.Reprobe: self._reprobe,
            msg.UncleanElection: self._unclean_election,
            msg.FromLeader: self._from_leader,
            msg.VoteRequested: self._vote_requested, msg.VoteAnswered: self._vote_answered,
            msg.TransferRequested: self._transfer_requested, msg.TransferAnswered: self._transfer_answered,
            msg.GossipIn: self._gossip_in, msg.Announce: self._announce_msg, msg.PutTopic: self._put_topic,
            msg.DeleteTopic: self._delete_topic, msg.RemoveBroker: self._remove_broker, msg.HandOver: self._hand_over,
            msg.Damaged: self._damaged, msg.Repaired: self._repaired, msg.StartMoved: self._start_moved,
            msg.LeadStart: self._lead_start, msg.ClockRead: self._clock_read, msg.LeaderLink: self._leader_link,
        }

    # --- the two entry points ---------------------------------------------------------------

    def step(self, now: float, message: Any) -> Ready:
        self._now, self._view = now, None
        self._stepping = True
        try:
            self._handlers[type(message)](now, message)
            return self._take()
        finally:
            self._stepping = False

    def tick(self, now: float, wall_ms: int | None = None) -> Ready:
        """``wall_ms``: the wall clock read together with ``now`` (a clock set meanwhile stops this
        broker's leading in this very tick)."""
        self._now, self._view = now, None
        self._stepping = True
        try:
            if wall_ms is not None:
                self._observe_clock(now, wall_ms)
            self.links.due(now)
            self.acks.expire(now)
            if now >= self._next_gossip:
                self._next_gossip = now + GOSSIP_INTERVAL_S
                self._gossip_round(now)
            if now >= self._next_election_tick:
                self._election_tick(now)
            return self._take()
        finally:
            self._stepping = False

    def _election_tick(self, now: float) -> None:
        view = self.view()
        signature = (self.members.signature(now), self._unreachable(now))
        every = signature != self._signature
        moved = self.members.moved()  # (taken even on a full look: they are looked at)
        if every:
            self._signature = signature
            reps = list(self.replicas())
        else:  # (the replicas waiting for a candidacy to end are looked at as one does: ``Elections._fill``)
            keys = (self._active - self.elections.deferred.keys()) | self._dirty | moved
            reps = [r for k in sorted(keys) if (r := self.replica(*k)) is not None]
        self._dirty = set()
        self.elections.tick(now, reps, view, every)
        watch = self.elections.watch
        active = [r for r in reps if not watch.steady(r, now, view)]
        self._active = {(r.topic, r.index) for r in active}
        wakes = self._check_unplaced(now, reps, view)
        if self._publish_due:
            self._publish_due = False
            self.members.publish(self.replicas())
        if self._dirty or self.elections.busy:
            self._next_election_tick = now + ELECTION_TICK_S
            return
        # Look again when a timer runs out, or a silent peer's status could change; an active replica
        # waiting on neither (a leader moving its voters, as answers come) is looked at when they come.
        at = self.members.next_change(now) or now + GOSSIP_INTERVAL_S
        downs = [*self._inbound_down.values(),
                 *(link.down_since for link in self.links.links.values() if link.down_since is not None)]
        for since in downs:
            if now < since + LINK_LOSS_GRACE_S < at:
                at = since + LINK_LOSS_GRACE_S
        for rep in active:
            wake = watch.wake_at(rep, now)
            if wake is not None and wake < at:
                at = wake
        at = min(at, *wakes) if wakes else at
        self._next_election_tick = max(at, now + ELECTION_TICK_S / 10)

    def keep(self, rep: Replica, now: float) -> bool:
        """Whether ``rep``, placed elsewhere, stays open here: while it leads (it hands over first), and
        while it counts itself a voter (closing would take a vote from its leader's elections) until a
        leader we do not follow, in our epoch or a newer one, has claimed it for CLAIM_GRACE_S (one
        whose voters count us replicates to us) for UNPLACED_VOTER_GRACE_S."""
        if rep.is_leader:
            return True
        since = self._superseded.get((rep.topic, rep.index))
        return self.name in rep.voters and (since is None or now < since + UNPLACED_VOTER_GRACE_S)

    def _check_unplaced(self, now: float, reps: list[Replica], view: View) -> list[float]:
        """Track the replicas placed elsewhere that still vote here (they stay looked at); returns
        when a newer claim's grace runs out."""
        wakes = []
        for key in [k for k in self._superseded if self.replica(*k) is None]:
            del self._superseded[key]  # closed
        for rep in reps:
            key = (rep.topic, rep.index)
            if self.name in rep.replicas or rep.is_leader or self.name not in rep.voters:
                self._superseded.pop(key, None)
                continue
            best = leaders.leader_from_claims(view.claims(), key, view.alive)
            if best is None or best[1] < rep.epoch or (best[1] == rep.epoch and rep.leader == best[0]):
                self._superseded.pop(key, None)  # nobody leads, or our leader does (and syncs our voters)
            else:
                since = self._superseded.setdefault(key, now)
                if now >= since + UNPLACED_VOTER_GRACE_S:
                    self._ready.reconcile = True
                else:
                    wakes.append(since + UNPLACED_VOTER_GRACE_S)
            self._active.add(key)
        return wakes

    def _hand_over(self, now: float, m: msg.HandOver) -> None:
        """Controlled shutdown: every partition led here moves to a caught-up follower (the election
        tick starts the hand-offs, looking at once)."""
        self.elections.watch.stopping = True
        self.members.set_extra("stopping", True)  # peers hand nothing to us (``View.up``) from now on
        self._announce()
        led = [(r.topic, r.index) for r in self.replicas() if r.is_leader]
        log.info("%s is stopping: handing %d partitions over", self.name, len(led))
        for key in led:
            self._look_soon(key)
        self._election_tick(now)

    def handing_over(self, now: float) -> list[Replica]:
        """Stopping: the partitions still led here that are being handed over or that a follower could
        take now (none: nothing more will move, the broker may stop)."""
        view = self.members.view(now, self._unreachable(now))
        watch, handoffs = self.elections.watch, self.elections.handoffs
        return [r for r in self.replicas() if r.is_leader and len(r.voters) > 1 and (
            (r.topic, r.index) in handoffs or watch.stopping_target(r, view) is not None)]

    def _look_soon(self, key: Key | None = None) -> None:
        """Have the next election tick come within ELECTION_TICK_MS (and look at ``key`` then)."""
        if key is not None:
            self._dirty.add(key)
        self._next_election_tick = min(self._next_election_tick, self._now + ELECTION_TICK_S)

    def _view_moved(self, now: float) -> None:
        """Gossip brought news, the detector ticked or a leader's link came or went: if what elections
        decide on changed, look now (at every replica, or at the partitions whose claims moved)."""
        if (self.members.signature(now), self._unreachable(now)) != self._signature or self.members.moving():
            self._election_tick(now)

    def view(self) -> View:
        """The cluster as gossip (and the leaders' links to us) show it now (one per step: nothing changes
        within one)."""
        if self._view is None:
            self._view = self.members.view(self._now, self._unreachable(self._now))
        return self._view

    def _unreachable(self, now: float) -> frozenset[str]:
        """Brokers whose replication link to us (as our leader) has been closed for LINK_LOSS_GRACE_MS,
        or, when they have none open to us, ours to them (as their leader)."""
        closed = {n for n, since in self._inbound_down.items() if now - since >= LINK_LOSS_GRACE_S}
        for name, link in self.links.links.items():
            if not link.reaches(now, LINK_LOSS_GRACE_S) and self._inbound.get(name, 0) == 0:
                closed.add(name)
        return frozenset(closed)

    def _leader_link(self, now: float, m: msg.LeaderLink) -> None:
        n = self._inbound.get(m.leader, 0) + (1 if m.up else -1)
        self._inbound[m.leader] = max(0, n)
        if n > 0 or m.retired:  # a link its leader closed on purpose does not make the leader unreachable
            self._inbound_down.pop(m.leader, None)
        else:
            self._inbound_down.setdefault(m.leader, now)
        self._view_moved(now)
        if n <= 0 and not m.retired:  # look again once the grace has passed
            self._next_election_tick = min(self._next_election_tick, now + LINK_LOSS_GRACE_S)

    def _take(self) -> Ready:
        self._view = None
        if self._relink:
            self._relink_changed()
        ready, self._ready = self._ready, Ready()
        if self.acks.released:
            ready.releases, self.acks.released = self.acks.released, []
        if self.links.damaged:
            damaged, self.links.damaged = self.links.damaged, []
            for rep, offset in damaged:
                self._damage(rep, offset, ready)
        if self.links.dirty:
            ready.flush = self.links.pending()
        at = self._next_gossip
        if self._next_election_tick < at:
            at = self._next_election_tick
        deadline = self.acks.next_deadline()
        if deadline is not None and deadline < at:
            at = deadline
        probe = self.links.next_probe() if self.links.links else None
        ready.next_tick_at = probe if probe is not None and probe < at else at
        if self._states:
            for rep in self._states:
                path, data = state.state_file(rep)
                ready.add("write", (os.path.abspath(path), data))  # (a data directory may be relative)
            self._states = {}
        return ready

    def defer_state(self, rep: Replica) -> bool:
        """Whether ``rep``'s state file goes in this step's Ready (``ring.replication.state.save_state``):
        while the core steps, once its Readys are carried out (``carries_writes``); the file is written
        once per step, as the step left the replica."""
        if not (self._stepping and self.carries_writes):
            return False
        self._states[rep] = None
        return True

    # --- registering replicas ---------------------------------------------------------------

    def adopt(self, rep: Replica) -> None:
        """A replica opened on this broker: its acknowledgements and high watermark run through the core."""
        rep.acks = self.acks
        rep.on_hw = self._hw_moved
        rep.state_writes = self

    def _hw_moved(self, rep: Replica) -> None:
        if rep.is_leader:
            self.links.notify(rep)

    def _send(self, dst: str, message: object) -> None:
        self._ready.add("sends", (dst, message))

    def _announce(self) -> None:
        self._ready.announce = True

    def _resync_rep(self, rep: Replica) -> None:
        self.links.resync(rep, self._now)

    def _changed(self, rep: Replica) -> None:
        """Who leads ``rep`` (or its epoch, or its voters) changed here: links follow, drivers hear of it."""
        if rep not in self._ready.changed:
            self._ready.add("changed", rep)
        self._publish_due = True
        self._look_soon((rep.topic, rep.index))
        if self.name not in rep.replicas and not self.keep(rep, self._now):
            self._ready.reconcile = True  # placed elsewhere, neither led nor voting here: close it
        self._relink.add((rep.topic, rep.index))  # (in _take: a burst of won elections is one update of the links)
        self._start_behind(rep)

    def _start_behind(self, rep: Replica) -> None:
        """A leader told of a later log start by its voters or followers (a move missed while following)
        moves up to it once no fsync runs on its log, reading nothing below it meanwhile (``serves_from``)."""
        if rep.is_leader and min(rep.peer_start, rep.hw) > rep.log.start_offset:
            self._ready.add("after_idle", (rep, msg.LeadStart(rep)))

    def _assign_links(self) -> None:
        """Every partition's links, from a pass over all replicas (replicas came or went)."""
        self._relink = set()
        wanted: dict[str, set[Key]] = {}
        for rep in self.replicas():
            if rep.is_leader:
                for f in rep.linked():
                    if f != self.name:
                        wanted.setdefault(f, set()).add((rep.topic, rep.index))
        if self.links.assign(wanted, self._now):
            self._ready.links = set(wanted)

    def _relink_changed(self) -> None:
        """The links of the partitions whose leadership (or voters) changed in this step, only."""
        keys, self._relink = self._relink, set()
        followers: dict[Key, list[str]] = {}
        for key in keys:
            rep = self.replica(*key)
            followers[key] = [f for f in rep.linked() if f != self.name] if rep is not None and rep.is_leader else []
        if self.links.reassign(followers, self._now):
            self._ready.links = set(self.links.links)

    # --- the leader's side ------------------------------------------------------------------

    def _appended(self, now: float, m: msg.Appended) -> None:
        self.links.notify(m.rep)
        if m.durable is not None:
            m.rep.set_durable(m.durable)

    def _await_acks(self, now: float, m: msg.AwaitAcks) -> None:
        rep = m.rep
        if not rep.is_leader or rep.deleted:
            self.acks.released.append((m.token, steps.stepped_down(rep, rep.epoch)))
            return
        self.acks.add(rep, m.token, m.end, m.level, now + m.timeout_s)

    def _await_start(self, now: float, m: msg.AwaitStart) -> None:
        rep = m.rep
        if not rep.is_leader or rep.deleted:
            self.acks.released.append((m.token, steps.stepped_down(rep, rep.epoch)))
            return
        self.acks.add_start(rep, m.token, m.start, now + m.timeout_s)

    def _durable(self, now: float, m: msg.Durable) -> None:
        m.rep.set_durable(m.end)

    def _sync_failed(self, now: float, m: msg.SyncFailed) -> None:
        log.error("%s/%d: an fsync failed; the replica takes no more appends", m.rep.topic, m.rep.index)

    def _link_up(self, now: float, m: msg.LinkUp) -> None:
        link = self.links.link(m.follower)
        if link is not None:
            link.up(now)
            self._view_moved(now)

    def _link_down(self, now: float, m: msg.LinkDown) -> None:
        link = self.links.link(m.follower)
        if link is not None:
            link.down(now)
            self._next_election_tick = min(self._next_election_tick, now + LINK_LOSS_GRACE_S)

    def _from_follower(self, now: float, m: msg.FromFollower) -> None:
        link = self.links.link(m.follower)
        rep = self.replica(m.frame.topic, m.frame.partition)
        leaving = len(rep.leaving) if rep is not None else 0
        recorded = rep is not None and rep.is_leader and steps.note_incarnation(rep, m.follower, m.frame)
        got = link.answer(now, m.frame) if link is not None else None
        if got is None:
            return
        rep, newer = got
        if steps.note_incarnation(rep, m.follower, m.frame) or recorded:
            self._resync_rep(rep)  # the followers keep the leader's record of the voters' incarnations
        if len(rep.leaving) != leaving:
            self._relink.add((rep.topic, rep.index))  # a voter removed knows it now: its link may go
        if newer is not None and steps.adopt_epoch(rep, newer):
            self._changed(rep)
        else:
            self._start_behind(rep)
        key = (rep.topic, rep.index)
        if key in self._active:
            self._look_soon(key)  # a leader moving its voters, or handing over, waits on these
        if key in self.elections.handoffs:
            self.elections.progress(key, now)

    def _start_moved(self, now: float, m: msg.StartMoved) -> None:
        self.links.notify(m.rep)  # an hw frame carries the new start to each follower

    def _lead_start(self, now: float, m: msg.LeadStart) -> None:
        rep = m.rep
        if rep.deleted or self.replica(rep.topic, rep.index) is not rep:
            return
        try:
            if steps.lead_start(rep):
                self.links.notify(rep)
        except (OSError, RingError) as exc:
            log.error("%s/%d: moving the log start up to a follower's failed: %s", rep.topic, rep.index, exc)

    def _flush(self, now: float, m: msg.Flush) -> None:
        sends: list[tuple[str, Any]] = []
        self.links.flush(now, sends, m.follower)
        if sends:
            self._ready.sends = sends

    def _placement_changed(self, now: float, m: msg.PlacementChanged) -> None:
        self._assign_links()
        self._publish_due = True
        self._signature = None  # replicas came or went: look at them all
        self._look_soon()

    def _resync(self, now: float, m: msg.Resync) -> None:
        self.links.resync(m.rep, now)

    def _reprobe(self, now: float, m: msg.Reprobe) -> None:
        self.links.reprobe(now)

    def _unclean_election(self, now: float, m: msg.UncleanElection) -> None:
        if m.rep.leader is None and not m.rep.deleted:
            m.rep.unclean_once = True
            self._look_soon((m.rep.topic, m.rep.index))

    # --- elections -----------------------------------------------------------------------------

    def _vote_requested(self, now: float, m: msg.VoteRequested) -> None:
        view = self.view()
        self._ready.reply = [self.elections.vote_asked(now, req, view) for req in m.reqs]
        for req in m.reqs:
            self._look_soon((req.topic, req.partition))  # a granted vote holds our own candidacy back a while

    def _vote_answered(self, now: float, m: msg.VoteAnswered) -> None:
        view = self.view()
        for req, reply in m.answers:
            self.elections.answered(now, m.peer, req, reply, view)

    def _transfer_requested(self, now: float, m: msg.TransferRequested) -> None:
        self._ready.reply = self.elections.transfer_asked(now, m.sender, m.transfer, self.view())

    def _transfer_answered(self, now: float, m: msg.TransferAnswered) -> None:
        t = m.transfer
        self.elections.transfer_answered(now, (t.topic, t.partition), t.epoch, m.started)

    def leader_of(self, topic: str, partition: int) -> str | None:
        """The leader as this broker knows it: its own replica's, or the newest live claim in gossip."""
        rep = self.replica(topic, partition)
        if rep is not None and rep.leader is not None:
            return rep.leader  # (if a newer one exists, it answers not_leader with the hint)
        view = self.view()
        best = leaders.leader_from_claims(view.claims(), (topic, partition), view.alive)
        return best[0] if best is not None else None

    def leader_epoch_of(self, topic: str, partition: int) -> int:
        """The leader's epoch as this broker knows it (its own replica's while it knows the leader, or
        the newest live claim's in gossip); -1 when no leader is known."""
        rep = self.replica(topic, partition)
        if rep is not None and rep.leader is not None:
            return rep.epoch
        view = self.view()
        best = leaders.leader_from_claims(view.claims(), (topic, partition), view.alive)
        return best[1] if best is not None else -1

    def claimants(self, topic: str) -> list[str]:
        """The live brokers whose gossip says they lead a partition of a topic named ``topic``."""
        view = self.view()
        return sorted(b for b, leads in view.claims().items() if view.alive(b) and any(t == topic for t, _ in leads))

    def stand_now(self, now: float) -> Ready:
        """Tick the elections at once (a topic was just created: its first leaders)."""
        self._next_election_tick = now
        return self.tick(now)

    # --- damage -------------------------------------------------------------------------------

    def _damaged(self, now: float, m: msg.Damaged) -> None:
        self._damage(m.rep, m.offset, self._ready)

    def _damage(self, rep: Replica, offset: int, ready: Ready) -> None:
        if rep.damaged_at is None or offset < rep.damaged_at:
            rep.damaged_at = offset
        ready.add("damaged", (rep, offset))
        self._publish_due = True
        self._look_soon((rep.topic, rep.index))  # a damaged leader hands over; a damaged copy is not elected

    def _repaired(self, now: float, m: msg.Repaired) -> None:
        m.rep.damaged_at = None
        self._publish_due = True
        self._look_soon((m.rep.topic, m.rep.index))

    # --- status -------------------------------------------------------------------------------

    def describe_links(self) -> dict[str, dict[str, object]]:
        return self.links.describe()
