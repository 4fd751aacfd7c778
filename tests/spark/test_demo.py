"""The README's two commands: `make demo` runs as written (its recipe, ``python -m ring.demo``,
with fewer events), and `make test` is this suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.docs import REPO_ROOT, commands, makefile_module, section

EVENTS = 3000


def test_make_demo_runs_and_prints_what_the_readme_says() -> None:
    assert [c.split("#")[0].strip() for c in commands(section("two-commands"))] == ["make demo", "make test"]
    assert makefile_module("test") == "-m pytest"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RING_DEMO_EVENTS": str(EVENTS)}
    module = makefile_module("demo").split()[1]
    done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, env=env, timeout=900,
                          cwd=REPO_ROOT)
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-3000:])
    assert "cluster is up: every broker sees the other two" in out
    assert f"produced {EVENTS:,} events" in out and f"{EVENTS:,} page views in" in out
    written = re.search(r"wrote (\d+) per-minute aggregates to topic 'clicks-per-minute'", out)
    assert written and int(written.group(1)) > 0, out[-2000:]
    assert "one of them, read back from the cluster: {" in out
    assert "cluster stopped (exit codes [0, 0, 0])" in out
