"""One seeded simulation run: four brokers, producers, faults, healing, the final drain, the checks.

``run(seed)`` builds the world from the seed alone: brokers ``s-0``..``s-2``
start (each knowing the others as seeds) and one of them creates topic
``events`` (3 partitions, replication factor 3) through gossip, as the admin
API does; in most seeds a fourth broker ``s-3`` joins later, which moves
partitions onto it (one of which it becomes the natural leader of: a
hand-off). Three producers write unique values, one per partition, at
consistency quorum or all (the seed picks), each to a random live broker,
retrying where a refusal names the leader, and a consumer reads every
partition from random brokers (what a replica serves below its high
watermark). Faults are drawn from the seed
over the first ``FAULTS_S`` seconds: crashes (restarted later on the same
files), power losses (a crash that also cuts each log at a random byte past
what it had synced), pauses (SIGSTOP, then SIGCONT with the queued
messages), cuts between brokers both ways or one way, spells of message
loss (which also break replication links), and bit flips in a committed
batch of one replica (found by a read or a scrub round, never served,
repaired from the leader); with ``RING_SIM_DISK_LOSS=1``, in a third of the
seeds one broker also loses its disk (it starts again later on an empty
directory: see ``DISK_LOSS``), and in a quarter two brokers lose their
power at the same instant, half of those under the ``interval`` fsync
policy (``PowerLosses``: what such a run may lose). Then everything heals, the
producers go on for a while (the cluster must be writable again), stop, and
once every partition has one leader that every replica has caught up with,
each broker's log is read to its high watermark (the final drain) and every
replica's batches are listed. The history goes through the chaos checker
(tests/chaos/checker.py), and the run checks that no epoch of a partition
ever had two leaders.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ring.catalog import TopicConfig
from ring.errors import StorageError
from ring.hashing import broker_token
from ring import limits
from ring.log import batch as batchfmt
from ring.node.ready import PutTopic
from ring.replication.election import majority
from tests.chaos.checker import Report, check
from tests.chaos.history import CONSUMER, FAIL, FINAL, OK, UNKNOWN, History, Read, ReplicaCopy, Write
from tests.sim.broker import SimBroker
from tests.sim.disk import bit_flip, on_disk, power_loss
from tests.sim.network import Network, TraceHandler, World

NAMES = ["s-0", "s-1", "s-2", "s-3"]
FIRST = NAMES[:3]
TOPIC = "events"  # with 3 partitions, s-3 joining becomes the natural leader of partition 1
PARTITIONS = 3
WARMUP_S = 2.5
FAULTS_S = 9.0
AFTER_HEAL_S = 9.0  # producers go on this long after healing (longer than a produce's own timeout, and a whole cluster's unclean-restart fallback)
SETTLE_S_MAX = 40.0
CLIENT_TIMEOUT_S = 6.0


@dataclass
class Producer:
    index: int
    partition: int
    level: str
    seq: int = 0
    target: str | None = None
    busy: bool = False


@dataclass
class Client:
    """Producers of unique values; each writes one record at a time and records the outcome."""

    world: World
    net: Network
    history: History
    levels: list[str]
    producers: list[Producer] = field(default_factory=list)
    running: bool = True
    _rid: int = 0
    _waiting: dict[int, tuple[Producer, str, float, str]] = field(default_factory=dict)
    name: str = "client"

    def start(self) -> None:
        self.net.nodes[self.name] = self
        for i in range(PARTITIONS):
            p = Producer(i, i, self.levels[i])
            self.producers.append(p)
            self.world.after(self.world.rng.uniform(0, 0.05), lambda p=p: self._next(p))

    def _next(self, p: Producer) -> None:
        if not self.running or p.busy:
            return
        p.busy = True
        p.seq += 1
        value = f"p{p.index}-{p.seq}"
        live = [n for n in NAMES if self.net.nodes[n].running]
        target = p.target if p.target in live else (self.world.rng.choice(live) if live else NAMES[0])
        self._rid += 1
        rid = self._rid
        start = self.world.now
        if not self.net.nodes[target].running:  # connection refused: nothing was written
            self._record(p, value, start, FAIL, None, target, None)
            return
        self._waiting[rid] = (p, value, start, target)
        self.net.request(self.name, target, ("produce", rid, (TOPIC, p.partition), value, p.level))
        self.world.after(CLIENT_TIMEOUT_S, lambda: self._timeout(rid))

    def _timeout(self, rid: int) -> None:
        got = self._waiting.pop(rid, None)
        if got is not None:
            p, value, start, target = got
            self._record(p, value, start, UNKNOWN, None, target, None)

    def receive(self, src: str, msg: Any) -> None:
        _, rid, outcome, offset, broker, status, hint = msg
        got = self._waiting.pop(rid, None)
        if got is None:
            return
        p, value, start, _ = got
        p.target = hint if outcome == FAIL and hint else (broker if outcome == OK else None)
        self._record(p, value, start, outcome, offset, broker, status)

    def _record(self, p: Producer, value: str, start: float, outcome: str, offset: int | None, broker: str,
                status: int | None) -> None:
        self.history.writes.append(Write(value, f"k{p.index}", p.index, p.seq, start, self.world.now, outcome,
                                         p.partition if outcome == OK else None, offset, broker, status))
        self.world.log(f"client: {value} -> {outcome} {offset} from {broker}")
        p.busy = False
        delay = self.world.rng.uniform(0.15, 0.6)
        self.world.after(delay, lambda: self._next(p))

    @property
    def idle(self) -> bool:
        return not self._waiting


@dataclass
class Consumer:
    """Reads every partition from a random live broker now and then, from where it got to: what a
    replica serves (below its high watermark) must never be taken back."""

    world: World
    net: Network
    history: History
    next: dict[int, int] = field(default_factory=dict)
    running: bool = True
    name: str = "consumer"

    def start(self) -> None:
        self.net.nodes[self.name] = self
        self.world.after(self.world.rng.uniform(0.2, 0.5), self._read)

    def _read(self) -> None:
        if not self.running:
            return
        self.world.after(self.world.rng.uniform(0.2, 0.5), self._read)
        p, broker = self.world.rng.randrange(PARTITIONS), self.world.rng.choice(NAMES)
        offset = self.next.get(p, 0)
        self.net.call(self.name, broker, ("fetch", (TOPIC, p, offset)), CLIENT_TIMEOUT_S,
                      lambda got: self._got(broker, p, offset, got))

    def _got(self, broker: str, p: int, offset: int, got: Any) -> None:
        if not got:
            self.history.fetches_failed += 1
            return
        self.history.fetches_ok += 1
        for at, value in got:
            self.history.reads.append(Read(CONSUMER, broker, p, at, value, self.world.now))
        self.next[p] = max(self.next.get(p, 0), got[-1][0] + 1)

    def receive(self, src: str, msg: Any) -> None:
        if msg[0] == "answer":
            msg[1](msg[2])


class Leaders:
    """Who led each (partition, epoch), as the brokers' Readies tell it: never two in one epoch."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int, int], str] = {}
        self.twice: list[str] = []

    def led(self, topic: str, partition: int, epoch: int, broker: str) -> None:
        other = self.seen.setdefault((topic, partition, epoch), broker)
        if other != broker:
            self.twice.append(f"{topic}/{partition} epoch {epoch}: {other} and {broker}")


