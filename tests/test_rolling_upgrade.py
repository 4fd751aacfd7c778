"""A rolling upgrade under load, run as docs/OPERATIONS.md ("Upgrading") says: three brokers of the
previous release (commit ``PREVIOUS`` of this repository, extracted from git at test time and installed
into a scratch virtual environment) take quorum produces through ``ring.client`` while each in turn is
stopped with SIGTERM and started again as this release's ``ring serve`` on the same data directory, name
and ports. Nothing acknowledged is lost, the client reports no produce failed, no partition is without a
leader for more than ``LEADERLESS_S_MAX`` (read every ``POLL_S`` through the whole upgrade), a topic
created while the releases mix works on every broker with one id, an upgraded broker can go back to the
previous release before the last one is upgraded, and the cluster ends speaking the new protocol
version."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ring.client import Client
from tests.brokers import REPO_ROOT, Http, Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

PREVIOUS = "78fa6b8"  # the previous release
PARTITIONS = 3
WAIT_S = 60.0  # a broker's restart and catch-up on a busy 2-core machine
DELIVERY_S = 30.0  # the client's delivery timeout: a produce not acknowledged by then (its retries included) failed
POLL_S = 0.1  # how often each partition's leader is read
POLL_ANSWER_S = 0.5  # one reading's wait for a broker's answer (then the next broker is asked)
POLL_GAP_S_MAX = 1.5  # longest gap between two readings for the measure to hold (a few unanswered asks)
# "No partition without a leader for more than a few seconds". The previous release hands nothing over
# when it stops: its partitions' followers count their leader lost after LINK_LOSS_GRACE_MS (1 s), the
# first caught-up one stands within an ELECTION_TICK_MS (0.1 s) and wins in one vote round (at most
# VOTE_REQUEST_TIMEOUT_S, 1 s), or the next in rank ELECTION_RANK_STEP_MS (1.5 s) later: 3.6 s at
# worst. This release hands its partitions over before it stops (HANDOFF_CATCHUP_MS, 2 s at most, then
# an election round). The measure is an upper bound (from the last reading with a leader to the first
# with one again), so a poll gap is added on each side.
LEADERLESS_S_MAX = 5.0
BUILD_S = 180.0  # extracting, building and installing the previous release (about 5 s)


@dataclass(frozen=True)
class Release:
    """A release's ``ring`` entry point, the PYTHONPATH its brokers run with, and where its package is."""

    name: str
    ring: Path
    pythonpath: str
    package: Path

    def run(self, m: Member) -> None:
        """Make ``m``'s next start run ``ring serve`` of this release."""
        m.local.program = [str(self.ring)]
        m.local.prefix = []
        m.local.env["PYTHONPATH"] = self.pythonpath

    def imported_by(self, m: Member) -> Path:
        """The ``ring`` package that ``m``'s interpreter imports with ``m``'s environment (``-P``: as the
        entry point does, without the working directory first on the path)."""
        python = self.ring.with_name("python")
        out = subprocess.run([str(python), "-P", "-c", "import ring; print(ring.__file__)"], capture_output=True,
                             text=True, env={**os.environ, **m.local.env}, timeout=60)
        assert out.returncode == 0, out.stderr
        return Path(out.stdout.strip()).parent


def _run(cmd: list[str], what: str, **kw: Any) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, timeout=BUILD_S, **kw)
    if out.returncode != 0:
        pytest.fail(f"{what} failed ({' '.join(cmd)}): {out.stderr.decode(errors='replace').strip()[-2000:]}")
    return out


