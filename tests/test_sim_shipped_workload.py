"""The seeded workload and fault schedule on three shipped brokers (``tests.sim.shipped_workload``).

Each seed produces at one, quorum and all through every broker (forwarding
included), idempotent producers retrying through other brokers, a reader
fetching from any broker, for 30 virtual seconds, while at least
``FAULTS_MIN`` faults drawn from the seed hit the cluster: leader and
follower crashes restarted on their data directory (some losing power, so
what was not synced is gone; some followers back on an empty disk), links cut
both ways and healed, brokers paused. Then the checker finds nothing: every
record acknowledged at quorum or all is at its offset in the leader's log, no
idempotent produce twice, every record fetched in the log at its offset, and
every replica's log, read from its data directory, the same as the leader's.

A second run draws its faults from more kinds (``MORE_FAULTS``): a link cut
one way only (what one broker writes to another is held, no new connection
between them completes), a broker's wall clock jumping by seconds to an hour
and back, and two brokers losing power together. A third (``DISK_FAULTS``)
adds a disk going bad: every fsync of one broker's data directory fails
(EIO) for a while, then the broker loses power (what the failed fsyncs were
to make durable is gone) and starts again on what its disk kept. A fourth
(``STORAGE_FAULTS``) adds a bit flip (a byte of a batch's body changed in a
crashed broker's segment file before it restarts: found, never served,
mended) and a slow disk (one broker's fsyncs taking virtual seconds), while
a second topic is created, written, read, deleted and created again, and
the checker holds its generations apart. A fifth (``MEMBERSHIP``) draws the
faults of the second while the membership changes: a fourth broker joins a
third of the way in, and at two thirds one of the first three is
decommissioned, and stopped once no partition counts it among its replicas;
the checker compares each partition's replicas at the end. A sixth
(``ACK_FAULTS``) adds faults timed at an acknowledgement: the instant a
produce at quorum or all is answered, its partition's leader loses power, or
every broker does and the leader's disk is lost, its followers' fsyncs slow
until then. A seventh (``TORN_FAULTS``) adds torn writes: a broker whose
fsyncs have been slow for a while loses power, and each of its files keeps
what was synced and a part of what followed, the tail of that part zeroed
now and then.

``RING_SIM_SHIPPED_WORKLOAD_SEEDS=N`` (``RING_SIM_SHIPPED_MORE_FAULTS_SEEDS=N``,
``RING_SIM_SHIPPED_DISK_FAULTS_SEEDS=N``, ``RING_SIM_SHIPPED_STORAGE_FAULTS_SEEDS=N`` and
``RING_SIM_SHIPPED_MEMBERSHIP_SEEDS=N``, ``RING_SIM_SHIPPED_ACK_FAULTS_SEEDS=N``, ``RING_SIM_SHIPPED_TORN_FAULTS_SEEDS=N`` for the others) runs seeds 0 to N-1 instead (a sweep); ``..._SEED=S`` replays one.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.sim.shipped import seeds_from_env
import pytest

from tests.sim.shipped_workload import (ACK_FAULTS, CHURN_TOPIC as CHURN, DISK_FAULTS, FAULTS, FAULTS_MIN, MEMBERSHIP,
                                        MORE_FAULTS, STORAGE_FAULTS, TORN_FAULTS, WORKLOAD_S, check, run_workload)

WORKLOAD_SEEDS = (2, 3, 4)
MORE_FAULTS_SEEDS = (0, 1, 2)
DISK_FAULTS_SEEDS = (6, 8)  # each draws a failing disk (8 two of them) among its faults
STORAGE_FAULTS_SEEDS = (0, 7)  # 0 draws a slow disk, 7 a bit flip in a batch of the topic
MEMBERSHIP_SEEDS = (0, 10)  # 10 draws a follower back on an empty disk after the join
ACK_FAULTS_SEEDS = (4, 0)  # 4 draws every broker losing power at an acknowledgement, 0 its leader alone
TORN_FAULTS_SEEDS = (3, 17)  # each tears a segment file's tail mid-batch, zeroing its last bytes


@pytest.mark.parametrize("kinds, env, default", [(FAULTS, "RING_SIM_SHIPPED_WORKLOAD", WORKLOAD_SEEDS),
                                                 (MORE_FAULTS, "RING_SIM_SHIPPED_MORE_FAULTS", MORE_FAULTS_SEEDS),
                                                 (DISK_FAULTS, "RING_SIM_SHIPPED_DISK_FAULTS", DISK_FAULTS_SEEDS),
                                                 (STORAGE_FAULTS, "RING_SIM_SHIPPED_STORAGE_FAULTS",
                                                  STORAGE_FAULTS_SEEDS),
                                                 (MEMBERSHIP, "RING_SIM_SHIPPED_MEMBERSHIP", MEMBERSHIP_SEEDS),
                                                 (ACK_FAULTS, "RING_SIM_SHIPPED_ACK_FAULTS", ACK_FAULTS_SEEDS),
                                                 (TORN_FAULTS, "RING_SIM_SHIPPED_TORN_FAULTS", TORN_FAULTS_SEEDS)],
                         ids=["faults", "more-faults", "disk-faults", "storage-faults", "membership", "ack-faults",
                              "torn-faults"])
def test_faults_drawn_from_the_seed_lose_nothing_acknowledged_and_replicas_agree(
        tmp_path: Path, kinds: tuple[str, ...], env: str, default: tuple[int, ...]) -> None:
    failed = []
    drawn: set[str] = set()
    seeds = seeds_from_env(env, default)
    for seed in seeds:
        started = time.monotonic()
        try:
            out = run_workload(seed, tmp_path / str(seed), kinds)
            problems = check(out)
        except AssertionError as exc:
            failed.append(f"seed {seed}: {exc}")
            continue
        levels = {lv: sum(a.level == lv for a in out.acks) for lv in ("one", "quorum", "all")}
        print(f"seed {seed}: {out.virtual_s:.0f} virtual s in {time.monotonic() - started:.1f} real s; "
              f"acknowledged {levels}; {len(out.fetched)} fetched; {len(out.group_read)} handed to the group, "
              f"committed {out.committed}; faults: {'; '.join(out.faults)}"
              + (f"; {CHURN}: {len(out.churn_acks)} acknowledged, {len(out.churn_fetched)} fetched (and "
                 f"{len(out.churn_acks_blind)}, {len(out.churn_fetched_blind)} through brokers not asked first); "
                 f"{'; '.join(out.churn_events)}" if out.churn_events else "")
              + (f"; membership: {'; '.join(out.membership)}; replicas at the end {out.replicas}"
                 if out.membership else ""))
        assert len(out.faults) >= FAULTS_MIN, seed
        assert out.virtual_s >= WORKLOAD_S, seed
        assert levels["quorum"] and levels["all"], seed
        if kinds != FAULTS:  # the group read, and committed: its rule was checked on something
            assert out.group_read and out.committed, (seed, out.committed)
        if kinds == DISK_FAULTS and seeds == default:  # in each default seed, a disk failed
            assert any("fsyncs failing" in f for f in out.faults), (seed, out.faults)
        if kinds == STORAGE_FAULTS and seeds == default:  # the topic was deleted and created again, its last
            # one written and checked
            assert out.churn_live is not None and sum("created generation" in e for e in out.churn_events) >= 2, \
                (seed, out.churn_events)
            assert any(g == out.churn_live for g, _ in out.churn_acks) and out.churn_fetched, seed
        if kinds == MEMBERSHIP:  # both changes made, and the check compared the replicas placed at the end
            assert [e.split(" ")[1] for e in out.membership] == ["joins", "decommissioned", "stopped"], \
                (seed, out.membership)
            gone = out.membership[1].split(" ")[0]
            assert all(len(r) == 3 and gone not in r for r in out.replicas.values()), (seed, out.replicas)
        if kinds == TORN_FAULTS and seeds == default:  # a segment file torn mid-batch, its tail zeroed
            assert any(re.search(r"\.log torn at \d+ of \d+, \d+ zeroed", f) for f in out.faults), (seed, out.faults)
        if kinds == ACK_FAULTS:
            drawn.update(f for f in out.faults if f.startswith("at an acknowledgement"))
        if kinds == STORAGE_FAULTS:
            drawn.update(f.split(" at ")[0].split(" (")[0] for f in out.faults)
        if problems:
            failed.append(f"seed {seed} ({env}_SEED={seed} replays it): {'; '.join(problems)}; faults: {out.faults}")
    assert not failed, "\n".join(failed)
    if kinds == STORAGE_FAULTS and seeds == default:  # between them, the default seeds draw each new kind
        assert any("a byte of a batch's body changed" in f for f in drawn), drawn
        assert any("fsyncs taking" in f for f in drawn), drawn
    if kinds == ACK_FAULTS and seeds == default:
        assert any(f.startswith("at an acknowledgement") and "every broker" in f for f in drawn), drawn
        assert any(f.startswith("at an acknowledgement") and "every broker" not in f for f in drawn), drawn


def test_a_topic_created_again_while_a_brokers_clock_jumped_back_elects_a_leader(tmp_path: Path) -> None:
    """Seed 3 of ``STORAGE_FAULTS`` with anti-entropy at its default interval: a broker's wall clock jumps
    back 21 minutes while the churn topic is deleted and created again. A topic created through a broker
    whose clock may not be used would look older than the data directories made at the cluster's start,
    and never elect a leader: such a broker refuses the create (the rule's own scenario is
    ``tests/test_sim_shipped.py::test_a_topic_is_not_created_with_a_wall_clock_its_broker_may_not_use``);
    here the churn topic's last generation is live, read back whole, and nothing acknowledged is lost."""
    out = run_workload(3, tmp_path, STORAGE_FAULTS, repair_interval_s=60.0)
    assert any("wall clock -1262s" in f for f in out.faults), out.faults  # (the seed still draws the case)
    assert out.churn_live is not None and out.churn_log, out.churn_events
    assert check(out) == []


