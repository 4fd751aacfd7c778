"""One chaos run from start to verdict: cluster up, load and faults, heal, settle, drain, check.

``run(spec)`` (async, in this process) does it all and returns a result
document: the spec, the checker's report, the fault events and a few
measurements; the history and the brokers' logs stay in ``spec.root``.
``run_isolated(spec)`` is what callers use: with the ``netns`` transport it
makes the namespaces, runs ``python -m tests.chaos one`` inside the hub (the
harness must be there to reach the brokers), reads the result it wrote and
deletes the namespaces (killing, by PID, anything left inside) even when the
run failed; with ``loopback`` or ``proxy`` it runs in this process. Either way
every broker is stopped before it returns, and every wait is bounded: the
whole run by ``RUN_BUDGET_S`` beyond its duration.

After the load stops and the faults are healed, the harness waits (bounded)
until every broker sees every other one up, then writes once to every
partition (retrying until acknowledged: is the cluster writable again?),
waits until every partition's replicas hold the same batches, then reads
every partition through every broker's client API and every replica's own
log: the final drain. Replicas that still differ are what the checker calls
divergent. Scenarios with consumer-group members stop them (a clean close)
when the load stops, and read the group's committed offsets after the drain.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos import netns
from tests.chaos.checker import check
from tests.chaos.cluster import REPO_ROOT, ChaosCluster
from tests.chaos.faults import Faults, SizeSampler
from tests.chaos.groupload import GroupLoad
from tests.chaos.history import FINAL, REPLICA, History, ReplicaCopy
from tests.chaos.network import Loopback, Network, NetnsNetwork, ProxyNetwork
from tests.chaos.scenarios import SCENARIOS, Ctx
from tests.chaos.workload import Load, Workload, broker_takes_producer_ids

TOPIC = "chaos"
PARTITIONS = 6
SEGMENT_BYTES = 4 * 1024  # small, so closed segments exist within seconds (bit flips, torn tails)
SETTLE_S = 60.0  # after healing: every broker up everywhere (a restarted broker rejoins in seconds)
PROBE_S = 30.0  # then: a write to every partition is acknowledged again (10 s in short runs)
PROBE_SHORT_S = 10.0
CONVERGE_S = 20.0  # then: replicas identical (8 s in short runs: divergence does not heal by waiting)
CONVERGE_SHORT_S = 8.0
GROUP_OFFSETS_S = 20.0  # after the drain: some broker describes the consumer group
RUN_BUDGET_S = 240.0  # start, healing, settling, draining, stopping: beyond this a run is stuck
TRANSPORTS = ("loopback", "netns", "proxy")


@dataclass
class RunSpec:
    scenario: str
    consistency: str
    root: str
    duration_s: float | None = None  # None: the scenario's (short or full)
    short: bool = False
    seed: int = 1
    transport: str = "loopback"
    netns: dict[str, Any] = field(default_factory=dict)  # {"hub", "brokers"}: made by the parent

    @property
    def seconds(self) -> float:
        s = SCENARIOS[self.scenario]
        return self.duration_s if self.duration_s is not None else (s.short_s if self.short else s.duration_s)


def _network(spec: RunSpec) -> Network:
    scenario = SCENARIOS[spec.scenario]
    if spec.transport == "netns":
        return NetnsNetwork(netns.Namespaces.existing(spec.netns["hub"], spec.netns["brokers"]))
    if spec.transport == "proxy":
        return ProxyNetwork(scenario.brokers + scenario.spare)
    return Loopback(scenario.brokers + scenario.spare)


async def run(spec: RunSpec) -> dict[str, Any]:
    scenario = SCENARIOS[spec.scenario]
    assert not scenario.partitions or spec.transport != "loopback", f"{spec.scenario} needs netns or proxy"
    root = Path(spec.root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    t0 = time.monotonic()
    now = lambda: time.monotonic() - t0  # noqa: E731
    history = History(meta={"spec": asdict(spec), "fsync": scenario.fsync,
                            "wall_ms_at_start": int(time.time() * 1000) - int((time.monotonic() - t0) * 1000)})
    cluster = ChaosCluster(root / "brokers", _network(spec), scenario.fsync, scenario.args, scenario.spare,
                           scenario.domain_args)
    result: dict[str, Any] = {"spec": asdict(spec), "scenario": scenario.what, "fsync": scenario.fsync,
                              "network": cluster.network.name, "seconds": spec.seconds, "error": "",
                              "drained": False}
    try:
        await asyncio.wait_for(_run(spec, cluster, history, rng, now, result), spec.seconds + RUN_BUDGET_S)
    except Exception as exc:  # a stuck or broken run is a result too: it is reported, never hidden
        result["error"] = f"{exc.__class__.__name__}: {exc}"
        history.events.append((round(now(), 3), "run error: " + traceback.format_exc(limit=5)))
    finally:
        try:
            await asyncio.wait_for(cluster.close(), 60)
        except Exception:
            cluster.kill_all()
    report = check(history)
    result |= {"report": report.to_json(), "events": history.events, "meta": history.meta,
               "elapsed_s": round(now(), 1)}
    with gzip.open(root / "history.json.gz", "wt") as f:
        json.dump(history.to_json(), f)
    (root / "result.json").write_text(json.dumps(result, indent=1))
    return result


async def _run(spec: RunSpec, cluster: ChaosCluster, history: History, rng: random.Random, now,
               result: dict[str, Any]) -> None:
    scenario = SCENARIOS[spec.scenario]
    await cluster.start()
    history.events.append((round(now(), 3), "cluster up"))
    tail = {"local_retention_bytes": 0} if scenario.ranges else {}  # ranges: the replicas keep their active segment
    await cluster.create_topic(name=TOPIC, partitions=PARTITIONS, replication_factor=3,
                               consistency=spec.consistency, segment_bytes=SEGMENT_BYTES, **tail)
    idempotent = await broker_takes_producer_ids(cluster)
    history.meta["idempotent_producers"] = idempotent
    load = Load(TOPIC, PARTITIONS, spec.consistency, spec.seconds, run_tag=f"s{spec.seed}",
                backlog_readers=2 if scenario.ranges else 0)
    workload = Workload(cluster, load, history, rng, now, idempotent)
    sampler = SizeSampler(cluster, TOPIC, PARTITIONS)
    faults = Faults(cluster, TOPIC, PARTITIONS, history, random.Random(rng.random()), now, sampler)
    sampler_stop = asyncio.Event()
    sampler_task = asyncio.create_task(sampler.run(sampler_stop))
    deadline = time.monotonic() + spec.seconds
    load_task = asyncio.create_task(workload.run())
    groups = GroupLoad(cluster, TOPIC, history, random.Random(rng.random()), now) if scenario.groups else None
    if groups is not None:
        groups.start(deadline)
    try:
        await scenario.drive(Ctx(faults, deadline, spec.short, groups))
        await asyncio.wait_for(asyncio.shield(load_task), max(0.0, deadline - time.monotonic()) + 15)
    finally:
        workload.stop.set()
        sampler_stop.set()
        await asyncio.gather(load_task, sampler_task, return_exceptions=True)
        if groups is not None:
            await groups.stop()
    history.events.append((round(now(), 3), "load stopped"))
    await faults.heal_all()
    history.events.append((round(now(), 3), "healed"))
    began = time.monotonic()
    up = await cluster.wait_all_up(SETTLE_S)
    history.meta["settle_s"] = round(time.monotonic() - began, 1)
    history.events.append((round(now(), 3), "every broker sees every broker up" if up else
                           f"brokers still not all up after {SETTLE_S:g} s"))
    history.meta["writable_after_heal_s"] = await workload.probe(PROBE_SHORT_S if spec.short else PROBE_S)
    history.events.append((round(now(), 3), "every partition writable again"
                           if history.meta["writable_after_heal_s"] is not None else
                           "some partition still refuses writes"))
    history.meta["converge_s"] = await _converge(cluster, now, CONVERGE_SHORT_S if spec.short else CONVERGE_S)
    history.events.append((round(now(), 3), "replicas identical" if history.meta["converge_s"] is not None
                           else "replicas still differ"))
    await _drain(cluster, history, now)
    history.events.append((round(now(), 3), "drained"))
    if groups is not None:
        history.group_committed = await groups.committed(GROUP_OFFSETS_S)
        if history.group_committed is None:
            history.drain_errors.append("the group's committed offsets could not be read")
    result["drained"] = True
    history.meta["partitions"] = {i: await cluster.describe(TOPIC, i) for i in cluster.members}
    await faults.sample_starts()
    if "timestamp_probe" in history.meta:
        await faults.probe_timestamps()


async def _copies(cluster: ChaosCluster, now) -> list[tuple[ReplicaCopy, list]]:
    """Each partition's replicas' own logs (from their log start: with a local tail, what is below is in
    ranges, read through the client API by the drain)."""
    placed: dict[int, list[int]] = {}
    for i in cluster.members:
        parts = await cluster.describe(TOPIC, i)
        if parts:
            placed = {p["partition"]: [cluster.index(r) for r in p["replicas"] if r in cluster.names
                                       and cluster.index(r) in cluster.members] for p in parts}
            break
    return [await cluster.replica_copy(i, TOPIC, p, REPLICA, now())
            for p in range(PARTITIONS) for i in placed.get(p) or cluster.members]


async def _converge(cluster: ChaosCluster, now, timeout_s: float) -> float | None:
    """Seconds until every partition's replicas hold the same batches; None if they never did in time."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        copies = [c for c, _ in await _copies(cluster, now)]
        by_p: dict[int, set] = {}
        for c in copies:
            by_p.setdefault(c.partition, set()).add(c.batches if not c.error else ("error", c.broker))
        if all(len(v) == 1 for v in by_p.values()):
            return round(time.monotonic() - began, 1)
        await asyncio.sleep(0.5)
    return None