def schedule_faults(world: World, net: Network, brokers: dict[str, SimBroker], joins: bool,
                    losses: PowerLosses) -> list[str]:
    """Draw the faults of this seed; returns what was scheduled, for the report."""
    rng, plan = world.rng, []
    kinds = ["crash", "pause", "cut", "one-way", "loss", "power", "flip"]
    names = NAMES if joins else FIRST
    for _ in range(rng.randint(2, 6)):
        at = WARMUP_S + rng.uniform(0, FAULTS_S - 2)
        victim = rng.choice(names)
        kind = rng.choice(kinds)
        length = rng.uniform(0.5, 9.0)
        plan.append(f"{at:.2f} {kind} {victim} {length:.2f}s")
        b = brokers[victim]
        if kind in ("crash", "power"):
            def down(b: SimBroker = b, kind: str = kind) -> None:
                if kind == "crash":
                    b.crash()
                elif b.running:
                    for line in power_loss(world, b):
                        world.log(line)
                    losses.record(world.now)
            world.at(at, down)
            world.at(at + length, lambda b=b: b.start() if not b.running and b.generation else None)
        elif kind == "flip":
            world.at(at, lambda b=b: world.log(bit_flip(world, b) or "no bit flipped") if b.running else None)
        elif kind == "pause":
            world.at(at, b.pause)
            world.at(at + length, b.resume)
        elif kind in ("cut", "one-way"):
            others = [n for n in NAMES if n != victim]
            both = kind == "cut"

            def cut(v: str = victim, others: list[str] = others, both: bool = both) -> None:
                for o in others:
                    net.cut(v, o)
                    if both:
                        net.cut(o, v)
            world.at(at, cut)
            world.at(at + length, net.heal)
        else:
            p = rng.uniform(0.02, 0.25)
            world.at(at, lambda p=p: setattr(net, "loss", p))
            world.at(at + length, lambda: setattr(net, "loss", 0.0))
    return plan


