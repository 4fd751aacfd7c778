"""One simulated broker: ring's node core on real partition logs, carried out on the simulated world.

Everything a broker decides is ring's own code: ``NodeCore`` (ring/node:
membership and phi accrual over real gossip exchanges, elections and
hand-offs, the leader's link scheduling, the follower's answers, the
produces waiting for acknowledgements), placement (``placement.held_here``,
``replacement``, ``catalog_change``), the replica steps and the
``PartitionLog`` on files under a temporary directory. This module is only
the driver: it steps the core with the world's clock, and carries out each
Ready through ring's own executor (``ring.node.executor``, as
``ring.cluster.pump`` does in a broker) with ``SimEffects``: files are written, fsyncs
are the simulated disk's (``disk.py``: a group commit a few milliseconds
later), messages go over the simulated network (gossip, votes and transfers
as calls; frames on ordered links that break and reconnect, ``links.py``), released
produces answer the client. A produce is routed and admitted by the core
(``route``, ``admit``) and appended by ``steps.append_as_leader``; a broker
that does not lead the partition answers with the leader it knows, as a
forwarded produce's ``not_leader`` does.

Under the ``always`` fsync policy (the default) an append is durable once
the simulated disk's fsync of it finished; under ``interval``
(``interval_s``) it is durable at once, for the leader and for a follower's
acknowledgement alike, and every ``interval_s`` the broker syncs each log
with unsynced bytes, as ``GroupCommit``'s interval loop does on a broker.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from ring import limits
from ring.catalog import TopicConfig
from ring.cluster.membership import load_files
from ring.errors import NotEnoughReplicas, NotLeader, RingError, StorageError, Unavailable
from ring.gossip.core import Ack2, Syn
from ring.gossip.state import EndpointState
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as batchfmt
from ring.log import datadir
from ring.log.fsync import write_atomically
from ring.node import placement
from ring.node import ready as m
from ring.node import executor
from ring.node.core import NodeCore
from ring.node.elections import Transfer
from ring.node.members import Members
from ring.replication import election, protocol, state, steps
from ring.replication.replica import Replica
from tests.sim.disk import Disk, Repair
from tests.sim.links import LINK_CHECK_S, Links
from tests.sim.network import Network, World

Key = tuple[str, int]
ACK_TIMEOUT_S = limits.REPLICATION_ACK_TIMEOUT_MS / 1000
LEADER_FRAMES = (protocol.Sync, protocol.Append, protocol.Hw)



class SimBroker:
    def __init__(self, world: World, net: Network, name: str, token: int, seeds: list[str], root: Path,
                 observer: Any, interval_s: float | None = None) -> None:
        self.world, self.net, self.name, self.token, self.seeds = world, net, name, token, seeds
        self.interval_s = interval_s  # the ``interval`` fsync policy's period (None: ``always``)
        self.dir = root / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.observer = observer  # the run: told of leaders won, for the one-leader-per-epoch check
        self.disk = Disk(world, self)
        self.repair = Repair(world, self)
        self.running = False
        self.paused = False
        self.generation = 0
        self.incarnation, self.fresh, self.opened_ms = "", False, 0  # its data directory's (set by start)
        net.nodes[name] = self

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.generation += 1
        self.running, self.paused = True, False
        self.inbox: list[tuple[str, Any]] = []
        self.wire = Links(self)  # replication links, both ends
        self.exchanges: set[str] = set()  # gossip exchanges running, by address
        self.parked: list[tuple[int, Key, str, str, float]] = []  # produces waiting out a hand-off
        self.pending_base: dict[int, int] = {}  # produce -> the offset its batch got
        self.tick_at: float | None = None
        self.catalog: dict[str, TopicConfig] = {}
        self.parts: dict[str, dict[int, Replica]] = {}
        self.opened_ms = self.world.clock.wall_ms()
        self.incarnation, self.fresh = datadir.incarnation(self.dir, not any(self.dir.iterdir()))
        rng = random.Random(self.world.rng.random())
        me = EndpointState(self.name, self.token, self.name, self.name, generation=self.world.clock.wall_ms(),
                           status="joining")
        members = Members(me, self.seeds, random.Random(rng.random()))
        self.core = NodeCore(self.name, self.replica, self.replicas, self.interval_s is not None,
                             random.Random(rng.random()), members, self.incarnation)
        self.core.carries_writes = True  # (every Ready is carried out: ``carry_out``)
        saved, removed, decommissioned = load_files(self.dir)
        members.restore(saved, removed, self.world.now, decommissioned)
        self.reconcile(starting=True)
        gen = self.generation
        self.world.after(self.world.rng.uniform(0, 0.1), lambda: self._tick(gen))
        self.world.after(LINK_CHECK_S, lambda: self.wire.check(gen))
        self.world.after(self.world.rng.uniform(0, 1), lambda: self.repair.scrub(gen))
        if self.interval_s is not None:
            self.world.after(self.interval_s, lambda: self._sync_interval(gen))
        self.world.log(f"{self.name} starts (generation {gen})")

    def _sync_interval(self, gen: int) -> None:
        """The ``interval`` policy's fsync: every log with unsynced bytes (not while stopped)."""
        if not self.live(gen):
            return
        assert self.interval_s is not None
        self.world.after(self.interval_s, lambda: self._sync_interval(gen))
        if not self.paused:
            for rep in self.replicas():
                if rep.log.unsynced_bytes and not rep.deleted:
                    rep.log.sync()

    def crash(self) -> None:
        if not self.running:
            return
        self.running = False
        for rep in self.replicas():
            rep.log.abandon()
        self.world.log(f"{self.name} crashes")

    def lose_disk(self) -> None:
        """Crash, and the data directory is gone: the broker starts again on an empty one."""
        self.crash()  # (its logs abandoned: nothing more is written to them)
        if self.generation:
            shutil.rmtree(self.dir)
            self.dir.mkdir()
            self.world.log(f"{self.name} loses its disk")

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
        for src, msg in queued:
            self.receive(src, msg)
        self.wire.flushing.clear()
        self.step(m.Flush())  # what the links were told to send while stopped
        self._tick(self.generation)

    def close(self) -> None:
        if self.running:
            for rep in self.replicas():
                rep.log.close()
            self.running = False

    def live(self, gen: int) -> bool:
        return self.running and gen == self.generation

    # --- replicas and placement ------------------------------------------------------------------

    def replica(self, topic: str, partition: int) -> Replica | None:
        return self.parts.get(topic, {}).get(partition)

    def replicas(self) -> list[Replica]:
        return [r for ps in self.parts.values() for r in ps.values()]

    def reconcile(self, starting: bool = False) -> None:
        """Open what placement gives this broker, close what it took away (its data stays), as the broker's
        ``_reconcile`` does (``starting``: as its ``open``, which also opens what it votes for)."""
        members = self.core.members
        change = placement.catalog_change(self.catalog, members.gossip.topics())
        for cfg in change.add + change.update:
            self.catalog[cfg.name] = cfg
        for cfg in self.catalog.values():
            open_ = self.parts.setdefault(cfg.name, {})
            kept = [p for p, r in open_.items() if self.core.keep(r, self.world.now)]
            if starting:
                kept += state.voting_here(self.dir / "topics" / cfg.name, self.name, cfg.partitions)
            plan = placement.replacement(placement.held_here(members.ring, cfg, self.name, kept),
                                         {p: r.replicas for p, r in open_.items()})
            for p in plan.close:
                rep = open_.pop(p)
                steps.close(rep, Unavailable(f"{cfg.name}/{p} moved to other brokers"))
                rep.log.close()
                self.world.log(f"{self.name} closes {cfg.name}/{p}, placed elsewhere")
            for p, replicas in plan.moved.items():
                open_[p].set_placement(replicas)
            for p, replicas in plan.open.items():
                self._open(cfg, p, replicas)
        self.carry_out(self.core_step(m.PlacementChanged()))

    def _open(self, cfg: TopicConfig, p: int, replicas: list[str]) -> None:
        plog = PartitionLog(self.dir / "topics" / cfg.name / str(p),
                            LogConfig(segment_bytes=2048, index_interval_bytes=256, fsync=FsyncPolicy("never")),
                            self.world.clock)
        rep = Replica(cfg.name, p, plog, self.name, replicas, hw=0)
        rep.incarnation = self.incarnation
        lost = datadir.partition_lost(self.fresh, cfg.created_ms, self.opened_ms, limits.CLOCK_OFFSET_MS_MAX_DEFAULT)
        steps.restore(rep, plog.clean_shutdown, lost)
        self.core.adopt(rep)
        self.parts[cfg.name][p] = rep
        if rep.damaged_at is not None:  # damage recovery kept inside the log: mend it
            self.carry_out(self.core_step(m.Damaged(rep, rep.damaged_at)))

    # --- the tick --------------------------------------------------------------------------------

    def _tick(self, gen: int, at: float | None = None) -> None:
        if not self.live(gen) or (at is not None and at != self.tick_at):
            return  # an old incarnation's, or superseded by an earlier one
        self.tick_at = None
        if not self.paused:
            self.world.current = self.name
            self.carry_out(self.core.tick(self.world.now, self.world.clock.wall_ms()))
            if self.parked:
                self._retry_parked()

    def _schedule_tick(self, at: float) -> None:
        if self.tick_at is not None and self.tick_at <= at:
            return
        self.tick_at = at
        gen = self.generation
        self.world.at(at, lambda: self._tick(gen, at))

    # --- carrying out a Ready ------------------------------------------------------------------

    def carry_out(self, ready: m.Ready, answer_to: tuple[str, int] | None = None) -> None:
        """Carry ``ready`` out through ring's executor (``answer_to``: the link a stepped frame came in on,
        where a follower's answers go)."""
        fx = SimEffects(self, answer_to)
        executor.carry_out(ready, fx)

    def _ask(self, votes: dict[str, list[election.VoteRequest]], gen: int) -> None:
        for dst, part in election.messages(votes):  # the messages the pump sends
            self.net.call(self.name, dst, ("votes", part), limits.VOTE_REQUEST_TIMEOUT_S,
                          lambda replies, dst=dst, part=part: self.step(
                              m.VoteAnswered(dst, tuple(zip(part, replies or [None] * len(part)))), gen))

    def core_step(self, message: Any) -> m.Ready:
        self.world.current = self.name  # whose log lines these are, in a trace
        return self.core.step(self.world.now, message)

    def step(self, message: Any, gen: int | None = None) -> None:
        if self.running and not self.paused and (gen is None or gen == self.generation):
            self.carry_out(self.core_step(message))

    def durable(self, rep: Replica) -> None:
        """An fsync of ``rep`` finished (``disk.py``)."""
        if self.replica(rep.topic, rep.index) is rep:
            self.step(m.Durable(rep, rep.log.end_offset))
        self.wire.flush_all_answers()

    # --- messages in -----------------------------------------------------------------------------

    def receive(self, src: str, msg: Any) -> None:
        if not self.running:
            return
        if self.paused:
            self.inbox.append((src, msg))
            return
        kind = msg[0]
        if kind == "call":
            self._serve(src, msg[1], msg[2])
        elif kind == "answer":
            msg[1](msg[2])
        elif kind == "gossip":
            self.step(m.GossipIn(src, msg[1]))
        elif kind == "produce":
            self.produce(src, *msg[1:])
        elif kind == "frame":
            self.wire.receive_frame(*msg[1:])

    def _serve(self, src: str, msg: Any, reply: Any) -> None:
        kind, body = msg
        if kind == "gossip":
            ready = self.core_step(m.GossipIn(src, body))
            self.carry_out(ready)
            reply((ready.reply, self.world.clock.wall_ms()))  # our wall clock answers too: the sender measures it
            return
        elif kind == "fetch":
            return reply(self.fetch(*body))
        elif kind == "replica":
            return reply(self.read_replica(*body))
        elif kind == "votes":
            ready = self.core_step(m.VoteRequested(body))
        elif kind == "resync":
            rep = self.replica(*body)
            ready = self.core_step(m.Resync(rep)) if rep is not None and rep.is_leader else m.Ready()
        else:
            ready = self.core_step(m.TransferRequested(src, body))
        self.carry_out(ready)
        reply(ready.reply)

    def _exchange(self, addr: str, syn: Syn) -> None:
        if addr in self.exchanges:
            return  # at most one exchange per peer at a time
        self.exchanges.add(addr)
        gen, sent_s, sent_wall_ms = self.generation, self.world.now, self.world.clock.wall_ms()

        def answered(got: Any) -> None:
            if not self.live(gen):
                return
            self.exchanges.discard(addr)
            if got is not None and got[0] is not None:
                ack, peer_wall_ms = got
                self.step(m.GossipIn(addr, ack, (sent_s, sent_wall_ms, peer_wall_ms)), gen)

        self.net.call(self.name, addr, ("gossip", syn), limits.GOSSIP_REQUEST_TIMEOUT_S, answered)

    # --- produce ----------------------------------------------------------------------------------

    def produce(self, src: str, rid: int, key: Key, value: str, level: str, deadline: float | None = None) -> None:
        """As ``Router.produce_partition`` and ``produce_as_leader``, minus forwarding: a broker that does
        not lead answers with the leader it knows."""
        now, (topic, p) = self.world.now, key
        if not self.core.members.joined:
            return self._answer(rid, "fail", None, 503, None)
        if topic not in self.catalog:
            return self._answer(rid, "fail", None, 404, None)
        rep = self.replica(topic, p)
        try:
            leader = self.core.leader_of(topic, p)
            if leader is None or leader != self.name and not self.core.view().alive(leader):
                voters = rep.voters if rep is not None else self._preference(key)
                leader = self.core.route(now, topic, p, voters, level)
            if leader != self.name:
                return self._answer(rid, "fail", None, 503, leader)
            needed = self.core.admit(now, rep, topic, p, level)
        except (NotLeader, NotEnoughReplicas) as exc:
            return self._answer(rid, "fail", None, 503, exc.extra.get("leader"))
        if needed is None:  # handing over: wait for the new leader, or for the hand-off to fail
            until = deadline if deadline is not None else now + limits.HANDOFF_CATCHUP_MS / 1000 + 1
            self.parked.append((rid, key, value, level, until))
            self._schedule_tick(until)
            return
        assert rep is not None
        now_ms = self.world.clock.wall_ms()
        base, end = steps.append_as_leader(rep, [batchfmt.encode([(now_ms, None, value.encode(), None)],
                                                                 now_ms=now_ms)])
        self.pending_base[rid] = base
        self.carry_out(self.core_step(m.Appended(rep)))
        if self.interval_s is None:
            self.disk.sync_soon(rep)
        else:  # durable at once: the interval's fsync comes later (``_sync_interval``)
            self.carry_out(self.core_step(m.Durable(rep, end)))
        self.carry_out(self.core_step(m.AwaitAcks(rid, rep, end, level, ACK_TIMEOUT_S)))

    def _preference(self, key: Key) -> list[str]:
        cfg = self.catalog.get(key[0])
        return placement.preference_lists(self.core.members.ring, cfg)[key[1]] if cfg is not None else []

    def _retry_parked(self) -> None:
        parked, self.parked = self.parked, []
        for rid, key, value, level, until in parked:
            if self.world.now >= until:
                self._answer(rid, "fail", None, 503, self.core.leader_of(*key))
            else:
                self.produce("client", rid, key, value, level, until)

    def answer_produce(self, rid: int, exc: BaseException | None) -> None:
        base = self.pending_base.pop(rid, None)
        if exc is None:
            self._answer(rid, "ok", base, 200, None)
        elif isinstance(exc, RingError) and getattr(exc, "status", 500) in (503, 404):
            self._answer(rid, "fail", None, exc.status, None)
        else:  # a timeout, or a step-down: the batch may still commit
            self._answer(rid, "unknown", None, 504, None)

    def fetch(self, topic: str, p: int, offset: int) -> list[tuple[int, str]] | None:
        """A consumer's read, as ``Broker.fetch`` serves it: this replica's records from ``offset`` below
        its high watermark (None: this broker holds no replica, or nothing there yet)."""
        rep = self.replica(topic, p)
        if (rep is None or not self.core.members.joined or rep.damaged_at is not None
                or not rep.log.start_offset <= offset < rep.hw):
            return None
        try:
            data = rep.log.read(offset, 16 * 1024, upto=rep.hw)
        except StorageError as exc:  # a damaged batch: never served, repaired
            self.step(m.Damaged(rep, exc.extra.get("offset", offset)))
            return None
        return [(rec.offset, rec.value.decode()) for _, pos in batchfmt.scan(data)
                for rec in batchfmt.decode(data, pos)[1] if offset <= rec.offset < rep.hw]

    def read_replica(self, topic: str, p: int, offset: int) -> bytes | None:
        """A peer's read of this replica's stored batch holding ``offset`` (``GET /peer/v1/replicas``, as
        ``ClusterBroker.read_replica`` serves it with ``max_bytes=1``): None where it is damaged or not held."""
        rep = self.replica(topic, p)
        if rep is None or not rep.log.start_offset <= offset < rep.log.end_offset:
            return None
        try:
            return bytes(rep.log.read(offset, 1))
        except StorageError:
            return None

    def _answer(self, rid: int, outcome: str, offset: int | None, status: int, hint: str | None) -> None:
        self.net.request(self.name, "client", ("answer", rid, outcome, offset, self.name, status, hint))


