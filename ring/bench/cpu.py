"""CPU per request: what one small request costs the brokers, against two yardsticks in the same run.

Each case sends one request shape, over and over, with a fixed number in
flight, from one client: ``wrk`` (C, one thread, so nearly none of the
client's cost is Python's) and ring's Python load generator (the lean
HTTP/1.1 client of ``ring.bench.http1``, in its own process). Around each
run the server processes' CPU seconds are read from /proc; the figure is
those seconds over the requests answered 200 (``cpu_us_per_req``). The same
loads go to the two yardsticks of ``ring.bench.yardsticks`` (a trivial
aiohttp handler, and an ``asyncio.Protocol`` on httptools), so each ring
figure reads as a ratio to them, measured minutes apart on the same machine.

Cases: a 1-record JSON produce to one broker alone (64 in flight); a
1-record quorum produce to the leader of a partition replicated on three
brokers (64 and 256 in flight; the CPU of all three counts); a 1-record
fetch that a long-poll answers at once (the record is there). Every run is
bounded in time and in requests.
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from ring.bench import calls, ceilings, procs, report, stats
from ring.bench.system import ensure_packages, http_json, stop_pid
from ring.commands import callcount
from ring.localcluster import LocalBroker, free_port

CLIENTS = ("wrk", "python")
START_TIMEOUT_S = 30.0
LEADER_WAIT_S = 30.0
REQUESTS_MAX = 5_000_000  # far above what a run reaches in its seconds


@dataclass(frozen=True)
class CpuCase:
    id: str
    label: str
    target: str  # a key of the targets the run started: aiohttp, httptools, ring-1, ring-3
    method: str
    path: str  # "{topic}" is filled in with the target's topic
    connections: int
    yardstick: bool = False


CASES = (
    CpuCase("yard-aiohttp", "yardstick: aiohttp handler, POST 1 KiB JSON, 64 in flight", "aiohttp", "POST",
            "/v1/topics/{topic}/messages", 64, yardstick=True),
    CpuCase("yard-httptools", "yardstick: asyncio.Protocol on httptools, POST 1 KiB JSON, 64 in flight",
            "httptools", "POST", "/v1/topics/{topic}/messages", 64, yardstick=True),
    CpuCase("produce-1", "produce 1 record (JSON), one broker, 64 in flight", "ring-1", "POST",
            "/v1/topics/{topic}/messages?partition=0", 64),
    CpuCase("produce-rf3-64", "produce 1 record (JSON), RF 3 quorum, to the leader, 64 in flight", "ring-3",
            "POST", "/v1/topics/{topic}/messages?partition=0&consistency=quorum", 64),
    CpuCase("produce-rf3-256", "produce 1 record (JSON), RF 3 quorum, to the leader, 256 in flight", "ring-3",
            "POST", "/v1/topics/{topic}/messages?partition=0&consistency=quorum", 256),
    CpuCase("fetch-1", "fetch 1 record, long-poll answered at once, one broker, 64 in flight", "ring-1", "GET",
            "/v1/topics/{fetch}/partitions/0/messages?offset=0&max_records=1&wait_ms=1000", 64),
)


@dataclass
class Target:
    url: str
    pids: list[int]
    topic: str = "yardstick"
    fetch_topic: str = "yardstick"


# --- starting what is measured ---------------------------------------------------------


def start_yardstick(kind: str) -> tuple[subprocess.Popen, Target]:
    proc = subprocess.Popen([sys.executable, "-m", "ring.bench.yardsticks", kind], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening "):
        stop_pid(proc)
        raise RuntimeError(f"the {kind} yardstick did not start: {line!r}")
    return proc, Target(f"http://127.0.0.1:{int(line.split()[1])}", [proc.pid])


def _post_json(url: str, doc: Any, ctype: str = "application/json", raw: bytes | None = None) -> None:
    req = urllib.request.Request(url, method="POST", headers={"Content-Type": ctype},
                                 data=raw if raw is not None else orjson.dumps(doc))
    with urllib.request.urlopen(req, timeout=30):
        pass


def create_topic(url: str, rf: int, record: bytes | None = None) -> str:
    """A fresh 1-partition topic (with ``record`` in it, for fetches); its name."""
    topic = f"cpu-{uuid.uuid4().hex[:8]}"
    _post_json(url + "/v1/topics", {"name": topic, "partitions": 1, "replication_factor": rf})
    if record is not None:
        _post_json(url + f"/v1/topics/{topic}/messages?partition=0", None, raw=record)
    return topic


def leader_url(urls: list[str], topic: str) -> str:
    """The client URL of the leader of partition 0 of ``topic``, once one is elected."""
    deadline = time.monotonic() + LEADER_WAIT_S
    while time.monotonic() < deadline:
        _, doc = http_json(urls[0] + f"/v1/topics/{topic}")
        _, cl = http_json(urls[0] + "/v1/cluster")
        by_name = {b["name"]: b["client_url"] for b in (cl or {}).get("brokers", [])}
        leader = ((doc or {}).get("partitions") or [{}])[0].get("leader")
        if leader in by_name:
            return by_name[leader]
        time.sleep(0.2)
    raise TimeoutError(f"partition 0 of {topic} has no leader after {LEADER_WAIT_S:g} s")


# --- one run -----------------------------------------------------------------------------


def _wrk(url: str, case: CpuCase, path: str, body: bytes, seconds: float, workdir: Path) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{case.connections}", f"-d{max(1, round(seconds))}s"]
    if case.method == "POST":
        body_file = workdir / "cpu-body.json"
        body_file.write_bytes(body)
        script = workdir / "cpu-post.lua"
        script.write_text(ceilings.WRK_POST_SCRIPT.format(body=body_file, ctype="application/json"))
        cmd += ["-s", str(script)]
    r = subprocess.run([*cmd, url + path], capture_output=True, text=True, timeout=seconds + 60)
    res = ceilings.parse_wrk(r.stdout)
    if r.returncode != 0 or res.get("requests") is None:
        return {"ok": False, "error": (r.stderr or r.stdout)[-300:]}
    bad = res["non_2xx"]
    return {"ok": True, "answered": res["requests"] - bad, "errors": bad, "req_s": res["req_s"],
            "last_error": res.get("socket_errors", "")}


def _python(url: str, case: CpuCase, path: str, body: bytes, seconds: float) -> dict[str, Any]:
    spec = {"system": "http", "op": "fixed", "url": url, "method": case.method, "path": path,
            "body": body.decode(), "ctype": "application/json", "window": case.connections,
            "seconds_max": seconds, "requests_max": REQUESTS_MAX}
    try:
        r = subprocess.run([sys.executable, "-m", "ring.bench.loadgen"], input=orjson.dumps(spec),
                           capture_output=True, timeout=seconds * 3 + 60)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": "the load generator did not finish"}
    lines = r.stdout.strip().splitlines()
    res = orjson.loads(lines[-1]) if lines else {"ok": False, "error": r.stderr.decode()[-300:]}
    if not res.get("ok"):
        return res
    return {"ok": True, "answered": res["requests"], "errors": res["errors"], "req_s": res["rec_s"],
            "last_error": res.get("last_error", "")}


def run_one(case: CpuCase, client: str, target: Target, body: bytes, seconds: float,
            workdir: Path) -> dict[str, Any]:
    path = case.path.replace("{topic}", target.topic).replace("{fetch}", target.fetch_topic)
    busy0, cpu0, t0 = procs.machine_busy_seconds(), procs.cpu_of(target.pids), time.perf_counter()
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if client == "wrk":
        res = _wrk(target.url, case, path, body, seconds, workdir)
    else:
        res = _python(target.url, case, path, body, seconds)
    wall = time.perf_counter() - t0
    cpu = procs.cpu_of(target.pids) - cpu0
    row = {"case": case.id, "client": client, **res, "cpu_s": cpu, "wall_s": wall}
    answered = res.get("answered") or 0
    row["cpu_us_per_req"] = cpu / answered * 1e6 if res.get("ok") and answered else None
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    row["client_cpu_s"] = client_cpu
    # The servers and the client are this run; what else the machine did meanwhile is "others".
    others = stats.others_cores(procs.machine_busy_seconds() - busy0, cpu + client_cpu, wall)
    row["others_cores"] = others
    row["disturbed"] = stats.disturbed(others)
    return row


# --- the part of ``ring bench`` --------------------------------------------------------


class CpuPart:
    """Starts the yardsticks and a broker alone, borrows the bench's cluster, runs every case."""

    def __init__(self, root: Path, cluster: Any | None, fsync: str, say: Callable[[str], None]) -> None:
        self.root = root
        self.cluster = cluster  # ring.bench.system.RingSystem with three brokers, or None
        self.fsync = fsync
        self.say = say
        self.procs: list[subprocess.Popen] = []
        self.single: LocalBroker | None = None
        self.counted: LocalBroker | None = None  # the broker that counts its Python calls
        self.targets: dict[str, Target] = {}

    def start(self, record: bytes) -> list[str]:
        """Start what the cases need; the notes of what could not be."""
        notes = []
        for kind in ("aiohttp", "httptools"):
            try:
                proc, target = start_yardstick(kind)
            except (RuntimeError, OSError) as exc:
                notes.append(f"cpu: the {kind} yardstick is skipped: {exc}")
                continue
            self.procs.append(proc)
            self.targets[kind] = target
        self.root.mkdir(parents=True, exist_ok=True)
        self.single = LocalBroker("ring-0", self.root / "cpu-ring-0", free_port(),
                                  args=["--fsync", self.fsync, "--log-level", "warning"],
                                  log_path=self.root / "cpu-ring-0.log")
        self.single.start()
        assert self.single.proc is not None
        one = Target(self.single.url, [self.single.proc.pid])
        one.topic = create_topic(one.url, 1)
        one.fetch_topic = create_topic(one.url, 1, record)
        self.targets["ring-1"] = one
        self.counted = LocalBroker("ring-c", self.root / "cpu-ring-c", free_port(),
                                   args=["--fsync", self.fsync, "--log-level", "warning"],
                                   log_path=self.root / "cpu-ring-c.log",
                                   env={callcount.ENV: str(self.root / "calls.txt")})
        self.counted.start()
        if self.cluster is not None and self.cluster.clustered:
            urls = self.cluster.urls
            topic = create_topic(urls[0], len(urls))
            three = Target(leader_url(urls, topic), [p for ps in self.cluster.broker_pids().values() for p in ps])
            three.topic = topic
            self.targets["ring-3"] = three
        else:
            notes.append("cpu: the RF 3 cases are skipped: ring runs on one broker")
        return notes

    def stop(self) -> None:
        for proc in self.procs:
            stop_pid(proc)
        for broker in (self.single, self.counted):
            if broker is not None:
                broker.stop()

    def count_calls(self, record: bytes) -> list[dict[str, Any]]:
        """Python calls per 1-record produce and per 1-record fetch, on a broker alone that counts them; and
        per 1-record fetch from the start of the produce case's partition (some thousands of one-record
        batches), which reads only the batch it answers."""
        assert self.counted is not None
        url, out = self.counted.url, []
        produced = create_topic(url, 1)
        produce = f"/v1/topics/{produced}/messages?partition=0"
        fetch = f"/v1/topics/{create_topic(url, 1, record)}/partitions/0/messages?offset=0&max_records=1&wait_ms=1000"
        deep = f"/v1/topics/{produced}/partitions/0/messages?offset=0&max_records=1"
        for case, method, path, body in (("produce-1", "POST", produce, record), ("fetch-1", "GET", fetch, None),
                                         ("fetch-1-of-many", "GET", deep, None)):
            runs = calls.calls_per_request(self.counted, self.root / "calls.txt", method, path, body)
            out.append({"case": case, "calls_per_req": runs})
            self.say(f"  cpu {case:<16} Python calls/request: {', '.join(f'{r:,.1f}' for r in runs)}")
        return out

    def run(self, clients: tuple[str, ...], reps: int, seconds: float, record: bytes) -> list[dict[str, Any]]:
        rows = []
        for rep in range(reps):
            for case in CASES:
                target = self.targets.get(case.target)
                if target is None:
                    continue
                for client in clients:
                    row = run_one(case, client, target, record, seconds, self.root)
                    row["rep"] = rep
                    rows.append(row)
                    self.say(describe(row))
        return rows


