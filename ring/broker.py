"""The broker: topics, partition logs, durability and long-polls behind one API.

``Broker`` owns a data directory (``<data_dir>/catalog.json`` and one
``PartitionLog`` per partition under ``<data_dir>/topics/<topic>/<p>/``) and
is the only thing the HTTP handlers call. It runs on one asyncio loop: log
appends and reads are synchronous calls on that loop (``os.write``/
``os.pread``, no awaits in between, so one request's batches get consecutive
offsets), and only fsyncs (and, under ``interval``, starting the kernel's
writeback early) run in threads.

Durability follows the fsync policy (``ring.replication.commit``: group
commit under ``always``, a background loop under ``interval:<ms>``, a clean
shutdown under ``never``). The high watermark of a partition (the end of what
consumers may see) is, alone, the durable end: the synced end under
``always`` and the appended end otherwise; fetches never return data at or
above it, and long-polls wake when it moves.

Retention runs on a partition's leader only (by size, and by age on this
broker's clock unless ``clock_refusal`` says it may not be used), and so do
truncations: the leader alone moves a partition's start offset, which
replication carries to the followers (``start_moved``). Records are stamped
with this broker's clock only while it may be used; else their produce is
refused (``ClockUnusable``, 503), a check of one attribute.

This class is the storage half of the broker ``ring serve`` runs
(``ring.cluster.node.ClusterBroker`` builds on it: membership, placement,
replication). What it asks of the cluster around it is a ``BrokerHost``
given at construction: which partitions are held (``held``) and the high
watermark each opens with (``initial_hw``), what happens after an append
(``appended``) or a move of a log start (``start_moved``), whether the clock
may be read (``refresh_clock``), whether something else applies a
partition's retention (``retained_elsewhere``), and how a topic is added,
changed or removed (``add_topic``, ``change_topic``, ``delete_topic``).
Where a produce, a fetch, an offsets lookup or a truncate goes is decided by
the broker's ``router`` (``ring.replication.local.Routing``):
a broker alone's serves everything here (``LocalRouter``), a clustered
broker's (``ring.cluster.routing.Router``) forwards to leaders and asks
replicas. A produce request comes in through ``intake``
(``ring.replication.intake``: its topic, partitions and batches). Partition
state lives in ``ring.replication.replica.Replica``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any, Protocol

from ring import __version__, limits
from ring.catalog import INTERNAL_TOPICS, Catalog, TopicConfig, validate_topic_name
from ring.clock import Clock
from ring.config import BrokerConfig
from ring.errors import StorageError, Unavailable, UnknownTopic
from ring.fetch import Fetch
from ring.offsets import EpochEnd, OffsetsAt, Truncate
from ring.hashing import broker_token, ordinal_from_name
from ring.log.config import LogConfig
from ring.log.datadir import DataDir
from ring.log.partition import PartitionLog
from ring.replication import steps
from ring.replication.appends import TurnAppends
from ring.replication.commit import GroupCommit
from ring.replication.idempotence import ProducerStates
from ring.replication.intake import Intake
from ring.replication.local import LocalRouter, Routing
from ring.replication.reads import Fetched, LongPolls
from ring.replication.replica import Replica

log = logging.getLogger("ring.broker")


class BrokerHost(Protocol):
    """What a ``Broker`` asks of the cluster around it (``ring.cluster.node.ClusterPolicy``)."""

    def held(self, cfg: TopicConfig) -> dict[int, list[str]]:
        """Partition -> preference list, for the partitions this broker holds."""

    def initial_hw(self, topic: str, p: int, replicas: list[str]) -> int | None:
        """High watermark of a replica as it opens (None: its whole log)."""

    def appended(self, part: Replica, durable: int | None = None) -> None:
        """Called right after batches were appended to ``part`` (replication sends them); ``durable``: its
        offsets below it are durable now (the fsync policy needs no fsync for them), else None."""

    def start_moved(self, part: Replica) -> None:
        """The leader moved ``part``'s log start offset (retention, truncation): tell the followers."""

    def refresh_clock(self) -> None:
        """Bring the broker's ``clock_refusal`` up to date before the clock is read for a decision."""

    def retained_elsewhere(self, part: Replica) -> bool:
        """Whether retention of ``part`` is applied by something else (its ranges: ring.ranges)."""

    async def add_topic(self, cfg: TopicConfig, leaders_wait_ms: int = limits.LEADER_WAIT_MS) -> dict[str, Any]:
        """Create a topic; its description, once its partitions have leaders or ``leaders_wait_ms`` passed."""

    async def change_topic(self, name: str, body: object, at_least: bool) -> dict[str, Any]:
        """Change a topic's settings; its description."""

    async def delete_topic(self, name: str) -> None: ...


