"""The producer's record accumulator: records in, per-partition requests out.

Records wait in one queue of batches per (topic, partition). The last batch
of a queue is open; it is sealed when the next record would take it past
``batch_bytes`` (or its value format differs). A partition is ready to send
when its head batch is sealed, has waited ``linger_ms`` since its first
record, or a flush asked for everything queued. ``drain`` hands out at most
ONE request per partition at a time (every ready batch of it, up to the
request bounds) and marks the partition busy until ``done``/``retry``: that
keeps each partition's records in order across retries, and while a request
is in flight the next one fills up, so a slow broker gets bigger requests
instead of more of them (the latency/throughput knob is ``linger_ms`` first,
``batch_bytes`` second).

A request that may have been written (its answer was lost) goes back as an
``exact`` retry: the same batches, alone in their request, so an idempotent
broker recognises it as a whole (it answers a request mixing written and new
batches with 409). ``request_batches_max`` keeps a request within what such
a broker remembers per producer. Batches that were never sent and are past
their delivery deadline are handed back by ``expire``.

A synchronous core: it takes ``now_ms`` as an argument and never touches a
socket, the event loop or the clock. The per-record ``waiter`` is opaque here
(the driver stores futures in it). Every byte queued is counted against
``buffer_bytes``; past it ``append`` raises ``BufferFull``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ring.errors import Overloaded
from ring.log.batch import HEADER_SIZE, Header, RecordIn

TP = tuple[str, int]
# msgpack framing of one record around key, value and headers (array header,
# timestamp delta, bin headers): counted so a batch never outgrows its bound.
RECORD_OVERHEAD_BYTES = 16


class BufferFull(Overloaded):
    """The producer holds ``buffer_bytes`` of unacknowledged records: wait (``drain``) and retry."""

    code = "buffer_full"


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[Header] | None) -> int:
    size = RECORD_OVERHEAD_BYTES
    if value is not None:
        size += len(value)
    if key is not None:
        size += len(key)
    if headers:
        for name, v in headers:
            size += len(name) + 2 + (len(v) if v is not None else 0)
    return size


@dataclass(eq=False)
class ProducerBatch:
    topic: str
    partition: int
    values_are_json: bool
    created_ms: float  # monotonic ms of its first record: the linger clock
    deadline_ms: float  # monotonic ms after which it fails instead of retrying
    movable: bool = True  # only sticky-placed unkeyed records: may move partition on retry
    records: list[RecordIn] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)  # each record's, for its RecordMetadata
    waiters: list[Any] = field(default_factory=list)
    size: int = HEADER_SIZE
    sealed: bool = False
    attempts: int = 0  # failed attempts on this partition: they count against the producer's retries
    failures: int = 0  # failed attempts anywhere: the backoff doubles with them
    last_error: Overloaded | None = None  # the last attempt's refusal for load or quota, if that is what failed
    retry_at_ms: float = 0.0
    encoded: bytearray | None = None  # set by the driver on first send, reused by retries
    sequence: int = -1  # an idempotent producer's base sequence on ``partition``, set with ``encoded``
    maybe_written: bool = False  # an attempt's outcome is unknown: the broker may hold it
    exact: object | None = None  # an exact retry: sent again with exactly the batches sharing this tag

    @property
    def count(self) -> int:
        return len(self.waiters)


class Accumulator:
    def __init__(self, *, linger_ms: float, batch_bytes: int, buffer_bytes: int,
                 request_bytes_max: int, request_records_max: int, delivery_timeout_ms: float,
                 request_batches_max: int | None = None) -> None:
        assert linger_ms >= 0 and batch_bytes > HEADER_SIZE and buffer_bytes >= batch_bytes
        assert request_bytes_max >= batch_bytes and request_records_max >= 1
        assert request_batches_max is None or request_batches_max >= 1
        self.linger_ms = linger_ms
        self.batch_bytes = batch_bytes
        self.buffer_bytes = buffer_bytes
        self.request_bytes_max = request_bytes_max
        self.request_records_max = request_records_max
        self.delivery_timeout_ms = delivery_timeout_ms
        self.request_batches_max = request_batches_max
        self._queues: dict[TP, deque[ProducerBatch]] = {}
        self._busy: set[TP] = set()
        self.buffered_bytes = 0  # queued + in flight; freed by done/fail

    # --- records in ------------------------------------------------------------

    def append(self, topic: str, partition: int, record: RecordIn, size: int, waiter: Any,
               values_are_json: bool, movable: bool, now_ms: float) -> bool:
        """Queue one record; True when the sender should look again (a batch
        was created or sealed, so a send may be due sooner than it thought)."""
        if self.buffered_bytes + size > self.buffer_bytes and self.buffered_bytes > 0:
            raise BufferFull(f"{self.buffered_bytes} bytes of records wait for acknowledgement "
                             f"(buffer_bytes={self.buffer_bytes}); await drain() and retry",
                             buffered_bytes=self.buffered_bytes)
        tp = (topic, partition)
        q = self._queues.get(tp)
        if q is None:
            q = self._queues[tp] = deque()
        batch = q[-1] if q and not q[-1].sealed else None
        nudge = False
        if batch is not None and (batch.values_are_json != values_are_json
                                  or batch.size + size > self.batch_bytes):
            batch.sealed = True
            batch, nudge = None, True
        if batch is None:
            batch = ProducerBatch(topic, partition, values_are_json, now_ms, now_ms + self.delivery_timeout_ms)
            q.append(batch)
            nudge = True
        batch.records.append(record)
        batch.timestamps.append(record[0])
        batch.waiters.append(waiter)
        batch.size += size
        batch.movable = batch.movable and movable
        self.buffered_bytes += size
        if batch.size >= self.batch_bytes:
            batch.sealed = True
            nudge = True
        return nudge

    def open_batch(self, topic: str, partition: int) -> ProducerBatch | None:
        q = self._queues.get((topic, partition))
        return q[-1] if q and not q[-1].sealed else None

    def held_back(self, topic: str, partition: int, now_ms: float) -> bool:
        """The partition's open batch is due but waits for the request in flight:
        a sticky partitioner should move on rather than pile more onto it."""
        tp = (topic, partition)
        q = self._queues.get(tp)
        return (tp in self._busy and bool(q) and not q[-1].sealed
                and now_ms - q[-1].created_ms >= self.linger_ms)

    def seal_all(self) -> list[ProducerBatch]:
        """Flush: every queued batch is ready now. Returns every batch queued."""
        out = []
        for q in self._queues.values():
            for b in q:
                b.sealed = True
                out.append(b)
        return out

    # --- requests out ----------------------------------------------------------

    def _ready(self, tp: TP, q: deque[ProducerBatch], now_ms: float) -> bool:
        if tp in self._busy or not q:
            return False
        head = q[0]
        if head.retry_at_ms > now_ms:
            return False
        return head.sealed or now_ms - head.created_ms >= self.linger_ms

    def drain(self, now_ms: float, max_requests: int) -> list[tuple[TP, list[ProducerBatch]]]:
        """Up to ``max_requests`` requests, one per ready partition, each the
        ready batches at the head of its queue within the request bounds."""
        out: list[tuple[TP, list[ProducerBatch]]] = []
        for tp, q in list(self._queues.items()):
            if len(out) >= max_requests:
                break
            if not self._ready(tp, q, now_ms):
                if not q and tp not in self._busy:
                    del self._queues[tp]
                continue
            taken: list[ProducerBatch] = []
            nbytes = nrecords = 0
            exact = q[0].exact
            while q:
                b = q[0]
                if exact is not None:  # the same request again, nothing more, nothing less
                    if b.exact is not exact:
                        break
                elif taken and (nbytes + b.size > self.request_bytes_max
                                or nrecords + b.count > self.request_records_max
                                or len(taken) == self.request_batches_max
                                or b.retry_at_ms > now_ms or b.exact is not None):
                    break
                if not (b.sealed or now_ms - b.created_ms >= self.linger_ms):
                    break
                b.sealed = True
                taken.append(q.popleft())
                nbytes += b.size
                nrecords += b.count
            self._busy.add(tp)
            out.append((tp, taken))
        return out

    def next_deadline_ms(self, now_ms: float) -> float | None:
        """When the next idle partition becomes ready (``now_ms`` if one is already)."""
        best: float | None = None
        for tp, q in self._queues.items():
            if tp in self._busy or not q:
                continue
            head = q[0]
            due = head.retry_at_ms if head.retry_at_ms > now_ms else (
                now_ms if head.sealed else head.created_ms + self.linger_ms)
            if best is None or due < best:
                best = due
        return best

    def done(self, tp: TP, batches: list[ProducerBatch]) -> None:
        """The request ended (acknowledged or failed for good): free its bytes."""
        self._busy.discard(tp)
        self.buffered_bytes -= sum(b.size - HEADER_SIZE for b in batches)

    def retry(self, tp: TP, batches: list[ProducerBatch], retry_at_ms: float, exact: bool = False) -> None:
        """Put a failed request's batches back at the head of their queue, in order; ``exact``: to be
        sent again as exactly this request."""
        self._busy.discard(tp)
        q = self._queues.setdefault(tp, deque())
        tag = object() if exact else None
        for b in reversed(batches):
            b.attempts += 1
            b.retry_at_ms = retry_at_ms
            b.sealed = True
            b.exact = tag or b.exact
            q.appendleft(b)

    def move(self, tp: TP, batches: list[ProducerBatch], partition: int, retry_at_ms: float = 0.0) -> None:
        """Send movable batches of a failed request to another partition instead (a new partition
        is a new place: the move spends no retry)."""
        assert all(b.movable and not b.maybe_written for b in batches)
        self._busy.discard(tp)
        q = self._queues.setdefault((tp[0], partition), deque())
        for b in batches:
            b.partition = partition
            b.retry_at_ms = retry_at_ms
            b.sealed = True
            b.exact = None
            if q and not q[-1].sealed:
                q.insert(len(q) - 1, b)  # before the open batch: only the last one is open
            else:
                q.append(b)

    def expire(self, now_ms: float) -> list[ProducerBatch]:
        """Remove and return the queued batches past their delivery deadline (those in a request
        in flight stay: the request's end decides)."""
        out: list[ProducerBatch] = []
        for tp, q in self._queues.items():
            if any(b.deadline_ms <= now_ms for b in q):
                out += [b for b in q if b.deadline_ms <= now_ms]
                self._queues[tp] = deque(b for b in q if b.deadline_ms > now_ms)
        self.buffered_bytes -= sum(b.size - HEADER_SIZE for b in out)
        return out

    def next_expiry_ms(self) -> float | None:
        """The earliest delivery deadline of a queued batch."""
        return min((b.deadline_ms for q in self._queues.values() for b in q), default=None)

    def fail_all(self) -> Iterator[ProducerBatch]:
        """Remove every queued batch (closing without flushing)."""
        for tp, q in list(self._queues.items()):
            while q:
                b = q.popleft()
                self.buffered_bytes -= b.size - HEADER_SIZE
                yield b
            del self._queues[tp]

    def queues(self) -> list[deque[ProducerBatch]]:
        return list(self._queues.values())

    def queued_batches(self) -> int:
        return sum(len(q) for q in self._queues.values())
