"""Membership changes against real broker processes, under a steady load of quorum writes.

A fourth broker joins a three-broker cluster: it takes its token's range,
its new replicas are filled from their leaders before they count, and it
then leads the partitions it is the natural leader of. Then a broker is
decommissioned through the admin API: its partitions get new replicas, the
ones it led move to other replicas, and it is reported removed. Throughout,
no acknowledged record is lost, and no partition refuses writes for longer
than a failover takes. A broker down longer than ``--down-grace-s`` is
removed the same way, and joins again when it comes back.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from typing import Any

import orjson
import pytest

from ring.localcluster import LocalBroker, free_port
from tests import support
from tests.brokers import REPO_ROOT, Http, TestCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "mb"
PARTITIONS = 6
LONGEST_OUTAGE_S = 15.0  # a failover: detection (4-13 s) plus an election, on a busy machine


class Writer:
    """Quorum writes of unique values, one partition after another, through random brokers."""

    def __init__(self, urls: list[tuple[str, int]]) -> None:
        self.urls = urls
        self.acked: list[tuple[int, int, str]] = []
        self.last_ok = {p: time.monotonic() for p in range(PARTITIONS)}
        self.longest_outage_s = 0.0
        self.errors: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        rng, n = random.Random(5), 0
        while not self._stop.is_set():
            n += 1
            p = n % PARTITIONS
            host, port = rng.choice(self.urls)
            value = f"v{n}"
            try:
                r = Http(host, port, timeout_s=15).produce(TOPIC, orjson.dumps([value]), partition=p,
                                                           consistency="quorum")
            except OSError:
                self.errors[0] = self.errors.get(0, 0) + 1
                continue
            now = time.monotonic()
            if r.status == 200:
                self.acked.append((p, r.json()["base_offset"], value))
                self.longest_outage_s = max(self.longest_outage_s, now - self.last_ok[p])
                self.last_ok[p] = now
            else:
                self.errors[r.status] = self.errors.get(r.status, 0) + 1
            time.sleep(0.01)


def parts(http: Http) -> list[dict[str, Any]]:
    return http.describe(TOPIC)["partitions"]


# A broker joining, leaving or electing answers 503, or not at all, for a moment: not yet.
wait_for = functools.partial(support.wait_for, interval_s=0.3,
                             errors=(OSError, AssertionError, KeyError, ValueError, TypeError))


def ring_1(http: Http) -> dict[str, Any]:
    """ring-1 as ``http``'s broker describes it in ``/v1/cluster``."""
    return next(b for b in http.get("/v1/cluster").json()["brokers"] if b["name"] == "ring-1")


