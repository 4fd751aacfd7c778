"""The simulated broker's replication: the leader's ordered links to its followers, the follower's answers.

A mixin of ``SimBroker``. The leader keeps one ``Link`` per follower (a
connection number, and a ``SendCursor`` per partition), notices a broken or
stuck link after ``LINK_TIMEOUT_S`` and connects again (only to a follower
that runs and is reachable), and sends what ``protocol``'s cursor says: a
sync first, then pipelined appends within a byte budget, then hw frames. The
follower runs ``steps`` on each frame and answers in order; an append is
acknowledged once a group commit (an fsync a few milliseconds later) covers
it. Answers go to ``steps.on_answer`` on the leader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ring import limits
from ring.errors import Conflict, CorruptBatch, OffsetOutOfRange, StorageError
from ring.log import batch as batchfmt
from ring.replication import protocol, steps
from ring.replication.replica import Replica
from tests.sim.network import LINK_TIMEOUT_S

Key = tuple[str, int]
INFLIGHT_BYTES_MAX = 64 * 1024
FRAME_BYTES_MAX = 4 * 1024
PROBE_RETRY_S = limits.REPLICATION_PROBE_RETRY_MS / 1000


@dataclass
class Link:
    conn: int
    cursors: dict[Key, protocol.SendCursor] = field(default_factory=dict)
    waiting_since: float | None = None  # the oldest frame not answered yet was sent then
    broken_at: float | None = None


class Replication:
    """Needs from SimBroker: world, net, name, reps, links, answers, syncing, handoffs, generation and
    _live, _changed, _check_pending, _handoff_progress."""

    # --- replication: the leader's links ---------------------------------------------------------------

    def _maintain_links(self) -> None:
        now = self.world.now
        wanted = sorted({m for r in self.reps.values() if r.is_leader for m in r.members() if m != self.name})
        for name in list(self.links):
            if name not in wanted:
                del self.links[name]
        for name in wanted:
            link = self.links.get(name)
            if link is not None and link.broken_at is None:
                stuck = link.waiting_since is not None and now - link.waiting_since > LINK_TIMEOUT_S
                if stuck or self.net.broken(self.name, name, link.conn):
                    link.broken_at = now
            if link is None or (link.broken_at is not None and now - link.broken_at >= LINK_TIMEOUT_S):
                if self.net.connectable(self.name, name) and not self.net.nodes[name].paused:
                    self._connect(name)

    def _connect(self, name: str) -> None:
        conn = self.world.rng.randrange(1 << 40)
        self.net.nodes[name].accepted[self.name] = conn  # the handshake: only while it runs and is reachable
        self.links[name] = Link(conn)
        self.world.log(f"{self.name} connects to {name} ({conn})")

    def _pump(self, rep: Replica) -> None:
        if not rep.is_leader:
            return
        key, now = (rep.topic, rep.index), self.world.now
        for name in rep.members():
            link = self.links.get(name)
            if name == self.name or link is None or link.broken_at is not None:
                continue
            cur = link.cursors.get(key)
            if cur is None:
                cur = link.cursors[key] = protocol.SendCursor(PROBE_RETRY_S)
                cur.reset(now)
            if cur.next is None:
                if cur.wants_probe(now):
                    cur.probed(now, rep.hw, rep.log.start_offset)
                    self._send(name, link, steps.sync_frame(rep))
                continue
            while cur.can_send() and cur.next < rep.log.end_offset and \
                    sum(c.inflight_bytes for c in link.cursors.values()) < INFLIGHT_BYTES_MAX:
                prev = cur.next
                try:
                    data = rep.log.read(prev, FRAME_BYTES_MAX, steps.frame_upto(rep, prev))
                except OffsetOutOfRange:
                    cur.reset(now + PROBE_RETRY_S)
                    break
                end = max(h.next_offset for h, _ in batchfmt.scan(data, verify=False))
                cur.sent(prev, end, len(data))
                cur.hw_sent = max(cur.hw_sent, rep.hw)
                self._send(name, link, protocol.Append(rep.topic, rep.index, rep.epoch, prev, rep.hw, data))
            if cur.wants_hw(rep.hw, rep.log.start_offset):
                frame = steps.hw_frame(rep)
                cur.told(frame.hw, frame.log_start)
                self._send(name, link, frame)

    def _send(self, name: str, link: Link, frame: protocol.Frame) -> None:
        if link.waiting_since is None:
            link.waiting_since = self.world.now
        if not self.net.send_frame(self.name, name, link.conn, frame):
            link.broken_at = link.broken_at or self.world.now

    def receive_frame(self, src: str, conn: int, frame: Any) -> None:
        if not self.running:
            self.net.break_link(src, self.name, conn)
            return
        if self.paused:
            self.inbox.append(("frame", src, conn, frame))
            return
        if isinstance(frame, (protocol.Ack, protocol.Reject)):
            self._on_answer(src, conn, frame)
            return
        if self.accepted.get(src) != conn:  # a connection of another incarnation, or superseded
            self.net.break_link(src, self.name, conn)
            return
        key = (frame.topic, frame.partition)
        if key not in self.reps:
            answer: Any = steps.reject_unknown(frame.topic, frame.partition, frame.epoch)
        else:
            answer = self._follow(src, frame)
        queue = self.answers.setdefault((src, conn), [])
        if isinstance(answer, int):  # appended: acked once synced, in order with the other answers
            queue.append((key, answer, None))
            self._sync_soon(self.reps[key])
        else:
            queue.append((key, None, answer))
        self._flush(src, conn)

    def _flush(self, src: str, conn: int) -> None:
        queue = self.answers.get((src, conn), [])
        while queue:
            key, end, answer = queue[0]
            rep = self.reps.get(key)
            if rep is None and answer is None:
                answer = steps.reject_unknown(key[0], key[1], 0)
            elif answer is None:
                if rep.durable < end and rep.log.end_offset >= end:
                    return  # not synced yet
                answer = steps.ack(rep)
            queue.pop(0)
            self.net.send_frame(self.name, src, conn, answer)

    def _sync_soon(self, rep: Replica) -> None:
        key = (rep.topic, rep.index)
        if key in self.syncing:
            return
        self.syncing.add(key)
        gen = self.generation
        self.world.after(self.world.rng.uniform(0.001, 0.01), lambda: self._sync(key, gen))

    def _sync(self, key: Key, gen: int) -> None:
        """Group commit: one fsync covers every append since the last one; then acks and the high watermark."""
        if not self._live(gen):
            return
        self.syncing.discard(key)
        rep = self.reps.get(key)
        if rep is None:
            return
        rep.log.sync()
        rep.set_durable(rep.log.end_offset)
        for src, conn in list(self.answers):
            self._flush(src, conn)
        self._check_pending(rep)
        self._pump(rep)

    def _follow(self, src: str, frame: protocol.Frame) -> protocol.Frame | int:
        rep = self.reps[(frame.topic, frame.partition)]
        try:
            if isinstance(frame, protocol.Sync):
                return steps.on_sync(rep, src, frame)
            if isinstance(frame, protocol.Hw):
                return steps.on_hw(rep, src, frame)
            assert isinstance(frame, protocol.Append)
            end = steps.on_append(rep, src, frame)
        except (CorruptBatch, Conflict, StorageError, OffsetOutOfRange):
            return steps.reject_storage(rep, frame.epoch)
        return end

    def _on_answer(self, src: str, conn: int, frame: protocol.Ack | protocol.Reject) -> None:
        link = self.links.get(src)
        if link is None or link.conn != conn:
            return
        link.waiting_since = None
        key = (frame.topic, frame.partition)
        rep, cur = self.reps.get(key), link.cursors.get(key)
        if cur is None or rep is None or not rep.is_leader:
            return
        newer = steps.on_answer(rep, cur, src, frame, self.world.now)
        if newer is not None and steps.adopt_epoch(rep, newer):
            self.world.log(f"{self.name} learns epoch {newer} of {key} from {src}: steps down")
        self._changed(rep)
        if key in self.handoffs:
            self._handoff_progress(key)
        self._pump(rep)