async def _drain(cluster: ChaosCluster, history: History, now) -> None:
    for i in cluster.members:
        for p in range(PARTITIONS):
            reads, error = await cluster.read_partition(i, TOPIC, p, FINAL, now())
            history.reads += reads
            if error:
                history.drain_errors.append(f"{cluster.brokers[i].name} partition {p}: {error}")
    for copy, reads in await _copies(cluster, now):
        history.replicas.append(copy)
        history.reads += reads


# --- running in namespaces -------------------------------------------------------------------


def run_isolated(spec: RunSpec) -> dict[str, Any]:
    """Run one spec to its result, in namespaces when its transport says so; nothing is left running."""
    if spec.transport != "netns":
        return asyncio.run(run(spec))
    root = Path(spec.root)
    root.mkdir(parents=True, exist_ok=True)
    netns.remove_stale()
    scenario = SCENARIOS[spec.scenario]
    with netns.Namespaces(scenario.brokers + scenario.spare) as ns:
        spec.netns = {"hub": ns.hub, "brokers": ns.brokers}
        cmd = [*ns.prefix(None), sys.executable, "-m", "tests.chaos", "one", json.dumps(asdict(spec))]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with open(root / "harness.log", "ab") as log:
            try:
                subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               timeout=spec.seconds + RUN_BUDGET_S + 90, check=False)
            except subprocess.TimeoutExpired:
                pass  # the namespaces' exit kills whatever is still inside
    try:
        return json.loads((root / "result.json").read_text())
    except (OSError, ValueError) as exc:
        return {"spec": asdict(spec), "scenario": SCENARIOS[spec.scenario].what, "network": "netns",
                "fsync": SCENARIOS[spec.scenario].fsync, "report": None,
                "error": f"the run inside the namespace left no result ({exc}); see {root / 'harness.log'}"}
