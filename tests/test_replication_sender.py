"""The leader's link scheduling (``ring.node.links``, through ``NodeCore``): a flush looks only at
the partitions marked since the last one, so a produce costs the same beside one partition or
thousands, and a partition that stopped at the link's in-flight budget is sent as soon as an answer
frees room."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ring import limits
from ring.clock import ManualClock
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.gossip.state import EndpointState
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import Appended, Flush, FromFollower, LinkUp, PlacementChanged
from ring.replication import protocol
from ring.replication.replica import Replica

T0 = 1_700_000_000_000
PARTITIONS = 50


def append(rep: Replica, value: bytes) -> None:
    rep.log.append(B.encode([(T0, None, value, None)], now_ms=T0), rep.epoch)


@pytest.fixture
def reps(tmp_path: Path):
    out = {}
    for p in range(PARTITIONS):
        log = PartitionLog(tmp_path / str(p), LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
        rep = Replica("t", p, log, "a", ["a", "b"])
        rep.lead()
        out[p] = rep
    yield out
    for rep in out.values():
        rep.log.close()


def node(reps: dict[int, Replica], replica=None) -> NodeCore:
    members = Members(EndpointState("a", 0, "a:1", "a:2", generation=1), [], random.Random(1))
    return NodeCore("a", replica or (lambda t, p: reps.get(p)), reps.values, True, random.Random(2), members)


def appends(ready) -> list[int]:
    return [f.partition for _, f in ready.sends if isinstance(f, protocol.Append)]


def test_a_flush_looks_only_at_marked_partitions_and_resumes_blocked_ones_on_an_answer(
        reps: dict[int, Replica], monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[int] = []

    def replica(topic: str, p: int) -> Replica | None:
        looked.append(p)
        return reps.get(p)

    core = node(reps, replica)
    assert core.step(0.0, PlacementChanged()).links == {"b"}
    core.step(0.0, LinkUp("b"))
    link = core.links.links["b"]
    for (_, p), cur in link.cursors.items():  # the follower is in sync on every partition
        cur.next, cur.hw_sent = reps[p].log.end_offset, reps[p].hw
    link.ready.clear()
    link.timed.clear()
    core.links.dirty.clear()
    looked.clear()
    assert not core.step(0.1, Flush("b")).sends and looked == []

    append(reps[7], b"one")
    ready = core.step(0.2, Appended(reps[7]))
    assert ready.flush == {"b"} and not ready.sends  # sent on the flush, once per loop turn
    ready = core.step(0.2, Flush("b"))
    assert appends(ready) == [7]
    assert set(looked) == {7}, "a produce looked at other partitions"
    core.step(0.3, FromFollower("b", protocol.FollowerAck("t", 7, reps[7].epoch, reps[7].log.end_offset)))

    # A budget of one byte: the first frame fills it, the second partition waits for an answer.
    monkeypatch.setattr(limits, "REPLICATION_INFLIGHT_BYTES_MAX", 1)
    core.step(0.4, Flush("b"))
    for p in (1, 2):
        append(reps[p], b"two")
        core.step(0.5, Appended(reps[p]))
    assert appends(core.step(0.5, Flush("b"))) == [1]
    assert ("t", 2) in link.blocked
    # The answer for 1 frees the budget: 2 goes without any new record of its own.
    ready = core.step(0.6, FromFollower("b", protocol.FollowerAck("t", 1, reps[1].epoch, reps[1].log.end_offset)))
    assert ready.flush == {"b"}
    assert appends(core.step(0.6, Flush("b"))) == [2]
    assert not link.blocked


def test_records_appended_while_a_frame_is_unanswered_wait_for_its_answer(reps: dict[int, Replica]) -> None:
    core = node(reps)
    core.step(0.0, PlacementChanged())
    core.step(0.0, LinkUp("b"))
    link = core.links.links["b"]
    for (_, p), cur in link.cursors.items():
        cur.next, cur.hw_sent = reps[p].log.end_offset, reps[p].hw
    core.step(0.0, Flush("b"))
    rep = reps[3]
    append(rep, b"first")
    core.step(0.1, Appended(rep))
    assert appends(core.step(0.1, Flush("b"))) == [3]
    append(rep, b"second")  # fewer than REPLICATION_FRAME_HOLD_RECORDS_MAX: held while the first is in flight
    core.step(0.2, Appended(rep))
    assert appends(core.step(0.2, Flush("b"))) == []
    append(rep, b"third")
    core.step(0.3, Appended(rep))
    core.step(0.3, Flush("b"))
    ready = core.step(0.4, FromFollower("b", protocol.FollowerAck("t", 3, rep.epoch, 1)))
    sent = core.step(0.4, Flush("b")).sends
    frames = [f for _, f in sent if isinstance(f, protocol.Append)]
    assert len(frames) == 1 and frames[0].prev_end == 1 and ready.flush == {"b"}
    assert [h.base_offset for h, _ in B.scan(bytes(frames[0].data))] == [1, 2]  # both in one frame
