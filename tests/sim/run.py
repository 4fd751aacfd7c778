"""One seeded simulation run: four brokers, producers, faults, healing, the final drain, the chaos checker.

``run(seed)`` builds the world from the seed alone: four ``SimBroker``s, two
partitions placed on the first three (replication factor 3), in most seeds a
membership change (one partition's replica on a broker is moved to the
fourth, which becomes its natural leader; each broker learns the new
preference list at its own moment, as gossip would tell it), a client with three
producers writing unique values at consistency quorum (each to its own
partition, retrying through the leader a refusal names), and a schedule of
faults drawn from the seed over the first ``FAULTS_S`` seconds: crashes
(restarted later on the same files), power losses (a crash that also cuts
each of the broker's logs at a random batch past what it had synced), pauses (SIGSTOP, then
SIGCONT with the queued messages), cuts between brokers both ways or one
way, and spells of message loss (which also break replication links). Then everything heals,
the producers go on for a while (the cluster must be writable again), stop,
and once every partition has one leader that every replica has caught up
with, each broker's log is read to its high watermark (the final drain) and
every replica's batches are listed. The history goes through the same
checker as the chaos harness (tests/chaos/checker.py).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ring.log import batch as batchfmt
from tests.chaos.checker import Report, check
from tests.chaos.history import FAIL, FINAL, OK, UNKNOWN, History, Read, ReplicaCopy, Write
from tests.sim.broker import SimBroker
from tests.sim.network import Network, World

NAMES = ["n0", "n1", "n2", "n3"]
PLACED = ["n0", "n1", "n2"]  # where both partitions start
KEYS = [("t", 0), ("t", 1)]
PRODUCERS = 3
WARMUP_S = 1.5
FAULTS_S = 12.0
AFTER_HEAL_S = 9.0  # producers go on this long after healing (longer than a produce's own timeout)
SETTLE_S_MAX = 40.0
CLIENT_TIMEOUT_S = 6.0


@dataclass
class Producer:
    index: int
    key: tuple[str, int]
    seq: int = 0
    target: str | None = None
    busy: bool = False


@dataclass
class Client:
    """Producers of unique values; each writes one record at a time and records the outcome."""

    world: World
    net: Network
    history: History
    producers: list[Producer] = field(default_factory=list)
    running: bool = True
    _rid: int = 0
    _waiting: dict[int, tuple[Producer, str, float, str]] = field(default_factory=dict)
    name: str = "client"

    def start(self) -> None:
        self.net.nodes[self.name] = self
        for i in range(PRODUCERS):
            p = Producer(i, KEYS[i % len(KEYS)])
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
        self.net.request(self.name, target, ("produce", rid, p.key, value))
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
                                         p.key[1] if outcome == OK else None, offset, broker, status))
        self.world.log(f"client: {value} -> {outcome} {offset} from {broker}")
        p.busy = False
        delay = self.world.rng.uniform(0.1, 0.4) if outcome == OK else self.world.rng.uniform(0.1, 0.5)
        self.world.after(delay, lambda: self._next(p))

    @property
    def idle(self) -> bool:
        return not self._waiting


def power_loss(world: World, b: SimBroker) -> None:
    """Crash, then cut the tail of each of its logs at a random batch boundary past what it had synced."""
    unsynced = {key: rep.log.unsynced_bytes for key, rep in b.reps.items()}
    b.crash()
    for t, p in KEYS:
        segs = sorted((b.dir / t / str(p)).glob("*.log"))
        if not segs or (t, p) not in unsynced:  # not held now: closed cleanly, synced
            continue
        raw = segs[-1].read_bytes()
        synced_at = max(0, len(raw) - unsynced[(t, p)])
        cuts = [pos for _, pos in batchfmt.scan(raw, verify=False) if pos >= synced_at] + [len(raw)]
        cut = world.rng.choice(cuts)
        with open(segs[-1], "r+b") as f:
            f.truncate(cut)
        world.log(f"{b.name} loses {len(raw) - cut} bytes of {t}/{p}")


def schedule_faults(world: World, net: Network, brokers: dict[str, SimBroker]) -> list[str]:
    """Draw the faults of this seed; returns what was scheduled, for the report."""
    rng, plan = world.rng, []
    kinds = ["crash", "pause", "cut", "one-way", "loss", "power"]
    for _ in range(rng.randint(2, 6)):
        at = WARMUP_S + rng.uniform(0, FAULTS_S - 2)
        victim = rng.choice(NAMES)
        kind = rng.choice(kinds)
        length = rng.uniform(0.5, 9.0)
        plan.append(f"{at:.2f} {kind} {victim} {length:.2f}s")
        b = brokers[victim]
        if kind in ("crash", "power"):
            world.at(at, b.crash if kind == "crash" else lambda b=b: power_loss(world, b))
            world.at(at + length, lambda b=b: b.start() if not b.running else None)
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
    return sorted(plan, key=lambda line: float(line.split()[0]))


def schedule_move(world: World, brokers: dict[str, SimBroker]) -> list[str]:
    """Most seeds: move one partition's replica from a broker to the fourth, which goes first in its list."""
    rng = world.rng
    if rng.random() < 0.25:
        return []
    key, gone = rng.choice(KEYS), rng.choice(PLACED)
    new = ["n3"] + [n for n in PLACED if n != gone]
    at = WARMUP_S + rng.uniform(0, FAULTS_S - 3)
    for b in brokers.values():  # each learns it at its own moment
        world.at(at + rng.uniform(0, 2.0), lambda b=b: b.set_placement(key, new))
    return [f"{at:.2f} move {key[0]}/{key[1]} from {gone} to n3: {','.join(new)}"]


