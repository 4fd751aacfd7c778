"""The order in which the node core's driver carries out a Ready: a leader's hw frames go to the
kernel before the produces they commit are answered, so a client that reads from a follower right
after its acknowledgement finds the records committed there (ring.cluster.pump.NodePump)."""

from __future__ import annotations

import asyncio
from typing import Any

from ring.cluster.pump import NodePump
from ring.node.ready import Ready


class _Link:
    """A follower's link as NodePump sees it: ``kick`` wakes a sender waiting on ``wake``, which
    then writes the frames the core gives it (``ring.cluster.leader.LinkDriver._send_loop``)."""

    def __init__(self, written: list[str]) -> None:
        self.wake = asyncio.Event()
        self.task = asyncio.create_task(self._send_loop(written))

    def kick(self) -> None:
        self.wake.set()

    async def _send_loop(self, written: list[str]) -> None:
        await self.wake.wait()
        written.append("hw frame")


async def test_a_readys_hw_frames_are_written_before_its_answers() -> None:
    written: list[str] = []
    pump: Any = NodePump(None, None, None)  # type: ignore[arg-type]  # carry_out uses neither
    pump.links = {"f1": _Link(written), "f2": _Link(written)}
    await asyncio.sleep(0)  # both senders wait on their wake events
    answer = asyncio.get_running_loop().create_future()
    answer.add_done_callback(lambda _: written.append("answer"))
    ready = Ready()
    ready.flush = ["f1", "f2"]
    ready.releases = [(answer, None)]
    pump.carry_out(ready)
    await asyncio.gather(*(link.task for link in pump.links.values()))
    await asyncio.sleep(0)
    assert written == ["hw frame", "hw frame", "answer"]
