"""Idempotent producers: the leader drops a retried batch and answers with the offsets it was first given.

A produce may carry a ``producer_id`` and a ``sequence``; the broker writes
them into each stored batch header (``producer_id``, ``base_sequence``: the
sequence of the batch's first record, counted per partition), and clients
that build batches themselves set them there. ``ProducerTable`` (pure) keeps,
per partition, the last ``PRODUCER_BATCHES_KEPT`` batches of each producer id
(sequences and offsets) and judges an incoming request:

* every idempotent batch matches a remembered one (same producer, base
  sequence and record count): a duplicate, answered with the original offsets;
* a batch at or below the producer's last sequence that matches nothing
  remembered (an old retry, or a reordering): 409, nothing is written;
* otherwise new (sequences must grow per partition; gaps are allowed, so a
  producer may use one counter for all partitions, unless its batches say
  ``SEQUENCES_CONTIGUOUS``, as a Kafka producer's do: then a batch must
  follow the producer's last one (or the one before it in the request)
  exactly, else 409, so a batch still on its way is never overtaken; a
  producer the table does not know may start anywhere); a request mixing
  duplicates and new batches is refused with 409.

At most ``PRODUCER_IDS_PER_PARTITION_MAX`` producer ids are kept per partition;
the least recently used is forgotten first, after which its retries are no
longer recognised (and are written again).

The table is never persisted: batch headers are the truth, so any replica can
rebuild it by scanning headers (no record is decoded). ``ProducerStates``
keeps one table per partition replica on the leader, built lazily on the
first idempotent batch (from the batches of the last
``PRODUCER_STATE_WINDOW_MS``, in steps that yield to the event loop), kept
current by the leader's own appends, and caught up from the log (or rebuilt
after a truncation or a new leader epoch) before each use, so after a leader
failover the new leader recognises retries of batches it holds.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple

from ring import limits
from ring.errors import Conflict
from ring.log import batch as batchfmt
from ring.log.batch import SEQUENCES_CONTIGUOUS, BatchHeader

# Yielding steps of a rebuild before the append goes on; a log written faster
# than it is scanned is finished synchronously by check().
_PREPARE_STEPS_MAX = 10_000


class Sent(NamedTuple):
    """One batch of a producer as written: its sequences and offsets."""

    base_sequence: int
    count: int
    base_offset: int


@dataclass(frozen=True)
class Duplicate:
    base_offset: int
    count: int


class ProducerTable:
    def __init__(self, batches_kept: int = limits.PRODUCER_BATCHES_KEPT,
                 ids_max: int = limits.PRODUCER_IDS_PER_PARTITION_MAX) -> None:
        assert batches_kept >= 1 and ids_max >= 1
        self.batches_kept = batches_kept
        self.ids_max = ids_max
        self._producers: OrderedDict[int, deque[Sent]] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._producers)

    def batches(self, producer_id: int) -> list[Sent]:
        return list(self._producers.get(producer_id, ()))

    def record(self, producer_id: int, base_sequence: int, count: int, base_offset: int) -> None:
        """A batch was written (by this leader, or found in the log while rebuilding)."""
        if producer_id < 0:
            return
        sent = self._producers.get(producer_id)
        if sent is None:
            sent = self._producers[producer_id] = deque(maxlen=self.batches_kept)
            while len(self._producers) > self.ids_max:
                self._producers.popitem(last=False)
                self.evicted += 1
        else:
            self._producers.move_to_end(producer_id)
        sent.append(Sent(base_sequence, count, base_offset))

    def judge(self, topic: str, partition: int, headers: Iterable[BatchHeader]) -> Duplicate | None:
        """None: write the request. A ``Duplicate``: it was written before, at these offsets. 409 otherwise."""
        dups: list[Sent] = []
        fresh = 0
        last_in_request: dict[int, int] = {}
        for h in headers:
            if h.producer_id < 0:
                fresh += 1
                continue
            pid, seq, n = h.producer_id, h.base_sequence, h.record_count
            if seq < 0:
                raise Conflict(f"batch of producer {pid} has no sequence", topic=topic, partition=partition,
                               producer_id=pid)
            before = last_in_request.get(pid)
            if before is not None and seq <= before:
                raise Conflict(f"sequences of producer {pid} go backwards within one request",
                               topic=topic, partition=partition, producer_id=pid)
            last_in_request[pid] = seq + n - 1
            sent = self._producers.get(pid)
            match = next((s for s in sent or () if s.base_sequence == seq and s.count == n), None)
            if match is not None:
                dups.append(match)
                continue
            last = sent[-1].base_sequence + sent[-1].count - 1 if sent else None
            if last is not None and seq <= last:
                raise Conflict(
                    f"sequence {seq} of producer {pid} on {topic}/{partition} is not after its last one ({last}) "
                    f"and matches none of its last {self.batches_kept} batches: an old retry or out of order; "
                    "nothing was written", topic=topic, partition=partition, producer_id=pid, sequence=seq,
                    last_sequence=last, reason="out_of_order_sequence")
            after = before if before is not None else last
            if h.attributes & SEQUENCES_CONTIGUOUS and after is not None and seq != after + 1:
                raise Conflict(
                    f"sequence {seq} of producer {pid} on {topic}/{partition} skips {seq - after - 1} after {after}, "
                    "and this producer's sequences have no gap: a batch before it is still on its way; nothing "
                    "was written", topic=topic, partition=partition, producer_id=pid, sequence=seq,
                    last_sequence=after, reason="out_of_order_sequence")
            fresh += 1
        if not dups:
            return None
        if fresh:
            raise Conflict(f"part of this request to {topic}/{partition} was written before and part was not: "
                           "retry exactly the original request", topic=topic, partition=partition,
                           reason="partial_duplicate")
        base = min(s.base_offset for s in dups)
        end = max(s.base_offset + s.count for s in dups)
        return Duplicate(base, end - base)


class _Turn:
    """The appends of one partition's idempotent batches that wait for its table, one at a time in arrival order."""

    __slots__ = ("key", "lock", "taking")

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.lock = asyncio.Lock()  # FIFO: its waiters acquire it in the order they asked
        self.taking = 0  # appends holding or waiting for the lock


