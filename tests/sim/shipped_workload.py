"""A seeded workload and fault schedule on three shipped brokers, and the checker of what it leaves.

``run_workload(seed, root)`` starts three brokers (``tests.sim.shipped``),
makes a topic of ``PARTITIONS`` partitions at replication factor 3, and for
``WORKLOAD_S`` virtual seconds runs producers that write one record a request
at ``one``, ``quorum`` or ``all`` through any broker (the two that do not lead
forward it), idempotent ones retrying a request that got no answer through
another broker with the same producer id and sequence, one that is not
idempotent and never retries, and a reader that fetches from any broker (with
``LONG_POLLS`` its fetches wait up to 2 s for records). The
faults come from the seed, one after another, at least ``FAULTS_MIN`` of
them: a leader crash and a follower crash (half of them power losses, which
lose what was not synced; each restarted after a while on its data
directory, a follower now and then on an empty one), a link cut
both ways, and a broker paused (its callbacks held, then run); with
``MORE_FAULTS`` also a link cut one way, a wall clock jumping and back, and
two brokers losing power together, while two members of a consumer group
(``ring.client``, each crashing now and then and replaced) read the topic;
with ``DISK_FAULTS`` also a broker's fsyncs failing; with ``STORAGE_FAULTS``
also a bit flip (a byte of a record batch's body changed in a crashed
broker's segment file before it restarts) and a slow disk (a broker's fsyncs
taking virtual seconds for a while), while a client creates a second topic
(``CHURN_TOPIC``), produces to it and fetches it, deletes it and creates it
again, over and over (each topic of the name a generation); with
``MEMBERSHIP`` the faults of ``MORE_FAULTS`` while a fourth broker joins a
third of the way in and one of the first three is decommissioned at two
thirds (stopped for good once the load is over and no partition counts it
among its replicas or voters); with ``ACK_FAULTS`` also faults timed at an
acknowledgement (the instant a produce at quorum or all to a partition drawn
is answered, its leader loses power, or every broker does and the leader's
disk is lost, its followers' fsyncs slow until then); with ``TORN_FAULTS``
also torn writes (a broker whose fsyncs were slow a while loses power, each
file keeping what was synced and a part of what followed, its tail zeroed
now and then). Then every link heals, every broker runs,
the cluster settles, and ``check`` looks at what is left:

* every record acknowledged at ``quorum`` or ``all`` is read back from its
  partition's leader at the offset it was acknowledged at (records
  acknowledged at ``one`` may go with their leader and are not checked);
* no value of an idempotent producer is in a partition twice, its values
  stand in the order it sent them (order per producer, as per key), and no
  value is in a partition that nobody produced;
* every record a fetch returned is in the partition at that offset (a fetch
  sees only what is committed);
* the group commits no offset past a record no member was handed;
* every replica's log (of the replicas the partition's leader names at the
  end), read from its data directory once the brokers are stopped, holds
  the same records as the leader's;
* with ``CHURN_TOPIC``: a fetch from a generation (asked of a broker that
  had just described the topic with that generation's id) returns none of
  another's values, every record acknowledged at quorum or all to the live
  one is at its offset in its leader's log, and its replicas agree.

``check`` returns the problems found, each a sentence; none means the seed
passed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson

from ring.client import AsyncGroupConsumer
from ring.clock import ManualClock
from ring.errors import RingError
from ring.log import batch as batchfmt
from ring.log.config import LogConfig
from ring.log.fsync import FsyncPolicy
from ring.log.partition import PartitionLog
from tests.sim.shipped import CLIENT_HOST, Probes, ShippedCluster
from tests.sim.vloop import VirtualClock, VirtualLoop, run

TOPIC = "work"
PARTITIONS = 2
WORKLOAD_S = 30.0  # virtual seconds of produces and faults, once the cluster is up
FAULTS_MIN = 3  # faults per seed at the least: a seed that draws fewer draws more
IDEMPOTENT_PRODUCERS = 2
ATTEMPTS = 4  # an idempotent request, sent at most this often
LEVELS = ("one", "quorum", "all")
GROUP = "work-group"
GROUP_MEMBERS = 2  # with MORE_FAULTS: consumers of one group, each crashing now and then and replaced
SETTLE_S = 90.0  # after healing: every broker up and every partition led, within this
QUIET_S = 6.0  # then this long without produces, for followers to catch up
ACK_TRAP_S = 5.0  # with ACK_FAULTS: a fault timed at an acknowledgement waits this long for one


@dataclass
class Ack:
    partition: int
    offset: int
    value: str
    level: str


@dataclass
class Outcome:
    seed: int
    acks: list[Ack] = field(default_factory=list)
    produced: set[str] = field(default_factory=set)  # every value a request carried
    idempotent: set[str] = field(default_factory=set)
    fetched: dict[tuple[int, int], str] = field(default_factory=dict)  # (partition, offset) -> value a fetch saw
    faults: list[str] = field(default_factory=list)
    leader_log: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    replica_logs: dict[tuple[str, int], list[tuple[int, str]]] = field(default_factory=dict)
    virtual_s: float = 0.0
    deliveries: int = 0
    group_read: set[tuple[int, int]] = field(default_factory=set)  # (partition, offset) a group member was handed
    committed: dict[int, int] = field(default_factory=dict)  # the group's committed offset per partition, at the end
    # The topic deleted and recreated (``CHURN_TOPIC``): each of its topics is a generation, 0 the first
    churn_events: list[str] = field(default_factory=list)  # what its client did, in order
    # Produces and fetches go to the topic by name: one asked of a broker that has not heard of the delete or
    # the new create yet reaches the old topic. Those asked of a broker that described the topic with the
    # generation's id just before (each turn's produce and fetch go to one broker, asked first) are checked;
    # the others ("blind") are counted only.
    churn_acks: list[tuple[int, Ack]] = field(default_factory=list)  # (generation, ack) at quorum or all
    churn_acks_blind: list[tuple[int, Ack]] = field(default_factory=list)
    churn_fetched: list[tuple[int, int, str]] = field(default_factory=list)  # (generation, offset, value) fetched
    # while that generation was the live topic (its create answered, its delete not yet asked)
    churn_fetched_blind: list[tuple[int, int, str]] = field(default_factory=list)
    churn_live: int | None = None  # the generation live at the end (None: no topic of the name then)
    churn_log: list[tuple[int, str]] = field(default_factory=list)  # its leader's log at the end
    churn_replica_logs: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    membership: list[str] = field(default_factory=list)  # with MEMBERSHIP: the joins, decommissions and stops
    replicas: dict[int, list[str]] = field(default_factory=dict)  # each partition's replicas at the end


FAULTS = ("leader-crash", "follower-crash", "cut", "pause")
# More faults drawn from the same seed: a link cut one way only, a broker's wall clock jumping (back or
# forward, by seconds to an hour) and back, and two brokers losing power together.
MORE_FAULTS = (*FAULTS, "one-way", "clock-jump", "power-pair")
# And a disk going bad: a broker's fsyncs fail (EIO) for a while, then it loses power (what the failed
# fsyncs were to make durable is gone) and starts again on what its disk kept.
DISK_FAULTS = (*MORE_FAULTS, "fsync-fail")
# And a disk that spoils or stalls: a byte of a record batch's body changed in a stopped broker's segment file
# before it starts again (its CRC no longer matches), and a broker's fsyncs taking seconds for a while. A run
# on these kinds also deletes and recreates a topic (``CHURN_TOPIC``) while it runs.
STORAGE_FAULTS = (*DISK_FAULTS, "bit-flip", "slow-disk")
# Not faults drawn from the seed but what a run on kinds that name them does besides. The membership
# changing: a fourth broker joins a third of the way in (partitions move to it), and at two thirds one of
# the first three is decommissioned (its partitions move away); once no partition counts it among its
# replicas it stops for good. Long polls: the reader's fetches wait up to 2 s for records (the runs without
# it fetch at once, and their seeds were chosen so).
MEMBERSHIP_CHANGE = "join-decommission"
LONG_POLLS = "long-polls"
NOT_DRAWN = (MEMBERSHIP_CHANGE, LONG_POLLS)
# And the membership changing while the faults of MORE_FAULTS hit it.
MEMBERSHIP = (*MORE_FAULTS, MEMBERSHIP_CHANGE, LONG_POLLS)
# And faults timed at an acknowledgement: the moment the workload is answered a produce at quorum or all,
# its partition's leader loses power, or (half of them) every broker does and the leader's disk is lost
# with it, so what the acknowledgement promised must survive on the replicas that acknowledged it.
ACK_FAULTS = (*FAULTS, "ack-crash", LONG_POLLS)
# And torn writes: a broker whose fsyncs have been slow for a while (so writes wait unsynced) loses power,
# and each of its files keeps what was synced and some of what was written after it, the tail of that part
# zeroed now and then.
TORN_FAULTS = (*FAULTS, "torn-write", LONG_POLLS)
CHURN_TOPIC = "churn"  # one partition at replication factor 3, created, produced to, deleted, created again
CHURN_LIVES_S = (4.0, 9.0)  # how long each of its topics lives, drawn from this range
STORAGE_REPAIR_INTERVAL_S = 4.0  # anti-entropy rounds this often in a run with bit flips: a spoiled batch
# no read touched is mended before the end


class _World(Probes):
    def __init__(self, loop: VirtualLoop, root: Path, seed: int, kinds: tuple[str, ...] = FAULTS,
                 repair_interval_s: float | None = None) -> None:
        if repair_interval_s is None and "bit-flip" in kinds:
            repair_interval_s = STORAGE_REPAIR_INTERVAL_S
        config = {} if repair_interval_s is None else {"repair_interval_s": repair_interval_s}
        self.membership = MEMBERSHIP_CHANGE in kinds
        super().__init__(loop, ShippedCluster(loop, root, spare=1 if self.membership else 0, **config))
        self.root = root
        self.kinds = kinds
        self.drawn = tuple(k for k in kinds if k not in NOT_DRAWN)  # the faults drawn from the seed
        self.long_polls = LONG_POLLS in kinds
        self.decommissioned: str | None = None
        self.disks_lost = 0  # brokers started again on an empty disk so far
        self.ack_trap: Callable[[int], None] | None = None  # given the partition of the next quorum or all
        # acknowledgement
        self.unmoved = ""  # why ``moved_off`` last said no
        self.churn = kinds == STORAGE_FAULTS
        self.out = Outcome(seed)
        self.rng = loop.rng
        self.stop_at = 0.0

    # --- asking the brokers ---------------------------------------------------------------

    async def leaders(self, topic: str = TOPIC) -> dict[int, str] | None:
        """Each partition's leader as every running broker reports it, once they all agree."""
        seen: list[tuple] = []
        for name in self.cluster.alive():
            got = await self.ask(name, "GET", f"/v1/topics/{topic}")
            if got is None or got[0] != 200:
                return None
            seen.append(tuple(p["leader"] for p in got[1]["partitions"]))
        if len(set(seen)) != 1 or None in seen[0]:
            return None
        return dict(enumerate(seen[0]))

    # --- the workload -----------------------------------------------------------------------

    async def produce(self, name: str, partition: int, value: str, level: str,
                      producer: tuple[int, int] | None, topic: str = TOPIC) -> int | None:
        params = {"partition": str(partition), "consistency": level, "timeout_ms": "3000"}
        if producer is not None:
            params.update(producer_id=str(producer[0]), sequence=str(producer[1]))
        got = await self.ask(name, "POST", f"/v1/topics/{topic}/messages", params=params,
                             data=orjson.dumps(value), headers={"Content-Type": "application/x-ndjson"})
        if got is None or got[0] != 200:
            return None
        return got[1]["base_offset"]

    async def producer(self, pid: int | None) -> None:
        sequences = [0] * PARTITIONS
        n = 0
        while self.loop.time() < self.stop_at:
            partition = self.rng.randrange(PARTITIONS)
            level = self.rng.choice(LEVELS)
            value = f"p{pid if pid is not None else 'x'}-{n}"
            n += 1
            self.out.produced.add(value)
            producer = None
            if pid is not None:
                self.out.idempotent.add(value)
                producer = (pid, sequences[partition])
                sequences[partition] += 1
            for _ in range(ATTEMPTS if pid is not None else 1):
                offset = await self.produce(self.rng.choice(self.cluster.members), partition, value, level, producer)
                if offset is not None:
                    self.out.acks.append(Ack(partition, offset, value, level))
                    if level != "one" and self.ack_trap is not None:
                        trap, self.ack_trap = self.ack_trap, None
                        trap(partition)
                    break
                await asyncio.sleep(self.rng.uniform(0.1, 0.5))
            await asyncio.sleep(self.rng.uniform(0.1, 0.4))

    async def group_member(self, n: int) -> None:
        """A member of the group (``ring.client``, committing what it was handed at its next poll), through
        a broker of its own at first; now and then it crashes (no leave, no commit) and a new one joins."""
        while self.loop.time() < self.stop_at:
            names = list(self.cluster.members)
            k = self.rng.randrange(len(names))
            urls = [f"http://{self.cluster.host_of(b)}:9250" for b in names[k:] + names[:k]]
            member = AsyncGroupConsumer(urls, GROUP, [TOPIC], consumer_id=f"m{n}-{self.rng.randrange(1 << 30)}",
                                        session_timeout_ms=6_000, wait_ms=500, timeout_s=2.0,
                                        retry_backoff_ms=200.0, clock=VirtualClock(self.loop))
            lives_s = self.rng.uniform(5.0, 20.0)
            until = min(self.stop_at, self.loop.time() + lives_s)
            while self.loop.time() < until:
                try:
                    record = await asyncio.wait_for(member.__anext__(), max(0.1, until - self.loop.time()))
                except asyncio.TimeoutError:
                    break
                except RingError:
                    await asyncio.sleep(0.2)
                    continue
                self.out.group_read.add((record.partition, record.offset))
            if self.loop.time() >= self.stop_at:
                try:
                    await asyncio.wait_for(member.close(), 10.0)  # the last members commit and leave
                except (RingError, asyncio.TimeoutError, OSError):
                    pass
                return
            if member._transport is not None:  # a crash: its connections dropped, no leave, no commit
                await member._transport.session.close()

    async def committed(self) -> dict[int, int] | None:
        for name in self.cluster.members:
            got = await self.ask(name, "GET", f"/v1/groups/{GROUP}")
            if got is not None and got[0] == 200:
                return {o["partition"]: o["committed"] for o in got[1]["offsets"]
                        if o["topic"] == TOPIC and o["committed"] is not None}
        return None

    async def reader(self) -> None:
        nexts = [0] * PARTITIONS
        while self.loop.time() < self.stop_at:
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
            partition = self.rng.randrange(PARTITIONS)
            wait_ms = self.rng.choice((0, 200, 2000)) if self.long_polls else 0
            got = await self.ask(self.rng.choice(self.cluster.members), "GET",
                                 f"/v1/topics/{TOPIC}/partitions/{partition}/messages",
                                 params={"offset": str(nexts[partition]), "max_records": "100",
                                         "wait_ms": str(wait_ms)},
                                 headers={"Accept": "application/json"})
            if got is None or got[0] != 200:
                continue
            for rec in got[1]["records"]:
                self.out.fetched[(partition, rec["offset"])] = rec["value"]
            nexts[partition] = got[1]["next_offset"]

    # --- a topic deleted and created again ---------------------------------------------------

    async def admin(self, method: str, path: str, done: tuple[int, ...], json: object = None) -> tuple[int, Any]:
        """Ask any broker until one answers with a status in ``done`` (that answer), or (0, None) once the
        workload's time is up. Unanswered and other answers are asked again."""
        while self.loop.time() < self.stop_at:
            got = await self.ask(self.rng.choice(self.cluster.members), method, path, json=json)
            if got is not None and got[0] in done:
                return got
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
        return 0, None

    async def knows(self, name: str, topic_id: str) -> bool:
        """Whether broker ``name`` describes ``CHURN_TOPIC`` as the topic of id ``topic_id``."""
        got = await self.ask(name, "GET", f"/v1/topics/{CHURN_TOPIC}")
        return got is not None and got[0] == 200 and got[1].get("id") == topic_id

    async def churn_topic(self) -> None:
        """Creates ``CHURN_TOPIC``, produces to it at quorum and all through any broker and fetches it back
        for a while, deletes it, creates it again, and so on until the workload's time is up, the last one
        left live. A create that may have happened unanswered (a 409 after a request with no answer, or a
        409 alone) is deleted again and created anew: only a 201 starts a generation."""
        gen = 0
        path = f"/v1/topics/{CHURN_TOPIC}"
        while self.loop.time() < self.stop_at:
            status, created = await self.admin("POST", "/v1/topics", (201, 409),
                                               json={"name": CHURN_TOPIC, "partitions": 1, "replication_factor": 3})
            if status != 201:
                if status == 409:  # a topic of the name that this client cannot tell is its own: away with it
                    await self.admin("DELETE", path, (200, 404))
                    self.out.churn_events.append(f"a create answered 409 at {self.loop.time():.1f}s: deleted the "
                                                 "topic of the name")
                    gen += 1
                continue
            self.out.churn_live = gen
            topic_id = created["id"]
            self.out.churn_events.append(f"created generation {gen} at {self.loop.time():.1f}s")
            until = min(self.stop_at, self.loop.time() + self.rng.uniform(*CHURN_LIVES_S))
            n = nxt = 0
            while self.loop.time() < until:
                value = f"c{gen}-{n}"
                n += 1
                self.out.produced.add(value)
                level = self.rng.choice(("quorum", "all"))
                via = self.rng.choice(self.cluster.members)
                knows = await self.knows(via, topic_id)
                offset = await self.produce(via, 0, value, level, None, topic=CHURN_TOPIC)
                if offset is not None:
                    (self.out.churn_acks if knows else self.out.churn_acks_blind).append((gen, Ack(0, offset, value,
                                                                                                   level)))
                got = await self.ask(via, "GET", f"{path}/partitions/0/messages",
                                     params={"offset": str(nxt), "max_records": "100", "wait_ms": "0"},
                                     headers={"Accept": "application/json"})
                if got is not None and got[0] == 200:
                    fetched = [(gen, r["offset"], r["value"]) for r in got[1]["records"]]
                    (self.out.churn_fetched if knows else self.out.churn_fetched_blind).extend(fetched)
                    nxt = got[1]["next_offset"]
                await asyncio.sleep(self.rng.uniform(0.1, 0.4))
            if self.loop.time() >= self.stop_at:
                return
            self.out.churn_live = None
            await self.admin("DELETE", path, (200, 404))
            self.out.churn_events.append(f"deleted generation {gen} at {self.loop.time():.1f}s")
            gen += 1

    # --- the faults -------------------------------------------------------------------------

    async def faults(self) -> None:
        await asyncio.sleep(self.rng.uniform(2.0, 4.0))
        while len(self.out.faults) < FAULTS_MIN or self.loop.time() < self.stop_at - 8.0:
            names = list(self.cluster.members)
            kind = self.rng.choice(self.drawn)
            lasts = self.rng.uniform(1.0, 5.0)
            at = self.loop.time()
            if kind in ("leader-crash", "follower-crash"):
                leaders = await self.leaders() or {}
                leader = leaders.get(self.rng.randrange(PARTITIONS)) or self.rng.choice(names)
                victim = leader if kind == "leader-crash" else self.rng.choice([n for n in names if n != leader])
                wipe = kind == "follower-crash" and self.rng.random() < 0.25
                power = self.rng.random() < 0.5
                # (after a disk lost before, not while a replica is still filling: two disks lost in turn can
                # leave a partition only an unclean election brings back)
                wipe = wipe and not (self.disks_lost and await self.blank_replicas())
                self.cluster.kill(victim, power_loss=power)
                await asyncio.sleep(lasts)
                # (a broker decommissioned meanwhile, back on an empty disk, would join as a new broker)
                wipe = wipe and victim != self.decommissioned
                self.cluster.restart(victim, wipe=wipe)
                self.disks_lost += wipe
                what = f"{kind} {victim}" + (" losing power" if power else "") + \
                    (" (back on an empty disk)" if wipe else "")
            elif kind in ("cut", "one-way"):
                a, b = self.rng.sample(names, 2)
                ha, hb = self.cluster.host_of(a), self.cluster.host_of(b)
                net = self.cluster.net
                cut, heal = (net.cut, net.heal) if kind == "cut" else (net.cut_one_way, net.heal_one_way)
                cut(ha, hb)
                await asyncio.sleep(lasts)
                heal(ha, hb)
                what = f"cut {a}-{b}" if kind == "cut" else f"cut {a}->{b} one way"
            elif kind == "torn-write":
                victim = self.rng.choice(names)
                self.cluster.slow_fsyncs(victim, self.rng.uniform(0.5, 2.0))  # writes wait, unsynced
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                torn = self.cluster.kill(victim, power_loss=True, torn=self.rng)
                self.cluster.slow_fsyncs(victim, 0)
                await asyncio.sleep(lasts)
                self.cluster.restart(victim)
                what = f"{victim} losing power, its writes torn ({'; '.join(torn) or 'nothing unsynced'})"
            elif kind == "ack-crash":
                what = await self.ack_crash(lasts)
                if what is None:  # no acknowledgement came: no fault
                    continue
            elif kind == "clock-jump":
                victim = self.rng.choice(names)
                jump = self.rng.choice((-1, 1)) * self.rng.uniform(5.0, 3600.0)
                self.cluster.jump_clock(victim, jump)
                await asyncio.sleep(lasts)
                self.cluster.jump_clock(victim, -jump)
                what = f"{victim}'s wall clock {jump:+.0f}s"
            elif kind == "fsync-fail":
                victim = self.rng.choice(names)
                self.cluster.fail_fsyncs(victim)
                await asyncio.sleep(lasts)
                self.cluster.kill(victim, power_loss=True)
                self.cluster.fail_fsyncs(victim, False)
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                self.cluster.restart(victim)
                what = f"{victim}'s fsyncs failing, then it loses power"
            elif kind == "bit-flip":
                victim = self.rng.choice(names)
                self.cluster.kill(victim)
                where = self.cluster.flip_batch_byte(victim, self.rng)
                await asyncio.sleep(lasts)
                self.cluster.restart(victim)
                what = f"{victim} crashed, a byte of a batch's body changed ({where or 'no batch on disk'})"
            elif kind == "slow-disk":
                victim = self.rng.choice(names)
                seconds = self.rng.uniform(0.5, 3.0)
                self.cluster.slow_fsyncs(victim, seconds)
                await asyncio.sleep(lasts)
                self.cluster.slow_fsyncs(victim, 0)
                what = f"{victim}'s fsyncs taking {seconds:.1f}s"
            elif kind == "power-pair":
                pair = self.rng.sample(names, 2)
                for victim in pair:
                    self.cluster.kill(victim, power_loss=True)
                await asyncio.sleep(lasts)
                for victim in pair:
                    self.cluster.restart(victim)
                what = f"{pair[0]} and {pair[1]} losing power together"
            else:
                victim = self.rng.choice(names)
                self.loop.pause(self.cluster.host_of(victim))
                await asyncio.sleep(lasts)
                self.loop.resume(self.cluster.host_of(victim))
                what = f"pause {victim}"
            self.out.faults.append(f"{what} at {at:.1f}s for {lasts:.1f}s")
            await asyncio.sleep(self.rng.uniform(1.0, 4.0))

    async def ack_crash(self, lasts: float) -> str | None:
        """At the next acknowledgement at quorum or all of a partition drawn here, its leader (as the brokers
        reported it just before) loses power; or, half of the time, every broker does and the leader's disk
        is lost (it starts again on an empty directory; unless a replica is still filling after losing its
        own), its followers' fsyncs having been slow meanwhile, so their copies are durable only once they
        acknowledge them. All start again ``lasts`` later. What
        happened, or None when no acknowledgement came within ``ACK_TRAP_S``."""
        leaders = await self.leaders() or {}
        partition = self.rng.randrange(PARTITIONS)
        leader = leaders.get(partition) or self.rng.choice(self.cluster.alive())
        every = self.rng.random() < 0.5
        # the leader's disk is lost only while no replica is still filling after losing its own: two disks
        # lost at once may leave a partition no replica can lead without an unclean election
        wipe = every and leader != self.decommissioned and not await self.blank_replicas()
        slowed = [n for n in self.cluster.alive() if n != leader] if every else []
        seconds = self.rng.uniform(0.3, 1.5)
        for name in slowed:
            self.cluster.slow_fsyncs(name, seconds)
        fired: asyncio.Future[list[str]] = self.loop.create_future()

        def trap(acknowledged: int) -> None:
            if acknowledged != partition:
                self.ack_trap = trap  # another partition's: wait on
                return
            victims = [leader] + ([n for n in self.cluster.alive() if n != leader] if every else [])
            for victim in victims:
                if victim in self.cluster.alive():
                    self.cluster.kill(victim, power_loss=True)
            fired.set_result(victims)

        self.ack_trap = trap
        try:
            victims = await asyncio.wait_for(fired, ACK_TRAP_S)
        except asyncio.TimeoutError:
            self.ack_trap = None
            return None
        finally:
            for name in slowed:
                self.cluster.slow_fsyncs(name, 0)
        await asyncio.sleep(lasts)
        for victim in victims:
            self.cluster.restart(victim, wipe=wipe and victim == leader)
        self.disks_lost += wipe
        if every:
            return (f"at an acknowledgement of partition {partition} (its followers' fsyncs taking {seconds:.1f}s), "
                    f"every broker losing power, its leader {leader}" + (" back on an empty disk" if wipe else ""))
        return f"at an acknowledgement of partition {partition}, its leader {leader} losing power"

    async def blank_replicas(self) -> bool:
        """Whether some running broker names a replica of some partition that lost its state and is still
        filling (``lost_state``), or cannot be asked."""
        for name in self.cluster.alive():
            listed = await self.ask(name, "GET", "/v1/topics")
            if listed is None or listed[0] != 200:
                return True
            for topic in (t["name"] for t in listed[1]["topics"]):
                got = await self.ask(name, "GET", f"/v1/topics/{topic}")
                if got is None or got[0] != 200 or any(d["lost_state"] for d in got[1]["partitions"]):
                    return True
        return False

    # --- the membership changing ---------------------------------------------------------------

    async def membership_changes(self) -> None:
        """The spare broker joins a third of the way in; at two thirds one of the first brokers is
        decommissioned, asked of the other members in turn until one takes it (200)."""
        start = self.stop_at - WORKLOAD_S
        spare = next(n for n in self.cluster.names if n not in self.cluster.members)
        await asyncio.sleep(start + WORKLOAD_S / 3 + self.rng.uniform(-2.0, 2.0) - self.loop.time())
        self.cluster.join(spare)
        self.out.membership.append(f"{spare} joins at {self.loop.time():.1f}s")
        await asyncio.sleep(start + 2 * WORKLOAD_S / 3 + self.rng.uniform(-2.0, 2.0) - self.loop.time())
        victim = self.rng.choice([n for n in self.cluster.members if n != spare])
        while self.loop.time() < self.stop_at:
            via = self.rng.choice([n for n in self.cluster.members if n != victim])
            got = await self.ask(via, "POST", f"/v1/cluster/brokers/{victim}/decommission")
            if got is not None and got[0] == 200:
                self.decommissioned = victim
                self.out.membership.append(f"{victim} decommissioned through {via} at {self.loop.time():.1f}s")
                return
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))
        self.out.membership.append(f"no member took {victim}'s decommission before the workload's end")

    async def moved_off(self, name: str) -> bool:
        """Whether every partition of every topic has a leader other than ``name`` that counts ``name``
        neither among its replicas nor among its voters (so its copies are needed by no quorum)."""
        others = [n for n in self.cluster.alive() if n != name]
        self.unmoved = "no other member runs"
        if not others:
            return False
        listed = await self.ask(others[0], "GET", "/v1/topics")
        self.unmoved = f"{others[0]} lists no topics: {listed}"
        if listed is None or listed[0] != 200:
            return False
        for topic in (t["name"] for t in listed[1]["topics"]):
            led: dict[int, dict[str, Any]] = {}
            parts = 0
            for other in others:
                got = await self.ask(other, "GET", f"/v1/topics/{topic}")
                self.unmoved = f"{other} describes {topic}: {got}"
                if got is None or got[0] != 200:
                    return False
                parts = len(got[1]["partitions"])
                led.update({d["partition"]: d for d in got[1]["partitions"] if d["leader"] == other})
            self.unmoved = (f"{topic}: {parts - len(led)} partitions not led by another member; "
                            + "; ".join(f"{p}: {d['leader']} counts {d['replica_end_offsets']}, replicas {d['replicas']}"
                                        for p, d in sorted(led.items())))
            if len(led) != parts or any(name in d["replicas"] or name in d["replica_end_offsets"]
                                        for d in led.values()):
                return False
        return True

    # --- the end ------------------------------------------------------------------------------

    async def read_leader(self, leader: str, partition: int, topic: str = TOPIC) -> list[tuple[int, str]] | None:
        """The partition's records as ``leader`` serves them, or None when it does not (any other answer)."""
        out: list[tuple[int, str]] = []
        offset = 0
        while True:
            got = await self.ask(leader, "GET", f"/v1/topics/{topic}/partitions/{partition}/messages",
                                 params={"offset": str(offset), "max_records": "10000", "wait_ms": "0"},
                                 headers={"Accept": "application/json"})
            if got is None or got[0] != 200:
                return None
            out.extend((rec["offset"], rec["value"]) for rec in got[1]["records"])
            if got[1]["next_offset"] == offset:
                return out
            offset = got[1]["next_offset"]

    async def final_log(self, leader: str, partition: int, topic: str = TOPIC) -> tuple[str, list[tuple[int, str]]]:
        """(leader, records) of the partition at the end. Leadership can still move after the cluster
        settled (a replica back from a lost disk takes its partition back once filled): when ``leader``
        does not serve it, the brokers are asked again who leads it."""
        log = await self.read_leader(leader, partition, topic)
        if log is not None:
            return leader, log

        async def again() -> tuple[str, list[tuple[int, str]]] | None:
            leaders = await self.leaders(topic)
            log = await self.read_leader(leaders[partition], partition, topic) if leaders else None
            return None if log is None or not leaders else (leaders[partition], log)

        return await self.until(f"{topic}/{partition}'s log from its leader", again, SETTLE_S)

    async def main(self) -> Outcome:
        cluster = self.cluster
        cluster.start()
        await self.until("every broker sees every broker up", self.all_up, 30.0)
        got = await self.ask(cluster.members[0], "POST", "/v1/topics",
                             json={"name": TOPIC, "partitions": PARTITIONS, "replication_factor": 3})
        assert got is not None and got[0] == 201, got
        await self.until("a leader for every partition", self.leaders, 30.0)
        self.stop_at = self.loop.time() + WORKLOAD_S
        work = [self.loop.create_task(self.producer(pid)) for pid in range(1, IDEMPOTENT_PRODUCERS + 1)]
        work += [self.loop.create_task(self.producer(None)), self.loop.create_task(self.reader()),
                 self.loop.create_task(self.faults())]
        if self.kinds != FAULTS:
            work += [self.loop.create_task(self.group_member(n)) for n in range(GROUP_MEMBERS)]
        if self.churn:
            work.append(self.loop.create_task(self.churn_topic()))
        if self.membership:
            work.append(self.loop.create_task(self.membership_changes()))
        await asyncio.gather(*work)
        if self.decommissioned is not None:  # stopped once nothing needs it, as an operator stops it
            victim = self.decommissioned
            try:
                await self.until(f"{victim}'s partitions moved to other members", lambda: self.moved_off(victim),
                                 SETTLE_S)
            except AssertionError as exc:
                raise AssertionError(f"{exc} (last seen: {self.unmoved})") from None
            self.cluster.retire(victim)
            self.out.membership.append(f"{victim} stopped at {self.loop.time():.1f}s")
        await self.until("every broker up again", self.all_up, SETTLE_S)
        leaders = await self.until("a leader for every partition again", self.leaders, SETTLE_S)
        await asyncio.sleep(QUIET_S)
        leaders = await self.until("a leader for every partition at the end", self.leaders, SETTLE_S)
        for p in range(PARTITIONS):
            leader, self.out.leader_log[p] = await self.final_log(leaders[p], p)
            got = await self.ask(leader, "GET", f"/v1/topics/{TOPIC}")
            assert got is not None and got[0] == 200, got
            self.out.replicas[p] = got[1]["partitions"][p]["replicas"]
        if self.kinds != FAULTS:
            self.out.committed = await self.until("the group's offsets", self.committed, SETTLE_S)
        if self.out.churn_live is not None:
            churn = await self.until(f"a leader for {CHURN_TOPIC}", lambda: self.leaders(CHURN_TOPIC), SETTLE_S)
            _, self.out.churn_log = await self.final_log(churn[0], 0, CHURN_TOPIC)
        await self.client.close()
        self.out.virtual_s = self.loop.time()
        self.out.deliveries = cluster.net.deliveries
        for name in cluster.members:
            cluster.kill(name)
        for config in cluster.configs:
            for p in range(PARTITIONS):
                if config.name in self.out.replicas[p]:
                    self.out.replica_logs[(config.name, p)] = replica_records(config.data_dir / "topics" / TOPIC /
                                                                              str(p))
            if self.out.churn_live is not None:
                self.out.churn_replica_logs[config.name] = replica_records(config.data_dir / "topics" / CHURN_TOPIC / "0")
        return self.out


