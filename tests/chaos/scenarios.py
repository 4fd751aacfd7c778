"""The chaos scenarios: which faults, when, on which broker, for a full run (``make chaos``) or a short one.

Each scenario is a schedule run against the live cluster while the workload
runs; it injects faults only before the run's deadline and leaves healing
what is still in effect to the harness. Victims are chosen with the run's
seeded random source: usually the leader of a random partition as a live
broker reports it, so whatever failover does, the faults keep landing on
leaders. Timings come from the failure detector (a stopped broker is
reported down 6-13 s after it stopped): pauses and partitions last longer
than that, so the cluster has to notice. Short versions fit one fault (or one
of each kind) into 12-20 s for ``make test``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from tests.chaos.faults import Faults
from tests.chaos.groupload import GroupLoad

WARMUP_S = 2.0  # load before the first fault, so there is something to lose
DOWN_DETECTED_S = 14.0  # longer than the failure detector's 6-13 s


@dataclass
class Ctx:
    faults: Faults
    deadline: float  # time.monotonic() at which the workload stops
    short: bool
    groups: GroupLoad | None = None  # the consumer-group members, in scenarios that run them

    @property
    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, min(seconds, self.left_s)))


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str  # one line, for the report
    drive: Callable[[Ctx], Awaitable[None]]
    partitions: bool = False  # needs a network that can cut links between brokers
    groups: bool = False  # consumer-group members read the topic too (``groupload``)
    fsync: str = "always"
    duration_s: float = 60.0
    short_s: float = 15.0
    args: tuple[str, ...] = ()  # more `ring serve` flags for every broker
    brokers: int = 3  # started at the beginning
    spare: int = 0  # made but not started: they join during the run
    ranges: bool = False  # the topic keeps a local tail; the rest is in ranges (ring.ranges), read back from 0
    # Failure domains: broker i runs on host ``hosts[i]`` and in zone ``zones[i]`` (``ring serve --host/--zone``);
    # empty: every broker on this machine's host, no zone.
    hosts: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()

    def domain_args(self, i: int) -> list[str]:
        return ([*("--host", self.hosts[i])] if self.hosts else []) + ([*("--zone", self.zones[i])] if self.zones else [])


async def no_faults(ctx: Ctx) -> None:
    await ctx.sleep(ctx.left_s)


async def leader_kill(ctx: Ctx) -> None:
    """Every 10 s: SIGKILL the leader of a random partition, restart it 5 s later."""
    async def a_leader() -> int:
        return (await ctx.faults.a_leader())[0]

    await _kill_every(ctx, a_leader, WARMUP_S)


async def _kill_every(ctx: Ctx, pick: Callable[[], Awaitable[int]], warmup_s: float) -> None:
    """Every 10 s: SIGKILL the broker ``pick`` names, restart it 5 s later (once in the short run)."""
    period_s, down_s = 10.0, 5.0
    await ctx.sleep(warmup_s)
    for _ in range(100):
        if ctx.left_s < down_s + 1:
            return
        began = time.monotonic()
        victim = await pick()
        await ctx.faults.kill(victim)
        await ctx.sleep(down_s)
        await ctx.faults.restart(victim)
        if ctx.short:
            return
        await ctx.sleep(period_s - (time.monotonic() - began))


async def leader_stop(ctx: Ctx) -> None:
    """SIGSTOP the leader of a random partition for longer than failure detection, then SIGCONT; again
    after 10 s while time is left."""
    await ctx.sleep(WARMUP_S)
    for _ in range(100):
        if ctx.left_s < DOWN_DETECTED_S:
            return
        victim, _ = await ctx.faults.a_leader()
        ctx.faults.pause(victim)
        await ctx.sleep(DOWN_DETECTED_S if ctx.short else DOWN_DETECTED_S + 2)
        ctx.faults.resume(victim)
        if ctx.short:
            return
        await ctx.sleep(10.0)


async def isolate(ctx: Ctx) -> None:
    """Cut the leader of a random partition off from both other brokers (clients still reach it) for
    15 s (10 s short), heal, again after 10 s."""
    cut_s = 10.0 if ctx.short else 15.0
    await ctx.sleep(WARMUP_S)
    for _ in range(100):
        if ctx.left_s < cut_s:
            return
        victim, _ = await ctx.faults.a_leader()
        ctx.faults.isolate(victim)
        await ctx.sleep(cut_s)
        ctx.faults.heal()
        if ctx.short:
            return
        await ctx.sleep(10.0)


async def one_way(ctx: Ctx) -> None:
    """The leader of a random partition cannot reach the others (they still reach it), heal; then the
    others cannot reach it (it still reaches them), heal. 12 s each (5 s short)."""
    cut_s, gap_s = (5.0, 1.0) if ctx.short else (12.0, 5.0)
    await ctx.sleep(WARMUP_S)
    for _ in range(100):
        if ctx.left_s < 2 * cut_s + gap_s:
            return
        victim, _ = await ctx.faults.a_leader()
        others = [j for j in range(ctx.faults.cluster.size) if j != victim]
        for j in others:
            ctx.faults.block(victim, j)
        await ctx.sleep(cut_s)
        ctx.faults.heal()
        await ctx.sleep(gap_s)
        for j in others:
            ctx.faults.block(j, victim)
        await ctx.sleep(cut_s)
        ctx.faults.heal()
        if ctx.short:
            return
        await ctx.sleep(gap_s)


async def torn_kill(ctx: Ctx) -> None:
    """Every 10 s: power loss on the leader of a random partition (stop, kill, cut each of its partitions'
    unsynced tail, restart)."""
    await _power_loss_every(ctx, ctx.faults.torn_kill)


async def domain_kill(ctx: Ctx) -> None:
    """Every 10 s: power loss on every broker of the failure domain (host, or zone when the brokers have
    zones) of a random partition's leader, together (restarted together); once in the short run."""
    await _power_loss_every(ctx, ctx.faults.torn_kill_domain)


