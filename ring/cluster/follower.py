"""The follower's side of replication on the wire: one leader's websocket, served on the peer port.

Frames are stepped into the node core one at a time in arrival order
(``FromLeader``), so appends land in the order the leader sent them; the
core answers each sync and append frame exactly once and an hw frame only
when it refuses it or it moved the log start. Before a sync (which may cut
the log) and an hw frame that moves the log start (files go), the driver
waits until no fsync runs on that log; appends go on beside one. Each answer goes back on this websocket, in
order, once the fsync its Ready lists has finished: at once when nothing is
queued and nothing needs syncing (every policy but ``always``), else through
a queue drained by one writer; the next frames are read meanwhile, so the
leader's pipeline stays full, up to ``ANSWERS_QUEUED_MAX`` answers waiting.
A failed fsync closes the link: the answer it would have carried is never
sent, and the leader, reconnecting, finds the replica refusing appends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from ring import limits
from ring.errors import BadRequest
from ring.node.ready import FromLeader, LeaderLink, Ready
from ring.replication import protocol, steps, versions
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

# Answers queued for the writer: when the link back to the leader is slower
# than the frames coming in, or fsyncs are, reading more frames stops here.
ANSWERS_QUEUED_MAX = 4096


class FollowerHost(Protocol):
    """What the follower needs from its broker."""

    def replica(self, topic: str, partition: int) -> Replica | None: ...

    async def wait_idle(self, part: Replica) -> None: ...

    def step(self, message: Any) -> Ready: ...

    def sync_soon(self, part: Replica) -> asyncio.Future[None]: ...


class _Writer:
    """Answers waiting for their fsync, sent in order by one task."""

    def __init__(self, ws: web.WebSocketResponse, version: int) -> None:
        self.ws = ws
        self.version = version  # the link's protocol version: the form of its answers
        self.queue: deque[tuple[asyncio.Future[None] | None, protocol.Frame]] = deque()
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.task = asyncio.create_task(self._run())

    def put(self, after: asyncio.Future[None] | None, frame: protocol.Frame) -> None:
        self.queue.append((after, frame))
        self.wake.set()
        if len(self.queue) >= ANSWERS_QUEUED_MAX:
            self.room.clear()

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue:
                after, frame = self.queue[0]
                if after is not None:
                    await asyncio.wait({after})
                    if after.exception() is not None:
                        raise ConnectionError("an fsync failed: its acknowledgement is never sent")
                self.queue.popleft()
                self.room.set()
                await self.ws.send_bytes(versions.encode(frame, self.version))


async def serve(ws: web.WebSocketResponse, leader: str, host: FollowerHost, version: int) -> None:
    """Follow ``leader`` on the link ``ws``, answering in ``version``'s frames (the link's negotiated one)."""
    writer = _Writer(ws, version)
    host.step(LeaderLink(leader, True))
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                continue
            frame = protocol.decode(msg.data, limits.REPLICATION_MESSAGE_BYTES_MAX)
            if not isinstance(frame, (protocol.Sync, protocol.Append, protocol.Hw)):
                raise BadRequest(f"{leader} sent a follower's frame")
            if not isinstance(frame, protocol.Append):
                rep = host.replica(frame.topic, frame.partition)
                if rep is not None and (isinstance(frame, protocol.Sync) or steps.start_behind(rep, frame)):
                    await host.wait_idle(rep)  # the log is cut, or its start moves: never beside an fsync
            ready = host.step(FromLeader(leader, frame))
            after = _persisted(ready, host)
            if after is None and not writer.queue:
                # Nothing ahead and nothing to sync: sent here, in order, without the writer's turn.
                try:
                    for _, answer in ready.sends:
                        await ws.send_bytes(versions.encode(answer, version))
                except ConnectionError:
                    break
                continue
            for _, answer in ready.sends:
                writer.put(after, answer)
            if writer.task.done():
                break
            if not writer.room.is_set():
                room = asyncio.ensure_future(writer.room.wait())
                await asyncio.wait({writer.task, room}, return_when=asyncio.FIRST_COMPLETED)
                room.cancel()
    except BadRequest as exc:
        log.warning("replication from %s: %s", leader, exc.message)
    finally:
        writer.task.cancel()
        await asyncio.gather(writer.task, return_exceptions=True)
        # (a leader whose link stays closed is lost, ring.node.watch; one it closed on purpose is not)
        host.step(LeaderLink(leader, False, ws.close_code == protocol.LINK_RETIRED))


def _persisted(ready: Ready, host: FollowerHost) -> asyncio.Future[None] | None:
    """A future resolved once the Ready's persist is done (None: nothing to wait for)."""
    futs = [host.sync_soon(rep) for rep, end in ready.persist if rep.durable < end]
    if not futs:
        return None
    if len(futs) == 1:
        return futs[0]
    return asyncio.ensure_future(asyncio.gather(*futs))