# One seed in DISK_LOSS_SEEDS also loses a broker's disk (RING_SIM_DISK_LOSS=0 turns it off). A disk lost
# beside another fault can rightly leave a partition refusing writes for good (no voter that kept its
# state and knows the current voter set can be elected): the run tells that refusal from a loss
# (``refused``). Another one in POWER_PAIR_SEEDS loses the power of two brokers at the same instant
# (both lose what they had not synced). Each is drawn from a source of its own, so the other faults of
# every seed stay what they were.
DISK_LOSS = os.environ.get("RING_SIM_DISK_LOSS", "1") != "0"
DISK_LOSS_SEEDS = 3
POWER_PAIR_SEEDS = 4


def schedule_disk_loss(seed: int, world: World, brokers: dict[str, SimBroker], joins: bool) -> list[str]:
    """One broker loses its disk (it restarts empty later), in one seed of DISK_LOSS_SEEDS."""
    rng = random.Random(f"disk-loss-{seed}")
    if not DISK_LOSS or rng.randrange(DISK_LOSS_SEEDS):
        return []
    victim = rng.choice(NAMES if joins else FIRST)
    at = WARMUP_S + rng.uniform(0, FAULTS_S - 2)
    length = rng.uniform(0.5, 6.0)
    b = brokers[victim]
    world.at(at, b.lose_disk)
    world.at(at + length, lambda: b.start() if not b.running and b.generation else None)
    return [f"{at:.2f} disk {victim} {length:.2f}s"]


def schedule_power_pair(seed: int, world: World, brokers: dict[str, SimBroker], joins: bool,
                        losses: PowerLosses) -> list[str]:
    """Two brokers lose their power together (a rack's), in one seed of POWER_PAIR_SEEDS: each crashes and
    its logs lose a random part of what it had not synced; both start again later."""
    rng = random.Random(f"power-pair-{seed}")
    if rng.randrange(POWER_PAIR_SEEDS):
        return []
    pair = rng.sample(NAMES if joins else FIRST, 2)
    at = WARMUP_S + rng.uniform(0, FAULTS_S - 2)
    length = rng.uniform(0.5, 6.0)

    def down() -> None:
        for name in pair:
            if brokers[name].running:
                for line in power_loss(world, brokers[name]):
                    world.log(line)
        losses.record(world.now)

    world.at(at, down)
    for name in pair:
        world.at(at + length, lambda b=brokers[name]: b.start() if not b.running and b.generation else None)
    return [f"{at:.2f} power-pair {'+'.join(pair)} {length:.2f}s"]


# Half the seeds that lose two brokers' power together run every broker under the ``interval`` fsync policy
# (``RING_SIM_INTERVAL=0`` keeps them all under ``always``): acknowledgements then need no fsync, and what
# two replicas had not synced can go with their power. Drawn from a source of its own too.
INTERVAL = os.environ.get("RING_SIM_INTERVAL", "1") != "0"
INTERVAL_S = limits.FSYNC_INTERVAL_MS_DEFAULT / 1000
INTERVAL_OF_PAIR_SEEDS = 2


