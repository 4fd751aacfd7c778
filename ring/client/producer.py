"""The producer's driver: place records on partitions, batch them, send each
partition's batches straight to its leader, retry what is worth retrying.

Placement happens when a record is produced: an explicit partition wins,
then a custom partitioner ``f(key, partitions)``, then the broker's own key
hash (``ring.hashing.partition_for_key``), so a key lands where a broker
would put it. Unkeyed records are sticky: they all go to one partition until
its batch is sent or full (or is due but held back by a request in flight),
then to the next partition round-robin (Kafka's sticky partitioner), which
makes big batches without skewing partitions over time; partitions whose
leader is down or refusing connections are skipped.
Records of a topic the client has not described yet wait, in order, until
its metadata arrives (creating the topic first if the cluster allows it).

A sender task asks the ``Accumulator`` for ready partitions (full batch,
``linger_ms`` waited, or a flush), encodes their batches with
``ring.log.batch.encode`` once, and posts them as
``application/vnd.ring.batch`` to ``{leader}/v1/topics/{t}/messages?
partition=P[&consistency=C]``. Connection refused or broken, 429, 503 and "not
leader" answers refresh the topology and retry after a doubling backoff (to
another broker, which forwards, while the leader refuses connections), at
most ``retries`` times and within the delivery timeout; batches of sticky
unkeyed records move to a partition with a reachable leader instead. A
broken connection may have delivered the request, so a retry can store a
record twice (at-least-once). A 504 says the outcome is unknown and is
raised as ``OutcomeUnknown`` rather than retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Awaitable, Callable

import orjson

from ring import errors, limits
from ring.client.batcher import TP, Accumulator, BufferFull, ProducerBatch, record_size
from ring.client.metadata import Metadata, backoff_ms, quote
from ring.client.records import RecordMetadata
from ring.client.transport import CT_BATCH, RETRY, BrokersUnavailable, BrokerUnreachable, Transport, \
    classify, error_from
from ring.clock import Clock
from ring.hashing import partition_for_key
from ring.log import batch as batchfmt
from ring.log.batch import RecordIn

log = logging.getLogger("ring.client")

Partitioner = Callable[[bytes | None, int], int]
NO_JSON = object()


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise errors.BadRequest(f"{what} must be bytes or str, not {type(value).__name__}")


def make_record(value: Any, key: Any, headers: Any, timestamp: int | None, json: Any,
                now_ms: int) -> tuple[RecordIn, int, bool]:
    """Check one record against the broker's limits; (record, size, value_is_json)."""
    is_json = json is not NO_JSON
    if is_json:
        if value is not None:
            raise errors.BadRequest("give value or json, not both")
        value = orjson.dumps(json)
    elif value is None:
        raise errors.BadRequest("a record needs a value (or json=)")
    value = _as_bytes(value, "value")
    key = None if key is None else _as_bytes(key, "key")
    if key is not None and len(key) > limits.KEY_BYTES_MAX:
        raise errors.PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
    hdrs = None
    if headers:
        if len(headers) > limits.HEADERS_PER_RECORD_MAX:
            raise errors.PayloadTooLarge(f"more than {limits.HEADERS_PER_RECORD_MAX} headers on a record")
        hdrs = {}
        for name, v in headers.items():
            if not isinstance(name, str) or not name or len(name.encode()) > limits.HEADER_NAME_BYTES_MAX:
                raise errors.BadRequest(f"header names must be non-empty strings of at most "
                                        f"{limits.HEADER_NAME_BYTES_MAX} bytes")
            hdrs[name] = None if v is None else _as_bytes(v, f"header {name[:40]!r}")
    if len(value) > limits.MESSAGE_BYTES_MAX:
        raise errors.PayloadTooLarge(f"a record is over the limit of {limits.MESSAGE_BYTES_MAX} bytes")
    if timestamp is None:
        timestamp = now_ms
    elif type(timestamp) is not int or not 0 <= timestamp < 2**62:
        raise errors.BadRequest("timestamp must be an integer of milliseconds since the epoch")
    return (timestamp, key, value, hdrs), record_size(key, value, hdrs), is_json


