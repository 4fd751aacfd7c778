"""Produces waiting for acknowledgements on a leader replica (``Replica.wait_replicas``).

Hundreds of produces wait on one partition at once; each durable end that
moves must release exactly the waiters it satisfies, for each consistency
level, in any order of arrival, and a leader that steps down fails the rest.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from ring.clock import ManualClock
from ring.errors import Unavailable
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.replication import protocol
from ring.replication.replica import Replica

T0 = 1_700_000_000_000


def leader(tmp_path: Path, records: int) -> Replica:
    log = PartitionLog(tmp_path, LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, "a", ["a", "b", "c"])
    rep.lead()
    for i in range(records):
        log.append(B.encode([(T0, None, b"v%d" % i, None)], now_ms=T0), rep.epoch)
    return rep


async def test_each_end_releases_exactly_the_waiters_it_satisfies(tmp_path: Path) -> None:
    rng = random.Random(7)
    rep = leader(tmp_path, 200)
    waiting = [(rng.randrange(1, 201), rng.choice((1, 2, 3))) for _ in range(300)]
    futs = [rep.wait_replicas(end, needed) for end, needed in waiting]
    moves = [("a", rep.set_durable)] + [(f, lambda e, f=f: rep.set_follower_end(f, e)) for f in ("b", "c")]
    ends = {"a": 0, "b": 0, "c": 0}
    for _ in range(60):
        name, move = rng.choice(moves)
        ends[name] = min(200, ends[name] + rng.randrange(0, 15))
        move(ends[name])
        for (end, needed), fut in zip(waiting, futs):
            assert fut.done() == (protocol.replicas_reaching(ends.values(), end) >= needed), (end, needed, ends)
    rep.unlead(None, Unavailable("stepped down"))
    for fut in futs:
        assert fut.done()
        if fut.exception() is not None:
            assert isinstance(fut.exception(), Unavailable)


async def test_an_end_already_reached_resolves_at_once_and_a_level_above_the_voters_waits(tmp_path: Path) -> None:
    rep = leader(tmp_path, 5)
    rep.set_durable(5)
    assert rep.wait_replicas(5, 1).done()
    more = rep.wait_replicas(5, 4)  # more than the three voters: only failing it ends the wait
    rep.set_follower_end("b", 5)
    rep.set_follower_end("c", 5)
    await asyncio.sleep(0)
    assert not more.done()
    rep.fail_waiters(Unavailable("moved"))
    with pytest.raises(Unavailable):
        await more


async def test_a_wait_with_a_timeout_fails_after_it_and_released_ones_do_not_linger(tmp_path: Path) -> None:
    rep = leader(tmp_path, 10)
    rep.set_durable(10)
    released = [rep.wait_replicas(end, 2, timeout_s=0.05) for end in range(1, 6)]
    rep.set_follower_end("b", 5)
    assert all(f.done() and f.exception() is None for f in released)
    assert not rep._ack_deadlines  # nothing left to expire: no memory held for a whole timeout per produce
    late = rep.wait_replicas(10, 2, timeout_s=0.05)
    untimed = rep.wait_replicas(10, 3)
    with pytest.raises(TimeoutError):
        await late
    assert not untimed.done()
    rep.set_follower_end("b", 10)
    rep.set_follower_end("c", 10)
    assert untimed.done() and rep._ack_timer is None