async def _power_loss_every(ctx: Ctx, power_loss: Callable[[int], Awaitable[None]]) -> None:
    """Every 10 s: ``power_loss`` on the leader of a random partition (once in the short run)."""
    await ctx.sleep(WARMUP_S + 1)
    for _ in range(100):
        if ctx.left_s < 3:
            return
        began = time.monotonic()
        victim, _ = await ctx.faults.a_leader()
        await power_loss(victim)
        if ctx.short:
            return
        await ctx.sleep(10.0 - (time.monotonic() - began))


async def bit_flip(ctx: Ctx) -> None:
    """Flip one bit in a closed segment of a random broker's replica of a partition; in the full run, kill
    and restart that broker later (recovery trusts synced segments: reads must still catch it)."""
    f = ctx.faults
    await ctx.sleep(WARMUP_S + 1)
    victim = f.rng.randrange(f.cluster.size)
    if not await f.flip_bit(victim, wait_s=max(1.0, ctx.left_s / 2)):
        return
    if ctx.short:
        return
    await ctx.sleep(ctx.left_s / 2)
    if ctx.left_s > 5:
        await f.kill(victim)
        await ctx.sleep(2.0)
        await f.restart(victim)


async def clock_skew(ctx: Ctx) -> None:
    """The leader of a random partition restarted with its wall clock 8 days off (ahead or behind, by the
    run's seed), then 60 s off the other way, then right; a third of the time left each. Every replica's
    start offset is sampled every second, and offsets by timestamp are noted before the first skew."""
    f = ctx.faults
    await ctx.sleep(WARMUP_S)
    await f.probe_timestamps()
    victim, _ = await f.a_leader()
    sign, other = f.rng.choice((("+", "-"), ("-", "+")))
    phase_s = max(3.0, (ctx.left_s - 1) / 3)
    for offset in (f"{sign}8d", f"{other}60s", None):
        if ctx.left_s < 2:
            return
        began = time.monotonic()
        await f.skew_clock(victim, offset)
        for _ in range(1000):
            if time.monotonic() - began >= phase_s or ctx.left_s <= 0:
                break
            await f.sample_starts()
            await ctx.sleep(1.0)


