"""Group requests that overlap a member's poll, on a real broker alone in this process: a rebalance, a
reset or a seek while a poll long-polls must leave the member's state as if they had come before or
after it, never half of each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ring.catalog import TopicConfig
from ring.errors import Conflict
from ring.group_requests import GroupPoll
from ring.groups.service import Groups
from ring.produce import Produce, Records
from ring.replication.intake import results_of
from tests.support import lone_broker, until

SESSION_MS = 1_000  # the shortest session a member may have: its expiry is what the first test waits for


async def _parked(b, count: int = 1) -> None:
    await until("the member's poll waiting for records", lambda: b.status()["long_polls_open"] >= count, 10)


async def test_a_member_whose_poll_met_a_rebalance_still_expires(tmp_path: Path) -> None:
    """``a`` long-polls, ``b`` joins (a rebalance: ``a``'s poll ends with 409), then ``a`` goes silent
    (its process died): its session runs out and ``b`` gets every partition."""
    b = await lone_broker(tmp_path, "never")
    try:
        await b.add_topic(TopicConfig(name="t", partitions=2, replication_factor=1, created_ms=1))
        groups = Groups(b)
        joined = await groups.join("g", "a", ["t"], SESSION_MS, None, "earliest")
        poll = asyncio.ensure_future(groups.poll(GroupPoll("g", "a", joined["generation"], 10, 5_000)))
        await _parked(b)
        await groups.join("g", "b", ["t"], 60_000, None, "earliest")
        with pytest.raises(Conflict):
            await asyncio.wait_for(poll, 10)

        async def gone() -> bool:
            await groups.coord.tick()  # the coordinator's timer, run here
            await groups.join("g", "b", ["t"], 60_000, None, "earliest")  # b heartbeats
            return "a" not in (await groups.coord.existing("g")).members

        await until("a's session running out", gone, 10, interval_s=0.2)
        g = await groups.coord.existing("g")
        assert sorted(g.members["b"].spec.assignment) == [("t", 0), ("t", 1)]
        await groups.coord.close()
    finally:
        await b.close()


async def _produce(b, n: int) -> None:
    records = [(None, None, b'{"i": 1}', None)] * n
    await results_of("t", b.intake.produce(Produce("t", Records(records, [24] * n, True, False), 0)))


@pytest.mark.parametrize("move", ["reset", "seek"])
async def test_a_reset_or_seek_during_a_first_poll_is_where_reading_goes_on(tmp_path: Path, move: str) -> None:
    """A member that reads from ``latest`` long-polls for the first time (its start is chosen then);
    meanwhile the group's offsets are reset to the earliest, or the member seeks there. The records
    from 0 come next, and nothing past them is committed before they do."""
    b = await lone_broker(tmp_path, "never")
    try:
        await b.add_topic(TopicConfig(name="t", partitions=1, replication_factor=1, created_ms=1))
        await _produce(b, 10)
        groups = Groups(b)
        gen = (await groups.join("g", "a", ["t"], 60_000, None, "latest"))["generation"]
        poll = asyncio.ensure_future(groups.poll(GroupPoll("g", "a", gen, 100, 5_000)))
        await _parked(b)
        if move == "reset":
            await groups.reset("g", "t", "earliest", None, None)
        else:
            await groups.seek("g", "a", gen, [("t", 0, 0)])
        await _produce(b, 1)  # wakes the poll: it read from where it started, 10
        first = await asyncio.wait_for(poll, 10)
        assert [r.offset for _, _, r, _ in first.records] == [10]
        after = await groups.poll(GroupPoll("g", "a", gen, 100, 0, True, first.token))
        assert [r.offset for _, _, r, _ in after.records] == list(range(11))
        assert (await groups.coord.existing("g")).committed.get(("t", 0), 0) == 0
        await groups.coord.close()
    finally:
        await b.close()