def previous_release(root: Path) -> Release:
    """Commit ``PREVIOUS`` of this repository, built into a wheel and installed into a scratch virtual
    environment under ``root``, offline.

    The build uses the suite's own setuptools and wheel (``--no-build-isolation``: nothing is
    downloaded); they are in the dev extra. The environment holds the previous release's ``ring`` and
    its entry point; its third-party packages are the suite's, through a path file after its own
    site-packages (the suite's interpreter is itself a virtual environment, so ``--system-site-packages``
    would give the base interpreter's packages instead). Anything missing fails the test."""
    tree = root / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", PREVIOUS], capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.fail(f"the rolling upgrade test runs the previous release, commit {PREVIOUS}, from this "
                    f"repository's git history, which is missing here (a shallow clone? fetch the full "
                    f"history): {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=120)
    for tool in ("setuptools", "wheel"):
        if importlib.util.find_spec(tool) is None:
            pytest.fail(f"building the previous release offline needs {tool} in the suite's environment "
                        f"(it is in the dev extra: make venv)")
    dist = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", str(dist), str(tree)], "building the previous release", cwd=root)
    wheel, = dist.glob("ring-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "making the scratch environment")
    python = venv / "bin" / "python"
    # The suite's pip installs into it (--python); before the path file, so it sees no other ring.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
          str(wheel)], "installing the previous release", env=clean, cwd=root)
    site = Path(_run([str(python), "-P", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     "asking the scratch environment", env=clean).stdout.decode().strip())
    suite = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "suite-packages.pth").write_text("".join(f"{p}\n" for p in suite))
    return Release(f"previous ({PREVIOUS})", venv / "bin" / "ring", "", site / "ring")


def current_release() -> Release:
    """This checkout, run by the suite's own ``ring`` entry point with the checkout first on the path."""
    ring = Path(sys.executable).with_name("ring")
    if not ring.exists():
        pytest.fail(f"{ring} is missing: the suite's environment has the project installed (make venv)")
    return Release("current", ring, str(REPO_ROOT), REPO_ROOT / "ring")