class _Entry:
    __slots__ = ("table", "log", "epoch", "scanned_to")

    def __init__(self, log: Any, epoch: int, start: int) -> None:
        self.table = ProducerTable()
        self.log = log
        self.epoch = epoch
        self.scanned_to = start


def _idempotent(batches: list[bytearray]) -> list[BatchHeader] | None:
    if all(batchfmt.producer_id(b) < 0 for b in batches):
        return None  # the common case, told from one field of each header
    return [batchfmt.read_header(b) for b in batches]


class ProducerStates:
    """One ``ProducerTable`` per partition replica this broker leads, rebuilt from batch headers when needed."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self._entries: dict[tuple[str, int], _Entry] = {}
        # Partition -> the lock its idempotent appends that wait for their table take, in arrival order, from
        # before it is built to right after they join the turn write; dropped when none holds or waits for it.
        self._turns: dict[tuple[str, int], _Turn] = {}

    def _entry(self, part: Any) -> _Entry | None:
        e = self._entries.get((part.topic, part.index))
        if e is None or e.log is not part.log or e.epoch != part.epoch or e.scanned_to > part.log.end_offset:
            return None  # never built, another incarnation, a new leader epoch, or a truncated log
        return e

    def ready(self, part: Any, batches: list[bytearray]) -> bool:
        """Whether ``prepare`` has nothing to do for an append of ``batches`` (no table to build or catch up)."""
        if _idempotent(batches) is None:
            return True
        if (part.topic, part.index) in self._turns:  # an earlier append is on its way: go after it
            return False
        e = self._entry(part)
        return e is not None and e.scanned_to >= e.log.end_offset

    async def turn(self, part: Any, batches: list[bytearray]) -> _Turn | None:
        """Before idempotent batches that were not ``ready`` join the turn write: wait for the appends of
        ``part`` that came first (a sequence judged before the one it follows would look like a gap), then
        ``prepare``. The lock returned is held: ``end_turn`` it right after they joined (or were refused).
        None for batches of no idempotent producer."""
        if _idempotent(batches) is None:
            return None
        key = (part.topic, part.index)
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = _Turn(key)
        turn.taking += 1
        try:
            await turn.lock.acquire()
        except BaseException:
            self._left(turn)
            raise
        try:
            await self.prepare(part, batches)
        except BaseException:
            self.end_turn(turn)
            raise
        return turn

    def end_turn(self, turn: _Turn | None) -> None:
        """The append ``turn`` was taken for is done (or refused): the next one may go."""
        if turn is not None:
            turn.lock.release()
            self._left(turn)

    def _left(self, turn: _Turn) -> None:
        turn.taking -= 1
        if turn.taking == 0 and self._turns.get(turn.key) is turn:
            del self._turns[turn.key]

    async def prepare(self, part: Any, batches: list[bytearray]) -> None:
        """Before an append of idempotent batches: have ``part``'s table built and caught up (yielding)."""
        if _idempotent(batches) is None:
            return
        e = self._entry(part)
        if e is None:
            plog = part.log
            # The window counts back from the log's newest record when this broker's wall clock is past
            # it: a clock stepped forward (or a partition idle a while) must not leave out recent batches.
            newest = plog.max_timestamp
            now_ms = self.clock.wall_ms() if newest is None else min(self.clock.wall_ms(), newest)
            found = plog.offset_for_timestamp(now_ms - limits.PRODUCER_STATE_WINDOW_MS)
            e = _Entry(plog, part.epoch, plog.end_offset if found is None else max(found, plog.start_offset))
            self._entries[(part.topic, part.index)] = e
        for _ in range(_PREPARE_STEPS_MAX):  # check() finishes whatever is left, without yielding
            if not self._step(e):
                break
            await self.clock.sleep(0)

    def _step(self, e: _Entry) -> bool:
        """Scan one read's worth of batch headers into the table; False at the end of the log."""
        if e.scanned_to >= e.log.end_offset:
            return False
        e.scanned_to = max(e.scanned_to, e.log.start_offset)
        data = e.log.read(e.scanned_to, limits.PRODUCER_STATE_SCAN_BYTES)
        for h, _ in batchfmt.scan(data, verify=False):
            if h.next_offset <= e.scanned_to:
                continue
            e.table.record(h.producer_id, h.base_sequence, h.record_count, h.base_offset)
            e.scanned_to = h.next_offset
        return True

    def check(self, part: Any, batches: list[bytearray]) -> Duplicate | None:
        """Right before the append, with no await in between: a duplicate, None to write, or 409."""
        headers = _idempotent(batches)
        if headers is None:
            return None
        e = self._entry(part)
        if e is None:  # prepare() was not called for this incarnation: build it now (rare)
            e = self._entries[(part.topic, part.index)] = _Entry(part.log, part.epoch, part.log.start_offset)
        while self._step(e):
            pass
        return e.table.judge(part.topic, part.index, headers)

    def appended(self, part: Any, batches: list[bytearray], base_offset: int) -> None:
        """The leader appended ``batches`` at ``base_offset``: keep a current table current."""
        e = self._entry(part)
        if e is None or e.scanned_to != base_offset:
            return
        for b in batches:
            h = batchfmt.read_header(b)
            e.table.record(h.producer_id, h.base_sequence, h.record_count, h.base_offset)
            e.scanned_to = h.next_offset
