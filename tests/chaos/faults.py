"""The faults a scenario injects into a running ``ChaosCluster``, each written to the history as it happens.

* ``kill`` / ``restart``: SIGKILL (a crash: the page cache survives, so
  nothing written is lost) and a start on the same data directory.
* ``pause`` / ``resume``: SIGSTOP and SIGCONT: the kernel still accepts
  connections to a stopped broker, nothing answers (a zombie).
* ``block`` / ``partition`` / ``isolate`` / ``heal``: the network's rules.
* ``torn_kill``: power loss. The broker is stopped, then killed, and the last
  segment of each of its partitions is cut at a random point after what is
  known to be on disk, then it restarts. Under ``--fsync always`` the floor
  is the replica's durable end as last seen: its own report just before the
  stop and its leaders' record of its acknowledgements just after (both only
  grow, so either is a lower bound). Under ``interval:<ms>`` anything written
  in the last interval may be unsynced: the floor is the segment's size one
  interval (plus a margin) before the stop, from a sampler that records
  every broker's last-segment sizes a few times a second.
* ``flip_bit``: one random bit of one closed segment of one replica, flipped
  in place while the broker runs (silent disk corruption).
* ``skew_clock``: a broker stopped cleanly and started again with its wall
  clock moved (libfaketime, the monotonic clock untouched), or right again.

Two observations go with the clock: ``sample_starts`` records every replica's
start offset as its broker reports it, and ``probe_timestamps`` asks every
broker for the first offset at or after a recent timestamp (before the
faults, and again after the drain).

Every fault's event text carries what is needed to reproduce it (broker,
file, position, bit). ``heal_all`` undoes whatever is still in effect.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import time
from pathlib import Path
from typing import Callable

from ring.errors import RingError
from ring.log import batch as batchfmt
from ring.log.fsync import FsyncPolicy
from tests.chaos.cluster import ChaosCluster
from tests.chaos.history import History

SAMPLE_EVERY_S = 0.05
SAMPLES_KEPT = 200  # 10 s of samples: more than any fsync interval a run uses
INTERVAL_MARGIN_S = 0.1  # the interval syncer runs a little late on a busy machine
PAUSE_BEFORE_KILL_S = 0.5  # lets acknowledgements already on the wire reach the leaders
SEGMENT_SUFFIX = ".log"


# --- pure helpers ------------------------------------------------------------------------


def position_of_offset(data: bytes, offset: int) -> int:
    """Byte position in a segment's bytes where batches at or after ``offset`` begin (whole batches only;
    the segment's size when there are none)."""
    whole = 0  # the end of the last whole batch seen
    try:
        for h, pos in batchfmt.scan(data, verify=False):
            if h.next_offset > offset:
                return pos if h.base_offset >= offset else pos + h.size
            whole = pos + h.size
    except RingError:
        return whole  # a torn tail already: nothing after the last whole batch was acknowledged
    return len(data)


def choose_cut(floor: int, size: int, rng: random.Random) -> int:
    """Where power loss ends the file: anywhere from the floor to the end."""
    floor = max(0, min(floor, size))
    return rng.randint(floor, size)


def last_segment(directory: Path) -> Path | None:
    segments = sorted(directory.glob("*" + SEGMENT_SUFFIX))
    return segments[-1] if segments else None


def closed_segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*" + SEGMENT_SUFFIX))[:-1]


def flip(path: Path, position: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())


# --- the sampler for interval fsync --------------------------------------------------------


