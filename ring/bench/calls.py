"""Python function calls per request, for the cpu part of ``ring bench``.

A broker started with ``RING_CALL_COUNT_FILE`` (``ring.commands.callcount``)
counts its Python calls; this module sends N requests of one shape over one
keep-alive connection, one at a time, and divides the count's growth by N.
A warm-up first fills the caches a first request fills. The broker's timers
(ticks, metrics) run meanwhile too; over a run of N requests answered in well
under a second they add a fraction of a call per request, so two runs agree
to about one call.
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

from ring.localcluster import LocalBroker

REQUESTS = 2000  # per case and run: enough that the timers' calls round away
WARMUP = 200
SNAPSHOT_WAIT_S = 10.0
RUNS = 2  # the figure is reported twice, so a reader sees that it repeats


def _snapshot(pid: int, path: Path, last: int) -> tuple[int, int]:
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline:
        try:
            seq, calls = (int(x) for x in path.read_text().split())
        except (OSError, ValueError):
            seq = last
        if seq > last:
            return seq, calls
        time.sleep(0.01)
    raise TimeoutError(f"the broker wrote no call count to {path} in {SNAPSHOT_WAIT_S:g} s")


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None, n: int) -> None:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    for _ in range(n):
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{method} {path} answered {resp.status}")


def calls_per_request(broker: LocalBroker, count_file: Path, method: str, path: str,
                      body: bytes | None) -> list[float]:
    """Calls per request of ``method path`` on ``broker``, once per run."""
    assert broker.proc is not None
    u = urlsplit(broker.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        _send(conn, method, path, body, WARMUP)
        seq = int(count_file.read_text().split()[0]) if count_file.exists() else 0  # (an earlier case's)
        out = []
        for _ in range(RUNS):
            seq, before = _snapshot(broker.proc.pid, count_file, seq)
            _send(conn, method, path, body, REQUESTS)
            seq, after = _snapshot(broker.proc.pid, count_file, seq)
            out.append((after - before) / REQUESTS)
        return out
    finally:
        conn.close()
