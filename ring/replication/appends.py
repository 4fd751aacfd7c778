"""The leader's produce path without a task: one log write per partition per event-loop turn.

A produce that needs nothing awaited before its append (its topic exists,
this broker leads the partition, no producer table has to be built) hands
its batches to ``TurnAppends.add`` and gets an ``Appending`` back at once: a
future-like object that is done when the consistency level's
acknowledgements are in. Every produce to one partition in one loop turn
joins the same list; on the next turn ``_write`` runs once for the list: it
checks the partition may still be written, stamps every batch with its
offsets, writes them all with one ``os.write``
(``PartitionLog.append_batches``), tells replication once (so one append
frame per follower carries the whole turn's records), makes them durable by
the fsync policy (at once, or by one group-commit fsync for the turn under
``always``), and then releases each produce as its acknowledgements arrive
(the node core's ack waiters, ``ring/node/waiters.py``, resolve the
``Appending`` itself in the Ready of the step that moved the ends, and its
callback writes the answer at once: no second future, no task, no timer, no
extra loop turn).

Order and guarantees are the awaited path's: produces are written in the
order they joined the turn; an idempotent batch is checked against its
producer's table right before its own write, after the writes of everything
before it (so a retry in the same turn as its original is recognised); the
answer waits for the same durable ends. A partition that stopped being
writable between the request and its turn fails the produces with the error
the awaited path would raise (``not_leader`` sends them back there, to
follow the new leader).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from ring.errors import RequestTimeout, RingError
from ring.log import batch as batchfmt
from ring.produce import Produce
from ring.replication import protocol
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")


class Appending:
    """One produce's batches on their way into a partition, and its wait for acknowledgements.

    It is its own future (the part of ``asyncio.Future`` the replica's waiters and the front use:
    ``done``, ``set_result``, ``set_exception``, ``add_done_callback``), with one difference: a
    callback runs as soon as the outcome is set, not on a later loop turn, so the answer to a
    produce leaves in the same turn as its acknowledgement (or its write, when that suffices).
    Callbacks must not raise; one that does is logged.
    """

    __slots__ = ("part", "batches", "needed", "request", "base", "count", "idempotent", "_done", "_exc",
                 "_callbacks")

    def __init__(self, part: Replica, batches: list[bytearray], needed: int, request: Produce,
                 idempotent: bool) -> None:
        self.part = part
        self.batches = batches
        self.needed = needed  # voters (this broker included) that must hold the batches
        self.request = request  # the produce the batches are of, its consistency resolved
        self.base = -1
        self.count = 0
        self.idempotent = idempotent
        self._done = False
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Appending], None]] = []

    @property
    def partition(self) -> int:
        return self.part.index

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, _: object) -> None:
        self._finish(None)

    def set_exception(self, exc: BaseException) -> None:
        self._finish(exc)

    def add_done_callback(self, fn: Callable[[Appending], None]) -> None:
        if self._done:
            fn(self)
        else:
            self._callbacks.append(fn)

    def _finish(self, exc: BaseException | None) -> None:
        assert not self._done, "an outcome is set once"
        self._done, self._exc = True, exc
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("a produce's callback failed")

    def result(self) -> tuple[int, int]:
        """(base offset, record count) once acknowledged; what the awaited path raises otherwise."""
        assert self._done
        if isinstance(self._exc, TimeoutError):
            raise ack_timeout(self.part, self.base, self.base + self.count, self.needed, self.request)
        if self._exc is not None:
            raise self._exc
        return self.base, self.count


def ack_timeout(rep: Replica, base: int, end: int, needed: int, req: Produce) -> RequestTimeout:
    have = protocol.replicas_reaching(rep.voter_ends(), end)
    return RequestTimeout(
        f"{rep.topic}/{rep.index}: {have} of {needed} replicas acknowledged offsets {base}-{end - 1} "
        f"within {req.ack_timeout_ms} ms (consistency={req.consistency}); the outcome is unknown",
        topic=rep.topic, partition=rep.index, acknowledged=have, needed=needed)


class TurnAppends:
    """The produces of this loop turn, per partition, and the write that takes them on the next turn.

    ``host`` is the broker: ``check_writable``, ``producers``, ``appended`` (replication is told, and
    what was written is durable at once under a policy that needs no fsync for it), ``sync_soon`` (the
    group commit, under ``always``), ``await_acks`` (a produce waits for its level's voters) and
    ``refused`` (what to do with a produce its partition no longer takes).
    """

    def __init__(self, host: Any) -> None:
        self.host = host

    def add(self, part: Replica, batches: list[bytearray], needed: int, req: Produce) -> Appending | None:
        """Queue ``batches`` for this turn's write to ``part``; None when they must take the awaited path."""
        host = self.host
        if part.deleted or part.failed:
            return None
        idempotent = False
        for b in batches:
            if batchfmt.producer_id(b) >= 0:
                idempotent = True
                if not host.producers.ready(part, batches):
                    return None
                break
        a = Appending(part, batches, needed, req, idempotent)
        if part.appends is None:
            part.appends = [a]
            asyncio.get_running_loop().call_soon(self._write, part)
        else:
            part.appends.append(a)
        return a

    def _write(self, part: Replica) -> None:
        pending, part.appends = part.appends, None
        if not pending:
            return
        host = self.host
        try:
            host.check_writable(part)
        except RingError as exc:
            for a in pending:
                host.refused(a, exc)
            return
        group: list[Appending] = []
        for a in pending:
            if a.idempotent:  # judged against everything written before it, then written alone
                self._write_group(part, group)
                group = []
                self._write_idempotent(part, a)
            else:
                group.append(a)
        self._write_group(part, group)
        if host.appended(part, part.log.end_offset):
            self._acknowledge(part, pending)
        else:  # fsync always: the group commit first (one fsync for the turn), as the awaited path
            host.sync_soon(part).add_done_callback(lambda synced: self._synced(part, pending, synced))

    def _synced(self, part: Replica, pending: list[Appending], synced: asyncio.Future) -> None:
        exc = synced.exception() if not synced.cancelled() else asyncio.CancelledError()
        if exc is None:
            self._acknowledge(part, pending)
            return
        for a in pending:
            if not a.done():
                a.set_exception(exc)

    def _acknowledge(self, part: Replica, pending: list[Appending]) -> None:
        """Each produce, durable here, waits for the voters its level needs (released at once when
        they hold it already: this broker alone, or consistency one); the wait is the node core's
        (``host.await_acks``), counted against the voter set as it is when they do."""
        ends = sorted(part.voter_ends(), reverse=True)
        voters = max(1, len(part.voters))
        for a in pending:
            if a.done():
                continue
            end = a.base + a.count
            needed = protocol.needed_acks(a.request.consistency, voters)
            if needed <= len(ends) and ends[needed - 1] >= end:
                a.set_result(None)  # held by enough voters already (this broker alone, or one)
            else:
                self.host.await_acks(part, a, end)

    def _write_group(self, part: Replica, group: list[Appending]) -> None:
        if not group:
            return
        try:
            headers = part.log.append_batches([b for a in group for b in a.batches], part.epoch)
        except RingError as exc:
            for a in group:
                a.set_exception(exc)
            return
        producers = self.host.producers
        i = 0
        for a in group:
            first, i = i, i + len(a.batches)
            a.base, a.count = headers[first].base_offset, headers[i - 1].next_offset - headers[first].base_offset
            producers.appended(part, a.batches, a.base)

    def _write_idempotent(self, part: Replica, a: Appending) -> None:
        producers = self.host.producers
        try:
            dup = producers.check(part, a.batches)
            if dup is not None:  # a retry of batches written before: their offsets, nothing appended
                a.base, a.count = dup.base_offset, dup.count
                return
            base = part.log.end_offset
            part.log.append_batches(a.batches, part.epoch)
        except RingError as exc:
            a.set_exception(exc)
            return
        producers.appended(part, a.batches, base)
        a.base, a.count = base, part.log.end_offset - base

