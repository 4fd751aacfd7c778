"""Bugs planted one at a time in the node core, to show the simulation finds them (docs/RELIABILITY.md).

Each plant is a context manager that patches ring's own code for the
duration of one run and nothing else: there is no switch for them in
``ring/``. ``tests/test_sim_plants.py`` runs, for each, the seed the table
names with the plant (the run's checks must fail) and without it (they must
pass).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from ring.node.core import NodeCore
from ring.replication import election, protocol, steps


@contextlib.contextmanager
def hw_before_epoch_on_majority() -> Iterator[None]:
    """The leader counts an offset committed once a majority holds it, even before its own epoch's start is
    on a majority (Raft's figure 8: a batch of an older epoch can still be replaced)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(protocol, "leader_high_watermark",
                   lambda ends, voters, epoch_start, current: protocol.high_watermark(ends, voters))
        yield


@contextlib.contextmanager
def ack_before_durable() -> Iterator[None]:
    """A follower acknowledges appended batches at once, before the fsync that makes them durable."""
    real = NodeCore.__init__

    def init(self: NodeCore, *args: object, **kwargs: object) -> None:
        real(self, *args, **kwargs)  # type: ignore[arg-type]
        self.durable_at_once = True

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NodeCore, "__init__", init)
        yield


@contextlib.contextmanager
def two_votes_per_epoch() -> Iterator[None]:
    """A voter that granted its vote in an epoch grants it again to another candidate."""
    real = election.judge_vote

    def judge(me: election.Voter, req: election.VoteRequest) -> election.Verdict:
        verdict = real(me, req)
        if verdict.reply.reason == election.ALREADY_VOTED:
            return real(election.Voter(me.name, election.Ballot(me.ballot.epoch, None), me.key, me.voters,
                                       me.leader_alive, me.leading), req)
        return verdict

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(election, "judge_vote", judge)
        yield


@contextlib.contextmanager
def sync_keeps_divergent_tail() -> Iterator[None]:
    """A follower taking a new leader's sync keeps what it holds past the point where their histories
    diverge (it does not cut its log back)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps, "divergence_point", lambda mine, my_end, leader, leader_end: my_end)
        yield


@contextlib.contextmanager
def quorum_one_short() -> Iterator[None]:
    """A produce at quorum is acknowledged once one replica fewer than a majority holds it."""
    real = protocol.needed_acks
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(protocol, "needed_acks",
                   lambda level, rf: max(1, real(level, rf) - 1) if level == "quorum" else real(level, rf))
        yield


PLANTS = {
    "hw_before_epoch_on_majority": hw_before_epoch_on_majority,
    "ack_before_durable": ack_before_durable,
    "two_votes_per_epoch": two_votes_per_epoch,
    "sync_keeps_divergent_tail": sync_keeps_divergent_tail,
    "quorum_one_short": quorum_one_short,
}
