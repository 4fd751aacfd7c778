"""The load of a chaos run: producers of unique values, one key each, and consumers that read everything.

Each producer owns one key (chosen so the producers cover every partition)
and sends one record per request, one request at a time, to a broker picked
at random (so most requests are forwarded to the leader), at the run's
consistency level, at most ``rate_per_producer_hz`` a second. Every value
is unique (``<run>-<producer>-<n>``) and every attempt is a ``Write`` in the
history with what the client could tell of its outcome: 200 is ``ok`` with
the partition and offset; 503 and other 4xx mean nothing was written
(``fail``), and so does a refused connection; 504, another 5xx, a timeout or
a connection lost after sending are ``unknown``. Without idempotent
producers a retry of an unknown outcome could write twice, so nothing is
retried. When the broker's OpenAPI document lists ``producer_id`` and
``sequence`` on produce, they are sent, and a write that was not
acknowledged is retried with the same value and sequence (at most
``RETRIES_MAX`` more times, not after a 4xx), each retry through a broker
this write has not tried yet while there is one, and an attempt not
answered within ``ATTEMPT_ANSWER_TIMEOUT_S`` is given up (a stopped broker answers
nothing, nor refuses); a write whose outcome stays
unknown retires its producer id (``Session``).

Consumers split the partitions between them and read each from a random
broker, long-polling from the next offset; every record they get is a
``Read``. Every loop is bounded by a deadline and a count.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import aiohttp
import orjson

from ring import limits
from ring.errors import RingError
from ring.hashing import partition_for_key
from tests.chaos.cluster import CT_BATCHES, READ_BYTES_MAX, ChaosCluster, decode_batches
from tests.chaos.history import CONSUMER, FAIL, OK, UNKNOWN, History, Read, Write

# A produce can wait for replication acks, then for a forward's timeout: past that the outcome is unknown.
PRODUCE_TIMEOUT_S = limits.PEER_REQUEST_TIMEOUT_S + 2.0
# An idempotent producer gives up an attempt on a broker that has sent no answer this long after the
# request and retries the same value and sequence through another broker: a stopped broker (SIGSTOP)
# keeps its connections open, so it neither answers nor refuses. Short enough that a write whose
# forward came back 504 when the followers lost its leader (2-4 s after the stop), then met the stopped
# broker, is acknowledged through the third broker within 8 s; a live broker cut off this early only
# costs a retry, which the leader recognises.
ATTEMPT_ANSWER_TIMEOUT_S = 3.0
FETCH_WAIT_MS = 300
FETCH_TIMEOUT_S = 3.0
END_GRACE_S = 2.0  # at the end of the run, requests still waiting get this long, then are abandoned
BACKOFF_S = 0.1  # after a refusal, so a producer does not spin on instant 503s
RETRIES_MAX = 3  # idempotent producers only: further attempts of one value
NOT_SENT = "not sent"  # the connection failed before the request left: nothing was written
KEYS_SEARCH_MAX = 100_000


@dataclass
class Load:
    topic: str
    partitions: int
    consistency: str
    duration_s: float
    producers: int = 9
    consumers: int = 2
    rate_per_producer_hz: float = 25.0
    writes_per_producer_max: int = 50_000
    run_tag: str = "r"
    backlog_readers: int = 0  # readers going over whole partitions from offset 0 again and again


def keys_for(producers: int, partitions: int) -> list[str]:
    """A key per producer, producer i's key landing on partition i % partitions."""
    keys: list[str] = []
    for n in range(KEYS_SEARCH_MAX):
        if len(keys) == producers:
            break
        key = f"key-{n}"
        if partition_for_key(key.encode(), partitions) == len(keys) % partitions:
            keys.append(key)
    assert len(keys) == producers, "no key found for some partition"
    return keys


@dataclass
class Session:
    """An idempotent producer's id and next sequence. After an unknown outcome the producer gives up on
    that value and starts a new id: reusing its sequence for another value would be answered as a
    duplicate of whatever was written under it."""

    producer_id: int
    seq: int = 0

    def after(self, outcome: str, ids: Iterator[int]) -> None:
        if outcome == OK:
            self.seq += 1
        elif outcome == UNKNOWN:
            self.producer_id, self.seq = next(ids), 0


def classify(status: int | None) -> str:
    """Outcome of a produce answered with ``status`` (None: no answer after sending)."""
    if status == 200:
        return OK
    if status is not None and (status == 503 or 400 <= status < 500):
        return FAIL
    return UNKNOWN


