"""Durability of appends by the fsync policy, with group commit.

With ``always`` an append is durable once an fsync that started after it has
finished: the first append of a loop turn asks for a sync that starts on the
next turn, so every append of that turn rides along and ONE fsync (in a
thread) covers them all. Appends go on while an fsync runs (the log locks
each write, and the sync only its snapshot and bookkeeping); truncates and
closes wait for it with ``idle``. With ``interval:<ms>`` a background loop syncs the replicas with
unsynced bytes; with ``never`` only a clean close syncs. Either way the
replica's durable end (``Replica.set_durable``) is what replication counts:
after the fsync under ``always``, at once otherwise. It moves through
``on_durable`` (the clustered broker steps its node core there, so the high
watermark and the produces waiting for acknowledgements follow).

Under ``interval`` a second loop has the kernel start writing each log's new
bytes early (``WRITEBACK_START_BYTES``, checked every
``WRITEBACK_CHECK_INTERVAL_MS``), in a thread: an interval's fsync that finds
a whole second of writes still in the page cache holds up the appends beside
it for tens of milliseconds (in the log's ``write``), once a second.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from ring import limits
from ring.clock import Clock
from ring.errors import StorageError, UnknownTopic
from ring.log.fsync import FsyncPolicy
from ring.replication.replica import Replica

log = logging.getLogger("ring.broker")


class GroupCommit:
    def __init__(self, policy: FsyncPolicy, clock: Clock) -> None:
        self.policy = policy
        self.clock = clock
        self.on_durable: Callable[[Replica, int], None] = Replica.set_durable
        self.fsyncs = 0  # completed replica fsyncs, for status and for telling group commit works
        self.writebacks = 0  # writebacks the kernel started early on request (interval policy)

    @staticmethod
    async def idle(part: Replica) -> None:
        """Return when no fsync thread runs on ``part``."""
        while part.running_sync is not None:
            await asyncio.wait({part.running_sync})

    @staticmethod
    def busy(parts: Iterable[Replica]) -> list[asyncio.Future[None]]:
        """Syncs asked for or running on ``parts``: a clean close waits for them."""
        return [f for part in parts for f in (part.running_sync, part.next_sync) if f is not None]

    def durable_when_written(self) -> bool:
        """Whether the policy counts what is written durable at once (not ``always``: no fsync first)."""
        return self.policy.mode != "always"

    def sync_soon(self, part: Replica) -> asyncio.Future[None]:
        """A future resolved once an fsync of ``part`` that starts after now has finished (failed with
        StorageError if it failed): one per loop turn, every append of the turn riding along."""
        if part.next_sync is None:
            part.next_sync = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._start_sync, part)
        return part.next_sync

    def _start_sync(self, part: Replica) -> None:
        fut = part.next_sync
        if fut is None or part.running_sync is not None:
            return  # a running sync will start this one when it ends
        part.next_sync = None
        if part.deleted or part.failed:
            fut.set_exception(StorageError(part.failed) if part.failed
                              else UnknownTopic(f"topic {part.topic!r} was deleted", topic=part.topic))
            return
        part.running_sync = fut
        end = part.log.end_offset
        thread = asyncio.get_running_loop().run_in_executor(None, part.log.sync)
        thread.add_done_callback(lambda t: self._sync_done(part, fut, end, t))

    def _sync_done(self, part: Replica, fut: asyncio.Future[None], end: int, thread: asyncio.Future[None]) -> None:
        part.running_sync = None
        exc = thread.exception()
        self.fsyncs += exc is None
        if exc is not None:
            part.failed = f"fsync of {part.topic}/{part.index} failed: {exc}"
            log.error(part.failed)
            fut.set_exception(StorageError(part.failed))
        else:
            if self.policy.mode == "always":
                self.on_durable(part, end)
            fut.set_result(None)
        if part.next_sync is not None:
            self._start_sync(part)

    async def writeback_loop(self, replicas: Callable[[], Iterable[Replica]]) -> None:
        """Start the kernel's writeback of every log with ``WRITEBACK_START_BYTES`` new, one at a time."""
        loop = asyncio.get_running_loop()
        while True:
            await self.clock.sleep(limits.WRITEBACK_CHECK_INTERVAL_MS / 1000)
            for part in list(replicas()):
                plog = part.log
                if (part.running_sync is None and not part.deleted and not part.failed
                        and plog.writeback_due(limits.WRITEBACK_START_BYTES)):
                    try:
                        self.writebacks += await loop.run_in_executor(None, plog.start_writeback)
                    except OSError as exc:  # only a hint to the kernel: the next fsync reports real trouble
                        log.debug("starting writeback of %s/%d: %s", part.topic, part.index, exc)

    async def interval_loop(self, replicas: Callable[[], Iterable[Replica]]) -> None:
        """Policy ``interval``: sync every replica with unsynced bytes, every interval."""
        assert self.policy.mode == "interval"
        loop = asyncio.get_running_loop()
        while True:
            await self.clock.sleep(self.policy.interval_ms / 1000)
            for part in list(replicas()):
                if part.log.unsynced_bytes and part.next_sync is None and part.running_sync is None:
                    part.next_sync = loop.create_future()
                    self._start_sync(part)