def fsync_policy(seed: int) -> str:
    """``interval`` or ``always``, for every broker of the seed."""
    pair = not random.Random(f"power-pair-{seed}").randrange(POWER_PAIR_SEEDS)
    interval = INTERVAL and pair and not random.Random(f"fsync-{seed}").randrange(INTERVAL_OF_PAIR_SEEDS)
    return "interval" if interval else "always"


@dataclass
class Survivors:
    """What one power loss left: each partition's newest voter set then, and what each voter's files held
    right after the cut (by offset)."""

    at_s: float
    voters: dict[int, list[str]]
    held: dict[int, dict[str, dict[int, str]]]


class PowerLosses:
    """Under ``interval`` (``active``), what docs/RELIABILITY.md allows to be lost when replicas lose power:
    a record a power loss left on fewer than a majority of its partition's voters (in their files: what
    the brokers that lost power had synced, or what the cut happened to spare, and what the others had
    written). After each power loss (one broker, or two at once) the run notes what survived
    (``record``); a write is ``at_risk`` if some power loss after it started left it so. Any other loss
    of an acknowledged write fails the seed, as under ``always``, where nothing is allowed to go."""

    def __init__(self, brokers: dict[str, SimBroker], active: bool) -> None:
        self.brokers, self.active = brokers, active
        self.survivors: list[Survivors] = []

    def record(self, now: float) -> None:
        if not self.active:
            return
        voters, held = {}, {}
        for p in range(PARTITIONS):
            reps = [r for b in self.brokers.values() if b.generation and (r := b.replica(TOPIC, p)) is not None]
            if not reps:
                continue
            voters[p] = list(max(reps, key=lambda r: (r.epoch, r.voters_seq)).voters)
            held[p] = {v: on_disk(self.brokers[v].dir / "topics" / TOPIC / str(p)) for v in voters[p]}
        self.survivors.append(Survivors(now, voters, held))

    def at_risk(self, p: int, offset: int, value: str, start_s: float) -> bool:
        return any(s.at_s >= start_s and p in s.voters
                   and sum(s.held[p][v].get(offset) == value for v in s.voters[p]) < majority(len(s.voters[p]))
                   for s in self.survivors)

    def give_up(self, history: History) -> int:
        """Take the writes (and what consumers read of them) the allowance covers and the drain did not
        find out of ``history``'s checks: acknowledged ones become in doubt. Returns how many acknowledged
        writes that took."""
        final = {(r.partition, r.offset, r.value) for r in history.reads if r.source == FINAL}
        starts = {w.value: w.start_s for w in history.writes}

        def gone(p: int | None, offset: int | None, value: str) -> bool:
            return (p is not None and offset is not None and value in starts and (p, offset, value) not in final
                    and self.at_risk(p, offset, value, starts[value]))

        given = {w.value for w in history.writes if w.outcome == OK and gone(w.partition, w.offset, w.value)}
        history.writes = [dataclasses.replace(w, outcome=UNKNOWN, offset=None, partition=None)
                          if w.value in given else w for w in history.writes]
        history.reads = [r for r in history.reads if r.source != CONSUMER or not gone(r.partition, r.offset, r.value)]
        return len(given)


def heal(net: Network, brokers: dict[str, SimBroker], joined: set[str]) -> None:
    net.heal()
    net.loss = 0.0
    for name in sorted(joined):
        b = brokers[name]
        if not b.running:
            b.start()
        elif b.paused:
            b.resume()


def refused(brokers: dict[str, SimBroker], members: set[str], lost_disks: set[str]) -> set[int]:
    """Partitions that refuse writes, rightly: no replica leads, a voter of the partition is a broker whose
    disk this run took, any voter an election here found without its state is one of those
    (``no_eligible_leader``; ``unexplained`` counts the refusals no election named a voter for), and every
    other voter of the newest voter set a replica knows still holds its replica (one that closed it would
    have taken a vote its partition needs)."""
    out = set()
    for p in range(PARTITIONS):
        reps = [r for b in map(brokers.get, members) if b.running and (r := b.replica(TOPIC, p)) is not None]
        said = set().union(*(r.lost_state for r in reps)) if reps else set()
        voters = set().union(*(r.voters for r in reps)) if reps else set()
        newest = set(max(reps, key=lambda r: (r.epoch, r.voters_seq)).voters) if reps else set()
        whole = all(brokers[v].running and brokers[v].replica(TOPIC, p) is not None for v in newest - lost_disks)
        if reps and not any(r.is_leader for r in reps) and voters & lost_disks and said <= lost_disks and whole:
            out.add(p)
    return out


