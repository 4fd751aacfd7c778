"""The simulated disk under a broker's real partition logs: how long an fsync takes, what a power loss takes back.

The logs are real files (``PartitionLog`` under a temporary directory), so
what is written is really written and recovery on restart is ring's own.
What is simulated is time and loss: an fsync a Ready asks for runs a few
milliseconds later and covers every append made until then (group commit);
a crash keeps what was written (the page cache survives a SIGKILL); a power
loss also cuts the newest segment of each log at a random byte past what was
synced: whole batches gone, or one torn in the middle, which recovery must
cut off. Files replaced atomically (ballots, membership's state) were synced
when written and survive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ring.replication.replica import Replica

if TYPE_CHECKING:
    from tests.sim.broker import SimBroker
    from tests.sim.network import World

FSYNC_S = (0.001, 0.01)


class Disk:
    def __init__(self, world: World, broker: SimBroker) -> None:
        self.world = world
        self.broker = broker
        self._pending: set[Replica] = set()

    def sync_soon(self, rep: Replica) -> None:
        """An fsync of ``rep`` that starts a little later and covers every append until then."""
        if rep in self._pending:
            return
        self._pending.add(rep)
        gen = self.broker.generation
        self.world.after(self.world.rng.uniform(*FSYNC_S), lambda: self._sync(rep, gen))

    def _sync(self, rep: Replica, gen: int) -> None:
        if not self.broker._live(gen):
            self._pending.discard(rep)
            return  # the broker crashed first: this fsync never ran
        if self.broker.paused:  # stopped with the process; runs once it resumes
            self.world.after(0.05, lambda: self._sync(rep, gen))
            return
        self._pending.discard(rep)
        if rep.deleted:
            return
        rep.log.sync()
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
