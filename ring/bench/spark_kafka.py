"""Spark's Kafka source on Apache Kafka beside sparkio on ring, side by side:
``python -m ring.bench.spark_kafka``.

Apache Kafka (``ring.bench.peer_kafka``: three KRaft nodes, RF 3) and a
three-broker ring (each broker with a Kafka listener) get the same records in
the same partitions: keys (some absent), null values, headers (a name
repeated, a null header value, or none) and timestamps of their own, two
records to a timestamp. Each case then runs one query three ways, in one
``local[2]`` SparkSession carrying Spark's Kafka source
(``ring.bench.spark_kafka_jars``):

- ``kafka``: ``format("kafka")`` on Apache Kafka, the reference;
- ``sparkio``: ``format("ring")`` on ring, with the same options;
- ``kafka→ring``: ``format("kafka")`` on ring's Kafka listeners.

and prints, per case, whether each side's rows (every column, headers
included) equal the reference's, how they differ when they do, and each
read's wall time (one run each, after one warm-up read per side: a single
measurement, not a distribution). Streams run with ``availableNow`` into a
memory table; their batch sizes are shown too. Exit status 1 when a side
reads other rows than Kafka's or fails where Kafka's does not; batch
boundaries that differ are shown, not counted (docs/SPARK.md says where and
why sparkio's differ).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPIC = "spark-kafka-compare"
PARTITIONS = 3
PER_PARTITION = 200
T0 = 1_700_000_000_000
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
WAIT_S = 120.0


def records(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        rec: dict[str, Any] = {"key": b"k%d" % (i % 5) if i % 4 else None,
                               "value": None if i % 7 == 3 else b"v%d" % i, "timestamp": T0 + 10 * (i // 2)}
        if i % 3 == 0:
            rec["headers"] = [("h", b"%d" % i), ("h", b"again"), ("nil", None)]
        elif i % 3 == 1:
            rec["headers"] = [("only", b"one")]
        out.append(rec)
    return out


def cases() -> list[tuple[str, str, dict[str, str]]]:
    """(name, batch or stream, options)."""
    t = TOPIC

    def per(offsets: dict[int, int]) -> str:
        return json.dumps({t: {str(p): o for p, o in offsets.items()}})

    return [
        ("earliest to latest, headers", "batch", {"subscribe": t, "includeHeaders": "true"}),
        ("by offset", "batch", {"subscribe": t, "includeHeaders": "true",
                                "startingOffsets": per({0: 5, 1: -2, 2: 150}),
                                "endingOffsets": per({0: 50, 1: -1, 2: 180})}),
        ("by timestamp per partition", "batch", {
            "subscribe": t, "includeHeaders": "true",
            "startingOffsetsByTimestamp": per({0: T0, 1: T0 + 255, 2: T0 + 985}),
            "endingOffsetsByTimestamp": per({0: T0 + 105, 1: T0 + 400, 2: T0 + 10**6})}),
        ("startingTimestamp / endingTimestamp", "batch", {
            "subscribe": t, "startingTimestamp": str(T0 + 300), "endingTimestamp": str(T0 + 555)}),
        ("timestamp after every record (strategy latest)", "batch", {
            "subscribe": t, "startingTimestamp": str(T0 + 10**6), "startingOffsetsByTimestampStrategy": "latest"}),
        ("assign, by offset", "batch", {"assign": json.dumps({t: [0, 2]}), "startingOffsets": per({0: 190, 2: 0}),
                                        "endingOffsets": per({0: -1, 2: 3})}),
        ("stream, maxOffsetsPerTrigger 250", "stream", {
            "subscribe": t, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "250", "includeHeaders": "true"}),
        ("stream from a timestamp, maxOffsetsPerTrigger 100", "stream", {
            "subscribe": t, "startingTimestamp": str(T0 + 500), "maxOffsetsPerTrigger": "100"}),
    ]


def _fill_kafka(bootstrap: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from ring.bench.peer_kafka import NODES, TOPIC_CONFIG

    admin = AdminClient({"bootstrap.servers": bootstrap})
    # The records' timestamps are in the past: kept forever, or retention would delete them.
    config = {**TOPIC_CONFIG, "retention.ms": "-1"}
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, NODES, config=config)])[TOPIC].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for p in range(PARTITIONS):
        for rec in records(PER_PARTITION):
            producer.produce(TOPIC, key=rec["key"], value=rec["value"], partition=p, timestamp=rec["timestamp"],
                             headers=rec.get("headers"))
        producer.flush(60)  # in partition order, one partition at a time
    assert producer.flush(60) == 0


def _fill_ring(urls: list[str], bootstraps: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    from sparkio.client import BrokerClient

    with BrokerClient(urls) as client:
        client.create_topic(TOPIC, PARTITIONS, replication_factor=3, retention_ms=-1)
        _until("leaders on ring", lambda: all(
            p.get("leader") for p in client.describe_topic(TOPIC)["partitions"]))
        for p in range(PARTITIONS):
            client.produce(TOPIC, [{k: v for k, v in rec.items() if v is not None or k == "value"}
                                   for rec in records(PER_PARTITION)], partition=p)
    for b in bootstraps:  # every listener's Metadata names a leader for each partition
        admin = AdminClient({"bootstrap.servers": b})
        _until(f"leaders in {b}'s Metadata", lambda: all(
            part.leader >= 0 for part in admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions.values()))


def _until(what: str, check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def _reader(spark, stream: bool, fmt: str, server_option: tuple[str, str], options: dict[str, str]):
    r = (spark.readStream if stream else spark.read).format(fmt).option(*server_option)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _run(spark, kind: str, df, name: str, checkpoint: Path) -> tuple[list[tuple], list[int], float]:
    """(rows sorted by partition and offset, batch sizes of a stream, seconds)."""
    cols = [c for c in COLUMNS if c in df.columns]
    start = time.perf_counter()
    if kind == "batch":
        got, sizes = [tuple(r) for r in df.select(*cols).collect()], []
    else:
        q = (df.select(*cols).writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        if not q.awaitTermination(WAIT_S):
            q.stop()
            raise TimeoutError(f"{name} did not finish")
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        got = [tuple(r) for r in spark.sql(f"select * from {name}").collect()]
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    seconds = time.perf_counter() - start
    return sorted(got, key=lambda r: (r[cols.index("partition")], r[cols.index("offset")])), sizes, seconds


ERROR_LINES = [re.compile(r"^(?:ring\.errors|sparkio\.\w+)\.[A-Z]\w*: .*$", re.M),  # sparkio's refusals
               re.compile(r"^(?:\w+\.)*\w+(?:Exception|Error): .*$", re.M)]  # a Java or Python exception


def error_line(text: str) -> str:
    """The line of an error that says what was refused, not Spark's wrapping of it."""
    for pattern in ERROR_LINES:
        m = pattern.search(text)
        if m:
            return m.group(0).strip()[:240]
    return text.strip().splitlines()[0][:240]