def unexplained(brokers: dict[str, SimBroker], members: set[str], gone: set[int]) -> list[int]:
    """The refusing partitions none of whose replicas says which voters lost their state."""
    return sorted(p for p in gone if not any(r.lost_state for b in map(brokers.get, members)
                                             if b.running and (r := b.replica(TOPIC, p)) is not None))


def settled(brokers: dict[str, SimBroker], members: set[str], skip: set[int] = frozenset()) -> bool:
    """Every partition (but those in ``skip``) has one leader, in agreement, its voters are its preference
    list, and every replica holds the whole log; only the placed brokers hold it."""
    ref = brokers[sorted(members)[0]]
    cfg = ref.catalog.get(TOPIC)
    if cfg is None or any(b.core.members.ring != ref.core.members.ring for b in map(brokers.get, members)):
        return False
    from ring.node import placement
    lists = placement.preference_lists(ref.core.members.ring, cfg)
    for p, placed in enumerate(lists):
        if p in skip:
            continue
        reps = [r for b in map(brokers.get, members) if (r := b.replica(TOPIC, p)) is not None]
        if sorted(r.self_name for r in reps) != sorted(placed):
            return False
        heads = [r for r in reps if r.is_leader]
        if len(heads) != 1 or heads[0].frozen or sorted(heads[0].voters) != sorted(placed):
            return False
        lead = heads[0]
        if any(r.leader != lead.self_name or r.epoch != lead.epoch or r.log.end_offset != lead.log.end_offset
               or r.hw != lead.hw for r in reps):
            return False
        if lead.hw != lead.log.end_offset or any(r.damaged_at is not None for r in reps):
            return False
    return True


def drain(history: History, brokers: dict[str, SimBroker], members: set[str]) -> None:
    for name in sorted(members):
        b = brokers[name]
        for rep in sorted(b.replicas(), key=lambda r: (r.topic, r.index)):
            p = rep.index
            try:
                data = rep.log.read(rep.log.start_offset, 1 << 30) if rep.log.end_offset > rep.log.start_offset else b""
            except StorageError as exc:
                history.drain_errors.append(f"{name} partition {p}: {exc.message}")
                continue
            batches = []
            for h, pos in batchfmt.scan(data):
                batches.append((h.base_offset, h.leader_epoch, h.crc, h.record_count))
                for rec in batchfmt.decode(data, pos)[1]:
                    if rec.offset < rep.hw:
                        history.reads.append(Read(FINAL, name, p, rec.offset, rec.value.decode()))
            history.replicas.append(ReplicaCopy(name, p, tuple(batches), rep.log.end_offset))


@dataclass
class Outcome:
    seed: int
    report: Report
    faults: list[str]
    settled: bool
    acked_after_heal: int
    two_leaders: list[str]
    trace: list[str] | None
    refused: list[int] = field(default_factory=list)  # partitions rightly refusing writes (no_eligible_leader)
    unexplained: list[int] = field(default_factory=list)  # of those, the ones no broker says why of
    given_up: int = 0  # acknowledged writes lost as the interval policy allows (``PowerLosses``)

    def why(self) -> str:
        r = self.report
        counts = {k: v for k, v in r.to_json().items() if k != "examples"}
        return (f"seed {self.seed}: settled={self.settled} refused={self.refused} unexplained={self.unexplained} "
                f"given_up={self.given_up} "
                f"acked_after_heal={self.acked_after_heal}\n"
                f"faults: {self.faults}\ntwo leaders: {self.two_leaders}\ncounts: {counts}\n"
                f"examples: {r.examples}")


