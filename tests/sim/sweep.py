"""Sweep the shipped-broker simulation over many seeds: ``python -m tests.sim.sweep`` (``make sim-sweep``).

The suite runs a few seeds of each run of the workload (``tests.sim.shipped_workload``:
faults, more faults, disk faults, storage faults, membership, faults timed at an
acknowledgement, torn writes); this runs as many as asked, spread over worker
processes, and prints each seed that fails with the environment variable that
replays it in the suite. A bug planted in driver code (``--plant``, one of
``tests.sim.driver_plants.PLANTS``) shows which seeds catch it. The exit status
is 1 when a seed failed (without ``--plant``) or when none caught the plant.

    python -m tests.sim.sweep --seeds 1000 --jobs 2
    python -m tests.sim.sweep --runs membership,torn-faults --first 500 --seeds 100
    python -m tests.sim.sweep --runs ack-faults --seeds 40 --plant follower_acks_before_fsync
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from tests.sim import shipped_workload as workload

# A worker process runs this many seeds, then a fresh one goes on: a crashed broker's objects are frozen
# as they were, its files pointed at /dev/null, and seeds after seeds would run out of file descriptors.
SEEDS_PER_WORKER = 20
RUNS = {  # name -> (kinds, the environment variable's stem that replays a seed in the suite)
    "faults": (workload.FAULTS, "RING_SIM_SHIPPED_WORKLOAD"),
    "more-faults": (workload.MORE_FAULTS, "RING_SIM_SHIPPED_MORE_FAULTS"),
    "disk-faults": (workload.DISK_FAULTS, "RING_SIM_SHIPPED_DISK_FAULTS"),
    "storage-faults": (workload.STORAGE_FAULTS, "RING_SIM_SHIPPED_STORAGE_FAULTS"),
    "membership": (workload.MEMBERSHIP, "RING_SIM_SHIPPED_MEMBERSHIP"),
    "ack-faults": (workload.ACK_FAULTS, "RING_SIM_SHIPPED_ACK_FAULTS"),
    "torn-faults": (workload.TORN_FAULTS, "RING_SIM_SHIPPED_TORN_FAULTS"),
}


def one(task: tuple[str, int, str | None]) -> tuple[str, int, list[str], float]:
    """One seed of one run (with the plant named, if any): (run, seed, problems, real seconds)."""
    run, seed, plant = task
    from tests.sim.driver_plants import PLANTS

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ring-sweep-") as root:
        try:
            with PLANTS[plant]() if plant else contextlib.nullcontext():
                problems = workload.check(workload.run_workload(seed, Path(root), RUNS[run][0]))
        except AssertionError as exc:  # the cluster did not settle, or a broker's serve ended
            problems = [f"the run stopped: {exc}"]
    return run, seed, problems, time.monotonic() - started


def _quiet() -> None:
    """A worker keeps the brokers' logs and startup lines to itself: those of thousands of seeds say nothing
    that a failure's problems and its replay do not."""
    logging.disable(logging.CRITICAL)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the worker's for its life)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # each crash leaves its frozen files open


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of {', '.join(RUNS)} (default all)")
    p.add_argument("--seeds", type=int, default=100, help="seeds per run (default 100)")
    p.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()),
                   help="worker processes (default: one per core)")
    p.add_argument("--plant", default=None, help="a bug of tests.sim.driver_plants to plant in every seed")
    args = p.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown or args.seeds < 1 or args.jobs < 1:
        p.error(f"unknown runs {unknown}" if unknown else "--seeds and --jobs take 1 or more")
    from tests.sim.driver_plants import PLANTS

    if args.plant is not None and args.plant not in PLANTS:
        p.error(f"--plant takes one of {', '.join(sorted(PLANTS))}")
    tasks = [(r, s, args.plant) for r in runs for s in range(args.first, args.first + args.seeds)]
    failed: list[tuple[str, int, list[str]]] = []
    started = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(args.jobs, initializer=_quiet,
                                                   maxtasksperchild=SEEDS_PER_WORKER) as pool:
        for run, seed, problems, took in pool.imap_unordered(one, tasks):
            if problems:
                failed.append((run, seed, problems))
                print(f"{run} seed {seed} ({RUNS[run][1]}_SEED={seed} replays it), {took:.1f} s: "
                      f"{'; '.join(problems)}", flush=True)
    what = "caught the plant" if args.plant else "failed"
    print(f"{len(tasks)} seeds of {', '.join(runs)} in {time.monotonic() - started:.0f} s: {len(failed)} {what}")
    if args.plant:
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
