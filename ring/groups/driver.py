"""The group coordinator's async driver: the offsets topic, loading shards, persisting events, the timer.

``Coordinator`` runs on every broker beside the ``ClusterBroker``. A group
belongs to offsets partition ``partition_for_key(group, P)`` of ``__offsets``
(created on first use, replicated like any topic) and is coordinated by that
partition's leader; ``locate`` says whether that is this broker, else where to
send the request (the HTTP layer proxies it to the coordinator's client port).

On the coordinator, the first request for a partition loads its ``Shard``:
it reads the partition's last record for the latest checkpoint and replays
the log from there to the end. The loaded shard is bound to the replica and
its leader epoch: if the replica is replaced, stops leading, or a new epoch
begins (a failover and back), the shard is loaded again from the log, so the
state always follows the log and a new coordinator carries on where the old
one stopped.

Changes go through ``change``: under the partition's lock, propose the events
on the current state, append them (one batch, consistency quorum, so the
commit is on a majority of the replicas before anyone is told), then apply
them. One change at a time per partition keeps memory in log order; if an
append fails or its outcome is unknown the shard is dropped and reloaded from
the log on the next request. The timer (``GROUP_TICK_MS``) expires members
whose session ran out, rebalances groups whose topics changed partition
count, forgets the committed offsets of deleted topics, writes due
checkpoints, and grows ``auto`` topics.

Deleted topics. The timer compares the catalogue's topic ids with the ones it
saw on its last tick: a topic gone, or there with another id (deleted and
created again), had its old id deleted, and every group loaded here forgets
its offsets committed for that id (a ``Forget`` event, persisted like any
change; proposing it again changes nothing). A group not loaded here then (or
a coordinator down meanwhile) keeps them in the log, where they never apply:
before each use the group is told the catalogue's ids (``Group.see_topics``)
and an offset committed for another id is not used. Reading records for
polls is ``poller.Poller``'s.

Every record appended is stamped by this broker's wall clock, and checkpoints
forget groups unused for ``GROUP_OFFSETS_RETENTION_MS`` by it: while the broker
may not use its clock (``clock_refusal``) changes are refused as a produce is
(503 ``clock_unusable``) and the timer waits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ring import limits
from ring.catalog import OFFSETS_TOPIC, TopicConfig
from ring.errors import ClockUnusable, Conflict, NotFound, Overloaded, RingError, Unavailable
from ring.groups.autogrow import AutoGrowth, demand
from ring.groups.codec import checkpoint_of
from ring.groups.group import Event, Group, Rebalance
from ring.groups.shard import Shard
from ring.hashing import partition_for_key
from ring.log import batch as batchfmt
from ring.produce import Batches, Produce

log = logging.getLogger("ring.groups")

COMMIT_CONSISTENCY = "quorum"
_REPLAY_STEP_BYTES = 4 * 1024 * 1024
_LEADER_POLL_S = 0.05  # how often a request waiting for the offsets partition's leader looks again


@dataclass(frozen=True)
class Remote:
    """The coordinator of a group is another broker."""

    name: str
    url: str


@dataclass
class Loaded:
    shard: Shard
    replica: Any  # the Replica the shard was loaded from: another object means reload
    epoch: int


def offsets_topic_config(now_ms: int) -> TopicConfig:
    return TopicConfig(name=OFFSETS_TOPIC, partitions=limits.OFFSETS_TOPIC_PARTITIONS,
                       replication_factor=limits.OFFSETS_TOPIC_REPLICATION_FACTOR,
                       retention_ms=limits.OFFSETS_TOPIC_RETENTION_MS,
                       segment_bytes=limits.OFFSETS_TOPIC_SEGMENT_BYTES,
                       consistency=COMMIT_CONSISTENCY, created_ms=now_ms)


class Coordinator:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.clock = broker.clock
        self._loaded: dict[int, Loaded] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._creating: asyncio.Task[None] | None = None
        self._timer: asyncio.Task[None] | None = None
        self._rebalanced: dict[str, asyncio.Future[None]] = {}  # group -> resolved at its next rebalance
        self.growth = AutoGrowth(round(broker.config.auto_partitions_grace_s * 1000))
        self._topic_ids: dict[str, str] | None = None  # the catalogue's topic ids at the last tick

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.create_task(self._tick_loop(), name="groups timer")

    async def close(self) -> None:
        for task in (self._timer, self._creating):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._timer, self._creating) if t is not None), return_exceptions=True)
        self._timer = self._creating = None
        for fut in self._rebalanced.values():
            if not fut.done():
                fut.set_result(None)

    # --- where groups live ---------------------------------------------------------------

    def _offsets_config(self) -> TopicConfig | None:
        return self.broker.catalog.get(OFFSETS_TOPIC) if OFFSETS_TOPIC in self.broker.catalog else None

    async def ensure_topic(self) -> TopicConfig:
        cfg = self._offsets_config()
        if cfg is not None:
            return cfg
        if self._creating is None or self._creating.done():
            self._creating = asyncio.create_task(self._create_topic(), name="create offsets topic")
        await asyncio.shield(self._creating)
        cfg = self._offsets_config()
        if cfg is None:
            raise Unavailable(f"the offsets topic {OFFSETS_TOPIC} is being created; retry")
        return cfg

    async def _create_topic(self) -> None:
        try:
            await self.broker.add_topic(offsets_topic_config(self.clock.wall_ms()))
            log.info("created the offsets topic %s", OFFSETS_TOPIC)
        except Conflict:
            pass  # another broker (or request) created it first

    def partition_of(self, group: str, cfg: TopicConfig) -> int:
        return partition_for_key(group.encode("utf-8"), cfg.partitions)

    def _replica(self, p: int) -> Any:
        get = getattr(self.broker, "replica", None)
        return get(OFFSETS_TOPIC, p) if get is not None else None

    def _leader(self, cfg: TopicConfig, p: int) -> str | None:
        leader_of = getattr(self.broker, "leader_of", None)
        if leader_of is not None:  # elected leaders: this broker's replica, or the newest claim in gossip
            return leader_of(cfg.name, p)
        rep = self._replica(p)
        if rep is not None:
            return rep.leader
        return self.broker.describe_topic(cfg.name)["partitions"][p]["leader"]

    async def locate(self, group: str, create: bool = True) -> Remote | None:
        """None when this broker coordinates ``group``, else the coordinator's address. Without
        ``create`` a cluster that has no offsets topic yet has no groups: 404."""
        if not create and self._offsets_config() is None:
            raise NotFound(f"no consumer group {group!r}", group=group)
        cfg = await self.ensure_topic()
        p = self.partition_of(group, cfg)
        leader = self._leader(cfg, p)
        waited_s = 0.0
        while leader is None and waited_s < limits.LEADER_WAIT_MS / 1000:  # a new topic, or an election
            await self.clock.sleep(_LEADER_POLL_S)
            waited_s += _LEADER_POLL_S
            leader = self._leader(cfg, p)
        me = self.broker.config.name
        if leader == me:
            return None
        membership = getattr(self.broker, "membership", None)
        if leader is None or membership is None:
            raise Unavailable(f"offsets partition {p} of group {group!r} has no leader; retry", group=group)
        url = membership.client_url(leader)
        if not membership.alive(leader) or url is None:
            raise Unavailable(f"the coordinator of group {group!r} ({leader}, leader of {OFFSETS_TOPIC}/{p}) "
                              "is down; retry once a new leader is elected", group=group, coordinator=leader)
        return Remote(leader, url)

    def led_partitions(self) -> list[int]:
        cfg = self._offsets_config()
        if cfg is None:
            return []
        return [p for p in range(cfg.partitions)
                if (rep := self._replica(p)) is not None and rep.is_leader]

    # --- loading -------------------------------------------------------------------------

    def _lock(self, p: int) -> asyncio.Lock:
        lock = self._locks.get(p)
        if lock is None:
            lock = self._locks[p] = asyncio.Lock()
        return lock

    def _current(self, p: int) -> Loaded | None:
        loaded = self._loaded.get(p)
        rep = self._replica(p)
        if loaded is None or rep is None or rep is not loaded.replica or rep.epoch != loaded.epoch \
                or not rep.is_leader or rep.deleted:
            return None
        return loaded

    async def shard(self, p: int) -> Shard:
        """This broker's shard of offsets partition ``p``, loaded if needed; 503 when not its leader."""
        loaded = self._current(p)
        if loaded is not None:
            return loaded.shard
        async with self._lock(p):
            return await self._shard_locked(p)

    async def _shard_locked(self, p: int) -> Shard:
        loaded = self._current(p)
        if loaded is not None:
            return loaded.shard
        rep = self._replica(p)
        if rep is None or not rep.is_leader:
            raise Unavailable(f"{self.broker.config.name} does not lead {OFFSETS_TOPIC}/{p}; retry",
                              partition=p)
        shard = await self._replay(rep, p)
        self._loaded[p] = Loaded(shard, rep, rep.epoch)
        for name in shard.groups:
            self._wake(name)
        return shard

    async def _replay(self, rep: Any, p: int) -> Shard:
        now = self.clock.monotonic()
        shard = Shard(p, self.clock.wall_ms())
        plog = rep.log
        start, end = plog.start_offset, plog.end_offset
        if end > start:
            _, last = batchfmt.decode(plog.read(end - 1, 1), verify=False)
            pointer = checkpoint_of(last[-1].headers)
            if pointer is not None and start <= pointer <= end:
                start = pointer
                shard.checkpoint = pointer
            elif pointer is not None:
                log.error("offsets partition %d: checkpoint %d is outside the log [%d, %d); replaying all",
                          p, pointer, start, end)
        offset, steps = start, 0
        while offset < plog.end_offset:
            offset = shard.replay_batches(plog.read(offset, _REPLAY_STEP_BYTES), offset, now)
            steps += 1
            if steps % 4 == 0:
                await self.clock.sleep(0)  # a long replay lets the loop serve others
                if rep.deleted or not rep.is_leader:
                    raise Unavailable(f"{OFFSETS_TOPIC}/{p} changed leader while loading; retry", partition=p)
        log.info("offsets partition %d loaded: %d groups from offsets %d-%d", p, len(shard.groups), start, offset)
        return shard

    # --- changing -------------------------------------------------------------------------

    async def group(self, name: str) -> tuple[int, Shard, Group | None]:
        cfg = await self.ensure_topic()
        p = self.partition_of(name, cfg)
        shard = await self.shard(p)
        g = shard.groups.get(name)
        if g is not None:
            self.see_topics(g)
        return p, shard, g

    def see_topics(self, g: Group, more: Iterable[str] = ()) -> None:
        """Tell ``g`` the catalogue's id of each topic it reads or has offsets in (and of ``more``)."""
        catalog = self.broker.catalog
        topics = g.subscribed() | {t for t, _ in g.committed} | set(more)
        g.see_topics({t: catalog.get(t).id for t in topics if t in catalog})

    async def change(self, name: str, propose: Callable[[Group], Sequence[Event] | Event | None],
                     topics: Iterable[str] = ()) -> list[Event]:
        """Propose events on the group's current state, persist them, apply them; the events. The group
        knows the ids of ``topics`` (those the change names) besides its own."""
        cfg = await self.ensure_topic()
        p = self.partition_of(name, cfg)
        async with self._lock(p):
            shard = await self._shard_locked(p)
            existing = shard.groups.get(name)
            if existing is None and len(shard.groups) >= limits.GROUPS_PER_PARTITION_MAX:
                raise Overloaded(f"offsets partition {p} already holds {limits.GROUPS_PER_PARTITION_MAX} groups")
            g = existing or Group(name)
            self.see_topics(g, topics)
            proposed = propose(g)
            events = [] if proposed is None else [proposed] if not isinstance(proposed, (list, tuple)) else list(proposed)
            if not events:
                return []
            await self._append(p, shard.records_for(name, events, self.clock.wall_ms()))
            shard.written(len(events))
            g = shard.group(name)
            self.see_topics(g, topics)
            now = self.clock.monotonic()
            for e in events:
                g.apply(e, now)
                if isinstance(e, Rebalance):
                    self._wake(name)
            return events

    def _check_clock(self) -> None:
        refusal = getattr(self.broker, "clock_refusal", None)
        if refusal is not None:
            raise ClockUnusable(refusal, broker=self.broker.config.name)

    async def _append(self, p: int, records: list[batchfmt.RecordIn]) -> Any:
        """Append records to offsets partition ``p`` as its leader; any failure drops the loaded shard."""
        self._check_clock()  # nothing appended: the shard stays
        now_ms = self.clock.wall_ms()
        batches = [batchfmt.encode(chunk, now_ms=now_ms) for chunk in _chunks(records)]
        try:
            req = Produce(OFFSETS_TOPIC, Batches(batches, len(records)), p, None, COMMIT_CONSISTENCY)
            return await self.broker.produce_as_leader(req, p, batches)
        except BaseException:
            # The records may or may not be in the log: only the log can say.
            self._loaded.pop(p, None)
            raise

    def _wake(self, group: str) -> None:
        fut = self._rebalanced.pop(group, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def rebalanced(self, group: str) -> asyncio.Future[None]:
        """A future resolved at the group's next rebalance (or when its shard is reloaded)."""
        fut = self._rebalanced.get(group)
        if fut is None or fut.done():
            fut = self._rebalanced[group] = asyncio.get_running_loop().create_future()
        return fut

    def partitions_of(self, topics: Any) -> dict[str, int]:
        catalog = self.broker.catalog
        return {t: catalog.get(t).partitions for t in topics if t in catalog}

    # --- the timer ------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        while True:
            await self.clock.sleep(limits.GROUP_TICK_MS / 1000)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except RingError as exc:
                log.info("group timer: %s", exc.message)
            except Exception:
                log.exception("group timer failed")

    async def tick(self) -> None:
        if getattr(self.broker, "clock_refusal", None) is not None:
            return  # expiries and checkpoints would be stamped, and groups forgotten, by a clock not to be used
        await self._forget_deleted_topics()
        for p in list(self._loaded):
            loaded = self._current(p)
            if loaded is None:
                self._loaded.pop(p, None)
                continue
            shard = loaded.shard
            now, now_ms = self.clock.monotonic(), self.clock.wall_ms()
            for name, g in list(shard.groups.items()):
                if g.expired(now) or g.propose_refresh(self.partitions_of(g.subscribed()), now_ms) is not None:
                    await self.change(name, lambda g: self._expire_or_refresh(g))
            if shard.checkpoint_due(now_ms):
                await self.checkpoint(p)
        await self._grow_auto_topics()

    async def _forget_deleted_topics(self) -> None:
        """Topic ids deleted since the last tick: every group loaded here forgets its offsets of them."""
        now_ids = {cfg.name: cfg.id for cfg in self.broker.catalog}
        before, self._topic_ids = self._topic_ids, now_ids
        gone = [] if before is None else [(t, tid) for t, tid in before.items() if now_ids.get(t) != tid]
        if not gone:
            return
        log.info("topics deleted: %s; forgetting their committed offsets", ", ".join(f"{t} ({i})" for t, i in gone))
        now_ms = self.clock.wall_ms()
        for shard in self.loaded_shards():
            for name, g in list(shard.groups.items()):
                if g.propose_forget(gone, now_ms) is not None:
                    try:
                        await self.change(name, lambda g: g.propose_forget(gone, self.clock.wall_ms()))
                    except RingError as exc:  # the topic id check still keeps them from applying
                        log.warning("group %s: forgetting offsets of deleted topics: %s", name, exc.message)

    async def _grow_auto_topics(self) -> None:
        """Grow ``auto`` topics some group here has had more members than partitions of, for the grace."""
        catalog = self.broker.catalog
        auto = [cfg.name for cfg in catalog if cfg.auto_partitions]
        if not auto and not self.growth._since:
            return
        wanted = demand([m.spec.topics for m in g.members.values()]
                        for shard in self.loaded_shards() for g in shard.groups.values())
        partitions = {t: catalog.get(t).partitions for t in auto}
        for topic, count in self.growth.observe(wanted, partitions, auto, self.clock.wall_ms()).items():
            log.info("growing auto topic %s from %d to %d partitions", topic, partitions[topic], count)
            try:
                await self.broker.grow_topic(topic, count)
            except RingError as exc:  # deleted meanwhile, or the cluster cannot place it now: next tick
                log.warning("growing topic %s to %d partitions: %s", topic, count, exc)

    def _expire_or_refresh(self, g: Group) -> Rebalance | None:
        now, now_ms = self.clock.monotonic(), self.clock.wall_ms()
        specs_topics = {t for m in g.members.values() for t in m.spec.topics}
        partitions = self.partitions_of(specs_topics)
        gone = g.expired(now)
        if gone:
            log.info("group %s: session of %s expired", g.name, ", ".join(gone))
        return g.propose_expire(now, now_ms, partitions) or g.propose_refresh(partitions, now_ms)

    async def checkpoint(self, p: int) -> None:
        async with self._lock(p):
            shard = await self._shard_locked(p)
            self._check_clock()  # it forgets groups by their age
            now_ms = self.clock.wall_ms()
            records, forgotten = shard.checkpoint_records(now_ms)
            if not records:
                rep = self._replica(p)
                shard.checkpointed(rep.log.end_offset, forgotten, now_ms)
                return
            result = await self._append(p, records)
            shard.checkpointed(result.base_offset, forgotten, now_ms)
            log.info("offsets partition %d: checkpoint of %d groups at offset %d",
                     p, len(records), result.base_offset)

    # --- views ----------------------------------------------------------------------------

    async def local_groups(self) -> list[tuple[Shard, Group]]:
        """Every group of every offsets partition this broker leads (loading them as needed)."""
        out = []
        for p in self.led_partitions():
            try:
                shard = await self.shard(p)
            except Unavailable:
                continue
            out.extend((shard, g) for g in shard.groups.values() if not g.dropped)
        return out

    def loaded_shards(self) -> list[Shard]:
        """The shards loaded and still led here, without loading any."""
        return [loaded.shard for p in list(self._loaded) if (loaded := self._current(p)) is not None]

    async def existing(self, name: str) -> Group:
        _, _, g = await self.group(name)
        if g is None or g.dropped:
            raise NotFound(f"no consumer group {name!r}", group=name)
        return g


def _chunks(records: list[batchfmt.RecordIn]) -> list[list[batchfmt.RecordIn]]:
    """Records cut into runs that fit in one stored batch."""
    budget = limits.BATCH_BYTES_MAX - batchfmt.HEADER_SIZE - 1024
    out: list[list[batchfmt.RecordIn]] = [[]]
    used = 0
    for rec in records:
        size = len(rec[1] or b"") + len(rec[2]) + 64
        if out[-1] and used + size > budget:
            out.append([])
            used = 0
        out[-1].append(rec)
        used += size
    return out

