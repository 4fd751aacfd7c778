"""The hostile-input part of ``ring bench``: what a produce at each documented limit, and 16 clients
trickling bodies, cost one broker.

Each produce case runs against a broker of its own (a real process on loopback, fsync interval):
a small produce of the same content type first (the topic exists, the code paths are warm), then
the broker's peak resident set is reset (``/proc/PID/clear_refs``, value 5) and the case's one
request is sent. The figure is the peak RSS (``VmHWM``) less the RSS before the request, read
against the yardstick of the request's own bytes after decompression: the budget is 4× those
bytes. Cases over a limit are in the table too, with the answer they get and what refusing them
cost.

The pipeline case (``pipelining.py``) reports the peak RSS of 1, 4 and 64 connections pipelining
requests without reading their answers, against the front's stated bounds.

The trickle case measures the latency of a small produce, one at a time, on an idle broker (the
yardstick), then again while 16 connections each declare a 16 MiB body and send one byte of it
every half second: the difference is the delay the tricklers cause; the budget is 100 ms.
"""

from __future__ import annotations

import gzip
import http.client
import shutil
import socket
import statistics
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import msgpack
import orjson

from ring import limits
from ring.bench import pipelining
from ring.bench.measure import reset_peak, start_broker, vm_kib
from ring.log import batch as batchfmt

RSS_BUDGET_RATIO = 4.0  # peak RSS rise per decompressed request byte
TRICKLE_DELAY_BUDGET_MS = 100.0
TRICKLERS = 16
TRICKLE_PRODUCES = 20
TRICKLE_INTERVAL_S = 0.5
REQUEST_TIMEOUT_S = 120.0  # ample: a bomb refused late (after decoding) takes tens of seconds, a figure to report


@dataclass(frozen=True)
class Body:
    ctype: str
    data: bytes
    inflated: int  # bytes after Content-Encoding is undone
    gzip: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    label: str
    make: Callable[[], Body]


def _json_events(n: int, size: int) -> bytes:
    """``n`` JSON objects of about ``size`` bytes each, as one array."""
    pad = "x" * max(0, size - 24)
    return orjson.dumps([{"n": i, "pad": pad} for i in range(n)])


def _gz(ctype: str, raw: bytes) -> Body:
    return Body(ctype, gzip.compress(raw, 9), len(raw), gzip=True)


def _plain(ctype: str, raw: bytes) -> Body:
    return Body(ctype, raw, len(raw))


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


def _max_records(n: int, per: int) -> bytes:
    return b"[" + b",".join([b'"' + b"x" * (per - 2) + b'"'] * n) + b"]"


