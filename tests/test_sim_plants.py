"""The simulation finds real bugs: each bug planted in the node core (tests/sim/plants.py), one at a
time, is caught by the seed named here (the run's checks fail with the problem named), and the same
seed passes without it. docs/RELIABILITY.md keeps the table."""

from __future__ import annotations

import logging

import pytest

from tests.sim.plants import PLANTS
from tests.sim.run import run
from tests.test_sim import problems

# plant, the seed that catches it, its fsync policy, what the checks report
CAUGHT = [
    ("two_votes_per_epoch", 0, "always", "two leaders in one epoch"),
    ("ack_before_durable", 26, "always", "lost="),
    ("sync_keeps_divergent_tail", 3, "always", "divergent_partitions="),
    ("quorum_one_short", 3, "always", "lost="),
    # under interval, beside the writes two power losses may take: the allowance does not hide it
    ("quorum_one_short", 0, "interval", "lost="),
]


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("plant,seed,fsync,reported", CAUGHT, ids=[f"{c[0]}-{c[2]}" for c in CAUGHT])
def test_a_planted_bug_is_caught_by_its_seed_and_the_seed_passes_without_it(plant: str, seed: int, fsync: str,
                                                                              reported: str) -> None:
    with PLANTS[plant]():
        planted = problems(run(seed, fsync=fsync))
    assert any(reported in p for p in planted), f"{plant} with seed {seed}: {planted}"
    assert problems(run(seed, fsync=fsync)) == [], f"seed {seed} fails without {plant}"
