"""Where a broker's produces and reads go when it is alone: here. ``Routing`` and ``LocalRouter``.

A broker routes every produce and read through its ``router`` (``Routing``,
the names the broker calls). ``LocalRouter`` is a broker alone's: every
partition is held and led here, a produce joins its partition's write of
this loop turn (``ring.replication.appends``: the router schedules the write
and carries out what follows it), at once or, when the partition's idempotent
producers are not ready for it, once they are (``append_awaited``), and is
answered once it is durable by the fsync policy (there are no other voters
to wait for), and a read is this broker's replica's, up to its high
watermark, long-polling there when asked to. A clustered broker's router
(``ring.cluster.routing.Router``) decides between here, the leader and a
live replica, and uses a ``LocalRouter`` for what it serves here.
``LocalRouter`` is given a ``LocalHost``, the names it uses of the broker;
it never imports the broker.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Awaitable, Callable, Protocol

from ring.catalog import TopicConfig
from ring.errors import OffsetOutOfRange, RingError, UnknownTopic
from ring.fetch import Fetch
from ring.offsets import EpochEnd, OffsetsAt, Truncate
from ring.produce import Produce
from ring.replication import reads
from ring.replication.appends import Appending, TurnAppends
from ring.replication.commit import GroupCommit
from ring.replication.intake import ProduceResult, result_of
from ring.replication.reads import Fetched, StoredRead, LongPolls
from ring.replication.replica import Replica


class LocalHost(Protocol):
    """What a ``LocalRouter`` uses of its broker."""

    turn: TurnAppends
    long_polls: LongPolls
    commits: GroupCommit  # idle(part): no fsync of the partition runs

    @property
    def closing(self) -> bool: ...

    def check_open(self) -> None:
        """Raise ``Unavailable`` while the broker shuts down."""

    def check_appendable(self, part: Replica) -> None:
        """Raise unless ``part`` may be appended to now (not deleted, not failed, the broker open)."""

    def check_writable(self, part: Replica) -> None:
        """``check_appendable``, and the router's own check (a clustered broker: it still leads ``part``)."""

    def appended(self, part: Replica, end: int) -> bool:
        """Batches were appended to ``part`` up to ``end`` (replication is told); whether they are durable
        now (the fsync policy needs no fsync for them)."""

    def replica_of(self, topic: str, partition: int) -> Replica:
        """The replica held here; UnknownTopic / UnknownPartition / Unavailable (not held here)."""

    def partitions_held(self, topic: str) -> dict[int, Replica]: ...

    def start_moved(self, part: Replica) -> None:
        """The leader moved ``part``'s log start offset (replication tells the followers)."""


class Routing(Protocol):
    """What a broker asks its router: where each produce and read goes, and what it may answer."""

    def check_accepting(self) -> None:
        """Raise unless produces are taken now (``ring.replication.intake``)."""

    def accepting_at_once(self) -> bool: ...

    def unkeyed_partition(self, cfg: TopicConfig) -> int: ...

    def produce_partition(self, req: Produce, cfg: TopicConfig, p: int,
                          batches: list[bytearray]) -> Appending | Awaitable[ProduceResult]:
        """``ring.replication.intake.IntakeRouting.produce_partition``."""

    def check_writable(self, part: Replica) -> None: ...

    def forget(self, topic: str) -> None: ...

    def fetch(self, req: Fetch) -> Fetched:
        """The read answered at once, or an awaitable of it (``reads.settled`` gives either)."""

    async def offsets(self, req: OffsetsAt) -> dict[str, Any]: ...

    def epoch_end(self, req: EpochEnd) -> tuple[int, int]:
        """(epoch, end offset) of ``req.leader_epoch`` on the partition's leader (``reads.epoch_end``)."""

    async def truncate(self, req: Truncate) -> dict[str, Any]: ...


Refuse = Callable[[Appending, RingError], None]
Acknowledge = Callable[[Replica, list[Appending]], None]