def replica_records(directory: Path) -> list[tuple[int, str]]:
    """The records in a stopped broker's partition log, (offset, value) in order."""
    if not directory.exists():
        return []
    log = PartitionLog(directory, LogConfig(fsync=FsyncPolicy("never")), ManualClock())
    try:
        end = log.end_offset
        data = log.read(0, 1 << 30)
        return [(r.offset, orjson.loads(r.value)) for r, _ in batchfmt.records_between(data, 0, end, 1 << 30)]
    finally:
        log.close()


def run_workload(seed: int, root: Path, kinds: tuple[str, ...] = FAULTS,
                 repair_interval_s: float | None = None) -> Outcome:
    """One seed's run, its faults drawn from ``kinds``; ``repair_interval_s``: the brokers' anti-entropy
    interval (None: the default, or ``STORAGE_REPAIR_INTERVAL_S`` with bit flips)."""
    async def main(loop: VirtualLoop) -> Outcome:
        return await loop.spawn(CLIENT_HOST, _World(loop, root, seed, kinds, repair_interval_s).main())

    return run(seed, main)


def check(out: Outcome) -> list[str]:
    """What the run left that breaks a promise, a sentence each (empty: the seed passed)."""
    problems: list[str] = []
    logs = {p: dict(recs) for p, recs in out.leader_log.items()}
    for p, recs in out.leader_log.items():
        offsets = [o for o, _ in recs]
        if offsets != sorted(set(offsets)):
            problems.append(f"partition {p}: the leader's offsets are not in order or repeat")
        values = [v for _, v in recs]
        twice = sorted({v for v in values if v in out.idempotent and values.count(v) > 1})
        if twice:
            problems.append(f"partition {p}: an idempotent produce written twice: {twice[:5]}")
        unknown = sorted(set(values) - out.produced)
        if unknown:
            problems.append(f"partition {p}: values nobody produced: {unknown[:5]}")
        last: dict[str, tuple[int, int]] = {}  # an idempotent producer's last record in the log: (its n, offset)
        for offset, value in recs:
            if value not in out.idempotent:
                continue
            pid, _, n = value.rpartition("-")
            if pid in last and int(n) < last[pid][0]:
                problems.append(f"partition {p}: {value} at offset {offset} stands after {pid}-{last[pid][0]} at "
                                f"offset {last[pid][1]}, which its producer sent later")
                break
            last[pid] = (int(n), offset)
    lost = [a for a in out.acks if a.level != "one" and logs.get(a.partition, {}).get(a.offset) != a.value]
    if lost:
        a = lost[0]
        problems.append(f"{len(lost)} records acknowledged at quorum or all lost, e.g. {a.value} at {a.level} at "
                        f"offset {a.offset} of partition {a.partition} (the leader has "
                        f"{logs.get(a.partition, {}).get(a.offset)!r} there)")
    for p, committed in sorted(out.committed.items()):
        undelivered = [o for o, _ in out.leader_log.get(p, []) if o < committed and (p, o) not in out.group_read]
        if undelivered:
            problems.append(f"the group committed offset {committed} of partition {p}, but no member was handed "
                            f"{len(undelivered)} records below it, e.g. offset {undelivered[0]}")
    unread = [(k, v) for k, v in out.fetched.items() if logs.get(k[0], {}).get(k[1]) != v]
    if unread:
        (p, o), v = unread[0]
        problems.append(f"{len(unread)} records a fetch returned are not in the log, e.g. {v} at offset {o} of "
                        f"partition {p}")
    for (name, p), recs in sorted(out.replica_logs.items()):
        if recs != out.leader_log.get(p):
            problems.append(f"{name}'s replica of partition {p} differs from its leader's log "
                            f"({len(recs)} records, the leader {len(out.leader_log.get(p, []))})")
    problems += check_churn(out)
    return problems


