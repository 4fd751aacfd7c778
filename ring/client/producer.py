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
partition=P[&consistency=C]``.

Retries. Connection refused or broken, 429, 503, 504 and "not leader"
answers refresh the topology and try again (to another broker, which
forwards, while the leader refuses connections or, for an idempotent
producer, has sent no answer ``CLIENT_PRODUCE_ANSWER_TIMEOUT_S`` after a
request) after a pause that doubles with each failure, or after the
``Retry-After`` a refusal for load or quota gave if that is longer
(``transport.retry_after_s``), until the records' delivery timeout (Kafka's
``delivery.timeout.ms``) and, when ``retries`` is set, at most that many
times. Batches of sticky unkeyed records move at once to a partition whose
leader looks reachable; a move is not a retry, and a batch failing
everywhere backs off like any other.

Truth about outcomes. A request whose answer was lost (a connection broken
after it was sent, a 504) may be stored. An idempotent producer (the
default) stamps each batch with its producer id and a per-partition
sequence the first time it is sent and sends such a request again exactly
as it was: the leader recognises it and answers with the original offsets,
so it is stored once. Without idempotence it is not retried, and its
records fail as ``OutcomeUnknown``, which is also what any failure of a
batch that may be stored becomes: ``BrokersUnavailable`` (or a 4xx error,
``Overloaded`` or ``QuotaExceeded`` among them when the last attempt was
refused for load or quota) means the records are not stored.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import Counter
from typing import Any, Awaitable, Callable

import orjson

from ring import errors, limits
from ring.client.batcher import TP, Accumulator, BufferFull, ProducerBatch, record_size
from ring.client.metadata import Metadata, quote
from ring.client.retry import backoff_ms
from ring.client.records import RecordMetadata
from ring.client.transport import CT_BATCH, RETRY, UNKNOWN, BrokersUnavailable, BrokerUnreachable, OutcomeUnknown, \
    Transport, classify, error_from, gave_up, retry_after_s
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
    """Check one record against the broker's limits; (record, size, value_is_json).

    ``value`` None (and no ``json=``) is a record without a value, Kafka's
    tombstone; ``headers`` are ``(name, value)`` pairs in order (a name may
    repeat) or a map.
    """
    is_json = json is not NO_JSON
    if is_json:
        if value is not None:
            raise errors.BadRequest("give value or json, not both")
        value = orjson.dumps(json)
    value = None if value is None else _as_bytes(value, "value")
    key = None if key is None else _as_bytes(key, "key")
    if key is not None and len(key) > limits.KEY_BYTES_MAX:
        raise errors.PayloadTooLarge(f"key is over the limit of {limits.KEY_BYTES_MAX} bytes")
    hdrs, header_bytes = batchfmt.check_headers(headers, _as_bytes)
    # The broker's rule: key, value and headers together (a batch holding one record over it is refused whole).
    if (len(value) if value is not None else 0) + (len(key) if key is not None else 0) + header_bytes \
            > limits.MESSAGE_BYTES_MAX:
        raise errors.PayloadTooLarge(f"a record (key, value and headers) is over the limit of "
                                     f"{limits.MESSAGE_BYTES_MAX} bytes")
    if timestamp is None:
        timestamp = now_ms
    elif type(timestamp) is not int or not 0 <= timestamp < 2**62:
        raise errors.BadRequest("timestamp must be an integer of milliseconds since the epoch")
    return (timestamp, key, value, hdrs), record_size(key, value, hdrs), is_json


