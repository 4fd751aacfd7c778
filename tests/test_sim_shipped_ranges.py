"""Ranges on five shipped brokers under simulation: a partition's leader cut off while ranges move.

The topic keeps only its active segment in the replicas' logs (``local_retention_bytes`` 0): what is
below lives in ranges, cut by the partition's leader, copied to holders on the ring and trimmed from
the logs once safe. Producers write at ``quorum`` through any broker while the partition's leader is
cut off from the other four brokers (clients still reach it) for a while: another replica leads,
cuts ranges of its own, copies them and trims its log. Then the cut heals, the old leader takes its
partition back, and its first rounds meet catalogues and copies it has not heard of. At the end
every record acknowledged at ``quorum`` is read back at its offset from offset 0, through the ranges.

``RING_SIM_SHIPPED_RANGES_SEEDS=N`` runs seeds 0 to N-1 instead (a sweep);
``RING_SIM_SHIPPED_RANGES_SEED=S`` replays one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from tests.sim.shipped import CLIENT_HOST, Probes, ShippedCluster, seeds_from_env
from tests.sim.vloop import VirtualLoop, run

TOPIC = "ranged"
BROKERS = 5
SEEDS = (0, 1, 2)
BEFORE_S = 8.0  # produces before the cut
CUT_S = (8.0, 14.0)  # how long the leader is cut off: drawn from the seed
AFTER_S = 12.0  # produces after the heal
READ_S = 60.0  # the whole partition read back within this


class _World(Probes):
    def __init__(self, loop: VirtualLoop, root: Path) -> None:
        super().__init__(loop, ShippedCluster(loop, root, size=BROKERS, range_interval_s=3.0, repair_interval_s=1.0))
        self.acks: dict[int, str] = {}
        self.events: list[str] = []
        self.producing = True

    async def leader(self) -> str | None:
        """The partition's leader once every broker names the same one."""
        seen = set()
        for name in self.cluster.names:
            got = await self.ask(name, "GET", f"/v1/topics/{TOPIC}")
            if got is None or got[0] != 200:
                return None
            seen.add(got[1]["partitions"][0]["leader"])
        return seen.pop() if len(seen) == 1 and None not in seen else None

    async def producer(self) -> None:
        n = 0
        rng = self.loop.rng
        while self.producing:
            value = f"v{n}-" + "x" * 100
            n += 1
            got = await self.ask(rng.choice(self.cluster.names), "POST", f"/v1/topics/{TOPIC}/messages",
                                 params={"partition": "0", "consistency": "quorum", "timeout_ms": "3000"},
                                 data=orjson.dumps(value), headers={"Content-Type": "application/x-ndjson"})
            if got is not None and got[0] == 200:
                self.acks[got[1]["base_offset"]] = value
            await asyncio.sleep(rng.uniform(0.02, 0.08))

    async def read_all(self) -> dict[int, str] | None:
        """The partition from offset 0 through any broker (None while a range has no live holder)."""
        out: dict[int, str] = {}
        offset, name = 0, self.loop.rng.choice(self.cluster.names)
        while True:
            got = await self.ask(name, "GET", f"/v1/topics/{TOPIC}/partitions/0/messages",
                                 params={"offset": str(offset), "max_records": "1000", "wait_ms": "0"},
                                 headers={"Accept": "application/json"})
            if got is None or got[0] != 200:
                return None
            out.update((rec["offset"], rec["value"]) for rec in got[1]["records"])
            if got[1]["next_offset"] == offset:
                return out
            offset = got[1]["next_offset"]

    async def main(self) -> tuple[dict[int, str], dict[int, str], list[str]]:
        cluster, net = self.cluster, self.cluster.net
        cluster.start()
        await self.until("every broker sees every broker up", self.all_up, 30.0)
        got = await self.ask(cluster.names[0], "POST", "/v1/topics",
                             json={"name": TOPIC, "partitions": 1, "replication_factor": 3, "segment_bytes": 4096,
                                   "local_retention_bytes": 0, "consistency": "quorum"})
        assert got is not None and got[0] == 201, got
        old = await self.until("a leader", self.leader, 30.0)
        producing = self.loop.create_task(self.producer())
        await asyncio.sleep(BEFORE_S)
        others = [cluster.host_of(n) for n in cluster.names if n != old]
        for h in others:
            net.cut(cluster.host_of(old), h)
        cut_s = self.loop.rng.uniform(*CUT_S)
        self.events.append(f"{old} cut off at {self.loop.time():.1f}s for {cut_s:.1f}s")
        await asyncio.sleep(cut_s)
        for h in others:
            net.heal(cluster.host_of(old), h)
        await asyncio.sleep(AFTER_S)
        self.producing = False
        await producing
        await self.until("every broker up again", self.all_up, 30.0)
        self.events.append(f"leader at the end: {await self.until('a leader at the end', self.leader, 30.0)}")
        read = await self.until("the partition read from offset 0", self.read_all, READ_S)
        await self.client.close()
        for name in cluster.names:
            cluster.kill(name)
        return self.acks, read, self.events


def test_a_leader_cut_off_while_ranges_move_loses_no_acknowledged_record(tmp_path: Path) -> None:
    failed = []
    for seed in seeds_from_env("RING_SIM_SHIPPED_RANGES", SEEDS):
        async def main(loop: VirtualLoop) -> tuple[dict[int, str], dict[int, str], list[str]]:
            return await loop.spawn(CLIENT_HOST, _World(loop, tmp_path / str(seed)).main())

        try:
            acks, read, events = run(seed, main)
        except AssertionError as exc:
            failed.append(f"seed {seed} (RING_SIM_SHIPPED_RANGES_SEED={seed} replays it): {exc}")
            continue
        assert len(acks) >= 100, (seed, len(acks))
        missing = sorted(o for o, v in acks.items() if read.get(o) != v)
        print(f"seed {seed}: {len(acks)} acknowledged, {len(read)} read; {events}")
        if missing:
            failed.append(f"seed {seed} (RING_SIM_SHIPPED_RANGES_SEED={seed} replays it): {len(missing)} "
                          f"acknowledged records not read back, offsets {missing[0]}-{missing[-1]}; {events}")
    assert not failed, "\n".join(failed)
