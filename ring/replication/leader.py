"""The leader's side of replication: one websocket per follower broker, batches streamed in order.

``Streams`` keeps a ``FollowerLink`` for every broker that follows at least
one partition this broker leads. A link connects to the follower's
``/peer/v1/replicate`` (cluster secret and our name in headers), reconnecting
with doubling backoff, and runs two loops on the connection:

* the sender, woken by new appends, high-watermark moves and freed budget,
  walks the partitions that were woken (``FollowerLink.mark``; not every
  partition of the link, so a produce costs the same with one partition or
  thousands), and those whose probe is due: a cursor that does not know where the follower's log
  ends sends a sync frame (the probe: epoch, history, voters); a known cursor reads whole stored
  batches from the log at the cursor (bytes as they are) and sends append
  frames without waiting for answers, while the link's unacknowledged bytes
  stay under ``REPLICATION_INFLIGHT_BYTES_MAX``, except that new records short
  of a frame's worth (``REPLICATION_FRAME_HOLD_RECORDS_MAX``) wait while a frame
  of that partition is unanswered and leave together when the answer comes; then an
  hw frame if the high watermark or the log start offset moved past what the
  follower was told.
  The links of one partition's followers usually read the same range in the
  same loop turn, so the bytes one link read are kept (``Streams.read``)
  until the partition's other followers have taken them: one read and CRC
  check of the log per range, not one per follower.
* the receiver applies acks and rejects to the cursors (``SendCursor``) and
  each ack to the replica (``set_follower_end``), which moves the high
  watermark and releases produces waiting for acknowledgements. A follower
  that answers with a newer epoch deposes this leader (``on_newer_epoch``);
  one whose log starts past ours has the broker move our start up
  (``on_peer_start``).

Every decision is in ``protocol`` and ``steps``; this module moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Callable, NamedTuple

import aiohttp

from ring import limits
from ring.clock import Clock
from ring.cluster.peers import H_BROKER, H_SECRET
from ring.errors import BadRequest, OffsetOutOfRange, StorageError
from ring.log import batch as batchfmt
from ring.replication import protocol, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

REPLICATE_PATH = "/peer/v1/replicate"

Key = tuple[str, int]
# Reads kept for a partition's other followers: one per partition sent at once;
# each is at most a frame (REPLICATION_FRAME_BYTES_MAX and one batch).
SHARED_READS_MAX = 8


class _SharedRead(NamedTuple):
    rep: Replica
    epoch: int
    prev: int
    upto: int | None
    data: bytes
    left: int  # followers that may still take it


class Streams:
    def __init__(self, name: str, secret: str | None, clock: Clock, session: aiohttp.ClientSession,
                 peer_url: Callable[[str], str | None], replica: Callable[[str, int], Replica | None],
                 on_newer_epoch: Callable[[Replica, int], None] = lambda rep, epoch: None,
                 on_damage: Callable[[Replica, int], None] = lambda rep, offset: None,
                 on_sent: Callable[[str, int], None] = lambda follower, nbytes: None,
                 on_peer_start: Callable[[Replica], None] = lambda rep: None) -> None:
        self.name = name
        self.on_peer_start = on_peer_start  # a follower's log starts past ours (``steps.lead_start``)
        self.on_sent = on_sent  # stored batch bytes handed to a follower's link (metrics)
        self.on_newer_epoch = on_newer_epoch
        self.on_damage = on_damage
        self.secret = secret
        self.clock = clock
        self.session = session
        self.peer_url = peer_url
        self.replica = replica
        self.links: dict[str, FollowerLink] = {}
        self._followers_of: dict[Key, list[str]] = {}
        self._reads: OrderedDict[Key, _SharedRead] = OrderedDict()

    def assign(self, wanted: dict[str, set[Key]]) -> None:
        """Follower -> partitions this broker leads that it replicates; links come and go to match."""
        for name in list(self.links):
            if name not in wanted:
                self.links.pop(name).stop()
        for name, keys in wanted.items():
            link = self.links.get(name)
            if link is None:
                link = self.links[name] = FollowerLink(self, name)
            link.set_partitions(keys)
        self._followers_of = {}
        for name, keys in wanted.items():
            for key in keys:
                self._followers_of.setdefault(key, []).append(name)

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
        """New batches or a new high watermark on a partition we lead: wake its followers' senders."""
        key = (rep.topic, rep.index)
        for name in self._followers_of.get(key, ()):
            link = self.links.get(name)
            if link is not None:
                link.mark(key)

    def resync(self, rep: Replica) -> None:
        """Send every follower of ``rep`` a sync again (its voter set changed)."""
        now = self.clock.monotonic()
        for name in self._followers_of.get((rep.topic, rep.index), ()):
            link = self.links.get(name)
            cur = link.cursors.get((rep.topic, rep.index)) if link is not None else None
            if cur is not None:
                cur.reset(now)
                link.mark((rep.topic, rep.index))

    def reprobe(self) -> None:
        """Probe now the followers that did not know a partition yet (a topic was just announced)."""
        now = self.clock.monotonic()
        for link in self.links.values():
            for key, cur in link.cursors.items():
                if cur.next is None and cur.parked is None:
                    cur.probe_at = min(cur.probe_at, now)
                    link.mark(key)

    async def close(self) -> None:
        links = list(self.links.values())
        self.links.clear()
        for link in links:
            link.stop()
        await asyncio.gather(*(link.task for link in links if link.task is not None), return_exceptions=True)

    def describe(self) -> dict[str, dict[str, object]]:
        return {name: link.describe() for name, link in sorted(self.links.items())}