def test_a_decommissioned_broker_that_loses_power_and_starts_again_stays_off_the_ring(tmp_path: Path) -> None:
    """Seed 21 of ``MEMBERSHIP``: ring-1 is decommissioned and a fifth of a second later loses power (with
    ring-2) and starts again on its data directory, a new generation. A removal names a generation, so the
    restart took it back onto the ring, undoing the decommission; a decommission also names the data
    directory's incarnation, so ring-1 stays off the ring, its partitions move away and it is stopped."""
    out = run_workload(21, tmp_path, MEMBERSHIP)
    assert out.membership[1].startswith("ring-1 decommissioned"), out.membership
    decommissioned_at = float(out.membership[1].rpartition(" at ")[2].rstrip("s"))
    assert any("ring-1 losing power" in f and decommissioned_at < float(f.split(" at ")[1].split("s")[0])
               < decommissioned_at + 1.0 for f in out.faults), (out.membership, out.faults)
    assert out.membership[2].startswith("ring-1 stopped"), out.membership
    assert all("ring-1" not in r for r in out.replicas.values()), out.replicas
    assert check(out) == []


def test_the_checker_finds_an_idempotent_producers_records_out_of_the_order_it_sent_them() -> None:
    from tests.sim.shipped_workload import Outcome

    out = Outcome(0)
    out.produced = out.idempotent = {"p1-0", "p1-1", "p2-0"}
    out.leader_log = {0: [(0, "p1-0"), (1, "p2-0"), (2, "p1-1")]}
    assert check(out) == []
    out.leader_log = {0: [(0, "p1-1"), (1, "p2-0"), (2, "p1-0")]}
    assert check(out) == ["partition 0: p1-0 at offset 2 stands after p1-1 at offset 0, which its producer sent "
                          "later"]
