"""A follower's answers go out through the one executor (``ring.node.executor``) and the broker's effects
(``ring.cluster.pump.BrokerEffects``): the persist starts the fsync, and each answer waits for it on the
leader's answer link (``ring.cluster.follower.AnswerLink``), in order; a failed fsync closes the link with
its answer unsent; an answer with nothing to wait for and nothing ahead leaves in the stepping task's turn.
The fsync is a future the test resolves: the disk's part, stood in for. On a real broker's peer port, a
newer link from the same leader supersedes the older one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ring.clock import ManualClock
from ring.cluster.follower import ANSWERS_QUEUED_MAX, AnswerLink
from ring.cluster.pump import NodePump
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.node.ready import Ready
from ring.replication import protocol, versions
from ring.replication.replica import Replica

LEADER = "a"


class _Socket:
    """The websocket back to the leader: what was sent on it, decoded."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(protocol.decode(data, 1 << 20))


def _ack(end: int) -> protocol.FollowerAck:
    return protocol.FollowerAck("t", 0, 1, end)


class _Follower:
    """A pump whose fsyncs are futures the test resolves, and the answer link of one leader's websocket."""

    def __init__(self, tmp_path: Path) -> None:
        log = PartitionLog(tmp_path / "b", LogConfig(segment_bytes=4096, fsync=FsyncPolicy("always")), ManualClock())
        self.rep = Replica("t", 0, log, "b", [LEADER, "b", "c"])
        self.fsyncs: list[asyncio.Future[None]] = []
        self.pump: Any = NodePump(None, None, None, sync_soon=self._sync_soon)  # type: ignore[arg-type]
        self.ws = _Socket()
        self.answers = AnswerLink(self.ws, versions.PROTOCOL_MAX)  # type: ignore[arg-type]
        self.pump.answer_links[LEADER] = self.answers

    def _sync_soon(self, rep: Replica) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.fsyncs.append(fut)
        return fut

    def carry_out(self, answer: protocol.FollowerAck, persist_to: int | None) -> None:
        """A FromLeader step's Ready: an append's persist (when ``persist_to``) and its answer."""
        ready = Ready()
        if persist_to is not None:
            self.rep.durable = 0
            ready.persist = [(self.rep, persist_to)]
        ready.sends = [(LEADER, answer)]
        self.pump.carry_out(ready)

    async def close(self) -> None:
        self.answers.task.cancel()
        await asyncio.gather(self.answers.task, return_exceptions=True)


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _until_sent(f: _Follower) -> None:
    """Until the answer link has nothing left to send (each answer waits for its future a few turns)."""
    async def drained() -> None:
        while f.answers.queue or f.answers.sending:
            await asyncio.sleep(0)
    await asyncio.wait_for(drained(), 5)


async def test_an_answer_leaves_only_once_its_fsync_is_done_and_the_next_waits_behind_it(tmp_path: Path) -> None:
    f = _Follower(tmp_path)
    f.carry_out(_ack(5), persist_to=5)
    f.carry_out(_ack(5), persist_to=None)  # (an answer that waits for nothing, behind one that waits)
    await f.answers.send_ready()
    assert len(f.fsyncs) == 1  # the persist started the fsync
    await _turns()
    assert f.ws.sent == []  # neither left: the first waits for its fsync, the second for the first
    f.fsyncs[0].set_result(None)
    await _until_sent(f)
    assert f.ws.sent == [_ack(5), _ack(5)]
    await f.close()


async def test_a_failed_fsync_closes_the_link_and_its_answer_is_never_sent(tmp_path: Path) -> None:
    f = _Follower(tmp_path)
    f.carry_out(_ack(3), persist_to=3)
    f.carry_out(_ack(3), persist_to=None)
    f.fsyncs[0].set_exception(OSError(5, "Input/output error"))
    await asyncio.wait({f.answers.task})
    with pytest.raises(ConnectionError, match="fsync failed"):
        f.answers.task.result()
    assert f.ws.sent == []


async def test_an_answer_with_nothing_to_wait_for_leaves_in_the_stepping_task(tmp_path: Path) -> None:
    f = _Follower(tmp_path)
    f.carry_out(_ack(1), persist_to=None)
    assert not f.answers.wake.is_set()  # the writer task is not woken for it
    await f.answers.send_ready()  # (serve's call right after the step: no other task runs meanwhile)
    assert f.ws.sent == [_ack(1)]
    await f.close()


async def test_a_full_answer_queue_stops_reading_until_answers_leave(tmp_path: Path) -> None:
    f = _Follower(tmp_path)
    for _ in range(ANSWERS_QUEUED_MAX):
        f.carry_out(_ack(2), persist_to=2)
    assert not f.answers.room.is_set()  # serve waits for room before it reads the next frame
    for fut in f.fsyncs:
        fut.set_result(None)
    await asyncio.wait_for(f.answers.room.wait(), 5)
    await _until_sent(f)
    assert len(f.ws.sent) == ANSWERS_QUEUED_MAX
    await f.close()


async def test_an_answer_to_a_leader_with_no_link_open_is_dropped(tmp_path: Path) -> None:
    f = _Follower(tmp_path)
    del f.pump.answer_links[LEADER]
    f.carry_out(_ack(1), persist_to=None)
    await f.answers.send_ready()
    assert f.ws.sent == [] and not f.answers.queue
    await f.close()


async def test_a_newer_link_from_the_same_leader_supersedes_the_older_one(shared_cluster) -> None:
    """On a real broker's peer port: a second replication link under the same leader name takes the
    leader's answers over; the first stops at its next frame, closed with that frame unanswered."""
    import aiohttp

    member = shared_cluster[1]
    url = f"http://{member.local.host}:{member.peer_port}/peer/v1/replicate"
    headers = {**member.auth, "Ring-Broker": "ring-superseded-test"}
    frame = protocol.encode(protocol.Sync("no-such-topic", 0, 3, 0, 0, 0, 0, (), ("ring-superseded-test",)))

    async def answer(ws: aiohttp.ClientWebSocketResponse) -> Any:
        msg = await asyncio.wait_for(ws.receive(), 10)
        return protocol.decode(msg.data, 1 << 20) if msg.type == aiohttp.WSMsgType.BINARY else msg.type

    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(url, protocols=(protocol.SUBPROTOCOL,), headers=headers) as old:
            await old.send_bytes(frame)
            assert isinstance(await answer(old), protocol.Reject)  # (it holds no such partition)
            async with session.ws_connect(url, protocols=(protocol.SUBPROTOCOL,), headers=headers) as new:
                await old.send_bytes(frame)
                assert await answer(old) in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                await new.send_bytes(frame)
                assert isinstance(await answer(new), protocol.Reject)
