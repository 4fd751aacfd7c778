"""The follower's side of replication on the wire: one leader's websocket, served on the peer port.

Frames are stepped into the node core one at a time in arrival order
(``FromLeader``), so appends land in the order the leader sent them; the
core answers each sync and append frame exactly once and an hw frame only
when it refuses it or it moved the log start. Before a sync (which may cut
the log) and an hw frame that moves the log start (files go), the driver
waits until no fsync runs on that log; appends go on beside one.

Each Ready is carried out by the one executor (``ring.node.executor``,
through the pump's ``BrokerEffects``): its persist starts the fsync, and
each answer to the leader is handed, with that fsync's future, to this
link's ``AnswerLink``, which ``serve`` registers with the pump under the
leader's name while it runs (a newer link from the same leader supersedes
it, and this one stops reading). The answer link sends the answers on this
websocket in order, each once the fsync it waits for has finished: an answer
with nothing to wait for and nothing ahead of it is sent by ``serve`` itself
right after the step (every policy but ``always``), the rest by one writer
task. The next frames are read meanwhile, so the leader's pipeline stays
full, up to ``ANSWERS_QUEUED_MAX`` answers waiting. A failed fsync closes the
link: the answer it would have carried is never sent, and the leader,
reconnecting, finds the replica refusing appends.
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

    def answer_links(self) -> dict[str, AnswerLink]:
        """The pump's answer links by leader name, where the executor hands a follower's answers."""


class AnswerLink:
    """The answers to one leader's link, each waiting for its fsync, sent in order on its websocket."""

    def __init__(self, ws: web.WebSocketResponse, version: int) -> None:
        self.ws = ws
        self.version = version  # the link's protocol version: the form of its answers
        self.queue: deque[tuple[asyncio.Future[None] | None, protocol.Frame]] = deque()
        self.sending = False  # one sender at a time: the writer task, or serve's own turn
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.task = asyncio.create_task(self._run())

    def put(self, after: asyncio.Future[None] | None, frame: protocol.Frame) -> None:
        """Send ``frame`` after every answer put before it, once ``after`` (an fsync; None: nothing) is done."""
        self.queue.append((after, frame))
        if after is not None:
            self.wake.set()
        if len(self.queue) >= ANSWERS_QUEUED_MAX:
            self.room.clear()

    async def send_ready(self) -> None:
        """Send, in this task, the answers at the head that wait for nothing (unless the writer is sending);
        what is left is the writer's."""
        if self.sending or not self.queue:
            return
        self.sending = True
        try:
            while self.queue and self.queue[0][0] is None:
                _, frame = self.queue.popleft()
                await self.ws.send_bytes(versions.encode(frame, self.version))
        finally:
            self.sending = False
            self._room()
            if self.queue:
                self.wake.set()

    def _room(self) -> None:
        if len(self.queue) < ANSWERS_QUEUED_MAX:
            self.room.set()

    async def _run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.sending:
                continue  # (serve's turn wakes this again when it leaves answers behind)
            self.sending = True
            try:
                while self.queue:
                    after, frame = self.queue[0]
                    if after is not None:
                        await asyncio.wait({after})
                        if after.exception() is not None:
                            raise ConnectionError("an fsync failed: its acknowledgement is never sent")
                    self.queue.popleft()
                    self._room()
                    await self.ws.send_bytes(versions.encode(frame, self.version))
            finally:
                self.sending = False


async def serve(ws: web.WebSocketResponse, leader: str, host: FollowerHost, version: int) -> None:
    """Follow ``leader`` on the link ``ws``, answering in ``version``'s frames (the link's negotiated one)."""
    answers = AnswerLink(ws, version)
    links = host.answer_links()
    links[leader] = answers  # (a link of this leader still open is superseded: it stops at its next frame)
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
            if links.get(leader) is not answers:
                log.info("replication link from %s superseded by a newer one", leader)
                break
            host.step(FromLeader(leader, frame))  # (its answers go to ``answers``, see the module's docstring)
            try:
                await answers.send_ready()
            except ConnectionError:
                break
            if answers.task.done():
                break
            if not answers.room.is_set():
                room = asyncio.ensure_future(answers.room.wait())
                await asyncio.wait({answers.task, room}, return_when=asyncio.FIRST_COMPLETED)
                room.cancel()
    except BadRequest as exc:
        log.warning("replication from %s: %s", leader, exc.message)
    finally:
        if links.get(leader) is answers:
            del links[leader]
        answers.task.cancel()
        await asyncio.gather(answers.task, return_exceptions=True)
        # (a leader whose link stays closed is lost, ring.node.watch; one it closed on purpose is not)
        host.step(LeaderLink(leader, False, ws.close_code == protocol.LINK_RETIRED))