class Producer:
    def __init__(self, meta: Metadata, transport: Transport, clock: Clock, acc: Accumulator, *,
                 max_in_flight: int, partitioner: Partitioner | None, consistency: str | None, retries: int,
                 retry_backoff_ms: float, codec: int, resolve_topic: Callable[[str], Awaitable[Any]],
                 spawn: Callable[[Awaitable[Any]], asyncio.Task], stats: Counter[str]) -> None:
        self.meta = meta
        self.transport = transport
        self.clock = clock
        self.acc = acc
        self.max_in_flight = max_in_flight
        self.partitioner = partitioner
        self._params_extra = {} if consistency is None else {"consistency": consistency}
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.codec = codec
        self.resolve_topic = resolve_topic
        self.spawn = spawn
        self.stats = stats
        self.requests_to: Counter[tuple[str, str, int]] = Counter()  # (url, topic, partition)
        self._pending: dict[str, list[tuple]] = {}  # records waiting for their topic's metadata
        self._pending_bytes = 0
        self._sticky: dict[str, tuple[int, ProducerBatch | None]] = {}
        self._round_robin: Counter[str] = Counter()
        self._sending: dict[TP, list[ProducerBatch]] = {}
        self._wake = asyncio.Event()
        self._drained: asyncio.Future[None] | None = None

    def now_ms(self) -> float:
        return self.clock.monotonic() * 1000

    @property
    def buffered_bytes(self) -> int:
        return self.acc.buffered_bytes + self._pending_bytes

    # --- records in --------------------------------------------------------------

    def enqueue(self, topic: str, record: RecordIn, size: int, is_json: bool,
                partition: int | None) -> asyncio.Future[RecordMetadata]:
        if self.buffered_bytes + size > self.acc.buffer_bytes and self.buffered_bytes > 0:
            raise BufferFull(f"{self.buffered_bytes} bytes of records wait for acknowledgement "
                             f"(buffer_bytes={self.acc.buffer_bytes}); await drain() and retry")
        fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if topic in self._pending or topic not in self.meta.topology.topics:
            self._pending.setdefault(topic, []).append((record, size, is_json, partition, fut))
            self._pending_bytes += size
            if len(self._pending[topic]) == 1:
                self.spawn(self._resolve(topic))
        else:
            self._place(topic, record, size, is_json, partition, fut)
        return fut

    async def _resolve(self, topic: str) -> None:
        """Learn (or create) a topic, then place the records that waited for it, in order."""
        try:
            await self.resolve_topic(topic)
        except Exception as exc:  # every waiting record learns why; none is left pending
            self.fail_pending(topic, exc)
            return
        for record, size, is_json, partition, fut in self._pending.pop(topic, []):
            self._pending_bytes -= size
            if not fut.done():
                self._place(topic, record, size, is_json, partition, fut)

    def fail_pending(self, topic: str, exc: BaseException) -> None:
        for _, size, _, _, fut in self._pending.pop(topic, []):
            self._pending_bytes -= size
            if not fut.done():
                fut.set_exception(exc)

    def _writable(self, topic: str) -> list[int]:
        """Partitions whose leader is neither reported down nor refusing connections lately."""
        topo = self.meta.topology
        parts = topo.live_leader_partitions(topic)
        ok = [p for p in parts if not self.meta.recently_unreachable(topo.leader_url(topic, p))]
        return ok or parts

    def _sticky_partition(self, topic: str, n: int) -> int:
        current = self._sticky.get(topic)
        if current is not None:
            p, batch = current
            if (p < n and batch is not None and batch is self.acc.open_batch(topic, p)
                    and not self.acc.held_back(topic, p, self.now_ms())):
                return p
        candidates = [p for p in self._writable(topic) if p < n] or list(range(n))
        self._round_robin[topic] += 1
        return candidates[self._round_robin[topic] % len(candidates)]

    def _place(self, topic: str, record: RecordIn, size: int, is_json: bool,
               partition: int | None, fut: asyncio.Future) -> None:
        n = self.meta.topology.topics[topic].partition_count
        movable = False
        try:
            if partition is not None:
                p = partition
            elif self.partitioner is not None:
                p = self.partitioner(record[1], n)
            elif record[1] is not None:
                p = partition_for_key(record[1], n)
            else:
                p, movable = self._sticky_partition(topic, n), True
            if type(p) is not int or not 0 <= p < n:
                raise errors.UnknownPartition(f"topic {topic!r} has partitions 0..{n - 1}, not {p!r}",
                                              topic=topic, partition=p)
            if self.acc.append(topic, p, record, size, fut, is_json, movable, self.now_ms()):
                self._wake.set()
        except Exception as exc:  # a bad partition or a failing custom partitioner: this record only
            fut.set_exception(exc)
            return
        if movable:
            self._sticky[topic] = (p, self.acc.open_batch(topic, p))

    # --- waiting -----------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until at most half of ``buffer_bytes`` waits for acknowledgement."""
        while self.buffered_bytes > self.acc.buffer_bytes // 2:
            if self._drained is None or self._drained.done():
                self._drained = asyncio.get_running_loop().create_future()
            self._wake.set()
            await self._drained

    def _freed(self) -> None:
        d = self._drained
        if d is not None and not d.done() and self.buffered_bytes <= self.acc.buffer_bytes // 2:
            d.set_result(None)

    async def flush(self) -> None:
        waits: list[asyncio.Future] = [f for recs in self._pending.values() for *_, f in recs]
        batches = self.acc.seal_all() + [b for bs in self._sending.values() for b in bs]
        waits += [b.waiters[-1] for b in batches]
        self._wake.set()
        if waits:
            await asyncio.wait(waits)

    def fail_everything(self, exc: BaseException) -> None:
        """Closing: every record not yet acknowledged fails with ``exc``."""
        for b in self.acc.fail_all():
            _fail_waiters(b.waiters, exc)
        for topic in list(self._pending):
            self.fail_pending(topic, exc)
        for batches in self._sending.values():
            for b in batches:
                _fail_waiters(b.waiters, exc)

    # --- the sender --------------------------------------------------------------

    async def run(self) -> None:
        while True:
            self._wake.clear()
            now = self.now_ms()
            room = self.max_in_flight - len(self._sending)
            deadline = None  # when at capacity, a finishing request wakes us
            if room > 0:
                for tp, batches in self.acc.drain(now, room):
                    self._sending[tp] = batches
                    self.spawn(self._send(tp, batches))
                deadline = self.acc.next_deadline_ms(now)
            if self.meta.stale():
                self.meta.refresh_soon(self.spawn)
            if deadline is None:
                await self._wake.wait()
            elif deadline > now:
                try:
                    async with asyncio.timeout((deadline - now) / 1000):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    def _encode(self, batches: list[ProducerBatch]) -> bytes:
        for b in batches:
            if b.encoded is None:
                b.encoded = bytes(batchfmt.encode(b.records, now_ms=self.clock.wall_ms(), codec=self.codec,
                                                  values_are_json=b.values_are_json))
                b.records = []  # the bytes are what a retry resends
        return b"".join(b.encoded for b in batches if b.encoded is not None)

    def _target(self, topic: str, partition: int) -> str:
        """The leader's client URL; another live broker (which forwards) while the
        leader refuses connections or is not known."""
        topo = self.meta.topology
        url = topo.leader_url(topic, partition)
        if url is not None and not (topo.clustered and self.meta.recently_unreachable(url)):
            return url
        others = [u for u in topo.live_broker_urls() if not self.meta.recently_unreachable(u)]
        if others:
            return others[self.stats["reroutes"] % len(others)]
        return url or self.meta.any_urls()[0]

    async def _send(self, tp: TP, batches: list[ProducerBatch]) -> None:
        topic, partition = tp
        try:
            url = self._target(topic, partition)
            body = self._encode(batches)
            self.stats["produce_requests"] += 1
            self.stats["batches"] += len(batches)
            self.requests_to[(url, topic, partition)] += 1
            try:
                reply = await self.transport.request(
                    "POST", url, f"/v1/topics/{quote(topic)}/messages",
                    params={"partition": partition, **self._params_extra},
                    body=body, headers={"Content-Type": CT_BATCH, "Accept": "application/json"})
            except BrokerUnreachable as exc:
                self.meta.mark_unreachable(url)
                self._retry(tp, batches, exc)
                return
            self.meta.mark_reachable(url)
            if reply.status == 200:
                self._acknowledged(tp, batches, reply.json())
                return
            code = str(reply.error_doc().get("error", ""))
            exc = error_from(reply, f"produce to {topic}/{partition}")
            # A topic just created on another broker may not have reached this one.
            if classify(reply.status, code) == RETRY or code == "unknown_topic":
                self._retry(tp, batches, exc)
            else:
                self._finish(tp, batches, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed answer fails these records, not the sender
            self._finish(tp, batches, exc)
        finally:
            self._wake.set()

    def _acknowledged(self, tp: TP, batches: list[ProducerBatch], doc: Any) -> None:
        topic, partition = tp
        total = sum(b.count for b in batches)
        if not isinstance(doc, dict) or doc.get("count") != total or type(doc.get("base_offset")) is not int:
            raise errors.RingError(f"broker acknowledged {doc!r} for {total} records of {topic}/{partition}")
        offset = doc["base_offset"]
        for b in batches:
            for w in b.waiters:
                if not w.done():
                    w.set_result(RecordMetadata(topic, partition, offset))
                offset += 1
        self.stats["records"] += total
        self._sending.pop(tp, None)
        self.acc.done(tp, batches)
        self._freed()

    def _finish(self, tp: TP, batches: list[ProducerBatch], exc: BaseException) -> None:
        for b in batches:
            _fail_waiters(b.waiters, exc)
        self.stats["failed_batches"] += len(batches)
        self._sending.pop(tp, None)
        self.acc.done(tp, batches)
        self._freed()

    def _retry(self, tp: TP, batches: list[ProducerBatch], exc: errors.RingError) -> None:
        topic, partition = tp
        self.stats["retries"] += 1
        self.meta.refresh_soon(self.spawn)
        now = self.now_ms()
        attempt = batches[0].attempts + 1
        if attempt > self.retries or now > min(b.deadline_ms for b in batches):
            self._finish(tp, batches, BrokersUnavailable(
                f"produce to {topic}/{partition} failed after {attempt} attempts: {exc.message}",
                topic=topic, partition=partition))
            return
        self._sending.pop(tp, None)
        if all(b.movable for b in batches):
            topo = self.meta.topology
            leader = topo.leader_url(topic, partition)
            others = [p for p in self._writable(topic) if p != partition and topo.leader_url(topic, p) != leader]
            if others:
                self._round_robin[topic] += 1
                self.stats["moved_batches"] += len(batches)
                self.acc.move(tp, batches, others[self._round_robin[topic] % len(others)])
                return
        if isinstance(exc, BrokerUnreachable):
            self.stats["reroutes"] += 1
        pause = backoff_ms(attempt, self.retry_backoff_ms)
        self.acc.retry(tp, batches, now + pause)
        asyncio.get_running_loop().call_later(pause / 1000, self._wake.set)


def _fail_waiters(waiters: list[asyncio.Future], exc: BaseException) -> None:
    for w in waiters:
        if not w.done():
            w.set_exception(exc)
