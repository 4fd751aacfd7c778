"""The scale part of ``ring bench``: what partitions cost a cluster at rest, and how fast a broker's
partitions fail over.

Three brokers (real processes on loopback, ``--fsync interval:1000``) get ``topics`` topics of
three partitions, replication factor 3, created a few at a time through the client API. Once every
partition has a leader and the cluster has been left alone for ``settle_s``, each broker's CPU over
``idle_s`` (user + system, from /proc) is the idle figure: the budget is 0.05 of a core per broker.
Then the broker leading the most partitions is SIGKILLed, and every partition it led is written
to (one record at consistency quorum, through the two others, retried until it is acknowledged):
the figure is when the last of them took its write, from the kill (the budget: 15 s).

``python -m ring.bench.scale --topics 1000`` runs it alone and prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import http.client
import json
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ring.bench.procs import cpu_seconds
from ring.localcluster import LocalCluster

IDLE_CORES_BUDGET = 0.05  # per broker
FAILOVER_BUDGET_S = 15.0
CREATORS = 8  # topics created at once
WRITERS = 256  # connections writing the partitions after the kill (every partition has a write in flight)
REQUEST_TIMEOUT_S = 30.0


@dataclass
class Figures:
    topics: int
    partitions: int
    create_s: float
    idle_cores: list[float]  # per broker
    killed: str
    led_by_killed: int
    writable_after_s: float  # from the kill until the last partition it led took a write
    writable_p50_s: float

    def report(self) -> str:
        idle = ", ".join(f"{c:.3f}" for c in self.idle_cores)
        return (f"{self.topics} topics x 3 partitions ({self.partitions} partitions, RF 3) on 3 brokers, created in "
                f"{self.create_s:.0f} s\n"
                f"idle CPU, cores per broker: {idle} (budget {IDLE_CORES_BUDGET})\n"
                f"SIGKILL {self.killed}, which led {self.led_by_killed} partitions: all writable again after "
                f"{self.writable_after_s:.1f} s (median partition {self.writable_p50_s:.1f} s; budget "
                f"{FAILOVER_BUDGET_S:.0f} s)")


def _request(url: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=REQUEST_TIMEOUT_S)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else None)
    finally:
        conn.close()


def _create(urls: list[str], topics: list[str]) -> None:
    def one(i: int, name: str) -> None:
        for attempt in range(20):
            try:
                status, body = _request(urls[i % len(urls)], "POST", "/v1/topics",
                                        {"name": name, "partitions": 3, "replication_factor": 3})
            except OSError:
                status, body = 0, None
            if status in (201, 409):
                return
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"creating {name}: {status} {body}")

    with concurrent.futures.ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(one, range(len(topics)), topics))


def _leaders(url: str, topics: list[str]) -> dict[tuple[str, int], str | None]:
    out: dict[tuple[str, int], str | None] = {}
    for t in topics:
        status, doc = _request(url, "GET", f"/v1/topics/{t}")
        for p in doc["partitions"] if status == 200 else []:
            out[(t, p["partition"])] = p["leader"]
    return out


def _wait_led(url: str, topics: list[str], timeout_s: float) -> dict[tuple[str, int], str | None]:
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = _leaders(url, topics)
        if len(leaders) == 3 * len(topics) and all(leaders.values()):
            return leaders
        if time.monotonic() > deadline:
            missing = sum(1 for v in leaders.values() if not v) + 3 * len(topics) - len(leaders)
            raise TimeoutError(f"{missing} partitions still have no leader")
        time.sleep(1.0)


async def _write_all(urls: list[str], keys: list[tuple[str, int]], began: float,
                     deadline: float) -> list[float | None]:
    """Write one record to every partition in ``keys`` at once, each retried until acknowledged: the
    time from ``began`` each took its write (None: not before ``deadline``)."""
    import aiohttp

    async def one(session: aiohttp.ClientSession, key: tuple[str, int]) -> float | None:
        topic, p = key
        i = p
        while time.monotonic() < deadline:
            url = f"{urls[i % len(urls)]}/v1/topics/{topic}/messages"
            try:
                async with session.post(url, params={"partition": str(p), "consistency": "quorum"},
                                        json=[{"failover": True}]) as resp:
                    await resp.read()
                    if resp.status == 200:
                        return time.monotonic() - began
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            i += 1
            await asyncio.sleep(0.1)
        return None

    connector = aiohttp.TCPConnector(limit=WRITERS)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        return list(await asyncio.gather(*(one(session, k) for k in keys)))


def run(topics: int, settle_s: float = 20.0, idle_s: float = 30.0, root: Path | None = None,
        keep: bool = False) -> Figures:
    tmp = Path(tempfile.mkdtemp(prefix="ring-scale-", dir=root))
    cluster = LocalCluster(tmp, size=3, args=["--fsync", "interval:1000"])
    try:
        cluster.start()
        names = [f"scale-{i:04d}" for i in range(topics)]
        began = time.monotonic()
        _create(cluster.urls, names)
        leaders = _wait_led(cluster.urls[0], names, 300.0)
        create_s = time.monotonic() - began
        time.sleep(settle_s)
        pids = [b.proc.pid for b in cluster.brokers if b.proc is not None]
        before, t0 = [cpu_seconds(pid) for pid in pids], time.monotonic()
        time.sleep(idle_s)
        elapsed = time.monotonic() - t0
        idle = [(cpu_seconds(pid) - b) / elapsed for pid, b in zip(pids, before)]

        leaders = _leaders(cluster.urls[0], names)
        counts = {b.name: sum(1 for v in leaders.values() if v == b.name) for b in cluster.brokers}
        victim = max(cluster.brokers, key=lambda b: counts[b.name])
        led = [k for k, v in leaders.items() if v == victim.name]
        others = [b.url for b in cluster.brokers if b is not victim]
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait()
        deadline = killed_at + 4 * FAILOVER_BUDGET_S
        took = asyncio.run(_write_all(others, led, killed_at, deadline))
        done = sorted(t for t in took if t is not None)
        if len(done) < len(led):
            raise TimeoutError(f"{len(led) - len(done)} of {len(led)} partitions {victim.name} led took no write "
                               f"within {deadline - killed_at:.0f} s")
        return Figures(topics, 3 * topics, create_s, idle, victim.name, len(led), done[-1], done[len(done) // 2])
    finally:
        cluster.kill()
        if keep:
            print(f"brokers' data and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ring.bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--settle-s", type=float, default=20.0)
    ap.add_argument("--idle-s", type=float, default=30.0)
    ap.add_argument("--keep", action="store_true", help="keep the brokers' data and logs")
    args = ap.parse_args(argv)
    f = run(args.topics, args.settle_s, args.idle_s, keep=args.keep)
    print(f.report())
    ok = max(f.idle_cores) <= IDLE_CORES_BUDGET and f.writable_after_s <= FAILOVER_BUDGET_S
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
