"""The brokers of a chaos run: real ``ring serve`` processes placed by a ``Network``, and how to read them.

``ChaosCluster`` starts the network's brokers (``ring.localcluster.LocalBroker``,
each behind its network's command prefix, so in its own namespace when there
is one), with the peer port, seeds, cluster secret, fsync policy and
advertised address the network gives; it kills, pauses, resumes and restarts
them by the PID it started, and speaks HTTP to them from the harness's event
loop. ``spare`` brokers are made but not started: they join later (``join``),
and a broker decommissioned leaves ``members`` (the brokers the run reads and
waits for). Reads for the checker come from here: a partition read through one
broker's client API to its high watermark (stored batches, decoded here),
and one replica's own log read on its peer port (``/peer/v1/replicas``) for
comparing replicas after healing. Blocking process calls (start, wait until
ready, stop) run in worker threads so the workload's loop never stalls.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import orjson

from ring.localcluster import LocalBroker
from ring.log import batch as batchfmt
from ring.errors import RingError
from tests.chaos.history import BatchId, Read, ReplicaCopy
from tests.brokers import faketime
from tests.chaos.network import Network

REPO_ROOT = Path(__file__).resolve().parents[2]
CT_BATCHES = "application/vnd.ring.batches"
READ_BYTES_MAX = 1 << 20  # per fetch: a chaos partition holds a few MiB at most
READ_ROUNDS_MAX = 10_000  # per partition read: each round moves forward or stops
HTTP_TIMEOUT_S = 10.0
JOIN_TIMEOUT_S = 60.0  # three cold starts on a busy 2-core machine, plus gossip rounds


def value_text(raw: bytes) -> str:
    """A record value as the workload wrote it (a JSON string); anything else as text, to be reported."""
    try:
        v = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")
    return v if isinstance(v, str) else raw.decode("utf-8", "replace")


def decode_batches(data: bytes, from_offset: int = 0) -> tuple[list[tuple[int, str, int]], list[BatchId]]:
    """(offset, value, timestamp) of every record at or after ``from_offset``, and each batch's identity."""
    records, ids = [], []
    for h, pos in batchfmt.scan(data, verify=True):
        ids.append((h.base_offset, h.leader_epoch, h.crc, h.record_count))
        for rec in batchfmt.decode(data, pos, verify=False)[1]:
            if rec.offset >= from_offset:
                records.append((rec.offset, value_text(rec.value), rec.timestamp))
    return records, ids


def _domain(args: list[str], name: str) -> str:
    flags = dict(zip(args[::2], args[1::2]))
    return flags.get("--zone") or flags.get("--host") or name


