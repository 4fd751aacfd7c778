"""`make demo`: a local 3-broker cluster, a clickstream, a Spark job over it.

1. Starts three brokers (``ring-0..2``) as real processes on loopback that
   find each other through seeds, and waits until each sees the others up.
2. Produces a web clickstream (users, sessions, pages; ``ring.clickstream``)
   with the Python client: JSON events keyed by user, sent in stored batches
   straight to each partition's leader, acknowledged at quorum (replication
   factor 3), with a progress bar.
3. Runs the Spark job of ``sparkio.pipeline`` (the same code as
   ``examples/clickstream_job.py``) through the ``ring`` data source: page
   views, sessions, users and top pages per minute. Prints the table and
   writes the aggregates back to the topic ``clicks-per-minute``.
4. Reads one aggregate back from the cluster and stops the brokers, whatever
   happened.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ring import clickstream
from ring.client import AsyncClient
from ring.client.batcher import BufferFull
from ring.commands.progress import Progress
from ring.localcluster import LocalCluster

EVENTS = int(os.environ.get("RING_DEMO_EVENTS", "300000"))
TOPIC = "clicks"
OUT_TOPIC = "clicks-per-minute"
PARTITIONS = 6
ROWS_SHOWN = 12


async def produce(urls: list[str]) -> tuple[int, float]:
    async with AsyncClient(urls, consistency="quorum", linger_ms=10) as client:
        # The events carry their own (past) times: kept forever, retention never takes them.
        await client.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3, exist_ok=True, retention_ms=-1)
        progress = Progress("producing", EVENTS, stream=sys.stdout)
        pending: list[asyncio.Future] = []
        for event in clickstream.events(EVENTS):
            while True:
                try:
                    pending.append(client.produce(TOPIC, key=event["user"], json=event, timestamp=event["ts"]))
                    break
                except BufferFull:
                    await client.drain()
            if len(pending) >= 5_000:
                await asyncio.gather(*pending)
                progress.update(len(pending))
                pending.clear()
        await client.flush()
        await asyncio.gather(*pending)
        progress.update(len(pending))
        return EVENTS, progress.finish()


async def read_back_one(urls: list[str]) -> dict | None:
    async with AsyncClient(urls) as client:
        topic = await client.describe(OUT_TOPIC)
        for p in topic["partitions"]:
            if p["high_watermark"] > p["earliest_offset"]:
                got = await client.fetch(OUT_TOPIC, p["partition"], p["earliest_offset"], max_records=1)
                if got.records:
                    r = got.records[0]
                    return {"partition": p["partition"], "offset": r.offset,
                            "key": r.key.decode() if r.key else None, "value": r.value.decode()[:120]}
    return None


def run_spark(brokers: str):
    from sparkio.pipeline import clickstream_job, format_table
    from sparkio.session import local_session

    print("\nstarting a local Spark session (local[2]) and running the clickstream job ...", flush=True)
    spark = local_session("ring-demo")
    try:
        t0 = time.perf_counter()
        result = clickstream_job(spark, brokers, topic=TOPIC, out_topic=OUT_TOPIC, top_n=3, show=False)
        seconds = time.perf_counter() - t0
    finally:
        spark.stop()
    rows = result.rows
    print(f"\n{result.events:,} page views in {len(rows)} minutes, read by Spark in {seconds:.1f} s "
          f"through the ring data source\n")
    shown = rows if len(rows) <= ROWS_SHOWN else rows[: ROWS_SHOWN // 2] + rows[-ROWS_SHOWN // 2 :]
    table = format_table(shown).splitlines()
    if len(rows) > ROWS_SHOWN:
        table.insert(1 + ROWS_SHOWN // 2, f"{'...':<18} ({len(rows) - ROWS_SHOWN} more minutes)")
    print("\n".join(table))
    print(f"\nwrote {result.written} per-minute aggregates to topic {OUT_TOPIC!r}")
    return result


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="ring-demo-"))
    cluster = LocalCluster(root, 3, args=["--fsync", "interval:200"])
    print(f"starting brokers {', '.join(b.name for b in cluster.brokers)} "
          f"on {', '.join(cluster.urls)} (data in {root})", flush=True)
    try:
        cluster.start()
        print("cluster is up: every broker sees the other two\n", flush=True)
        sent, seconds = asyncio.run(produce(cluster.urls))
        print(f"produced {sent:,} events in {seconds:.1f} s ({sent / seconds:,.0f} events/s, "
              f"quorum of 3 replicas)")
        result = run_spark(",".join(cluster.urls))
        assert result.events == sent, f"Spark read {result.events} events, {sent} were produced"
        sample = asyncio.run(read_back_one(cluster.urls))
        if sample:
            print(f"one of them, read back from the cluster: {sample}")
    finally:
        codes = cluster.stop()
        print(f"\ncluster stopped (exit codes {codes})")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