class Producer:
    def __init__(self, meta: Metadata, transport: Transport, clock: Clock, acc: Accumulator, *,
                 max_in_flight: int, partitioner: Partitioner | None, consistency: str | None,
                 retries: int | None, retry_backoff_ms: float, codec: int, producer_id: int | None,
                 resolve_topic: Callable[[str], Awaitable[Any]],
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
        self.producer_id = producer_id  # None: not idempotent
        self._sequences: dict[TP, int] = {}  # the next base sequence per partition
        self.resolve_topic = resolve_topic
        self.spawn = spawn
        self.stats = stats
        self.requests_to: Counter[tuple[str, str, int]] = Counter()  # (url, topic, partition)
        self._pending: dict[str, list[tuple]] = {}  # records waiting for their topic's metadata
        self._pending_bytes = 0
        self._sticky: dict[str, tuple[int, ProducerBatch | None]] = {}
        self._round_robin: Counter[str] = Counter()
        self._sending: dict[TP, list[ProducerBatch]] = {}
        self._flushing = 0  # flush() calls waiting: records placed meanwhile are sent without linger
        self._wake = asyncio.Event()
        self._drained: asyncio.Future[None] | None = None

    def now_ms(self) -> float:
        return self.clock.monotonic() * 1000

    @property
    def idempotent(self) -> bool:
        return self.producer_id is not None

    @property
    def buffered_bytes(self) -> int:
        return self.acc.buffered_bytes + self._pending_bytes

    def unfinished(self) -> int:
        """Records produced and neither acknowledged nor failed yet."""
        pending = sum(len(recs) for recs in self._pending.values())
        queued = sum(b.count for q in self.acc.queues() for b in q)
        return pending + queued + sum(b.count for bs in self._sending.values() for b in bs)

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
        """Learn (or create) a topic, then place the records that waited for it, in order. While no
        broker answers, keep asking (backing off) until the delivery timeout."""
        deadline = self.now_ms() + self.acc.delivery_timeout_ms
        for attempt in itertools.count(1):
            try:
                async with asyncio.timeout((deadline - self.now_ms()) / 1000):  # its own retries may last longer
                    await self.resolve_topic(topic)
                break
            except (errors.Unavailable, TimeoutError) as exc:
                pause = backoff_ms(attempt, self.retry_backoff_ms)
                if self.now_ms() + pause >= deadline:
                    self.fail_pending(topic, BrokersUnavailable(
                        f"topic {topic!r}: no broker described it within the delivery timeout; last: "
                        f"{getattr(exc, 'message', 'still asking')}",
                        topic=topic))
                    return
                await self.clock.sleep(pause / 1000)
            except Exception as exc:  # every waiting record learns why; none is left pending
                self.fail_pending(topic, exc)
                return
        for record, size, is_json, partition, fut in self._pending.pop(topic, []):
            self._pending_bytes -= size
            if not fut.done():
                self._place(topic, record, size, is_json, partition, fut)
        if self._flushing:
            self.acc.seal_all()
        self._wake.set()

    def fail_pending(self, topic: str, exc: BaseException) -> None:
        for _, size, _, _, fut in self._pending.pop(topic, []):
            self._pending_bytes -= size
            if not fut.done():
                fut.set_exception(exc)
        self._freed()

    def _writable(self, topic: str) -> list[int]:
        """Partitions whose leader is neither reported down nor refusing connections lately."""
        topo = self.meta.topology
        parts = topo.live_leader_partitions(topic)
        return [p for p in parts if not self.meta.recently_unreachable(topo.leader_url(topic, p))]

    def _sticky_partition(self, topic: str, n: int) -> int:
        current = self._sticky.get(topic)
        if current is not None:
            p, batch = current
            if (p < n and batch is not None and batch is self.acc.open_batch(topic, p)
                    and not self.acc.held_back(topic, p, self.now_ms())):
                return p
        candidates = ([p for p in self._writable(topic) if p < n]
                      or [p for p in self.meta.topology.live_leader_partitions(topic) if p < n] or list(range(n)))
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
        self._flushing += 1
        try:
            waits: list[asyncio.Future] = [f for recs in self._pending.values() for *_, f in recs]
            batches = self.acc.seal_all() + [b for bs in self._sending.values() for b in bs]
            waits += [b.waiters[-1] for b in batches]
            self._wake.set()
            if waits:
                await asyncio.wait(waits)
        finally:
            self._flushing -= 1

    def fail_everything(self, exc: errors.RingError) -> None:
        """Closing: every record not yet acknowledged fails with ``exc``, or with ``OutcomeUnknown`` where
        a request that carried it may have been stored (one in flight now, or one whose answer was lost)."""
        for b in self.acc.fail_all():
            _fail_waiters(b, exc)
        for topic in list(self._pending):
            self.fail_pending(topic, exc)
        for batches in self._sending.values():
            for b in batches:
                b.maybe_written = True  # its request is out, or going out: the broker may store it
                _fail_waiters(b, exc)

    # --- the sender --------------------------------------------------------------

    async def run(self) -> None:
        while True:
            self._wake.clear()
            now = self.now_ms()
            expired = self.acc.expire(now)
            for b in expired:
                last = b.last_error
                _fail_waiters(b, gave_up(
                    f"produce to {b.topic}/{b.partition}: not delivered within the delivery timeout "
                    f"after {b.failures} failed attempts" + (f"; last: {last.message}" if last else ""), last,
                    topic=b.topic, partition=b.partition))
            if expired:
                self.stats["expired_batches"] += len(expired)
                self._freed()
            room = self.max_in_flight - len(self._sending)
            deadline = self.acc.next_expiry_ms()  # when at capacity, a finishing request wakes us
            if room > 0:
                for tp, batches in self.acc.drain(now, room):
                    self._sending[tp] = batches
                    self.spawn(self._send(tp, batches))
                due = self.acc.next_deadline_ms(now)
                if due is not None:
                    deadline = due if deadline is None else min(due, deadline)
            if self.meta.stale():
                self.spawn(self.meta.refresh(quiet=True))
            if deadline is None:
                await self._wake.wait()
            elif deadline > now:
                try:
                    async with asyncio.timeout((deadline - now) / 1000):
                        await self._wake.wait()
                except TimeoutError:
                    pass

    def _encode(self, tp: TP, batches: list[ProducerBatch]) -> bytes:
        for b in batches:
            if b.encoded is None:
                b.encoded = batchfmt.encode(b.records, now_ms=self.clock.wall_ms(), codec=self.codec,
                                            values_are_json=b.values_are_json)
                b.records = []  # the bytes are what a retry resends
            if self.producer_id is not None and b.sequence < 0:
                self._sequence(tp, b)
        return b"".join(b.encoded for b in batches if b.encoded is not None)

    def _sequence(self, tp: TP, b: ProducerBatch) -> None:
        """Give ``b`` the next base sequence of its partition (before its first send there)."""
        assert self.producer_id is not None and b.encoded is not None
        seq = self._sequences.get(tp, 0)
        if seq + b.count >= 2**31:  # the sequence space of this id is used up: go on under a new one
            self.producer_id = new_producer_id()
            self._sequences.clear()
            seq = 0
        self._sequences[tp] = seq + b.count
        b.sequence = seq
        batchfmt.set_producer(b.encoded, self.producer_id, seq)

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
            body = self._encode(tp, batches)
            self.stats["produce_requests"] += 1
            self.stats["batches"] += len(batches)
            self.requests_to[(url, topic, partition)] += 1
            try:
                reply = await self.transport.request(
                    "POST", url, f"/v1/topics/{quote(topic)}/messages",
                    params={"partition": partition, **self._params_extra},
                    body=body, headers={"Content-Type": CT_BATCH, "Accept": "application/json"},
                    answer_timeout_s=None if self.producer_id is None else limits.CLIENT_PRODUCE_ANSWER_TIMEOUT_S)
            except BrokerUnreachable as exc:
                self.meta.mark_unreachable(url)
                self._failed(tp, batches, exc, maybe_written=exc.maybe_sent)
                return
            self.meta.mark_reachable(url)
            if reply.status == 200:
                self._acknowledged(tp, batches, reply.json())
                return
            code = str(reply.error_doc().get("error", ""))
            exc = error_from(reply, f"produce to {topic}/{partition}")
            kind = classify(reply.status, code)
            if kind == UNKNOWN or reply.status == 502:  # a 502 is a proxy that lost the broker's answer
                self._failed(tp, batches, exc, maybe_written=True)
            elif kind == RETRY or code == "unknown_topic":  # (a topic just created elsewhere)
                self._failed(tp, batches, exc, maybe_written=False, wait_s=retry_after_s(reply))
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
            for w, ts in zip(b.waiters, b.timestamps):
                if not w.done():
                    w.set_result(RecordMetadata(topic, partition, offset, ts))
                offset += 1
        self.stats["records"] += total
        self._sending.pop(tp, None)
        self.acc.done(tp, batches)
        self._freed()

    def _finish(self, tp: TP, batches: list[ProducerBatch], exc: BaseException) -> None:
        for b in batches:
            _fail_waiters(b, exc)
        self.stats["failed_batches"] += len(batches)
        self._sending.pop(tp, None)
        self.acc.done(tp, batches)
        self._freed()

    def _failed(self, tp: TP, batches: list[ProducerBatch], exc: errors.RingError, *, maybe_written: bool,
                wait_s: float = 0.0) -> None:
        """A request that did not succeed and may be worth another try. It is tried again (after a
        doubling pause, or the ``wait_s`` the broker's refusal asked for if that is longer, following
        the leader as metadata learns where it went) until the delivery timeout, or ``retries``
        attempts if that is set; moving to another partition is a new place, not a retry. A request
        that may have been written is sent again exactly as it was, and only by an idempotent
        producer; otherwise its records fail as ``OutcomeUnknown``."""
        topic, partition = tp
        self.stats["retries"] += 1
        self.spawn(self.meta.refresh(quiet=True))
        now = self.now_ms()
        refused = exc if isinstance(exc, errors.Overloaded) else None
        for b in batches:
            b.failures += 1
            b.maybe_written = b.maybe_written or maybe_written
            b.last_error = refused
        attempt = batches[0].attempts + 1
        if maybe_written and self.producer_id is None:
            self._finish(tp, batches, exc)
            return
        if (self.retries is not None and attempt > self.retries) or now >= min(b.deadline_ms for b in batches):
            self._finish(tp, batches, gave_up(
                f"produce to {topic}/{partition} failed after {batches[0].failures} attempts: {exc.message}", exc,
                topic=topic, partition=partition))
            return
        self._sending.pop(tp, None)
        pause = max(backoff_ms(batches[0].failures, self.retry_backoff_ms), wait_s * 1000)
        if all(b.movable and not b.maybe_written for b in batches):
            topo = self.meta.topology
            leader = topo.leader_url(topic, partition)
            others = [p for p in self._writable(topic) if p != partition and topo.leader_url(topic, p) != leader]
            if others:  # another leader looks reachable: go there now; a batch failing everywhere backs off
                self._round_robin[topic] += 1
                self.stats["moved_batches"] += len(batches)
                target = others[self._round_robin[topic] % len(others)]
                for b in batches:  # never written: the next send there numbers it anew
                    b.sequence = -1
                self.acc.move(tp, batches, target, retry_at_ms=0.0 if batches[0].failures <= 1 else now + pause)
                return
        if isinstance(exc, BrokerUnreachable):  # _target tries another live broker next
            self.stats["reroutes"] += 1
        self.acc.retry(tp, batches, now + pause, exact=any(b.maybe_written for b in batches))
        asyncio.get_running_loop().call_later(pause / 1000, self._wake.set)


def new_producer_id() -> int:
    """A random id for an idempotent producer: ids are not coordinated, so 63 random bits."""
    return secrets.randbits(63)


def _fail_waiters(b: ProducerBatch, exc: BaseException) -> None:
    """Fail a batch's records with ``exc``; with ``OutcomeUnknown`` if an attempt may have stored them."""
    if b.maybe_written and not isinstance(exc, OutcomeUnknown):
        why = exc.message if isinstance(exc, errors.RingError) else repr(exc)
        exc = OutcomeUnknown(f"{b.count} records may be stored on {b.topic}/{b.partition} or not (an attempt's "
                             f"answer was lost): {why}", topic=b.topic, partition=b.partition)
    for w in b.waiters:
        if not w.done():
            w.set_exception(exc)
