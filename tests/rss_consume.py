"""Broker memory while a consumer reads a full topic from offset 0, the way ``ring bench`` does.

Starts three real brokers (``ring.localcluster``, RF 3, fsync ``interval:1000``
as the bench runs them), fills a 3-partition topic with ``--records`` 1 KiB
records by batched produce (100 a request, 32 in flight, the bench's own
driver ``ring.bench.gen_ring``), then reads it all back twice: by fetch of
every partition from offset 0 (4 MiB a fetch, as the bench asks) and as one
member of a consumer group polling with auto-commit. A thread samples each
broker's VmRSS from /proc every 50 ms and the script prints, per phase, each
broker's peak and its RSS at the end of the phase.

``--probe`` also starts every broker with ``tests/memprobe`` on its path (a
``sitecustomize`` that turns tracemalloc on and dumps, on SIGUSR1, the top
allocation sites, glibc's malloc statistics and ``smaps_rollup``) and dumps
each broker after each phase into ``<root>/ring-N.memprobe``.

Run: ``python -m tests.rss_consume [--records 300000] [--probe]``. Every loop is
bounded in count and time; only loopback is used; brokers are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ring.bench.gen_ring import RingDriver
from ring.bench.loadgen import make_records, windowed
from ring.localcluster import LocalCluster

REPO_ROOT = Path(__file__).resolve().parent.parent
PROBE_DIR = Path(__file__).resolve().parent / "memprobe"
SAMPLE_INTERVAL_S = 0.05
PHASE_SECONDS_MAX = 120.0


def vm_kib(pid: int, field: str) -> int:
    """A ``Vm*`` line of /proc/PID/status, in KiB (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Peak VmRSS of each process since the last ``cut``."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = {n: 0 for n in pids}
        self._lock = threading.Lock()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_INTERVAL_S):
            with self._lock:
                for n, pid in self.pids.items():
                    self.peak[n] = max(self.peak[n], vm_kib(pid, "VmRSS"))

    def cut(self) -> dict[str, tuple[int, int]]:
        """{name: (peak KiB since the last cut, now KiB)}; starts a new period."""
        with self._lock:
            now = {n: vm_kib(pid, "VmRSS") for n, pid in self.pids.items()}
            out = {n: (max(self.peak[n], now[n]), now[n]) for n in self.pids}
            self.peak = dict(now)
        return out

    def stop(self) -> None:
        self._done.set()
        self.join(2)


async def run(root: Path, records: int, probe: bool) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    env = {"PYTHONPATH": f"{PROBE_DIR}:{REPO_ROOT}" if probe else str(REPO_ROOT)}
    if probe:
        env["RING_MEMPROBE"] = "1"
    cluster = LocalCluster(root, 3, args=["--fsync", "interval:1000", "--log-level", "warning"], env=env)
    cluster.start()
    pids = {b.name: b.proc.pid for b in cluster.brokers if b.proc is not None}
    sampler = Sampler(pids)
    sampler.start()
    phases: list[tuple[str, dict[str, tuple[int, int]]]] = []

    def phase(name: str) -> None:
        phases.append((name, sampler.cut()))
        if probe:
            for b in cluster.brokers:
                assert b.proc is not None
                b.proc.send_signal(signal.SIGUSR1)
                (root / f"{b.name}.memprobe").open("a").write(f"\n##### after {name}\n")
            time.sleep(2.0)  # the dumps are written between requests

    spec: dict[str, Any] = {"system": "ring", "target": {"urls": cluster.urls, "partitions": 3,
                                                          "replication_factor": 3},
                            "topic": "rss-consume", "consistency": "quorum", "window": 32,
                            "keep_topic": True}
    driver = RingDriver(spec, make_records())
    try:
        await driver.open()
        phase("start")
        fill = await windowed(driver.sender(100, False), 32, records // 100, PHASE_SECONDS_MAX)
        assert not fill["errors"], fill["last_error"]
        phase(f"fill ({fill['records']} records, {fill['rec_s']:.0f}/s)")
        t0 = time.perf_counter()
        got = await driver.consume(fill["records"], PHASE_SECONDS_MAX)
        phase(f"fetch from 0 ({got} records, {got / (time.perf_counter() - t0):.0f}/s)")
        t0 = time.perf_counter()
        got = await driver.consume_group(fill["records"], PHASE_SECONDS_MAX)
        phase(f"group poll ({got} records, {got / (time.perf_counter() - t0):.0f}/s)")
    finally:
        await driver.close()
        sampler.stop()
        cluster.stop()
    return phases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=300_000)
    p.add_argument("--probe", action="store_true", help="tracemalloc and malloc statistics in each broker")
    p.add_argument("--root", type=Path, default=None, help="keep the data and logs here")
    args = p.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="ring-rss-"))
    phases = asyncio.run(run(root, args.records, args.probe))
    names = sorted(phases[0][1])
    print(f"{'phase':<44}" + "".join(f"{n + ' peak/end MB':>24}" for n in names))
    for name, figures in phases:
        cells = "".join(f"{figures[n][0] / 1024:>15.1f} / {figures[n][1] / 1024:>6.1f}" for n in names)
        print(f"{name:<44}{cells}")
    print(f"largest peak: {max(f[n][0] for _, f in phases for n in names) / 1024:.1f} MB; data and logs in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
