"""The single-broker part of ``ring bench``: produce and fetch on one broker
against this machine's disk, stored batches against JSON.

One broker runs as a real process on loopback (fsync interval, the default).
The load generator (this process, uvloop when present) keeps a fixed window of
requests in flight:

- produce: batches of 1 KiB clickstream records sent as stored batches
  (``application/vnd.ring.batch``), the zero-copy path; and the same records
  as JSON arrays, the curl path, for comparison;
- fetch: every partition read from offset 0 as stored batches
  (``application/vnd.ring.batches``) and as JSON.

In the same run it measures the ceiling: raw sequential appends of the same
bytes in the same chunk size to a file on the same disk, with one fsync at the
end, so the broker's figure reads as a fraction of what the disk allows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from ring import clickstream
from ring.bench.ceilings import disk_append
from ring.localcluster import LocalBroker, free_port
from ring.log import batch as batchfmt

RECORD_BYTES = 1024
BATCH_CT = "application/vnd.ring.batch"
BATCHES_CT = "application/vnd.ring.batches"
# The raw-append ceiling stops after this long even if the bytes are not all written.
DISK_SECONDS_MAX = 60.0


def _records(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [clickstream.padded_record(rng, RECORD_BYTES) for _ in range(n)]


async def _windowed(total: int, window: int, make_request) -> float:
    """Run ``total`` requests with ``window`` in flight; seconds taken."""
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < total:
            i = next_i
            next_i += 1
            await make_request(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    return time.perf_counter() - t0


REFUSALS_MAX = 50  # 429s (the broker's admission control on a busy machine) one request waits out


async def _produce(session, url, topic, payloads, content_type, requests, window) -> float:
    async def one(i: int) -> None:
        for _ in range(REFUSALS_MAX):
            async with session.post(
                f"{url}/v1/topics/{topic}/messages",
                params={"partition": str(i % 4)},
                data=payloads[i % len(payloads)],
                headers={"Content-Type": content_type},
            ) as r:
                if r.status == 429:  # refused before anything was written: wait as it asks, then again
                    await asyncio.sleep(float(r.headers.get("Retry-After", "0.1")))
                    continue
                if r.status != 200:
                    raise RuntimeError(f"produce: {r.status} {await r.text()}")
                await r.read()
                return
        raise RuntimeError(f"produce: refused {REFUSALS_MAX} times (429)")

    return await _windowed(requests, window, one)


async def _fetch_all(session, url, topic, accept, max_bytes) -> tuple[float, int]:
    """Read partitions 0..3 from offset 0 to the end; returns (seconds, bytes)."""
    total = 0

    async def part(p: int) -> None:
        nonlocal total
        offset = 0
        refused = 0
        while True:
            async with session.get(
                f"{url}/v1/topics/{topic}/partitions/{p}/messages",
                params={"offset": str(offset), "max_bytes": str(max_bytes), "max_records": "10000"},
                headers={"Accept": accept},
            ) as r:
                body = await r.read()
                if r.status == 429 and refused < REFUSALS_MAX:
                    refused += 1
                    await asyncio.sleep(float(r.headers.get("Retry-After", "0.1")))
                    continue
                if r.status != 200:
                    raise RuntimeError(f"fetch: {r.status} {body[:200]!r}")
                if accept == BATCHES_CT:
                    nxt, hw = int(r.headers["Ring-Next-Offset"]), int(r.headers["Ring-High-Watermark"])
                else:
                    doc = orjson.loads(body)
                    nxt, hw = doc["next_offset"], doc["high_watermark"]
            total += len(body)
            if nxt >= hw or nxt == offset:
                return
            offset = nxt

    t0 = time.perf_counter()
    await asyncio.gather(*(part(p) for p in range(4)))
    return time.perf_counter() - t0, total


async def _run(url: str, args, workdir: Path) -> dict:
    recs = _records(args.batch * 8)
    now_ms = int(time.time() * 1000)
    batches = [
        bytes(batchfmt.encode([(None, None, v, None) for v in recs[i : i + args.batch]], now_ms=now_ms))
        for i in range(0, len(recs), args.batch)
    ]
    jsons = [b"[" + b",".join(recs[i : i + args.batch]) + b"]" for i in range(0, len(recs), args.batch)]
    requests = max(1, args.records // args.batch)
    results: dict = {"records": requests * args.batch, "batch": args.batch, "window": args.window}
    load_before = os.getloadavg()[0]
    conn = aiohttp.TCPConnector(limit=args.window)
    async with aiohttp.ClientSession(connector=conn) as s:
        for topic in ("bench-batch", "bench-json"):
            async with s.post(f"{url}/v1/topics", json={"name": topic, "partitions": 4}) as r:
                await r.read()
        # warm-up: first writes on a fresh disk are slower (MACHINE-NOTES)
        await _produce(s, url, "bench-warm", batches, BATCH_CT, min(200, requests), args.window)
        sec = await _produce(s, url, "bench-batch", batches, BATCH_CT, requests, args.window)
        results["produce_batch_rec_s"] = requests * args.batch / sec
        sec = await _produce(s, url, "bench-json", jsons, "application/json", requests, args.window)
        results["produce_json_rec_s"] = requests * args.batch / sec
        sec, nbytes = await _fetch_all(s, url, "bench-batch", BATCHES_CT, 4 << 20)
        results["fetch_batch_rec_s"] = requests * args.batch / sec
        results["fetch_batch_mb_s"] = nbytes / sec / 1e6
        sec, _ = await _fetch_all(s, url, "bench-batch", "application/json", 4 << 20)
        results["fetch_json_rec_s"] = requests * args.batch / sec
    results["load_avg_1m"] = (load_before, os.getloadavg()[0])
    chunk = batches[0]
    total = requests * len(chunk)
    results["disk_append_mb_s"] = disk_append(workdir, chunk, DISK_SECONDS_MAX, total, fsync_each=False)["mb_s"]
    results["disk_append_fsync_each_mb_s"] = disk_append(
        workdir, chunk, DISK_SECONDS_MAX, min(total, 64 << 20), fsync_each=True)["mb_s"]
    results["disk_append_rec_s"] = results["disk_append_mb_s"] * 1e6 / (len(chunk) / args.batch)
    return results


def report(res: dict, command: str) -> str:
    rec_mb = RECORD_BYTES / 1e6
    disk = res["disk_append_rec_s"]
    rows = [
        ("produce, stored batches", res["produce_batch_rec_s"]),
        ("produce, JSON arrays", res["produce_json_rec_s"]),
        ("fetch, stored batches", res["fetch_batch_rec_s"]),
        ("fetch, JSON", res["fetch_json_rec_s"]),
    ]
    load = res.get("load_avg_1m", (0.0, 0.0))
    busy = max(load) > (os.cpu_count() or 1) * 0.75
    lines = [
        f"command: `{command}`",
        f"load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}"
        + (" -- FLAGGED: other processes were using much of the CPU; figures are depressed" if busy else ""),
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"records: {res['records']} x {RECORD_BYTES} B, {res['batch']} per request, {res['window']} requests in flight",
        "",
        "| case | records/s | MB/s | vs raw disk append |",
        "|---|---:|---:|---:|",
    ]
    for name, rate in rows:
        lines.append(f"| {name} | {rate:,.0f} | {rate * rec_mb:,.1f} | {rate / disk:.2f} |")
    lines.append(f"| raw disk append, same chunks, one fsync | {disk:,.0f} | {res['disk_append_mb_s']:,.1f} | 1.00 |")
    lines.append(f"| raw disk append, fdatasync per chunk | | {res['disk_append_fsync_each_mb_s']:,.1f} | |")
    return "\n".join(lines)


def run_part(records: int = 200_000, batch: int = 100, window: int = 32, fsync: str = "interval:1000") -> dict:
    """Start one broker, run the single-broker cases, stop it; the results."""
    args = argparse.Namespace(records=records, batch=batch, window=window, fsync=fsync)
    workdir = Path(tempfile.mkdtemp(prefix="ring-bench-single-"))
    broker = LocalBroker("ring-0", workdir / "ring-0", free_port(), args=["--fsync", args.fsync])
    try:
        broker.start()
        try:
            import uvloop
            runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        except ImportError:
            runner = asyncio.Runner()
        with runner:
            return runner.run(_run(broker.url, args, workdir))
    except Exception as exc:
        log = workdir / "ring-0.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        raise RuntimeError(f"{exc}; broker log: {' | '.join(tail)[-600:]}") from exc
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m ring.bench.single``: this part alone."""
    p = argparse.ArgumentParser(prog="python -m ring.bench.single", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000, help="records per produce case")
    p.add_argument("--batch", type=int, default=100, help="records per request")
    p.add_argument("--window", type=int, default=32, help="requests in flight")
    p.add_argument("--fsync", default="interval:1000", help="broker fsync policy")
    args = p.parse_args(argv)
    res = run_part(args.records, args.batch, args.window, args.fsync)
    print(report(res, " ".join(["python -m ring.bench.single", *(argv if argv is not None else sys.argv[1:])])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