def join_turn(host: LocalHost, part: Replica, batches: list[bytearray], needed: int, req: Produce, refuse: Refuse,
              acknowledge: Acknowledge, prepared: bool = False) -> Appending | None:
    """``batches`` of ``req`` queued for the partition's write of this turn (``TurnAppends.add``), the
    turn's first produce scheduling it (``write_turn``, with the router's ``refuse`` and ``acknowledge``);
    None when they must take the awaited way (``append_awaited``)."""
    first = part.appends is None
    pending = host.turn.add(part, batches, needed, req, prepared)
    if first and pending is not None:
        asyncio.get_running_loop().call_soon(write_turn, host, part, refuse, acknowledge)
    return pending


async def append_awaited(host: LocalHost, part: Replica, batches: list[bytearray], needed: int, req: Produce,
                         refuse: Refuse, acknowledge: Acknowledge) -> ProduceResult:
    """A produce that could not join its partition's turn write at once joins it once it may: after the
    partition's earlier idempotent appends, with its producer table caught up (``ProducerStates.turn``),
    while the broker says the partition may still be written (``check_writable``). The one append path:
    the same write, durability and acknowledgements as a produce that joined at once."""
    host.check_appendable(part)
    producers = host.turn.producers
    turn = await producers.turn(part, batches)
    try:
        host.check_writable(part)  # (no await from here to the queueing)
        pending = join_turn(host, part, batches, needed, req, refuse, acknowledge, prepared=True)
    finally:
        producers.end_turn(turn)
    assert pending is not None, "a partition that may be written takes a prepared produce"
    return await result_of(part.topic, pending)


def write_turn(host: LocalHost, part: Replica, refuse: Refuse,
               acknowledge: Acknowledge) -> None:
    """The partition's write of this turn (``TurnAppends.write``), as both routers carry it out: while
    the broker says it may still be written (``check_writable``; else each produce goes to ``refuse``
    with the reason); replication is told; once the batches are durable by the fsync policy (at once,
    or after the turn's group commit under ``always``) its produces go to
    ``acknowledge``, which answers each once its level's voters hold it."""
    try:
        host.check_writable(part)  # (no await from here to the append)
    except RingError as exc:
        for a in host.turn.take(part):
            refuse(a, exc)
        return
    end, pending = host.turn.write(part)
    if host.appended(part, end):
        acknowledge(part, pending)
    else:
        host.commits.sync_soon(part).add_done_callback(
            lambda synced: acknowledge(part, host.turn.synced(pending, synced)))