def _batches(total: int) -> bytes:
    value = b"v" * (limits.MESSAGE_BYTES_MAX - 1024)
    one = bytes(batchfmt.encode([(None, None, value, None)], now_ms=int(time.time() * 1000)))
    return one * (total // len(one))


def _many_headers(total: int) -> bytes:
    n = total // 12
    entries = b"".join(msgpack.packb(f"h{i}") + b"\xc0" for i in range(n))
    return b"\x82\xa5value\xc4\x01x\xa7headers\xdf" + struct.pack(">I", n) + entries


J, N, M, B = "application/json", "application/x-ndjson", "application/msgpack", "application/vnd.ring.batch"
RECORDS = limits.RECORDS_PER_REQUEST_MAX
BYTES = limits.REQUEST_BYTES_MAX
PER_RECORD_AT_BOTH = BYTES // RECORDS - 8  # records of this size fill both limits at once

CASES = [
    Case("json-records", f"JSON, {RECORDS:,} records of 1 byte (records limit)",
         lambda: _plain(J, b"[" + b"1," * (RECORDS - 1) + b"1]")),
    Case("json-records-bytes", f"JSON, {RECORDS:,} records filling {BYTES >> 20} MiB (both limits)",
         lambda: _plain(J, _json_events(RECORDS, PER_RECORD_AT_BOTH))),
    Case("json-bytes", f"JSON, 1 KiB records filling {BYTES >> 20} MiB (bytes limit)",
         lambda: _plain(J, _json_events(BYTES // 1060, 1024))),
    Case("json-message", "JSON, records of 1 MiB filling the request (record size limit)",
         lambda: _plain(J, _max_records(BYTES // limits.MESSAGE_BYTES_MAX - 1, limits.MESSAGE_BYTES_MAX - 64))),
    Case("json-nesting", f"JSON, {RECORDS:,} records nested {limits.JSON_DEPTH_MAX} deep (nesting limit)",
         lambda: _plain(J, b"[" + b",".join([_nested(limits.JSON_DEPTH_MAX)] * RECORDS) + b"]")),
    Case("ndjson-records-bytes", f"NDJSON, {RECORDS:,} lines filling {BYTES >> 20} MiB (both limits)",
         lambda: _plain(N, b"\n".join(orjson.dumps({"n": i, "pad": "x" * (PER_RECORD_AT_BOTH - 24)})
                                      for i in range(RECORDS)))),
    Case("gzip-ratio", f"JSON gzipped, inflating to {BYTES >> 20} MiB (decompressed size limit)",
         lambda: _gz(J, b"[" + b" " * (BYTES - 3) + b"1]")),
    Case("msgpack-records", f"msgpack, {RECORDS:,} records of 1 byte (records limit)",
         lambda: _plain(M, msgpack.packb([{"value": b"x"}] * RECORDS))),
    Case("msgpack-bytes", f"msgpack, 1 KiB records filling {BYTES >> 20} MiB (bytes limit)",
         lambda: _plain(M, msgpack.packb([{"value": b"x" * 1024}] * (BYTES // 1040)))),
    Case("msgpack-headers", f"msgpack, {RECORDS:,} records of {limits.HEADERS_PER_RECORD_MAX - 2} headers "
         "(records and headers limits)",
         lambda: _plain(M, msgpack.packb([{"value": b"", "headers": [["h", b""]] * (limits.HEADERS_PER_RECORD_MAX - 2)}]
                                         * RECORDS))),
    Case("batch-bytes", f"stored batches of 1 MiB filling {BYTES >> 20} MiB (bytes limit)",
         lambda: _plain(B, _batches(BYTES))),
    Case("over-json-records", "over: JSON, 500,000 records of 1 byte in 1 MB",
         lambda: _plain(J, b"[" + b"1," * 499_999 + b"1]")),
    Case("over-gzip-records", "over: JSON gzipped, 3 million records in 6 KB",
         lambda: _gz(J, b"[" + b"1," * 2_999_999 + b"1]")),
    Case("over-gzip-bytes", f"over: JSON gzipped, inflating past {BYTES >> 20} MiB",
         lambda: _gz(J, b"[" + b" " * (BYTES + 1024) + b"1]")),
    Case("over-ndjson-records", "over: NDJSON, 500,000 lines of 1 byte",
         lambda: _plain(N, b"1\n" * 500_000)),
    Case("over-msgpack-records", f"over: msgpack, {BYTES >> 20} MiB of empty maps as records",
         lambda: _plain(M, b"\xdd" + struct.pack(">I", BYTES - 5) + b"\x80" * (BYTES - 5))),
    Case("over-msgpack-headers", f"over: msgpack, one record with {BYTES >> 20} MiB of headers",
         lambda: _plain(M, _many_headers(BYTES))),
]


# --- measuring ----------------------------------------------------------------------


def post(url: str, path: str, body: Body, timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[int, bytes, float]:
    host, port = url.removeprefix("http://").split(":")
    headers = {"Content-Type": body.ctype, **({"Content-Encoding": "gzip"} if body.gzip else {})}
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, body=body.data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), time.perf_counter() - t0
    finally:
        conn.close()


def run_case(case: Case, root: Path, fsync: str) -> dict:
    body = case.make()
    broker = start_broker(root / case.id, fsync)
    try:
        assert broker.proc is not None
        pid = broker.proc.pid
        topic = f"/v1/topics/hostile/messages?partition=0"
        warm = {J: b"[1]", N: b"1\n", M: msgpack.packb({"value": b"x"}),
                B: bytes(batchfmt.encode([(None, None, b"x", None)], now_ms=int(time.time() * 1000)))}[body.ctype]
        status, answer, _ = post(broker.url, topic, Body(body.ctype, warm, len(warm)))
        assert status == 200, answer[:200]
        time.sleep(0.2)  # the warm-up's answer is out and its objects freed
        reset_peak(pid)
        before = vm_kib(pid, "VmRSS")
        status, answer, took = post(broker.url, topic, body)
        peak = vm_kib(pid, "VmHWM")
        rise = max(0, peak - before) * 1024
        error = "" if status == 200 else orjson.loads(answer).get("error", "")
        return {"id": case.id, "label": case.label, "status": status, "error": error, "sent": len(body.data),
                "inflated": body.inflated, "rss_before_mb": before / 1024, "rise_mb": rise / 2**20,
                "ratio": rise / body.inflated, "seconds": took}
    finally:
        broker.stop()


def _trickler(url: str, stop: threading.Event) -> None:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    try:
        for _ in range(TRICKLERS):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/topics/hostile/messages?partition=0 HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n[" % BYTES)
            socks.append(s)
        while not stop.wait(TRICKLE_INTERVAL_S):
            for s in socks:
                try:
                    s.sendall(b" ")
                except OSError:
                    pass  # cut by the body deadline: it stops counting
    finally:
        for s in socks:
            s.close()


def _latencies(url: str) -> tuple[list[float], list[int]]:
    small = Body(J, b'[{"n":1}]', 9)
    out, statuses = [], []
    for _ in range(TRICKLE_PRODUCES):
        status, _, took = post(url, "/v1/topics/hostile/messages?partition=0", small, timeout_s=30)
        out.append(took * 1000)
        statuses.append(status)
    return out, statuses


def run_trickle(root: Path, fsync: str) -> dict:
    broker = start_broker(root / "trickle", fsync)
    try:
        assert broker.proc is not None
        _latencies(broker.url)  # warm
        idle, _ = _latencies(broker.url)
        stop = threading.Event()
        thread = threading.Thread(target=_trickler, args=(broker.url, stop), daemon=True)
        reset_peak(broker.proc.pid)
        before = vm_kib(broker.proc.pid, "VmRSS")
        thread.start()
        time.sleep(1.0)  # every trickler connected and sending
        busy, statuses = _latencies(broker.url)
        stop.set()
        thread.join(10)
        peak = vm_kib(broker.proc.pid, "VmHWM")
        return {"tricklers": TRICKLERS, "idle_p50_ms": statistics.median(idle), "idle_max_ms": max(idle),
                "busy_p50_ms": statistics.median(busy), "busy_max_ms": max(busy),
                "delay_ms": statistics.median(busy) - statistics.median(idle),
                "refused": sum(s != 200 for s in statuses), "rise_mb": max(0, peak - before) / 1024}
    finally:
        broker.stop()


def run_part(fsync: str = "interval:1000", only: list[str] | None = None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ring-bench-hostile-"))
    try:
        cases = [run_case(c, root, fsync) for c in CASES if not only or c.id in only]
        trickle = run_trickle(root, fsync) if not only or "trickle" in only else None
        pipeline = pipelining.run(root, fsync) if not only or "pipeline" in only else []
        return {"cases": cases, "trickle": trickle, "pipeline": pipeline}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(res: dict) -> list[str]:
    lines = [f"Peak broker RSS rise for one request, against the request's bytes after decompression "
             f"(budget {RSS_BUDGET_RATIO:g}×); each case on a fresh broker after a warm-up produce.", "",
             "| request | answer | sent | decompressed | RSS before | peak rise | rise / bytes | within 4× | took |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    for c in res["cases"]:
        answer = f"{c['status']}" + (f" {c['error']}" if c["error"] else "")
        met = "yes" if c["ratio"] <= RSS_BUDGET_RATIO else "NO"
        lines.append(f"| {c['label']} | {answer} | {c['sent']:,} | {c['inflated']:,} | {c['rss_before_mb']:.0f} MiB "
                     f"| {c['rise_mb']:.1f} MiB | {c['ratio']:.2f}× | {met} | {c['seconds']:.2f} s |")
    t = res.get("trickle")
    if t:
        lines += ["", f"{t['tricklers']} clients each declaring a {BYTES >> 20} MiB body and sending a byte every "
                      f"{TRICKLE_INTERVAL_S:g} s; {TRICKLE_PRODUCES} small produces one at a time (budget: "
                      f"{TRICKLE_DELAY_BUDGET_MS:g} ms of delay):", "",
                  "| figure | idle broker | with the tricklers |", "|---|---:|---:|",
                  f"| produce latency p50 | {t['idle_p50_ms']:.2f} ms | {t['busy_p50_ms']:.2f} ms |",
                  f"| produce latency max | {t['idle_max_ms']:.2f} ms | {t['busy_max_ms']:.2f} ms |",
                  f"| produces refused | 0 | {t['refused']} of {TRICKLE_PRODUCES} |",
                  f"| delay (p50 difference) | | {t['delay_ms']:.2f} ms "
                  f"({'within' if t['delay_ms'] < TRICKLE_DELAY_BUDGET_MS and not t['refused'] else 'OVER'} "
                  f"budget{'' if not t['refused'] else ': refused ones never got through'}) |",
                  f"| peak RSS rise | | {t['rise_mb']:.1f} MiB |"]
    return lines + pipelining.report(res.get("pipeline") or [])


def main(argv: list[str] | None = None) -> int:
    """``python -m ring.bench.hostile [CASE ...]``: this part alone (every case by default)."""
    import sys

    only = list(argv if argv is not None else sys.argv[1:])
    print("\n".join(report(run_part(only=only))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
