"""A group member's poll: records from the partitions it holds, from where it left off, long-polling when none.

The coordinator reads on the member's behalf through the broker's own fetch
(any replica, below the high watermark; proxied when this broker holds no
replica), so a consumer needs one URL and no partition bookkeeping. Each
partition is read from the member's position (past what it acknowledged), else
the group's committed offset, else the member's reset policy (earliest or
latest, pinned at the first poll so later records are not missed). A
committed offset that retention or truncation left behind starts again at
the earliest offset; one past the end of the log (a topic deleted and created
again keeps the group's offsets) where the reset policy says, as Kafka's
``auto.offset.reset`` would, "latest" being the high watermark (never past
records still being replicated).

The starting partition rotates from poll to poll so one busy partition cannot
starve the others. A poll reads at most ``GROUP_POLL_BYTES_MAX`` of stored
batches in all (and no more than the broker's budget of fetch answers leaves
room for), so its records and its answer stay about that size however many
partitions the member holds (``GROUP_POLL_BATCHES_BYTES_MAX`` for an answer of stored batches,
whose size is that of what it read). When nothing is there, up to ``GROUP_POLL_WAIT_PARTITIONS_MAX``
partitions are long-polled at once and the first with records answers; a
rebalance of the group ends the wait early (the member then hears that its
generation is stale). Polls of one member run one at a time, and a poll is
answered only if the group is still at the generation it started in: records
read across a rebalance are not handed out, positions stay where they were,
and the member is told to join again.

A poll first acknowledges the answer its token names (``delivery``), then,
with auto commit, commits the positions, then reads. What it reads moves no
position: its answer is remembered under the token it returns, until a
later request acknowledges it. Acknowledging outside a poll (a commit of
positions, a leave) does not wait for a poll in progress: if it moves a
position that poll read from, that poll's answer no longer applies there
and its records past the position come again.

A poll answers with decoded records, or (``batches``) with the stored batches
that hold them and, per partition, the offsets they hand out: a fetch's own
bytes, no record decoded or encoded on the broker.

A poll may read only the member's partitions one broker leads
(``GroupPoll.leader``): PolarStreams' consumers poll every broker, and each
answers from the partitions it leads, so no two brokers hand out the same
records.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Awaitable, Callable, Iterable, NamedTuple

from ring import answer_budget, limits
from ring.errors import Conflict, RingError, Unavailable
from ring.fetch import Fetch
from ring.group_requests import GroupPoll
from ring.groups import delivery
from ring.groups.assignment import TopicPartition
from ring.groups.driver import Coordinator
from ring.groups.group import Group, Member
from ring.log.selection import select_batches, select_records  # the fetch's own selection
from ring.log.batch import Record
from ring.offsets import OffsetsAt
from ring.replication.reads import settled

log = logging.getLogger("ring.groups")


class PolledBatches(NamedTuple):
    """Stored batches of one partition a poll hands out: the records ``start <= offset < end`` in them."""

    topic: str
    partition: int
    start: int
    end: int
    data: bytes | memoryview


def _settled(fut: asyncio.Future) -> None:
    """A commit's outcome is its poll's; one whose poll is gone is not an error left unread."""
    if not fut.cancelled():
        fut.exception()


def _led_by(broker: Any, name: str) -> Callable[[TopicPartition], bool]:
    """Whether a partition's leader, as this broker knows it, is the broker ``name``."""
    leader_of = getattr(broker, "leader_of", None)
    if leader_of is None:  # a broker alone leads everything
        return lambda tp: name == broker.config.name
    return lambda tp: leader_of(tp[0], tp[1]) == name


@dataclass(frozen=True)
class Polled:
    records: list[tuple[str, int, Record, bool]]  # (topic, partition, record, value is JSON)
    generation: int
    token: str  # names this answer: the client's next request acknowledges it by naming it
    partitions: int = 0  # of the member's partitions, how many this poll read (a ``leader`` may leave some out)
    batches: list[PolledBatches] = field(default_factory=list)  # a poll for stored batches: these, no records

    def topics(self) -> Iterable[str]:
        """The topic of each record handed out, one per record."""
        for t, _, _, _ in self.records:
            yield t
        for b in self.batches:
            yield from repeat(b.topic, b.end - b.start)


@dataclass
class _Read:
    """What one poll read: records, and per partition where it started and where the next read would."""

    records: list[tuple[str, int, Record, bool]]
    starts: dict[TopicPartition, int]
    ends: dict[TopicPartition, int]
    pinned: dict[TopicPartition, int]  # starts chosen by the reset policy: kept whatever becomes of the answer,
    # unless a reset or a seek during the poll set a start first
    raw: bool = False  # hand out stored batches (``batches``), not records
    batches: list[PolledBatches] = field(default_factory=list)
    count: int = 0  # records handed out, in ``records`` or ``batches``

    @property
    def bytes_max(self) -> int:
        return limits.GROUP_POLL_BATCHES_BYTES_MAX if self.raw else limits.GROUP_POLL_BYTES_MAX

    def add(self, tp: TopicPartition, start: int, got: list[tuple[Record, bool]] | bytes | memoryview, end: int,
            count: int) -> None:
        if not count:
            return
        if not isinstance(got, list):
            self.batches.append(PolledBatches(tp[0], tp[1], start, end, got))
        else:
            self.records.extend((tp[0], tp[1], r, j) for r, j in got)
        self.count += count


