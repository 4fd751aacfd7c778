"""Produces waiting for acknowledgements, and their deadlines, on every partition a broker leads.

A leader answers a produce once the consistency level's number of voters
(itself included) durably hold its batches, counted against the voter set
as it is when they do: a set that grew meanwhile (a replica joining) needs
a majority of the larger set, else the set before could still elect a leader
without the batches. Hundreds of produces may wait on one partition, so each
replica keeps one heap per consistency level, ordered by end offset
(``Replica.ack_waiters``): a moved end releases the waiters it satisfies
without walking the others. Every produce waits the
same time, so arrival order is deadline order and one queue of deadlines
serves every partition; ``expire`` fails the ones whose time is up.
Released waiters go to ``released`` as (token, None) or (token, error); the
core hands them to the driver in its Ready.

A truncate waits the same way, on the log starts its leader's followers
acknowledge (``Replica.start_waiters``, few: a plain list): it is answered
once a majority of the voters, the leader counted, hold a start at least
its own. Why a majority suffices: a later leader won the votes of a
majority, so one of its voters holds the new start, and a vote reply
carries the voter's start; the winner takes the largest before it serves
a read below it (``steps.win``, ``Replica.serves_from``). A truncate waits
as long as a produce, so one queue of deadlines still serves both.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from ring.replication import protocol
from ring.replication.election import majority
from ring.replication.replica import Replica


class _Waiter:
    __slots__ = ("token", "done")

    def __init__(self, token: Any) -> None:
        self.token = token
        self.done = False


class AckWaiters:
    def __init__(self) -> None:
        self.released: list[tuple[Any, BaseException | None]] = []
        self._deadlines: deque[tuple[float, _Waiter]] = deque()
        self._seq = 0

    def add(self, rep: Replica, token: Any, end: int, level: str, deadline: float) -> None:
        if protocol.replicas_reaching(rep.voter_ends(), end) >= protocol.needed_acks(level, max(1, len(rep.voters))):
            self.released.append((token, None))
            return
        waiter = _Waiter(token)
        self._seq += 1
        heapq.heappush(rep.ack_waiters.setdefault(level, []), (end, self._seq, waiter))
        self._deadlines.append((deadline, waiter))

    def add_start(self, rep: Replica, token: Any, start: int, deadline: float) -> None:
        """Release ``token`` once a majority of ``rep``'s voters hold a log start of at least ``start``."""
        if rep.voters_starting_at(start) >= majority(max(1, len(rep.voters))):
            self.released.append((token, None))
            return
        waiter = _Waiter(token)
        rep.start_waiters.append((start, waiter))
        self._deadlines.append((deadline, waiter))

    def check(self, rep: Replica) -> None:
        """``rep``'s durable ends or log starts moved: release the waiters they satisfy."""
        if rep.start_waiters:
            self._check_starts(rep)
        ends = sorted(rep.voter_ends(), reverse=True)
        waiting = rep.ack_waiters
        for level in list(waiting):
            needed = protocol.needed_acks(level, max(1, len(rep.voters)))
            reached = ends[needed - 1]  # ``needed`` voters hold everything below this
            heap = waiting[level]
            while heap and heap[0][0] <= reached:
                self._release(heapq.heappop(heap)[2], None)
            if not heap:
                del waiting[level]
        deadlines = self._deadlines
        while deadlines and deadlines[0][1].done:  # released ones leave at once, not at their deadline
            deadlines.popleft()

    def _check_starts(self, rep: Replica) -> None:
        needed = majority(max(1, len(rep.voters)))
        waiting = []
        for start, waiter in rep.start_waiters:
            if waiter.done:
                continue
            if rep.voters_starting_at(start) >= needed:
                self._release(waiter, None)
            else:
                waiting.append((start, waiter))
        rep.start_waiters = waiting

    def fail(self, rep: Replica, exc: BaseException) -> None:
        starts, rep.start_waiters = rep.start_waiters, []
        for _, waiter in starts:
            self._release(waiter, exc)
        waiting, rep.ack_waiters = rep.ack_waiters, {}
        for heap in waiting.values():
            for _, _, waiter in heap:
                self._release(waiter, exc)

    def expire(self, now: float) -> float | None:
        """Fail the waiters whose deadline passed; the next deadline (None: none waits)."""
        deadlines = self._deadlines
        while deadlines and (deadlines[0][0] <= now or deadlines[0][1].done):
            self._release(deadlines.popleft()[1], TimeoutError())
        return deadlines[0][0] if deadlines else None

    def next_deadline(self) -> float | None:
        return self._deadlines[0][0] if self._deadlines else None

    def _release(self, waiter: _Waiter, exc: BaseException | None) -> None:
        if not waiter.done:
            waiter.done = True
            self.released.append((waiter.token, exc))
