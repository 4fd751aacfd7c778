"""The simulated disk under a broker's real partition logs: how long an fsync takes, what a power loss takes back.

The logs are real files (``PartitionLog`` under a temporary directory), so
what is written is really written and recovery on restart is ring's own.
What is simulated is time and loss: an fsync a Ready asks for runs a few
milliseconds later and covers every append made until then (group commit);
a crash keeps what was written (the page cache survives a SIGKILL); a power
loss also cuts the newest segment of each log at a random byte past what was
synced: whole batches gone, or one torn in the middle, which recovery must
cut off. Files replaced atomically (ballots, membership's state) were synced
when written and survive. A bit flip changes one bit of one committed batch
of one replica on disk; ``Repair`` does what ring/repair/driver.py does on a
broker, on the world's time: scrub rounds read every committed batch with
its checks (anti-entropy's reads), and a damaged replica mends each batch
failing its check in place from a whole copy on another replica
(``ring.repair.mend``), keeping every other batch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ring.errors import CorruptBatch, StorageError
from ring.log import batch as batchfmt
from ring.node import ready as m
from ring.repair import mend
from ring.replication import steps
from ring.replication.replica import Replica

if TYPE_CHECKING:
    from tests.sim.broker import SimBroker
    from tests.sim.network import World

FSYNC_S = (0.001, 0.01)
SCRUB_S = 2.0  # between scrub rounds (anti-entropy's, scaled down to the run)
REPAIR_POLL_S = 0.1


class Disk:
    def __init__(self, world: World, broker: SimBroker) -> None:
        self.world = world
        self.broker = broker
        self._pending: dict[Replica, int] = {}  # replica -> the number of its fsync asked for, not run yet
        self._asked: dict[Replica, int] = {}
        self._done: dict[Replica, int] = {}  # replica -> the number of its last fsync that finished

    def sync_soon(self, rep: Replica) -> int:
        """An fsync of ``rep`` that starts a little later and covers every append until then; its number
        (``synced`` says when it finished), as ``Commits.sync_soon`` gives a future."""
        if rep in self._pending:
            return self._pending[rep]
        number = self._pending[rep] = self._asked[rep] = self._asked.get(rep, 0) + 1
        gen = self.broker.generation
        self.world.after(self.world.rng.uniform(*FSYNC_S), lambda: self._sync(rep, gen))
        return number

    def synced(self, rep: Replica, number: int) -> bool:
        """Whether fsync ``number`` of ``rep`` finished (whatever the log's end is by then: a cut may have
        taken back what it covered, and the answers waiting for it go all the same)."""
        return self._done.get(rep, 0) >= number

    def _sync(self, rep: Replica, gen: int) -> None:
        if not self.broker.live(gen):
            self._pending.pop(rep, None)
            return  # the broker crashed first: this fsync never ran
        if self.broker.paused:  # stopped with the process; runs once it resumes
            self.world.after(0.05, lambda: self._sync(rep, gen))
            return
        number = self._pending.pop(rep)
        if rep.deleted:
            return
        rep.log.sync()
        self._done[rep] = number
        self.broker.durable(rep)


def power_loss(world: World, b: SimBroker) -> list[str]:
    """Crash ``b``, then cut the newest segment of each of its logs at a random byte past what it had
    synced; what was cut, for the trace."""
    unsynced = {rep.log.directory: rep.log.unsynced_bytes for rep in b.replicas()}
    b.crash()
    cuts = []
    for directory, nbytes in sorted(unsynced.items()):
        segs = sorted(directory.glob("*.log"))
        if not segs or not nbytes:
            continue
        raw = segs[-1].read_bytes()
        synced_at = max(0, len(raw) - nbytes)
        cut = world.rng.randint(synced_at, len(raw))
        with open(segs[-1], "r+b") as f:
            f.truncate(cut)
        cuts.append(f"{b.name} loses {len(raw) - cut} bytes of {directory.parent.name}/{directory.name}")
    return cuts


def on_disk(directory: Path) -> dict[int, str]:
    """The records a replica's files hold now, by offset (each segment read up to its first bad or torn
    batch): what survives once a power loss cut them."""
    held: dict[int, str] = {}
    for seg in sorted(directory.glob("*.log")):
        raw = seg.read_bytes()
        try:
            for _, pos in batchfmt.scan(raw):
                for rec in batchfmt.decode(raw, pos)[1]:
                    held[rec.offset] = rec.value.decode()
        except CorruptBatch:
            pass
    return held


def bit_flip(world: World, b: SimBroker) -> str | None:
    """Flip one bit in the payload of a committed batch of a random replica of ``b``; what, for the trace."""
    reps = sorted((r for r in b.replicas() if r.hw > r.log.start_offset), key=lambda r: (r.topic, r.index))
    if not reps:
        return None
    rep = world.rng.choice(reps)
    segs = sorted(rep.log.directory.glob("*.log"))
    path = segs[0] if segs else None
    raw = path.read_bytes() if path is not None else b""
    batches = [(h, pos) for h, pos in batchfmt.scan(raw, verify=False)
               if h.next_offset <= rep.hw and h.size > batchfmt.HEADER_SIZE]
    if path is None or not batches:
        return None
    h, pos = world.rng.choice(batches)
    at = pos + batchfmt.HEADER_SIZE + world.rng.randrange(h.size - batchfmt.HEADER_SIZE)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([raw[at] ^ (1 << world.rng.randrange(8))]), at)
    finally:
        os.close(fd)
    return f"{b.name} flips a bit of {rep.topic}/{rep.index} at offset {h.base_offset}"


class Repair:
    def __init__(self, world: World, broker: SimBroker) -> None:
        self.world = world
        self.broker = broker
        self.fixing: set[Replica] = set()

    def scrub(self, gen: int) -> None:
        """One round: every committed batch of every replica read with its checks; damage is stepped in."""
        b = self.broker
        if not b.live(gen):
            return
        self.world.after(SCRUB_S, lambda: self.scrub(gen))
        if b.paused:
            return
        for rep in b.replicas():
            offset = rep.log.start_offset
            try:
                while rep.damaged_at is None and offset < min(rep.hw, rep.log.end_offset):
                    data = rep.log.read(offset, 1 << 16, upto=rep.hw)
                    for h, _ in batchfmt.scan(data, verify=False):
                        offset = h.next_offset
            except StorageError as exc:
                b.step(m.Damaged(rep, exc.extra.get("offset", offset)))

    def fix(self, rep: Replica) -> None:
        """``rep`` is damaged (the node core marked it): mend each batch failing its check from a whole copy
        on another replica (``ring.repair.mend``, as ring/repair/driver.py does); if none fails its check,
        cut it back once it does not lead, then wait for its leader to send the rest again."""
        if rep not in self.fixing:
            self.fixing.add(rep)
            self._mend(rep, rep.log.end_offset, self.broker.generation, False)

    def _gone(self, rep: Replica, gen: int) -> bool:
        b = self.broker
        if not b.live(gen) or rep.deleted or b.replica(rep.topic, rep.index) is not rep or rep.damaged_at is None:
            self.fixing.discard(rep)
            return True
        return False

    def _mend(self, rep: Replica, target: int, gen: int, mended: bool) -> None:
        if self._gone(rep, gen):
            return
        if self.broker.paused:
            self.world.after(REPAIR_POLL_S, lambda: self._mend(rep, target, gen, mended))
            return
        offset, bad = rep.damaged_at, False
        while not bad and offset < rep.log.end_offset:
            offset, bad = mend.scan(rep, offset)
        if not bad:
            if mended or mend.cut_away(rep):
                self.fixing.discard(rep)
                self.broker.step(m.Repaired(rep))
            else:
                self._fix(rep, target, gen, 0)
            return
        self._ask(rep, offset, target, gen, mended, mend.sources(rep))

    def _ask(self, rep: Replica, offset: int, target: int, gen: int, mended: bool, names: list[str]) -> None:
        """Ask ``names`` in turn for a whole copy of the batch holding ``offset``, and mend with the first."""
        if not names:
            self.world.after(REPAIR_POLL_S, lambda: self._mend(rep, target, gen, mended))
            return

        def got(data: bytes | None) -> None:
            if self._gone(rep, gen):
                return
            if not data:
                self._ask(rep, offset, target, gen, mended, names[1:])
            elif self.broker.paused:
                self.world.after(REPAIR_POLL_S, lambda: got(data))
            else:
                ok = mend.put(rep, offset, data)
                self.world.after(0 if ok else REPAIR_POLL_S, lambda: self._mend(rep, target, gen, mended or ok))
        b = self.broker
        b.net.call(b.name, names[0], ("replica", (rep.topic, rep.index, offset)), REPAIR_POLL_S * 5, got)

    def _fix(self, rep: Replica, target: int, gen: int, tries: int) -> None:
        b = self.broker
        if self._gone(rep, gen):
            return
        if rep.is_leader or b.paused:  # a damaged leader hands over first
            self.world.after(REPAIR_POLL_S, lambda: self._fix(rep, target, gen, tries))
            return
        if tries == 0 and not steps.cut_damaged(rep):
            self.fixing.discard(rep)
            return
        if rep.log.end_offset >= target:
            self.fixing.discard(rep)
            b.step(m.Repaired(rep))
            return
        if tries % 10 == 0 and rep.leader is not None:
            b.net.call(b.name, rep.leader, ("resync", (rep.topic, rep.index)), REPAIR_POLL_S * 5, lambda _: None)
        self.world.after(REPAIR_POLL_S, lambda: self._fix(rep, target, gen, tries + 1))
