"""`make demo`: start a local broker, produce a clickstream, read it back.

Everything goes through the public HTTP API exactly as curl would use it:
JSON arrays of events keyed by user, then JSON fetches of every partition from
offset 0 to the high watermark. The broker runs as a real process and is
stopped at the end, whatever happens.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from ring import clickstream
from ring.localcluster import LocalBroker, free_port

EVENTS = 5_000
TOPIC = "clicks"
PARTITIONS = 6
BATCH = 250  # events per produce request, all with the same key (user)


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


async def _produce(session: aiohttp.ClientSession, url: str, events: list[dict]) -> int:
    by_user: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        by_user[e["user"]].append(e)
    sent = 0
    tty = sys.stdout.isatty()
    for user, evs in by_user.items():
        for i in range(0, len(evs), BATCH):
            chunk = evs[i : i + BATCH]
            async with session.post(
                f"{url}/v1/topics/{TOPIC}/messages", params={"key": user}, json=chunk
            ) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"produce failed: {r.status} {body}")
            sent += len(chunk)
            if tty:
                print("\r  producing " + _bar(sent, len(events)), end="", flush=True)
    if tty:
        print()
    return sent


async def _read_all(session: aiohttp.ClientSession, url: str) -> list[dict]:
    records = []
    for p in range(PARTITIONS):
        offset = 0
        while True:
            async with session.get(
                f"{url}/v1/topics/{TOPIC}/partitions/{p}/messages",
                params={"offset": offset, "max_records": 2000},
            ) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"fetch failed: {r.status} {body}")
            records.extend(body["records"])
            offset = body["next_offset"]
            if offset >= body["high_watermark"]:
                break
    return records


async def _run(url: str) -> None:
    events = list(clickstream.events(EVENTS))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/topics", json={"name": TOPIC, "partitions": PARTITIONS}) as r:
            if r.status not in (200, 201):
                raise RuntimeError(f"create topic failed: {r.status} {await r.text()}")
        t0 = time.perf_counter()
        sent = await _produce(session, url, events)
        t1 = time.perf_counter()
        records = await _read_all(session, url)
        t2 = time.perf_counter()
        async with session.get(f"{url}/v1/topics/{TOPIC}") as r:
            topic = await r.json()

    values = [r["value"] for r in records]
    assert sorted(v["ts"] for v in values) == sorted(e["ts"] for e in events), "read back != produced"
    pages = collections.Counter(v["page"] for v in values)
    sessions = {v["session"] for v in values}
    print(f"\nproduced {sent} events in {t1 - t0:.2f} s, read back {len(records)} in {t2 - t1:.2f} s")
    print(f"{len({v['user'] for v in values})} users, {len(sessions)} sessions, "
          f"{len(values) / len(sessions):.1f} page views per session")
    print("\nrecords per partition:")
    for p in topic["partitions"]:
        print(f"  partition {p['partition']}: offsets {p['earliest_offset']}..{p['high_watermark']}")
    print("\ntop pages:")
    for page, n in pages.most_common(8):
        print(f"  {page:<24} {n:>6}")


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="ring-demo-"))
    broker = LocalBroker("ring-0", root / "ring-0", free_port(), args=["--fsync", "interval:200"])
    print(f"starting broker ring-0 on {broker.url} (data in {root})")
    try:
        broker.start()
        asyncio.run(_run(broker.url))
    finally:
        code = broker.stop()
        print(f"\nbroker stopped (exit code {code})")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