class ChaosCluster:
    def __init__(self, root: Path, network: Network, fsync: str, extra_args: tuple[str, ...] = (),
                 spare: int = 0, domain_args: Callable[[int], list[str]] = lambda i: []) -> None:
        """``domain_args``: broker i's ``--host``/``--zone`` flags (its failure domain)."""
        self.root, self.network, self.fsync = Path(root), network, fsync
        self.secret = secrets.token_hex(16)
        places = network.places
        seeds = ",".join(f"{p.reach_host}:{p.peer_port}" for p in places)
        self.brokers: list[LocalBroker] = []
        for i, place in enumerate(places):
            args = ["--peer-listen", f"{place.host}:{place.peer_port}", "--seeds", seeds, "--fsync", fsync,
                    *extra_args, *domain_args(i)]
            if place.advertise:
                args += ["--advertise", place.advertise]
            name = f"ring-{i}"
            self.brokers.append(LocalBroker(
                name, self.root / name, place.client_port, host=place.host, args=args,
                env={"PYTHONPATH": str(REPO_ROOT), "RING_CLUSTER_SECRET": self.secret},
                log_path=self.root / f"{name}.log", prefix=place.prefix))
        # Broker i's failure domain as a fault sees it: its zone, else its host, else itself alone.
        self.domains = [_domain(domain_args(i), b.name) for i, b in enumerate(self.brokers)]
        self.paused: set[int] = set()
        self.session: aiohttp.ClientSession | None = None
        self.members: list[int] = list(range(len(self.brokers) - spare))  # started, and not decommissioned

    # --- processes ------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return len(self.brokers)

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.brokers]

    def index(self, name: str) -> int:
        return self.names.index(name)

    def running(self, i: int) -> bool:
        """Started and not dead (a paused broker runs)."""
        proc = self.brokers[i].proc
        return proc is not None and proc.poll() is None

    def answering(self, i: int) -> bool:
        return self.running(i) and i not in self.paused

    def pids(self) -> dict[int, int]:
        return {b.proc.pid: i for i, b in enumerate(self.brokers) if b.proc is not None and b.proc.poll() is None}

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S, connect=3))
        await self.network.start(self.pids)
        for i in self.members:
            self.brokers[i].start(wait=False)
        for i in self.members:
            await asyncio.to_thread(self.brokers[i].wait_ready, JOIN_TIMEOUT_S)
        await self.wait_all_up(JOIN_TIMEOUT_S)

    async def join(self, i: int) -> None:
        """Start a spare broker: it joins the ring."""
        assert i not in self.members
        await asyncio.to_thread(self.brokers[i].start, True)
        self.members.append(i)

    async def decommission(self, i: int) -> bool:
        """Take broker i off the ring through another member; it stays running (and a member) until
        ``retire``. Whether a broker took the request."""
        name = self.brokers[i].name
        for j in self.members:
            if j == i or not self.answering(j):
                continue
            try:
                status, _, _ = await self.request("POST", f"{self.url(j)}/v1/cluster/brokers/{name}/decommission")
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
            if status == 200:
                return True
        return False

    async def retire(self, i: int) -> None:
        """A decommissioned broker stops, and the run no longer reads through it or waits for it."""
        if i in self.members:
            self.members.remove(i)
        await asyncio.to_thread(self.brokers[i].stop)

    async def restart(self, i: int) -> None:
        b = self.brokers[i]
        b.kill()
        self.paused.discard(i)
        await asyncio.to_thread(b.start, True)

    async def restart_with_clock(self, i: int, offset: str | None) -> None:
        """Stop broker i cleanly and start it again with its wall clock ``offset`` off (libfaketime:
        ``+8d``, ``-60s``), or right (None); returns once it answers."""
        b = self.brokers[i]
        if i in self.paused:
            self.resume(i)
        await asyncio.to_thread(b.stop)
        b.prefix = [*self.network.places[i].prefix, *(faketime(offset) if offset else [])]
        await asyncio.to_thread(b.start, True)

    def kill(self, i: int) -> None:
        self.brokers[i].kill()
        self.paused.discard(i)

    def pause(self, i: int) -> None:
        self.brokers[i].pause()
        self.paused.add(i)

    def resume(self, i: int) -> None:
        if self.running(i):
            self.brokers[i].resume()
        self.paused.discard(i)

    async def close(self) -> None:
        """Stop every broker (SIGTERM, SIGKILL after a grace), the network and the client session."""
        for i in list(self.paused):
            self.resume(i)
        await asyncio.gather(*(asyncio.to_thread(b.stop) for b in self.brokers))
        self.kill_all()
        if self.session is not None:
            await self.session.close()
            self.session = None
        await self.network.close()

    def kill_all(self) -> None:
        """Last resort, safe to call from anywhere: SIGKILL every broker we started, by PID (a stopped
        process dies of it too)."""
        for b in self.brokers:
            b.kill()
        self.paused.clear()

    def partition_dir(self, i: int, topic: str, partition: int) -> Path:
        return self.brokers[i].data_dir / "topics" / topic / str(partition)

    # --- HTTP ------------------------------------------------------------------------------

    def url(self, i: int) -> str:
        return self.brokers[i].url

    def peer_url(self, i: int) -> str:
        place = self.network.places[i]
        return f"http://{place.host}:{place.peer_port}"

    async def request(self, method: str, url: str, timeout_s: float = HTTP_TIMEOUT_S,
                      **kw: Any) -> tuple[int, dict[str, str], bytes]:
        assert self.session is not None
        async with self.session.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout_s), **kw) as r:
            return r.status, dict(r.headers), await r.read()

    async def get_json(self, i: int, path: str, timeout_s: float = 3.0) -> Any | None:
        """The broker's JSON answer, or None when it does not answer 200 in time."""
        try:
            status, _, body = await self.request("GET", self.url(i) + path, timeout_s)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
        return orjson.loads(body) if status == 200 else None

    async def create_topic(self, **settings: Any) -> None:
        status, _, body = await self.request("POST", self.url(0) + "/v1/topics", json=settings)
        if status != 201:
            raise RuntimeError(f"creating the topic failed: {status} {body[:300]!r}")

    async def describe(self, topic: str, i: int) -> list[dict[str, Any]] | None:
        doc = await self.get_json(i, f"/v1/topics/{topic}")
        return doc["partitions"] if doc else None

    async def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> index of its leader, as the first answering broker sees it."""
        for i in self.members:
            if self.answering(i):
                parts = await self.describe(topic, i)
                if parts:
                    return {p["partition"]: self.index(p["leader"]) for p in parts if p["leader"]}
        return {}

    async def offset_for_timestamp(self, i: int, topic: str, partition: int, timestamp_ms: int) -> int | None:
        doc = await self.get_json(i, f"/v1/topics/{topic}/partitions/{partition}/offsets?timestamp={timestamp_ms}")
        return doc["offset"] if doc else None

    async def statuses(self, i: int) -> dict[str, str]:
        doc = await self.get_json(i, "/v1/cluster")
        return {b["name"]: b["status"] for b in doc["brokers"]} if doc else {}

    async def wait_all_up(self, timeout_s: float) -> bool:
        """Until every broker sees every broker up; False when that did not happen in time."""
        deadline = time.monotonic() + timeout_s
        names = {self.brokers[i].name for i in self.members}
        while time.monotonic() < deadline:
            views = [await self.statuses(i) for i in self.members]
            if all(v and all(v.get(n) == "up" for n in names) for v in views):
                return True
            await asyncio.sleep(0.3)
        return False

    # --- reading what the cluster holds ------------------------------------------------------

    async def read_partition(self, i: int, topic: str, partition: int, source: str,
                             at_s: float) -> tuple[list[Read], str]:
        """Every record of a partition through broker i's client API, up to its high watermark; and
        the error that stopped the read early (empty when none)."""
        reads: list[Read] = []
        offset = 0
        url = f"{self.url(i)}/v1/topics/{topic}/partitions/{partition}/messages"
        for _ in range(READ_ROUNDS_MAX):
            try:
                status, headers, body = await self.request(
                    "GET", url, params={"offset": str(offset), "max_bytes": str(READ_BYTES_MAX)},
                    headers={"Accept": CT_BATCHES})
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return reads, f"{exc.__class__.__name__}"
            if status != 200:
                return reads, f"{status} {body[:200].decode('utf-8', 'replace')}"
            try:
                records, _ = decode_batches(body, offset)
            except RingError as exc:
                return reads, f"bad batches: {exc}"
            name = self.brokers[i].name
            reads += [Read(source, name, partition, o, v, at_s, ts) for o, v, ts in records]
            next_offset, hw = int(headers["Ring-Next-Offset"]), int(headers["Ring-High-Watermark"])
            if next_offset >= hw or next_offset <= offset:
                return reads, ""
            offset = next_offset
        return reads, "too many rounds"

    async def replica_copy(self, i: int, topic: str, partition: int, source: str,
                           at_s: float) -> tuple[ReplicaCopy, list[Read]]:
        """Broker i's own stored batches of a partition from its log start (offsets below are in ranges,
        when its topic keeps a local tail) up to its log end (the peer port)."""
        name = self.brokers[i].name
        ids: list[BatchId] = []
        reads: list[Read] = []
        offset, end = None, None
        url = f"{self.peer_url(i)}/peer/v1/replicas/{topic}/{partition}"
        for _ in range(READ_ROUNDS_MAX):
            params = {"max_bytes": str(READ_BYTES_MAX), **({} if offset is None else {"offset": str(offset)})}
            try:
                status, headers, body = await self.request("GET", url, params=params,
                                                           headers={"Ring-Cluster-Secret": self.secret})
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                return ReplicaCopy(name, partition, tuple(ids), end, exc.__class__.__name__), reads
            if status != 200:
                error = f"{status} {body[:200].decode('utf-8', 'replace')}"
                return ReplicaCopy(name, partition, tuple(ids), end, error), reads
            end = int(headers["Ring-Log-End-Offset"])
            start = int(headers["Ring-Log-Start-Offset"]) if offset is None else offset
            try:
                records, batch_ids = decode_batches(body, start)
            except RingError as exc:
                return ReplicaCopy(name, partition, tuple(ids), end, f"bad batches: {exc}"), reads
            ids += [b for b in batch_ids if b[0] + b[3] > start]
            reads += [Read(source, name, partition, o, v, at_s, ts) for o, v, ts in records]
            if not batch_ids or ids[-1][0] + ids[-1][3] >= end:
                return ReplicaCopy(name, partition, tuple(ids), end), reads
            offset = ids[-1][0] + ids[-1][3]
        return ReplicaCopy(name, partition, tuple(ids), end, "too many rounds"), reads
