"""The seeded simulation (tests/sim): many seeds of crashes, power loss, pauses, cuts, message loss and a
partition moving to a fourth broker, against brokers made of ring's own replica cores and partition logs,
each run checked by the chaos checker: nothing acknowledged at quorum lost, one value per offset, key order
kept, nothing read that was never written or was refused, replicas identical once healed, and the cluster
writable again.

``RING_SIM_SEEDS`` sets how many seeds run (default 200); a failing seed is printed and replays exactly
with ``RING_SIM_SEED=N`` (which also prints the run's trace).
"""

from __future__ import annotations

import logging
import os
import time

import pytest

from tests.sim.run import Outcome, run

SEEDS = int(os.environ.get("RING_SIM_SEEDS", "200"))
REPLAY = os.environ.get("RING_SIM_SEED")
BUDGET_S = 120.0  # a bound on the loop on a loaded machine; about 20 s on an idle one


def problems(o: Outcome) -> list[str]:
    r = o.report
    out = []
    for name in ("lost", "inconsistent_offsets", "order_violations", "duplicated", "unexpected",
                 "failed_but_read", "divergent_partitions", "drain_errors"):
        if getattr(r, name):
            out.append(f"{name}={getattr(r, name)}")
    if not o.settled:
        out.append("never settled on one caught-up leader per partition")
    if not o.acked_after_heal:
        out.append("nothing acknowledged after healing")
    return out


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # thousands of expected step-downs and cuts
    yield
    logging.disable(logging.NOTSET)


def test_seeds_keep_what_quorum_promises() -> None:
    seeds = [int(REPLAY)] if REPLAY else list(range(SEEDS))
    began, failures, ran = time.monotonic(), [], 0
    for seed in seeds:
        o = run(seed, trace=REPLAY is not None)
        ran += 1
        if problems(o):
            if o.trace:
                print("\n".join(o.trace))
            failures.append(f"{', '.join(problems(o))}\n{o.why()}\nreplay: RING_SIM_SEED={seed} "
                            f"python -m pytest tests/test_sim.py")
        assert time.monotonic() - began < BUDGET_S, f"{ran} seeds took over {BUDGET_S} s"
    assert not failures, "\n\n".join(failures[:3]) + f"\n({len(failures)} of {ran} seeds failed)"


def test_a_seed_replays_exactly() -> None:
    a, b = run(11), run(11)
    assert a.report.to_json() == b.report.to_json() and a.faults == b.faults
    assert a.report.acknowledged > 20