def heal(net: Network, brokers: dict[str, SimBroker]) -> None:
    net.heal()
    net.loss = 0.0
    for b in brokers.values():
        if not b.running:
            b.start()
        elif b.paused:
            b.resume()


def settled(brokers: dict[str, SimBroker]) -> bool:
    """Every partition has one leader, in agreement, its voters are its preference list, and every replica
    holds the whole log; only the placed brokers hold it."""
    for key in KEYS:
        placed = brokers[NAMES[0]].placement[key]
        if any(b.placement[key] != placed for b in brokers.values()):
            return False
        reps = [b.reps[key] for b in brokers.values() if key in b.reps]
        if sorted(r.self_name for r in reps) != sorted(placed):
            return False
        heads = [r for r in reps if r.is_leader]
        if len(heads) != 1 or heads[0].frozen or sorted(heads[0].voters) != sorted(placed):
            return False
        lead = heads[0]
        if any(r.leader != lead.self_name or r.epoch != lead.epoch or r.log.end_offset != lead.log.end_offset
               or r.hw != lead.hw for r in reps):
            return False
        if lead.hw != lead.log.end_offset:
            return False
    return True


def drain(history: History, brokers: dict[str, SimBroker]) -> None:
    for name, b in sorted(brokers.items()):
        for (t, p), rep in sorted(b.reps.items()):
            data = rep.log.read(rep.log.start_offset, 1 << 30) if rep.log.end_offset > rep.log.start_offset else b""
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
    trace: list[str] | None

    def why(self) -> str:
        r = self.report
        counts = {k: v for k, v in r.to_json().items() if k != "examples"}
        return (f"seed {self.seed}: settled={self.settled} acked_after_heal={self.acked_after_heal}\n"
                f"faults: {self.faults}\ncounts: {counts}\nexamples: {r.examples}")


def run(seed: int, trace: bool = False) -> Outcome:
    root = Path(tempfile.mkdtemp(prefix=f"ring-sim-{seed}-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    world = World(seed)
    world.trace = [] if trace else None
    net = Network(world)
    history = History()
    try:
        brokers = {n: SimBroker(world, net, n, NAMES, KEYS, root, PLACED) for n in NAMES}
        client = Client(world, net, history)
        world.run_until(WARMUP_S / 2)
        client.start()
        faults = sorted(schedule_faults(world, net, brokers) + schedule_move(world, brokers),
                        key=lambda line: float(line.split()[0]))
        heal_at = WARMUP_S + FAULTS_S
        world.run_until(heal_at)
        heal(net, brokers)
        world.log("healed")
        world.run_until(heal_at + AFTER_HEAL_S)
        client.running = False
        deadline = world.now + SETTLE_S_MAX
        while world.now < deadline and not (client.idle and settled(brokers)):
            world.run_until(world.now + 0.5)
        ok_settled = client.idle and settled(brokers)
        drain(history, brokers)
        acked_after = sum(1 for w in history.writes if w.outcome == OK and w.start_s >= heal_at + 2.0)
        return Outcome(seed, check(history), faults, ok_settled, acked_after, world.trace)
    finally:
        for b in net.nodes.values():
            if isinstance(b, SimBroker):
                b.close()
        shutil.rmtree(root, ignore_errors=True)
