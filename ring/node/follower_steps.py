"""The node core's steps as a follower: a leader's sync, append and hw frames, and what it answers.

A part of ``NodeCore`` (``core.py``), kept in a module of its own: it uses
the core's replicas, its Ready under construction (``_ready``), and its
rules on what changed (``_changed``, ``keep``, ``_look_soon``). An append is
acknowledged with the end it reaches once the Ready's persist made it
durable (or at once, under an fsync policy that makes appends durable
without an fsync of their own); an hw frame only when it moved the log
start (on disk by then), which a truncate on the leader waits for.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ring.errors import Conflict, CorruptBatch, OffsetOutOfRange, StorageError
from ring.node import ready as msg
from ring.node.links import Key
from ring.node.ready import Ready
from ring.replication import protocol, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.node")


class FollowerSteps:
    name: str
    closing: bool
    durable_at_once: bool
    replica: Callable[[str, int], Replica | None]
    _ready: Ready
    _now: float
    _publish_due: bool
    _changed: Callable[[Replica], None]
    keep: Callable[[Replica, float], bool]
    _look_soon: Callable[[Key | None], None]

    def _from_leader(self, now: float, m: msg.FromLeader) -> None:
        frame, leader = m.frame, m.leader
        rep = self.replica(frame.topic, frame.partition)
        caught_up = rep is not None and rep.caught_up
        if rep is None:
            answer: Any = steps.reject_unknown(frame.topic, frame.partition, frame.epoch)
        elif isinstance(frame, protocol.Append):
            answer = self._follow_append(rep, leader, frame)
        elif isinstance(frame, protocol.Sync):
            answer = self._follow_sync(rep, leader, frame)
        else:
            start = rep.log.start_offset
            try:
                answer = steps.on_hw(rep, leader, frame)
            except (StorageError, OffsetOutOfRange) as exc:
                log.error("%s/%d: following %s's log start %d failed: %s", rep.topic, rep.index, leader,
                          frame.log_start, exc.message)
                answer = steps.reject_storage(rep, frame.epoch)
            if isinstance(answer, protocol.FollowerAck) and rep.log.start_offset == start:
                return  # it would repeat what the last append's ack named; a moved start waits a truncate
        if rep is not None and rep.caught_up != caught_up:
            self._publish_due = True  # no longer behind: others may elect it
            self._look_soon((rep.topic, rep.index))
        self._ready.add("sends", (leader, answer))

    def _follow_sync(self, rep: Replica, leader: str, frame: protocol.Sync) -> Any:
        """Follow ``leader``: the driver made sure no fsync runs on the log (it may be cut)."""
        if rep.deleted or rep.failed or self.closing:
            return steps.reject_storage(rep, frame.epoch)
        before = (rep.leader, rep.epoch)
        try:
            answer = steps.on_sync(rep, leader, frame)
        except (StorageError, OffsetOutOfRange, Conflict) as exc:
            log.error("%s/%d: following %s failed: %s", rep.topic, rep.index, leader, exc.message)
            answer = steps.reject_storage(rep, frame.epoch)
        if (rep.leader, rep.epoch) != before:
            self._changed(rep)
        elif self.name not in rep.replicas and not self.keep(rep, self._now):
            self._ready.reconcile = True  # the leader's voters no longer count us: close (after the ack)
        return answer

    def _follow_append(self, rep: Replica, leader: str, frame: protocol.Append) -> Any:
        """Append the leader's batches (beside a running fsync); the ack names the end they reach once the
        Ready's persist made them durable."""
        if rep.deleted or rep.failed or self.closing:
            return steps.reject_storage(rep, frame.epoch)
        try:
            end = steps.on_append(rep, leader, frame)
        except (CorruptBatch, Conflict, StorageError) as exc:
            log.error("%s/%d from %s: refused replicated batches: %s", rep.topic, rep.index, leader, exc.message)
            return steps.reject_storage(rep, frame.epoch)
        if isinstance(end, protocol.Reject):
            return end
        if self.durable_at_once:
            rep.set_durable(end)
        else:
            self._ready.add("persist", (rep, end))
        return protocol.FollowerAck(frame.topic, frame.partition, rep.epoch, end, rep.log.start_offset, rep.voters_seq,
                            rep.incarnation)
