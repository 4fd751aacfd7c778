"""A partition larger than a broker, measured: ``python -m ring.bench.ranges``.

Six brokers on loopback (``ring.localcluster``) and one topic of one
partition, replication factor 3, whose replicas keep a local tail of two
segments (``local_retention_bytes``); every other closed segment becomes a
range on the ring (``ring.ranges``). The run fills the partition with
1 KiB records until it holds ``--ranges`` ranges or more, waits until every
range has its three verified holders and the replicas have trimmed their
logs to the tail, and then measures:

- disk used per broker (every file under its data directory), against the
  mean over the six: storage spreads when each broker holds about as much;
- each replica's own log (offsets and bytes it keeps locally);
- the backlog read twice, from offset 0 to the high watermark: by a plain
  fetch loop (``ring.client``, which reads each range from its holders) and
  by Spark (``sparkio.read_rdd``, one split per range, each task reading
  from the range's holders). The bytes each broker served are its own
  ``ring_fetch_bytes_total`` for the topic (fetch answers, counted where they
  are answered; the readers ask holders and replicas straight, so nothing is
  proxied), taken before and after each read.

The output is a JSON document (``--output``) and the markdown rows
docs/BENCHMARKS.md shows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from ring.localcluster import LocalCluster

TOPIC = "backlog"
RECORD_BYTES = 1024
BATCHES_PER_SEGMENT = 8  # a produce request is one batch: several fill a segment
WAIT_S = 600.0  # copies and trims of ~50 MiB on a busy 2-core machine


def _get(url: str, timeout_s: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read()


def _json(url: str) -> Any:
    return json.loads(_get(url))


def _fetch_bytes(url: str) -> int:
    """This broker's ``ring_fetch_bytes_total`` for the topic."""
    text = _get(url + "/metrics").decode()
    m = re.search(r'^ring_fetch_bytes_total\{topic="%s"\} ([0-9.e+]+)$' % TOPIC, text, re.M)
    return int(float(m.group(1))) if m else 0


def _served(urls: list[str]) -> dict[str, int]:
    return {u: _fetch_bytes(u) for u in urls}


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _wait(what: str, check: Any, timeout_s: float = WAIT_S, last: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s" + (f"; last seen {last()}" if last else ""))


def _shares(before: dict[str, int], after: dict[str, int], names: dict[str, str]) -> dict[str, float]:
    served = {names[u]: after[u] - before[u] for u in after}
    total = sum(served.values()) or 1
    return {n: round(v / total, 4) for n, v in sorted(served.items())}


def fill(urls: list[str], ranges_min: int, segment_bytes: int) -> int:
    """Produce 1 KiB records until the partition's closed segments make ``ranges_min`` ranges; records."""
    from sparkio.client import BrokerClient

    value = b"r" * (RECORD_BYTES - 24)
    per_request = max(1, segment_bytes // RECORD_BYTES // BATCHES_PER_SEGMENT)
    n = 0
    target = (ranges_min + 3) * segment_bytes  # the local tail keeps two segments and the active one
    with BrokerClient(urls) as c:
        while n * RECORD_BYTES < target:
            c.produce(TOPIC, [{"value": b"%08d:" % (n + i) + value} for i in range(per_request)], partition=0)
            n += per_request
    return n


def _active_base(data_dir: Path) -> int:
    """Base offset of the active (last) segment of the partition's log in a broker's data directory."""
    return max(int(p.stem) for p in (data_dir / "topics" / TOPIC / "0").glob("*.log"))


def measure(root: Path, brokers: int, ranges_min: int, segment_bytes: int, spark: bool) -> dict[str, Any]:
    cluster = LocalCluster(root, brokers, args=["--range-interval-s", "0.5", "--log-level", "warning"])
    cluster.start()
    out: dict[str, Any] = {"brokers": brokers, "segment_bytes": segment_bytes, "record_bytes": RECORD_BYTES}
    try:
        urls = cluster.urls
        names = {b.url: b.name for b in cluster.brokers}
        req = urllib.request.Request(urls[0] + "/v1/topics", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"name": TOPIC, "partitions": 1, "replication_factor": 3,
                                                      "segment_bytes": segment_bytes,
                                                      "local_retention_bytes": 2 * segment_bytes}).encode())
        urllib.request.urlopen(req, timeout=60).read()
        t0 = time.monotonic()
        records = fill(urls, ranges_min, segment_bytes)
        out["records"], out["fill_s"] = records, round(time.monotonic() - t0, 1)

        part = _json(urls[0] + f"/v1/topics/{TOPIC}")["partitions"][0]
        by_name = {b.name: b for b in cluster.brokers}
        leader = by_name[part["leader"]]

        def placed() -> Any:  # every closed segment is a range on its three holders
            doc = _json(leader.url + f"/v1/topics/{TOPIC}/partitions/0/ranges")
            rs = doc["ranges"]
            ok = len(rs) >= ranges_min and all(len(r["holders"]) == r["copies"] == 3 for r in rs)
            return doc if ok and rs[-1]["end_offset"] == _active_base(leader.data_dir) else None

        doc = _wait("every range on three holders", placed,
                    last=lambda: (records, _json(urls[0] + f"/v1/topics/{TOPIC}/partitions/0/ranges")))
        part = _json(leader.url + f"/v1/topics/{TOPIC}")["partitions"][0]
        replicas = part["replicas"]

        def trimmed() -> Any:  # every replica keeps the tail only, where the leader's starts
            parts = {n: _json(by_name[n].url + f"/v1/topics/{TOPIC}")["partitions"][0] for n in replicas}
            ok = all(p["local_start_offset"] == doc["local_start_offset"] > 0 for p in parts.values())
            return parts if ok else None

        parts = _wait("the replicas trimmed to their tail", trimmed)
        out["settle_s"] = round(time.monotonic() - t0 - out["fill_s"], 1)
        out["ranges"] = len(doc["ranges"])
        out["range_bytes"] = sum(r["bytes"] for r in doc["ranges"])
        out["high_watermark"] = part["high_watermark"]
        disk = {b.name: _disk(b.data_dir) for b in cluster.brokers}
        mean = sum(disk.values()) / len(disk)
        out["disk_bytes"] = disk
        out["disk_max_over_mean"] = round(max(disk.values()) / mean, 3)
        out["disk_min_over_mean"] = round(min(disk.values()) / mean, 3)
        out["replicas"] = {n: {"local_start_offset": p["local_start_offset"],
                               "local_bytes": _disk(by_name[n].data_dir / "topics" / TOPIC / "0"),
                               "local_share_of_offsets": round(1 - p["local_start_offset"] / p["high_watermark"], 4)}
                           for n, p in parts.items()}
        out["fetch_loop"] = read_loop(urls, names, part["high_watermark"])
        if spark:
            out["spark"] = read_spark(urls, names, part["high_watermark"])
    finally:
        cluster.stop()
    return out


