"""The clustered broker: the single broker plus membership, placement, forwarding and replication.

``ClusterBroker`` keeps the ``Broker`` API the HTTP handlers call and fills
its hooks. It holds only the partition replicas placement gives it (the
preference lists on the ring gossip knows; ``placement.py``), reconciling its
local catalogue and open logs whenever the gossiped catalogue or the ring
changes. Topics are created and deleted through the gossiped catalogue
(last writer wins) and announced to every live broker before the answer.

Produce: the leader (``protocol.choose_leader``) appends and waits until the
consistency level's number of replicas hold the batches; any other broker
frames the records and forwards the batches to the leader's peer port.
Unkeyed records go to a partition this broker leads, round-robin. Fetch:
served by this broker's replica up to its high watermark (a follower knows
the leader's from replication frames), else proxied to a live replica.
Describe shows this broker's own view: on a partition's leader,
``replica_end_offsets`` holds every replica's acknowledged end; on a
follower only its own (the others are null); where it holds no replica, the
offsets are null.

A starting broker answers 503 to client requests until membership says it
has joined (``Membership.joined``), so no broker places partitions on a ring
it has not seen yet.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from typing import Any

import aiohttp
import msgpack

from ring import limits
from ring.broker import Broker, BrokerConfig, FetchResult, ProduceResult
from ring.catalog import TopicConfig, validate_topic_name
from ring.clock import Clock
from ring.cluster import placement
from ring.cluster.membership import Membership
from ring.cluster.peers import PeerClient, make_session
from ring.errors import Conflict, RequestTimeout, Unavailable, UnknownPartition
from ring.gossip.state import EndpointState
from ring.hashing import broker_token, ordinal_from_name
from ring.log.checkpoint import read_offset, write_offset
from ring.log.fsync import write_atomically
from ring.replication import protocol
from ring.replication.leader import Streams
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")

EPOCH_FILE = "replica-epoch"  # in each partition directory: the epoch this replica last saw
HW_FILE = "high-watermarks"  # in the data directory: every replica's high watermark, saved now and then


def token_of(config: BrokerConfig) -> int:
    """--token, else the token of the name's ordinal suffix.

    A broker alone (no seeds) needs no particular token; one that joins
    others and has neither is refused (ValueError): its place on the ring
    would be a guess.
    """
    if config.token is not None:
        return config.token
    ordinal = ordinal_from_name(config.name)
    if ordinal is None:
        if not config.seeds:
            return broker_token(0)
        raise ValueError(f"broker name {config.name!r} has no ordinal suffix (like ring-0): give --token")
    return broker_token(ordinal)


class ClusterBroker(Broker):
    def __init__(self, config: BrokerConfig, clock: Clock, rng: random.Random | None = None) -> None:
        super().__init__(config, clock)
        self.name = config.name
        self.token = token_of(config)
        self.rng = rng or random.Random()
        self.client_addr = f"{config.advertise or config.host}:{config.port}"
        peer_port = config.peer_port if config.peer_port is not None else config.port + 1
        self.peer_addr = f"{config.advertise or config.peer_host}:{peer_port}"
        self.membership: Membership | None = None
        self.streams: Streams | None = None
        self.peers: PeerClient | None = None
        self._session: aiohttp.ClientSession | None = None
        self._hw_saved: dict[tuple[str, int], int] = {}
        self._reconcile_lock = asyncio.Lock()
        self._reconcile_task: asyncio.Task[None] | None = None

    def bind(self, client_port: int, peer_port: int) -> None:
        """The ports actually listened on (port 0 picks one): what gossip advertises. Before open()."""
        host = self.config.advertise
        self.client_addr = f"{host or self.config.host}:{client_port}"
        self.peer_addr = f"{host or self.config.peer_host}:{peer_port}"

    # --- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        self._open_dir()
        me = EndpointState(self.name, self.token, self.client_addr, self.peer_addr,
                           generation=self.clock.wall_ms(), status="joining")
        seeds = [s.strip() for s in self.config.seeds if s.strip()]
        self.membership = Membership(me, seeds, self.config.cluster_secret, self.clock, self.rng, self.data_dir,
                                     on_change=self._cluster_changed, load=self._load, tls=self.config.tls)
        if not self.membership.topics():
            for cfg in self.catalog:  # a data directory from before the cluster: its topics join the catalogue
                self.membership.put_topic(cfg.name, cfg.to_json())
        self._hw_saved = self._load_hws()
        for cfg in self.catalog:  # what gossip deleted or replaced meanwhile goes in the first reconcile
            self._open_topic(cfg)

    async def start(self) -> None:
        await super().start()
        assert self.membership is not None
        self._session = make_session(self.config.cluster_secret, self.config.tls)  # TLS, secret, identity
        self.peers = PeerClient(self.name, self.config.cluster_secret, self._session)
        self.streams = Streams(self.name, self.config.cluster_secret, self.clock, self._session,
                               self.membership.peer_url, self.replica)
        await self.membership.start()
        self._tasks.append(asyncio.create_task(self._hw_checkpoint_loop(), name="hw checkpoint"))
        await self._reconcile()

    async def close(self) -> None:
        self.begin_shutdown()
        if self._reconcile_task is not None:
            self._reconcile_task.cancel()
        if self.streams is not None:
            await self.streams.close()
        if self.membership is not None:
            await self.membership.close()
        if self._session is not None:
            await self._session.close()
        self._save_hws()
        await super().close()

    def _load(self) -> dict[str, Any]:
        parts = [r for ps in self._parts.values() for r in ps.values()]
        return {"disk_bytes": sum(r.log.size_bytes for r in parts),
                "partitions_led": sum(1 for r in parts if r.is_leader), "replicas": len(parts)}

    # --- placement and reconciling ---------------------------------------------------------

    def _held(self, cfg: TopicConfig) -> dict[int, list[str]]:
        assert self.membership is not None
        return placement.held(self.membership.ring, cfg, self.name)

    def _replicas(self, cfg: TopicConfig, p: int) -> list[str]:
        assert self.membership is not None
        return placement.preference_lists(self.membership.ring, cfg)[p]

    def _open_partition(self, cfg: TopicConfig, p: int, replicas: list[str]) -> Replica:
        rep = super()._open_partition(cfg, p, replicas)
        epoch_path = rep.log.directory / EPOCH_FILE
        epoch = read_offset(epoch_path)
        if epoch is None:
            epoch = max(1, rep.log.latest_epoch)  # the natural leader's first epoch
            write_offset(epoch_path, epoch)
        rep.epoch = epoch
        rep.on_hw = self._hw_moved
        return rep

    def _initial_hw(self, topic: str, p: int, replicas: list[str]) -> int | None:
        return None if len(replicas) == 1 else self._hw_saved.get((topic, p), 0)

    def set_epoch(self, rep: Replica, epoch: int) -> None:
        write_offset(rep.log.directory / EPOCH_FILE, epoch)
        rep.epoch = epoch

    def _cluster_changed(self, ring_changed: bool, topics_changed: bool) -> None:
        if self._closing:
            return
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = asyncio.create_task(self._reconcile(), name="reconcile")

    async def settle(self) -> None:
        """Wait for a reconcile that gossip started, if one runs."""
        task = self._reconcile_task
        if task is not None and not task.done():
            await asyncio.shield(task)

    async def _reconcile(self) -> None:
        """Make the local catalogue, open replicas and replication links match gossip and the ring."""
        assert self.membership is not None
        async with self._reconcile_lock:
            change = placement.catalog_change({c.name: c for c in self.catalog}, self.membership.topics())
            for name in change.remove:
                log.info("topic %s removed (deleted or recreated elsewhere)", name)
                await self._remove_topic_local(name)
            for cfg in change.add:
                if cfg.name not in self.catalog:
                    self._add_topic_local(cfg)
            for cfg in self.catalog:
                await self._replace(cfg)
            self._assign_streams()

    async def _replace(self, cfg: TopicConfig) -> None:
        """Open the partitions of ``cfg`` placement gives us, close the ones it took away."""
        held, open_ = self._held(cfg), self._parts.setdefault(cfg.name, {})
        for p, rep in list(open_.items()):
            if p not in held:
                log.info("%s/%d is no longer placed here; closing it (its data stays)", cfg.name, p)
                del open_[p]
                rep.deleted = True
                rep.wake()
                rep.fail_waiters(Unavailable(f"{cfg.name}/{p} moved to other brokers"))
                await self.commits.idle(rep)
                rep.log.close()
            elif rep.replicas != held[p]:
                rep.set_placement(held[p])
        for p, replicas in held.items():
            if p not in open_:
                self._open_partition(cfg, p, replicas)

    def _assign_streams(self) -> None:
        if self.streams is None:
            return
        wanted: dict[str, set[tuple[str, int]]] = {}
        for topic, parts in self._parts.items():
            for p, rep in parts.items():
                if rep.is_leader:
                    for f in rep.replicas[1:]:
                        wanted.setdefault(f, set()).add((topic, p))
        self.streams.assign(wanted)

    def replica(self, topic: str, partition: int) -> Replica | None:
        return self._parts.get(topic, {}).get(partition)

    def _hw_moved(self, rep: Replica) -> None:
        if rep.is_leader and self.streams is not None:
            self.streams.notify(rep)

    def _appended(self, part: Replica) -> None:
        if self.streams is not None:
            self.streams.notify(part)

    def _check_joined(self) -> None:
        self._check_open()
        if self.membership is None or not self.membership.joined:
            raise Unavailable(f"{self.name} is still joining the cluster; retry")

    # --- high watermark checkpoints ------------------------------------------------------

    def _load_hws(self) -> dict[tuple[str, int], int]:
        try:
            doc = msgpack.unpackb((self.data_dir / HW_FILE).read_bytes(), raw=False)
            return {(t, int(p)): int(hw) for t, parts in doc.items() for p, hw in parts.items()}
        except (OSError, ValueError, TypeError, AttributeError, msgpack.UnpackException):
            return {}

    def _save_hws(self) -> None:
        hws = {(t, p): r.hw for t, ps in self._parts.items() for p, r in ps.items() if r.rf > 1}
        if hws == self._hw_saved:
            return
        doc: dict[str, dict[str, int]] = {}
        for (t, p), hw in hws.items():
            doc.setdefault(t, {})[str(p)] = hw
        try:
            write_atomically(self.data_dir / HW_FILE, msgpack.packb(doc))
            self._hw_saved = hws
        except OSError as exc:
            log.error("saving high watermarks: %s", exc)

    async def _hw_checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(limits.HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS / 1000)
            self._save_hws()

    # --- topics ------------------------------------------------------------------------

    async def add_topic(self, cfg: TopicConfig) -> dict[str, Any]:
        self._check_joined()
        assert self.membership is not None
        await self.membership.announce()  # learn of a topic of that name created elsewhere
        await self._reconcile()
        if cfg.name in self.membership.topics() or cfg.name in self.catalog:
            raise Conflict(f"topic {cfg.name!r} already exists", topic=cfg.name)
        if len(self.catalog) >= limits.TOPICS_MAX:
            raise Conflict(f"the cluster already holds the maximum of {limits.TOPICS_MAX} topics")
        self.membership.put_topic(cfg.name, cfg.to_json())
        await self._reconcile()
        await self.membership.announce()  # returns once live peers have opened their replicas
        if self.streams is not None:
            self.streams.reprobe()
        return self.describe_topic(cfg.name)

    def create_topic(self, cfg: TopicConfig) -> dict[str, Any]:
        raise AssertionError("a clustered broker creates topics with add_topic")

    async def delete_topic(self, name: str) -> None:
        self._check_joined()
        assert self.membership is not None
        self.catalog.get(validate_topic_name(name))
        self.membership.delete_topic(name)
        await self._reconcile()
        await self.membership.announce()

    def _describe_partition(self, cfg: TopicConfig, p: int) -> dict[str, Any]:
        if p in self._parts.get(cfg.name, {}):
            return super()._describe_partition(cfg, p)
        replicas = self._replicas(cfg, p)
        return {"partition": p, "earliest_offset": None, "end_offset": None, "high_watermark": None,
                "leader": protocol.choose_leader(replicas) if replicas else None, "replicas": replicas,
                "epoch": None, "replica_end_offsets": {r: None for r in replicas}}

    # --- produce -------------------------------------------------------------------------

    async def _topic_for_produce(self, topic: str) -> TopicConfig:
        self._check_joined()
        return await super()._topic_for_produce(topic)

    def _unkeyed_partition(self, cfg: TopicConfig) -> int:
        led = sorted(p for p, r in self._parts.get(cfg.name, {}).items() if r.is_leader)
        n = next(self._round_robin.setdefault(cfg.name, itertools.count()))
        return led[n % len(led)] if led else n % cfg.partitions

    def _status_of(self, name: str) -> str:
        assert self.membership is not None
        return "up" if name == self.name else self.membership.status(name)

    async def _produce_partition(self, cfg: TopicConfig, p: int, batches: list[bytearray],
                                 level: str) -> ProduceResult:
        assert self.membership is not None and self.peers is not None
        replicas = self._replicas(cfg, p)
        leader = protocol.choose_leader(replicas)
        if leader == self.name:
            return await self.produce_as_leader(cfg.name, p, batches, level)
        if not self.membership.alive(leader):
            raise Unavailable(f"leader {leader} of {cfg.name}/{p} is down", topic=cfg.name, partition=p,
                              leader=leader)
        url = self.membership.peer_url(leader)
        assert url is not None
        doc = await self.peers.forward_produce(leader, url, cfg.name, p, level, batches)
        return ProduceResult(doc["topic"], doc["partition"], doc["base_offset"], doc["count"])

    async def produce_as_leader(self, topic: str, p: int, batches: list[bytearray], level: str) -> ProduceResult:
        """Append as the leader once enough replicas are alive; answer once enough hold the batches."""
        self._check_joined()
        rep = self.replica(topic, p)
        if rep is None or not rep.is_leader:
            leader = rep.leader if rep is not None else None
            raise Unavailable(f"{self.name} is not the leader of {topic}/{p} (leader: {leader}); retry",
                              topic=topic, partition=p, leader=leader)
        needed = protocol.check_alive(topic, p, protocol.count_alive(rep.replicas, self._status_of), rep.rf, level)
        result = await self._append(rep, batches)
        end = result.base_offset + result.count
        try:
            await asyncio.wait_for(asyncio.shield(rep.wait_replicas(end, needed)),
                                   limits.REPLICATION_ACK_TIMEOUT_MS / 1000)
        except TimeoutError:
            have = protocol.replicas_reaching(
                [e if e is not None else 0 for e in rep.replica_ends().values()], end)
            raise RequestTimeout(
                f"{topic}/{p}: {have} of {needed} replicas acknowledged offsets {result.base_offset}-{end - 1} "
                f"within {limits.REPLICATION_ACK_TIMEOUT_MS} ms (consistency={level}); the outcome is unknown",
                topic=topic, partition=p, acknowledged=have, needed=needed) from None
        return result

    # --- reads ---------------------------------------------------------------------------

    def _remote_partition(self, topic: str, partition: int) -> list[str] | None:
        """None when this broker holds the partition; else the client URLs of its live replicas."""
        self._check_joined()
        assert self.membership is not None
        cfg = self.catalog.get(validate_topic_name(topic))
        if not 0 <= partition < cfg.partitions:
            raise UnknownPartition(f"topic {topic!r} has partitions 0..{cfg.partitions - 1}, not {partition}",
                                   topic=topic, partition=partition)
        if partition in self._parts.get(topic, {}):
            return None
        replicas = self._replicas(cfg, partition)
        urls = [self.membership.client_url(r) for r in replicas if self.membership.alive(r)]
        if not urls:
            raise Unavailable(f"no replica of {topic}/{partition} is alive ({', '.join(replicas)})",
                              topic=topic, partition=partition)
        return [u for u in urls if u]

    async def fetch(self, topic: str, partition: int, offset: int | None, max_bytes: int,
                    wait_ms: int) -> FetchResult:
        remote = self._remote_partition(topic, partition)
        if remote is None:
            return await super().fetch(topic, partition, offset, max_bytes, wait_ms)
        assert self.peers is not None
        data, hw = await self.peers.fetch(self.rng.choice(remote), topic, partition, offset, max_bytes, wait_ms)
        return FetchResult(topic, partition, offset or 0, data, hw, -1)

    def _partition(self, topic: str, partition: int) -> Replica:
        rep = self.replica(topic, partition)
        if rep is None:
            super()._partition(topic, partition)  # UnknownTopic / UnknownPartition first
            raise Unavailable(f"{self.name} holds no replica of {topic}/{partition}; ask one that does",
                              topic=topic, partition=partition)
        return rep

    async def offsets(self, topic: str, partition: int, timestamp: str) -> dict[str, Any]:
        remote = self._remote_partition(topic, partition)
        if remote is None:
            return super().offset_for_timestamp(topic, partition, timestamp)
        assert self.peers is not None
        return await self.peers.json("GET", self.rng.choice(remote),
                                     f"/v1/topics/{topic}/partitions/{partition}/offsets", {"timestamp": timestamp})

    async def truncate(self, topic: str, partition: int, before_offset: int) -> dict[str, Any]:
        """On the leader's log; followers keep their records below it (repair will align them)."""
        self._remote_partition(topic, partition)
        cfg = self.catalog.get(topic)
        leader = protocol.choose_leader(self._replicas(cfg, partition))
        if leader == self.name:
            return await super().truncate(topic, partition, before_offset)
        assert self.membership is not None and self.peers is not None
        url = self.membership.client_url(leader)
        if url is None or not self.membership.alive(leader):
            raise Unavailable(f"leader {leader} of {topic}/{partition} is down", topic=topic, partition=partition)
        return await self.peers.json("POST", url, f"/v1/topics/{topic}/partitions/{partition}/truncate",
                                     body={"before_offset": before_offset})

    def read_replica(self, topic: str, partition: int, offset: int | None, max_bytes: int) -> tuple[bytes, int, int]:
        """This broker's own stored batches of a partition up to its log end (not the high
        watermark), for comparing replicas: (data, start offset, end offset)."""
        rep = self.replica(validate_topic_name(topic), partition)
        if rep is None:
            raise UnknownPartition(f"{self.name} holds no replica of {topic}/{partition}",
                                   topic=topic, partition=partition)
        start = rep.log.start_offset if offset is None else offset
        if start >= rep.log.end_offset:
            return b"", rep.log.start_offset, rep.log.end_offset
        return bytes(rep.log.read(start, max_bytes)), rep.log.start_offset, rep.log.end_offset

    # --- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        doc = super().status()
        if doc["status"] == "ok" and (self.membership is None or not self.membership.joined):
            doc["status"] = "joining"
        doc.update({"token": self.token, "client_addr": self.client_addr, "peer_addr": self.peer_addr,
                    "cluster_secret_set": bool(self.config.cluster_secret)})
        if self.streams is not None:
            doc["replication"] = self.streams.describe()
        return doc

    def cluster(self) -> dict[str, Any]:
        if self.membership is None:
            return super().cluster()
        return {"brokers": self.membership.brokers(), "self": self.name}
