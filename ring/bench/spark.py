"""The Spark part of ``ring bench``: how fast Spark reads ring, against the same
records read from a local file by Spark's own readers, in one run.

A three-broker cluster (RF 3) holds ``records`` clickstream events as JSON
values (1 KiB each, as in the rest of the bench: the event padded with a
user-agent blob; ``--record-bytes 0`` for the bare ~150-byte events) in a
topic of ``PARTITIONS`` partitions; the same events, one JSON text per
line, are written to a local file. A ``local[2]`` SparkSession
(``sparkio.session.local_session``) then times, interleaved, ``reps`` times
each, after one warm-up round:

- count: ``spark.read.format("ring")...load().count()`` against
  ``spark.read.text(file).count()``;
- parse + group-by: ``from_json(cast(value as string))`` then
  ``groupBy("page").count()`` on the ring source, against
  ``spark.read.schema(...).json(file)`` grouped the same way (the schema
  given, so neither side pays for inference).

A ratio is the file's median time over ring's: 1.0 means ring is read as
fast as a local file. A third side is the floor of any Python data source
(``ring.bench.spark_floor``: the same rows prebuilt, nothing read), with
and without rows: what Spark's Python data source path costs before ring
does anything. Beside
wall time each run's CPU seconds are counted (the Spark driver, JVM and
Python workers, and the brokers): on a machine other work also uses, CPU
seconds move much less than wall time. Spark runs in a child process
(``python -m ring.bench.spark --child``) so its JVM and workers end with it;
the brokers are stopped at the end whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECORDS_DEFAULT = 300_000
RECORD_BYTES_DEFAULT = 1024
PARTITIONS = 6
TOPIC = "bench-spark"
CHILD_TIMEOUT_S = 1_800
CASES = ("count", "group")


def _events(records: int, record_bytes: int):
    """(user, ts, JSON value) of each event."""
    import random

    import orjson

    from ring import clickstream

    if not record_bytes:
        for event in clickstream.events(records):
            yield event["user"], event["ts"], orjson.dumps(event)
        return
    rng = random.Random(7)
    for _ in range(records):
        value = clickstream.padded_record(rng, record_bytes)
        event = orjson.loads(value)
        yield event["user"], event["ts"], value


def missing() -> str | None:
    """Why the Spark part cannot run here, or None."""
    import importlib.util

    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return f"the spark extra is not installed ({module} missing): pip install -e '.[spark]'"
    if shutil.which("java") is None:
        return "Spark needs a Java runtime and java is not on PATH"
    return None


def _fill(urls: list[str], path: Path, records: int, record_bytes: int, partitions: int) -> int:
    """Produce the events to the topic and write them to ``path``; bytes of values."""
    from sparkio.client import BrokerClient

    total = 0
    with BrokerClient(urls) as client, path.open("wb") as f:
        # The events carry their own (past) times: kept forever, or retention would delete each
        # partition's first segment once it closes and the bench would lose its own records.
        client.create_topic(TOPIC, partitions, replication_factor=3, retention_ms=-1)
        batch: list[dict] = []
        for user, ts, value in _events(records, record_bytes):
            total += len(value)
            f.write(value + b"\n")
            batch.append({"key": user, "value": value, "timestamp": ts})
            if len(batch) == 2_000:
                client.produce(TOPIC, batch)
                batch = []
        if batch:
            client.produce(TOPIC, batch)
    return total


def _tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds of ``roots`` and their descendants, with the children they reaped."""
    from ring.bench import procs

    total = 0
    for pid in procs.with_descendants(roots):
        f = procs._stat_fields(pid)
        if f is not None:
            total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])  # utime stime cutime cstime
    return total / procs.TICKS_PER_S