class Workload:
    def __init__(self, cluster: ChaosCluster, load: Load, history: History, rng: random.Random,
                 now: Callable[[], float], idempotent: bool = False) -> None:
        self.cluster, self.load, self.history, self.rng, self.now = cluster, load, history, rng, now
        self.idempotent = idempotent
        self.keys = keys_for(load.producers, load.partitions)
        self._ids = itertools.count(1)  # idempotent producer ids, fresh per cluster
        self.stop = asyncio.Event()
        self.session: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        """Produce and consume until ``stop`` is set or the duration is over."""
        deadline = time.monotonic() + self.load.duration_s
        connector = aiohttp.TCPConnector(limit=self.load.producers + self.load.consumers + 4)
        async with aiohttp.ClientSession(connector=connector) as self.session:
            tasks = [asyncio.create_task(self._producer(i, deadline)) for i in range(self.load.producers)]
            tasks += [asyncio.create_task(self._consumer(j, deadline)) for j in range(self.load.consumers)]
            tasks += [asyncio.create_task(self._backlog(j, deadline)) for j in range(self.load.backlog_readers)]
            await asyncio.gather(*tasks)

    async def probe(self, timeout_s: float) -> float | None:
        """After healing: one write to every partition (under the producers' keys, as producers
        1000 + p), retried until each is acknowledged. Seconds until all were; None if not in time."""
        began = time.monotonic()
        keys = keys_for(self.load.partitions, self.load.partitions)
        pending = list(range(self.load.partitions))
        ids = {p: Session(next(self._ids)) for p in pending}
        async with aiohttp.ClientSession() as self.session:
            for n in range(10_000):
                if not pending or time.monotonic() - began > timeout_s:
                    break
                p = pending[0]
                w = await self._write(1000 + p, keys[p], f"{self.load.run_tag}-probe-{p}-{n}", ids[p])
                self.history.writes.append(w)
                ids[p].after(w.outcome, self._ids)
                if w.outcome == OK:
                    pending.pop(0)
                else:
                    await asyncio.sleep(BACKOFF_S)
        return None if pending else round(time.monotonic() - began, 1)

    def _target(self, tried: frozenset[int] = frozenset(), silent: frozenset[int] = frozenset()) -> int:
        """A random member: one not in ``tried`` while there is one, then one not in ``silent`` (as
        ``ring.client`` passes over a broker that just refused it or sent no answer in time)."""
        for pool in ([i for i in self.cluster.members if i not in tried],
                     [i for i in self.cluster.members if i not in silent]):
            if pool:
                return self.rng.choice(pool)
        return self.rng.choice(self.cluster.members)

    async def _producer(self, i: int, deadline: float) -> None:
        key, gap = self.keys[i], 1.0 / self.load.rate_per_producer_hz
        session = Session(next(self._ids))
        for n in range(self.load.writes_per_producer_max):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            began = time.monotonic()
            value = f"{self.load.run_tag}-{i}-{n}"
            write = await self._write_until(deadline + END_GRACE_S, i, key, value, session)
            self.history.writes.append(write)
            session.after(write.outcome, self._ids)
            pause = gap - (time.monotonic() - began)
            if write.outcome != OK:
                pause = max(pause, BACKOFF_S)
            if pause > 0:
                await asyncio.sleep(pause)

    async def _write_until(self, give_up: float, producer: int, key: str, value: str, session: Session) -> Write:
        """``_write``, abandoned (outcome unknown) if it has not finished by ``give_up`` (monotonic)."""
        start = self.now()
        task = asyncio.create_task(self._write(producer, key, value, session))
        done, _ = await asyncio.wait({task}, timeout=max(0.0, give_up - time.monotonic()))
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Write(value, key, producer, session.seq, start, self.now(), UNKNOWN,
                     error="abandoned: the run ended")

    async def _write(self, producer: int, key: str, value: str, session: Session) -> Write:
        """One logical write: a single attempt, or with idempotent producers attempts of the same value and
        sequence until one is acknowledged, a 4xx refuses it, or the attempts run out. Its outcome is
        unknown if any attempt's was and none succeeded."""
        assert self.session is not None
        params = {"key": key, "consistency": self.load.consistency}
        if self.idempotent:
            params |= {"producer_id": str(session.producer_id), "sequence": str(session.seq)}
        body, start = orjson.dumps([value]), self.now()
        unknown, status, error, name, tried, silent = False, None, "", "", frozenset[int](), frozenset[int]()
        answer_s = ATTEMPT_ANSWER_TIMEOUT_S if self.idempotent else None
        for _ in range(1 + (RETRIES_MAX if self.idempotent else 0)):
            target = self._target(tried, silent)
            tried |= {target}
            name = self.cluster.brokers[target].name
            status, doc, error = await self._attempt(target, body, params, answer_s)
            silent |= {target} if status is None else frozenset()
            outcome = FAIL if error == NOT_SENT else classify(status)
            if outcome == OK:
                assert isinstance(doc, dict) and doc.get("count") == 1, doc
                return Write(value, key, producer, session.seq, start, self.now(), OK, doc["partition"],
                             doc["base_offset"], name, status)
            unknown = unknown or outcome == UNKNOWN
            if self.stop.is_set() or (status is not None and 400 <= status < 500):
                break
            await asyncio.sleep(BACKOFF_S)
        return Write(value, key, producer, session.seq, start, self.now(), UNKNOWN if unknown else FAIL,
                     broker=name, status=status, error=error)

    async def _attempt(self, target: int, body: bytes, params: dict[str, str],
                       answer_s: float | None) -> tuple[int | None, object, str]:
        """(status, answer, error) of one produce request; error NOT_SENT when the request never left."""
        assert self.session is not None
        url = f"{self.cluster.url(target)}/v1/topics/{self.load.topic}/messages"
        try:
            async with self.session.post(url, data=body, params=params, headers={"Content-Type": "application/json"},
                                         timeout=aiohttp.ClientTimeout(total=PRODUCE_TIMEOUT_S, connect=3,
                                                                       sock_read=answer_s)) as r:
                status, raw = r.status, await r.read()
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            return None, None, NOT_SENT
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return None, None, exc.__class__.__name__
        try:
            doc = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return status, None, "not JSON"
        return status, doc, str(doc.get("error", "")) if status != 200 and isinstance(doc, dict) else ""

    async def _consumer(self, j: int, deadline: float) -> None:
        mine = [p for p in range(self.load.partitions) if p % self.load.consumers == j]
        if not mine:
            return
        next_offset = {p: 0 for p in mine}
        for n in range(1_000_000):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            p = mine[n % len(mine)]
            got = await self._fetch(p, next_offset[p])
            if got is None:
                self.history.fetches_failed += 1
                await asyncio.sleep(BACKOFF_S)
                continue
            self.history.fetches_ok += 1
            next_offset[p] = max(next_offset[p], got)

    async def _backlog(self, j: int, deadline: float) -> None:
        """Read a random partition from offset 0 to where it ends, through a random broker per fetch (the
        oldest offsets are in ranges on other brokers when the topic keeps a local tail); again."""
        for _ in range(1_000_000):
            if self.stop.is_set() or time.monotonic() >= deadline:
                return
            p, offset = self.rng.randrange(self.load.partitions), 0
            for _ in range(100_000):
                if self.stop.is_set() or time.monotonic() >= deadline:
                    return
                got = await self._fetch(p, offset, wait_ms=0)
                if got is None:
                    self.history.fetches_failed += 1
                    await asyncio.sleep(BACKOFF_S)
                    continue
                self.history.fetches_ok += 1
                if got <= offset:
                    break
                offset = got

    async def _fetch(self, p: int, offset: int, wait_ms: int = FETCH_WAIT_MS) -> int | None:
        """One long-poll from a random broker; the next offset, None when it failed."""
        assert self.session is not None
        i = self._target()
        url = f"{self.cluster.url(i)}/v1/topics/{self.load.topic}/partitions/{p}/messages"
        params = {"offset": str(offset), "max_bytes": str(READ_BYTES_MAX), "wait_ms": str(wait_ms)}
        try:
            async with self.session.get(url, params=params, headers={"Accept": CT_BATCHES},
                                        timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S, connect=3)) as r:
                if r.status != 200:
                    await r.read()
                    return None
                body, next_offset = await r.read(), int(r.headers["Ring-Next-Offset"])
        except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
            return None
        try:
            records, _ = decode_batches(body, offset)
        except RingError:
            return None
        at, name = self.now(), self.cluster.brokers[i].name
        self.history.reads += [Read(CONSUMER, name, p, o, v, at, ts) for o, v, ts in records]
        return next_offset


async def broker_takes_producer_ids(cluster: ChaosCluster) -> bool:
    """Whether produce documents ``producer_id`` and ``sequence`` (idempotent producers)."""
    for i in cluster.members:
        doc = await cluster.get_json(i, "/v1/openapi.json")
        if doc:
            op = doc.get("paths", {}).get("/v1/topics/{topic}/messages", {}).get("post", {})
            names = {p.get("name") for p in op.get("parameters", [])}
            return {"producer_id", "sequence"} <= names
    return False