class Broker:
    def __init__(self, config: BrokerConfig, clock: Clock, host: BrokerHost) -> None:
        self.config = config
        self.clock = clock
        self.host = host
        self.data_dir = Path(config.data_dir)
        self.catalog = Catalog()
        self._parts: dict[str, dict[int, Replica]] = {}
        self.long_polls = LongPolls(clock)
        self._closing = False
        self._started_monotonic = clock.monotonic()
        self.dir = DataDir(self.data_dir)
        self._tasks: list[asyncio.Task[None]] = []
        self._deleting: set[str] = set()
        self.commits = GroupCommit(config.fsync, clock)
        self.producers = ProducerStates(clock)  # idempotent producers' tables, on leaders
        self.turn = TurnAppends(self.producers)  # produces without a task: one write per partition per loop turn
        self.intake = Intake(self)  # a produce request's topic, partitions and batches
        # Where produces and reads go: here, alone; ClusterBroker's goes to leaders and replicas too.
        self.router: Routing = LocalRouter(self)
        self.previous_shutdown_clean = True
        self.metrics: Any = None  # ring.http_api.metrics.Metrics once the HTTP app installs it
        # Why this broker's wall clock may not be used now (None: it may): no record is stamped
        # with it and no time-based retention applied. ClusterBroker sets it from how its clock
        # compares with its peers' (``ring.gossip.clocks``).
        self.clock_refusal: str | None = None
        self.retention_sweeps = 0

    # --- lifecycle ----------------------------------------------------------------

    def _open_dir(self) -> None:
        catalog, self.previous_shutdown_clean = self.dir.open()
        if catalog is not None:
            self.catalog = catalog

    def _log_config(self, cfg: TopicConfig) -> LogConfig:
        # A segment smaller than the index interval (a topic may ask for 1 KiB) indexes its start only.
        return LogConfig(segment_bytes=cfg.segment_bytes, retention_ms=cfg.retention_ms,
                         retention_bytes=cfg.retention_bytes, fsync=self.config.fsync,
                         codec=cfg.compression,
                         index_interval_bytes=min(limits.INDEX_INTERVAL_BYTES, cfg.segment_bytes))

    def _open_topic(self, cfg: TopicConfig) -> None:
        self._parts[cfg.name] = {}
        self.router.forget(cfg.name)
        for p, replicas in self.host.held(cfg).items():
            self._open_partition(cfg, p, replicas)

    def _open_partition(self, cfg: TopicConfig, p: int, replicas: list[str]) -> Replica:
        directory = self.dir.partition(cfg.name, p)
        part = Replica(cfg.name, p, PartitionLog(directory, self._log_config(cfg), self.clock),
                       self.config.name, replicas, hw=self.host.initial_hw(cfg.name, p, replicas))
        part.unclean_allowed = cfg.unclean_leader_election
        self._parts[cfg.name][p] = part
        return part

    async def start(self) -> None:
        """Start the background work: interval fsyncs and retention."""
        self._tasks.append(asyncio.create_task(self._retention_loop(), name="retention"))
        if self.config.fsync.mode == "interval":
            self._tasks.append(asyncio.create_task(self.commits.interval_loop(self._all_replicas), name="fsync"))
            self._tasks.append(asyncio.create_task(self.commits.writeback_loop(self._all_replicas), name="writeback"))

    async def hand_over(self) -> None:
        """Controlled shutdown's first step; a broker alone has nobody to hand its partitions to."""

    def begin_shutdown(self) -> None:
        """Stop waiting: long-polls answer with what they have, new produces get 503."""
        self._closing = True
        for parts in self._parts.values():
            for part in parts.values():
                part.wake()

    async def close(self) -> None:
        """Finish running fsyncs, close every log cleanly and leave the clean-shutdown marker."""
        self.begin_shutdown()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        # Syncs already asked for still run, so the produces waiting on them get
        # their answer; no new append can start (check_open), so this ends.
        while busy := self.commits.busy(self._all_replicas()):
            await asyncio.wait(busy)
        clean = True
        for parts in self._parts.values():
            for part in parts.values():
                try:
                    part.log.close()
                except (OSError, StorageError) as exc:
                    clean = False
                    log.error("closing %s/%d failed: %s", part.topic, part.index, exc)
        self._parts.clear()
        self.dir.close(clean)

    @property
    def closing(self) -> bool:
        """Shutting down: no new work starts."""
        return self._closing

    @property
    def fsyncs(self) -> int:
        return self.commits.fsyncs

    def _all_replicas(self) -> list[Replica]:
        return [part for parts in self._parts.values() for part in parts.values()]

    @property
    def clean_shutdown(self) -> bool:
        """Whether the last run ended cleanly (broker marker and every log agree)."""
        return self.previous_shutdown_clean and all(
            part.log.clean_shutdown for parts in self._parts.values() for part in parts.values())

    # --- topics ------------------------------------------------------------------

    async def add_topic(self, cfg: TopicConfig, leaders_wait_ms: int = limits.LEADER_WAIT_MS) -> dict[str, Any]:
        """Create a topic (the client API's POST /v1/topics, Kafka's CreateTopics); answer once its
        partitions have leaders or after ``leaders_wait_ms`` (0: once it is created, leaders or not)."""
        return await self.host.add_topic(cfg, leaders_wait_ms)

    def _add_topic_local(self, cfg: TopicConfig) -> None:
        if cfg.name in self._deleting:
            raise Unavailable(f"topic {cfg.name!r} is being deleted; retry", topic=cfg.name)
        self.catalog.add(cfg)
        try:
            self._open_topic(cfg)
            self._save_catalog()
        except BaseException:
            self.catalog.remove(cfg.name)
            for part in self._parts.pop(cfg.name, {}).values():
                part.log.abandon()
            raise

    async def change_topic(self, name: str, body: object, at_least: bool = False) -> dict[str, Any]:
        """Change a topic's settings (the client API's PATCH /v1/topics/{topic}).

        ``at_least``: a partition count below the current one keeps the
        current one instead of being refused (growth asked for by more than one
        coordinator at once).
        """
        return await self.host.change_topic(name, body, at_least)

    async def grow_topic(self, name: str, partitions: int) -> dict[str, Any]:
        """Give a topic at least ``partitions`` partitions."""
        return await self.change_topic(name, {"partitions": partitions}, at_least=True)

    def _update_topic_local(self, cfg: TopicConfig) -> None:
        """New settings of an open topic: open logs take them at once, added partitions open."""
        old = self.catalog.get(cfg.name)
        if cfg == old:
            return
        self.catalog.replace(cfg)
        self._save_catalog()
        log_config = self._log_config(cfg)
        parts = self._parts.setdefault(cfg.name, {})
        for part in parts.values():
            part.log.config = log_config
            part.unclean_allowed = cfg.unclean_leader_election
        for p, replicas in self.host.held(cfg).items():
            if p not in parts:
                self._open_partition(cfg, p, replicas)
        if cfg.partitions != old.partitions:
            log.info("topic %s grew from %d to %d partitions", cfg.name, old.partitions, cfg.partitions)

    async def delete_topic(self, name: str) -> None:
        await self.host.delete_topic(name)

    async def _remove_topic_local(self, name: str) -> None:
        self.catalog.remove(name)
        parts = list(self._parts.pop(name).values())
        self.router.forget(name)
        self._deleting.add(name)  # no topic of this name until its files are gone
        try:
            self._save_catalog()
            for part in parts:
                steps.close(part, UnknownTopic(f"topic {name!r} was deleted", topic=name))
            for part in parts:
                await self.commits.idle(part)
                part.log.abandon()  # its files are about to go: no final fsync
            doomed = self.dir.trash_topic(name, self.clock.wall_ms())
        finally:
            self._deleting.discard(name)
        await asyncio.get_running_loop().run_in_executor(None, shutil.rmtree, doomed, True)

    def _save_catalog(self) -> None:
        self.dir.save_catalog(self.catalog)

    def list_topics(self) -> list[dict[str, Any]]:
        return [{**cfg.to_json(), "internal": cfg.name in INTERNAL_TOPICS} for cfg in self.catalog]

    def describe_topic(self, name: str) -> dict[str, Any]:
        cfg = self.catalog.get(validate_topic_name(name))
        doc = cfg.to_json()
        doc["unclean_leader_election"] = cfg.unclean_leader_election
        doc["internal"] = cfg.name in INTERNAL_TOPICS
        doc["partitions"] = [self._describe_partition(cfg, p) for p in range(cfg.partitions)]
        doc["partition_count"] = cfg.partitions
        return doc

    def _describe_partition(self, cfg: TopicConfig, p: int) -> dict[str, Any]:
        part = self._parts[cfg.name][p]
        return {"partition": part.index, "earliest_offset": part.log.start_offset,
                "end_offset": part.log.end_offset, "high_watermark": part.hw,
                "leader": part.leader, "replicas": list(part.replicas), "epoch": part.epoch,
                "replica_end_offsets": part.replica_ends(), "lost_state": part.lost_voters(),
                "unclean_elections": list(part.unclean_history)}

    def replica(self, topic: str, partition: int) -> Replica | None:
        """This broker's replica of a partition, if it holds one."""
        return self._parts.get(topic, {}).get(partition)

    def partitions_held(self, topic: str) -> dict[int, Replica]:
        return self._parts.get(topic, {})

    def replica_of(self, topic: str, partition: int) -> Replica:
        """The replica held here; UnknownTopic/UnknownPartition when there is no such partition,
        Unavailable when another broker holds it."""
        cfg = self.catalog.get(validate_topic_name(topic))
        cfg.check_partition(partition)
        rep = self.replica(topic, partition)
        if rep is None:
            raise Unavailable(f"{self.config.name} holds no replica of {topic}/{partition}; ask one that does",
                              topic=topic, partition=partition)
        return rep

    # --- routing: where produces and reads go is the router's (``self.router``) ------------

    def fetch(self, req: Fetch) -> Fetched:
        """The read at once when this broker can answer it so, else an awaitable of it (``reads.settled``)."""
        return self.router.fetch(req)

    async def offsets(self, req: OffsetsAt) -> dict[str, Any]:
        """GET .../offsets: the first offset with a timestamp at or after ``req.at``."""
        return await self.router.offsets(req)

    def epoch_end(self, req: EpochEnd) -> tuple[int, int]:
        """(epoch, end offset) of a leader epoch in the partition's log, answered by its leader alone."""
        return self.router.epoch_end(req)

    async def truncate(self, req: Truncate) -> dict[str, Any]:
        """Delete records below ``req.before_offset`` (Kafka's deleteRecords)."""
        return await self.router.truncate(req)

    def appended(self, part: Replica, end: int) -> bool:
        """Batches were appended to ``part`` up to ``end``: replication is told, and under an fsync policy
        that needs no fsync for them they are durable at once, in the same step; whether they are."""
        durable = self.commits.durable_when_written()
        self.host.appended(part, end if durable else None)
        return durable

    def check_open(self) -> None:
        if self._closing:
            raise Unavailable("the broker is shutting down")

    def check_writable(self, part: Replica) -> None:
        """The leader's append path: raise unless ``part`` may be appended to now (and the router
        agrees: in a cluster, this broker still leads it)."""
        self.check_appendable(part)
        self.router.check_writable(part)

    def check_appendable(self, part: Replica) -> None:
        """Raise unless ``part`` may be appended to. Appends go on beside a running fsync thread (the
        log locks each write, and the sync only its snapshot and bookkeeping): waiting for it would
        stall every produce to the partition for the length of the flush. Truncating and closing a
        log still wait for it (``GroupCommit.idle``)."""
        if part.deleted:
            raise UnknownTopic(f"topic {part.topic!r} was deleted", topic=part.topic)
        if part.failed:
            raise StorageError(part.failed)
        self.check_open()

    async def _retention_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.retention_interval_s)
            self.retention_sweep()

    def retention_sweep(self) -> None:
        """Apply retention to every partition led here: by size, and by age on this broker's clock
        unless it may not be used (``clock_refusal``). A partition's start offset is its leader's to
        move, within the high watermark; followers learn it through replication
        (``start_moved``) and never apply retention themselves."""
        self.host.refresh_clock()
        now_ms = None if self.clock_refusal is not None else self.clock.wall_ms()
        for part in self._all_replicas():
            if (not part.is_leader or part.running_sync is not None or part.deleted
                    or self.host.retained_elsewhere(part)):
                continue
            try:
                if part.log.enforce_retention(now_ms, upto=part.hw):
                    self.start_moved(part)
            except (OSError, StorageError) as exc:
                log.error("retention on %s/%d failed: %s", part.topic, part.index, exc)
        self.retention_sweeps += 1

    def start_moved(self, part: Replica) -> None:
        """The leader moved ``part``'s log start offset (retention, truncation): tell the followers."""
        self.host.start_moved(part)

    # --- status ------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "version": __version__,
            "status": "shutting_down" if self._closing else "ok",
            "uptime_s": round(self.clock.monotonic() - self._started_monotonic, 3),
            "topics": len(self.catalog),
            "partitions": sum(len(p) for p in self._parts.values()),
            "clean_shutdown": self.clean_shutdown,
            "fsync": str(self.config.fsync),
            "auto_create": self.config.auto_create,
            "long_polls_open": self.long_polls.open,
            "fsyncs": self.commits.fsyncs,
            "writebacks": self.commits.writebacks,
            "retention_sweeps": self.retention_sweeps,
        }

    def cluster(self) -> dict[str, Any]:
        """GET /v1/cluster of a broker alone: itself, up."""
        ordinal = ordinal_from_name(self.config.name)
        token = self.config.token if self.config.token is not None else (
            broker_token(ordinal) if ordinal is not None else None)
        url = f"{self.config.tls.scheme}://{self.config.advertise or self.config.host}:{self.config.port}"
        return {"brokers": [{"name": self.config.name, "token": token, "status": "up", "phi": 0.0,
                             "client_url": url, "peer_url": None, "generation": None,
                             "host": self.config.failure_host, "zone": self.config.zone,
                             "incarnation": self.dir.incarnation,
                             "load": {"partitions_led": sum(len(p) for p in self._parts.values())}}],
                "self": self.config.name}


def changed_config(cfg: TopicConfig, body: object, at_least: bool) -> TopicConfig:
    """``cfg`` with a change request applied; ``at_least`` turns a smaller partition count into no change."""
    if at_least and isinstance(body, dict) and type(body.get("partitions")) is int:
        body = {**body, "partitions": max(body["partitions"], cfg.partitions)}
    return cfg.changed(body)

