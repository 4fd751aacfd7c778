"""The ranges of a broker: its leaders' work every ``--range-interval-s``, and the catalogue exchange.

For every partition it leads whose topic has ``local_retention_bytes`` set
(or whose catalogue lists ranges already), each round the leader:

1. hands its catalogue to every live replica of the partition and merges
   their answers (a new leader learns what the old one wrote: ranges below
   its own log; a range it cuts again from its own log is newer and wins);
2. applies retention to the whole partition (``plan.retention_start``): the
   catalogue's start moves, ranges below it go (their holders are told), and
   the local log follows when the new start is past its own;
3. cuts new ranges from its committed closed segments, each with its size,
   checksum (read through the log, so every batch's CRC is checked) and
   newest timestamp (``plan.next_ranges``);
4. orders copies to the brokers placement names and lets go of holders no
   longer placed (``plan.holder_changes``, ``copier``);
5. saves the catalogue (fsync) before it is handed out again;
6. trims the local log (``plan.trim_point``) below what is safe in every
   voter's catalogue as it answered, so any replica that may be elected
   leader knows every range the offsets it lacks are in. The leader's new
   log start reaches the followers through replication (``hw`` frames), and
   they drop the same segments.

Anti-entropy among holders and the scrub of held copies are ``Audit``'s
(``audit.py``), reads below the local log ``Reads``' (``remote.py``): parts
that ``Ranges`` holds, each given the ranges as its owner (``AuditOwner``,
``ReadsOwner``), as the ``Copier`` is (``CopyOwner``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from typing import Any

from ring import limits
from ring.catalog import TopicConfig
from ring.errors import BadRequest, RingError, StorageError, Unavailable, UnknownTopic
from ring.log.fsync import write_atomically
from ring.ranges import placement, plan
from ring.ranges.catalogue import Catalogue, Range
from ring.ranges.audit import Audit
from ring.ranges.copier import Copier, ranges_path
from ring.ranges.host import RangesHost
from ring.ranges.remote import Reads
from ring.ranges.store import Key, RangeStore, new_hash
from ring.replication.replica import Replica

log = logging.getLogger("ring.ranges")

CATALOGUE_FILE = "ranges.catalogue"  # in the partition replica's directory
STORE_DIR = "ranges"  # in the data directory


class Ranges:
    def __init__(self, host: RangesHost) -> None:
        self.host = host  # the broker, through what the ranges use of it (ring.ranges.host)
        self.store = RangeStore(host.data_dir / STORE_DIR)
        self.copier = Copier(self)
        self.reads = Reads(self)  # fetches and offsets below the local logs
        self.audit = Audit(self)  # anti-entropy among holders, the scrub of held copies
        self._tasks: list[asyncio.Task[None]] = []
        self._term: dict[Key, int] = {}  # the epoch each partition was last led here in
        self._seen: dict[Key, dict[str, Catalogue]] = {}  # this term: each replica's catalogue as it answered
        self._handed: dict[Key, tuple[int, float]] = {}  # (catalogue seq, monotonic s) last handed to all
        self._saved: dict[Key, int] = {}  # catalogue seq last saved
        self.hw_heard: dict[Key, int] = {}
        self._pulled: dict[Key, float] = {}  # when a follower last asked its leader for the catalogue
        self.ranges_cut = 0
        self.segments_trimmed = 0
        self.rounds = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        self.store.open()

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._loop(), name="ranges"))
        self._tasks.append(asyncio.create_task(self.audit.loop(), name="ranges audit"))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.copier.close()
        self.store.close()

    # --- the catalogue of a replica ---------------------------------------------------------

    @staticmethod
    def enabled(cfg: TopicConfig) -> bool:
        return cfg.local_retention_bytes >= 0

    def catalogue(self, rep: Replica) -> Catalogue:
        """The replica's catalogue, read from its directory the first time (empty when there is none)."""
        cat = rep.catalogue
        if isinstance(cat, Catalogue):
            return cat
        try:
            cat = Catalogue.loads((rep.log.directory / CATALOGUE_FILE).read_bytes())
        except FileNotFoundError:
            cat = Catalogue()
        except (OSError, ValueError) as exc:
            log.error("%s/%d: the ranges catalogue is unreadable (%s); starting from an empty one, which the "
                      "other replicas' fill again", rep.topic, rep.index, exc)
            cat = Catalogue()
        rep.catalogue = cat
        return cat

    def save(self, rep: Replica, cat: Catalogue) -> None:
        rep.catalogue = cat
        write_atomically(rep.log.directory / CATALOGUE_FILE, cat.dumps())
        self._saved[(rep.topic, rep.index)] = cat.seq

    def _save_if_changed(self, rep: Replica) -> None:
        cat = self.catalogue(rep)
        if self._saved.get((rep.topic, rep.index)) != cat.seq:
            self.save(rep, cat)

    def retains(self, rep: Replica) -> bool:
        """Whether retention of ``rep`` is the ranges' (its topic makes them, or it has some)."""
        cfg = self.topic_config(rep.topic)
        return cfg is not None and (self.enabled(cfg) or bool(self.catalogue(rep).ranges))

    def earliest(self, rep: Replica) -> int:
        """The partition's first offset as this replica knows it: in its ranges, or in its log."""
        cat = rep.catalogue if isinstance(rep.catalogue, Catalogue) else self.catalogue(rep)
        return cat.earliest(rep.log.start_offset) if cat.ranges else rep.log.start_offset

    def created_ms(self, topic: str) -> int | None:
        cfg = self.topic_config(topic)
        return None if cfg is None else cfg.created_ms

    def topic_config(self, topic: str) -> TopicConfig | None:
        try:
            return self.host.catalog.get(topic)
        except UnknownTopic:
            return None

    def heard_hw(self, key: Key, hw: int) -> None:
        if hw > self.hw_heard.get(key, -1):
            self.hw_heard[key] = hw

    # --- the catalogue exchange (follower's side) -----------------------------------------------

    def on_catalogue(self, topic: str, partition: int, body: bytes) -> bytes:
        """A leader's catalogue: merged into ours and saved before the answer, which is the merge."""
        rep = self.host.replica(topic, partition)
        if rep is None or rep.deleted:
            raise Unavailable(f"{self.host.name} holds no replica of {topic}/{partition}", topic=topic,
                              partition=partition)
        try:
            theirs = Catalogue.loads(body)
        except ValueError as exc:
            raise BadRequest(f"malformed catalogue: {exc}") from None
        mine = self.catalogue(rep)
        merged = mine.merge(theirs)
        if merged != mine:
            self.save(rep, merged)
        return merged.dumps()

    def catalogue_bytes(self, topic: str, partition: int) -> bytes:
        """GET .../catalogue: this replica's catalogue (a follower that lacks it asks its leader)."""
        rep = self.host.replica(topic, partition)
        if rep is None or rep.deleted:
            raise Unavailable(f"{self.host.name} holds no replica of {topic}/{partition}", topic=topic,
                              partition=partition)
        return self.catalogue(rep).dumps()

    def pull_catalogue(self, rep: Replica) -> None:
        """Ask the leader for its catalogue (in the background, at most once a second per partition)."""
        key, now = (rep.topic, rep.index), self.host.clock.monotonic()
        if now - self._pulled.get(key, -1e9) < limits.RANGE_CATALOGUE_PULL_S_MIN or self.host.closing:
            return
        self._pulled[key] = now
        leader = self.host.leader_of(rep.topic, rep.index)
        if leader is None or leader == self.host.name:
            return

        async def pull() -> None:
            try:
                theirs = Catalogue.loads(await self.peer("GET", leader, ranges_path(*key) + "/catalogue"))
            except (RingError, ValueError) as exc:
                log.debug("%s/%d: asking %s for the catalogue: %s", key[0], key[1], leader, exc)
                return
            if not rep.deleted:
                merged = self.catalogue(rep).merge(theirs)
                if merged != self.catalogue(rep):
                    self.save(rep, merged)

        task = asyncio.create_task(pull(), name=f"ranges pull {key}")
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    # --- talking to other brokers ----------------------------------------------------------------

    async def peer(self, method: str, name: str, path: str, *, params: dict[str, str] | None = None,
                   body: bytes | None = None, timeout_s: float = limits.PEER_REQUEST_TIMEOUT_S) -> bytes:
        """A request to ``name``'s peer port through the broker's one peer client."""
        peers = self.host.peers
        if peers is None:
            raise Unavailable(f"{name} is not known")
        return await peers.request(method, name, path, params=params, body=body, timeout_s=timeout_s)

    # --- the leader's rounds ----------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self.host.gossip_load(self.load())  # gossiped with the node's next round
            await self.host.clock.sleep(self.host.config.range_interval_s)
            for rep in list(self.host.replicas()):
                if self.host.closing:
                    return
                if not rep.is_leader or rep.deleted:
                    continue
                cfg = self.topic_config(rep.topic)
                if cfg is None or not (self.enabled(cfg) or self.catalogue(rep).ranges):
                    continue
                try:
                    await self.lead(rep, cfg)
                except (RingError, OSError) as exc:
                    log.error("%s/%d: ranges: %s", rep.topic, rep.index, getattr(exc, "message", exc))
                except Exception:  # a bug: say so, and go on with the others
                    log.exception("%s/%d: ranges round failed", rep.topic, rep.index)
            self.rounds += 1

    async def lead(self, rep: Replica, cfg: TopicConfig) -> None:
        """One round for a partition this broker leads (see the module's docstring)."""
        key, epoch = (rep.topic, rep.index), rep.epoch
        if self._term.get(key) != epoch:
            self._term[key], self._seen[key] = epoch, {}
            self._handed.pop(key, None)
        await self._exchange(rep)
        if not self.still_leads(rep, epoch):
            return
        now_ms = None if self.host.clock_refusal is not None else self.host.clock.wall_ms()
        await self._retain(rep, cfg, now_ms)
        if self.enabled(cfg) and self.still_leads(rep, epoch):
            await self._cut(rep, cfg)
        if self.still_leads(rep, epoch):
            self._place(rep, cfg)
            self._save_if_changed(rep)
        if self.enabled(cfg) and self.still_leads(rep, epoch):
            await self._trim(rep, cfg)

    def still_leads(self, rep: Replica, epoch: int) -> bool:
        return rep.is_leader and rep.epoch == epoch and not rep.deleted

    def _live_members(self, rep: Replica) -> list[str]:
        ms = self.host.membership
        return [m for m in rep.members() if m != self.host.name and ms.alive(m)]

    async def _exchange(self, rep: Replica) -> None:
        """Hand the catalogue to the live replicas when it changed or is due again (or they have not
        answered in this term); merge their answers."""
        key = (rep.topic, rep.index)
        seen, cat = self._seen[key], self.catalogue(rep)
        members = self._live_members(rep)
        handed = self._handed.get(key)
        now = self.host.clock.monotonic()
        due = handed is None or handed[0] != cat.seq or now - handed[1] >= limits.RANGE_CATALOGUE_RESEND_S
        todo = members if due else [m for m in members if m not in seen]
        if todo:
            self._save_if_changed(rep)
            body = cat.dumps()
            answers = await asyncio.gather(*(self._hand(rep, m, body) for m in todo))
            merged = self.catalogue(rep)
            for m, theirs in zip(todo, answers):
                if theirs is not None:
                    seen[m] = theirs
                    merged = merged.merge(theirs)
            if merged != self.catalogue(rep):
                self.save(rep, merged)
            if all(a is not None for a in answers):
                self._handed[key] = (cat.seq, now)

    async def _hand(self, rep: Replica, member: str, body: bytes) -> Catalogue | None:
        try:
            raw = await self.peer("POST", member, ranges_path(rep.topic, rep.index) + "/catalogue", body=body,
                                  timeout_s=limits.RANGE_EXCHANGE_TIMEOUT_S)
            return Catalogue.loads(raw)
        except (RingError, ValueError) as exc:
            log.debug("%s/%d: handing the catalogue to %s: %s", rep.topic, rep.index, member, exc)
            return None

    async def _retain(self, rep: Replica, cfg: TopicConfig, now_ms: int | None) -> None:
        cat = self.catalogue(rep)
        closed = [plan.SegmentInfo(*s) for s in rep.log.closed_segments()]
        start = plan.retention_start(cat, closed, rep.log.start_offset, rep.log.size_bytes, rep.hw,
                                     cfg.retention_ms, cfg.retention_bytes, now_ms)
        if start is None:
            return
        await self.move_start(rep, start)

    async def move_start(self, rep: Replica, start: int) -> None:
        """The partition starts at ``start`` (retention, truncation): the catalogue first (saved, and
        handed to the replicas), then the local log; the holders of ranges wholly below let go of
        them, and those of the range holding ``start`` serve nothing below it from then on."""
        cat = self.catalogue(rep).copy()
        gone = cat.move_start(start)
        if cat.start != self.catalogue(rep).start:
            self.save(rep, cat)
            if (rep.topic, rep.index) in self._seen:
                self._handed.pop((rep.topic, rep.index), None)
                await self._exchange(rep)
        if start > rep.log.start_offset:
            await self.host.commits.idle(rep)
            if rep.is_leader and not rep.deleted and start > rep.log.start_offset:
                rep.log.truncate_before(min(start, rep.hw))
                self.host.start_moved(rep)
        for r in gone:
            for h in r.holders:
                self.let_go(rep, h, r.base)
        first = cat.ranges[0] if cat.ranges else None
        if first is not None and first.base < cat.start:  # it holds offsets below the start: not to be served
            told = [t for t in (self.tell(rep, h, "POST", "/start", {"offset": str(cat.start)}) for h in first.holders)
                    if t is not None]  # (none: every holder is this broker or down)
            if told:  # one not answering in time hears it from the next audit
                with contextlib.suppress(TimeoutError):
                    await self.host.clock.wait_for(asyncio.wait(told), limits.PEER_REQUEST_TIMEOUT_S)

    def let_go(self, rep: Replica, holder: str, base: int) -> None:
        if holder == self.host.name:
            self.store.drop((rep.topic, rep.index), base, "no longer placed here")
            return
        self.tell(rep, holder, "DELETE", "", {"base": str(base)})

    def tell(self, rep: Replica, holder: str, method: str, what: str,
              params: dict[str, str]) -> asyncio.Task[None] | None:
        """A request to a holder in the background (one that misses it hears it from the next audit)."""
        key = (rep.topic, rep.index)
        if holder == self.host.name:
            if what == "/start":
                self.store.set_start(key, int(params["offset"]))
            return None
        if not self.host.membership.alive(holder):
            return None

        async def tell() -> None:
            try:
                await self.peer(method, holder, ranges_path(*key) + what, params=params)
            except RingError as exc:
                log.debug("%s/%d: %s %s%s to %s: %s", key[0], key[1], method, what, params, holder, exc)

        task = asyncio.create_task(tell(), name=f"ranges {method} {key}")
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)
        return task

    async def _cut(self, rep: Replica, cfg: TopicConfig) -> None:
        cat = self.catalogue(rep)
        closed = [plan.SegmentInfo(*s) for s in rep.log.closed_segments()]
        copies = placement.copies_for(cfg.replication_factor, self.host.membership.ring)
        for base, end, max_ts in plan.next_ranges(cat, closed, rep.log.start_offset, rep.hw,
                                                     limits.RANGES_CUT_PER_ROUND_MAX):
            got = await self._checksum(rep, base, end)
            if got is None or self.catalogue(rep).covered_end > base or not rep.is_leader:
                return
            size, checksum = got
            cat = self.catalogue(rep)
            r = cat.add(Range(base, end, size, checksum, max_ts, copies), rep.epoch)
            self.ranges_cut += 1
            log.info("%s/%d: range %d-%d (%d bytes) cut", rep.topic, rep.index, r.base, r.end, r.size)

    async def _checksum(self, rep: Replica, base: int, end: int) -> tuple[int, str] | None:
        hasher, size = new_hash(), 0
        try:
            for chunk in self.copier.local_chunks((rep.topic, rep.index), base, end):
                hasher.update(chunk)
                size += len(chunk)
                await self.host.clock.sleep(0)  # one chunk at a time: requests go on meanwhile
        except (RingError, OSError) as exc:
            if isinstance(exc, StorageError):
                self.host.damaged(rep, base)
            log.warning("%s/%d: reading %d-%d for a range: %s", rep.topic, rep.index, base, end, exc)
            return None
        return size, hasher.hexdigest()

    def _full(self) -> set[str]:
        """Brokers that say in gossip they take no new range (free disk below their floor)."""
        out = set()
        for b in self.host.membership.brokers():
            if (b.get("load") or {}).get("ranges_full"):
                out.add(b["name"])
        if self.copier_full():
            out.add(self.host.name)
        return out

    def copier_full(self) -> bool:
        try:
            free = shutil.disk_usage(self.store.root).free
        except OSError:
            return True
        return free < self.host.config.disk_free_min_bytes

    def _place(self, rep: Replica, cfg: TopicConfig) -> None:
        ring = self.host.membership.ring
        on_ring = {n for _, n in ring.brokers}
        full = self._full()
        copies = placement.copies_for(cfg.replication_factor, ring)
        cat = self.catalogue(rep)
        for r in list(cat.ranges):
            placed = placement.holders(ring, rep.topic, rep.index, r.base, copies, full, keep=r.holders)
            copy_to, let_go = plan.holder_changes(r, placed, on_ring)
            if let_go or r.copies != copies:
                r = cat.set_holders(r.base, [h for h in r.holders if h not in let_go], rep.epoch, copies)
                for h in let_go:
                    if h in on_ring:
                        self.let_go(rep, h, r.base)
            for target in copy_to:
                if self.host.membership.alive(target):
                    self.copier.order(rep, r, target, self._sources(rep, r))

    def _sources(self, rep: Replica, r: Range) -> list[str]:
        """Where a copy of ``r`` can come from: this leader's log when it still has the offsets, then
        the live holders."""
        out = []
        if rep.log.start_offset <= r.base and r.end <= min(rep.hw, rep.log.end_offset):
            out.append(self.host.name)
        out += [h for h in r.holders if h not in out and self.host.membership.alive(h)]
        return out

    def copied(self, rep: Replica, epoch: int, r: Range, target: str) -> None:
        """``target`` holds a verified copy of ``r``: one more holder (if this leader still leads)."""
        if not self.still_leads(rep, epoch):
            return
        cat = self.catalogue(rep)
        cur = cat.get(r.base)
        if cur is None or cur.checksum != r.checksum or cur.end != r.end or target in cur.holders:
            return
        cat.set_holders(r.base, (*cur.holders, target), epoch)

    async def _trim(self, rep: Replica, cfg: TopicConfig) -> None:
        key, cat = (rep.topic, rep.index), self.catalogue(rep)
        local_start = rep.log.start_offset
        safe = cat.safe_through(local_start)
        for v in rep.voters:
            if v != self.host.name:
                theirs = self._seen[key].get(v)
                safe = min(safe, theirs.safe_through(local_start) if theirs is not None else local_start)
        closed = [plan.SegmentInfo(*s) for s in rep.log.closed_segments()]
        new = plan.trim_point(closed, rep.log.size_bytes, cfg.local_retention_bytes, min(safe, rep.hw))
        if new is None or new <= local_start:
            return
        await self.host.commits.idle(rep)
        if rep.is_leader and not rep.deleted and new > rep.log.start_offset:
            before = rep.log.segment_count
            rep.log.truncate_before(new)
            self.segments_trimmed += before - rep.log.segment_count
            log.info("%s/%d: the local log starts at %d; what is below is in ranges", rep.topic, rep.index, new)
            self.host.start_moved(rep)

    # --- what to show -------------------------------------------------------------------------------

    def describe(self, rep: Replica) -> dict[str, Any]:
        """GET .../ranges on a replica: every range, where it lives, and whether this replica's log
        still has it."""
        cat = self.catalogue(rep)
        local = rep.log.start_offset
        return {"topic": rep.topic, "partition": rep.index, "earliest_offset": self.earliest(rep),
                "local_start_offset": local,
                "ranges": [{"base_offset": r.base, "end_offset": r.end, "bytes": r.size, "holders": list(r.holders),
                            "copies": r.copies, "local": r.base >= local, "checksum": r.checksum,
                            "max_timestamp": r.max_timestamp} for r in cat.ranges]}

    def load(self) -> dict[str, Any]:
        """What gossip says of this broker's ranges: bytes held, free disk (MiB-rounded, so the value
        changes only when it moves), and whether it takes new ranges."""
        try:
            free = shutil.disk_usage(self.store.root).free
        except OSError:
            free = 0
        return {"range_bytes": self.store.bytes, "disk_free_bytes": free >> 20 << 20,
                "ranges_full": free < self.host.config.disk_free_min_bytes}

    def status(self) -> dict[str, Any]:
        return {"held": sum(len(self.store.ranges(k)) for k in self.store.keys()), "held_bytes": self.store.bytes,
                "served_bytes": self.reads.bytes_served,
                "cut": self.ranges_cut, "copied_in": self.copier.copies_in, "trimmed_segments": self.segments_trimmed,
                "damaged_dropped": self.store.dropped, "refused_full": self.copier.refused_full,
                "full": self.copier_full()}