@dataclass
class _MemberSlot:
    lock: asyncio.Lock
    users: int = 0
    rotation: int = 0


class Poller:
    def __init__(self, coordinator: Coordinator) -> None:
        self.coord = coordinator
        self.broker = coordinator.broker
        self._slots: dict[tuple[str, str], _MemberSlot] = {}

    async def poll(self, req: GroupPoll) -> Polled:
        key = (req.group, req.consumer)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _MemberSlot(asyncio.Lock())
        slot.users += 1
        try:
            async with slot.lock:
                return await self._poll(slot, req)
        finally:
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(key, None)

    async def acknowledge(self, group: str, member_id: str, generation: int | None, token: str | None) -> None:
        """Outside a poll: the client got the answer named ``token`` (409 for a stale member first)."""
        g, m = await self._member(group, member_id, generation)
        g.acknowledge(m, token)

    async def _member(self, group: str, member_id: str, generation: int | None) -> tuple[Group, Member]:
        _, _, g = await self.coord.group(group)
        g = g or Group(group)
        return g, g.member(member_id, generation, self.coord.clock.monotonic())

    async def _poll(self, slot: _MemberSlot, req: GroupPoll) -> Polled:
        clock = self.coord.clock
        group, member_id = req.group, req.consumer
        g, m = await self._member(group, member_id, req.generation)
        gen = g.generation
        g.acknowledge(m, req.token)
        commit = None
        if req.auto_commit and m.positions:
            # What the client acknowledged was processed (it asks for more): commit it, while reading.
            commit = asyncio.ensure_future(self.coord.change(group, lambda g: g.propose_poll_commit(
                g.member(member_id, gen, clock.monotonic()), clock.wall_ms())))
        m.polling += 1
        try:
            # A topic deleted since the assignment is not read (nor an error): the rebalance its
            # delete brings ends the wait, and a re-created one is the member's to join again.
            catalog = self.broker.catalog
            only = None if req.leader is None else _led_by(self.broker, req.leader)
            tps = [tp for tp in m.spec.assignment if (only is None or only(tp)) and tp[0] in catalog]
            read = await self._committing(commit, self._read(slot, g, tps, m, req.max_records, req.wait_ms,
                                                             req.batches))
        finally:
            m.polling -= 1
            m.last_seen = clock.monotonic()
            # A rebalance meanwhile made the member a new object that took this poll's count over
            # (``Group._set_members``): left there, the member could never expire.
            now_m = g.members.get(member_id)
            if now_m is not None and now_m is not m and now_m.polling > 0:
                now_m.polling -= 1
                now_m.last_seen = m.last_seen
        g2, m2 = await self._member(group, member_id, gen)
        if g2 is not g or m2 is not m:
            raise Unavailable(f"the coordinator of group {group!r} reloaded its state during the poll; poll again",
                              group=group)
        for tp, start in read.pinned.items():
            if g.start_offset(m, tp) is None:  # a reset or seek during the poll says where reading goes on
                m.positions[tp] = start
        answer = delivery.answer(gen, g.resets, ((t, p, read.starts[(t, p)], end)
                                                 for (t, p), end in read.ends.items()))
        g.hand_out(m, answer)
        return Polled(read.records, gen, answer.token, len(tps), read.batches)

    @staticmethod
    async def _committing(commit: asyncio.Future | None, reading: Awaitable[_Read]) -> _Read:
        """What ``reading`` read, once ``commit`` (the poll's implicit commit) is on a quorum too.

        The read does not wait for the commit: it starts from the member's positions, which the
        commit only copies into the committed offsets, so it reads the same either way. The answer
        goes out only after both: a commit refused (a stale generation, a coordinator that lost its
        leadership) fails the poll as it did before anything was read, and stops a read still
        long-polling; a read that failed fails the poll once the commit is settled."""
        if commit is None:
            return await reading
        commit.add_done_callback(_settled)  # it goes on if the poll is cancelled: a change once begun completes
        read = asyncio.ensure_future(reading)
        try:
            await asyncio.wait((commit, read), return_when=asyncio.FIRST_EXCEPTION)
            if commit.done() and commit.exception() is not None:
                read.cancel()
                await asyncio.gather(read, return_exceptions=True)
            await asyncio.shield(commit)  # its error first, as when the read came after it
        except BaseException:
            read.cancel()
            raise
        return read.result()

    async def _read(self, slot: _MemberSlot, g: Group, tps: list[TopicPartition], m: Member, max_records: int,
                    wait_ms: int, raw: bool) -> _Read:
        read = _Read([], {}, {}, {}, raw)
        if not tps:
            if wait_ms > 0:  # nothing to read until a rebalance gives this member something
                await asyncio.wait({self.coord.rebalanced(g.name)}, timeout=wait_ms / 1000)
            return read
        slot.rotation += 1
        k = slot.rotation % len(tps)
        tps = tps[k:] + tps[:k]
        failures: list[RingError] = []
        bytes_left = read.bytes_max
        for tp in tps:
            if read.count >= max_records or bytes_left <= 0:
                break
            try:
                start = await self._start(g, m, tp, read)
                got, nxt, size, count = await self._fetch(tp, start, max_records - read.count, bytes_left, 0,
                                                          read.ends, m.spec.reset, raw)
            except RingError as exc:
                failures.append(exc)
                continue
            read.add(tp, read.ends[tp], got, nxt, count)  # ends[tp]: where _fetch found a readable offset
            read.ends[tp] = nxt
            bytes_left -= size
        if failures and len(failures) == len(tps):
            raise failures[0]
        if read.count or wait_ms <= 0:
            return read
        return await self._wait(g, tps[: limits.GROUP_POLL_WAIT_PARTITIONS_MAX], read, max_records, wait_ms,
                                m.spec.reset)

    async def _wait(self, g: Group, tps: list[TopicPartition], read: _Read, max_records: int,
                    wait_ms: int, reset: str) -> _Read:
        positions = read.ends
        waits = {asyncio.ensure_future(self._fetch(tp, positions[tp], max_records, read.bytes_max,
                                                   wait_ms, None, reset, read.raw)): tp
                 for tp in tps if tp in positions}
        rebalance = self.coord.rebalanced(g.name)
        try:
            await asyncio.wait([*waits, rebalance], timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        bytes_left = read.bytes_max
        for task, tp in waits.items():
            if task.cancelled() or task.exception() is not None or read.count >= max_records or bytes_left <= 0:
                continue
            got, nxt, size, count = task.result()
            if isinstance(got, list):
                got = got[: max_records - read.count]
                count = len(got)
                nxt = got[-1][0].offset + 1 if got else nxt
            elif count > max_records - read.count:  # fewer records of the same batches
                nxt -= count - (max_records - read.count)
                count = max_records - read.count
            if count:
                read.add(tp, nxt - count, got, nxt, count)
                positions[tp] = nxt
                bytes_left -= size
        return read

    async def _start(self, g: Group, m: Member, tp: TopicPartition, read: _Read) -> int:
        start = g.start_offset(m, tp)
        if start is None:
            doc = await self.broker.offsets(OffsetsAt(tp[0], tp[1], m.spec.reset))
            start = int(doc["offset"])
            read.pinned[tp] = start  # "latest" means from this member's first poll on
        read.starts[tp] = read.ends[tp] = start
        return start

    async def _fetch(self, tp: TopicPartition, offset: int, max_records: int, max_bytes: int, wait_ms: int,
                     positions: dict[TopicPartition, int] | None, reset: str,
                     raw: bool = False) -> tuple[list[tuple[Record, bool]] | bytes | memoryview, int, int, int]:
        """Records of one partition from ``offset`` (``raw``: the stored batches holding them), the next
        offset, the stored bytes read and the record count; an offset below the earliest starts there,
        one past the end where the member's ``reset`` says."""
        max_bytes = answer_budget.budget_of(self.broker).grant(min(max_bytes, limits.FETCH_BYTES_DEFAULT))
        for _ in range(2):
            try:
                res = await settled(self.broker.fetch(Fetch(tp[0], tp[1], offset, max_bytes, wait_ms, max_records)))
            except RingError as exc:
                if exc.status != 416:
                    raise
                earliest = exc.extra.get("earliest")
                if isinstance(earliest, int) and offset < earliest:
                    moved = earliest
                else:  # past the end (a topic deleted and created again): out of range, as Kafka's
                    # consumer resets it. "latest" is the high watermark, not the replica's log end
                    # (the answer's "latest"), past which records are still being replicated.
                    moved = int((await self.broker.offsets(OffsetsAt(tp[0], tp[1], reset)))["offset"])
                log.info("%s/%d: offset %d is out of range; reading from %d", tp[0], tp[1], offset, moved)
                offset = moved
                if positions is not None:
                    positions[tp] = offset
                continue
            if raw:
                data, nxt, count = select_batches(res.data, offset, max_records, res.high_watermark)
                return data, nxt, len(res.data), count
            got, nxt = select_records(res.data, offset, max_records, res.high_watermark)
            return got, nxt, len(res.data), len(got)
        raise Conflict(f"{tp[0]}/{tp[1]}: no readable offset found", topic=tp[0], partition=tp[1])