class LocalRouter:
    def __init__(self, host: LocalHost) -> None:
        self.host = host
        self._round_robin: dict[str, itertools.count] = {}  # topic -> unkeyed produces so far

    # --- produce -------------------------------------------------------------------------

    def check_accepting(self) -> None:
        self.host.check_open()

    def accepting_at_once(self) -> bool:
        return not self.host.closing

    def next_unkeyed(self, topic: str) -> int:
        """How many unkeyed produces to ``topic`` went before this one (round-robin)."""
        return next(self._round_robin.setdefault(topic, itertools.count()))

    def forget(self, topic: str) -> None:
        """``topic`` is gone: a topic of that name made later starts its round-robin afresh."""
        self._round_robin.pop(topic, None)

    def unkeyed_partition(self, cfg: TopicConfig) -> int:
        return self.next_unkeyed(cfg.name) % cfg.partitions

    def produce_partition(self, req: Produce, cfg: TopicConfig, p: int,
                          batches: list[bytearray]) -> Appending | Awaitable[ProduceResult]:
        """This turn's write to the partition (the turn's first produce schedules it, ``write_turn``), or
        the awaited way into it when the turn will not take it at once (``append_awaited``). A produce the
        write refuses fails with the reason."""
        part = self.host.replica_of(cfg.name, p)
        pending = join_turn(self.host, part, batches, 1, req, Appending.set_exception, self._acknowledge)
        if pending is None:
            return append_awaited(self.host, part, batches, 1, req, Appending.set_exception, self._acknowledge)
        return pending

    def _acknowledge(self, part: Replica, pending: list[Appending]) -> None:
        """A broker alone never waits for others: its own durable end suffices."""
        for a in self.host.turn.release_held(part, pending):
            a.set_result(None)

    def check_writable(self, part: Replica) -> None:
        """Nothing beyond the broker's own checks: every partition is led here."""

    # --- reads ---------------------------------------------------------------------------

    def check_offset(self, part: Replica, offset: int) -> None:
        """``reads.check_offset``, but on a follower offsets up to the high watermark its leader told
        it are in range even past its own log end (it lags): a fetch there waits, or answers empty,
        like one at the high watermark, until the records arrive. (A replica nobody leads elsewhere
        never hears of a high watermark beyond its own, so alone this is ``reads.check_offset``.)"""
        if not part.is_leader and part.log.start_offset <= offset <= part.leader_hw:
            return
        reads.check_offset(part, offset)

    def fetch(self, req: Fetch) -> Fetched:
        """The read, at once when records are there or no wait was asked for; else (a long poll at
        the high watermark) an awaitable of it. A bad offset raises here, before any wait."""
        return self.read(self.host.replica_of(req.topic, req.partition), req)

    def read(self, part: Replica, req: Fetch) -> Fetched:
        """``fetch`` of a replica held here, already found (its topic and partition checked)."""
        offset = part.log.start_offset if req.offset is None else req.offset
        self.check_offset(part, offset)
        if offset >= part.hw and req.wait_ms > 0 and not self.host.closing:
            return self._after_wait(part, offset, req)
        return reads.read(part, offset, req.max_bytes, req.max_records)

    async def _after_wait(self, part: Replica, offset: int, req: Fetch) -> StoredRead:
        host = self.host
        await host.long_polls.wait(part, offset, req.wait_ms, lambda: host.closing)
        self.check_offset(part, offset)  # a truncate may have moved the start
        return reads.read(part, offset, req.max_bytes, req.max_records)

    def offset_for_timestamp(self, req: OffsetsAt) -> dict[str, Any]:
        """First offset with a timestamp at or after ``req.at`` (``ring.replication.reads``), and the leader
        epoch of the batch holding it (the latest epoch for the log end; -1 where none is known)."""
        part = self.host.replica_of(req.topic, req.partition)
        offset = reads.offset_for_timestamp(part, req.at)
        return {"topic": req.topic, "partition": req.partition, "timestamp": str(req.at), "offset": offset,
                "leader_epoch": part.log.epoch_at(offset)}

    async def offsets(self, req: OffsetsAt) -> dict[str, Any]:
        return self.offset_for_timestamp(req)

    def epoch_end(self, req: EpochEnd) -> tuple[int, int]:
        return reads.epoch_end(self.host.replica_of(req.topic, req.partition), req)

    async def truncate(self, req: Truncate) -> dict[str, Any]:
        """Delete records below ``req.before_offset`` (Kafka's deleteRecords) from this broker's log."""
        topic, partition, before_offset = req
        part = self.host.replica_of(topic, partition)
        await self.host.commits.idle(part)  # the log is single-threaded: never beside an fsync
        if part.deleted:
            raise UnknownTopic(f"topic {part.topic!r} was deleted", topic=part.topic)
        if not 0 <= before_offset <= part.hw:
            raise OffsetOutOfRange(
                f"before_offset {before_offset} is beyond the high watermark {part.hw}",
                topic=topic, partition=partition, earliest=part.log.start_offset, latest=part.hw)
        if before_offset > part.log.start_offset:
            part.log.truncate_before(before_offset)
            self.host.start_moved(part)
        return {"topic": topic, "partition": partition, "earliest_offset": part.log.start_offset}