class SimEffects:
    """What a Ready asks for, done in the simulated world (``ring.node.executor.Effects``): files are
    written, fsyncs are the simulated disk's, messages go over the simulated network."""

    def __init__(self, b: SimBroker, answer_to: tuple[str, int] | None) -> None:
        self.b, self.answer_to, self.gen = b, answer_to, b.generation
        self.votes: dict[str, list[election.VoteRequest]] = {}  # to one peer, they travel together (as NodePump's)

    def write(self, files: list[tuple[str, bytes]]) -> None:
        for name, data in files:
            write_atomically(self.b.dir / name, data)

    def persist(self, rep: Replica, end: int) -> tuple[Replica, int]:
        return rep, self.b.disk.sync_soon(rep)

    def send(self, dst: str, msg: Any, persisted: Any) -> None:
        b, gen = self.b, self.gen
        if isinstance(msg, LEADER_FRAMES):
            b.wire.send_frame(dst, msg)
        elif isinstance(msg, (protocol.FollowerAck, protocol.Reject)):
            assert self.answer_to is not None
            b.wire.answer(self.answer_to, persisted, msg)
        elif isinstance(msg, election.VoteRequest):
            self.votes.setdefault(dst, []).append(msg)
        elif isinstance(msg, Transfer):
            b.net.call(b.name, dst, ("transfer", msg), limits.VOTE_REQUEST_TIMEOUT_S,
                       lambda ok, dst=dst, t=msg: b.step(m.TransferAnswered(dst, t, bool(ok)), gen))
        elif isinstance(msg, Syn):
            b._exchange(dst, msg)
        else:
            assert isinstance(msg, Ack2), msg
            b.net.request(b.name, dst, ("gossip", msg))

    def sent(self) -> None:
        votes, self.votes = self.votes, {}
        self.b._ask(votes, self.gen)
        if self.answer_to is not None:
            self.b.wire.flush_answers(self.answer_to)

    def relink(self, wanted: set[str]) -> None:
        self.b.wire.relink(wanted)

    def flush(self, names: set[str] | frozenset[str]) -> None:
        self.b.wire.flush_soon(names)

    def release(self, token: Any, exc: BaseException | None) -> None:
        self.b.answer_produce(token, exc)

    def changed(self, reps: list[Replica]) -> None:
        b = self.b
        for rep in reps:
            if rep.is_leader:
                b.observer.led(rep.topic, rep.index, rep.epoch, b.name)
            b.world.log(f"{b.name}: {rep.topic}/{rep.index} epoch {rep.epoch} leader {rep.leader} "
                        f"voters {','.join(rep.voters)}")
        if b.parked:
            b._retry_parked()

    def damaged(self, rep: Replica, offset: int) -> None:
        self.b.repair.fix(rep)

    def after_idle(self, rep: Replica, message: Any) -> None:
        pass  # (the simulated leader's log start never moves: no retention, no truncate in the workload)

    def reconcile(self) -> None:
        self.b.reconcile()

    def clock(self, verdict: Any) -> None:
        pass  # (the simulated brokers stamp records with the world's clock whatever the verdict)

    def announce(self) -> None:
        b, gen = self.b, self.gen
        b.world.after(0.02, lambda: b.step(m.Announce(), gen))

    def tick_at(self, at: float) -> None:
        self.b._schedule_tick(at)