class SizeSampler:
    """Every broker's last-segment (name, size) per partition, a few times a second, for the last few seconds."""

    def __init__(self, cluster: ChaosCluster, topic: str, partitions: int) -> None:
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.samples: collections.deque[tuple[float, dict[tuple[int, int], tuple[str, int]]]] = \
            collections.deque(maxlen=SAMPLES_KEPT)

    def sample(self) -> None:
        now, sizes = time.monotonic(), {}
        for i in range(self.cluster.size):
            for p in range(self.partitions):
                seg = last_segment(self.cluster.partition_dir(i, self.topic, p))
                if seg is not None:
                    try:
                        sizes[(i, p)] = (seg.name, seg.stat().st_size)
                    except OSError:
                        pass
        self.samples.append((now, sizes))

    async def run(self, stop: asyncio.Event) -> None:
        for _ in range(10_000_000):
            if stop.is_set():
                return
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def at(self, when: float) -> dict[tuple[int, int], tuple[str, int]]:
        """The latest sample taken at or before ``when`` (empty: none that old)."""
        best: dict[tuple[int, int], tuple[str, int]] = {}
        for t, sizes in self.samples:
            if t <= when:
                best = sizes
        return best


# --- the faults -----------------------------------------------------------------------------


class Faults:
    def __init__(self, cluster: ChaosCluster, topic: str, partitions: int, history: History,
                 rng: random.Random, now: Callable[[], float], sampler: SizeSampler | None = None) -> None:
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self.history, self.rng, self.now, self.sampler = history, rng, now, sampler
        self.killed: set[int] = set()
        self.skewed: set[int] = set()

    def event(self, text: str) -> None:
        self.history.events.append((round(self.now(), 3), text))

    def name(self, i: int) -> str:
        return self.cluster.brokers[i].name

    async def a_leader(self) -> tuple[int, int]:
        """(broker, partition): the leader of a random partition, as a live broker sees it now."""
        p = self.rng.randrange(self.partitions)
        leaders = await self.cluster.leaders(self.topic)
        return leaders.get(p, self.cluster.members[p % len(self.cluster.members)]), p

    # --- ranges ----------------------------------------------------------------------------

    def range_files(self, i: int) -> list[Path]:
        """The range copies broker i holds (ring.ranges: one segment file each)."""
        root = self.cluster.brokers[i].data_dir / "ranges" / self.topic
        return sorted(root.glob("*/*.log")) if root.exists() else []

    async def a_holder(self) -> int:
        """A running member holding range copies (any member when none holds one yet)."""
        held = [i for i in self.cluster.members if self.cluster.running(i) and self.range_files(i)]
        return self.rng.choice(held or self.cluster.members)

    def flip_range_bit(self, i: int) -> bool:
        """Flip one random bit of a random range copy broker i holds; False when it holds none."""
        files = self.range_files(i)
        if not files:
            return False
        path = self.rng.choice(files)
        size = path.stat().st_size
        position, bit = self.rng.randrange(size), self.rng.randrange(8)
        flip(path, position, bit)
        self.event(f"bit flip on {self.name(i)}: range {path.parent.name}/{path.name} byte {position} bit {bit} "
                   f"(of {size} bytes)")
        return True

    async def join(self, i: int) -> None:
        self.event(f"start {self.name(i)}: it joins the ring")
        await self.cluster.join(i)
        self.event(f"{self.name(i)} ready")

    async def decommission(self, i: int) -> bool:
        ok = await self.cluster.decommission(i)
        self.event(f"decommission {self.name(i)}" + ("" if ok else ": no broker took the request"))
        return ok

    async def retire(self, i: int) -> None:
        await self.cluster.retire(i)
        self.killed.discard(i)
        self.event(f"{self.name(i)}, decommissioned, stopped")

    async def kill(self, i: int) -> None:
        self.cluster.kill(i)
        self.killed.add(i)
        self.event(f"SIGKILL {self.name(i)}")

    async def restart(self, i: int) -> None:
        self.event(f"restart {self.name(i)}")
        await self.cluster.restart(i)
        self.killed.discard(i)
        self.event(f"{self.name(i)} ready")

    def pause(self, i: int) -> None:
        self.cluster.pause(i)
        self.event(f"SIGSTOP {self.name(i)}")

    def resume(self, i: int) -> None:
        self.cluster.resume(i)
        self.event(f"SIGCONT {self.name(i)}")

    def block(self, src: int, dst: int) -> None:
        self.cluster.network.block(src, dst)
        self.event(f"{self.name(src)} cannot reach {self.name(dst)}")

    def partition(self, a: int, b: int) -> None:
        self.cluster.network.partition(a, b)
        self.event(f"partition {self.name(a)} | {self.name(b)}")

    def isolate(self, i: int) -> None:
        self.cluster.network.isolate(i)
        self.event(f"isolate {self.name(i)} from the other brokers")

    def heal(self) -> None:
        if self.cluster.network.blocked:
            self.cluster.network.heal()
            self.event("network healed")

    async def heal_all(self) -> None:
        self.heal()
        for i in sorted(self.cluster.paused):
            self.resume(i)
        for i in sorted(self.killed):
            if i in self.cluster.members:
                await self.restart(i)
        for i in sorted(self.skewed):
            await self.skew_clock(i, None)

    # --- clocks ---------------------------------------------------------------------------

    async def skew_clock(self, i: int, offset: str | None) -> None:
        """Restart broker i (a clean stop) with its wall clock ``offset`` off (``+8d``, ``-60s``), or right."""
        self.event(f"restart {self.name(i)} with its clock {offset}" if offset else
                   f"restart {self.name(i)} with its clock right")
        await self.cluster.restart_with_clock(i, offset)
        if offset:
            self.skewed.add(i)
        else:
            self.skewed.discard(i)
        self.killed.discard(i)
        self.event(f"{self.name(i)} ready")

    async def sample_starts(self) -> None:
        """Every answering broker's report of its replicas' start offsets, into the history."""
        for j in range(self.cluster.size):
            if self.cluster.answering(j):
                for p in await self.cluster.describe(self.topic, j) or []:
                    if p.get("earliest_offset") is not None:
                        self.history.starts.append((round(self.now(), 3), self.name(j), p["partition"],
                                                    p["earliest_offset"]))

    async def probe_timestamps(self) -> None:
        """Ask every broker, on every partition, for the first offset at or after each of a few timestamps of
        the last two seconds (by this machine's clock). The first call notes the answers on which every broker
        agreed (a lagging follower's may still be its high watermark); a later call asks again and adds
        (broker, partition, timestamp, before, after) for each of them to the history."""
        probe = self.history.meta.get("timestamp_probe")
        now_ms = int(time.time() * 1000)
        stamps = probe["timestamps"] if probe else [now_ms - 1500, now_ms - 1000, now_ms - 500]
        answers: dict[tuple[int, int], dict[str, int]] = {}
        for j in range(self.cluster.size):
            if not self.cluster.answering(j):
                continue
            for p in range(self.partitions):
                for ts in stamps:
                    got = await self.cluster.offset_for_timestamp(j, self.topic, p, ts)
                    if got is not None:
                        answers.setdefault((p, ts), {})[self.name(j)] = got
        if probe is None:
            agreed = [[p, ts, a] for (p, ts), a in sorted(answers.items()) if len(set(a.values())) == 1]
            self.history.meta["timestamp_probe"] = {"timestamps": stamps, "before": agreed}
            self.event(f"offsets at {len(stamps)} timestamps noted on every broker ({len(agreed)} agreed)")
            return
        for p, ts, before in probe["before"]:
            for broker, offset in sorted(before.items()):
                after = answers.get((p, ts), {}).get(broker)
                if after is not None:
                    self.history.timestamp_answers.append((broker, p, ts, offset, after))

    # --- power loss -----------------------------------------------------------------------

    async def _durable_floors(self, i: int, own_view: list[dict] | None) -> dict[int, int]:
        """Partition -> a lower bound of broker i's durable end: its own report (taken before the stop)
        and what the live leaders recorded of its acknowledgements."""
        name = self.name(i)
        floors: dict[int, int] = {}
        for p in own_view or []:
            if p.get("replica_end_offsets", {}).get(name) is not None:
                floors[p["partition"]] = p["replica_end_offsets"][name]
        for j in range(self.cluster.size):
            if j == i or not self.cluster.answering(j):
                continue
            for p in await self.cluster.describe(self.topic, j) or []:
                seen = (p.get("replica_end_offsets") or {}).get(name)
                if p.get("leader") == self.name(j) and seen is not None:
                    floors[p["partition"]] = max(floors.get(p["partition"], 0), seen)
        return floors

    async def torn_kill(self, i: int) -> None:
        """Power loss on broker i: stop, kill, cut each partition's unsynced tail, restart."""
        await self._power_loss([i])

    async def torn_kill_domain(self, i: int) -> None:
        """Power loss on every broker of broker i's failure domain (its zone, else its host), together."""
        domain = self.cluster.domains[i]
        await self._power_loss([j for j in self.cluster.members if self.cluster.domains[j] == domain])

    async def _power_loss(self, victims: list[int]) -> None:
        """Stop every victim at once, kill them, cut each one's unsynced tails, restart them."""
        policy = FsyncPolicy.parse(self.cluster.fsync)
        views = {i: await self.cluster.describe(self.topic, i) for i in victims}
        for i in victims:
            self.pause(i)
        stopped_at = time.monotonic()
        await asyncio.sleep(PAUSE_BEFORE_KILL_S)
        floors = {i: await self._durable_floors(i, views[i]) if policy.mode == "always" else {} for i in victims}
        interval_s = (policy.interval_ms or 0) / 1000
        before = self.sampler.at(stopped_at - interval_s - INTERVAL_MARGIN_S) if self.sampler else {}
        for i in victims:
            await self.kill(i)
        for i in victims:
            self._cut_unsynced(i, policy, floors[i], before)
        for i in victims:
            await self.restart(i)

    def _cut_unsynced(self, i: int, policy: FsyncPolicy, floors: dict[int, int], before: dict) -> None:
        cuts = []
        for p in range(self.partitions):
            seg = last_segment(self.cluster.partition_dir(i, self.topic, p))
            if seg is None:
                continue
            data = seg.read_bytes()
            if policy.mode == "always":
                floor = position_of_offset(data, floors.get(p, 0)) if p in floors else len(data)
            elif policy.mode == "never":
                floor = 0  # nothing was ever forced to disk
            else:
                sampled = before.get((i, p))
                floor = sampled[1] if sampled and sampled[0] == seg.name else 0
            cut = choose_cut(floor, len(data), self.rng)
            if cut < len(data):
                os.truncate(seg, cut)
            cuts.append(f"{p}:{seg.name}@{cut}/{len(data)} (floor {floor})")
        self.event(f"power loss on {self.name(i)} ({self.cluster.fsync}): cut " + ", ".join(cuts))

    # --- bit rot -----------------------------------------------------------------------------

    async def flip_bit(self, i: int, wait_s: float) -> bool:
        """Flip one random bit in a random closed segment of a random partition of broker i (one that has
        closed segments), waiting (bounded) for one to exist. False when none appeared in time."""
        deadline = time.monotonic() + wait_s
        for _ in range(10_000):
            closed = {p: segs for p in range(self.partitions)
                      if (segs := closed_segments(self.cluster.partition_dir(i, self.topic, p)))}
            if closed or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        if not closed:
            self.event(f"no closed segment on {self.name(i)} to flip a bit in")
            return False
        p = self.rng.choice(sorted(closed))
        seg = self.rng.choice(closed[p])
        size = seg.stat().st_size
        position, bit = self.rng.randrange(size), self.rng.randrange(8)
        flip(seg, position, bit)
        self.event(f"bit flip on {self.name(i)}: partition {p} {seg.name} byte {position} bit {bit} (of {size} bytes)")
        return True
