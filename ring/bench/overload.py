"""The overload part of ``ring bench``: what one broker does when offered more than it can take, and
whether one tenant over its quota slows another.

One broker runs as a real process on loopback with a tokens file. The load
generator (this process, uvloop when present, the lean client of ``http1``)
sends produces of one 1 KiB record, as JSON, open loop (request i leaves at
t0 + i/rate whatever the others do; latency counts from that scheduled time):

1. **maximum**: a closed loop of ``WINDOW`` requests in flight; its rate is
   the broker's maximum in this run;
2. **overload**: twice that rate, open loop: goodput (answers 200 a second),
   how fast refusals (429) come back (from when each was sent), the p99 of
   the admitted requests, and the broker's RSS before and at its peak;
3. **recovery**: right after, half the maximum: how long after the load
   dropped the last refusal came (0: none);
4. **tenants**: ``quiet`` at a quarter of the maximum, alone, then beside
   ``noisy`` offering five times its quota (a tenth of the maximum's bytes):
   quiet's p99 beside noisy over its p99 alone, and noisy's goodput against
   its quota.

The targets the report checks are the issue's: goodput at least 90% of the
maximum, refusals within a few ms, admitted p99 at most 50 ms, RSS flat,
recovery within a second, quiet's p99 within 1.5 times its own alone.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from ring import auth, clickstream
from ring.bench import http1, procs, stats
from ring.localcluster import LocalBroker, free_port

WINDOW = 256  # the closed loop that finds the maximum, as the produce cases' window
# Open-loop requests outstanding at once, each on a connection opened before the phase (as clients
# keep pools): under the broker's connection bound with the tenants' beside it. Opened on demand,
# a burst of connects overflows the listening socket's backlog and waits for SYN retries (1 s, 3 s ...),
# which measures the kernel, not the broker.
IN_FLIGHT_MAX = 1000
CONNECTS_AT_ONCE = 50
RECORD_BYTES = 1024
TOKENS = {"bench": "t-bench", "noisy": "t-noisy", "quiet": "t-quiet"}


class Tally:
    """The answers of one run: latencies of the 200s from their scheduled start, of the 429s from their send."""

    def __init__(self) -> None:
        self.ok_ms: list[float] = []
        self.refused_ms: list[float] = []
        self.refused_at: list[float] = []  # perf_counter of each 429's answer
        self.other = 0
        self.last_other = ""
        self.t0 = time.perf_counter()
        self.last_answer = self.t0

    def result(self, seconds: float) -> dict[str, Any]:
        # Goodput over the whole span, to the last answer: answers that come late count late.
        seconds = max(seconds, self.last_answer - self.t0)
        return {"seconds": seconds, "ok": len(self.ok_ms), "ok_per_s": len(self.ok_ms) / seconds if seconds else None,
                "refused": len(self.refused_ms), "other": self.other, "last_other": self.last_other,
                "ok_lat_ms": stats.latency_summary(self.ok_ms), "refused_lat_ms": stats.latency_summary(self.refused_ms)}


def _request(pool: http1.Pool, token: str, body: bytes) -> bytes:
    head = pool.post_head("/v1/topics/overload/messages", "application/json", len(body))
    return head[:-2] + f"Authorization: Bearer {token}\r\n\r\n".encode() + body


async def _one(pool: http1.Pool, data: bytes, tally: Tally, scheduled: float) -> None:
    sent = time.perf_counter()
    try:
        status, answer = await pool.request(data)
    except Exception as exc:  # counted: an overloaded broker may drop a connection, the bench goes on
        tally.other += 1
        tally.last_other = f"{type(exc).__name__}: {exc}"[:200]
        return
    now = tally.last_answer = time.perf_counter()
    if status == 200:
        tally.ok_ms.append((now - scheduled) * 1000)
    elif status == 429:
        tally.refused_ms.append((now - sent) * 1000)
        tally.refused_at.append(now)
    else:
        tally.other += 1
        tally.last_other = f"{status}: {answer[:200]!r}"


async def warm(pool: http1.Pool, n: int) -> None:
    """Open ``n`` connections of ``pool`` now, a few at a time, and keep them idle in it."""
    while len(pool.all) < n:
        opened = await asyncio.gather(*(pool._open() for _ in range(min(CONNECTS_AT_ONCE, n - len(pool.all)))))
        pool.idle.extend(opened)


async def paced(pool: http1.Pool, data: bytes, rate: float, seconds: float) -> tuple[Tally, float]:
    """Open loop at ``rate`` a second for ``seconds``; the tally and when the last request was sent."""
    tally, tasks = Tally(), set()
    gate = asyncio.Semaphore(len(pool.all) or IN_FLIGHT_MAX)  # no more than its open connections
    t0 = tally.t0
    for i in range(int(rate * seconds)):
        scheduled = t0 + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await gate.acquire()
        task = asyncio.ensure_future(_one(pool, data, tally, scheduled))
        task.add_done_callback(lambda _t: gate.release())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    sent_until = time.perf_counter()
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    return tally, sent_until


async def closed(pool: http1.Pool, data: bytes, seconds: float) -> float:
    """Requests answered 200 a second with WINDOW in flight for ``seconds``."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            status, answer = await pool.request(data)
            if status == 200:
                done += 1
            elif status != 429:  # a refusal is the admission at work: the maximum is what is served
                raise RuntimeError(f"produce at the maximum: {status} {answer[:200]!r}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(WINDOW)))
    return done / (time.perf_counter() - t0)


async def _run(url: str, pid: int, seconds: float, quota: float) -> dict[str, Any]:
    import random

    body = b"[" + clickstream.padded_record(random.Random(1), RECORD_BYTES) + b"]"
    pools = {name: http1.Pool(url) for name in TOKENS}
    data = {name: _request(pools[name], token, body) for name, token in TOKENS.items()}
    res: dict[str, Any] = {"record_bytes": RECORD_BYTES, "body_bytes": len(body), "seconds": seconds,
                           "quota_bytes_per_s": quota}
    try:
        await closed(pools["bench"], data["bench"], min(seconds, 2.0))  # warm up
        res["max_per_s"] = rate = await closed(pools["bench"], data["bench"], seconds)
        peak = [procs.rss_bytes(pid)]
        res["rss_before"] = peak[0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(procs.SAMPLE_INTERVAL_S):
                peak[0] = max(peak[0], procs.rss_bytes(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        await warm(pools["bench"], IN_FLIGHT_MAX)
        cpu0 = time.process_time()
        over, dropped_at = await paced(pools["bench"], data["bench"], 2 * rate, seconds)
        res["overload"] = over.result(seconds)
        # The load generator's own CPU share while offering it: near 1, it (not the broker) set the pace.
        res["loadgen_cpu_share"] = (time.process_time() - cpu0) / res["overload"]["seconds"]
        after, _ = await paced(pools["bench"], data["bench"], rate / 2, 3.0)
        sampling.set()
        sampler.join()
        res["rss_peak"], res["rss_after"] = peak[0], procs.rss_bytes(pid)
        pools["bench"].close()  # its connections would count against the broker's bound below
        res["recovery"] = after.result(3.0)
        late = [t for t in after.refused_at if t > dropped_at]
        res["recovery_s"] = (max(late) - dropped_at) if late else 0.0
        await asyncio.gather(warm(pools["quiet"], IN_FLIGHT_MAX // 2), warm(pools["noisy"], IN_FLIGHT_MAX // 2))
        quiet_alone, _ = await paced(pools["quiet"], data["quiet"], rate / 4, seconds)
        noisy_rate = 5 * res["quota_bytes_per_s"] / len(body)
        (quiet, _), (noisy, _) = await asyncio.gather(paced(pools["quiet"], data["quiet"], rate / 4, seconds),
                                                      paced(pools["noisy"], data["noisy"], noisy_rate, seconds))
        res["quiet_alone"], res["quiet_beside"] = quiet_alone.result(seconds), quiet.result(seconds)
        res["noisy"] = noisy.result(seconds)
    finally:
        for pool in pools.values():
            pool.close()
    return res


def run_part(seconds: float = 5.0, fsync: str = "interval:1000", quota_bytes_per_s: float | None = None) -> dict:
    """Start one broker, run the overload and tenant cases, stop it; the results. The noisy tenant's
    quota is set before the broker starts: a tenth of a first maximum measured without it."""
    workdir = Path(tempfile.mkdtemp(prefix="ring-overload-"))
    tokens = workdir / "tokens"
    broker = None
    try:
        quota = quota_bytes_per_s or 1.0  # rewritten below once the maximum is known
        lines = [auth.file_line(TOKENS["bench"], "bench", "admin", "*"),
                 auth.file_line(TOKENS["quiet"], "quiet", "produce", "*"),
                 auth.file_line(TOKENS["noisy"], "noisy", "produce", "*", f"produce_bytes_per_s={quota:g}")]
        tokens.write_text("\n".join(lines) + "\n")
        log_path = workdir / "ring-0.log"
        broker = LocalBroker("ring-0", workdir / "ring-0", free_port(), log_path=log_path,
                             args=["--fsync", fsync, "--auth-tokens", str(tokens)])
        broker.start()
        created = broker_http(broker.url, "POST", "/v1/topics", {"name": "overload", "partitions": 4})
        assert created in (200, 201), created
        assert broker.proc is not None
        if quota_bytes_per_s is None:
            quota = max(1.0, asyncio.run(_first_max(broker.url)) * 0.1 * (RECORD_BYTES + 2))
            lines[2] = auth.file_line(TOKENS["noisy"], "noisy", "produce", "*", f"produce_bytes_per_s={quota:.0f}")
            tokens.write_text("\n".join(lines) + "\n")
            broker.proc.send_signal(signal.SIGHUP)  # the broker reads its tokens again: no restart
            deadline = time.monotonic() + 10
            while "client tokens reloaded" not in log_path.read_text(errors="replace"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the broker did not reload its tokens file on SIGHUP")
                time.sleep(0.05)
        return asyncio.run(_run(broker.url, broker.proc.pid, seconds, quota))
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def _first_max(url: str) -> float:
    import random

    pool = http1.Pool(url)
    body = b"[" + clickstream.padded_record(random.Random(1), RECORD_BYTES) + b"]"
    try:
        return await closed(pool, _request(pool, TOKENS["bench"], body), 2.0)
    finally:
        pool.close()


def broker_http(url: str, method: str, path: str, doc: Any) -> int:
    import urllib.request

    req = urllib.request.Request(url + path, data=orjson.dumps(doc), method=method,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKENS['bench']}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _ms(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    return "—" if value is None else f"{value:.1f} ms"


def report(res: dict[str, Any]) -> list[str]:
    """The part's Markdown: each figure beside the issue's target, and whether it is met."""
    rate, over = res["max_per_s"], res["overload"]
    mib = 1 << 20

    def row(what: str, value: str, target: str, met: bool | None) -> str:
        return f"| {what} | {value} | {target} | {'yes' if met else 'no' if met is not None else '—'} |"

    refused_p99, admitted_p99 = over["refused_lat_ms"]["p99"], over["ok_lat_ms"]["p99"]
    grown = res["rss_peak"] - res["rss_before"]
    alone, beside = res["quiet_alone"]["ok_lat_ms"]["p99"], res["quiet_beside"]["ok_lat_ms"]["p99"]
    noisy_bytes = res["noisy"]["ok_per_s"] * res["body_bytes"] if res["noisy"]["ok_per_s"] is not None else None
    return [
        f"One broker, produces of one {res['record_bytes']} B record as JSON, {res['seconds']:g} s a phase. "
        f"Maximum (closed loop, {WINDOW} in flight): **{rate:,.0f} requests/s**; offered twice that, open loop.",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
        row("goodput at 2x the maximum", f"{over['ok_per_s']:,.0f}/s ({over['ok_per_s'] / rate:.0%})", ">= 90%",
            over["ok_per_s"] >= 0.9 * rate),
        row("refusals (429), p50 / p99 from their send", f"{over['refused']:,}: {_ms(over['refused_lat_ms'], 'p50')} / "
            f"{_ms(over['refused_lat_ms'], 'p99')}", "a few ms", None if refused_p99 is None else refused_p99 <= 5),
        row("admitted requests, p99 from their scheduled start", _ms(over["ok_lat_ms"], "p99"), "<= 50 ms",
            None if admitted_p99 is None else admitted_p99 <= 50),
        row("broker RSS before / peak", f"{res['rss_before'] / mib:.0f} / {res['rss_peak'] / mib:.0f} MiB", "flat",
            grown <= 64 * mib),
        row("last refusal after the load dropped to half", f"{res['recovery_s']:.2f} s", "<= 1 s",
            res["recovery_s"] <= 1.0),
        row("quiet tenant's p99 beside noisy (5x its quota) / alone",
            f"{_ms(res['quiet_beside']['ok_lat_ms'], 'p99')} / {_ms(res['quiet_alone']['ok_lat_ms'], 'p99')}",
            "<= 1.5x", None if not alone or beside is None else beside <= 1.5 * alone),
        row("noisy tenant's goodput / its quota",
            f"{(noisy_bytes or 0) / 1024:,.0f} / {res['quota_bytes_per_s'] / 1024:,.0f} KiB/s", "~1x",
            # a quota lets a second's worth through at once: over a phase of S s, (S + 1) / S of the rate
            None if noisy_bytes is None else noisy_bytes <= (1 + 1 / res["seconds"]) * res["quota_bytes_per_s"]),
        "",
        f"Errors other than 429 (overload / recovery / quiet / noisy): {over['other']} / {res['recovery']['other']} / "
        f"{res['quiet_beside']['other']} / {res['noisy']['other']}"
        + (f" (last: {over['last_other']})" if over["last_other"] else "") + ".",
        f"The load generator used {res['loadgen_cpu_share']:.0%} of a core while offering twice the maximum"
        + ("; at that share it, not the broker, set the pace, and the overload row measures the generator: "
           "a second machine for the load is needed for that claim." if res["loadgen_cpu_share"] > 0.85 else "."),
    ]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ring.bench.overload", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=5.0, help="each phase's length (default 5)")
    p.add_argument("--fsync", default="interval:1000")
    args = p.parse_args(argv)
    res = run_part(args.seconds, args.fsync)
    print("\n".join(report(res)))
    print(orjson.dumps(res).decode())
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
