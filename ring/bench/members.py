"""The members part of ``ring bench``: one host's produce throughput with 1, 2 and ``auto`` members.

Each configuration is one ``ring serve --members N`` (real processes on
loopback, RF 1 so a member's throughput is its own), loaded by wrk (one
thread, CONNECTIONS connections in all) with 1 KiB records as stored
batches, 1 or 100 records per request, two ways:

- ``direct``: as a topology-aware client does, each member's own port gets
  its share of the connections, and each request goes to a partition that
  member leads (an unkeyed produce: the receiving broker picks a partition it
  leads);
- ``shared``: as curl or a Kubernetes Service does, every request goes to the
  host's one port (SO_REUSEPORT spreads the connections over the members)
  and names a partition, round-robin over all of them, so a member forwards
  the requests for partitions another member leads. The members' own count of
  forwarded produces (``produces_forwarded`` in ``/v1/status``) gives the
  fraction forwarded.

The figure to read is the ratio of N members to one member in the same run:
wrk shares this machine's cores with the members.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from ring.bench.ceilings import parse_wrk
from ring.bench.single import _records
from ring.localcluster import free_port
from ring.log import batch as batchfmt

PARTITIONS = 8
CONNECTIONS = 64
READY_S_MAX = 60.0
STOP_S_MAX = 60.0

_WRK_SCRIPT = """-- POST one stored batch; "{mode}" mode
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/vnd.ring.batch"
local n = 0
request = function()
  n = n + 1
  {path}
  return wrk.format(nil, path)
