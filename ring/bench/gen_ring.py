"""ring's load-generator driver: stored batches straight to partition leaders.

What the Python client does on its hot path, without its accumulator: records
are encoded once into stored batches (``application/vnd.ring.batch``, built
with ``ring.log.batch.encode``; values as opaque bytes, as the peers get them,
not flagged JSON, which the broker would parse to validate), keyed records
grouped by the partition their
key hashes to, and each request goes to the leader of its partition, learned
from ``GET /v1/topics/{t}`` (partitions[].leader) and ``GET /v1/cluster``
(brokers[].client_url). Consume reads every partition from offset 0 as stored
batches and decodes each record, as a consumer would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import aiohttp
import orjson

from ring.bench import http1
from ring.bench.records import with_seq
from ring.hashing.jump import partition_for_key
from ring.log import batch as batchfmt

CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
CT_POLL_BATCHES = "application/vnd.ring.poll-batches"
POOL_REQUESTS = 64  # pre-encoded request bodies per partition, reused in rotation
LEADERS_WAIT_S = 30.0
FETCH_BYTES = 4 << 20
LONG_POLL_MS = 500
GROUP_POLL_RECORDS = 10_000  # the broker's FETCH_RECORDS_MAX


class RingDriver:
    def __init__(self, spec: dict[str, Any], records: list[tuple[bytes, bytes]]) -> None:
        self.spec = spec
        self.records = records
        self.urls: list[str] = spec["target"]["urls"]
        self.topic: str = spec["topic"]
        self.partitions: int = spec["target"].get("partitions", 3)
        self.rf: int = spec["target"].get("replication_factor", 3)
        self.consistency: str = spec.get("consistency", "quorum")
        self.leader_url: list[str] = []
        self.session: aiohttp.ClientSession | None = None
        self._e2e_tasks: list[asyncio.Task] = []
        self._stop = asyncio.Event()
        self._pools: list[http1.Pool] = []

    async def _json(self, method: str, url: str, **kw: Any) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.request(method, url, **kw) as r:
            body = await r.read()
            return r.status, (orjson.loads(body) if body else None)

    async def open(self) -> None:
        window = self.spec.get("window", 1)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=window + 16),
            timeout=aiohttp.ClientTimeout(total=60))
        status, doc = await self._json("POST", f"{self.urls[0]}/v1/topics", json={
            "name": self.topic, "partitions": self.partitions, "replication_factor": self.rf})
        if status not in (201, 409):
            raise RuntimeError(f"create topic: {status} {doc}")
        await self._learn_leaders()

    async def _learn_leaders(self) -> None:
        """Wait until every partition has a leader with a client URL (the
        catalogue reaches the other brokers by gossip)."""
        deadline = time.monotonic() + LEADERS_WAIT_S
        last: Any = None
        while time.monotonic() < deadline:
            _, cluster = await self._json("GET", f"{self.urls[0]}/v1/cluster")
            url_of = {b["name"]: b["client_url"] for b in cluster["brokers"]}
            status, doc = await self._json("GET", f"{self.urls[0]}/v1/topics/{self.topic}")
            last = doc
            if status == 200:
                leaders = [p.get("leader") for p in sorted(doc["partitions"], key=lambda p: p["partition"])]
                if all(leader in url_of for leader in leaders):
                    self.leader_url = [url_of[leader] for leader in leaders]
                    return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"partitions of {self.topic} have no reachable leaders: {last}")

    def _bodies(self, per_request: int, keyed: bool) -> list[list[bytes]]:
        """Per partition, POOL_REQUESTS stored batches of ``per_request`` records."""
        now_ms = int(time.time() * 1000)
        by_part: list[list[tuple[bytes | None, bytes]]] = [[] for _ in range(self.partitions)]
        for i, (key, value) in enumerate(self.records):
            if keyed:
                by_part[partition_for_key(key, self.partitions)].append((key, value))
            else:
                by_part[i % self.partitions].append((None, value))
        out = []
        for recs in by_part:
            bodies = []
            for j in range(POOL_REQUESTS):
                chunk = [recs[(j * per_request + k) % len(recs)] for k in range(per_request)]
                bodies.append(bytes(batchfmt.encode([(None, k, v, None) for k, v in chunk], now_ms=now_ms)))
            out.append(bodies)
        return out

    def sender(self, per_request: int, keyed: bool, seq_stamp: bool = False) -> Callable[[int], Any]:
        """Each request is pre-built (head and body, one write) and sent on a
        keep-alive connection of the lean client (``ring.bench.http1``)."""
        pools = [http1.Pool(u) for u in self.leader_url]
        self._pools.extend(pools)
        parts = self.partitions
        paths = [f"/v1/topics/{self.topic}/messages?partition={p}&consistency={self.consistency}"
                 for p in range(parts)]
        records = self.records

        def request(p: int, body: bytes) -> bytes:
            return pools[p].post_head(paths[p], CT_BATCH, len(body)) + body

        pre = None if seq_stamp else [[request(p, b) for b in bodies]
                                      for p, bodies in enumerate(self._bodies(per_request, keyed))]

        async def send(i: int) -> int:
            p = i % parts
            if pre is None:
                value = with_seq(records[i % len(records)][1], i)
                data = request(p, bytes(batchfmt.encode([(None, None, value, None)], now_ms=int(time.time() * 1000))))
            else:
                pool = pre[p]
                data = pool[(i // parts) % len(pool)]
            status, body = await pools[p].request(data)
            if status != 200:
                raise RuntimeError(f"produce {status}: {body[:200]!r}")
            return per_request

        return send

    async def _fetch(self, p: int, offset: int, wait_ms: int) -> tuple[bytes, int]:
        assert self.session is not None
        async with self.session.get(
            f"{self.leader_url[p]}/v1/topics/{self.topic}/partitions/{p}/messages",
            params={"offset": str(offset), "max_bytes": str(FETCH_BYTES), "wait_ms": str(wait_ms)},
            headers={"Accept": CT_BATCHES},
        ) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"fetch {r.status}: {body[:200]!r}")
            return body, int(r.headers["Ring-Next-Offset"])

    async def consume(self, expected: int, seconds_max: float) -> int:
        """Read every partition from offset 0, decoding each record; stops at
        ``expected`` records or ``seconds_max``."""
        deadline = time.perf_counter() + seconds_max
        got = 0

        async def part(p: int) -> None:
            nonlocal got
            offset = 0
            while got < expected and time.perf_counter() < deadline:
                body, nxt = await self._fetch(p, offset, 0)
                for _, pos in batchfmt.scan(body, verify=False):
                    h, recs = batchfmt.decode(body, pos, verify=False)
                    got += sum(1 for r in recs if r.offset >= offset)
                if nxt == offset:
                    return
                offset = nxt

        await asyncio.gather(*(part(p) for p in range(self.partitions)))
        return got

    async def consume_group(self, expected: int, seconds_max: float) -> int:
        """One member of a fresh consumer group polls its coordinator (as ``consume`` reads each
        partition's leader) for stored batches (as ring.client's consumer does), each poll naming the
        previous answer's token, which commits it, until it has ``expected`` records or
        ``seconds_max`` passed; each record decoded, as ``consume`` does."""
        import msgpack

        assert self.session is not None
        group, consumer = f"{self.topic}-g", "bench-consumer"
        base = f"{self.urls[0]}/v1/groups/{group}/members"
        deadline = time.perf_counter() + seconds_max
        got = 0
        generation = None
        token = None
        while got < expected and time.perf_counter() < deadline:
            if generation is None:
                status, doc = await self._json("POST", base, json={
                    "consumer": consumer, "topics": [self.topic], "reset": "earliest"})
                if status != 200:
                    raise RuntimeError(f"join: {status} {doc}")
                generation = doc["generation"]
                base = await self._coordinator_url(group) + f"/v1/groups/{group}/members"
            params = {"max_records": str(GROUP_POLL_RECORDS), "wait_ms": "200", "generation": str(generation)}
            if token is not None:
                params["token"] = token
            async with self.session.post(
                f"{base}/{consumer}/poll", headers={"Accept": CT_POLL_BATCHES}, params=params,
            ) as r:
                body = await r.read()
                if r.status == 409:  # a rebalance: join again
                    generation = None
                    continue
                if r.status != 200:
                    raise RuntimeError(f"poll {r.status}: {body[:200]!r}")
            doc = msgpack.unpackb(body, raw=False)
            for _, _, start, end, data in doc["batches"]:
                got += sum(1 for _ in batchfmt.records_between(data, start, end, GROUP_POLL_RECORDS, verify=False))
            token = doc.get("token")
        await self._json("DELETE", f"{base}/{consumer}")
        return got

    async def _coordinator_url(self, group: str) -> str:
        status, cluster = await self._json("GET", f"{self.urls[0]}/v1/cluster")
        if status == 404:  # a standalone broker: it coordinates every group
            return self.urls[0]
        status, doc = await self._json("GET", f"{self.urls[0]}/v1/groups/{group}")
        url_of = {b["name"]: b["client_url"] for b in cluster["brokers"]}
        if status != 200 or doc.get("coordinator") not in url_of:
            raise RuntimeError(f"group {group}: no coordinator with a client URL: {status} {doc}")
        return url_of[doc["coordinator"]]

    async def e2e_start(self, delivered: Callable[[bytes], None]) -> None:
        """One long-poll loop per partition from its current end."""
        async def part(p: int) -> None:
            _, doc = await self._json("GET", f"{self.leader_url[p]}/v1/topics/{self.topic}")
            offset = doc["partitions"][p]["high_watermark"]
            while not self._stop.is_set():
                body, nxt = await self._fetch(p, offset, LONG_POLL_MS)
                for _, pos in batchfmt.scan(body, verify=False):
                    for r in batchfmt.decode(body, pos, verify=False)[1]:
                        if r.offset >= offset:
                            delivered(r.value)
                offset = nxt

        self._e2e_tasks = [asyncio.get_running_loop().create_task(part(p)) for p in range(self.partitions)]

    async def e2e_stop(self) -> None:
        self._stop.set()
        for t in self._e2e_tasks:
            t.cancel()
        await asyncio.gather(*self._e2e_tasks, return_exceptions=True)

    async def close(self) -> None:
        for pool in self._pools:
            pool.close()
        if self.session is None:
            return
        try:
            if not self.spec.get("keep_topic"):
                await self._json("DELETE", f"{self.urls[0]}/v1/topics/{self.topic}")
        finally:
            await self.session.close()
