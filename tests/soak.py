"""A soak: a real 3-broker cluster with client tokens under normal load while hostile clients run.

For ``seconds``, healthy producers append small NDJSON batches at quorum and
healthy consumers long-poll every partition, through random brokers, while
on the same brokers a fuzzer sends random garbage requests (bytes that are
not HTTP, mangled request lines, random routes, parameters, headers, tokens
and bodies), slowloris clients dribble header lines, slow clients dribble
bodies, fetchers ask for megabytes and never read, idle connections sit, and
long-polls wait. Then it checks, and ``Figures`` reports: every acknowledged
record is on every replica at its offset; the healthy clients' success rate;
how many fuzzed requests got a 5xx; each broker's resident memory (VmRSS
from /proc) before, at its peak and after.

``tests/test_soak.py`` runs a short one in ``make test``; by hand:
``python -m tests.soak --seconds 300`` prints the figures. Every loop is
bounded by the deadline, every connection count is fixed, only loopback is
spoken to, and the brokers are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

TOPIC = "orders-soak"  # the grants of tests.secure_cluster.GRANTS["both"] cover orders*
IDLE_TOPIC = "orders-idle"  # never written: long-polls on it wait out their time
PARTITIONS = 4

# Attackers per run, spread over the three brokers. Each is one connection at a time.
SLOWLORIS = 60
SLOW_BODIES = 20
NEVER_READING = 20
IDLE = 300
LONG_POLLS = 150
FUZZERS = 3
PRODUCERS = 2


@dataclass
class Figures:
    seconds: float
    fuzz_requests: int = 0
    fuzz_statuses: dict[str, int] = field(default_factory=dict)
    fuzz_5xx: int = 0
    fuzz_500: int = 0
    fuzz_no_answer: int = 0
    slow_clients_cut: int = 0
    healthy_requests: int = 0
    healthy_ok: int = 0
    healthy_statuses: dict[str, int] = field(default_factory=dict)
    produce_latency_ms_p50: float = 0.0
    produce_latency_ms_p99: float = 0.0
    records_acked: int = 0
    records_lost: int = 0
    records_read_by_consumers: int = 0
    rss_mib_before: list[float] = field(default_factory=list)
    rss_mib_peak: list[float] = field(default_factory=list)
    rss_mib_after: list[float] = field(default_factory=list)
    long_polls_answered: Counter = field(default_factory=Counter)

    @property
    def healthy_success_rate(self) -> float:
        return self.healthy_ok / self.healthy_requests if self.healthy_requests else 0.0

    def report(self) -> str:
        doc = asdict(self)
        doc["healthy_success_rate"] = round(self.healthy_success_rate, 5)
        doc["long_polls_answered"] = dict(self.long_polls_answered)
        return json.dumps(doc, indent=2, sort_keys=True)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    def __init__(self, cluster: Any, tokens: dict[str, str], seconds: float, seed: int = 1) -> None:
        self.cluster = cluster
        self.tokens = tokens
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.ports = [b.port for b in cluster.local.brokers]
        self.pids = [b.proc.pid for b in cluster.local.brokers]
        self.figures = Figures(seconds)
        self.acked: list[tuple[int, int, list[bytes]]] = []  # (partition, base offset, values)
        self.latencies_ms: list[float] = []
        self.deadline = 0.0

    def url(self) -> str:
        return f"http://127.0.0.1:{self.rng.choice(self.ports)}"

    def live(self) -> bool:
        return time.monotonic() < self.deadline

    # --- healthy clients -------------------------------------------------------------------------

    def _count(self, status: int | str) -> None:
        f = self.figures
        f.healthy_requests += 1
        f.healthy_statuses[str(status)] = f.healthy_statuses.get(str(status), 0) + 1
        if isinstance(status, int) and status < 300:
            f.healthy_ok += 1

    async def producer(self, session: aiohttp.ClientSession, wid: int) -> None:
        seq = 0
        while self.live():
            p = seq % PARTITIONS
            values = [orjson.dumps({"w": wid, "n": seq, "i": i, "pad": "x" * 200}) for i in range(10)]
            t0 = time.monotonic()
            try:
                async with session.post(f"{self.url()}/v1/topics/{TOPIC}/messages",
                                        params={"partition": str(p), "consistency": "quorum"},
                                        data=b"\n".join(values),
                                        headers={"Content-Type": "application/x-ndjson"}) as r:
                    body = await r.read()
                    self._count(r.status)
                    if r.status == 200:
                        self.latencies_ms.append((time.monotonic() - t0) * 1000)
                        self.acked.append((p, orjson.loads(body)["base_offset"], values))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self._count(type(exc).__name__)
            seq += 1
            await asyncio.sleep(0.02)

    async def consumer(self, session: aiohttp.ClientSession, p: int) -> None:
        offset = 0
        url = self.url()  # one replica: another may not have reached an offset this one served
        while self.live():
            try:
                async with session.get(f"{url}/v1/topics/{TOPIC}/partitions/{p}/messages",
                                       params={"offset": str(offset), "wait_ms": "1000"}) as r:
                    body = await r.read()
                    self._count(r.status)
                    if r.status == 200:
                        got = orjson.loads(body)["records"]
                        self.figures.records_read_by_consumers += len(got)
                        offset = int(r.headers["Ring-Next-Offset"])
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self._count(type(exc).__name__)

    # --- hostile clients ------------------------------------------------------------------------

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.rng.choice(self.ports))

    async def _hold_until_cut(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              drip: bytes | None, every_s: float) -> None:
        """Send ``drip`` every ``every_s`` until the broker closes the connection or time is up."""
        while self.live():
            try:
                if drip:
                    writer.write(drip)
                    await writer.drain()
                data = await asyncio.wait_for(reader.read(4096), min(every_s, max(0.01, self.deadline - time.monotonic())))
                if not data:
                    self.figures.slow_clients_cut += 1
                    return
            except asyncio.TimeoutError:
                continue
            except OSError:
                self.figures.slow_clients_cut += 1
                return

    async def attacker(self, kind: str) -> None:
        await asyncio.sleep(self.rng.random())  # spread the connects
        while self.live():
            writer = None
            try:
                reader, writer = await self._open()
                if kind == "slowloris":
                    writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n")
                    await self._hold_until_cut(reader, writer, b"X-Slow: 1\r\n", 1.0)
                elif kind == "slow-body":
                    writer.write(f"POST /v1/topics/{TOPIC}/messages HTTP/1.1\r\nHost: x\r\n"
                                 f"Authorization: Bearer {self.tokens['both']}\r\n"
                                 "Content-Type: application/x-ndjson\r\nContent-Length: 100000\r\n\r\n".encode())
                    await self._hold_until_cut(reader, writer, b"1\n", 1.0)
                elif kind == "never-reading":
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    writer.write(f"GET /v1/topics/{TOPIC}/partitions/0/messages?offset=0&max_bytes=16777216 "
                                 f"HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.tokens['both']}\r\n"
                                 "Accept: application/vnd.ring.batches\r\n\r\n".encode())
                    transport = writer.transport
                    transport.pause_reading()
                    while self.live() and not transport.is_closing():
                        await asyncio.sleep(0.5)
                elif kind == "idle":
                    await self._hold_until_cut(reader, writer, None, 1.0)
                elif kind == "long-poll":
                    writer.write(f"GET /v1/topics/{IDLE_TOPIC}/partitions/0/messages?offset=0&wait_ms=30000 "
                                 f"HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.tokens['both']}\r\n\r\n".encode())
                    line = await asyncio.wait_for(reader.readline(), max(0.1, self.deadline - time.monotonic()))
                    self.figures.long_polls_answered[line[9:12].decode(errors="replace") or "closed"] += 1
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
                await asyncio.sleep(0.1)
            finally:
                if writer is not None:
                    writer.transport.abort()

    # --- the fuzzer -----------------------------------------------------------------------------

    def _junk(self, n: int) -> str:
        """Mostly characters a URL or header may hold; now and then ones that break the request."""
        alphabet = "abcXYZ019-_.~*:@!$'()+,"
        if self.rng.random() < 0.03:
            alphabet += "/?&=# \t\u00e9\u2603\x00\x7f\r\n"
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(0, n)))

    def _fuzz_request(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            return rng.randbytes(rng.randint(1, 2000))  # not HTTP at all
        # Not IDLE_TOPIC: a record there would answer the long-polls at once and make them spin.
        topic = rng.choice([TOPIC, "orders-fuzz", "nope", self._junk(20), "x" * 300, "..", "%2e%2e"])
        paths = [f"/v1/topics/{topic}/messages", f"/v1/topics/{topic}/partitions/{rng.randint(-2, 9)}/messages",
                 f"/v1/topics/{topic}", "/v1/topics", f"/v1/topics/{topic}/partitions/0/offsets",
                 f"/v1/groups/{self._junk(10)}/members", f"/v1/groups/g/members/{self._junk(8)}/poll",
                 "/v1/groups", "/v1/cluster", "/metrics", "/v1/consumer/poll", f"/v1/topic/{topic}/messages",
                 f"/admin/brokers/{self._junk(6)}/topics/{topic}", "/admin/" + self._junk(10), "/" + self._junk(30)]
        path = rng.choice(paths)
        params = "&".join(f"{rng.choice(['offset', 'partition', 'wait_ms', 'max_bytes', 'max_records', 'key', 'consistency', 'producer_id', 'sequence', 'timestamp', self._junk(5)])}={self._junk(12)}"
                          for _ in range(rng.randint(0, 4)))
        target = path + ("?" + params if params else "")
        method = rng.choice(["GET"] * 4 + ["POST"] * 4 + ["PUT", "DELETE", "PATCH", "HEAD", "OPTIONS",
                                                          self._junk(6) or "X"])
        version = rng.choice(["HTTP/1.1"] * 30 + ["HTTP/1.0", "HTTP/2.0", "HTTP/9", ""])
        headers = [("Host", "x")]
        auth = rng.random()
        if auth < 0.5:  # a client's token, not an administrator's: the fuzzer must not delete the topic under test
            headers.append(("Authorization", f"Bearer {self.tokens[rng.choice(['both', 'producer', 'consumer'])]}"))
        elif auth < 0.7:
            headers.append(("Authorization", rng.choice(["Bearer ", "Basic abc", f"Bearer {self._junk(40)}"])))
        if rng.random() < 0.1:
            headers.append(("Ring-Principal", rng.choice(['{"name":"admin","all":true,"grants":[]}', self._junk(50)])))
        if rng.random() < 0.1:
            headers.append(("Ring-Cluster-Secret", self._junk(20)))
        ctype = rng.choice(["application/json", "application/x-ndjson", "application/msgpack",
                            "application/vnd.ring.batch", "text/plain", self._junk(15)])
        headers.append(("Content-Type", ctype))
        body_kind = rng.random()
        if body_kind < 0.3:
            body = b""
        elif body_kind < 0.6:
            body = self._junk(300).encode("utf-8", "surrogatepass")
        elif body_kind < 0.8:
            body = json.dumps(rng.choice([{"name": topic}, [1, {"a": [None] * 5}], {"consumer": "c", "topics": [topic]},
                                          {"before_offset": -1}, "x" * 100, {"value": {"deep": [[[[1]]]]}}])).encode()
        else:
            body = rng.randbytes(rng.randint(0, 3000))
        length = rng.random()
        if length < 0.85:
            headers.append(("Content-Length", str(len(body))))
        elif length < 0.9:
            headers.append(("Content-Length", rng.choice(["-1", "abc", "99999999999999999999", str(len(body) + 5)])))
        else:
            headers.append(("Transfer-Encoding", rng.choice(["chunked", "gzip", self._junk(5)])))
        for _ in range(rng.randint(0, 3)):
            headers.append((rng.choice(["X-Junk", "Accept", "Accept-Encoding", "Connection", "Expect", "Range",
                                        "Content-Encoding", "Upgrade"]), self._junk(40)))
        head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        return head.encode("utf-8", "surrogatepass") + body

    async def fuzzer(self) -> None:
        f = self.figures
        while self.live():
            raw = self._fuzz_request()
            writer = None
            try:
                reader, writer = await self._open()
                writer.write(raw)  # no half-close: a broker closes on EOF before answering
                line = await asyncio.wait_for(reader.readline(), 15)
                f.fuzz_requests += 1
                status = line[9:12].decode(errors="replace") if line.startswith(b"HTTP/") else "none"
                f.fuzz_statuses[status] = f.fuzz_statuses.get(status, 0) + 1
                if status == "none":
                    f.fuzz_no_answer += 1
                elif status.startswith("5"):
                    f.fuzz_5xx += 1
                    if status == "500":
                        f.fuzz_500 += 1
            except (OSError, asyncio.TimeoutError, ValueError):
                f.fuzz_requests += 1
                f.fuzz_no_answer += 1
            finally:
                if writer is not None:
                    writer.transport.abort()

    # --- the run --------------------------------------------------------------------------------

    async def sample_memory(self) -> None:
        while self.live():
            for i, pid in enumerate(self.pids):
                self.figures.rss_mib_peak[i] = max(self.figures.rss_mib_peak[i], rss_mib(pid))
            await asyncio.sleep(0.5)

    async def run(self) -> Figures:
        f = self.figures
        headers = {"Authorization": f"Bearer {self.tokens['both']}"}
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            # warm up: the healthy load alone for a few seconds, then the baseline memory
            self.deadline = time.monotonic() + 3
            await asyncio.gather(*(self.producer(session, w) for w in range(PRODUCERS)),
                                 *(self.consumer(session, p) for p in range(PARTITIONS)))
            f.rss_mib_before = [round(rss_mib(p), 1) for p in self.pids]
            f.rss_mib_peak = list(f.rss_mib_before)
            f.healthy_requests = f.healthy_ok = 0
            f.healthy_statuses = {}
            self.latencies_ms.clear()
            self.deadline = time.monotonic() + self.seconds
            kinds = (["slowloris"] * SLOWLORIS + ["slow-body"] * SLOW_BODIES + ["never-reading"] * NEVER_READING
                     + ["idle"] * IDLE + ["long-poll"] * LONG_POLLS)
            await asyncio.gather(*(self.producer(session, PRODUCERS + w) for w in range(PRODUCERS)),
                                 *(self.consumer(session, p) for p in range(PARTITIONS)),
                                 *(self.attacker(k) for k in kinds), *(self.fuzzer() for _ in range(FUZZERS)),
                                 self.sample_memory())
        await asyncio.sleep(2)  # let the brokers notice the closed connections
        f.rss_mib_after = [round(rss_mib(p), 1) for p in self.pids]
        f.rss_mib_peak = [round(x, 1) for x in f.rss_mib_peak]
        lat = sorted(self.latencies_ms)
        if lat:
            f.produce_latency_ms_p50 = round(lat[len(lat) // 2], 1)
            f.produce_latency_ms_p99 = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)
        self.check_nothing_lost()
        return f

    def check_nothing_lost(self) -> None:
        """Every acknowledged record, at its offset, on every broker (each serves its own replica)."""
        f = self.figures
        f.records_acked = sum(len(v) for _, _, v in self.acked)
        want: dict[int, dict[int, bytes]] = {p: {} for p in range(PARTITIONS)}
        for p, base, values in self.acked:
            for i, v in enumerate(values):
                want[p][base + i] = v
        lost = 0
        for i in range(len(self.ports)):
            client = self.cluster.client(i, self.tokens["both"])
            for p in range(PARTITIONS):
                have: dict[int, bytes] = {}
                offset, end = 0, max(want[p], default=-1) + 1
                for _ in range(10_000):
                    if offset >= end:
                        break
                    r = client.fetch(TOPIC, p, offset=offset, max_records=10_000)
                    if r.status != 200:
                        break
                    for rec in r.json()["records"]:
                        have[rec["offset"]] = orjson.dumps(rec["value"])
                    nxt = int(r.headers["Ring-Next-Offset"])
                    if nxt <= offset:
                        break
                    offset = nxt
                lost += sum(1 for o, v in want[p].items() if orjson.loads(have.get(o, b"null")) != orjson.loads(v))
        f.records_lost = lost


def start_cluster(root: Path) -> tuple[Any, dict[str, str]]:
    from tests.secure_cluster import SecureCluster, make_tokens

    tokens = make_tokens(root / "tokens.txt")
    cluster = SecureCluster(root / "cluster", 3, tokens_file=root / "tokens.txt", args=["--fsync", "interval:100"])
    cluster.start(admin_token=tokens["admin"])
    admin = cluster.client(0, tokens["admin"])
    for name, parts in ((TOPIC, PARTITIONS), (IDLE_TOPIC, 1)):
        r = admin.post("/v1/topics", json_body={"name": name, "partitions": parts, "replication_factor": 3})
        assert r.status == 201, r.body
    return cluster, tokens


def soak(seconds: float, root: Path, seed: int = 1) -> Figures:
    cluster, tokens = start_cluster(root)
    try:
        return asyncio.run(Soak(cluster, tokens, seconds, seed).run())
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="how long the hostile clients run (default 300)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--root", type=Path, default=None, help="where the brokers' data and logs go (default: a temp dir)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ring-soak-") as tmp:
        root = args.root or Path(tmp)
        t0 = time.monotonic()
        figures = soak(args.seconds, root, args.seed)
        print(figures.report())
        print(f"# {time.monotonic() - t0:.0f} s in all; command: python -m tests.soak --seconds {args.seconds:g} "
              f"--seed {args.seed}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
