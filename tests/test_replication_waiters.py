"""Produces waiting for acknowledgements on a leader replica (``ring.node.waiters.AckWaiters``).

Hundreds of produces wait on one partition at once; each durable end that
moves must release exactly the waiters it satisfies, for each consistency
level, in any order of arrival, counted against the voter set as it is when
they do; a leader that steps down fails the rest, and a wait past its
deadline fails when the core is ticked then.
"""

from __future__ import annotations

import random
from pathlib import Path

from ring.clock import ManualClock
from ring.errors import Unavailable
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.node.waiters import AckWaiters
from ring.replication import protocol
from ring.replication.replica import Replica

T0 = 1_700_000_000_000


def leader(tmp_path: Path, records: int) -> tuple[Replica, AckWaiters]:
    log = PartitionLog(tmp_path, LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, "a", ["a", "b", "c"])
    rep.lead()
    rep.acks = AckWaiters()
    for i in range(records):
        log.append(B.encode([(T0, None, b"v%d" % i, None)], now_ms=T0), rep.epoch)
    return rep, rep.acks


def outcomes(acks: AckWaiters) -> dict[object, BaseException | None]:
    out, acks.released = dict(acks.released), []
    return out


def test_each_end_releases_exactly_the_waiters_it_satisfies(tmp_path: Path) -> None:
    rng = random.Random(7)
    rep, acks = leader(tmp_path, 200)
    levels = {"one": 1, "quorum": 2, "all": 3}
    waiting = [(rng.randrange(1, 201), rng.choice(list(levels))) for _ in range(300)]
    for i, (end, level) in enumerate(waiting):
        acks.add(rep, i, end, level, deadline=60.0)
    released: dict[object, BaseException | None] = {}
    moves = [("a", rep.set_durable)] + [(f, lambda e, f=f: rep.set_follower_end(f, e)) for f in ("b", "c")]
    ends = {"a": 0, "b": 0, "c": 0}
    for _ in range(60):
        name, move = rng.choice(moves)
        ends[name] = min(200, ends[name] + rng.randrange(0, 15))
        move(ends[name])
        released.update(outcomes(acks))
        for i, (end, level) in enumerate(waiting):
            assert (i in released) == (protocol.replicas_reaching(ends.values(), end) >= levels[level]), (end, ends)
    assert all(exc is None for exc in released.values())
    rep.unlead(None, Unavailable("stepped down"))
    released.update(outcomes(acks))
    assert set(released) == set(range(len(waiting)))
    assert all(isinstance(released[i], Unavailable) for i in range(len(waiting)) if released[i] is not None)


def test_an_end_already_reached_releases_at_once_and_a_grown_voter_set_raises_the_bar(tmp_path: Path) -> None:
    rep, acks = leader(tmp_path, 5)
    rep.set_durable(5)
    acks.add(rep, "now", 5, "one", deadline=60.0)
    assert outcomes(acks) == {"now": None}
    acks.add(rep, "quorum", 5, "quorum", deadline=60.0)
    rep.set_voters(["a", "b", "c", "d"])  # a replica joins while it waits: a majority of four is three
    rep.set_follower_end("b", 5)
    assert outcomes(acks) == {}, "released by two of four voters"
    rep.set_follower_end("c", 5)
    assert outcomes(acks) == {"quorum": None}
    acks.add(rep, "all", 5, "all", deadline=60.0)
    rep.fail_waiters(Unavailable("moved"))
    assert isinstance(outcomes(acks)["all"], Unavailable)


def test_a_wait_fails_at_its_deadline_and_released_ones_do_not_linger(tmp_path: Path) -> None:
    rep, acks = leader(tmp_path, 10)
    rep.set_durable(10)
    for end in range(1, 6):
        acks.add(rep, end, end, "quorum", deadline=1.0)
    rep.set_follower_end("b", 5)
    assert outcomes(acks) == {end: None for end in range(1, 6)}
    assert acks.next_deadline() is None  # nothing left to expire: no memory held for a whole timeout per produce
    acks.add(rep, "late", 10, "quorum", deadline=2.0)
    acks.add(rep, "later", 10, "all", deadline=3.0)
    assert acks.expire(1.9) == 2.0 and outcomes(acks) == {}
    assert acks.expire(2.0) == 3.0
    assert isinstance(outcomes(acks)["late"], TimeoutError)
    rep.set_follower_end("b", 10)
    rep.set_follower_end("c", 10)
    assert outcomes(acks) == {"later": None} and acks.next_deadline() is None