def describe(row: dict[str, Any]) -> str:
    if not row.get("ok"):
        return f"  cpu {row['case']:<16} {row['client']:<6} FAILED: {row.get('error')}"
    cpu = row.get("cpu_us_per_req")
    flag = f"  DISTURBED (others {row['others_cores']:.2f} cores)" if row.get("disturbed") else ""
    err = f"  errors {row['errors']}: {row.get('last_error')}" if row.get("errors") else ""
    return (f"  cpu {row['case']:<16} {row['client']:<6} {row.get('req_s') or 0:>9,.0f} req/s  "
            f"{'-' if cpu is None else f'{cpu:,.1f}'} µs CPU/request{flag}{err}")


def run_part(bench: Any) -> dict[str, Any]:
    """The CPU-per-request part of a ``ring bench`` run: its rows and notes."""
    from ring.bench.records import make_records

    why = ensure_packages({"wrk": "wrk"})
    clients = CLIENTS if why is None else ("python",)
    notes = [] if why is None else [f"cpu: wrk is skipped: {why}"]
    s = bench.settings
    part = CpuPart(bench.root / "cpu", bench.systems.get("ring"), bench.args.fsync, bench.say)
    record = make_records(1)[0][1]
    try:
        notes += part.start(record)
        rows = part.run(clients, s.reps, s.cpu_s, record)
        counts = part.count_calls(record)
    finally:
        part.stop()
        shutil.rmtree(bench.root / "cpu", ignore_errors=True)
    return {"rows": rows, "notes": notes, "clients": list(clients), "calls": counts}