def _norm(row: tuple) -> tuple:
    return tuple([(h.key, h.value) for h in v] if isinstance(v, list) else v for v in row)


def difference(ref: tuple[list, list[int]], got: tuple[list, list[int]], cols: list[str]) -> tuple[str, bool]:
    """("same" or how ``got`` differs from ``ref``, whether its rows differ)."""
    (rows_a, sizes_a), (rows_b, sizes_b) = ref, got
    rows_a, rows_b = [_norm(r) for r in rows_a], [_norm(r) for r in rows_b]
    out = []
    if rows_a != rows_b:
        pos = lambda r: (r[cols.index("partition")], r[cols.index("offset")])  # noqa: E731
        a, b = {pos(r): r for r in rows_a}, {pos(r): r for r in rows_b}
        if a.keys() != b.keys():
            out.append(f"{len(rows_b)} rows, not {len(rows_a)} (missing {sorted(a.keys() - b.keys())[:3]}, "
                       f"extra {sorted(b.keys() - a.keys())[:3]})")
        for k in sorted(a.keys() & b.keys()):
            if a[k] != b[k]:
                which = [c for c, x, y in zip(cols, a[k], b[k]) if x != y]
                out.append(f"at {k} {', '.join(which)}: {[a[k][cols.index(c)] for c in which]} vs "
                           f"{[b[k][cols.index(c)] for c in which]}")
                break
    rows_differ = bool(out)
    if sizes_a != sizes_b:
        out.append(f"batches {sizes_b}, not {sizes_a}")
    return ("same" if not out else "; ".join(out)), rows_differ