def read_loop(urls: list[str], names: dict[str, str], hw: int) -> dict[str, Any]:
    from ring.client import Client

    before = _served(urls)
    t0 = time.monotonic()
    nbytes, offset = 0, 0
    with Client(",".join(urls)) as c:
        while offset < hw:
            got = c.fetch(TOPIC, 0, offset, max_records=10_000, max_bytes=1 << 20)
            assert got.records and got.records[0].offset == offset, (offset, got.next_offset)
            nbytes += sum(len(r.value or b"") for r in got.records)
            offset = got.next_offset
    seconds = time.monotonic() - t0
    shares = _shares(before, _served(urls), names)
    return {"seconds": round(seconds, 2), "record_bytes": nbytes, "served_share": shares,
            "served_share_max": max(shares.values()), "brokers_serving": sum(1 for v in shares.values() if v > 0)}


def read_spark(urls: list[str], names: dict[str, str], hw: int) -> dict[str, Any]:
    import sparkio
    from sparkio.session import local_session

    spark = local_session("ranges-bench", cores=2)
    try:
        before = _served(urls)
        t0 = time.monotonic()
        got = sparkio.read_rdd(spark.sparkContext, urls, TOPIC)
        count, nbytes = got.rdd.map(lambda r: (1, len(r.value or b""))).reduce(lambda a, b: (a[0] + b[0], a[1] + b[1]))
        seconds = time.monotonic() - t0
        assert count == hw, (count, hw)
        shares = _shares(before, _served(urls), names)
        return {"seconds": round(seconds, 2), "splits": len(got.ranges), "records": count, "record_bytes": nbytes,
                "served_share": shares, "served_share_max": max(shares.values()),
                "brokers_serving": sum(1 for v in shares.values() if v > 0)}
    finally:
        spark.stop()


def markdown(r: dict[str, Any]) -> str:
    mib = 1 << 20
    lines = [f"{r['brokers']} brokers, one partition (replication factor 3, {r['segment_bytes'] // 1024} KiB "
             f"segments, a local tail of two segments): {r['records']} records of {r['record_bytes']} bytes, "
             f"{r['ranges']} ranges ({r['range_bytes'] / mib:.1f} MiB); filled in {r['fill_s']} s, every range on "
             f"three holders and the replicas trimmed {r['settle_s']} s later.", "",
             "| broker | disk used (MiB) | / mean | fetch loop: share of bytes served | Spark: share of bytes served |",
             "|---|---|---|---|---|"]
    mean = sum(r["disk_bytes"].values()) / len(r["disk_bytes"])
    for name, d in sorted(r["disk_bytes"].items()):
        loop = r["fetch_loop"]["served_share"].get(name, 0)
        spark = r.get("spark", {}).get("served_share", {}).get(name)
        lines.append(f"| {name} | {d / mib:.1f} | {d / mean:.2f} | {loop:.1%} | "
                     + (f"{spark:.1%}" if spark is not None else "—") + " |")
    lines += ["", "| replica | local log starts at | local log (MiB) | offsets kept locally |", "|---|---|---|---|"]
    for name, rep in sorted(r["replicas"].items()):
        lines.append(f"| {name} | {rep['local_start_offset']} | {rep['local_bytes'] / mib:.1f} | "
                     f"{rep['local_share_of_offsets']:.1%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ring.bench.ranges", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", type=int, default=6)
    p.add_argument("--ranges", type=int, default=40, help="ranges the partition must hold at least")
    p.add_argument("--segment-bytes", type=int, default=1 << 20)
    p.add_argument("--no-spark", action="store_true", help="the fetch loop only")
    p.add_argument("--output", type=Path, default=None, help="write the JSON result here")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ring-ranges-bench-"))
    try:
        result = measure(root, args.brokers, args.ranges, args.segment_bytes, not args.no_spark)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["command"] = "python -m ring.bench.ranges " + " ".join(argv if argv is not None else sys.argv[1:])
    result["load_avg"] = os.getloadavg()[0]
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print()
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
