"""Repair on a broker: anti-entropy rounds, and mending a replica's damaged batches from other replicas.

Every ``repair_interval_s`` (``ring serve --repair-interval-s``) each follower
replica asks its leader for the checksums of its committed ranges (``GET
/peer/v1/checksums/{topic}/{partition}``, cut at the leader's segment
boundaries, below both high watermarks) and checksums the same ranges of its
own log; ``entropy.plan`` says who is damaged. A leader checksums its own
committed ranges in the same round, so damage on a leader is found even when
no follower asks. Each replica remembers its digests (``entropy.Digests`` on
``Replica.sums``, dropped when its log is cut), so a round reads only what
was committed since the last and re-reads a range in full every
``REPAIR_REREAD_ROUNDS`` rounds; it reads one chunk per event-loop turn, so
requests go on between chunks.

Damage found there, or by a read that hit a batch failing its check (a
client fetch, or the leader's own replication sender), marks the replica
``damaged_at``: from then on its reads are served by another replica, never
from here, and a damaged leader hands its partition to a caught-up voter
(the node core, ``ring.node``). Each batch from there that fails its check is replaced in
place by a whole copy of the same batch, asked of the leader first, then of
the other replicas (``GET /peer/v1/replicas/{topic}/{partition}?offset=``,
``ring.repair.mend``); every other batch stays, so a copy that may be the
last whole one anywhere is never thrown away. With no copy to be had, it
asks again, and never cuts. Once no batch fails its check, the mark is
cleared. A range that differs from the leader's while every batch in it
passes its check (anti-entropy's digests) is cut instead, once the replica
does not lead: at that batch (at the start of its segment if that cut
fails), and the follower asks its leader to sync it again (``POST
/peer/v1/resync``), so replication refetches everything from there; once
its log is back at the end it had, the mark is cleared.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from ring import limits
from ring.repair import entropy, mend
from ring.repair.host import RepairHost
from ring.replication import steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.repair")

Key = tuple[str, int]
# How often a replica being repaired is looked at (cut it, ask for a sync, see it refilled).
REPAIR_POLL_S = 0.2


class Repair:
    def __init__(self, host: RepairHost, interval_s: float) -> None:
        self.host = host
        self.interval_s = interval_s
        self._loop_task: asyncio.Task[None] | None = None
        self._fixing: dict[Key, asyncio.Task[None]] = {}
        self.rounds = 0
        self.repaired = 0

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="anti-entropy")

    async def close(self) -> None:
        tasks = [t for t in (self._loop_task, *self._fixing.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def describe(self) -> list[str]:
        return sorted(f"{t}/{p}" for t, p in self._fixing)

    # --- damage ------------------------------------------------------------------------------

    def fix(self, rep: Replica, offset: int) -> None:
        """``rep`` holds a damaged batch at ``offset`` (the node core marked it: it is not served from
        here): repair it, unless that runs already."""
        key = (rep.topic, rep.index)
        if key not in self._fixing and not self.host.closing:
            log.error("%s/%d on %s: stored data damaged near offset %d; repairing from another replica",
                      rep.topic, rep.index, self.host.name, offset)
            task = asyncio.create_task(self._fix(rep), name=f"repair {rep.topic}/{rep.index}")
            self._fixing[key] = task
            task.add_done_callback(lambda t: self._fixing.pop(key, None) if self._fixing.get(key) is t else None)

    async def _fix(self, rep: Replica) -> None:
        target = rep.log.end_offset
        mended = await self._mend(rep)
        if mended is None:
            return
        if not mended and not mend.cut_away(rep) and not await self._cut(rep, target):
            return
        if not rep.deleted:
            self.host.repaired(rep)
            self.repaired += 1
            log.info("%s/%d on %s repaired up to %d", rep.topic, rep.index, self.host.name, rep.log.end_offset)

    async def _mend(self, rep: Replica) -> bool | None:
        """Mend each batch failing its check from a whole copy elsewhere (``mend``), until none is left:
        whether any was (False: none failed its check, the damage is a range that differs from the
        leader's); None: the replica went."""
        mended = False
        while not rep.deleted and rep.damaged_at is not None:
            offset, bad = rep.damaged_at, False
            while not bad and offset < rep.log.end_offset and not rep.deleted:
                offset, bad = mend.scan(rep, offset)
                await self.host.clock.sleep(0)  # one chunk at a time: requests go on meanwhile
            if not bad:
                return None if rep.deleted else mended
            data = await self._whole_copy(rep, offset)
            await self.host.wait_idle(rep)  # no fsync runs beside the write
            if data is not None and mend.put(rep, offset, data):
                mended = True
            else:
                await self.host.clock.sleep(REPAIR_POLL_S * 5)  # no whole copy reachable now: never cut, ask again
        return None

    async def _whole_copy(self, rep: Replica, offset: int) -> bytes | None:
        for name in mend.sources(rep):
            raw = await self._peer("GET", name, f"/peer/v1/replicas/{rep.topic}/{rep.index}",
                                   {"offset": str(offset), "max_bytes": "1"})
            if raw:
                return raw
        return None

    async def _cut(self, rep: Replica, target: int) -> bool:
        """Cut the log back to its damaged range and refetch it from the leader, up to ``target``; whether
        it got there."""
        while True:
            while not rep.deleted and rep.is_leader:  # a damaged leader hands over first (the node core)
                await self.host.clock.sleep(REPAIR_POLL_S)
            if rep.deleted or rep.damaged_at is None:
                return False
            await self.host.wait_idle(rep)
            if not rep.is_leader:
                break
        if rep.deleted or not steps.cut_damaged(rep):
            return False
        while not rep.deleted and rep.log.end_offset < target:
            if rep.leader is not None and not rep.is_leader:
                await self._ask_resync(rep)
            for _ in range(10):
                if rep.deleted or rep.log.end_offset >= target:
                    break
                await self.host.clock.sleep(REPAIR_POLL_S)
        return not rep.deleted

    async def _ask_resync(self, rep: Replica) -> None:
        await self._peer("POST", rep.leader, "/peer/v1/resync",
                         {"topic": rep.topic, "partition": str(rep.index)})

    # --- anti-entropy rounds -------------------------------------------------------------------

    async def _loop(self) -> None:
        interval = self.interval_s
        while True:
            await self.host.clock.sleep(interval)
            for rep in list(self.host.replicas()):
                if rep.deleted or rep.damaged_at is not None or self.host.closing:
                    continue
                try:
                    await self.check(rep)
                except Exception:  # a bug: say so, and keep checking the others
                    log.exception("anti-entropy of %s/%d failed", rep.topic, rep.index)
            self.rounds += 1

    async def sums(self, rep: Replica, upto: int) -> list[entropy.RangeSum]:
        """Checksums of this replica's committed ranges below ``upto``, cut at its segments."""
        end = min(upto, rep.hw, rep.log.end_offset)
        spans = entropy.leader_ranges(rep.log.segment_bases(), rep.log.start_offset, end, limits.REPAIR_RANGES_MAX)
        return await self._sums(rep, spans)

    def _digests(self, rep: Replica) -> entropy.Digests:
        if not isinstance(rep.sums, entropy.Digests):
            rep.sums = entropy.Digests(limits.REPAIR_REREAD_ROUNDS * self.interval_s)
        return rep.sums

    async def _sums(self, rep: Replica, spans: list[tuple[int, int]]) -> list[entropy.RangeSum]:
        digests = self._digests(rep)
        digests.keep_only({b for b, _ in spans})
        out = []
        for base, end in spans:
            if rep.deleted or not (rep.log.start_offset <= base and end <= rep.log.end_offset):
                continue
            hasher = digests.hasher(base, end, self.host.clock.monotonic())
            while not hasher.step(rep.log.read, limits.REPAIR_CHUNK_BYTES):
                await self.host.clock.sleep(0)  # one chunk at a time: requests go on meanwhile
                if rep.sums is not digests or rep.deleted:  # the log was cut (or closed) meanwhile
                    return out
            assert hasher.result is not None
            if rep.sums is not digests:
                return out
            digests.done(hasher)
            out.append(hasher.result)
        return out

    async def check(self, rep: Replica) -> entropy.Plan | None:
        """One comparison: a leader checks its own copy; a follower compares with its leader's."""
        if rep.is_leader:
            mine = await self.sums(rep, rep.hw)
            bad = next((r.base for r in mine if r.digest is None), None)
            if bad is not None:
                self.host.damaged(rep, bad)
            return None
        if rep.leader is None or not rep.aligned:
            return None
        raw = await self._peer("GET", rep.leader, f"/peer/v1/checksums/{rep.topic}/{rep.index}",
                               {"upto": str(rep.hw)})
        if raw is None:
            return None
        try:
            theirs = entropy.sums_from_wire(orjson.loads(raw), limits.REPAIR_RANGES_MAX)
        except ValueError as exc:
            log.warning("%s/%d: malformed checksums from %s: %s", rep.topic, rep.index, rep.leader, exc)
            return None
        mine = await self._sums(rep, [(r.base, r.end) for r in theirs])
        plan = entropy.plan(theirs, mine)
        if plan.truncate_at is not None:
            log.error("%s/%d: range from %d differs from leader %s's copy", rep.topic, rep.index,
                      plan.truncate_at, rep.leader)
            self.host.damaged(rep, plan.truncate_at)
        return plan

    async def _peer(self, method: str, name: str | None, path: str, params: dict[str, str]) -> bytes | None:
        client = self.host.peers
        if client is None or name is None:
            return None
        return await client.call(name, path, params=params, method=method, timeout_s=limits.PEER_REQUEST_TIMEOUT_S)

    def to_wire(self, sums: list[entropy.RangeSum]) -> list[Any]:
        return [r.to_wire() for r in sums]
