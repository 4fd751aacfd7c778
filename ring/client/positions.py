"""What a group consumer knows of its own partitions, client-side: the records it received and handed
out, pauses and seeks, and what to tell the coordinator before the next poll.

The coordinator keeps each member's read position, but only in memory: a new coordinator (after a
failover) starts the member from the committed offsets, and a poll whose answer was lost has moved
the position past records the member never got. So the consumer keeps its own position per partition
as Kafka's consumer does (``fetched``: one past the last record it received) and

* drops records below it (already received: the coordinator lost the member's position) and, once
  that happened or a request failed (``resync``), puts its positions back on the coordinator before
  the next poll, whose implicit commit then covers exactly what was handed out;
* holds back records of paused partitions and seeks the coordinator back to the first of them, so
  they come again once resumed;
* carries ``seek`` to the coordinator before the next poll (lazily, like Kafka's ``seek``).

A pure value: no I/O; ``ring.client.consumer`` does the requests.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from ring.client.records import ConsumerRecord
from ring.errors import BadRequest

TP = tuple[str, int]


class Positions:
    def __init__(self) -> None:
        self.assignment: list[TP] = []
        self.buffer: deque[ConsumerRecord] = deque()  # received, not yet handed out (the iterators)
        self.fetched: dict[TP, int] = {}  # one past the last record received
        self.handed: dict[TP, int] = {}  # one past the last record handed to the application
        self.committed: dict[TP, int] = {}  # what this consumer last committed itself
        self.paused: set[TP] = set()
        self.seeks: dict[TP, int] = {}  # positions to set on the coordinator before the next poll
        self.dropped = 0  # records received again below ``fetched``

    # --- the assignment ---------------------------------------------------------------

    def assign(self, partitions: Iterable[TP]) -> tuple[list[TP], list[TP]]:
        """A new assignment; (revoked, added). What is known of revoked partitions is forgotten:
        their new owner reads them from the committed offsets."""
        new = list(partitions)
        old = set(self.assignment)
        revoked, added = sorted(old - set(new)), sorted(set(new) - old)
        self.assignment = new
        for tp in revoked:
            for d in (self.fetched, self.handed, self.committed, self.seeks):
                d.pop(tp, None)
            self.paused.discard(tp)
        if revoked:
            gone = set(revoked)
            self.buffer = deque(r for r in self.buffer if (r.topic, r.partition) not in gone)
        return revoked, added

    def _held(self, tps: Iterable[TP]) -> list[TP]:
        tps = list(tps)
        held = set(self.assignment)
        foreign = [tp for tp in tps if tp not in held]
        if foreign:
            raise BadRequest(f"not assigned to this consumer: {', '.join(f'{t}/{p}' for t, p in foreign[:5])}")
        return tps

    # --- records in and out -----------------------------------------------------------

    def accept(self, records: Iterable[ConsumerRecord]) -> list[ConsumerRecord]:
        """The records of a poll the application should get, in order."""
        held = set(self.assignment)
        out: list[ConsumerRecord] = []
        again = False
        for r in records:
            tp = (r.topic, r.partition)
            if tp not in held:
                continue
            if r.offset < self.fetched.get(tp, -1):
                self.dropped += 1
                again = True
                continue
            if tp in self.paused:
                self.seeks.setdefault(tp, r.offset)  # read it again once resumed
                continue
            out.append(r)
            self.fetched[tp] = r.offset + 1
        if again:
            self.resync()
        return out

    def mark(self, record: ConsumerRecord) -> None:
        """``record`` was handed to the application: a commit counts it as read."""
        self.handed[(record.topic, record.partition)] = record.offset + 1

    def resync(self) -> None:
        """The coordinator may not know where this consumer is: tell it before the next poll."""
        for tp in self.assignment:
            if tp in self.fetched:
                self.seeks.setdefault(tp, self.fetched[tp])

    def take_seeks(self) -> dict[TP, int]:
        seeks, self.seeks = self.seeks, {}
        return {tp: o for tp, o in seeks.items() if tp in set(self.assignment)}

    # --- seeking and pausing ------------------------------------------------------------

    def seek(self, tp: TP, offset: int) -> None:
        """Read ``tp`` from ``offset`` next (its buffered records are dropped)."""
        self._held([tp])
        if type(offset) is not int or offset < 0:
            raise BadRequest(f"offset must be a non-negative integer, not {offset!r}")
        self._unbuffer({tp})
        self.fetched[tp] = self.handed[tp] = self.seeks[tp] = offset

    def pause(self, tps: Iterable[TP]) -> None:
        """Hand out nothing more of ``tps`` until resumed: their buffered records go back to the coordinator."""
        tps = set(self._held(tps))
        self.paused |= tps
        for tp, first in self._unbuffer(tps).items():
            self.fetched[tp] = self.seeks[tp] = first

    def resume(self, tps: Iterable[TP]) -> None:
        self.paused -= set(tps)

    def _unbuffer(self, tps: set[TP]) -> dict[TP, int]:
        """Drop the buffered records of ``tps``; the first offset dropped per partition."""
        first: dict[TP, int] = {}
        kept: deque[ConsumerRecord] = deque()
        for r in self.buffer:
            tp = (r.topic, r.partition)
            if tp in tps:
                first.setdefault(tp, r.offset)
            else:
                kept.append(r)
        self.buffer = kept
        return first

    def position(self, tp: TP) -> int | None:
        """The offset of the next record of ``tp`` the application gets (None: not known here yet)."""
        for r in self.buffer:
            if (r.topic, r.partition) == tp:
                return r.offset
        return self.seeks.get(tp, self.fetched.get(tp))
