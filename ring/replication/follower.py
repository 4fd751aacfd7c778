"""The follower's side of replication: one leader's websocket, served on the peer port.

Frames are handled one at a time in arrival order, so appends land in the
order the leader sent them. Each frame gets exactly one answer, and answers
leave in the same order through a bounded queue drained by one writer: an
accepted append is answered with an ack once its batches are durable by this
broker's fsync policy (group commit with ``always``; the next frames are
read meanwhile, so the leader's pipeline stays full), a refused one at once
with a reject naming this replica's end offset. The accept/reject rule is
``protocol.judge_append``; the append itself is the log's
``append_replicated``, which checks every batch (CRC, contiguous offsets,
epochs) before writing any.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Protocol

from aiohttp import WSMsgType, web

from ring import limits
from ring.errors import BadRequest, Conflict, CorruptBatch, RingError, StorageError
from ring.replication import protocol
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

# Answers queued for the writer: when the link back to the leader is slower
# than the frames coming in, reading more frames stops here.
ANSWERS_QUEUED_MAX = 4096


class Host(Protocol):
    """What the follower needs from its broker."""

    def replica(self, topic: str, partition: int) -> Replica | None: ...

    async def wait_writable(self, part: Replica) -> None: ...

    async def make_durable(self, part: Replica, end: int) -> None: ...

    def set_epoch(self, part: Replica, epoch: int) -> None: ...


async def serve(ws: web.WebSocketResponse, leader: str, host: Host) -> None:
    answers: asyncio.Queue[Awaitable[protocol.Frame]] = asyncio.Queue(ANSWERS_QUEUED_MAX)
    writer = asyncio.create_task(_write(ws, answers))
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                continue
            frame = protocol.decode(msg.data, limits.REPLICATION_MESSAGE_BYTES_MAX)
            if isinstance(frame, protocol.Append):
                answer = await _append(frame, leader, host)
            elif isinstance(frame, protocol.Hw):
                answer = _done(_hw(frame, leader, host))
            else:
                raise BadRequest(f"{leader} sent a follower's frame")
            await answers.put(answer)
            if writer.done():
                break
    except BadRequest as exc:
        log.warning("replication from %s: %s", leader, exc.message)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def _write(ws: web.WebSocketResponse, answers: asyncio.Queue[Awaitable[protocol.Frame]]) -> None:
    while True:
        frame = await (await answers.get())
        await ws.send_bytes(protocol.encode(frame))


def _done(frame: protocol.Frame) -> asyncio.Future[protocol.Frame]:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(frame)
    return fut


def _reject(frame: protocol.Append | protocol.Hw, rep: Replica | None, reason: str) -> protocol.Reject:
    if rep is None:
        return protocol.Reject(frame.topic, frame.partition, frame.epoch, -1, reason)
    return protocol.Reject(frame.topic, frame.partition, rep.epoch, rep.log.end_offset, reason)


def _leads(rep: Replica, leader: str) -> bool:
    return rep.leader == leader and not rep.is_leader


def _hw(frame: protocol.Hw, leader: str, host: Host) -> protocol.Frame:
    rep = host.replica(frame.topic, frame.partition)
    if rep is None:
        return _reject(frame, None, protocol.UNKNOWN_PARTITION)
    if not _leads(rep, leader):
        return _reject(frame, rep, protocol.NOT_FOLLOWER)
    if frame.epoch < rep.epoch:
        return _reject(frame, rep, protocol.STALE_EPOCH)
    rep.set_leader_hw(frame.hw)
    return protocol.Ack(frame.topic, frame.partition, rep.epoch, rep.durable)


async def _append(frame: protocol.Append, leader: str, host: Host) -> Awaitable[protocol.Frame]:
    rep = host.replica(frame.topic, frame.partition)
    if rep is None:
        return _done(_reject(frame, None, protocol.UNKNOWN_PARTITION))
    try:
        await host.wait_writable(rep)
    except RingError:
        return _done(_reject(frame, rep, protocol.STORAGE))
    # No await from here to the append: the verdict holds for the log as it is written.
    verdict = protocol.judge_append(rep.epoch, rep.log.end_offset, _leads(rep, leader), frame.epoch, frame.prev_end)
    if verdict is not None:
        return _done(_reject(frame, rep, verdict))
    if frame.epoch > rep.epoch:
        host.set_epoch(rep, frame.epoch)
    try:
        end = rep.log.append_replicated(frame.data)
    except (CorruptBatch, Conflict, StorageError) as exc:
        log.error("%s/%d from %s: refused replicated batches: %s", rep.topic, rep.index, leader, exc.message)
        return _done(_reject(frame, rep, protocol.STORAGE))
    rep.set_leader_hw(frame.hw)
    return asyncio.ensure_future(_ack_when_durable(frame, rep, end, host))


async def _ack_when_durable(frame: protocol.Append, rep: Replica, end: int, host: Host) -> protocol.Frame:
    try:
        await host.make_durable(rep, end)
    except RingError:
        return _reject(frame, rep, protocol.STORAGE)
    return protocol.Ack(frame.topic, frame.partition, rep.epoch, rep.durable)
