"""``ring bench``: ring against NATS JetStream, RabbitMQ streams and Apache
Kafka, each a three-node cluster on loopback, in one run.

The run starts every system, then goes through the cases (``ring.bench.cases``)
interleaving systems within each repetition. Each run is one load-generator
process (``ring.bench.loadgen``); around it this process reads the brokers'
CPU seconds and peak RSS, and the whole machine's busy CPU time, so a run
during which other processes took a noticeable share of the CPU is flagged.
Then the ceilings (wrk, disk, loopback), the single-broker and hostile-input
parts, the Spark part (``ring.bench.spark``: Spark reading ring against a
local file; left out of ``--quick`` unless named in ``--cases``), optionally a
py-spy profile of a broker under produce load, and the report: one table on
stdout, and with ``--output`` the generated section of docs/BENCHMARKS.md and a
PNG plot beside it. Every system is stopped at the end, also on failure or ^C.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from ring.bench import cases as casemod
from ring.bench import procs, profile, stats
from ring.bench.system import RingSystem, ensure_packages, http_json

E2E_RATE = casemod.E2E_RATE_PER_S
WARM_UP_S = 3.0  # a peer may ask for longer (``warm_up_s``: a JVM's JIT)
PEER_MODULES = {"nats": ("ring.bench.peer_nats", "NatsSystem"),
                "rabbitmq": ("ring.bench.peer_rabbitmq", "RabbitSystem"),
                "kafka": ("ring.bench.peer_kafka", "KafkaSystem")}
DEFAULT_OUTPUT = Path("docs/BENCHMARKS.md")


@dataclass
class Settings:
    reps: int = 3
    produce_s: float = 8.0
    latency_s: float = 5.0
    e2e_s: float = 5.0
    fill_records: int = 300_000
    consume_s: float = 20.0
    window: int = 256
    window_batched: int = 32
    ceiling_s: float = 3.0
    single_records: int = 200_000
    spark_records: int = 300_000
    profile_s: float = 10.0
    hostile_cases: tuple[str, ...] = ()  # ring.bench.hostile's case ids (and "trickle", "pipeline"); empty: all
    cpu_s: float = 5.0
    members_s: float = 5.0
    overload_s: float = 5.0

    @classmethod
    def quick(cls) -> "Settings":
        return cls(reps=1, produce_s=0.5, latency_s=0.4, e2e_s=0.5, fill_records=10_000, consume_s=5.0,
                   ceiling_s=0.3, single_records=10_000, spark_records=10_000, profile_s=1.0, cpu_s=0.5,
                   hostile_cases=("json-records-bytes", "over-gzip-records", "trickle"), members_s=0.5,
                   overload_s=0.5)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ring bench", description=(
        "ring (3 brokers, RF 3) against NATS JetStream, RabbitMQ streams and Apache Kafka (3 nodes each) on loopback: "
        "produce, latency, consume, end-to-end, ceilings; one table of medians and ratios."))
    p.add_argument("--quick", action="store_true", help="short runs, 1 repetition: a smoke test")
    p.add_argument("--peers", default=",".join(casemod.PEERS),
                   help=f"some of {','.join(casemod.PEERS)}, or none (default all)")
    p.add_argument("--cases", default=",".join(casemod.GROUPS),
                   help=f"groups ({','.join(casemod.GROUPS)}) or case ids, comma-separated (default all)")
    p.add_argument("--output", type=Path, default=None,
                   help="rewrite the generated section of this Markdown file and write a plot beside it "
                        f"(default {DEFAULT_OUTPUT} when it exists here, except with --quick)")
    p.add_argument("--no-output", action="store_true", help="print the report only")
    p.add_argument("--reps", type=int, default=None, help="repetitions per case and system (default 3, quick 1)")
    p.add_argument("--seconds", type=float, default=None, help="time bound of each produce run")
    p.add_argument("--window", type=int, default=None, help="requests in flight, 1 record per request (default 256)")
    p.add_argument("--window-batched", type=int, default=None,
                   help="requests in flight, 100 records per request (default 32)")
    p.add_argument("--brokers", type=int, default=3, help="ring brokers (default 3; 1 runs the ring side on one broker)")
    p.add_argument("--fsync", default="interval:1000", help="ring's fsync policy (default interval:1000)")
    p.add_argument("--profile", action="store_true",
                   help="py-spy a ring broker during an extra batched-produce run and report its top frames")
    args = p.parse_args(argv)
    if args.no_output:
        args.output = None
    elif args.output is None and not args.quick and DEFAULT_OUTPUT.exists():
        args.output = DEFAULT_OUTPUT
    return args


def ring_commit() -> str:
    """The commit of the ring source being measured (and whether it has local changes)."""
    here = Path(__file__).resolve().parent.parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no", "--", "ring"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha + (" with uncommitted changes under ring/" if dirty else "")) if sha else "unknown"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.settings = Settings.quick() if args.quick else Settings()
        s = self.settings
        s.reps = args.reps or s.reps
        s.produce_s = args.seconds or s.produce_s
        s.window = args.window or s.window
        s.window_batched = args.window_batched or s.window_batched
        self.cases = casemod.select([c for c in args.cases.split(",") if c])
        self.groups = {c.group for c in self.cases} | {g for g in args.cases.split(",") if g in casemod.GROUPS}
        if args.quick and args.cases == ",".join(casemod.GROUPS):
            self.groups.discard("spark")  # a Spark session alone takes longer than the rest of a smoke run
        self.peers = casemod.parse_peers(args.peers)
        self.root = Path(tempfile.mkdtemp(prefix="ring-bench-"))
        self.systems: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.extra: dict[str, Any] = {}
        self.failed_parts: list[str] = []
        self.versions: dict[str, str] = {}

    def say(self, line: str) -> None:
        print(line, flush=True)

    def note(self, line: str) -> None:
        self.notes.append(line)
        self.say(line)

    # --- systems ---------------------------------------------------------------------

    def start_systems(self) -> None:
        ring = RingSystem(self.root / "ring", brokers=self.args.brokers, fsync=self.args.fsync)
        self.systems["ring"] = ring
        ring.start()
        if not ring.clustered and self.args.brokers > 1:
            self.note(f"ring runs on ONE broker: {ring.label}; its figures are labelled so")
        self.say(f"started {ring.label}")
        for name in self.peers:
            module, cls = PEER_MODULES[name]
            Peer = getattr(importlib.import_module(module), cls)
            missing = [m for m in Peer.python_modules if importlib.util.find_spec(m) is None]
            if missing:
                self.note(f"peer {name} skipped: Python module {', '.join(missing)} missing "
                          f"(pip install -e '.[bench]')")
                continue
            why = Peer(self.root / name).install()
            if why:
                self.note(f"peer {name} skipped: {why}")
                continue
            peer = Peer(self.root / name)
            try:
                peer.start()
            except Exception as exc:
                self.note(f"peer {name} skipped: could not start: {exc}")
                continue
            self.systems[name] = peer
            self.say(f"started {peer.label}")
            if hasattr(peer, "describe"):  # a configuration the report prints whole
                self.extra.setdefault("configs", {})[name] = peer.describe(self.settings)

    def measure_idle(self, seconds: float) -> None:
        """Each system's CPU while nothing is sent: what an idle peer costs the
        runs of the others (counted among their *others*)."""
        pids = {n: [p for ps in s.broker_pids().values() for p in ps] for n, s in self.systems.items()}
        before = {n: procs.cpu_of(p) for n, p in pids.items()}
        time.sleep(seconds)
        self.extra["idle_cores"] = {n: (procs.cpu_of(p) - before[n]) / seconds for n, p in pids.items()}

    def stop_systems(self) -> None:
        for name, s in self.systems.items():
            try:
                s.stop()
            except Exception as exc:
                self.say(f"stopping {name}: {exc}")

    # --- runs ------------------------------------------------------------------------

    def spec(self, case: casemod.Case, rep: int, system: str) -> dict[str, Any] | None:
        s = self.settings
        batched = case.records_per_request > 1
        spec: dict[str, Any] = {
            "system": system, "op": case.op, "target": self.systems[system].target(),
            "topic": f"bench-{case.id}-r{rep}-{uuid.uuid4().hex[:6]}", "consistency": case.consistency,
            "records_per_request": case.records_per_request, "keyed": case.keyed, "seed": rep + 1,
            "window": s.window_batched if batched else s.window,
        }
        if case.op == "produce":
            spec["seconds_max"] = s.produce_s if case.in_flight == "window" else s.latency_s
            spec["requests_max"] = 2_000_000 // case.records_per_request
            if case.in_flight == "one":
                spec["window"] = 1
            elif case.in_flight == "half":
                top = stats.median(r["rec_s"] for r in self.rows
                                   if r["case"] == case.max_of and r["system"] == system and r.get("ok"))
                if not top:
                    return None
                spec["rate"] = top / 2 / case.records_per_request
        elif case.op in ("consume", "consume_group"):
            spec.update(fill_records=s.fill_records, seconds_max=s.consume_s, window=s.window_batched)
        elif case.op == "e2e":
            spec.update(rate=E2E_RATE, requests_max=int(E2E_RATE * s.e2e_s), seconds_max=s.e2e_s, window=1)
        return spec

    def run_one(self, case: casemod.Case, rep: int, system: str, spec: dict[str, Any],
                profile_out: Path | None = None) -> dict[str, Any]:
        groups = self.systems[system].broker_pids()
        brokers = [p for pids in groups.values() for p in pids]
        busy0, cpu0, me0 = procs.machine_busy_seconds(), procs.cpu_of(brokers), time.process_time()
        kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        load0 = os.getloadavg()[0]
        sampler = procs.PeakRss(groups)
        sampler.start()
        spy = None
        if profile_out is not None:
            spy = profile.start(groups[sorted(groups)[0]][0], profile_out, self.settings.profile_s)
        t0 = time.perf_counter()
        timeout = spec.get("seconds_max", 10) * 3 + 90
        try:
            r = subprocess.run([sys.executable, "-m", "ring.bench.loadgen"], input=orjson.dumps(spec),
                               capture_output=True, timeout=timeout)
            lines = r.stdout.strip().splitlines()
            res = orjson.loads(lines[-1]) if lines else {"ok": False, "error": r.stderr.decode()[-500:]}
        except subprocess.TimeoutExpired:
            res = {"ok": False, "error": f"load generator did not finish within {timeout:g} s"}
        wall = time.perf_counter() - t0
        if spy is not None:
            spy.wait(30)
        peak = sampler.stop()
        kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        kids = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
        broker_cpu = procs.cpu_of(brokers) - cpu0
        mine = time.process_time() - me0
        others = stats.others_cores(procs.machine_busy_seconds() - busy0, broker_cpu + kids + mine, wall)
        records = res.get("records") or 0
        row = {
            "case": case.id, "system": system, "rep": rep, **res,
            "lat": res.get("lat_ms"), "broker_cpu_s": broker_cpu, "loadgen_cpu_s": kids,
            "cpu_us_per_rec": broker_cpu / records * 1e6 if records else None,
            "rss_peak_mb": max(peak.values(), default=0) / 1e6, "rss_mb": {k: v / 1e6 for k, v in peak.items()},
            "others_cores": others, "disturbed": stats.disturbed(others),
            "load1": (load0, os.getloadavg()[0]), "wall_s": wall,
        }
        row.pop("lat_ms", None)
        return row

    def describe(self, row: dict[str, Any]) -> str:
        if not row.get("ok"):
            return f"  {row['system']:<9} FAILED: {row.get('error')}"
        lat = row.get("lat") or {}
        p99 = lat.get("p99")
        flag = f"  DISTURBED (others {row['others_cores']:.2f} cores)" if row["disturbed"] else ""
        err = f"  errors {row['errors']}: {row.get('last_error')}" if row.get("errors") else ""
        cpu = row.get("cpu_us_per_rec")
        cpu_text = "" if cpu is None else f"  cpu {cpu:,.0f} µs/rec"
        return (f"  {row['system']:<9} {row.get('rec_s') or 0:>11,.0f} rec/s  p99 "
                f"{'-' if p99 is None else f'{p99:.2f}'} ms  rss {row['rss_peak_mb']:.0f} MB{cpu_text}{flag}{err}")

    def warm_up(self) -> None:
        """A short batched produce per system, not counted: first writes on a
        fresh disk and first connections are slower (MACHINE-NOTES). A system
        that asks for a longer one (``warm_up_s``: a JVM's JIT) gets a batched
        and an unbatched produce that long each."""
        for system, obj in self.systems.items():
            seconds = getattr(obj, "warm_up_s", None)
            ids = ["produce-100-unkeyed-quorum"] + (["produce-1-unkeyed-quorum"] if seconds else [])
            for case_id in ids:
                case = next(c for c in casemod.all_cases() if c.id == case_id)
                spec = self.spec(case, 0, system)
                assert spec is not None
                spec["seconds_max"] = 0.5 if self.args.quick else seconds or WARM_UP_S
                row = self.run_one(case, 0, system, spec)
                if not row.get("ok"):
                    self.say(f"warm-up of {system} failed: {row.get('error')}")

    def run_cases(self) -> None:
        have = list(self.systems)
        if not self.args.quick:
            self.warm_up()
        for case, rep, system in casemod.plan(self.cases, have, self.settings.reps):
            if rep == 0 and system == "ring":
                self.say(f"{case.label}")
            spec = self.spec(case, rep, system)
            if spec is None:
                self.note(f"{case.id} on {system} skipped: no maximum measured for {case.max_of}")
                continue
            row = self.run_one(case, rep, system, spec)
            self.rows.append(row)
            self.say(self.describe(row))
        if self.args.profile and "ring" in self.systems:
            self.run_profile()

    def run_profile(self) -> None:
        """py-spy on ring-0 during an extra run of each quorum produce case
        (not counted in the table: the profiler takes CPU)."""
        if profile.py_spy() is None:
            self.note("profile skipped: py-spy is not installed (pip install py-spy)")
            return
        self.extra["profile"] = []
        for case_id in ("produce-100-unkeyed-quorum", "produce-1-unkeyed-quorum"):
            case = next(c for c in casemod.all_cases() if c.id == case_id)
            spec = self.spec(case, 99, "ring")
            assert spec is not None
            spec["seconds_max"] = self.settings.profile_s + 2
            out = self.root / f"profile-{case_id}.txt"
            row = self.run_one(case, 99, "ring", spec, profile_out=out)
            text = out.read_text() if out.exists() else ""
            kept = Path(tempfile.gettempdir()) / f"ring-bench-profile-{case_id}.txt"
            kept.write_text(text)
            self.extra["profile"].append({"case": case.label, "top": profile.top_frames(text),
                                          "rec_s": row.get("rec_s"), "raw": str(kept)})
            self.say(f"profile of ring-0 during {case.label} ({row.get('rec_s') or 0:,.0f} rec/s): {kept}")

    # --- ceilings and the single-broker part -----------------------------------------

    def run_ceilings(self) -> None:
        from ring.bench import ceilings
        from ring.bench.records import make_records

        s = self.settings
        self.say("ceilings: disk, loopback, wrk")
        self.extra["disk"] = ceilings.disk_ceilings(self.root, s.ceiling_s)
        self.extra["loopback_mb_s"] = ceilings.loopback_mb_s(s.ceiling_s)
        ring = self.systems["ring"]
        import urllib.request
        topic = f"bench-wrk-{uuid.uuid4().hex[:6]}"
        req = urllib.request.Request(ring.urls[0] + "/v1/topics", method="POST", headers={"Content-Type": "application/json"},
                                     data=orjson.dumps({"name": topic, "partitions": 1,
                                                        "replication_factor": ring.target()["replication_factor"]}))
        with urllib.request.urlopen(req, timeout=10):
            pass
        leader_url = ring.urls[0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, doc = http_json(ring.urls[0] + f"/v1/topics/{topic}")
            _, cl = http_json(ring.urls[0] + "/v1/cluster")
            urls = {b["name"]: b["client_url"] for b in (cl or {}).get("brokers", [])}
            leader = ((doc or {}).get("partitions") or [{}])[0].get("leader")
            if leader in urls:
                leader_url = urls[leader]
                break
            time.sleep(0.2)
        why = ensure_packages({"wrk": "wrk"})
        if why:
            self.note(f"wrk ceiling skipped: {why}")
            return
        self.extra["wrk"] = ceilings.wrk_produce(leader_url, topic, 0, make_records(1)[0][1], self.root,
                                                 max(1.0, s.ceiling_s * 2), s.window)

    def run_spark(self) -> None:
        from ring.bench import spark

        why = spark.missing()
        if why:
            self.note(f"Spark part skipped: {why}")
            return
        self.say("Spark part: reading ring against a local file")
        try:
            self.extra["spark"] = spark.run_part(self.settings.spark_records, reps=self.settings.reps + 2,
                                                 fsync=self.args.fsync)
        except Exception as exc:  # a failed part is reported; the figures already measured are kept
            self.failed_parts.append(f"Spark part failed: {exc}")
            self.note(self.failed_parts[-1])

    def run_cpu(self) -> None:
        from ring.bench import cpu

        self.say("cpu per request: wrk and the Python load generator against ring and the yardsticks")
        self.extra["cpu"] = cpu.run_part(self)
        for line in self.extra["cpu"]["notes"]:
            self.note(line)

    def _part(self, key: str, label: str, what: str, run: Callable[[], Any]) -> None:
        """Run one part measured only when asked for, its figures under ``extra[key]``; a failed part is
        reported, the figures already measured are kept."""
        self.say(f"{label} part: {what}")
        try:
            self.extra[key] = run()
        except Exception as exc:
            self.failed_parts.append(f"{label} part failed: {exc}")
            self.note(self.failed_parts[-1])

    def run_single(self) -> None:
        from ring.bench import single

        self._part("single", "single-broker", "stored batches and JSON on one broker",
                   lambda: single.run_part(self.settings.single_records, fsync=self.args.fsync))

    def run_hostile(self) -> None:
        from ring.bench import hostile

        self._part("hostile", "hostile", "broker RSS for a produce at each limit, and trickling clients",
                   lambda: hostile.run_part(fsync=self.args.fsync, only=list(self.settings.hostile_cases)))

    def run_members(self) -> None:
        from ring.bench import members

        self._part("members", "members",
                   "one host's throughput with 1, 2 and auto members, direct and through one port",
                   lambda: members.run_part(self.settings.members_s, fsync=self.args.fsync))

    def run_overload(self) -> None:
        from ring.bench import overload

        self._part("overload", "overload",
                   "twice the maximum offered to one broker, and a tenant over its quota",
                   lambda: overload.run_part(self.settings.overload_s, fsync=self.args.fsync))

    # --- all of it -------------------------------------------------------------------

    def run(self) -> int:
        t0 = time.time()
        self.versions["commit"] = ring_commit()  # the run log's, not the reference doc's
        self.say(f"ring source: commit {self.versions['commit']}")
        try:
            if self.cases or self.groups & {"ceiling", "cpu"}:  # the single and hostile parts start their own broker
                self.start_systems()
                self.versions.update({n: s.version() for n, s in self.systems.items()})
                self.measure_idle(1.0 if self.args.quick else 5.0)
                self.run_cases()
            if "ceiling" in self.groups:
                self.part(self.run_ceilings, "ceilings")
            if "cpu" in self.groups:
                self.part(self.run_cpu, "cpu per request")
        finally:
            self.stop_systems()
        if "single" in self.groups:
            self.run_single()
        if "hostile" in self.groups:
            self.run_hostile()
        if "members" in self.groups:
            self.run_members()
        if "overload" in self.groups:
            self.run_overload()
        if "spark" in self.groups:
            self.run_spark()
        shutil.rmtree(self.root, ignore_errors=True)
        self.extra["seconds"] = time.time() - t0
        raw = Path(tempfile.gettempdir()) / "ring-bench-rows.json"
        raw.write_bytes(orjson.dumps({"versions": self.versions, "rows": self.rows, "extra": self.extra,
                                      "notes": self.notes},
                                     option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        self.say(f"every run's figures: {raw}")
        from ring.bench import render

        text = render.markdown(self)
        print()
        print(text)
        if self.args.output is not None:
            render.write(self, text)
        return 0 if all(r.get("ok") for r in self.rows) and not self.failed_parts else 1

    def part(self, fn: Any, name: str) -> None:
        try:
            fn()
        except Exception as exc:  # reported beside the figures already measured
            self.failed_parts.append(f"{name} failed: {type(exc).__name__}: {exc}")
            self.note(self.failed_parts[-1])


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the systems as ^C does


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    args.command = " ".join(["ring bench", *(argv if argv is not None else sys.argv[2:])])
    try:
        bench = Bench(args)
    except ValueError as exc:
        print(f"ring bench: {exc}", file=sys.stderr)
        return 2
    try:
        return bench.run()
    except KeyboardInterrupt:
        print("interrupted; every system was stopped", file=sys.stderr)
        return 130
