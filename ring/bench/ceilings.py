"""What this machine allows, measured in the same run as the brokers: the
ceiling of the load generator (wrk against ring's produce endpoint), raw disk
append bandwidth with and without fsync, and loopback TCP bandwidth.

Each figure reads against the broker's: a produce rate near wrk's says the
Python load generator is not what limits it; a broker far below the disk's
append rate is CPU-bound, not disk-bound. Every loop is bounded in bytes and
seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from ring.log import batch as batchfmt

CHUNK_BYTES = 100 * 1024  # one 100-record request of 1 KiB records
LOOPBACK_CHUNK_BYTES = 1 << 20


def disk_append(directory: Path, chunk: bytes, seconds_max: float, bytes_max: int, fsync_each: bool) -> dict[str, float]:
    """Sequential appends of ``chunk`` to a fresh file: MB/s and writes/s."""
    path = directory / "raw-append.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    writes = written = 0
    try:
        t0 = time.perf_counter()
        deadline = t0 + seconds_max
        while written < bytes_max and time.perf_counter() < deadline:
            written += os.write(fd, chunk)
            writes += 1
            if fsync_each:
                os.fdatasync(fd)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink()
    return {"mb_s": written / seconds / 1e6, "writes_s": writes / seconds}


def disk_ceilings(directory: Path, seconds_max: float) -> dict[str, Any]:
    chunk = os.urandom(CHUNK_BYTES)
    disk_append(directory, chunk, min(2.0, seconds_max), 256 << 20, False)  # warm-up: first writes are slower
    return {
        "append_100k": disk_append(directory, chunk, seconds_max, 4 << 30, False),
        "append_100k_fdatasync": disk_append(directory, chunk, seconds_max, 1 << 30, True),
        "append_1k_fdatasync": disk_append(directory, chunk[:1024], seconds_max, 256 << 20, True),
    }


def loopback_mb_s(seconds_max: float, bytes_max: int = 8 << 30) -> float:
    """One TCP connection over 127.0.0.1, 1 MiB sends, a thread each side."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    received = 0

    def sink() -> None:
        nonlocal received
        conn, _ = server.accept()
        buf = bytearray(LOOPBACK_CHUNK_BYTES)
        with conn:
            while True:
                n = conn.recv_into(buf)
                if not n:
                    return
                received += n

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    chunk = os.urandom(LOOPBACK_CHUNK_BYTES)
    sent = 0
    with socket.create_connection(("127.0.0.1", port)) as c:
        t0 = time.perf_counter()
        deadline = t0 + seconds_max
        while sent < bytes_max and time.perf_counter() < deadline:
            c.sendall(chunk)
            sent += len(chunk)
        c.shutdown(socket.SHUT_WR)
        t.join(10)
        seconds = time.perf_counter() - t0
    server.close()
    return received / seconds / 1e6


WRK_POST_SCRIPT = """-- POST the same body in every request
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "{ctype}"
"""

_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    return float(m.group(1)) * _UNITS_MS[m.group(2)] if m else None


def parse_wrk(out: str) -> dict[str, Any]:
    """Requests answered (any status), requests/s, latency percentiles and non-2xx count from ``wrk --latency``."""
    res: dict[str, Any] = {}
    m = re.search(r"^\s*(\d+) requests in ", out, re.M)
    res["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    res["req_s"] = float(m.group(1)) if m else None
    for q in ("50", "99"):
        m = re.search(rf"^\s*{q}(?:\.000)?%\s+(\S+)", out, re.M)
        res[f"p{q}_ms"] = _ms(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    res["non_2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors:.*", out)
    res["socket_errors"] = m.group(0) if m else ""
    return res


def wrk_produce(url: str, topic: str, partition: int, record: bytes, workdir: Path, seconds: float,
                connections: int) -> dict[str, Any]:
    """wrk, one thread, ``connections`` open, POSTing single-record stored
    batches to one partition's leader with consistency=quorum."""
    if shutil.which("wrk") is None:
        return {"skipped": "wrk is not installed"}
    body = workdir / "wrk-body.bin"
    body.write_bytes(bytes(batchfmt.encode([(None, None, record, None)], now_ms=int(time.time() * 1000))))
    script = workdir / "wrk-post.lua"
    script.write_text(WRK_POST_SCRIPT.format(body=body, ctype="application/vnd.ring.batch"))
    target = f"{url}/v1/topics/{topic}/messages?partition={partition}&consistency=quorum"
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, int(seconds))}s", "--latency", "-s", str(script), target]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    res = parse_wrk(r.stdout)
    res["command"] = " ".join(["wrk", *cmd[1:-3], "-s", "post.lua", "URL"])
    if r.returncode != 0 or res["req_s"] is None:
        res["error"] = (r.stderr or r.stdout)[-300:]
    return res