end
"""


def _get(port: int, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return orjson.loads(r.read())


def _post(port: int, path: str, doc: Any) -> Any:
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=orjson.dumps(doc), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return orjson.loads(r.read())


def _ports(n: int) -> tuple[int, int]:
    """The host's client port, and a base with ``2n`` free ports after it."""
    for _ in range(200):
        base, free = free_port(), True
        for port in range(base, base + 2 * n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free:
            return free_port(), base
    raise RuntimeError("no free ports for the members")


class Host:
    """``ring serve --members N`` in a scratch directory, started and stopped by PID."""

    def __init__(self, members: int, workdir: Path, fsync: str) -> None:
        self.n = members
        self.port, self.base = _ports(members)
        self.dir = workdir / f"members-{members}"
        self.log = self.dir / "host.log"
        self.fsync = fsync
        self.proc: subprocess.Popen | None = None

    @property
    def member_ports(self) -> list[int]:
        """Each member's own client port (one member is a plain broker on the host's port)."""
        return [self.port] if self.n == 1 else [self.base + 2 * i for i in range(self.n)]

    def start(self) -> None:
        self.dir.mkdir(parents=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ring", "serve", "--members", str(self.n), "--name", "ring-0",
                 "--listen", f"127.0.0.1:{self.port}", "--member-ports", str(self.base),
                 "--data-dir", str(self.dir / "data"), "--fsync", self.fsync, "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_S_MAX
        while time.monotonic() < deadline:
            try:
                brokers = _get(self.port, "/v1/cluster")["brokers"]
                if len(brokers) == self.n and all(b["status"] == "up" for b in brokers):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"{self.n} members not up; log: {self.log.read_text(errors='replace')[-600:]}")

    def counts(self) -> tuple[int, int]:
        """Produces the members forwarded, and requests their admission control refused for load (429
        ``overloaded``, all reasons), from one status of each member."""
        docs = [_get(p, "/v1/status") for p in self.member_ports]
        return (sum(d.get("produces_forwarded", 0) for d in docs),
                sum(sum(d["admission"]["refused"].values()) for d in docs))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S_MAX)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wrk(targets: list[tuple[str, int]], script: Path, seconds: float) -> dict[str, Any]:
    """wrk runs side by side, one per (URL, connections); their sums."""
    procs = [subprocess.Popen(["wrk", "-t1", f"-c{c}", f"-d{max(1, int(seconds))}s", "--latency", "-s",
                               str(script), url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for url, c in targets]
    outs = [parse_wrk(p.communicate(timeout=seconds + 60)[0]) for p in procs]
    return {"req_s": sum(o["req_s"] or 0.0 for o in outs), "requests": sum(o["requests"] or 0 for o in outs),
            "non_2xx": sum(o["non_2xx"] for o in outs), "p99_ms": max((o["p99_ms"] or 0.0) for o in outs)}


def _measure(host: Host, workdir: Path, rpr: int, mode: str, seconds: float) -> dict[str, Any]:
    body = workdir / f"body-{rpr}.bin"
    body.write_bytes(bytes(batchfmt.encode([(None, None, r, None) for r in _records(rpr)],
                                           now_ms=int(time.time() * 1000))))
    script = workdir / f"{mode}-{rpr}.lua"
    if mode == "direct":
        path = 'local path = "/v1/topics/bench/messages"'
        per = max(1, CONNECTIONS // host.n)
        targets = [(f"http://127.0.0.1:{p}/v1/topics/bench/messages", per) for p in host.member_ports]
    else:
        path = f'local path = "/v1/topics/bench/messages?partition=" .. (n % {PARTITIONS})'
        targets = [(f"http://127.0.0.1:{host.port}/v1/topics/bench/messages", CONNECTIONS)]
    script.write_text(_WRK_SCRIPT.format(mode=mode, body=body, path=path))
    forwarded, refused = host.counts()
    res = _wrk(targets, script, seconds)
    forwarded_after, refused_after = host.counts()
    res["forwarded"] = (forwarded_after - forwarded) / res["requests"] if res["requests"] else None
    res["refused"] = refused_after - refused  # (a loaded machine's loop lags: refusals, not errors)
    res["rec_s"] = res["req_s"] * rpr
    return res


def run_part(seconds: float = 5.0, fsync: str = "interval:1000", members: list[int] | None = None) -> dict:
    """Each member count in turn (1, 2, and ``auto`` when it differs): the four measurements."""
    if shutil.which("wrk") is None:
        return {"skipped": "wrk is not installed"}
    auto = max(1, len(os.sched_getaffinity(0)))
    counts = members or sorted({1, 2, auto})
    workdir = Path(tempfile.mkdtemp(prefix="ring-bench-members-"))
    out: dict[str, Any] = {"auto": auto, "seconds": seconds, "connections": CONNECTIONS, "runs": {}}
    try:
        for n in counts:
            host = Host(n, workdir, fsync)
            try:
                host.start()
                _post(host.port, "/v1/topics", {"name": "bench", "partitions": PARTITIONS, "replication_factor": 1})
                for rpr in (1, 100):
                    for mode in ("direct", "shared"):
                        out["runs"][f"{n}-{rpr}-{mode}"] = _measure(host, workdir, rpr, mode, seconds)
            finally:
                host.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def report(res: dict, command: str) -> str:
    if "skipped" in res:
        return f"members part skipped: {res['skipped']}"
    runs = res["runs"]
    counts = sorted({int(k.split("-")[0]) for k in runs})
    lines = [f"One host, N members, RF 1, wrk -t1 with {res['connections']} connections in all, "
             f"{res['seconds']:g} s each (`{command}`; auto = {res['auto']} here)", "",
             "| members | records/req | path | records/s | vs 1 member | forwarded | p99 ms | non-2xx |",
             "|---|---|---|---|---|---|---|---|"]
    for n in counts:
        for rpr in (1, 100):
            for mode in ("direct", "shared"):
                r = runs.get(f"{n}-{rpr}-{mode}")
                one = runs.get(f"1-{rpr}-{mode}")
                if r is None:
                    continue
                ratio = f"{r['rec_s'] / one['rec_s']:.2f}x" if one and one["rec_s"] else "-"
                fwd = f"{r['forwarded']:.0%}" if r["forwarded"] is not None else "-"
                lines.append(f"| {n} | {rpr} | {mode} | {r['rec_s']:,.0f} | {ratio} | {fwd} | "
                             f"{r['p99_ms']:.1f} | {r['non_2xx']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m ring.bench.members``: this part alone."""
    p = argparse.ArgumentParser(prog="python -m ring.bench.members", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="each measurement's length")
    p.add_argument("--fsync", default="interval:1000", help="the members' fsync policy")
    p.add_argument("--members", type=lambda t: [int(x) for x in t.split(",")], default=None,
                   help="member counts to run, comma-separated (default 1, 2 and auto)")
    args = p.parse_args(argv)
    res = run_part(args.seconds, args.fsync, args.members)
    print(report(res, " ".join(["python -m ring.bench.members", *(argv if argv is not None else sys.argv[1:])])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