def check_churn(out: Outcome) -> list[str]:
    """The rules of the topic deleted and recreated: a fetch from a generation returns only its own values;
    what was acknowledged to the live one at quorum or all is in it; its replicas agree."""
    problems: list[str] = []
    foreign = [(g, o, v) for g, o, v in out.churn_fetched if not v.startswith(f"c{g}-")]
    if foreign:
        g, o, v = foreign[0]
        problems.append(f"{len(foreign)} records fetched from a generation of {CHURN_TOPIC} were produced to "
                        f"another, e.g. {v} at offset {o} of generation {g}")
    if out.churn_live is None:
        return problems
    log = dict(out.churn_log)
    mine = [v for _, v in out.churn_log if not v.startswith(f"c{out.churn_live}-")]
    if mine:
        problems.append(f"the live {CHURN_TOPIC} (generation {out.churn_live}) holds values of another: {mine[:5]}")
    lost = [a for g, a in out.churn_acks if g == out.churn_live and log.get(a.offset) != a.value]
    if lost:
        a = lost[0]
        problems.append(f"{len(lost)} records acknowledged to the live {CHURN_TOPIC} lost, e.g. {a.value} at "
                        f"{a.level} at offset {a.offset} (the leader has {log.get(a.offset)!r} there)")
    unread = [(o, v) for g, o, v in out.churn_fetched if g == out.churn_live and log.get(o) != v]
    if unread:
        problems.append(f"{len(unread)} records fetched from the live {CHURN_TOPIC} are not in its log, e.g. "
                        f"{unread[0][1]} at offset {unread[0][0]}")
    for name, recs in sorted(out.churn_replica_logs.items()):
        if recs != out.churn_log:
            problems.append(f"{name}'s replica of {CHURN_TOPIC} differs from its leader's log ({len(recs)} records, "
                            f"the leader {len(out.churn_log)})")
    return problems
