"""The leader's produce path: one log write per partition per event-loop turn, every produce's.

Every produce a broker appends as a partition's leader is queued by the
broker's router with ``TurnAppends.add`` (``ring.replication.local.join_turn``),
which gives an ``Appending`` back: a future-like object that is done when
the consistency level's acknowledgements are in. A produce that needs
nothing awaited first (its topic exists, this broker leads the partition,
no producer table has to be built) is queued at once, with no task; one of
idempotent batches whose producer table is not ready waits for the
partition's earlier idempotent appends and the table first
(``ring.replication.local.append_awaited``), then is queued ``prepared``.
Every produce to one partition in one loop turn joins the same list; the
first one's router schedules the partition's write for the next turn,
which checks the partition may still be written and calls
``TurnAppends.write`` once for the list: it stamps every batch with its
offsets and writes them all with one ``os.write``
(``PartitionLog.append_batches``), and returns the log's end and the
produces. The router then tells replication once (so one append frame per
follower carries the whole turn's records), makes them durable by the fsync
policy (at once, or by one group-commit fsync for the turn under
``always``), and releases each produce as its acknowledgements arrive:
``release_held`` answers those enough voters hold already and returns the
others, for which the router registers the node core's ack waiters
(``ring/node/waiters.py``); they resolve the ``Appending`` itself in the
Ready of the step that moved the ends, and its callback writes the answer
at once: no second future, no task, no timer, no extra loop turn. Nothing
here calls the router or the broker: what happened travels back as return
values and through the ``Appending`` futures.

Produces are written in the order they joined the turn; an idempotent batch
is checked against its producer's table right before its own write, after
the writes of everything before it (so a retry in the same turn as its
original is recognised). A partition that stopped being writable between
the request and its turn fails the produces with the reason (a router sends
``not_leader`` on to follow the new leader).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ring.errors import RequestTimeout, RingError
from ring.log import batch as batchfmt
from ring.produce import Produce
from ring.replication import protocol
from ring.replication.idempotence import ProducerStates
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
        """(base offset, record count) once acknowledged; else its error (``ack_timeout`` for a wait for
        acknowledgements that timed out)."""
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
    """The produces of this loop turn, per partition (``part.appends``), and the write that takes them.

    Its caller is the broker's router (``ring.replication.local.LocalRouter``, ``ring.cluster.routing.Router``),
    which decides a produce is this broker's to write: it queues each produce with ``add`` and, for the
    first of a partition's turn (``part.appends`` was None), schedules the partition's write on the next
    loop turn. There it checks the partition may still be written and calls ``write`` (or ``take``, to
    refuse the turn's produces, none written), which returns what it did; the caller tells replication,
    makes the batches durable by the fsync policy, and calls ``release_held``, which answers the produces
    their level's voters hold already and returns the others, whose waits the caller registers.
    ``producers`` is the partition layer's table of idempotent producers (``ring.replication.idempotence``).
    """

    def __init__(self, producers: ProducerStates) -> None:
        self.producers = producers

    def add(self, part: Replica, batches: list[bytearray], needed: int, req: Produce,
            prepared: bool = False) -> Appending | None:
        """Queue ``batches`` for the turn's write to ``part``; None when they must take the awaited path
        (``ring.replication.local.append_awaited``): the partition was deleted or failed, or its idempotent
        producers are not ``ready`` for them, unless the awaited path ``prepared`` them (it holds their
        turn, ``ProducerStates.turn``: what is left of the table to catch up the write's check finishes)."""
        if part.deleted or part.failed:
            return None
        idempotent = False
        for b in batches:
            if batchfmt.producer_id(b) >= 0:
                idempotent = True
                if not prepared and not self.producers.ready(part, batches):
                    return None
                break
        a = Appending(part, batches, needed, req, idempotent)
        if part.appends is None:
            part.appends = [a]
        else:
            part.appends.append(a)
        return a

    def take(self, part: Replica) -> list[Appending]:
        """The turn's produces to ``part``, taken off it unwritten (its caller refuses them)."""
        pending, part.appends = part.appends, None
        return pending or []

    def write(self, part: Replica) -> tuple[int, list[Appending]]:
        """Write the turn's produces to ``part``, in the order they joined it; the log's end after them,
        and the produces. Each is done when its write failed (the log's error), else it has its offsets
        (``base``, ``count``: its own, or for a retry of idempotent batches written before, theirs) and
        waits for them to be durable and acknowledged."""
        pending, part.appends = part.appends, None
        assert pending, "a partition's write is scheduled by the first produce of its turn"
        group: list[Appending] = []
        for a in pending:
            if a.idempotent:  # judged against everything written before it, then written alone
                self._write_group(part, group)
                group = []
                self._write_idempotent(part, a)
            else:
                group.append(a)
        self._write_group(part, group)
        return part.log.end_offset, pending

    def release_held(self, part: Replica, pending: list[Appending]) -> list[Appending]:
        """Once the turn's produces are durable here: answer each that enough voters hold already (this
        broker alone, or consistency one), counted against the voter set as it is now; the others, which
        wait for the voters their level needs to hold offsets below ``base + count``."""
        ends = sorted(part.voter_ends(), reverse=True)
        voters = max(1, len(part.voters))
        waiting = []
        for a in pending:
            if a.done():
                continue
            needed = protocol.needed_acks(a.request.consistency, voters)
            if needed <= len(ends) and ends[needed - 1] >= a.base + a.count:
                a.set_result(None)  # held by enough voters already (this broker alone, or one)
            else:
                waiting.append(a)
        return waiting

    @staticmethod
    def synced(pending: list[Appending], synced: asyncio.Future) -> list[Appending]:
        """The turn's produces to acknowledge once its group commit is done: all of them when it made
        them durable; none when it failed, and each produce not answered yet fails with its error."""
        exc = synced.exception() if not synced.cancelled() else asyncio.CancelledError()
        if exc is None:
            return pending
        for a in pending:
            if not a.done():
                a.set_exception(exc)
        return []

    def _write_group(self, part: Replica, group: list[Appending]) -> None:
        if not group:
            return
        try:
            headers = part.log.append_batches([b for a in group for b in a.batches], part.epoch)
        except RingError as exc:
            for a in group:
                a.set_exception(exc)
            return
        producers = self.producers
        i = 0
        for a in group:
            first, i = i, i + len(a.batches)
            a.base, a.count = headers[first].base_offset, headers[i - 1].next_offset - headers[first].base_offset
            producers.appended(part, a.batches, a.base)

    def _write_idempotent(self, part: Replica, a: Appending) -> None:
        producers = self.producers
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