# --- the report --------------------------------------------------------------------------


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Medians per (case, client)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key in dict.fromkeys((r["case"], r["client"]) for r in rows):
        runs = [r for r in rows if (r["case"], r["client"]) == key]
        ok = [r for r in runs if r.get("ok")]
        out[key] = {"runs": len(runs), "ok": len(ok), "disturbed": sum(bool(r.get("disturbed")) for r in runs),
                    "req_s": stats.median(r.get("req_s") for r in ok),
                    "cpu_us_per_req": stats.median(r.get("cpu_us_per_req") for r in ok),
                    "errors": sum(r.get("errors") or 0 for r in runs)}
    return out


def table(part: dict[str, Any]) -> list[str]:
    """One row per case and client: requests/s, µs of server CPU per request, and the ratios to the yardsticks."""
    summary = summarise(part["rows"])
    lines = ["| case | client | requests/s | server CPU per request, µs | × aiohttp yardstick | "
             "× httptools yardstick | notes |", "|---|---|---:|---:|---:|---:|---|"]
    for case in CASES:
        for client in part["clients"]:
            s = summary.get((case.id, client))
            if s is None:
                continue
            cpu = s["cpu_us_per_req"]
            ratios = []
            for yard in ("yard-aiohttp", "yard-httptools"):
                y = (summary.get((yard, client)) or {}).get("cpu_us_per_req")
                r = stats.ratio(cpu, y)
                ratios.append("" if r is None or case.yardstick else f"{r:.2f}×")
            req_s = "–" if s["req_s"] is None else f"{s['req_s']:,.0f}"
            cpu_text = "–" if cpu is None else f"{cpu:,.1f}"
            lines.append(f"| {case.label} | {client} | {req_s} | {cpu_text} | {ratios[0]} | {ratios[1]} | "
                         f"{report.flags(s)} |")
    if part.get("calls"):
        lines += ["", "| case | Python calls per request (one broker alone, each run) |", "|---|---:|"]
        lines += [f"| {c['case']} | {' / '.join(f'{r:,.1f}' for r in c['calls_per_req'])} |" for c in part["calls"]]
    return lines


def explanation() -> list[str]:
    return ["Server CPU seconds (from /proc, every server process of the target) over the requests answered "
            "200, each case driven by wrk (`wrk -t1 -cN`) and by the Python load generator; the yardsticks "
            "answer a fixed JSON after `orjson.loads` of the same body (`ring.bench.yardsticks`). RF 3 counts "
            "the CPU of all three brokers. Beside the timings, the Python function calls of one request on "
            f"a broker alone (`ring.bench.calls`: a broker started with `RING_CALL_COUNT_FILE` counts its calls; "
            f"{calls.REQUESTS:,} requests one at a time over one connection, after a warm-up, the count's growth "
            f"over the requests, measured {calls.RUNS} times): a figure the machine's noise cannot move."]