def run(seed: int, trace: bool = False, fsync: str | None = None) -> Outcome:
    """``fsync``: the brokers' fsync policy (None: the seed's draw, ``fsync_policy``)."""
    fsync = fsync or os.environ.get("RING_SIM_FSYNC") or fsync_policy(seed)
    root = Path(tempfile.mkdtemp(prefix=f"ring-sim-{seed}-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    world = World(seed)
    world.trace = [] if trace else None
    handler = TraceHandler(world)
    if trace:
        logging.getLogger("ring").addHandler(handler)
        logging.getLogger("ring").setLevel(logging.INFO)
    net = Network(world)
    history = History()
    leaders = Leaders()
    brokers: dict[str, SimBroker] = {}
    try:
        for i, name in enumerate(NAMES):
            brokers[name] = SimBroker(world, net, name, broker_token(i), [n for n in FIRST if n != name], root, leaders,
                                      INTERVAL_S if fsync == "interval" else None)
        losses = PowerLosses(brokers, fsync == "interval")
        for name in FIRST:
            brokers[name].start()
        creator = brokers[world.rng.choice(FIRST)]
        cfg = TopicConfig.from_request({"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3},
                                       now_ms=world.clock.wall_ms())
        world.at(0.5, lambda: creator.step(PutTopic(TOPIC, cfg.to_json(), world.clock.wall_ms())))
        levels = [world.rng.choice(("quorum", "quorum", "all")) for _ in range(PARTITIONS)]
        client = Client(world, net, history, levels)
        consumer = Consumer(world, net, history)
        world.run_until(WARMUP_S / 2)
        client.start()
        consumer.start()
        joins = world.rng.random() < 0.75
        faults = [f"levels {','.join(levels)}", f"fsync {fsync}"]
        joined = set(FIRST)
        if joins:
            at = WARMUP_S + world.rng.uniform(0, FAULTS_S - 3)
            world.at(at, brokers["s-3"].start)
            joined.add("s-3")
            faults.append(f"{at:.2f} s-3 joins")
        faults += schedule_faults(world, net, brokers, joins, losses)
        faults += schedule_disk_loss(seed, world, brokers, joins)
        faults += schedule_power_pair(seed, world, brokers, joins, losses)
        lost_disks = {line.split()[2] for line in faults if line.split()[1:2] == ["disk"]}
        faults.sort(key=lambda line: float(line.split()[0]) if line[0].isdigit() else -1.0)
        heal_at = WARMUP_S + FAULTS_S
        world.run_until(heal_at)
        heal(net, brokers, joined)
        world.log("healed")
        world.run_until(heal_at + AFTER_HEAL_S)
        client.running = consumer.running = False
        deadline = world.now + SETTLE_S_MAX
        while world.now < deadline and not (client.idle and settled(brokers, joined)):
            world.run_until(world.now + 0.5)
        # Only what still refuses when every other partition had all this time to settle counts as refused.
        gone = set() if settled(brokers, joined) else refused(brokers, joined, lost_disks)
        ok_settled = client.idle and settled(brokers, joined, gone)
        drain(history, brokers, joined)
        # A refusing partition's acknowledged writes are out of reach, not lost: in doubt for the checker
        # (if read, each at its offset, once, in order); its replicas are not caught up, and what a
        # consumer read of it before is out of reach too. The partitions with a leader are checked in full.
        history.writes = [w if not (w.outcome == OK and w.partition in gone) else dataclasses.replace(
            w, outcome=UNKNOWN, offset=None, partition=None) for w in history.writes]
        history.replicas = [c for c in history.replicas if c.partition not in gone]
        history.reads = [r for r in history.reads if r.source == FINAL or r.partition not in gone]
        given_up = losses.give_up(history)
        acked_after = sum(1 for w in history.writes if w.outcome == OK and w.start_s >= heal_at + 2.0)
        return Outcome(seed, check(history), faults, ok_settled, acked_after, leaders.twice, world.trace,
                       sorted(gone), unexplained(brokers, joined, gone), given_up)
    finally:
        logging.getLogger("ring").removeHandler(handler)
        for b in brokers.values():
            b.close()
        shutil.rmtree(root, ignore_errors=True)
