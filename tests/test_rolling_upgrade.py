"""A rolling upgrade under load, run as docs/OPERATIONS.md ("Upgrading") says: three brokers of the
previous release (commit ``PREVIOUS`` of this repository, extracted from git at test time) take quorum
produces while each in turn is stopped with SIGTERM and started again from this release's code on the
same data directory and ports. Nothing acknowledged is lost, no produce fails (one that meets the broker
being restarted is sent again to another) and none waits long for a leader, a topic created while the
releases mix works on every broker with one id, an upgraded broker can go back to the previous release
before the last one is upgraded, and the cluster ends speaking the new protocol version."""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import REPO_ROOT, Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

PREVIOUS = "78fa6b8"  # the previous release
PARTITIONS = 3
WAIT_S = 60.0  # a broker's restart and catch-up on a busy 2-core machine
LEADERLESS_S_MAX = 10.0  # "a few seconds", with room for a busy 2-core machine
RETRY_S = 30.0  # how long one produce is retried (through the other brokers) before it counts as failed


def previous_release(dest: Path) -> Path:
    """This repository's tree at ``PREVIOUS``, extracted into ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", PREVIOUS], capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.fail(f"the rolling upgrade test runs the previous release, commit {PREVIOUS}, from this "
                    f"repository's git history, which is missing here (a shallow clone? fetch the full "
                    f"history): {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=120)
    assert (dest / "ring" / "__init__.py").exists()
    return dest


class Load:
    """Quorum produces, one record at a time, through each broker in turn; a produce that fails is sent
    again to the next broker until ``RETRY_S`` has passed (then it counts as failed)."""

    def __init__(self, c: TestCluster, topic: str) -> None:
        self.c, self.topic = c, topic
        self.acked: list[tuple[int, int, Any]] = []  # (partition, offset, value)
        self.retried = 0
        self.longest_s = 0.0  # the longest a record took to be acknowledged, retries included
        self.failed: list[Any] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = itertools.count()
        for n in itertools.count():
            if self.stop.is_set():
                return
            value = {"n": n}
            began = time.monotonic()
            deadline, last = began + RETRY_S, None
            while time.monotonic() < deadline:
                m = self.c[next(turn) % len(self.c.members)]
                try:
                    r = m.http.produce(self.topic, [value], partition=n % PARTITIONS, consistency="quorum")
                except OSError as exc:  # the broker being restarted
                    last = exc
                else:
                    if r.status == 200:
                        self.acked.append((n % PARTITIONS, r.json()["base_offset"], value))
                        self.longest_s = max(self.longest_s, time.monotonic() - began)
                        break
                    last = (m.name, r.status, r.body[:300])
                self.retried += 1
                time.sleep(0.05)  # (the pace of the retries, not a wait for a condition)
            else:
                self.failed.append((value, last))

    def acked_count(self) -> int:
        return len(self.acked)


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


def _upgrade(c: TestCluster, m: Member, load: Load, topic: str, tree: Path = REPO_ROOT) -> None:
    """The procedure of docs/OPERATIONS.md for one broker: stop it (SIGTERM: it hands its partitions
    over), start the release in ``tree`` (default: this one) on the same data directory and ports, wait
    until it is up everywhere and every partition has a leader, and the load goes on."""
    assert m.local.stop() == 0
    m.local.env["PYTHONPATH"] = str(tree)
    m.local.prefix = ["env", "-C", str(tree)]
    m.local.start()  # returns once it answers
    c.wait_statuses({x.name: "up" for x in c}, timeout_s=WAIT_S)
    wait_for(f"every partition of {topic} led, seen from every broker", lambda: _leaders_everywhere(c, topic),
             timeout_s=WAIT_S)
    marks = [p["high_watermark"] for p in m.http.describe(topic)["partitions"]]
    wait_for(f"{m.name} caught up with {marks}", lambda: _caught_up(c, m, topic, marks), timeout_s=WAIT_S)
    before = load.acked_count()
    wait_for("produces acknowledged after the upgrade of " + m.name, lambda: load.acked_count() >= before + 20,
             timeout_s=WAIT_S)


def test_a_rolling_upgrade_from_the_previous_release_under_quorum_load(tmp_path: Path) -> None:
    old = previous_release(tmp_path / "previous")
    # Run from the extracted tree (``python -m`` puts the working directory first on the path).
    c = TestCluster(tmp_path / "cluster", 3, env={"PYTHONPATH": str(old)},
                    prefixes={i: ["env", "-C", str(old)] for i in range(3)})
    c.start()
    try:
        _roll_and_check(c, old)
    finally:
        c.stop()


def _roll_and_check(c: TestCluster, old: Path) -> None:
    load = Load(c, "roll")
    try:
        assert c[0].http.create_topic("roll", partitions=PARTITIONS, replication_factor=3).status == 201
        wait_for("partitions led", lambda: _leaders_everywhere(c, "roll"), timeout_s=WAIT_S)
        assert "protocol_version" not in _cluster_doc(c[0])  # the previous release says nothing of versions
        load.thread.start()
        wait_for("load under way", lambda: load.acked_count() >= 20, timeout_s=WAIT_S)

        _upgrade(c, c[0], load, "roll")
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
        _upgrade(c, c[0], load, "roll", tree=old)
        assert "protocol_version" not in _cluster_doc(c[0])  # (the previous release's answer)
        assert c[0].http.describe("mixed")["name"] == "mixed"
        _upgrade(c, c[0], load, "roll")

        _upgrade(c, c[1], load, "roll")
        _upgrade(c, c[2], load, "roll")
    finally:
        load.stop.set()
        if load.thread.ident is not None:
            load.thread.join(RETRY_S + 30)
    assert load.thread.ident is not None and not load.thread.is_alive()
    assert load.failed == [], load.failed[:5]
    # No partition was without a leader for long: no record took more than a few seconds, retries included.
    assert load.longest_s < LEADERLESS_S_MAX, (load.longest_s, load.retried)
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
