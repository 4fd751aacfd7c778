"""One simulated broker: the real replica cores on real partition logs, driven by simulated time and messages.

What runs is ring's own code: ``Replica`` and ``PartitionLog`` (files under a
temporary directory; a crash keeps the page cache, as a SIGKILL does, and a
power loss may cut what was not synced), durability as fsync ``always``
gives it (a group commit a few milliseconds after an append; followers ack
and leaders count only what is synced), the replication steps (``steps.on_sync``, ``on_append``,
``on_answer``, ``sync_frame``), the leader's ``SendCursor``, the election
steps and ``election.Tally``, and ``Watch``, which makes every leadership
decision the real driver makes. What stands in for the async drivers is
this module's glue: heartbeats instead of gossip (each carries what the
broker leads and which replicas are catching up, as the real gossip entry
does), a failure detector that convicts after ``DOWN_AFTER_S`` of silence
(and forgives everyone after its own stall, as phi accrual's guard does),
votes and transfers as requests, one ordered link per (leader, follower)
that breaks and reconnects (``replication.py``), and the produce path: append while leading,
answer once a majority of the voters holds the batch, 504 (outcome unknown)
on a timeout or a step-down.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ring import limits
from ring.cluster import leaders
from ring.cluster.watch import Watch
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as batchfmt
from ring.replication import election, protocol, steps
from ring.replication.replica import Replica
from tests.sim.network import Network, World
from tests.sim.replication import Link, Replication

Key = tuple[str, int]
TICK_S = limits.ELECTION_TICK_MS / 1000
HEARTBEAT_S = 1.0
DOWN_AFTER_S = 5.0  # silence before a peer is convicted (the real detector: about 4-13 s)
SUSPECT_AFTER_S = 2.0
STALL_S = 2.0  # a tick this late means we were stopped: forgive every peer's silence
VOTE_TIMEOUT_S = limits.VOTE_REQUEST_TIMEOUT_S
ACK_TIMEOUT_S = limits.REPLICATION_ACK_TIMEOUT_MS / 1000


@dataclass
class Heard:
    at: float
    generation: int
    leads: dict[Key, int]
    behind: set[Key]


@dataclass
class Candidacy:
    req: election.VoteRequest
    tally: election.Tally
    deadline: float
    transfer: bool


@dataclass
class Handoff:
    target: str
    epoch: int
    deadline: float
    sent: bool = False


@dataclass
class Pending:
    rid: int
    base: int
    end: int
    epoch: int
    deadline: float


class SimBroker(Replication):
    def __init__(self, world: World, net: Network, name: str, names: list[str], keys: list[Key], root: Path,
                 placed: list[str]) -> None:
        self.world, self.net, self.name, self.names, self.keys = world, net, name, names, keys
        self.dir = root / name
        self.generation = 0
        self.running = False
        self.paused = False
        self.inbox: list[tuple[str, str, int, Any]] = []
        self.accepted: dict[str, int] = {}  # leader -> the connection of its link we accept
        self.reps: dict[Key, Replica] = {}
        # Where each partition is placed, as this broker last learned it (kept across restarts, as the
        # real broker keeps its gossiped state on disk).
        self.placement: dict[Key, list[str]] = {k: list(placed) for k in keys}
        net.nodes[name] = self
        self.start()

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.generation += 1
        self.running, self.paused, self.inbox, self.accepted = True, False, [], {}
        self.reps = {}
        for key in self.keys:
            if self.name in self.placement[key]:
                self._open(key)
        self.watch = Watch(self.name, random.Random(self.world.rng.random()))
        self.heard: dict[str, Heard] = {}
        self.links: dict[str, Link] = {}
        self.candidacies: dict[Key, Candidacy] = {}
        self.handoffs: dict[Key, Handoff] = {}
        self.pending: dict[Key, list[Pending]] = {k: [] for k in self.keys}  # produces awaiting acks
        self.answers: dict[tuple[str, int], list[tuple[Key, int | None, Any]]] = {}  # per link, in order
        self.syncing: set[Key] = set()
        self.last_tick = self.world.now
        gen = self.generation
        self.world.after(self.world.rng.uniform(0, TICK_S), lambda: self._tick(gen))
        self.world.after(self.world.rng.uniform(0, HEARTBEAT_S), lambda: self._heartbeat(gen))
        self.world.log(f"{self.name} starts (generation {gen})")

    def _open(self, key: Key) -> Replica:
        t, p = key
        plog = PartitionLog(self.dir / t / str(p), LogConfig(segment_bytes=2048, index_interval_bytes=256,
                                                             fsync=FsyncPolicy("never")), self.world.clock)
        rep = Replica(t, p, plog, self.name, list(self.placement[key]), hw=0)
        ballot, voters = steps.load_state(plog.directory)
        rep.epoch, rep.voted_for, rep.voters = ballot.epoch, ballot.voted_for, voters or list(self.placement[key])
        rep.leader, rep.aligned, rep.caught_up = None, False, plog.clean_shutdown
        self.reps[key] = rep
        return rep

    def set_placement(self, key: Key, replicas: list[str]) -> None:
        """The ring changed (a broker joined or left): this broker learns the partition's new preference list."""
        self.placement[key] = list(replicas)
        self.world.log(f"{self.name} learns {key} is placed on {','.join(replicas)}")
        if self.running:
            self._reconcile(key)

    def _reconcile(self, key: Key) -> None:
        """Open a partition placed here, close one placed elsewhere once we no longer lead it (data stays)."""
        rep, placed = self.reps.get(key), self.name in self.placement[key]
        if rep is None:
            if placed:
                self._open(key)
            return
        if rep.replicas != self.placement[key]:
            rep.set_placement(list(self.placement[key]))
        if not placed and not rep.is_leader:
            self.world.log(f"{self.name} closes {key}, placed elsewhere")
            rep.log.close()
            del self.reps[key]
            self.candidacies.pop(key, None)
            self.handoffs.pop(key, None)
            self._check_pending(rep)

    def crash(self) -> None:
        if not self.running:
            return
        self.running = False
        for rep in self.reps.values():
            rep.log.abandon()
        self.world.log(f"{self.name} crashes")

    def pause(self) -> None:
        if self.running:
            self.paused = True
            self.world.log(f"{self.name} paused")

    def resume(self) -> None:
        if not self.running or not self.paused:
            return
        self.paused = False
        self.world.log(f"{self.name} resumed with {len(self.inbox)} queued messages")
        queued, self.inbox = self.inbox, []
        for kind, src, conn, msg in queued:
            if kind == "frame":
                self.receive_frame(src, conn, msg)
            else:
                self.receive(src, msg)

    def close(self) -> None:
        if self.running:
            for rep in self.reps.values():
                rep.log.close()
            self.running = False

    # --- the View the watch decides on ------------------------------------------------------------

    def alive(self, name: str) -> bool:
        h = self.heard.get(name)
        return name == self.name or (h is not None and self.world.now - h.at < DOWN_AFTER_S)

    def up(self, name: str) -> bool:
        h = self.heard.get(name)
        return name == self.name or (h is not None and self.world.now - h.at < SUSPECT_AFTER_S)

    def generation_of(self, name: str | None) -> int | None:
        if name == self.name:
            return self.generation
        h = self.heard.get(name) if name is not None else None
        return h.generation if h is not None else None

    def claims(self) -> dict[str, dict[Key, int]]:
        return {n: self.heard[n].leads for n in sorted(self.heard)}

    def behind(self, name: str) -> set[Key]:
        h = self.heard.get(name)
        return h.behind if h is not None else set()

    def leader_of(self, key: Key) -> str | None:
        rep = self.reps.get(key)
        best = leaders.leader_from_claims(self.claims(), key, self.alive)
        if rep is not None and rep.leader is not None and (best is None or best[1] <= rep.epoch):
            return rep.leader
        return best[0] if best is not None else None

    # --- timers --------------------------------------------------------------------------------

    def _live(self, gen: int) -> bool:
        return self.running and gen == self.generation

    def _heartbeat(self, gen: int) -> None:
        if not self._live(gen):
            return
        self.world.after(HEARTBEAT_S, lambda: self._heartbeat(gen))
        if self.paused:
            return
        leads = {k: r.epoch for k, r in self.reps.items() if r.is_leader}
        behind = {k for k, r in self.reps.items() if not r.caught_up}
        for n in self.names:
            if n != self.name:
                self.net.request(self.name, n, ("heartbeat", self.generation, dict(leads), set(behind)))

    def _tick(self, gen: int) -> None:
        if not self._live(gen):
            return
        self.world.after(TICK_S, lambda: self._tick(gen))
        if self.paused:
            return
        now = self.world.now
        if now - self.last_tick > STALL_S:  # we were stopped: nobody's silence counts against them
            for h in self.heard.values():
                h.at = now
        self.last_tick = now
        for action in self.watch.tick(now, list(self.reps.values()), _View(self)):
            if action.kind == "stand":
                self._stand(action.rep, pre=True)
            elif action.kind == "hand_off":
                assert action.target is not None
                self.handoffs[(action.rep.topic, action.rep.index)] = Handoff(
                    action.target, action.rep.epoch, now + limits.HANDOFF_CATCHUP_MS / 1000)
                action.rep.frozen = True
            else:
                self._changed(action.rep, resync=action.target == "voters")
        for key in list(self.candidacies):
            if now >= self.candidacies[key].deadline:
                self._end_candidacy(key, won=False)
        for key in list(self.handoffs):
            self._handoff_progress(key)
        for key in list(self.reps):
            self._reconcile(key)
        self._maintain_links()
        for rep in self.reps.values():
            self._check_pending(rep)
            self._pump(rep)

    # --- messages --------------------------------------------------------------------------------

    def receive(self, src: str, msg: Any) -> None:
        if not self.running:
            return
        if self.paused:
            self.inbox.append(("request", src, 0, msg))
            return
        kind = msg[0]
        if kind == "heartbeat":
            _, gen, leads, behind = msg
            old = self.heard.get(src)
            if old is None or gen >= old.generation:
                self.heard[src] = Heard(self.world.now, gen, leads, behind)
        elif kind == "vote":
            self._on_vote(src, msg[1])
        elif kind == "voted":
            self._on_voted(msg[1])
        elif kind == "transfer":
            rep = self.reps.get(msg[1])
            if rep is not None and self.watch.may_take_over(rep, src, msg[2], self.world.now):
                self._stand(rep, pre=False, transfer=True)
        elif kind == "produce":
            self._on_produce(src, *msg[1:])
        elif kind == "connect":
            self.accepted[src] = msg[1]

    def _reply(self, dst: str, msg: Any) -> None:
        self.net.request(self.name, dst, msg)

    def _changed(self, rep: Replica, resync: bool = False) -> None:
        """Leadership of ``rep`` changed here: produces waiting on a deposed leader learn the outcome is unknown."""
        self._check_pending(rep)
        if resync and rep.is_leader:
            for link in self.links.values():
                cur = link.cursors.get((rep.topic, rep.index))
                if cur is not None:
                    cur.reset(self.world.now)

    # --- elections -------------------------------------------------------------------------------

    def _stand(self, rep: Replica, pre: bool, transfer: bool = False) -> None:
        key = (rep.topic, rep.index)
        voters = frozenset(rep.voters)
        if self.name not in voters or key in self.candidacies:
            self.watch.stood(rep, False, self.world.now)
            return
        req = steps.vote_request(rep, pre=pre, transfer=transfer)
        if not req.pre:
            self._changed(rep)
        self.world.log(f"{self.name} stands for {key} epoch {req.epoch} ({'pre' if req.pre else 'real'})")
        self.candidacies[key] = Candidacy(req, election.Tally(self.name, voters, req.epoch, req.pre),
                                          self.world.now + VOTE_TIMEOUT_S, transfer)
        for v in sorted(voters - {self.name}):
            self._reply(v, ("vote", req))
        self._count(key)

    def _on_voted(self, reply: election.VoteReply) -> None:
        key = (reply.topic, reply.partition)
        c = self.candidacies.get(key)
        if c is None:
            return
        c.tally.add(reply)
        self._count(key)

    def _count(self, key: Key) -> None:
        c, rep = self.candidacies[key], self.reps[key]
        if c.tally.newest_epoch > rep.epoch:
            steps.adopt_epoch(rep, c.tally.newest_epoch)
            self._changed(rep)
            self._end_candidacy(key, won=False)
        elif c.tally.won and c.req.pre:
            del self.candidacies[key]
            self._stand(rep, pre=False)  # the real round (the pre-vote passed)
        elif c.tally.won:
            won = steps.win(rep, c.req.epoch)
            if won:
                self.world.log(f"{self.name} leads {key} epoch {rep.epoch} from {rep.epoch_start}")
                self._changed(rep, resync=True)
            self._end_candidacy(key, won=won)
        elif c.tally.lost:
            self._end_candidacy(key, won=False)

    def _end_candidacy(self, key: Key, won: bool) -> None:
        self.candidacies.pop(key, None)
        self.watch.stood(self.reps[key], won, self.world.now)

    def _on_vote(self, src: str, req: election.VoteRequest) -> None:
        rep = self.reps.get((req.topic, req.partition))
        if rep is None:
            self._reply(src, ("voted", election.VoteReply(req.topic, req.partition, 0, self.name, False,
                                                          election.NOT_A_VOTER, req.pre)))
            return
        now = self.world.now
        was = (rep.leader, rep.epoch)
        reply = steps.on_vote_request(rep, req, self.watch.voter_view(rep, _View(self), now))
        self.watch.voted(rep, reply.granted and not req.pre, now)
        if (rep.leader, rep.epoch) != was:
            self._changed(rep)
        self._reply(src, ("voted", reply))

    def _handoff_progress(self, key: Key) -> None:
        h, rep, now = self.handoffs[key], self.reps[key], self.world.now
        done = not rep.is_leader or rep.epoch != h.epoch or now >= h.deadline
        if not done and not h.sent and rep.follower_ends.get(h.target, -1) >= rep.log.end_offset:
            self._reply(h.target, ("transfer", key, h.epoch))
            h.sent, h.deadline = True, now + 2 * VOTE_TIMEOUT_S
        if done:
            del self.handoffs[key]
            if rep.is_leader:
                rep.frozen = False
            self.watch.handed(rep, now)

    # --- produce -----------------------------------------------------------------------------------

    def _on_produce(self, src: str, rid: int, key: Key, value: str) -> None:
        rep = self.reps.get(key)
        if rep is None or not rep.is_leader or rep.frozen:
            self._reply(src, ("answer", rid, "fail", None, self.name, 503, self.leader_of(key)))
            return
        if sum(1 for v in rep.voters if self.alive(v)) < election.majority(len(rep.voters)):
            self._reply(src, ("answer", rid, "fail", None, self.name, 503, None))
            return
        now_ms = self.world.clock.wall_ms()
        base = rep.log.end_offset
        rep.log.append(batchfmt.encode([(now_ms, f"{key[1]}".encode(), value.encode(), None)], now_ms=now_ms),
                       rep.epoch)
        end = rep.log.end_offset
        self._sync_soon(rep)
        self.pending[key].append(Pending(rid, base, end, rep.epoch, self.world.now + ACK_TIMEOUT_S))
        self._pump(rep)
        self._check_pending(rep)

    def _check_pending(self, rep: Replica) -> None:
        key = (rep.topic, rep.index)
        if self.reps.get(key) is not rep:  # closed: nothing more will be acknowledged here
            for p in self.pending[key]:
                self._reply("client", ("answer", p.rid, "unknown", None, self.name, 504, None))
            self.pending[key] = []
            return
        keep = []
        ends = [rep.durable] + [rep.follower_ends.get(r, 0) for r in rep.voters if r != self.name]
        for p in self.pending[key]:
            if not rep.is_leader or rep.epoch != p.epoch or self.world.now >= p.deadline:
                self._reply("client", ("answer", p.rid, "unknown", None, self.name, 504, None))
            elif protocol.replicas_reaching(ends, p.end) >= election.majority(len(rep.voters)):
                self._reply("client", ("answer", p.rid, "ok", p.base, self.name, 200, None))
            else:
                keep.append(p)
        self.pending[key] = keep

class _View:
    """``Watch``'s View over a SimBroker."""

    def __init__(self, b: SimBroker) -> None:
        self.b = b

    def alive(self, name: str) -> bool:
        return self.b.alive(name)

    def up(self, name: str) -> bool:
        return self.b.up(name)

    def generation(self, name: str | None) -> int | None:
        return self.b.generation_of(name)

    def claims(self) -> dict[str, dict[Key, int]]:
        return self.b.claims()

    def behind(self, name: str) -> set[Key]:
        return self.b.behind(name)

    def clock_usable(self, name: str) -> bool:
        return True  # the simulation's clocks agree