def _measure(action, roots: list[int]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of ``roots``' process trees) of one run."""
    cpu0 = _tree_cpu_s(roots)
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0, _tree_cpu_s(roots) - cpu0


def child(urls: str, path: str, reps: int, broker_pids: list[int], value_bytes: int) -> dict:
    """Runs in the child process: wall and CPU seconds per case and side."""
    from pyspark.sql import functions as F

    from ring.bench.spark_floor import FloorSource
    from sparkio.pipeline import EVENT_DDL
    from sparkio.session import local_session

    spark = local_session("ring-bench-spark", cores=2, shuffle_partitions=2)
    spark.dataSource.register(FloorSource)
    try:
        def ring():
            return spark.read.format("ring").option("brokers", urls).option("subscribe", TOPIC).load()

        def parsed(df):
            return df.select(F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e")).select("e.*")

        expect = spark.read.text(path).count()

        def floor(rows: int):
            return spark.read.format("ring-floor").option("rows", rows).option("valueBytes", value_bytes).load()

        runs = {
            ("count", "ring"): lambda: ring().count(),
            ("count", "file"): lambda: spark.read.text(path).count(),
            ("count", "floor"): lambda: floor(expect).count(),
            ("count", "empty"): lambda: floor(0).count(),
            ("group", "ring"): lambda: parsed(ring()).groupBy("page").count().collect(),
            ("group", "file"): lambda: spark.read.schema(EVENT_DDL).json(path).groupBy("page").count().collect(),
        }
        assert ring().count() == expect, "the ring source and the file hold different record counts"
        for run in runs.values():  # warm-up: JIT, Python workers, page cache
            run()
        roots = [os.getpid(), *broker_pids]
        times: dict[str, list[float]] = {f"{c}/{side}": [] for c, side in runs}
        cpu: dict[str, list[float]] = {f"{c}/{side}": [] for c, side in runs}
        for _ in range(reps):
            for (case, side), run in runs.items():
                wall, cpu_s = _measure(run, roots)
                times[f"{case}/{side}"].append(wall)
                cpu[f"{case}/{side}"].append(cpu_s)
        return {"times": times, "cpu": cpu, "records": expect}
    finally:
        spark.stop()


def run_part(records: int = RECORDS_DEFAULT, reps: int = 3, fsync: str = "interval:1000",
             record_bytes: int = RECORD_BYTES_DEFAULT) -> dict:
    """Start a cluster, fill it and the file, time Spark in a child process, stop everything."""
    from ring.localcluster import LocalCluster

    workdir = Path(tempfile.mkdtemp(prefix="ring-bench-spark-"))
    cluster = LocalCluster(workdir / "cluster", 3, args=["--fsync", fsync, "--log-level", "warning"],
                           env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        cluster.start()
        path = workdir / "events.json"
        value_bytes = _fill(cluster.urls, path, records, record_bytes, PARTITIONS)
        load = os.getloadavg()[0]
        pids = [b.proc.pid for b in cluster.brokers if b.proc is not None]
        proc = subprocess.run([sys.executable, "-m", "ring.bench.spark", "--child", ",".join(cluster.urls),
                               str(path), str(reps), ",".join(map(str, pids)), str(record_bytes or 154)],
                              capture_output=True, timeout=CHILD_TIMEOUT_S)
        lines = proc.stdout.decode().strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"the Spark run failed: {proc.stderr.decode()[-800:]}")
        res = json.loads(lines[-1])
        res.update(value_bytes=value_bytes, file_bytes=path.stat().st_size, partitions=PARTITIONS,
                   load_avg_1m=(load, os.getloadavg()[0]))
        return res
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def summary(res: dict) -> dict[str, dict[str, float]]:
    """Per case and side (ring, file, floor): median wall and CPU seconds; ratios file/ring."""
    out = {}
    for case in CASES:
        c: dict[str, float] = {}
        for side in ("ring", "file", "floor", "empty"):
            key = f"{case}/{side}"
            if key in res["times"]:
                c[f"{side}_s"] = statistics.median(res["times"][key])
                c[f"{side}_cpu_s"] = statistics.median(res["cpu"][key])
        c["ratio"] = c["file_s"] / c["ring_s"]
        c["cpu_ratio"] = c["file_cpu_s"] / c["ring_cpu_s"]
        out[case] = c
    return out


def report(res: dict, command: str) -> str:
    s = summary(res)
    labels = {"count": ("`load().count()`", "`spark.read.text(file).count()`"),
              "group": ("`from_json(value)` + `groupBy(\"page\").count()`",
                        "`spark.read.schema(...).json(file)` + the same group-by")}
    load = res["load_avg_1m"]
    busy = max(load) > (os.cpu_count() or 1) * 0.75
    lines = [
        f"command: `{command}`",
        f"{res['records']:,} clickstream events ({res['value_bytes'] / res['records']:.0f} B of JSON each), "
        f"a {res['partitions']}-partition topic on three brokers (RF 3) and a {res['file_bytes'] / 1e6:.0f} MB "
        f"local file; local[2] SparkSession; median of {len(res['times']['count/ring'])} interleaved runs "
        f"after a warm-up; load average (1 min) before/after: {load[0]:.2f}/{load[1]:.2f}"
        + (" -- FLAGGED: other processes used much of the CPU; wall times are depressed and noisy" if busy else ""),
        "",
        "| query | ring source | local file | file / ring, wall | file / ring, CPU |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in CASES:
        ring_label, file_label = labels[case]
        c = s[case]
        lines.append(f"| {ring_label} vs {file_label} | {c['ring_s']:.2f} s, {c['ring_cpu_s']:.1f} CPU s | "
                     f"{c['file_s']:.2f} s, {c['file_cpu_s']:.1f} CPU s | {c['ratio']:.2f} | {c['cpu_ratio']:.2f} |")
    f = s["count"]
    lines += ["", f"Floor of any Python data source (`ring.bench.spark_floor`: the same rows prebuilt, nothing read), "
                  f"`count()`: {f['floor_s']:.2f} s, {f['floor_cpu_s']:.1f} CPU s, of which {f['empty_s']:.2f} s "
                  f"({f['empty_cpu_s']:.1f} CPU s) with no rows at all; the local file's `count()` takes "
                  f"{f['file_s'] / f['floor_s']:.2f} of the floor's time."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m ring.bench.spark``: this part alone."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        pids = [int(p) for p in argv[4].split(",") if p]
        print(json.dumps(child(argv[1], argv[2], int(argv[3]), pids, int(argv[5]))))
        return 0
    p = argparse.ArgumentParser(prog="python -m ring.bench.spark", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--fsync", default="interval:1000")
    p.add_argument("--record-bytes", type=int, default=RECORD_BYTES_DEFAULT,
                   help="JSON events padded to this size (0: bare events)")
    args = p.parse_args(argv)
    res = run_part(args.records, args.reps, args.fsync, args.record_bytes)
    print(report(res, " ".join(["python -m ring.bench.spark", *argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
