"""The leader's sender (``FollowerLink._send_loop``) looks only at the partitions marked since its
last turn, so a produce costs the same beside one partition or thousands, and a partition that
stopped at the link's in-flight budget is sent as soon as an answer frees room."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from ring import limits
from ring.clock import ManualClock
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.replication import leader as leadermod
from ring.replication import protocol
from ring.replication.replica import Replica
from tests.support import until

T0 = 1_700_000_000_000
PARTITIONS = 50


class FakeSocket:
    """The websocket of one link: frames sent are decoded and kept; answers are fed in."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(protocol.decode(data, limits.REPLICATION_MESSAGE_BYTES_MAX))

    def __aiter__(self) -> FakeSocket:
        return self

    async def __anext__(self) -> Any:
        return SimpleNamespace(type=aiohttp.WSMsgType.BINARY, data=await self.inbox.get())

    def appends(self) -> list[int]:
        return [f.partition for f in self.sent if isinstance(f, protocol.Append)]


def append(rep: Replica, value: bytes) -> None:
    rep.log.append(B.encode([(T0, None, value, None)], now_ms=T0), rep.epoch)


@pytest.fixture
def reps(tmp_path: Path) -> dict[int, Replica]:
    out = {}
    for p in range(PARTITIONS):
        log = PartitionLog(tmp_path / str(p), LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
        rep = Replica("t", p, log, "a", ["a", "b", "c"])
        rep.lead()
        out[p] = rep
    return out


async def test_the_sender_looks_only_at_marked_partitions_and_resumes_blocked_ones_on_an_answer(
        reps: dict[int, Replica], monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[int] = []

    def replica(topic: str, p: int) -> Replica | None:
        looked.append(p)
        return reps.get(p)

    streams = leadermod.Streams("a", None, ManualClock(T0), None, lambda name: None,  # type: ignore[arg-type]
                                replica)
    ws = FakeSocket()
    tasks: list[asyncio.Task[None]] = []
    try:
        streams.assign({"b": {("t", p) for p in reps}})
        link = streams.links["b"]
        for (_, p), cur in link.cursors.items():  # the follower is in sync on every partition
            cur.next, cur.hw_sent = reps[p].log.end_offset, reps[p].hw
        link.ready.clear()
        link.timed.clear()
        tasks = [asyncio.create_task(link._send_loop(ws)),  # type: ignore[arg-type]
                 asyncio.create_task(link._receive_loop(ws))]  # type: ignore[arg-type]
        append(reps[7], b"one")
        streams.notify(reps[7])
        await until("the append frame of partition 7", ws.appends)
        # The loop runs its turns in order: anything looked at or sent before 7 would show here.
        assert ws.appends() == [7] and {f.partition for f in ws.sent} == {7}
        assert set(looked) == {7}, "a produce looked at other partitions"
        ws.inbox.put_nowait(protocol.encode(protocol.Ack("t", 7, reps[7].epoch, reps[7].log.end_offset)))
        await until("the ack of partition 7 freeing the budget", lambda: link.inflight_bytes() == 0)

        # A budget of one byte: the first frame fills it, the second partition waits for an answer.
        monkeypatch.setattr(limits, "REPLICATION_INFLIGHT_BYTES_MAX", 1)
        ws.sent.clear()
        for p in (1, 2):
            append(reps[p], b"two")
            streams.notify(reps[p])
        await until("partition 2 blocked on the budget", lambda: ("t", 2) in link.blocked)
        assert ws.appends() == [1]
        # The answer for 1 frees the budget: 2 goes without any new record of its own.
        ws.inbox.put_nowait(protocol.encode(protocol.Ack("t", 1, reps[1].epoch, reps[1].log.end_offset)))
        await until("the append frame of partition 2", lambda: ws.appends() == [1, 2])
        assert not link.blocked
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await streams.close()
        for rep in reps.values():
            rep.log.close()


async def test_a_follower_that_does_not_answer_with_this_versions_subprotocol_gets_no_frame(
        reps: dict[int, Replica], caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp import web

    got: list[bytes] = []
    accepted = asyncio.Event()

    async def old_follower(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()  # an older broker: no subprotocol named back
        await ws.prepare(request)
        accepted.set()
        async for msg in ws:
            got.append(msg.data)
        return ws

    app = web.Application()
    app.router.add_get(leadermod.REPLICATE_PATH, old_follower)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    session = aiohttp.ClientSession()
    streams = leadermod.Streams("a", "s", ManualClock(T0), session, lambda name: f"http://127.0.0.1:{port}",
                                reps.get)
    try:
        streams.assign({"b": {("t", 0)}})
        await asyncio.wait_for(accepted.wait(), 10)
        for _ in range(100):  # the link is closed as soon as its answer is read
            if any("speaks another replication protocol" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
        assert any("speaks another replication protocol than ring-replication.2" in r.getMessage()
                   for r in caplog.records)
        assert got == [] and not streams.links["b"].connected
    finally:
        await streams.close()
        await session.close()
        await runner.cleanup()