async def consumer_kill(ctx: Ctx) -> None:
    """While group members poll through random brokers, in turn: kill a member (a new one joins), SIGSTOP
    the group's coordinator for 5 s (4 s short), kill a member, SIGSTOP another broker (one that only
    forwards) as long, cut a random broker off from the others for 4 s (3 s short), and in the full run
    SIGKILL a random broker and restart it 3 s later; again while time is left. The stops are shorter
    than failure detection and than the members' sessions: the stopped broker still holds the polls it
    took, and answers them after it resumes, to members that gave up on them and polled elsewhere."""
    f, groups = ctx.faults, ctx.groups
    assert groups is not None, "consumer-kill runs group members"
    pause_s, cut_s, down_s = (4.0, 3.0, 3.0) if ctx.short else (5.0, 4.0, 3.0)
    await ctx.sleep(WARMUP_S)
    for _ in range(100):
        for step in range(2):
            if ctx.left_s < pause_s:
                return
            f.event(f"kill consumer {await groups.kill_one()}")
            coordinator = await groups.coordinator()
            if coordinator is None:
                coordinator = f.rng.randrange(f.cluster.size)
            victim = coordinator if step == 0 else f.rng.choice(
                [i for i in range(f.cluster.size) if i != coordinator])
            f.pause(victim)
            await ctx.sleep(pause_s)
            f.resume(victim)
        if ctx.left_s < cut_s:
            return
        victim = f.rng.randrange(f.cluster.size)
        f.isolate(victim)
        await ctx.sleep(cut_s)
        f.heal()
        if ctx.short or ctx.left_s < down_s + 1:
            return
        victim = f.rng.randrange(f.cluster.size)
        await f.kill(victim)
        await ctx.sleep(down_s)
        await f.restart(victim)


# --- ranges (ring.ranges): the topic's replicas keep their active segment, the rest is on holders ---------


async def range_holder_kill(ctx: Ctx) -> None:
    """Every 10 s: SIGKILL a broker holding range copies (backlog readers are reading them), restart it 5 s
    later."""
    await _kill_every(ctx, ctx.faults.a_holder, WARMUP_S + 3)


async def range_holder_isolate(ctx: Ctx) -> None:
    """Cut a broker holding range copies off from the other brokers (clients still reach it) for 12 s (8 s
    short), heal, again after 8 s."""
    cut_s = 8.0 if ctx.short else 12.0
    await ctx.sleep(WARMUP_S + 3)
    for _ in range(100):
        if ctx.left_s < cut_s:
            return
        ctx.faults.isolate(await ctx.faults.a_holder())
        await ctx.sleep(cut_s)
        ctx.faults.heal()
        if ctx.short:
            return
        await ctx.sleep(8.0)


async def range_bit_flip(ctx: Ctx) -> None:
    """Every 4 s: flip one bit in a random range copy of a random holder (one flip in the short run)."""
    await ctx.sleep(WARMUP_S + 3)
    for _ in range(100):
        if ctx.left_s < 2:
            return
        f = ctx.faults
        holders = [i for i in f.cluster.members if f.range_files(i)]
        if holders:
            f.flip_range_bit(f.rng.choice(holders))
            if ctx.short:
                return
        await ctx.sleep(4.0)


async def range_join_decommission(ctx: Ctx) -> None:
    """A new broker joins a third of the way in (ranges and replicas move to it); a third later another
    broker is decommissioned (its ranges and replicas move away) and, a little before the end, stopped."""
    f = ctx.faults
    spare = next(i for i in range(f.cluster.size) if i not in f.cluster.members)
    third = ctx.left_s / 3
    await ctx.sleep(third)
    await f.join(spare)
    await ctx.sleep(ctx.left_s / 2)
    victim = f.rng.choice([i for i in f.cluster.members if i != spare])
    if await f.decommission(victim):
        await ctx.sleep(ctx.left_s - 2)
        await f.retire(victim)


