"""A replica's state file (ballot, epoch, voters) changed by a node core's step is a write of that step's
Ready (``ring.replication.state.save_state``, ``NodeCore.defer_state``): nothing is written while the
step runs, the Ready's ``write`` holds the file as the step left it, and the executor writes it before
the vote it answers is handed out. A core whose Readys nobody carries out writes at once."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from ring.clock import ManualClock
from ring.gossip.state import EndpointState
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.node import executor
from ring.node.core import NodeCore
from ring.node.members import Members
from ring.node.ready import Ready, VoteRequested
from ring.replication import election
from ring.replication.replica import Replica
from ring.replication.state import STATE_FILE, load_state, save_state
from tests.test_node_executor import Recording

T0 = 1_700_000_000_000


def _voter(tmp_path: Path, carries_writes: bool) -> tuple[NodeCore, Replica]:
    log = PartitionLog(tmp_path / "a", LogConfig(fsync=FsyncPolicy("never")), ManualClock(T0))
    rep = Replica("t", 0, log, "a", ["a", "b", "c"], epoch=3)
    rep.leader = None
    save_state(rep)  # (opened: written at once)
    members = Members(EndpointState("a", 0, "a:1", "a:2", generation=1), [], random.Random(1))
    core = NodeCore("a", lambda t, p: rep if (t, p) == ("t", 0) else None, lambda: [rep], True, random.Random(2),
                    members)
    core.adopt(rep)
    core.carries_writes = carries_writes
    return core, rep


def _ask(core: NodeCore, epoch: int) -> Ready:
    return core.step(1.0, VoteRequested((election.VoteRequest("t", 0, epoch, "b", 3, 1 << 40),)))


def test_a_ballot_granted_in_a_step_is_written_by_its_ready_before_the_vote_leaves(tmp_path: Path) -> None:
    core, rep = _voter(tmp_path, carries_writes=True)
    ready = _ask(core, 4)
    assert [r.granted for r in ready.reply] == [True]
    assert load_state(rep.log.directory)[0] == election.Ballot(3, None)  # nothing written in the step
    [(name, data)] = ready.write
    assert name == str(rep.log.directory / STATE_FILE)
    assert (orjson.loads(data)["epoch"], orjson.loads(data)["voted_for"]) == (4, "b")
    fx = Recording()
    executor.carry_out(ready, fx)
    assert fx.calls[0] == ("write", [(name, data)])  # first: before anything the Ready sends
    # A step that changes the ballot twice writes the file once, as the step left it.
    ready = core.step(2.0, VoteRequested((election.VoteRequest("t", 0, 5, "c", 3, 1 << 40, pre=False),
                                          election.VoteRequest("t", 0, 6, "b", 3, 1 << 40))))
    assert [(orjson.loads(d)["epoch"], orjson.loads(d)["voted_for"]) for _, d in ready.write] == [(6, "b")]
    assert core.step(3.0, VoteRequested((election.VoteRequest("t", 0, 6, "c", 3, 1 << 40),))).write == ()


def test_a_core_whose_readys_are_not_carried_out_writes_at_once(tmp_path: Path) -> None:
    core, rep = _voter(tmp_path, carries_writes=False)
    ready = _ask(core, 4)
    assert [r.granted for r in ready.reply] == [True] and ready.write == ()
    assert load_state(rep.log.directory)[0] == election.Ballot(4, "b")