def compare(spark, kafka_bootstrap: str, ring_urls: str, ring_bootstrap: str, work: Path) -> list[dict]:
    sides = {"kafka": ("kafka", ("kafka.bootstrap.servers", kafka_bootstrap)),
             "sparkio": ("ring", ("brokers", ring_urls)),
             "kafka→ring": ("kafka", ("kafka.bootstrap.servers", ring_bootstrap))}
    for fmt, server in sides.values():  # warm-up: class loading and the first connections
        _reader(spark, False, fmt, server, {"subscribe": TOPIC}).count()
    table = []
    for n, (name, kind, options) in enumerate(cases()):
        results, seconds = {}, {}
        for s, (side, (fmt, server)) in enumerate(sides.items()):
            df = _reader(spark, kind == "stream", fmt, server, options)
            cols = [c for c in COLUMNS if c in df.columns]
            try:
                rows, sizes, seconds[side] = _run(spark, kind, df, f"cmp_{n}_{s}", work / f"ck-{n}-{s}")
                results[side] = (rows, sizes)
            except Exception as exc:  # a side that refuses the query is a difference to show
                results[side], seconds[side] = error_line(str(exc)), float("nan")
        ref = results["kafka"]
        row = {"case": name, "rows": len(ref[0]) if isinstance(ref, tuple) else ref,
               "batches": ref[1] if isinstance(ref, tuple) else []}
        for side in sides:
            got = results[side]
            if side != "kafka":
                row[side], row[f"{side} rows differ"] = (
                    difference(ref, got, cols) if isinstance(ref, tuple) and isinstance(got, tuple)
                    else (f"error: {got}", True) if isinstance(got, str) else (f"kafka failed: {ref}", True))
            row[f"{side} s"] = seconds[side]
        table.append(row)
    return table


def render(table: list[dict]) -> str:
    lines = ["| case | rows (batches) | sparkio on ring | Kafka source on ring | s: kafka / sparkio / kafka→ring |",
             "|---|---|---|---|---|"]
    for r in table:
        batches = f" ({r['batches']})" if r["batches"] else ""
        lines.append(f"| {r['case']} | {r['rows']}{batches} | {r['sparkio']} | {r['kafka→ring']} | "
                     f"{r['kafka s']:.2f} / {r['sparkio s']:.2f} / {r['kafka→ring s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ring.bench.spark_kafka", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="directory for the brokers' data (default: a temporary one)")
    args = ap.parse_args(argv)

    from ring.bench.peer_kafka import KafkaSystem
    from ring.bench.spark_kafka_jars import jars
    from ring.localcluster import LocalCluster, free_port
    from sparkio.session import local_session

    got = jars()
    if isinstance(got, str):
        print(f"Spark's Kafka source: {got}", file=sys.stderr)
        return 2
    version, paths = got
    work = args.work or Path(tempfile.mkdtemp(prefix="spark-kafka-"))
    kafka = KafkaSystem(work / "kafka")
    why = kafka.install()
    if why:
        print(f"Apache Kafka: {why}", file=sys.stderr)
        return 2
    kafka_ports = [free_port() for _ in range(3)]
    ring = LocalCluster(work / "ring", 3, kafka_ports=kafka_ports, args=["--fsync", "never", "--log-level", "warning"])
    spark, spark_version = None, "?"
    try:
        kafka.start()
        ring.start()
        ring_bootstrap = ",".join(f"127.0.0.1:{p}" for p in kafka_ports)
        _fill_kafka(kafka.bootstrap())
        _fill_ring(ring.urls, ring_bootstrap.split(","))
        spark = local_session("spark-kafka-compare", cores=2, shuffle_partitions=2,
                              conf={"spark.jars": ",".join(paths)})
        spark_version = spark.version
        table = compare(spark, kafka.bootstrap(), ",".join(ring.urls), ring_bootstrap, work)
    finally:
        if spark is not None:
            spark.stop()
        ring.stop()
        kafka.stop()
    print(f"{kafka.version()}; ring: 3 brokers, RF 3; Spark's Kafka source {version} on pyspark "
          f"{spark_version}; {PARTITIONS} partitions x {PER_PARTITION} records\n")
    print(render(table))
    return 1 if any(r[f"{side} rows differ"] for r in table for side in ("sparkio", "kafka→ring")) else 0


if __name__ == "__main__":
    raise SystemExit(main())