RANGE_ARGS = ("--range-interval-s", "0.5", "--repair-interval-s", "2")
# Six brokers ring-0..5 sit clockwise in the order 0, 3, 1, 4, 2, 5. Hosts (zones) of two brokers that are
# neighbours on the ring: a walk over the next three brokers would put two replicas of many partitions on
# one host, so these scenarios lose acknowledged writes unless placement keeps replicas on distinct hosts.
_CLOCKWISE_6 = (0, 3, 1, 4, 2, 5)
HOSTS_OF_TWO = tuple(f"host-{_CLOCKWISE_6.index(i) // 2}" for i in range(6))
ZONES_OF_TWO = tuple(f"zone-{_CLOCKWISE_6.index(i) // 2}" for i in range(6))

SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("none", "no faults", no_faults, short_s=8.0),
    Scenario("leader-kill", "SIGKILL a leader every 10 s, restart after 5 s", leader_kill, short_s=12.0),
    Scenario("leader-stop", "SIGSTOP a leader for 16 s (14 s short), then SIGCONT", leader_stop, short_s=19.0),
    Scenario("isolate", "a leader cut off from both other brokers for 15 s (10 s short)", isolate,
             partitions=True, short_s=14.0),
    Scenario("one-way", "a leader cannot reach the others, then they cannot reach it (12 s each, 5 s short)",
             one_way, partitions=True, short_s=15.0),
    Scenario("torn-always", "power loss on a leader every 10 s, tail cut after its durable end (fsync always)",
             torn_kill, short_s=10.0),
    Scenario("torn-interval", "power loss on a leader every 10 s, tail cut in the last fsync interval "
             "(fsync interval:1000)", torn_kill, fsync="interval:1000", short_s=10.0),
    Scenario("host-kill", "3 hosts of 2 brokers: power loss on both brokers of a leader's host every 10 s, their "
             "tails cut in the last fsync interval (fsync interval:1000)", domain_kill, fsync="interval:1000",
             short_s=12.0, brokers=6, hosts=HOSTS_OF_TWO),
    Scenario("zone-kill", "3 zones of 2 hosts: power loss on both brokers of a leader's zone every 10 s, their "
             "tails cut in the last fsync interval (fsync interval:1000)", domain_kill, fsync="interval:1000",
             short_s=12.0, brokers=6, hosts=tuple(f"host-{i}" for i in range(6)), zones=ZONES_OF_TWO),
    Scenario("bit-flip", "one bit flipped in a closed segment of one replica (full run: then kill, restart)",
             bit_flip, short_s=10.0),
    Scenario("clock-skew", "a leader restarted with its clock 8 days off, then 60 s off the other way, then right "
             "(retention checked every second)", clock_skew, short_s=24.0, args=("--retention-interval-s", "1")),
    Scenario("consumer-kill", "group members polling through random brokers are killed; the group's coordinator "
             "and a forwarding broker SIGSTOPped 5 s each, a broker cut off 4 s, one SIGKILLed", consumer_kill,
             partitions=True, groups=True, short_s=14.0),
    Scenario("range-holder-kill", "5 brokers, a local tail and ranges: SIGKILL a range holder every 10 s, restart "
             "after 5 s, while readers go over every partition from offset 0", range_holder_kill, short_s=14.0,
             brokers=5, ranges=True, args=RANGE_ARGS),
    Scenario("range-holder-isolate", "5 brokers, a local tail and ranges: a range holder cut off from the other "
             "brokers for 12 s (8 s short)", range_holder_isolate, partitions=True, short_s=16.0, brokers=5,
             ranges=True, args=RANGE_ARGS),
    Scenario("range-bit-flip", "5 brokers, a local tail and ranges: a bit flipped in a random range copy every "
             "4 s (once short)", range_bit_flip, short_s=12.0, brokers=5, ranges=True, args=RANGE_ARGS),
    Scenario("range-join-decommission", "4 brokers, a local tail and ranges: a fifth joins, then one of the "
             "others is decommissioned and stopped, while ranges move", range_join_decommission, short_s=30.0,
             brokers=4, spare=1, ranges=True, args=RANGE_ARGS),
]}
