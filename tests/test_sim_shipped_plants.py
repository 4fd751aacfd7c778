"""Bugs planted in the shipped broker's driver code (``tests/sim/driver_plants.py``) are caught by a seed
of the shipped-broker workload (``tests/sim/shipped_workload.py``): with the plant the checker reports the
problem named, without it nothing (docs/RELIABILITY.md lists them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.driver_plants import PLANTS
from tests.sim.shipped_workload import ACK_FAULTS, FAULTS, MEMBERSHIP, MORE_FAULTS, check, run_workload

# plant -> (seed, the workload's faults, words of the problem the checker reports)
CAUGHT = {
    "forward_answer_to_oldest": (0, FAULTS, "acknowledged at quorum or all lost"),
    "idempotent_retry_written_again": (0, FAULTS, "an idempotent produce written twice"),
    "turn_answers_before_acks": (5, ACK_FAULTS, "acknowledged at quorum or all lost"),
    "follower_acks_before_fsync": (18, ACK_FAULTS, "acknowledged at quorum or all lost"),
    "fetch_reads_past_high_watermark": (22, FAULTS, "records a fetch returned are not in the log"),
    "poll_acknowledged_when_answered": (25, MORE_FAULTS, "but no member was handed"),
    # (a real bug the seed found, fixed: the seed is kept here, with the fix undone as the plant)
    "places_partitions_not_knowing_the_ring": (156, MEMBERSHIP, "acknowledged at quorum or all lost"),
}


@pytest.mark.parametrize("plant", sorted(CAUGHT))
def test_a_driver_plant_is_caught_by_its_seed_and_the_seed_passes_without_it(plant: str, tmp_path: Path) -> None:
    seed, kinds, words = CAUGHT[plant]
    with PLANTS[plant]():
        problems = check(run_workload(seed, tmp_path / "planted", kinds))
    assert any(words in p for p in problems), (plant, seed, problems)
    assert check(run_workload(seed, tmp_path / "clean", kinds)) == [], (plant, seed)
