"""The clustered broker: the single broker plus membership, placement, forwarding and replication.

``ClusterBroker`` keeps the ``Broker`` API the HTTP handlers call and gives
its storage half a ``ClusterPolicy`` (the ``BrokerHost`` it asks what is held,
and through which appends, start moves and topic changes reach the cluster);
where its produces and reads go is its ``router``'s (``routing.py``). It
holds the partition replicas placement gives it (the preference lists on
the ring gossip knows; ``placement.py``), and those placed elsewhere that
it still leads or votes for (``NodeCore.keep``; as it starts, the ones
whose saved voter set names it), reconciling its local
catalogue and open logs whenever the gossiped catalogue or the ring
changes. Topics are created, changed and deleted through the gossiped
catalogue (last writer wins; a partition count never shrinks, see
``placement.catalog_change``) and announced to every live broker before the
answer.

Leadership is elected (the node core, ``ring.node``, stepped by ``pump.py``):
produce goes to the partition's leader as this broker knows it (its own
replica's, else gossip's claims), which appends and waits until the
consistency level's number of voters hold the batches; any other broker
frames the records and forwards them to the leader's peer port, following a
``not_leader`` answer's hint and waiting up to ``LEADER_WAIT_MS`` while an
election runs. Unkeyed records go to a partition this broker leads, round-robin.
Fetch: served by this broker's replica up to its high watermark (a
follower knows the leader's from replication frames), else proxied to a live
replica; a replica whose stored data failed a check proxies its reads while
it is repaired (``ring.repair``). Describe shows this broker's own view: on a
partition's leader, ``replica_end_offsets`` holds every replica's
acknowledged end; on a follower only its own (the others are null); where it
holds no replica, the offsets are null.

A starting broker answers 503 to client requests until membership says it
has joined (``Membership.joined``), so no broker places partitions on a ring
it has not seen yet (nor stamps records with a clock it has not compared).
Membership's judgement of this broker's clock sets ``clock_refusal``: out of
bounds, or not compared, the broker stamps no record, applies no retention by
age and (``ring.node.watch``) leads no partition.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import aiohttp

from ring import answer_budget, limits
from ring.broker import Broker, changed_config
from ring.catalog import TopicConfig, validate_topic_name
from ring.clock import Clock
from ring.cluster.checkpoints import HighWatermarks
from ring.cluster.follower import AnswerLink
from ring.cluster.membership import Membership
from ring.cluster.peers import PeerClient
from ring.cluster.proxy import Proxy
from ring.cluster.pump import NodePump
from ring.cluster.routing import Router
from ring.config import BrokerConfig
from ring.errors import ClockUnusable, Conflict, Unavailable, UnknownPartition
from ring.gossip import clocks
from ring.gossip.state import EndpointState
from ring.hashing import broker_token, ordinal_from_name
from ring.log.datadir import TOPICS_DIR, partition_lost
from ring.node import placement
from ring.node import ready as msg
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import Ready
from ring.produce import Produce
from ring.ranges.manager import Ranges
from ring.repair.driver import Repair
from ring.replication import state, steps, versions
from ring.replication.intake import ProduceResult
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")



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
        super().__init__(config, clock, ClusterPolicy(self))
        self.name = config.name
        self.token = token_of(config)
        self.rng = rng or random.Random()
        self.client_addr = f"{config.advertise or config.host}:{config.port}"
        peer_port = config.peer_port if config.peer_port is not None else config.port + 1
        self.peer_addr = f"{config.advertise or config.peer_host}:{peer_port}"
        self.kafka_addr: str | None = None  # the Kafka listener's advertised HOST:PORT (ring.kafka_api)
        self.membership: Membership | None = None
        self.core: NodeCore | None = None  # ring.node: made in open(), once our address is known
        self.pump: NodePump | None = None
        self.commits.on_durable = self._durable
        self.peers: PeerClient | None = None
        self.session: aiohttp.ClientSession | None = None
        self.repair = Repair(self, config.repair_interval_s)
        self.ranges = Ranges(self)
        self.proxy = Proxy(self, lambda: answer_budget.budget_of(self))  # reads asked of other brokers
        self.router: Router = Router(self)  # where produces and reads go: here, the leader, a replica
        self._hws = HighWatermarks(self.data_dir)  # every replica's high watermark, saved now and then
        self._reconcile_lock = asyncio.Lock()
        self._reconcile_task: asyncio.Task[None] | None = None
        self._starting = False  # open(): the partitions this broker votes for open too, placed here or not
        self._opened_ms = 0  # wall clock when open() began (a new data directory was made then)

    def bind(self, client_port: int, peer_port: int, kafka_addr: str | None = None) -> None:
        """The ports actually listened on (port 0 picks one): what gossip advertises. Before open().
        ``kafka_addr``: the HOST:PORT Kafka clients reach this broker's Kafka listener at, if it has one."""
        host = self.config.advertise
        self.client_addr = f"{host or self.config.host}:{client_port}"
        self.peer_addr = f"{host or self.config.peer_host}:{peer_port}"
        self.kafka_addr = kafka_addr

    # --- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        self._opened_ms = self.clock.wall_ms()
        self._open_dir()
        self.ranges.open()
        me = EndpointState(self.name, self.token, self.client_addr, self.peer_addr,
                           generation=self.clock.wall_ms(), status="joining")
        seeds = [s.strip() for s in self.config.seeds if s.strip()]
        members = Members(me, seeds, random.Random(self.rng.random()), self.config.down_grace_s,
                          self.config.max_clock_offset_ms)
        members.set_extra("host", self.config.failure_host)
        members.set_extra("zone", self.config.zone)
        if self.kafka_addr is not None:
            members.set_extra("kafka", self.kafka_addr)  # where Kafka clients reach it (ring.kafka_api.cluster)
        self.core = NodeCore(self.name, self.replica, self.replicas, self.config.fsync.mode != "always",
                             random.Random(self.rng.random()), members, self.dir.incarnation)
        members.set_extra("incarnation", self.dir.incarnation)  # (its data directory's: see _open_partition)
        self.membership = Membership(members, self.clock, self.data_dir, self.step, tls=self.config.tls)
        self._clock_changed(members.clock.verdict)
        if not self.membership.topics():
            # Topics on disk while gossip's saved state holds none: they join it, stamped with their
            # creation time, so a delete or a re-creation gossiped while this broker was down wins
            # (stamped now, the old topic would come back over both).
            for cfg in self.catalog:
                self.membership.put_topic(cfg.name, cfg.to_json(), cfg.created_ms)
        self._hws.load()
        if self._ring_unknown():
            log.warning("no saved cluster state names another broker: the partitions held here open once "
                        "this broker has heard from the cluster")
            return
        self._starting = True
        try:
            for cfg in self.catalog:  # what gossip deleted or replaced meanwhile goes in the first reconcile
                self._open_topic(cfg)
        finally:
            self._starting = False

    async def start(self) -> None:
        await super().start()
        assert self.membership is not None
        self.peers = PeerClient(self.name, self.config.cluster_secret, tls=self.config.tls,  # TLS, secret, identity
                                peer_url=self.membership.peer_url, monotonic=self.clock.monotonic)
        self.session = self.peers.session
        assert self.core is not None
        self.pump = NodePump(self.core, self.clock, self.peers, on_damaged=self.repair.fix,
                             on_sent=self._replicated_bytes, on_write=self.membership.write,
                             on_gossip=self.membership.send, on_cluster=self._cluster_changed,
                             on_clock=self._clock_changed, wait_idle=self.commits.idle,
                             sync_soon=self.commits.sync_soon)
        self.core.carries_writes = True  # (the pump carries out every Ready: replica state files go in them)
        for rep in self.replicas():  # damage recovery kept in a log opened before the pump ran
            if rep.damaged_at is not None:
                self.damaged(rep, rep.damaged_at)
        self.membership.start(self.peers)
        self._tasks.append(asyncio.create_task(self._hw_checkpoint_loop(), name="hw checkpoint"))
        await self._reconcile()
        self.pump.tick()
        self.repair.start()
        self.ranges.start()

    async def hand_over(self) -> None:
        """Controlled shutdown, before the ports close: every partition led here moves to a caught-up
        follower (requests keep being served meanwhile, and forwarded once their partition moved)."""
        if self.pump is not None and not self._closing:
            await self.pump.hand_over(limits.STOP_HANDOVER_MS_MAX / 1000)

    async def close(self) -> None:
        self.begin_shutdown()
        await self.repair.close()
        await self.ranges.close()
        if self._reconcile_task is not None:
            self._reconcile_task.cancel()
        if self.pump is not None:
            await self.pump.close()
        if self.membership is not None:
            await self.membership.close()
        if self.peers is not None:
            await self.peers.close()
        self._save_hws()
        await super().close()

    def replicas(self) -> list[Replica]:
        return [r for ps in self._parts.values() for r in ps.values()]

    def check_joined(self) -> None:
        """Raise ``Unavailable`` while shutting down, or until membership says this broker has joined."""
        self.check_open()
        if self.membership is None or not self.membership.joined:
            raise Unavailable(f"{self.name} is still joining the cluster; retry")

    # --- placement and reconciling ---------------------------------------------------------

    def preference_list(self, cfg: TopicConfig, p: int) -> list[str]:
        assert self.membership is not None
        return placement.preference_list(self.membership.ring, cfg, p)

    def _open_partition(self, cfg: TopicConfig, p: int, replicas: list[str]) -> Replica:
        rep = super()._open_partition(cfg, p, replicas)
        rep.incarnation = self.dir.incarnation
        lost = partition_lost(self.dir.fresh, cfg.created_ms, self._opened_ms, self.config.max_clock_offset_ms)
        steps.restore(rep, rep.log.clean_shutdown and self.previous_shutdown_clean, lost)
        if rep.blank:
            log.warning("%s/%d: this broker's data directory is new (incarnation %s) and the partition is older: "
                        "it grants no vote until it has caught up from a leader", cfg.name, p, rep.incarnation)
        assert self.core is not None
        self.core.adopt(rep)
        if rep.damaged_at is not None and self.pump is not None:
            self.damaged(rep, rep.damaged_at)  # (before the pump runs, ``start`` does it)
        if not rep.caught_up and not rep.blank:
            log.info("%s/%d came back from an unclean shutdown: not electable until it has caught up",
                     cfg.name, p)
        return rep

    def _cluster_changed(self) -> None:
        if self._closing:
            return
        if self._reconcile_task is None or self._reconcile_task.done():
            self._reconcile_task = asyncio.create_task(self._reconcile(), name="reconcile")

    async def settle(self) -> None:
        """Wait for a reconcile that gossip started, if one runs."""
        task = self._reconcile_task
        if task is not None and not task.done():
            await asyncio.shield(task)

    def _ring_unknown(self) -> bool:
        """Whether this broker holds topics and its seeds name other brokers, but it has not joined and knows
        none of them yet: no saved state said who is on the ring (lost with the power before it was first
        saved, or unreadable) and gossip has not told it. Placed on a ring of this broker alone, every
        partition would have it as its only voter, and it would elect itself over what the others hold:
        nothing is placed until it knows the ring, or has joined knowing no other (a seed naming itself)."""
        assert self.membership is not None
        members = self.membership.members
        return (bool(members.gossip.seeds) and not members.joined and any(True for _ in self.catalog)
                and not any(n != self.name for n in members.gossip.state.endpoints))

    async def _reconcile(self) -> None:
        """Make the local catalogue, open replicas and replication links match gossip and the ring."""
        assert self.membership is not None
        if self._ring_unknown():
            return  # (gossip's first news of another broker changes the ring, and reconciles again)
        async with self._reconcile_lock:
            change = placement.catalog_change({c.name: c for c in self.catalog}, self.membership.topics())
            for name in change.remove:
                log.info("topic %s removed (deleted or recreated elsewhere)", name)
                await self._remove_topic_local(name)
            for cfg in change.add:
                if cfg.name not in self.catalog:
                    self._add_topic_local(cfg)
            for cfg in change.update:
                self._update_topic_local(cfg)
            for cfg in change.regrow:
                log.warning("topic %s: a concurrent change gossiped %d partitions; keeping %d",
                            cfg.name, self.membership.topics()[cfg.name].get("partitions"), cfg.partitions)
                self.membership.put_topic(cfg.name, cfg.to_json())
            for cfg in self.catalog:
                await self._replace(cfg)
            self._assign_streams()
        if self.pump is not None:
            self.pump.notify()

    async def _replace(self, cfg: TopicConfig) -> None:
        """Open the partitions of ``cfg`` placement gives us, close the ones it took away."""
        open_ = self._parts.setdefault(cfg.name, {})
        plan = placement.replacement(self.host.held(cfg), {p: rep.replicas for p, rep in open_.items()})
        for p in plan.close:
            log.info("%s/%d is no longer placed here; closing it (its data stays)", cfg.name, p)
            rep = open_.pop(p)
            steps.close(rep, Unavailable(f"{cfg.name}/{p} moved to other brokers"))
            await self.commits.idle(rep)
            rep.log.close()
        for p, replicas in plan.moved.items():
            open_[p].set_placement(replicas)
        for p, replicas in plan.open.items():
            self._open_partition(cfg, p, replicas)

    def _assign_streams(self) -> None:
        self.step(msg.PlacementChanged())

    def step(self, message: object) -> Ready:
        """Step the node core (``ring.node``) and carry out its Ready; before start, only step it."""
        if self.pump is not None:
            return self.pump.step(message)
        return self.core.step(self.clock.monotonic(), message)

    def leader_of(self, topic: str, partition: int) -> str | None:
        """The leader as this broker knows it: its own replica's, or the newest live claim in gossip."""
        return self.core.leader_of(topic, partition)

    def leader_epoch_of(self, topic: str, partition: int) -> int:
        """The leader's epoch as this broker knows it (``NodeCore.leader_epoch_of``); -1: none known."""
        return self.core.leader_epoch_of(topic, partition)

    def _replicated_bytes(self, follower: str, nbytes: int) -> None:
        if self.metrics is not None:  # installed by the HTTP app
            self.metrics.sent(follower, nbytes)

    def damaged(self, rep: Replica, offset: int) -> None:
        self.step(msg.Damaged(rep, offset))

    def repaired(self, rep: Replica) -> None:
        self.step(msg.Repaired(rep))

    def _durable(self, part: Replica, end: int) -> None:
        self.step(msg.Durable(part, end))

    def answer_links(self) -> dict[str, AnswerLink]:
        """Where the executor hands the answers to each leader's link (``ring.cluster.follower.serve``)."""
        assert self.pump is not None, "a replication link is served only once the broker started"
        return self.pump.answer_links

    async def wait_idle(self, part: Replica) -> None:
        """The follower's path before a sync frame (which may truncate): no fsync runs on the log."""
        await self.commits.idle(part)

    def begin_shutdown(self) -> None:
        if self.core is not None:
            self.core.closing = True
        super().begin_shutdown()

    # --- the log start offset and the clock ------------------------------------------------

    def gossip_load(self, load: dict[str, Any]) -> None:
        """What ``ranges`` adds to this broker's load in gossip (bytes held, free disk, full)."""
        if self.core is not None:
            self.core.load_extra = load

    async def describe_ranges(self, topic: str, partition: int) -> dict[str, Any]:
        """GET .../ranges: this broker's replica's catalogue, else a replica's."""
        return await self.router.describe_ranges(topic, partition)

    def _clock_changed(self, verdict: clocks.ClockVerdict) -> None:
        self.clock_refusal = None if verdict.usable else (
            f"the clock of {self.name} is not used now ({verdict.state}): {verdict.reason}. Produce through another "
            "broker, or send batches with the client's timestamps")
        if self.pump is not None:
            self.pump.notify()

    # --- high watermark checkpoints ------------------------------------------------------

    def _hw_snapshot(self) -> tuple[int, dict[tuple[str, int], int]]:
        return self._hws.snapshot({(t, p): r.hw for t, ps in self._parts.items() for p, r in ps.items()
                                   if r.rf > 1})

    def _save_hws(self) -> None:
        self._hws.save(self._hw_snapshot())

    async def _hw_checkpoint_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.clock.sleep(limits.HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS / 1000)
            await loop.run_in_executor(None, self._hws.save, self._hw_snapshot())  # its fsyncs off the loop

    # --- topics ------------------------------------------------------------------------

    def brokers_placed(self) -> int:
        """Brokers in the ring, down ones included: a partition's replicas are placed on them."""
        assert self.membership is not None
        return max(1, len(self.membership.ring))

    def _describe_partition(self, cfg: TopicConfig, p: int) -> dict[str, Any]:
        rep = self._parts.get(cfg.name, {}).get(p)
        leader = self.leader_of(cfg.name, p)
        if rep is not None:
            doc = super()._describe_partition(cfg, p)
            doc["leader"] = leader
            doc["earliest_offset"] = self.ranges.earliest(rep)  # below the local log: in ranges
            if rep.serves_from > rep.log.start_offset:  # a new leader moving up to its voters' start
                doc["earliest_offset"] = rep.serves_from
            doc["local_start_offset"] = rep.log.start_offset
            doc["no_eligible_leader"] = leader is None and bool(doc["lost_state"])
            return doc
        replicas = self.preference_list(cfg, p)
        return {"partition": p, "earliest_offset": None, "end_offset": None, "high_watermark": None,
                "local_start_offset": None, "leader": leader, "replicas": replicas, "epoch": None,
                "replica_end_offsets": {r: None for r in replicas}, "lost_state": [], "no_eligible_leader": False,
                "unclean_elections": []}

    # --- asked of this broker's own replicas (by other brokers, and the group coordinator) -----

    async def produce_as_leader(self, req: Produce, p: int, batches: list[bytearray]) -> ProduceResult:
        """A produce appended here as the partition's leader (forwarded by another broker, or the group
        coordinator's; its consistency given): ``Router.produce_as_leader``."""
        return await self.router.produce_as_leader(req, p, batches)

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

    # --- membership ------------------------------------------------------------------------

    async def decommission(self, name: str) -> dict[str, Any]:
        """Take broker ``name`` off the ring (its partitions get new replicas, filled before they count)."""
        self.check_joined()
        assert self.membership is not None
        self.membership.remove(name)
        await self.membership.announce()
        return {"decommissioned": name, "brokers": self.membership.brokers()}

    # --- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        doc = super().status()
        if doc["status"] == "ok" and (self.membership is None or not self.membership.joined):
            doc["status"] = "joining"
        doc.update({"token": self.token, "client_addr": self.client_addr, "peer_addr": self.peer_addr,
                    "cluster_secret_set": bool(self.config.cluster_secret),
                    "produces_forwarded": self.peers.forwards if self.peers is not None else 0,
                    "forward_links": self.peers.links.open() if self.peers is not None else 0})
        if self.pump is not None:
            doc["replication"] = self.pump.describe()
        reps = self.replicas()
        doc["leadership"] = {"led": sum(r.is_leader for r in reps), "leaderless": sum(r.leader is None for r in reps),
                             "behind": sum(not r.caught_up for r in reps), "repairing": self.repair.describe()}
        if self.core is not None:
            doc["clock"] = self.core.members.clock.status(self.clock.monotonic())
        doc["ranges"] = self.ranges.status()
        return doc

    def cluster(self) -> dict[str, Any]:
        if self.membership is None:
            return super().cluster()
        return {**self.membership.describe(), "self": self.name}


