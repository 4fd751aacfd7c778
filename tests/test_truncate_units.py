"""A truncate holds once a majority of the voters holds its start, and a failover keeps it.

The steps and the core's waiters run on real partition logs: the leader's
truncate waits (``AckWaiters.add_start``) until a follower's ack of the hw
frame that moved its start makes a majority, or fails at its deadline; a
replica that never took the start wins an election with the vote of one that
did, and serves nothing below that start (``Replica.serves_from``) before and
after ``lead_start`` moves its own log there.
"""

from __future__ import annotations

from pathlib import Path

from ring.clock import ManualClock
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.node.waiters import AckWaiters
from ring.replication import election, protocol, steps
from ring.replication.replica import Replica

T0 = 1_700_000_000_000
NAMES = ["a", "b", "c"]


def opened(tmp_path: Path, name: str, records: int) -> Replica:
    log = PartitionLog(tmp_path / name, LogConfig(segment_bytes=4096, fsync=FsyncPolicy("never")), ManualClock(T0))
    for i in range(records):
        log.append(B.encode([(T0, None, b"v%d" % i * 8, None)], now_ms=T0), 1)
    rep = Replica("t", 0, log, name, NAMES, epoch=1)
    rep.leader, rep.aligned = "a", name != "a"
    return rep


def three(tmp_path: Path) -> tuple[Replica, Replica, Replica, AckWaiters]:
    """``a`` leads epoch 1; all three hold offsets 0-59, committed."""
    a, b, c = (opened(tmp_path, n, 60) for n in NAMES)
    acks = AckWaiters()
    a.acks = acks
    a.lead()
    for f in (b, c):
        a.set_follower_end(f.self_name, 60)
    assert a.hw == 60
    return a, b, c, acks


def test_a_truncate_is_released_once_a_follower_acknowledges_the_start_and_fails_at_its_deadline(tmp_path) -> None:
    a, b, c, acks = three(tmp_path)
    a.log.truncate_before(30)
    acks.add_start(a, "held", 30, deadline=5.0)
    acks.add_start(a, "higher", 45, deadline=5.0)
    assert acks.released == []  # the leader alone holds it: one of three
    ack = steps.on_hw(b, "a", steps.hw_frame(a))
    assert isinstance(ack, protocol.FollowerAck) and ack.log_start == 30 and b.log.start_offset == 30
    steps.on_answer(a, protocol.SendCursor(0.3), "b", ack, 0.0)
    assert acks.released == [("held", None)]  # leader and b: a majority
    acks.released.clear()
    assert acks.expire(4.9) == 5.0 and acks.released == []
    acks.expire(5.0)
    assert [(t, type(e)) for t, e in acks.released] == [("higher", TimeoutError)]
    assert a.start_waiters == [] or all(w.done for _, w in a.start_waiters)


def test_a_leader_stepping_down_fails_its_waiting_truncates(tmp_path) -> None:
    a, b, c, acks = three(tmp_path)
    a.log.truncate_before(30)
    acks.add_start(a, "held", 30, deadline=5.0)
    steps.adopt_epoch(a, 2)
    assert [t for t, e in acks.released if e is not None] == ["held"]


def test_a_new_leader_elected_by_a_voter_holding_the_start_serves_nothing_below_it(tmp_path) -> None:
    a, b, c, acks = three(tmp_path)
    a.log.truncate_before(30)
    steps.on_answer(a, protocol.SendCursor(0.3), "b", steps.on_hw(b, "a", steps.hw_frame(a)), 0.0)
    # ``a`` dies; ``c`` never heard of the truncate and stands with ``b``'s vote.
    req = steps.vote_request(c, pre=False)
    reply = steps.on_vote_request(b, req, leader_alive=False)
    assert reply.granted and reply.log_start == 30
    assert election.reply_from_wire(reply.to_wire()) == reply
    tally = election.Tally("c", frozenset(NAMES), req.epoch)
    tally.add(reply)
    assert tally.won and tally.log_start == 30
    assert steps.win(c, req.epoch, tally.log_start)
    assert c.log.start_offset == 0 and c.serves_from == 30  # before its log moves: nothing below 30
    assert steps.lead_start(c)
    assert c.log.start_offset == c.serves_from == 30
    steps.on_sync(b, "c", steps.sync_frame(c))
    assert b.log.start_offset == 30  # never back down


def test_a_vote_reply_without_a_start_reads_as_zero() -> None:
    reply = election.VoteReply("t", 0, 2, "b", True, election.GRANTED, False, 17)
    wire = reply.to_wire()
    assert election.reply_from_wire(wire[:8]).log_start == 0
