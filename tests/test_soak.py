"""A short soak (tests/soak.py): a real 3-broker cluster with client tokens serves healthy producers
and consumers while a fuzzer, slowloris and slow-body clients, never-reading fetchers, idle
connections and long-polls run against the same brokers for 20 s. Healthy clients keep being
served, no fuzzed request gets a 5xx, memory stays bounded, and every acknowledged record is on
every replica. ``python -m tests.soak --seconds 300`` is the long one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import soak

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECONDS = 20.0  # past the header read deadline (10 s), so slow clients are cut within it


def test_healthy_clients_are_served_while_hostile_ones_run(tmp_path: Path) -> None:
    f = soak(SECONDS, tmp_path)
    print(f.report())
    assert f.records_acked > 1_000 and f.records_lost == 0, f.report()
    assert f.healthy_success_rate >= 0.98, f.report()
    assert f.fuzz_requests > 500 and f.fuzz_5xx == 0, f.report()
    assert f.fuzz_no_answer <= 0.05 * f.fuzz_requests, f.report()
    assert f.slow_clients_cut > 0, f.report()  # header and body deadlines cut the slow clients
    for before, peak, after in zip(f.rss_mib_before, f.rss_mib_peak, f.rss_mib_after):
        assert peak <= before + 200 and after <= before + 100, f.report()