class ClusterPolicy:
    """What a ``ClusterBroker``'s storage half asks of the cluster around it (``ring.broker.BrokerHost``):
    the partitions placement gives it, the saved high watermarks they open with, the node core told of
    appends, start moves and clock reads, and topic changes made through the gossiped catalogue."""

    def __init__(self, node: ClusterBroker) -> None:
        self.node = node

    def held(self, cfg: TopicConfig) -> dict[int, list[str]]:
        """Placed here, plus partitions placed elsewhere that this broker still leads (it hands them over
        first) or votes for (``NodeCore.keep``; as it starts, the ones whose saved voters name it)."""
        node = self.node
        assert node.membership is not None
        now = node.clock.monotonic()
        kept = [p for p, rep in node._parts.get(cfg.name, {}).items() if node.core.keep(rep, now)]
        if node._starting:
            kept += state.voting_here(node.data_dir / TOPICS_DIR / cfg.name, node.name, cfg.partitions)
        return placement.held_here(node.membership.ring, cfg, node.name, kept)

    def initial_hw(self, topic: str, p: int, replicas: list[str]) -> int | None:
        return None if len(replicas) == 1 else self.node._hws.saved.get((topic, p), 0)

    def appended(self, part: Replica, durable: int | None = None) -> None:
        self.node.step(msg.Appended(part, durable))

    def start_moved(self, part: Replica) -> None:
        self.node.step(msg.StartMoved(part))  # an hw frame carries the new start to each follower

    def retained_elsewhere(self, part: Replica) -> bool:
        return self.node.ranges.retains(part)

    def refresh_clock(self) -> None:
        if self.node.core is not None:
            self.node.step(msg.ClockRead(self.node.clock.wall_ms()))

    async def add_topic(self, cfg: TopicConfig, leaders_wait_ms: int = limits.LEADER_WAIT_MS) -> dict[str, Any]:
        node = self.node
        node.check_joined()
        assert node.membership is not None
        # The topic's creation time is this broker's clock: one far behind would make it look older than the
        # data directories made since, whose replicas would then count themselves as having lost their state.
        self.refresh_clock()
        if node.clock_refusal is not None:
            raise ClockUnusable(f"topic {cfg.name!r} not created: its creation time is read from the clock of "
                                f"{node.name}, which is not used now (too far from its peers'); create it through "
                                "another broker", broker=node.name)
        await node.membership.announce()  # learn of a topic of that name created elsewhere
        await node._reconcile()
        if cfg.name in node.membership.topics() or cfg.name in node.catalog:
            raise Conflict(f"topic {cfg.name!r} already exists", topic=cfg.name)
        if len(node.catalog) >= limits.TOPICS_MAX:
            raise Conflict(f"the cluster already holds the maximum of {limits.TOPICS_MAX} topics")
        await self._unclaimed(cfg.name)
        cfg = versions.new_topic(cfg, node.membership.members.protocol_version(), node.rng)  # (the simulation's seed)
        node.membership.put_topic(cfg.name, cfg.to_json())
        await node._reconcile()
        await node.membership.announce()  # returns once live peers have opened their replicas
        await self._elect_new_partitions(cfg, leaders_wait_ms)
        return node.describe_topic(cfg.name)

    async def _unclaimed(self, name: str) -> None:
        """Return once no live broker's gossip claims to lead a partition of a topic named ``name``: a topic
        of that name deleted a moment ago is claimed by its leaders until they hear of the delete, and a new
        topic's elections and routing would take those claims for its own. Unavailable after LEADER_WAIT_MS."""
        node = self.node
        assert node.pump is not None
        deadline = node.clock.monotonic() + limits.LEADER_WAIT_MS / 1000
        while claimants := node.core.claimants(name):
            remaining = deadline - node.clock.monotonic()
            if remaining <= 0:
                raise Unavailable(f"topic {name!r} was deleted a moment ago and {', '.join(claimants)} still claim "
                                  "to lead its partitions; retry", topic=name, claimed_by=claimants)
            await node.pump.changed(min(remaining, limits.ELECTION_TICK_MS / 1000))

    async def _elect_new_partitions(self, cfg: TopicConfig, leaders_wait_ms: int = limits.LEADER_WAIT_MS) -> None:
        """Stand now for the new partitions where this broker is first in line; return once all have leaders
        or after ``leaders_wait_ms``."""
        node = self.node
        assert node.pump is not None and node.core is not None
        node.pump.carry_out(node.core.stand_now(node.clock.monotonic()))
        node.step(msg.Reprobe())
        await node.pump.wait_for_leaders(cfg.name, cfg.partitions, leaders_wait_ms / 1000)

    async def change_topic(self, name: str, body: object, at_least: bool = False) -> dict[str, Any]:
        """Gossip a topic's changed settings; with more partitions, return once they have leaders."""
        node = self.node
        node.check_joined()
        assert node.membership is not None
        await node.membership.announce()  # learn of a change made elsewhere first
        await node._reconcile()
        old = node.catalog.get(validate_topic_name(name))
        cfg = changed_config(old, body, at_least)
        if cfg != old:
            node.membership.put_topic(name, cfg.to_json())
            await node._reconcile()
            await node.membership.announce()
            if cfg.partitions > old.partitions:
                await self._elect_new_partitions(cfg)
        return node.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        node = self.node
        node.check_joined()
        assert node.membership is not None
        node.catalog.get(validate_topic_name(name))
        node.membership.delete_topic(name)
        await node._reconcile()
        await node.membership.announce()
