"""One partition replica held by this broker: its log and the state replication keeps beside it.

A ``Replica`` knows its preference list (``replicas``), its leader and epoch,
its own durable end (what the fsync policy has made safe), and the high
watermark (``hw``): what consumers may see. On the leader the high watermark
is ``protocol.high_watermark`` over its own durable end and the ends its
followers acknowledged; on a follower it is the leader's high watermark as
last told, capped at its own log end. A replica alone (a single broker) is
its own majority: its high watermark is its durable end.

The broker's event loop is the only caller. Long-polls wait on ``waiter``
(resolved when hw moves); produces wait on ``wait_replicas`` until enough
replicas hold their batches. The group-commit fields (``next_sync``,
``running_sync``) belong to ``commit.GroupCommit``, which serialises appends with fsyncs.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from ring.log.partition import PartitionLog
from ring.replication import protocol


class Replica:
    __slots__ = ("topic", "index", "log", "self_name", "replicas", "leader", "epoch", "durable", "hw",
                 "follower_ends", "leader_hw", "next_sync", "running_sync", "waiter", "deleted", "failed",
                 "_ack_waiters", "on_hw")

    def __init__(self, topic: str, index: int, plog: PartitionLog, self_name: str,
                 replicas: list[str] | None = None, epoch: int = 1, hw: int | None = None) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self.self_name = self_name
        self.replicas: list[str] = [self_name]
        self.leader = self_name
        self.epoch = epoch
        # What survived to this open counts as durable: it was read back from disk.
        self.durable: int = plog.end_offset
        self.hw: int = plog.end_offset if hw is None else min(hw, plog.end_offset)
        self.follower_ends: dict[str, int] = {}
        self.leader_hw = self.hw
        self.next_sync: asyncio.Future[None] | None = None  # resolves after a sync not yet started
        self.running_sync: asyncio.Future[None] | None = None  # set while an fsync thread runs
        self.waiter: asyncio.Future[None] | None = None  # long-polls; resolved when hw moves
        self.deleted = False
        self.failed: str | None = None  # an fsync failed: what was acknowledged may be gone
        self._ack_waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self.on_hw: Callable[[Replica], None] | None = None  # told when hw moves (leaders tell followers)
        self.set_placement(replicas or [self_name])

    # --- placement ------------------------------------------------------------------

    def set_placement(self, replicas: list[str]) -> None:
        assert self.self_name in replicas, (self.self_name, replicas)
        self.replicas = list(replicas)
        self.leader = protocol.choose_leader(self.replicas)
        self.follower_ends = {r: e for r, e in self.follower_ends.items() if r in self.replicas}
        self.refresh()

    @property
    def is_leader(self) -> bool:
        return self.leader == self.self_name

    @property
    def rf(self) -> int:
        return len(self.replicas)

    def replica_ends(self) -> dict[str, int | None]:
        """Each replica's durable end as known here (None: not known)."""
        if not self.is_leader:
            return {r: (self.durable if r == self.self_name else None) for r in self.replicas}
        return {r: (self.durable if r == self.self_name else self.follower_ends.get(r)) for r in self.replicas}

    # --- progress -------------------------------------------------------------------

    def set_durable(self, end: int) -> None:
        if end > self.durable:
            self.durable = end
            self.refresh()

    def set_follower_end(self, name: str, end: int) -> None:
        if name in self.replicas and name != self.self_name and end > self.follower_ends.get(name, -1):
            self.follower_ends[name] = end
            self.refresh()

    def set_leader_hw(self, hw: int) -> None:
        if hw > self.leader_hw:
            self.leader_hw = hw
            self.refresh()

    def _ends(self) -> list[int]:
        return [self.durable] + [self.follower_ends.get(r, 0) for r in self.replicas if r != self.self_name]

    def refresh(self) -> None:
        if self.is_leader:
            hw = protocol.high_watermark(self._ends(), self.rf)
        else:
            hw = self.leader_hw
        self.advance(min(hw, self.log.end_offset))
        if self._ack_waiters:
            self._check_waiters()

    def advance(self, hw: int) -> None:
        if hw > self.hw:
            self.hw = hw
            self.wake()
            if self.on_hw is not None:
                self.on_hw(self)

    def wake(self) -> None:
        if self.waiter is not None:
            if not self.waiter.done():
                self.waiter.set_result(None)
            self.waiter = None

    # --- waiting for acknowledgements ------------------------------------------------

    def wait_replicas(self, end: int, needed: int) -> asyncio.Future[None]:
        """A future resolved once ``needed`` replicas (this one included) durably hold offsets below ``end``."""
        fut = asyncio.get_running_loop().create_future()
        if protocol.replicas_reaching(self._ends(), end) >= needed:
            fut.set_result(None)
        else:
            self._ack_waiters.append((end, needed, fut))
        return fut

    def _check_waiters(self) -> None:
        ends = self._ends()
        keep = []
        for end, needed, fut in self._ack_waiters:
            if fut.done():
                continue
            if protocol.replicas_reaching(ends, end) >= needed:
                fut.set_result(None)
            else:
                keep.append((end, needed, fut))
        self._ack_waiters = keep

    def fail_waiters(self, exc: BaseException) -> None:
        for _, _, fut in self._ack_waiters:
            if not fut.done():
                fut.set_exception(exc)
        self._ack_waiters = []