class Load:
    """Quorum produces through ``ring.client``, a record to each partition at a time, each waited for.
    A produce counts as failed when the client reports it failed (after its own retries, within
    ``DELIVERY_S``)."""

    def __init__(self, c: TestCluster, topic: str) -> None:
        self.topic = topic
        self.client = Client([m.url for m in c], consistency="quorum", linger_ms=0, delivery_timeout_s=DELIVERY_S)
        self.acked: list[tuple[int, int, Any]] = []  # (partition, offset, value)
        self.failed: list[tuple[Any, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for n in itertools.count():
            if self.stop.is_set():
                return
            sent = [(p, {"n": n, "p": p}) for p in range(PARTITIONS)]
            futures = [(value, self.client.produce(self.topic, json=value, partition=p)) for p, value in sent]
            for value, fut in futures:
                try:
                    md = fut.result(timeout=DELIVERY_S + 30)
                except Exception as exc:  # the client gave up on it: a failed produce
                    self.failed.append((value, repr(exc)))
                else:
                    self.acked.append((md.partition, md.offset, value))

    def acked_count(self) -> int:
        return len(self.acked)


class LeaderWatch:
    """Reads each partition's leader every ``POLL_S`` from the first broker not stopped that answers
    ``GET /v1/topics/{topic}``. A partition has no leader at a reading when none is named, or the one
    named is in ``down`` (from its SIGTERM until its restart answers)."""

    def __init__(self, c: TestCluster, topic: str) -> None:
        self.c, self.topic = c, topic
        self.down: set[str] = set()
        self.readings: list[tuple[float, list[str | None]]] = []  # (when, each partition's leader or None)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> list[str | None] | None:
        for m in self.c:
            if m.name in self.down:
                continue
            try:
                r = Http(m.local.host, m.local.port, POLL_ANSWER_S).get(f"/v1/topics/{self.topic}")
            except OSError:
                continue
            if r.status == 200:
                down = set(self.down)
                return [None if p.get("leader") in down else p.get("leader") for p in r.json()["partitions"]]
        return None

    def _run(self) -> None:
        while not self.stop.wait(POLL_S):
            leaders = self._read()
            if leaders is not None:
                self.readings.append((time.monotonic(), leaders))

    def longest_gap_s(self) -> float:
        times = [t for t, _ in self.readings]
        return max((b - a for a, b in zip(times, times[1:])), default=float("inf"))

    def longest_leaderless_s(self) -> list[float]:
        """Per partition, the longest time from a reading with a leader to the next one with a leader
        across readings without (an upper bound of the time it had none)."""
        longest = [0.0] * PARTITIONS
        last_led: list[float | None] = [None] * PARTITIONS
        for t, leaders in self.readings:
            for p, leader in enumerate(leaders):
                if leader is not None:
                    if last_led[p] is not None:
                        longest[p] = max(longest[p], t - last_led[p])  # (POLL_S when it never lacked one)
                    last_led[p] = t
        end = self.readings[-1][0]
        return [max(x, end - t) if t is not None else float("inf") for x, t in zip(longest, last_led)]


def _cluster_doc(m: Member) -> dict[str, Any]:
    r = m.http.get("/v1/cluster")
    assert r.status == 200, r.body
    return r.json()


def _leaders_everywhere(c: TestCluster, topic: str) -> bool:
    for m in c:
        r = m.http.get(f"/v1/topics/{topic}")
        if r.status != 200 or any(p.get("leader") is None for p in r.json()["partitions"]):
            return False
    return True


def _caught_up(c: TestCluster, m: Member, topic: str, marks: list[int]) -> bool:
    """Whether each partition's leader holds ``m``'s replica at or past ``marks``."""
    by_name = {x.name: x for x in c}
    for p, mark in enumerate(marks):
        leader = m.http.describe(topic)["partitions"][p]["leader"]
        if leader is None:
            return False
        ends = by_name[leader].http.describe(topic)["partitions"][p]["replica_end_offsets"]
        if (ends.get(m.name) or 0) < mark:
            return False
    return True


def _upgrade(c: TestCluster, m: Member, load: Load, watch: LeaderWatch, topic: str, release: Release) -> None:
    """The procedure of docs/OPERATIONS.md ("Upgrading") for one broker: 1. stop it with SIGTERM;
    2. start ``ring serve`` of ``release`` with the same flags (data directory, name, ports, seeds);
    3. wait until every broker's ``GET /v1/cluster`` has it up, every broker's ``GET /v1/topics/{topic}``
    names a leader for every partition, and each partition's leader has its replica at the high watermark
    it restarted with. The load goes on throughout."""
    watch.down.add(m.name)
    assert m.local.stop() == 0
    release.run(m)
    m.local.start()  # returns once it answers
    watch.down.discard(m.name)
    assert release.imported_by(m) == release.package, release
    c.wait_statuses({x.name: "up" for x in c}, timeout_s=WAIT_S)
    wait_for(f"every partition of {topic} led, seen from every broker", lambda: _leaders_everywhere(c, topic),
             timeout_s=WAIT_S)
    marks = [p["high_watermark"] for p in m.http.describe(topic)["partitions"]]
    wait_for(f"{m.name} caught up with {marks}", lambda: _caught_up(c, m, topic, marks), timeout_s=WAIT_S)
    before = load.acked_count()
    wait_for("produces acknowledged after the upgrade of " + m.name, lambda: load.acked_count() >= before + 20,
             timeout_s=WAIT_S)


def test_a_rolling_upgrade_from_the_previous_release_under_quorum_load(tmp_path: Path) -> None:
    old, new = previous_release(tmp_path / "previous"), current_release()
    c = TestCluster(tmp_path / "cluster", 3)
    for m in c:
        old.run(m)
    c.start()
    try:
        for m in c:
            assert old.imported_by(m) == old.package  # the scratch environment's ring, not this checkout's
        _roll_and_check(c, old, new)
    finally:
        c.stop()


def _roll_and_check(c: TestCluster, old: Release, new: Release) -> None:
    load, watch = Load(c, "roll"), LeaderWatch(c, "roll")
    try:
        assert c[0].http.create_topic("roll", partitions=PARTITIONS, replication_factor=3).status == 201
        wait_for("partitions led", lambda: _leaders_everywhere(c, "roll"), timeout_s=WAIT_S)
        assert "protocol_version" not in _cluster_doc(c[0])  # the previous release says nothing of versions
        watch.thread.start()
        load.thread.start()
        wait_for("load under way", lambda: load.acked_count() >= 20, timeout_s=WAIT_S)

        _upgrade(c, c[0], load, watch, "roll", new)
        doc = _cluster_doc(c[0])  # releases mixed: the new broker speaks the old version
        assert doc["protocol_version"] == 3, doc
        assert {b["name"]: b["protocol"] for b in doc["brokers"]} == {"ring-0": [3, 4], "ring-1": [3, 3],
                                                                        "ring-2": [3, 3]}, doc
        # A topic created on a new broker while the releases mix.
        assert c[0].http.create_topic("mixed", partitions=2, replication_factor=3).status == 201
        wait_for("the mixed-period topic led", lambda: _leaders_everywhere(c, "mixed"), timeout_s=WAIT_S)
        for i, m in enumerate(c):
            r = m.http.produce("mixed", [{"from": m.name, "at": "mixed"}], partition=i % 2, consistency="quorum")
            assert r.status == 200, (m.name, r.body)
        # Before the version is raised, an upgraded broker goes back to the previous release and again.
        _upgrade(c, c[0], load, watch, "roll", old)
        assert "protocol_version" not in _cluster_doc(c[0])  # (the previous release's answer)
        assert c[0].http.describe("mixed")["name"] == "mixed"
        _upgrade(c, c[0], load, watch, "roll", new)

        _upgrade(c, c[1], load, watch, "roll", new)
        _upgrade(c, c[2], load, watch, "roll", new)
    finally:
        load.stop.set()
        watch.stop.set()
        for thread in (load.thread, watch.thread):
            if thread.ident is not None:
                thread.join(DELIVERY_S + 60)
        load.client.close()
    assert not load.thread.is_alive() and not watch.thread.is_alive()
    assert load.failed == [], (len(load.failed), load.failed[:5])
    # No partition was without a leader for long, read all along.
    leaderless = watch.longest_leaderless_s()
    print(f"rolling upgrade: {load.acked_count()} acknowledged, longest leaderless per partition "
          f"{[round(s, 2) for s in leaderless]} s over {len(watch.readings)} readings, longest gap "
          f"{watch.longest_gap_s():.2f} s")
    assert watch.longest_gap_s() <= POLL_GAP_S_MAX, watch.longest_gap_s()
    assert max(leaderless) < LEADERLESS_S_MAX, leaderless
    # The version is raised on its own once every broker speaks it.
    for m in c:
        doc = wait_for(f"{m.name} sees the cluster on protocol 4",
                       lambda m=m: (d := _cluster_doc(m))["protocol_version"] == 4 and d, timeout_s=WAIT_S)
        assert all(b["protocol"] == [3, 4] for b in doc["brokers"]), doc
    # Nothing acknowledged is lost: every broker serves every acknowledged record.
    expected: dict[int, dict[int, Any]] = {p: {} for p in range(PARTITIONS)}
    for p, offset, value in load.acked:
        assert offset not in expected[p], ("an offset acknowledged twice", p, offset)
        expected[p][offset] = value
    assert all(len(expected[p]) >= 100 for p in range(PARTITIONS)), {p: len(v) for p, v in expected.items()}
    for m in c:
        for p in range(PARTITIONS):
            end = max(expected[p], default=-1) + 1
            got = m.http.read_all("roll", p, end=end, timeout_s=WAIT_S)
            missing = {o: v for o, v in expected[p].items() if got.get(o) != v}
            assert not missing, (m.name, p, len(missing), list(missing.items())[:5])
    # The topic created while the releases mixed: one id everywhere, written and read on every broker.
    ids = {m.name: m.http.describe("mixed").get("id") for m in c}
    assert len(set(ids.values())) == 1 and None not in ids.values(), ids
    for i, m in enumerate(c):
        r = m.http.produce("mixed", [{"from": m.name, "at": "after"}], partition=i % 2, consistency="quorum")
        assert r.status == 200, (m.name, r.body)
    for m in c:
        ends = {p: sum(1 for i in range(len(c.members)) if i % 2 == p) * 2 for p in range(2)}  # both rounds
        values = [v for p in range(2) for v in m.http.read_all("mixed", p, end=ends[p], timeout_s=WAIT_S).values()]
        assert sorted((v["from"], v["at"]) for v in values) == sorted(
            (x.name, at) for x in c for at in ("mixed", "after")), (m.name, values)
    # And one created now, with every broker on the new version, works everywhere too.
    assert c[1].http.create_topic("upgraded", partitions=1, replication_factor=3).status == 201
    wait_for("the new topic led", lambda: _leaders_everywhere(c, "upgraded"), timeout_s=WAIT_S)
    for m in c:
        assert m.http.produce("upgraded", [{"from": m.name}], partition=0, consistency="all").status == 200
