"""Reads of a partition replica: offset checks, reads below the high watermark, long-poll waits
and timestamp lookups.

A fetch never returns data at or above the replica's high watermark, and a
long-poll waits on the replica's waiter (set when the high watermark moves)
until its deadline, the partition's deletion or the broker's shutdown. The
number of open long-polls is bounded (``LONG_POLLS_OPEN_MAX``); one more is
refused with ``Overloaded`` (429).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, NamedTuple, Union

from ring import limits
from ring.clock import Clock
from ring.errors import FencedLeaderEpoch, NotLeader, OffsetOutOfRange, Overloaded, UnknownLeaderEpoch, UnknownTopic
from ring.offsets import EARLIEST, LATEST, At, EpochEnd
from ring.replication.replica import Replica


class StoredRead(NamedTuple):  # made per fetch: a tuple is cheaper to make than a frozen dataclass
    topic: str
    partition: int
    offset: int  # the requested offset; ``data`` may start with a batch below it
    data: bytes  # whole stored batches, all below high_watermark
    high_watermark: int
    earliest_offset: int


Fetched = Union[StoredRead, Awaitable[StoredRead]]
"""What a fetch gives: its result at once, or (a long poll, a read another replica answers) an awaitable of it."""


async def settled(got: Fetched) -> StoredRead:
    """A fetch's result, awaited if it was not there at once."""
    return got if isinstance(got, StoredRead) else await got


def check_offset(part: Replica, offset: int) -> None:
    """Raise ``OffsetOutOfRange`` (naming the earliest and latest) unless ``part``'s log holds ``offset``
    or ends at it."""
    start, end = part.log.start_offset, part.log.end_offset
    if not start <= offset <= end:
        where = "below the earliest" if offset < start else "above the latest"
        raise OffsetOutOfRange(
            f"offset {offset} is {where} offset of {part.topic}/{part.index} "
            f"(earliest {start}, latest {end})",
            topic=part.topic, partition=part.index, earliest=start, latest=end)


def read(part: Replica, offset: int, max_bytes: int, max_records: int | None = None) -> StoredRead:
    """Whole batches from ``offset``, all below the high watermark (none when it is at or past it), and
    with ``max_records`` none past the one holding the last of that many records from ``offset``: a
    small fetch checks the few batches it answers, not ``max_bytes`` of them."""
    hw = part.hw
    upto = hw if max_records is None else min(hw, offset + max_records)
    data = b"" if offset >= hw else part.log.read(offset, max_bytes, upto=upto)
    return StoredRead(part.topic, part.index, offset, bytes(data), hw, part.log.start_offset)


def offset_for_timestamp(part: Replica, at: At) -> int:
    """First offset with a timestamp at or after ``at`` (ms, or EARLIEST/LATEST: ``ring.offsets``).

    When every record is older, the answer is the high watermark: reading
    from there yields exactly the records that arrive later.
    """
    if at == EARLIEST:
        return part.log.start_offset
    if at == LATEST:
        return part.hw
    assert type(at) is int, at
    found = part.log.offset_for_timestamp(at, upto=part.hw)
    return part.hw if found is None else found


def check_leader_epoch(topic: str, partition: int, current: int, known: int) -> None:
    """Refuse a request whose sender's metadata names leader epoch ``current`` (-1: no check) where this
    broker knows ``known`` (-1: none): an older one is fenced, a newer one not heard of here yet."""
    if current < 0 or current == known:
        return
    if current < known:
        raise FencedLeaderEpoch(f"leader epoch {current} of {topic}/{partition} is older than its current "
                                f"epoch {known}; refresh metadata", topic=topic, partition=partition,
                                current_leader_epoch=known)
    raise UnknownLeaderEpoch(f"leader epoch {current} of {topic}/{partition} is newer than the epoch {known} "
                             "known here; retry", topic=topic, partition=partition, current_leader_epoch=known)


def epoch_end(part: Replica, req: EpochEnd) -> tuple[int, int]:
    """(epoch, end offset) of ``req.leader_epoch`` in ``part``'s log (``PartitionLog.epoch_end``), on its
    leader only: a follower's history may still hold what its leader cut."""
    if not part.is_leader:
        raise NotLeader(f"{part.self_name} does not lead {part.topic}/{part.index} (leader: {part.leader})",
                        topic=part.topic, partition=part.index, leader=part.leader)
    check_leader_epoch(part.topic, part.index, req.current_leader_epoch, part.epoch)
    return part.log.epoch_end(req.leader_epoch)


class LongPolls:
    """Fetches waiting for data, counted so their number stays bounded."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.open = 0

    async def wait(self, part: Replica, offset: int, wait_ms: int, closing: Callable[[], bool]) -> None:
        """Return once ``part``'s high watermark is past ``offset``, ``wait_ms`` have passed or the broker
        is ``closing``; raise ``UnknownTopic`` if the partition was deleted meanwhile."""
        if self.open >= limits.LONG_POLLS_OPEN_MAX:
            raise Overloaded(f"{limits.LONG_POLLS_OPEN_MAX} long-polls are open; retry later")
        deadline = self.clock.monotonic() + wait_ms / 1000
        self.open += 1
        try:
            while part.hw <= offset and not part.deleted and not closing():
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    break
                if part.waiter is None:
                    part.waiter = asyncio.get_running_loop().create_future()
                await asyncio.wait({part.waiter}, timeout=remaining)
        finally:
            self.open -= 1
        if part.deleted:
            raise UnknownTopic(f"topic {part.topic!r} was deleted", topic=part.topic)
