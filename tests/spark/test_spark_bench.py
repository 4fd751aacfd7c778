"""The Spark part of ``ring bench`` end to end, small: a real cluster, a real
local file, Spark in its own process, the table it reports."""

from __future__ import annotations

import subprocess
import sys

from tests.brokers import REPO_ROOT


def test_spark_bench_part_runs_and_reports():
    r = subprocess.run([sys.executable, "-m", "ring.bench.spark", "--records", "3000", "--reps", "1"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "3,000 clickstream events (1024 B of JSON each)" in r.stdout
    assert "| `load().count()` vs `spark.read.text(file).count()` |" in r.stdout
    assert "Floor of any Python data source" in r.stdout
