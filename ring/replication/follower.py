"""The follower's side of replication: one leader's websocket, served on the peer port.

Frames are handled one at a time in arrival order, so appends land in the
order the leader sent them. Each sync and append frame gets exactly one
answer, an hw frame only a reject (an ack would repeat the durable end the
last append's ack named: a message each way saved per high-watermark move),
and answers leave in the same order: through a bounded queue drained by one
writer, or at once when none is queued and the answer is ready. An accepted
append is answered with an ack once its batches are durable by this broker's
fsync policy (at once, or by group commit with ``always``; the next frames
are read meanwhile, so the leader's pipeline stays full), a refused one at
once with a reject naming this replica's end offset. Appends go on while an
fsync thread runs on the log; moving the log start (an hw frame naming a new
one) waits for it. A sync (the leader's first frame for a
partition) makes this replica follow the sender in its epoch, cutting its
log back to where it agrees with the leader's first (after any running
fsync). What each frame does is ``steps`` (``on_sync``, ``on_append``,
``on_hw``); the append itself is the log's ``append_replicated``, which
checks every batch (CRC, contiguous offsets, epochs) before writing any.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Protocol

from aiohttp import WSMsgType, web

from ring import limits
from ring.errors import BadRequest, Conflict, CorruptBatch, OffsetOutOfRange, RingError, StorageError
from ring.replication import protocol, steps
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

# Answers queued for the writer: when the link back to the leader is slower
# than the frames coming in, reading more frames stops here.
ANSWERS_QUEUED_MAX = 4096


class Host(Protocol):
    """What the follower needs from its broker."""

    def replica(self, topic: str, partition: int) -> Replica | None: ...

    async def wait_idle(self, part: Replica) -> None: ...

    async def make_durable(self, part: Replica, end: int) -> None: ...

    def durable_now(self, part: Replica, end: int) -> bool: ...

    def check_appendable(self, part: Replica) -> None: ...

    def leadership_changed(self, part: Replica) -> None: ...


async def serve(ws: web.WebSocketResponse, leader: str, host: Host) -> None:
    answers: asyncio.Queue[Awaitable[protocol.Frame]] = asyncio.Queue(ANSWERS_QUEUED_MAX)
    queued = [0]  # answers put and not yet sent by the writer
    writer = asyncio.create_task(_write(ws, answers, queued))
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                continue
            frame = protocol.decode(msg.data, limits.REPLICATION_MESSAGE_BYTES_MAX)
            if isinstance(frame, protocol.Sync):
                answer = _done(await _sync(frame, leader, host))
            elif isinstance(frame, protocol.Append):
                answer = await _append(frame, leader, host)
            elif isinstance(frame, protocol.Hw):
                told = await _hw(frame, leader, host)
                if isinstance(told, protocol.Ack):
                    continue  # it would repeat the durable end the last append's ack named
                answer = _done(told)
            else:
                raise BadRequest(f"{leader} sent a follower's frame")
            if not queued[0] and answer.done():
                # Nothing ahead of it: sent here, in order, without the writer's turn of the loop.
                try:
                    await ws.send_bytes(protocol.encode(answer.result()))
                except ConnectionError:
                    break
                continue
            queued[0] += 1
            await answers.put(answer)
            if writer.done():
                break
    except BadRequest as exc:
        log.warning("replication from %s: %s", leader, exc.message)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def _write(ws: web.WebSocketResponse, answers: asyncio.Queue[Awaitable[protocol.Frame]],
                 queued: list[int]) -> None:
    while True:
        frame = await (await answers.get())
        await ws.send_bytes(protocol.encode(frame))
        queued[0] -= 1


def _done(frame: protocol.Frame) -> asyncio.Future[protocol.Frame]:
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(frame)
    return fut


async def _sync(frame: protocol.Sync, leader: str, host: Host) -> protocol.Frame:
    rep = host.replica(frame.topic, frame.partition)
    if rep is None:
        return steps.reject_unknown(frame.topic, frame.partition, frame.epoch)
    try:
        await host.wait_idle(rep)
    except RingError:
        return steps.reject_storage(rep, frame.epoch)
    before = (rep.leader, rep.epoch)
    try:
        answer = steps.on_sync(rep, leader, frame)  # no await: the log is as the verdict saw it
    except (StorageError, OffsetOutOfRange, Conflict) as exc:
        log.error("%s/%d: following %s failed: %s", rep.topic, rep.index, leader, exc.message)
        answer = steps.reject_storage(rep, frame.epoch)
    if (rep.leader, rep.epoch) != before:
        host.leadership_changed(rep)
    return answer


async def _hw(frame: protocol.Hw, leader: str, host: Host) -> protocol.Frame:
    rep = host.replica(frame.topic, frame.partition)
    if rep is None:
        return steps.reject_unknown(frame.topic, frame.partition, frame.epoch)
    if steps.start_behind(rep, frame) and steps.following(rep, leader, frame.epoch):
        try:
            await host.wait_idle(rep)  # the log start moves: files go, never beside an fsync
        except RingError:
            return steps.reject_storage(rep, frame.epoch)
        rep = host.replica(frame.topic, frame.partition)
        if rep is None:
            return steps.reject_unknown(frame.topic, frame.partition, frame.epoch)
    try:
        return steps.on_hw(rep, leader, frame)
    except (StorageError, OffsetOutOfRange) as exc:
        log.error("%s/%d: following %s's log start %d failed: %s", rep.topic, rep.index, leader, frame.log_start,
                  exc.message)
        return steps.reject_storage(rep, frame.epoch)


async def _append(frame: protocol.Append, leader: str, host: Host) -> Awaitable[protocol.Frame]:
    rep = host.replica(frame.topic, frame.partition)
    if rep is None:
        return _done(steps.reject_unknown(frame.topic, frame.partition, frame.epoch))
    try:
        host.check_appendable(rep)  # appends go on beside a running fsync
    except RingError:
        return _done(steps.reject_storage(rep, frame.epoch))
    try:
        end = steps.on_append(rep, leader, frame)  # no await from the verdict to the append
    except (CorruptBatch, Conflict, StorageError) as exc:
        log.error("%s/%d from %s: refused replicated batches: %s", rep.topic, rep.index, leader, exc.message)
        return _done(steps.reject_storage(rep, frame.epoch))
    if isinstance(end, protocol.Reject):
        return _done(end)
    if host.durable_now(rep, end):  # no fsync to wait for: the ack without a task of its own
        return _done(steps.ack(rep))
    return asyncio.ensure_future(_ack_when_durable(frame, rep, end, host))


async def _ack_when_durable(frame: protocol.Append, rep: Replica, end: int, host: Host) -> protocol.Frame:
    try:
        await host.make_durable(rep, end)
    except RingError:
        return steps.reject_storage(rep, frame.epoch)
    return steps.ack(rep)
