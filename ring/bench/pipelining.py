"""The pipelining part of ``ring bench --cases hostile``: what clients that pipeline requests and never
read their answers make one broker hold.

For 1, 4 and 64 connections, each case on a broker of its own (a real process on loopback) after a
warm-up GET of the OpenAPI document (the largest answer of an open route): the peak resident set is
reset (``/proc/PID/clear_refs``), each connection sends ``REQUESTS`` GETs of ``/v1/openapi.json`` in
one write (126 KB) and reads nothing, and once the broker's count of answers stops moving (it has
done all it will for them; at most ``SETTLE_S``) the peak RSS rise (``VmHWM`` less the RSS before)
is read against the bound the front states: per connection ``limits.connection_bytes_max`` of the
document's size, and for the answers of all of them ``FRONT_ANSWER_BYTES_IN_FLIGHT_MAX`` plus one
answer each. Meanwhile another client's ``GET /v1/status`` is timed. With up to 4 connections each
then reads its answers, which must all come, in order; the 64 are closed unread (their answers would
be gigabytes on loopback).
"""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path

from ring import limits
from ring.bench.measure import reset_peak, start_broker, vm_kib

CONNECTIONS = (1, 4, 64)
REQUESTS = 3000  # per connection, in one write
OPENAPI_GET = b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
SETTLE_S = 30.0
READ_CONNECTIONS_MAX = 4  # connections whose answers are all read and checked
ALLOCATOR_SLACK_BYTES = 8 * 2**20


def _get(host: str, port: int, path: str) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    t0 = time.perf_counter()
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(), time.perf_counter() - t0
    finally:
        conn.close()


def answers_counted(host: str, port: int, route: str) -> int:
    """Answers a broker has counted for ``route`` (its /metrics)."""
    _, body, _ = _get(host, port, "/metrics")
    return sum(int(float(line.split()[-1])) for line in body.decode().splitlines()
               if line.startswith("ring_http_requests_total") and f'route="{route}"' in line)


def settle(host: str, port: int, route: str, timeout_s: float = SETTLE_S) -> int:
    """Poll until the broker's count of answers for ``route`` stops moving; that count."""
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        now = answers_counted(host, port, route)
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise RuntimeError(f"the broker kept answering {route} for {timeout_s:g} s")


def read_answers(s: socket.socket, n: int) -> list[tuple[int, int]]:
    """(status, body bytes) of ``n`` answers read off ``s`` in order."""
    buf = bytearray()
    out: list[tuple[int, int]] = []
    pos = 0
    while len(out) < n:
        end = buf.find(b"\r\n\r\n", pos)
        size = 0
        if end >= 0:
            head = bytes(buf[pos:end]).split(b"\r\n")
            size = next((int(line.split(b":", 1)[1]) for line in head[1:]
                         if line.lower().startswith(b"content-length:")), 0)
        if end < 0 or end + 4 + size > len(buf):
            chunk = s.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"the connection ended after {len(out)} of {n} answers")
            del buf[:pos]
            pos = 0
            buf += chunk
            continue
        out.append((int(head[0].split(b" ", 2)[1]), size))
        pos = end + 4 + size
    return out


def bound_bytes(connections: int, answer_bytes: int) -> int:
    """What ``connections`` such clients may make the broker hold, by the front's stated bounds."""
    per = limits.connection_bytes_max(answer_bytes)
    answers = limits.CONNECTION_ANSWER_BYTES_MAX + answer_bytes
    capped = limits.FRONT_ANSWER_BYTES_IN_FLIGHT_MAX + connections * (answer_bytes + per - answers)
    return min(connections * per, capped) + ALLOCATOR_SLACK_BYTES


def run_one(connections: int, root: Path, fsync: str) -> dict:
    broker = start_broker(root / f"pipeline-{connections}", fsync)
    socks: list[socket.socket] = []
    try:
        assert broker.proc is not None
        pid, host, port = broker.proc.pid, broker.host, broker.port
        status, doc, _ = _get(host, port, "/v1/openapi.json")
        assert status == 200
        time.sleep(0.2)  # the warm-up's answer is out and its objects freed
        reset_peak(pid)
        before = vm_kib(pid, "VmRSS")
        for _ in range(connections):
            s = socket.create_connection((host, port), timeout=60)
            s.sendall(OPENAPI_GET * REQUESTS)
            socks.append(s)
        answered = settle(host, port, "/v1/openapi.json") - 1  # less the warm-up
        status_ms = _get(host, port, "/v1/status")[2] * 1000
        peak = vm_kib(pid, "VmHWM")
        complete = None
        if connections <= READ_CONNECTIONS_MAX:
            complete = all(read_answers(s, REQUESTS) == [(200, len(doc))] * REQUESTS for s in socks)
        rise = max(0, peak - before) * 1024
        return {"connections": connections, "sent": len(OPENAPI_GET) * REQUESTS, "answer": len(doc),
                "rss_before_mb": before / 1024, "rise_mb": rise / 2**20,
                "bound_mb": bound_bytes(connections, len(doc)) / 2**20, "answered": answered,
                "status_ms": status_ms, "complete": complete}
    finally:
        for s in socks:
            s.close()
        broker.stop()


def run(root: Path, fsync: str) -> list[dict]:
    return [run_one(n, root, fsync) for n in CONNECTIONS]


def report(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", f"Clients pipelining {REQUESTS:,} GETs of the OpenAPI document ({rows[0]['answer']:,}-byte answers) "
                 f"in one write each and reading nothing; each case on a fresh broker. The bound is the "
                 f"front's: per connection CONNECTION_ANSWER_BYTES_MAX "
                 f"({limits.CONNECTION_ANSWER_BYTES_MAX >> 20} MiB) and one answer, the rest of one read, "
                 f"{limits.PIPELINED_REQUESTS_MAX} parsed heads and one arriving; for all, FRONT_ANSWER_BYTES_IN_FLIGHT_MAX "
                 f"({limits.FRONT_ANSWER_BYTES_IN_FLIGHT_MAX >> 20} MiB) and one answer each; plus "
                 f"{ALLOCATOR_SLACK_BYTES >> 20} MiB of allocator slack.", "",
             "| connections | sent each | answers made | RSS before | peak rise | bound | within | "
             "another client's GET /v1/status | all answered in order once read |",
             "|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        met = "yes" if r["rise_mb"] <= r["bound_mb"] else "NO"
        complete = "not read" if r["complete"] is None else ("yes" if r["complete"] else "NO")
        lines.append(f"| {r['connections']} | {r['sent']:,} B | {r['answered']:,} of "
                     f"{r['connections'] * REQUESTS:,} | {r['rss_before_mb']:.0f} MiB | {r['rise_mb']:.1f} MiB | "
                     f"{r['bound_mb']:.1f} MiB | {met} | {r['status_ms']:.1f} ms | {complete} |")
    return lines
