"""A broker whose wall clock is wrong, on three real brokers: one runs under libfaketime (Debian
``faketime``, the monotonic clock left alone).

It measures its clock against its peers' over gossip and, beyond ``--max-clock-offset``,
says so (log, /v1/status, /v1/cluster, /metrics, ``ring cluster status``), leads no
partition, stamps no record and deletes nothing by its clock (retention is the leader's,
and its replicas follow the leader's start offset). Once its clock is right it leads again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from ring.log import batch as batchfmt
from tests.brokers import REPO_ROOT, Member, TestCluster, faketime, faketime_file, libfaketime
from tests.support import require, wait_for

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
ARGS = ("--fsync", "interval:100", "--retention-interval-s", "0.5")


@pytest.fixture(autouse=True)
def _needs_faketime() -> None:
    require(None if shutil.which("faketime") and libfaketime() else
            "the faketime package is not installed (apt-get install faketime)")



def clock(m: Member) -> dict:
    return m.http.get("/v1/status").json()["clock"]


def led(m: Member) -> int:
    return m.http.get("/v1/status").json()["leadership"]["led"]


def leaders(m: Member, topic: str) -> dict[int, str | None]:
    return {p["partition"]: p["leader"] for p in m.http.get(f"/v1/topics/{topic}").json()["partitions"]}


def clocks_seen(m: Member) -> dict[str, str | None]:
    return {b["name"]: b["clock"]["state"] for b in m.http.get("/v1/cluster").json()["brokers"]}


def test_eight_days_ahead_it_keeps_young_segments_leads_nothing_says_so_and_leads_again_once_right(
        make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(3, *ARGS, prefixes={2: faketime("+8d")})
    skewed, healthy = c[2], [c[0], c[1]]

    # It knows, and says so everywhere.
    mine = clock(skewed)
    assert mine["state"] == "out_of_bounds" and abs(mine["offset_ms"] - 8 * DAY_MS) < 5000, mine
    assert abs(mine["peers"]["ring-0"]["offset_ms"] + 8 * DAY_MS) < 5000
    for m in healthy:
        assert clock(m)["state"] == "ok" and abs(clock(m)["offset_ms"]) < 1000
    for m in c:
        wait_for(f"{m.name} sees ring-2's clock out of bounds", lambda m=m: clocks_seen(m) == {
            "ring-0": "ok", "ring-1": "ok", "ring-2": "out_of_bounds"})
    metrics = skewed.http.get("/metrics").body.decode()
    assert 'ring_clock_state{state="out_of_bounds"} 1.0' in metrics
    offset_s = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("ring_clock_offset_seconds "))
    assert abs(offset_s - 8 * 86_400) < 5
    assert "clock of ring-2 out of bounds" in skewed.log_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RING_")}
    ran = subprocess.run([sys.executable, "-m", "ring", "cluster", "status"], capture_output=True, timeout=60,
                         env={**env, "PYTHONPATH": str(REPO_ROOT), "RING_BROKERS": c[0].url}, cwd=REPO_ROOT)
    assert ran.returncode == 0, ran.stderr
    assert "OUT 8.0 d ahead" in ran.stdout.decode() and "ring-2: clock out of bounds" in ran.stdout.decode()

    # A topic keeping 7 days, in small segments; 600 records through all three brokers.
    assert c[0].http.create_topic(topic, partitions=6, replication_factor=3, segment_bytes=4096).status == 201
    refused = skewed.http.produce(topic, b'[{"value": "stamped by a wrong clock?"}]')
    assert refused.status == 503 and refused.json()["error"] == "clock_unusable", refused.body
    assert "Retry-After" in refused.headers
    now_ms = int(time.time() * 1000)
    for i in range(30):
        m = c[i % 3]
        if m is skewed:  # what it takes: batches the client stamped
            data = bytes(batchfmt.encode([(now_ms, None, b'"' + b'v' * 100 + b'"', None)] * 20, now_ms=now_ms))
            r = m.http.produce(topic, data, content_type="application/vnd.ring.batch", partition=i % 6)
        else:
            r = m.http.produce(topic, orjson.dumps([{"value": "v" * 100}] * 20), partition=i % 6)
        assert r.status == 200, (m.name, r.body)

    # It leads nothing: every partition is led by the others, and it does not get its own back.
    wait_for("every partition led", lambda: None not in leaders(c[0], topic).values())
    for _ in range(30):  # three seconds: past the natural leader's hand-back wait (HANDOFF_MIN_LEAD_MS)
        assert "ring-2" not in leaders(c[0], topic).values() and led(skewed) == 0
        time.sleep(0.1)
    stamps = [rec["timestamp"] for p in range(6) for rec in c[0].http.fetch(topic, p, max_records=1000).json()["records"]]
    assert len(stamps) == 600 and all(abs(t - now_ms) < 60_000 for t in stamps)  # none stamped days off

    # Retention sweeps after the writes, on every broker: nothing young goes, anywhere.
    swept = {m.name: m.http.get("/v1/status").json()["retention_sweeps"] for m in c}
    for m in c:
        wait_for(f"{m.name} swept twice", lambda m=m: m.http.get("/v1/status").json()["retention_sweeps"]
                 >= swept[m.name] + 2)
    for m in c:
        assert all(p["earliest_offset"] == 0 for p in m.http.get(f"/v1/topics/{topic}").json()["partitions"]), m.name
    for p in range(6):
        files = [sorted(f.name for f in (m.local.data_dir / "topics" / topic / str(p)).glob("*.log")) for m in c]
        assert len(files[0]) > 1 and files[2] == files[0] == files[1], (p, files)  # every young segment kept

    # Started again with a correct clock, it leads again.
    skewed.restart(prefix=[])
    assert clock(skewed)["state"] == "ok"  # it joins once it has compared its clock
    wait_for("ring-2 leads again", lambda: led(skewed) > 0 and "ring-2" in leaders(c[0], topic).values())
    assert skewed.http.produce(topic, b'[{"value": "now"}]').status == 200


def test_a_clock_set_while_it_leads_hands_its_partitions_over_until_it_is_right_again(
        make_cluster, topic: str, tmp_path: Path) -> None:
    offset = tmp_path / "ring-2.faketime"
    offset.write_text("+0\n")
    c: TestCluster = make_cluster(3, *ARGS, prefixes={2: faketime_file(offset)})
    skewed = c[2]
    assert clock(skewed)["state"] == "ok"
    assert c[0].http.create_topic(topic, partitions=6, replication_factor=3).status == 201
    wait_for("ring-2 leads its partitions", lambda: led(skewed) == 2)

    offset.write_text("-60s\n")  # its clock is set a minute back while it leads
    got = wait_for("ring-2 finds its clock out of bounds",
                   lambda: (v := clock(skewed))["state"] == "out_of_bounds" and v)
    assert abs(got["offset_ms"] + 60_000) < 5000, got
    assert "clock of ring-2 was set" in skewed.log_text()
    wait_for("ring-2 hands its partitions over", lambda: led(skewed) == 0)
    wait_for("every partition led by the others", lambda: set(leaders(c[0], topic).values()) == {"ring-0", "ring-1"})
    assert skewed.http.produce(topic, b'[{"value": "x"}]').json()["error"] == "clock_unusable"
    assert c[0].http.produce(topic, b'[{"value": "x"}]').status == 200

    offset.write_text("+0\n")  # set right again
    wait_for("ring-2's clock is back within bounds", lambda: clock(skewed)["state"] == "ok")
    wait_for("ring-2 leads again", lambda: led(skewed) > 0)



def test_a_coordinator_whose_clock_may_not_be_used_stores_no_group_record(
        make_cluster, topic: str, tmp_path: Path) -> None:
    from ring.catalog import OFFSETS_TOPIC

    offset = tmp_path / "ring-1.faketime"
    offset.write_text("+0\n")
    # Two brokers: once one clock is 8 days off neither can tell whose is wrong, so neither may use
    # its clock, and neither may hand what it leads to the other: each keeps leading it.
    c: TestCluster = make_cluster(2, *ARGS, prefixes={1: faketime_file(offset)})
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=2).status == 201
    commit = {"offsets": [{"topic": topic, "partition": 0, "offset": 0}]}
    assert c[0].http.post("/v1/groups/g/offsets", json_body=commit).status == 200
    offset.write_text("+8d\n")
    for m in c:
        wait_for(f"{m.name} finds its clock out of bounds", lambda m=m: clock(m)["state"] == "out_of_bounds")
    wait_for("every offsets partition led", lambda: None not in leaders(c[0], OFFSETS_TOPIC).values())
    ends = [p["end_offset"] for p in c[0].http.get(f"/v1/topics/{OFFSETS_TOPIC}").json()["partitions"]]
    for m in c:  # the group's coordinator stamps its records as a produce would: refused alike
        r = m.http.post("/v1/groups/g/offsets", json_body=commit)
        assert r.status == 503 and r.json()["error"] == "clock_unusable", (m.name, r.status, r.body)
    assert [p["end_offset"] for p in c[0].http.get(f"/v1/topics/{OFFSETS_TOPIC}").json()["partitions"]] == ends