def test_a_broker_joins_and_another_is_decommissioned_under_load(make_cluster, tmp_path, request) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always")
    assert c[0].http.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3).status == 201
    preloaded: list[tuple[int, int, str]] = []
    for p in range(PARTITIONS):  # something to fill the new replicas with
        for n in range(4):
            batch = [f"pre-{p}-{n}-{i}-" + "x" * 200 for i in range(100)]
            r = c[p % 3].http.produce(TOPIC, orjson.dumps(batch), partition=p)
            assert r.status == 200, r.body
            preloaded += [(p, r.json()["base_offset"] + i, v) for i, v in enumerate(batch)]
    peers = [f"127.0.0.1:{m.peer_port}" for m in c]
    fourth = LocalBroker("ring-3", tmp_path / "ring-3", free_port(),
                         args=["--peer-listen", f"127.0.0.1:{free_port()}", "--seeds", ",".join(peers),
                               "--fsync", "always"],
                         env={"RING_CLUSTER_SECRET": c.secret, "PYTHONPATH": str(REPO_ROOT)},
                         log_path=tmp_path / "ring-3.log")
    request.addfinalizer(fourth.kill)  # (whatever fails first)
    writer = Writer([(m.local.host, m.local.port) for m in c])
    writer.start()
    try:
        time.sleep(1.0)
        fourth.start()
        h3 = Http(fourth.host, fourth.port)
        writer.urls.append((fourth.host, fourth.port))
        # ring-3 takes its range, is filled, and leads the partitions it is the natural leader of
        wait_for("ring-3 placed on some partitions", lambda: any("ring-3" in p["replicas"] for p in parts(h3)), 30)
        natural = [p["partition"] for p in parts(h3) if p["replicas"][0] == "ring-3"]
        assert natural, parts(h3)
        wait_for("ring-3 leading its partitions",
                 lambda: all(parts(c[0].http)[p]["leader"] == "ring-3" for p in natural), 60)
        # decommission ring-1: it leaves every preference list and leads nothing
        r = c[0].http.post("/v1/cluster/brokers/ring-1/decommission")
        assert r.status == 200 and r.json()["decommissioned"] == "ring-1", r.body
        writer.urls = [(m.local.host, m.local.port) for m in (c[0], c[2])] + [(fourth.host, fourth.port)]
        for http in (c[0].http, c[2].http, h3):
            wait_for("ring-1 reported removed", lambda http=http: {b["name"]: b["status"] for b in
                                                                   http.get("/v1/cluster").json()["brokers"]}
                     ["ring-1"] == "removed", 20)
        wait_for("ring-1 out of every partition",
                 lambda: all("ring-1" not in p["replicas"] and p["leader"] not in (None, "ring-1")
                             for p in parts(c[0].http)), 60)
        # ring-1 crashes and starts again on its data directory (as a supervisor restarts it): a new
        # generation, the same directory, so it stays decommissioned
        before = ring_1(c[0].http)["generation"]
        c[1].restart()
        wait_for("ring-1's new generation heard of", lambda: ring_1(c[0].http)["generation"] > before, 30)
        for http in (c[0].http, c[2].http, h3, c[1].http):
            assert ring_1(http)["status"] == "removed", http.get("/v1/cluster").json()
        assert all("ring-1" not in p["replicas"] and p["leader"] != "ring-1" for p in parts(c[0].http))
        time.sleep(2.0)  # writes go on on the new placement
    finally:
        writer.stop()
    assert len(writer.acked) > 100, (len(writer.acked), writer.errors)
    writer.acked += preloaded
    print(f"{len(writer.acked)} acknowledged, errors {writer.errors}, longest outage {writer.longest_outage_s:.1f} s")
    assert writer.longest_outage_s <= LONGEST_OUTAGE_S, writer.errors
    try:
        for p in range(PARTITIONS):
            want = {o: v for q, o, v in writer.acked if q == p}
            got: dict[int, Any] = {}
            offset = 0
            for _ in range(1000):
                r = c[0].http.fetch(TOPIC, p, offset=offset, max_records=10_000)
                assert r.status == 200, r.body
                doc = r.json()
                got.update({rec["offset"]: rec["value"] for rec in doc["records"]})
                if doc["next_offset"] == offset:
                    break
                offset = doc["next_offset"]
            missing = {o: v for o, v in want.items() if got.get(o) != v}
            assert not missing, (p, sorted(missing.items())[:5])
    finally:
        fourth.kill()


def test_a_broker_down_past_the_grace_period_is_removed_and_rejoins(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "always", "--down-grace-s", "2")
    assert c[0].http.create_topic(TOPIC, partitions=3, replication_factor=3).status == 201
    acked = []
    for p in range(3):
        r = c[0].http.produce(TOPIC, orjson.dumps([f"before-{p}"]), partition=p, consistency="all")
        assert r.status == 200, r.body
        acked.append((p, r.json()["base_offset"], f"before-{p}"))
    c[2].kill()
    c.wait_statuses({"ring-2": "removed"}, [c[0], c[1]], timeout_s=30)
    wait_for("partitions placed on the two brokers left",
             lambda: all(sorted(p["replicas"]) == ["ring-0", "ring-1"] and p["leader"] in ("ring-0", "ring-1")
                         for p in parts(c[0].http)), 20)
    for p in range(3):
        r = c[1].http.produce(TOPIC, orjson.dumps([f"after-{p}"]), partition=p)
        assert r.status == 200, r.body
        acked.append((p, r.json()["base_offset"], f"after-{p}"))
    c[2].restart()  # a new generation: it joins afresh, is filled, and counts again
    c.wait_statuses({m.name: "up" for m in c}, timeout_s=30)
    wait_for("ring-2 back in every preference list",
             lambda: all(sorted(p["replicas"]) == ["ring-0", "ring-1", "ring-2"] for p in parts(c[0].http)), 30)
    for p, offset, value in acked:
        wait_for(f"{value} readable from ring-2",
                 lambda p=p, offset=offset, value=value: [rec["value"] for rec in c[2].http.fetch(
                     TOPIC, p, offset=offset, max_records=1).json()["records"]] == [value], 30)
