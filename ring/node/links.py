"""The leader's side of replication: what to send to each follower, and when.

``Links`` keeps a ``Link`` for every broker that follows at least one
partition this broker leads, and a ``SendCursor`` (``protocol``) per
partition on it. Nothing here touches a socket: the driver connects each
link, steps ``LinkUp`` / ``LinkDown``, sends the frames a ``flush`` returns
and steps each answer (``answer``).

A flush looks only at the partitions marked since the last one (new records,
a high watermark that moved, an answer: ``Link.mark``; not every partition of
the link, so a produce costs the same with one partition or thousands), and
at those whose probe is due:

* a cursor that does not know where the follower's log ends sends a sync
  frame (the probe: epoch, history, voters), again every
  ``REPLICATION_PROBE_RETRY_MS`` until answered;
* a known cursor reads whole stored batches from the log at the cursor
  (bytes as they are) and sends append frames without waiting for answers,
  while the link's unacknowledged bytes stay under
  ``REPLICATION_INFLIGHT_BYTES_MAX``, except that new records short of a
  frame's worth (``REPLICATION_FRAME_HOLD_RECORDS_MAX``) wait while a frame
  of that partition is unanswered and leave together when the answer comes
  (the hold rule); a partition stopped at the budget is looked at again on
  the link's next answer (``blocked``);
* then an hw frame if the high watermark or the log start offset moved past
  what the follower was told.

The links of one partition's followers read the same range in the same
flush, so the bytes one link read are kept (``Links.read``) until the
partition's other followers have taken them: one read and CRC check of the
log per range, not one per follower.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

from ring import limits
from ring.errors import OffsetOutOfRange, StorageError
from ring.log import batch as batchfmt
from ring.replication import protocol, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

Key = tuple[str, int]
# Reads kept for a partition's other followers: one per partition sent at once;
# each is at most a frame (REPLICATION_FRAME_BYTES_MAX and one batch).
SHARED_READS_MAX = 8
PROBE_RETRY_S = limits.REPLICATION_PROBE_RETRY_MS / 1000


class _SharedRead(NamedTuple):
    rep: Replica
    epoch: int
    prev: int
    upto: int | None
    data: bytes
    left: int  # followers that may still take it


class Links:
    def __init__(self, name: str, replica: Callable[[str, int], Replica | None]) -> None:
        self.name = name
        self.replica = replica
        self.links: dict[str, Link] = {}
        self.dirty: set[str] = set()  # links with partitions marked since their last flush
        self.damaged: list[tuple[Replica, int]] = []  # stored batches a read found damaged
        self._followers_of: dict[Key, list[str]] = {}
        self._reads: OrderedDict[Key, _SharedRead] = OrderedDict()

    def assign(self, wanted: dict[str, set[Key]], now: float) -> bool:
        """Follower -> partitions this broker leads that it replicates; links come and go to match.
        Whether the set of followers changed."""
        changed = set(wanted) != set(self.links)
        for name in list(self.links):
            if name not in wanted:
                del self.links[name]
                self.dirty.discard(name)
        for name, keys in wanted.items():
            link = self.links.get(name)
            if link is None:
                link = self.links[name] = Link(self, name, now)
            link.set_partitions(keys, now)
        self._followers_of = {}
        for name, keys in wanted.items():
            for key in keys:
                self._followers_of.setdefault(key, []).append(name)
        return changed

    def reassign(self, followers: dict[Key, list[str]], now: float) -> bool:
        """What ``assign`` does, for the partitions named only (key -> the brokers its leader here
        replicates to; none: it is not led here): the others' cursors stay as they are, unmarked, so
        a step in which a few partitions changed leader costs those, not a pass over every partition.
        Whether the set of followers changed."""
        before, emptied = set(self.links), set()
        for key in sorted(followers):
            names = followers[key]
            for name in self._followers_of.get(key, ()):
                link = self.links.get(name)
                if link is not None and name not in names:
                    link.drop(key)
                    emptied.add(name)
            for name in names:
                link = self.links.get(name)
                if link is None:
                    link = self.links[name] = Link(self, name, now)
                link.add(key, now)
            if names:
                self._followers_of[key] = list(names)
            else:
                self._followers_of.pop(key, None)
        for name in emptied:  # (after every key: a link another key still wants keeps its connection)
            if not self.links[name].cursors:
                del self.links[name]
                self.dirty.discard(name)
        return set(self.links) != before

    def link(self, follower: str) -> Link | None:
        return self.links.get(follower)

    def read(self, rep: Replica, prev: int) -> tuple[bytes, bool]:
        """Whole stored batches from ``prev`` for an append frame, as ``rep.log.read`` gives them,
        and whether another follower's link had read them.

        The bytes below a leader's log end do not change while it leads in
        one epoch (only a follower's log is cut), so a read another follower's
        link made from the same offset, in this epoch, is the same answer.
        """
        key = (rep.topic, rep.index)
        upto = steps.frame_upto(rep, prev)
        kept = self._reads.get(key)
        if (kept is not None and kept.rep is rep and kept.epoch == rep.epoch and kept.prev == prev
                and kept.upto == upto and prev >= rep.log.start_offset):
            if kept.left <= 1:
                del self._reads[key]
            else:
                self._reads[key] = kept._replace(left=kept.left - 1)
            return kept.data, True
        data = rep.log.read(prev, limits.REPLICATION_FRAME_BYTES_MAX, upto)
        others = len(self._followers_of.get(key, ())) - 1
        if others > 0 and data:
            self._reads[key] = _SharedRead(rep, rep.epoch, prev, upto, data, others)
            self._reads.move_to_end(key)
            while len(self._reads) > SHARED_READS_MAX:
                self._reads.popitem(last=False)
        return data, False

    def notify(self, rep: Replica) -> None:
        """New batches or a new high watermark on a partition we lead: look at it on each follower's link."""
        key = (rep.topic, rep.index)
        for name in self._followers_of.get(key, ()):
            link = self.links.get(name)
            if link is not None:
                link.mark(key)

    def resync(self, rep: Replica, now: float) -> None:
        """Send every follower of ``rep`` a sync again (its voter set changed, or a follower asked)."""
        key = (rep.topic, rep.index)
        for name in self._followers_of.get(key, ()):
            link = self.links.get(name)
            cur = link.cursors.get(key) if link is not None else None
            if cur is not None:
                cur.reset(now)
                link.mark(key)

    def reprobe(self, now: float) -> None:
        """Probe now the followers that did not know a partition yet."""
        for link in self.links.values():
            for key, cur in link.cursors.items():
                if cur.next is None and cur.parked is None:
                    cur.probe_at = min(cur.probe_at, now)
                    link.mark(key)

    def due(self, now: float) -> None:
        """Mark the partitions whose probe time came."""
        for link in self.links.values():
            if link.connected and link.probe_next is not None and link.probe_next <= now:
                link.due(now)

    def flush(self, now: float, sends: list[tuple[str, Any]], follower: str | None = None) -> None:
        """Append the frames every marked, connected link (or only ``follower``'s) has to send to ``sends``."""
        for name in sorted(self.dirty) if follower is None else [follower]:
            link = self.links.get(name)
            if link is None or not link.connected or name not in self.dirty:
                continue
            self.dirty.discard(name)
            link.flush(now, sends)

    def pending(self) -> set[str]:
        """The connected links with partitions marked (a flush would look at them)."""
        return {n for n in self.dirty if n in self.links and self.links[n].connected} if self.dirty else set()

    def next_probe(self) -> float | None:
        return min((link.probe_next for link in self.links.values() if link.connected and link.probe_next is not None),
                   default=None)

    def describe(self) -> dict[str, dict[str, object]]:
        return {name: link.describe() for name, link in sorted(self.links.items())}


class Link:
    def __init__(self, links: Links, follower: str, now: float) -> None:
        self.links = links
        self.follower = follower
        self.down_since: float | None = now  # not connected since (None: connected)
        self.cursors: dict[Key, protocol.SendCursor] = {}
        # What the next flush looks at: partitions marked (new records, hw, an answer), the ones
        # waiting for a probe time, and the ones that stopped at the link's in-flight budget
        # (looked at again on any answer).
        self.ready: dict[Key, None] = {}
        self.timed: set[Key] = set()
        self.blocked: set[Key] = set()
        # At least the link's unanswered bytes (sends add, answers do not subtract); counted
        # exactly again when it reaches REPLICATION_INFLIGHT_BYTES_MAX, once per event that may
        # have freed some (a mark: an answer, a reset, new records).
        self._inflight_bound = 0
        self._bound_exact = False
        self.connected = False
        self.frames_sent = 0  # append frames, and the batches they carried: how well sends coalesce
        self.batches_sent = 0
        self.reads_shared = 0  # frames whose bytes another follower's link had read from the log
        self.bytes_sent = 0
        self.probe_next: float | None = None  # the earliest probe_at of the partitions in ``timed``

    def set_partitions(self, keys: set[Key], now: float) -> None:
        for key in list(self.cursors):
            if key not in keys:
                del self.cursors[key]
        for key in sorted(keys):  # (a set: sorted, so the same inputs flush in the same order)
            if key not in self.cursors:
                cur = self.cursors[key] = protocol.SendCursor(PROBE_RETRY_S)
                cur.reset(now)
        self.mark_all()

    def add(self, key: Key, now: float) -> None:
        """Replicate ``key`` on this link (asking where the follower stands, if it is new here)."""
        if key not in self.cursors:
            self.cursors[key] = cur = protocol.SendCursor(PROBE_RETRY_S)
            cur.reset(now)
        self.mark(key)

    def drop(self, key: Key) -> None:
        """Stop replicating ``key`` on this link (a probe it waited for finds no cursor: ``flush`` forgets
        it there, and works out the link's next probe without it)."""
        self.cursors.pop(key, None)

    def mark(self, key: Key) -> None:
        """Have the next flush look at this partition."""
        self.ready[key] = None
        self._bound_exact = False
        self.links.dirty.add(self.follower)

    def mark_all(self) -> None:
        self.ready.update(dict.fromkeys(self.cursors))
        self._bound_exact = False
        self.links.dirty.add(self.follower)

    def up(self, now: float) -> None:
        """Connected (again): where the follower stands must be asked anew on every partition."""
        self.connected = True
        self.down_since = None
        for cur in self.cursors.values():
            cur.reset(now)
        self._inflight_bound = 0
        self.mark_all()

    def down(self, now: float) -> None:
        self.connected = False
        self.down_since = now

    def reaches(self, now: float, grace_s: float) -> bool:
        """Connected, or not closed for ``grace_s`` yet (a link just made, or that broke by accident)."""
        return self.down_since is None or now - self.down_since < grace_s

    def inflight_bytes(self) -> int:
        return sum(c.inflight_bytes for c in self.cursors.values())

    def _has_room(self) -> bool:
        """Whether the link's unanswered bytes are under REPLICATION_INFLIGHT_BYTES_MAX."""
        if self._inflight_bound < limits.REPLICATION_INFLIGHT_BYTES_MAX:
            return True
        if not self._bound_exact:
            self._inflight_bound = self.inflight_bytes()
            self._bound_exact = True
        return self._inflight_bound < limits.REPLICATION_INFLIGHT_BYTES_MAX

    def describe(self) -> dict[str, object]:
        return {"connected": self.connected, "inflight_bytes": self.inflight_bytes(),
                "append_frames": self.frames_sent, "batches": self.batches_sent, "reads_shared": self.reads_shared,
                "parked": {f"{t}/{p}": c.parked for (t, p), c in self.cursors.items() if c.parked}}

    # --- sending -----------------------------------------------------------------------

    def due(self, now: float) -> None:
        """Mark the partitions whose probe time came."""
        for key in sorted(self.timed):
            cur = self.cursors.get(key)
            if cur is None or cur.probe_at <= now:
                self.mark(key)

    def flush(self, now: float, out: list[tuple[str, Any]]) -> None:
        keys = list(self.ready)
        self.ready.clear()
        for key in keys:
            cur = self.cursors.get(key)
            rep = self.links.replica(*key)
            if cur is None or rep is None or not rep.is_leader or rep.deleted:
                self.timed.discard(key)  # leading it again, or a new cursor, marks it again
                continue
            self._send_one(now, key, rep, cur, out)
        self.probe_next = min((c.probe_at for c in map(self.cursors.get, self.timed) if c is not None), default=None)

    def _send_one(self, now: float, key: Key, rep: Replica, cur: protocol.SendCursor,
                  out: list[tuple[str, Any]]) -> None:
        """What one partition's cursor has to send now: a probe, append frames, an hw frame."""
        if cur.next is None:
            if cur.wants_probe(now):
                cur.probed(now, rep.hw, rep.log.start_offset)
                out.append((self.follower, steps.sync_frame(rep)))
        else:
            self._send_batches(now, rep, cur, out)
            if cur.next is None:
                self._bound_exact = False  # reset: its frames no longer count
            if cur.should_send(rep.log.end_offset, limits.REPLICATION_FRAME_HOLD_RECORDS_MAX) and not rep.deleted:
                self.blocked.add(key)  # out of in-flight budget: again on the next answer
            if cur.wants_hw(rep.hw, rep.log.start_offset) and not rep.deleted:
                frame = steps.hw_frame(rep)
                cur.told(frame.hw, frame.log_start)
                out.append((self.follower, frame))
        if cur.next is None and cur.parked is None:
            self.timed.add(key)  # probed again at probe_at
        else:
            self.timed.discard(key)

    def _send_batches(self, now: float, rep: Replica, cur: protocol.SendCursor, out: list[tuple[str, Any]]) -> None:
        while (cur.should_send(rep.log.end_offset, limits.REPLICATION_FRAME_HOLD_RECORDS_MAX) and not rep.deleted
               and self._has_room()):
            prev = cur.next
            try:
                data, shared = self.links.read(rep, prev)
                self.reads_shared += shared
            except OffsetOutOfRange:
                log.warning("%s/%d to %s: offset %d is below the log start; syncing again", rep.topic, rep.index,
                            self.follower, prev)
                cur.reset(now + PROBE_RETRY_S)
                return
            except StorageError as exc:
                if rep.damaged_at is None:  # (once: it hands over, and the probes read it again meanwhile)
                    log.error("%s/%d to %s: reading the log failed: %s", rep.topic, rep.index, self.follower, exc)
                self.links.damaged.append((rep, prev))
                cur.reset(now + PROBE_RETRY_S)
                return
            first, end, batches = batchfmt.span(data) if data else (prev, prev, 0)
            # A follower started again at our log start, inside a batch, takes that batch whole.
            if first != prev and prev != rep.log.start_offset:
                log.warning("%s/%d to %s: the follower's end %d is not a batch boundary here; syncing again",
                            rep.topic, rep.index, self.follower, prev)
                cur.reset(now + PROBE_RETRY_S)
                return
            hw = rep.hw
            cur.sent(prev, end, len(data))
            self._inflight_bound += len(data)
            cur.hw_sent = max(cur.hw_sent, hw)
            self.frames_sent += 1
            self.batches_sent += batches
            self.bytes_sent += len(data)
            out.append((self.follower, protocol.Append(rep.topic, rep.index, rep.epoch, prev, hw, data)))

    # --- answers -------------------------------------------------------------------------

    def answer(self, now: float, frame: Any) -> tuple[Replica, int | None] | None:
        """A follower's ack or reject: applied to its cursor and the replica. The replica and a newer
        epoch the follower is in (the caller steps this leader down), or None if it concerns nothing
        this broker leads."""
        key = (frame.topic, frame.partition)
        cur, rep = self.cursors.get(key), self.links.replica(*key)
        if cur is None or rep is None or not rep.is_leader:
            return None
        was = cur.parked
        newer = steps.on_answer(rep, cur, self.follower, frame, now)
        if newer is not None:
            log.warning("%s/%d: follower %s is in epoch %d, past ours (%d)", rep.topic, rep.index,
                        self.follower, newer, rep.epoch)
        elif cur.parked and not was:
            log.warning("%s/%d to %s: %s", rep.topic, rep.index, self.follower, cur.parked)
        elif isinstance(frame, protocol.Reject):
            log.debug("%s/%d to %s: rejected (%s) at %d", rep.topic, rep.index, self.follower,
                      frame.reason, frame.end_offset)
        if self.blocked:
            self.ready.update(dict.fromkeys(sorted(self.blocked)))
            self.blocked.clear()
        self.mark(key)
        return rep, newer
