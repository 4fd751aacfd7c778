"""The sweep command of the shipped-broker simulation (``python -m tests.sim.sweep``): it runs the seeds
asked in worker processes, passes when none fails, and with a planted bug reports the seeds that catch it."""

from __future__ import annotations

import pytest

from tests.sim import sweep


def test_a_sweep_of_passing_seeds_exits_0(capsys) -> None:
    assert sweep.main(["--runs", "faults", "--first", "2", "--seeds", "2", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("2 seeds of faults in ")


def test_a_sweep_with_a_plant_names_the_seed_that_catches_it_and_how_to_replay_it(capsys) -> None:
    assert sweep.main(["--runs", "faults", "--seeds", "1", "--jobs", "1", "--plant",
                       "idempotent_retry_written_again"]) == 0
    out = capsys.readouterr().out
    assert "faults seed 0 (RING_SIM_SHIPPED_WORKLOAD_SEED=0 replays it)" in out, out
    assert "an idempotent produce written twice" in out and out.splitlines()[-1].endswith("1 caught the plant"), out


@pytest.mark.parametrize("argv", [["--runs", "nope"], ["--seeds", "0"], ["--plant", "nope"]])
def test_a_sweep_refuses_what_it_cannot_run(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        sweep.main(argv)
    assert exc.value.code == 2