def _unmasked(ws: aiohttp.ClientWebSocketResponse) -> None:
    """Send this link's frames unmasked.

    RFC 6455 has a client mask every frame so that a browser's script cannot
    make a frame look like a request to a proxy's cache in between. Both ends
    here are brokers on the peer port, and aiohttp's server reads unmasked
    frames as they are; masking would copy and XOR every replicated byte on
    the leader and again on the follower (a tenth of a leader's CPU under
    batched produce). If aiohttp's writer ever changes shape, frames stay
    masked: slower, never wrong.
    """
    writer = getattr(ws, "_writer", None)
    if writer is not None and isinstance(getattr(writer, "use_mask", None), bool):
        writer.use_mask = False


class FollowerLink:
    def __init__(self, streams: Streams, follower: str) -> None:
        self.streams = streams
        self.follower = follower
        self.cursors: dict[Key, protocol.SendCursor] = {}
        self.wake = asyncio.Event()
        # What the sender looks at on its next turn: partitions marked (new records, hw, an
        # answer), the ones waiting for a probe time, and the ones that stopped at the link's
        # in-flight budget (looked at again on any answer).
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
        self._retry_handle: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = asyncio.create_task(self._run(), name=f"replicate to {follower}")

    def set_partitions(self, keys: set[Key]) -> None:
        retry_s = limits.REPLICATION_PROBE_RETRY_MS / 1000
        now = self.streams.clock.monotonic()
        for key in list(self.cursors):
            if key not in keys:
                del self.cursors[key]
        for key in keys:
            if key not in self.cursors:
                cur = self.cursors[key] = protocol.SendCursor(retry_s)
                cur.reset(now)
        self.mark_all()

    def mark(self, key: Key) -> None:
        """Have the sender look at this partition on its next turn."""
        self.ready[key] = None
        self._bound_exact = False
        self.wake.set()

    def mark_all(self) -> None:
        self.ready.update(dict.fromkeys(self.cursors))
        self._bound_exact = False
        self.wake.set()

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        if self._retry_handle is not None:
            self._retry_handle.cancel()

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

    # --- connection ------------------------------------------------------------------

    async def _run(self) -> None:
        delay_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
        while True:
            url = self.streams.peer_url(self.follower)
            if url is not None:
                try:
                    await self._connected(url)
                    delay_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
                except aiohttp.WSServerHandshakeError as exc:
                    # 400: it refused our link's subprotocol (a broker of another version); else starting, etc.
                    log.log(logging.WARNING if exc.status == 400 else logging.DEBUG,
                            "replication link to %s refused: %s %s", self.follower, exc.status, exc.message)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    log.debug("replication link to %s: %s", self.follower, exc)
                except BadRequest as exc:
                    log.warning("replication link to %s: %s", self.follower, exc.message)
                except Exception:  # a bug: say so, and keep the link alive
                    log.exception("replication link to %s failed", self.follower)
                finally:
                    self.connected = False
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, limits.REPLICATION_RECONNECT_MS_MAX / 1000)

    async def _connected(self, url: str) -> None:
        headers = {H_SECRET: self.streams.secret or "", H_BROKER: self.streams.name}
        async with self.streams.session.ws_connect(
                url + REPLICATE_PATH, headers=headers, heartbeat=limits.REPLICATION_HEARTBEAT_S,
                max_msg_size=limits.REPLICATION_MESSAGE_BYTES_MAX, protocols=(protocol.SUBPROTOCOL,)) as ws:
            if ws.protocol != protocol.SUBPROTOCOL:
                raise BadRequest(f"{self.follower} speaks another replication protocol than {protocol.SUBPROTOCOL} "
                                 f"(it answered {ws.protocol or 'none'}): a broker of another version; "
                                 "not replicating to it")
            _unmasked(ws)
            self.connected = True
            log.info("replicating to %s", self.follower)
            now = self.streams.clock.monotonic()
            for cur in self.cursors.values():
                cur.reset(now)
            self._inflight_bound = 0
            self.mark_all()
            sender = asyncio.create_task(self._send_loop(ws))
            receiver = asyncio.create_task(self._receive_loop(ws))
            try:
                done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()  # raise what ended it
            finally:
                for t in (sender, receiver):
                    t.cancel()
                await asyncio.gather(sender, receiver, return_exceptions=True)

    # --- sending -----------------------------------------------------------------------

    async def _send_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            now = self.streams.clock.monotonic()
            for key in self.timed:
                cur = self.cursors.get(key)
                if cur is None or cur.probe_at <= now:
                    self.ready[key] = None
            keys = list(self.ready)
            self.ready.clear()
            for key in keys:
                cur = self.cursors.get(key)
                rep = self.streams.replica(*key)
                if cur is None or rep is None or not rep.is_leader or rep.deleted:
                    self.timed.discard(key)  # leading it again, or a new cursor, marks it again
                    continue
                await self._send_one(ws, key, rep, cur)
            probe_at = min((c.probe_at for c in map(self.cursors.get, self.timed) if c is not None), default=None)
            if probe_at is not None:
                self._wake_at(probe_at)

    async def _send_one(self, ws: aiohttp.ClientWebSocketResponse, key: Key, rep: Replica,
                        cur: protocol.SendCursor) -> None:
        """What one partition's cursor has to send now: a probe, append frames, an hw frame."""
        now = self.streams.clock.monotonic()
        if cur.next is None:
            if cur.wants_probe(now):
                cur.probed(now, rep.hw, rep.log.start_offset)
                await ws.send_bytes(protocol.encode(steps.sync_frame(rep)))
        else:
            await self._send_batches(ws, rep, cur)
            if cur.next is None:
                self._bound_exact = False  # reset: its frames no longer count
            if cur.should_send(rep.log.end_offset, limits.REPLICATION_FRAME_HOLD_RECORDS_MAX) and not rep.deleted:
                self.blocked.add(key)  # out of in-flight budget: again on the next answer
            if cur.wants_hw(rep.hw, rep.log.start_offset) and not rep.deleted:
                frame = steps.hw_frame(rep)
                cur.told(frame.hw, frame.log_start)
                await ws.send_bytes(protocol.encode(frame))
        if cur.next is None and cur.parked is None:
            self.timed.add(key)  # probed again at probe_at
        else:
            self.timed.discard(key)

    async def _send_batches(self, ws: aiohttp.ClientWebSocketResponse, rep: Replica,
                            cur: protocol.SendCursor) -> None:
        while (cur.should_send(rep.log.end_offset, limits.REPLICATION_FRAME_HOLD_RECORDS_MAX) and not rep.deleted
               and self._has_room()):
            prev = cur.next
            try:
                data, shared = self.streams.read(rep, prev)
                self.reads_shared += shared
            except OffsetOutOfRange:
                log.warning("%s/%d to %s: offset %d is below the log start; syncing again", rep.topic, rep.index,
                            self.follower, prev)
                cur.reset(self.streams.clock.monotonic() + limits.REPLICATION_PROBE_RETRY_MS / 1000)
                return
            except StorageError as exc:
                log.error("%s/%d to %s: reading the log failed: %s", rep.topic, rep.index, self.follower, exc)
                self.streams.on_damage(rep, prev)
                cur.reset(self.streams.clock.monotonic() + limits.REPLICATION_PROBE_RETRY_MS / 1000)
                return
            first, end, batches = batchfmt.span(data) if data else (prev, prev, 0)
            # A follower started again at our log start, inside a batch, takes that batch whole.
            if first != prev and prev != rep.log.start_offset:
                log.warning("%s/%d to %s: the follower's end %d is not a batch boundary here; syncing again",
                            rep.topic, rep.index, self.follower, prev)
                cur.reset(self.streams.clock.monotonic() + limits.REPLICATION_PROBE_RETRY_MS / 1000)
                return
            hw = rep.hw
            cur.sent(prev, end, len(data))  # before the await: answers may arrive while it sends
            self._inflight_bound += len(data)
            cur.hw_sent = max(cur.hw_sent, hw)
            self.frames_sent += 1
            self.batches_sent += batches
            await ws.send_bytes(protocol.encode(protocol.Append(rep.topic, rep.index, rep.epoch, prev, hw, data)))
            self.streams.on_sent(self.follower, len(data))

    def _wake_at(self, at_s: float) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()
        delay = max(0.0, at_s - self.streams.clock.monotonic())
        self._retry_handle = asyncio.get_running_loop().call_later(delay, self.wake.set)

    # --- receiving ---------------------------------------------------------------------

    async def _receive_loop(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY:
                if msg.type == aiohttp.WSMsgType.ERROR:
                    raise aiohttp.ClientError(f"websocket error: {ws.exception()}")
                continue
            frame = protocol.decode(msg.data, limits.REPLICATION_MESSAGE_BYTES_MAX)
            key = (frame.topic, frame.partition)
            cur, rep = self.cursors.get(key), self.streams.replica(*key)
            if cur is None or rep is None or not rep.is_leader:
                continue
            was = cur.parked
            newer = steps.on_answer(rep, cur, self.follower, frame, self.streams.clock.monotonic())
            if newer is not None:
                log.warning("%s/%d: follower %s is in epoch %d, past ours (%d)", rep.topic, rep.index,
                            self.follower, newer, rep.epoch)
                self.streams.on_newer_epoch(rep, newer)
            elif cur.parked and not was:
                log.warning("%s/%d to %s: %s", rep.topic, rep.index, self.follower, cur.parked)
            elif isinstance(frame, protocol.Reject):
                log.debug("%s/%d to %s: rejected (%s) at %d", rep.topic, rep.index, self.follower,
                          frame.reason, frame.end_offset)
            elif rep.peer_start > rep.log.start_offset:
                self.streams.on_peer_start(rep)
            if self.blocked:
                self.ready.update(dict.fromkeys(self.blocked))
                self.blocked.clear()
            self.mark(key)
        raise aiohttp.ClientError("the follower closed the link")
