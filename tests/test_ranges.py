"""Ranges on real brokers: a partition's closed segments spread over the ring, its replicas keeping a tail.

Segments of 4 KiB make ranges within seconds. Four brokers and a replication
factor of 3 leave one broker that holds no replica of the partition: it
holds ranges all the same, and answers fetches in them.
"""

from __future__ import annotations

import time

import orjson
import pytest

from tests.brokers import Member, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

ARGS = ("--fsync", "interval:100", "--range-interval-s", "0.2", "--repair-interval-s", "1")
SEGMENT = 4096


def ranges(m: Member, topic: str, partition: int = 0) -> dict:
    r = m.http.get(f"/v1/topics/{topic}/partitions/{partition}/ranges")
    assert r.status == 200, (m.name, r.status, r.body)
    return r.json()


def produce(m: Member, topic: str, start: int, n: int, consistency: str = "all") -> None:
    """Records ``v<i>`` for i in [start, start + n), 20 to a request, so segments roll often."""
    for i in range(start, start + n, 20):
        body = orjson.dumps([f"v{j}-" + "x" * 150 for j in range(i, min(i + 20, start + n))])
        r = m.http.produce(topic, body, partition=0, consistency=consistency)
        assert r.status == 200, r.body


def read_all(m: Member, topic: str, end: int) -> list[str]:
    """Every value of partition 0 from offset 0 to ``end``, through ``m``, in order."""
    return read_all_from(m, topic, 0, end)


def test_ranges_spread_replicas_keep_a_tail_and_every_broker_reads_from_zero(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(4, *ARGS)
    r = c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                               local_retention_bytes=2 * SEGMENT)
    assert r.status == 201, r.body
    produce(c[0], topic, 0, 400)
    replicas = c[0].http.describe(topic)["partitions"][0]["replicas"]
    outsider = next(m for m in c if m.name not in replicas)

    def placed() -> dict | None:
        doc = ranges(c[0], topic)
        done = len(doc["ranges"]) >= 10 and all(len(x["holders"]) == 3 for x in doc["ranges"])
        return doc if done and doc["local_start_offset"] > 0 else None

    doc = wait_for("ranges cut, copied three times, and the local log trimmed", placed, timeout_s=60)
    assert doc["earliest_offset"] == 0
    bases = [x["base_offset"] for x in doc["ranges"]]
    assert bases[0] == 0 and all(a["end_offset"] == b["base_offset"] for a, b in zip(doc["ranges"], doc["ranges"][1:]))
    holders = {h for x in doc["ranges"] for h in x["holders"]}
    assert outsider.name in holders, (outsider.name, doc)  # ranges go where placement says, not to the replicas

    for m in c:  # each replica drops what is safe in ranges, down to its tail
        if m.name in replicas:
            wait_for(f"{m.name} keeps only a tail", lambda m=m: m.http.describe(topic)["partitions"][0]
                     ["local_start_offset"] > 0)
    expected = [f"v{i}-" + "x" * 150 for i in range(400)]
    for m in c:
        assert read_all(m, topic, 400) == expected, m.name
        part = m.http.describe(topic)["partitions"][0]
        if m.name in replicas:
            assert part["earliest_offset"] == 0, (m.name, part)
        earliest = m.http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "earliest"})
        assert earliest.status == 200 and earliest.json()["offset"] == 0, (m.name, earliest.body)
        first = m.http.fetch(topic, 0)  # no offset: from the earliest, in a range
        assert first.status == 200 and first.json()["records"][0]["offset"] == 0, (m.name, first.body)


def wait_ms_past(t_ms: int) -> None:
    """Return once the wall clock reads past ``t_ms`` (records produced after are stamped later)."""
    wait_for(f"the clock passes {t_ms}", lambda: time.time() * 1000 > t_ms, timeout_s=5, interval_s=0.001)


def test_turned_on_by_patch_then_timestamps_truncation_and_retention_go_through_ranges(make_cluster,
                                                                                        topic: str) -> None:
    c: TestCluster = make_cluster(4, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT).status == 201
    produce(c[0], topic, 0, 200)
    t_mid = int(time.time() * 1000) + 1
    wait_ms_past(t_mid)
    produce(c[0], topic, 200, 200)
    assert ranges(c[1], topic)["ranges"] == []  # everything local: no ranges
    r = c[1].http.request("PATCH", f"/v1/topics/{topic}", json_body={"local_retention_bytes": 0})
    assert r.status == 200 and r.json()["local_retention_bytes"] == 0, r.body
    wait_for("ranges below a trimmed local log", lambda: ranges(c[0], topic)["local_start_offset"] > 250, timeout_s=60)
    for m in c:
        at = m.http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": str(t_mid)})
        assert at.status == 200 and at.json()["offset"] == 200, (m.name, at.body)

    r = c[2].http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 50})
    assert r.status == 200 and r.json()["earliest_offset"] == 50, r.body
    for m in c:  # the replicas take it through replication; the holders of the range were told first
        wait_for(f"{m.name} starts at 50", lambda m=m: m.http.describe(topic)["partitions"][0]["earliest_offset"]
                 in (50, None))
        below = m.http.fetch(topic, 0, offset=49)
        assert below.status == 416 and below.json()["earliest"] == 50, (m.name, below.status, below.body)
        at = m.http.fetch(topic, 0, offset=50)
        assert at.status == 200 and at.json()["records"][0]["offset"] == 50, (m.name, at.body)

    # Retention by size over the whole partition: 400 records are about 70 KiB; keep 20 KiB.
    r = c[3].http.request("PATCH", f"/v1/topics/{topic}", json_body={"retention_bytes": 20_000})
    assert r.status == 200, r.body
    doc = wait_for("retention drops the oldest ranges", lambda: (lambda d: d if d["earliest_offset"] > 200 else None)(
        ranges(c[0], topic)), timeout_s=30)
    earliest = doc["earliest_offset"]
    assert doc["ranges"] == [] or doc["ranges"][0]["end_offset"] > earliest
    assert sum(x["bytes"] for x in doc["ranges"] if not x["local"]) < 20_000
    for m in c:
        wait_for(f"{m.name}: below {earliest} is gone", lambda m=m: m.http.fetch(topic, 0, offset=earliest - 1)
                 .status == 416)
    held = wait_for("the holders let go of what retention dropped", lambda: (lambda bases: bases if all(
        b >= doc["ranges"][0]["base_offset"] for b in bases) else None)(held_bases(c, topic)) if doc["ranges"] else True,
        timeout_s=30)
    assert held is not None
    assert read_all_from(c[1], topic, earliest, 400) == [f"v{i}-" + "x" * 150 for i in range(earliest, 400)]


def test_a_lone_broker_truncates_into_the_ranges_it_alone_holds(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(1, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=1, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    produce(c[0], topic, 0, 200)
    doc = wait_for("ranges below a trimmed local log", lambda: (lambda d: d if d["local_start_offset"] > 100 else None)(
        ranges(c[0], topic)), timeout_s=60)
    assert doc["ranges"][0]["base_offset"] == 0 and doc["ranges"][0]["holders"] == [c[0].name], doc
    r = c[0].http.post(f"/v1/topics/{topic}/partitions/0/truncate", json_body={"before_offset": 50})
    assert r.status == 200 and r.json()["earliest_offset"] == 50, r.body  # no holder to tell but itself
    below = c[0].http.fetch(topic, 0, offset=49)
    assert below.status == 416 and below.json()["earliest"] == 50, below.body
    assert read_all_from(c[0], topic, 50, 200) == [f"v{i}-" + "x" * 150 for i in range(50, 200)]


def held_bases(c: TestCluster, topic: str) -> list[int]:
    """Base offsets of every copy of a range of partition 0 any broker holds."""
    out = []
    for m in c:
        r = m.peer.get(f"/peer/v1/ranges/{topic}/0", headers=m.auth)
        assert r.status == 200, r.body
        out += [b for b, _, _ in r.json()]
    return out


def read_all_from(m: Member, topic: str, start: int, end: int) -> list[str]:
    """Every value of partition 0 from ``start`` to ``end``, through ``m``, in order: each answer starts
    at the offset asked for."""
    out: list[str] = []
    offset = start
    for _ in range(10 * end):
        if offset >= end:
            break
        r = m.http.fetch(topic, 0, offset=offset, max_records=10_000)
        assert r.status == 200, (m.name, offset, r.status, r.body)
        doc = r.json()
        assert doc["records"] and doc["records"][0]["offset"] == offset, (m.name, offset, doc)
        out += [rec["value"] for rec in doc["records"]]
        offset = doc["next_offset"]
    return out


def test_a_new_leader_serves_the_ranges_and_cuts_more(make_cluster, topic: str) -> None:
    # The old leader, killed, is taken off the ring after 4 s: its voter's place (and its ranges'
    # copies) go to the broker that had none, and trimming, which waits for every voter, goes on.
    c: TestCluster = make_cluster(4, *ARGS, "--down-grace-s", "4")
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    produce(c[0], topic, 0, 200)
    wait_for("trimmed", lambda: ranges(c[0], topic)["local_start_offset"] > 100, timeout_s=60)
    old = c.member(c.leaders(topic)[0])
    old.kill()
    others = [m for m in c if m is not old]
    wait_for("a new leader", lambda: others[0].http.describe(topic)["partitions"][0]["leader"] not in (None, old.name))
    for m in others:
        assert read_all(m, topic, 200) == [f"v{i}-" + "x" * 150 for i in range(200)], m.name
    produce(others[0], topic, 200, 200, consistency="quorum")
    wait_for("the new leader cuts and trims past the new records",
             lambda: ranges(others[0], topic)["local_start_offset"] > 300, timeout_s=60)
    wait_for(f"every range has three holders again, none of them {old.name}", lambda: all(
        len(x["holders"]) == 3 and old.name not in x["holders"] for x in ranges(others[1], topic)["ranges"]),
        timeout_s=30)
    for m in others:
        assert read_all(m, topic, 400) == [f"v{i}-" + "x" * 150 for i in range(400)], m.name


def test_the_client_reads_a_backlog_straight_from_the_holders(make_cluster, topic: str) -> None:
    from ring.client import Client

    c: TestCluster = make_cluster(4, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    produce(c[0], topic, 0, 400)
    doc = wait_for("trimmed", lambda: (lambda d: d if d["local_start_offset"] > 300 and all(
        len(x["holders"]) == 3 for x in d["ranges"]) else None)(ranges(c[0], topic)), timeout_s=60)
    replicas = c[0].http.describe(topic)["partitions"][0]["replicas"]
    outsider = next(m for m in c if m.name not in replicas)
    served_before = {m.name: m.http.status()["ranges"]["served_bytes"] for m in c}
    answered: dict[str, int] = {}
    values: list[str] = []
    with Client(c[1].url) as client:
        offset = 0
        while offset < 400:
            got = client.fetch(topic, 0, offset, max_records=10_000)
            assert got.records and got.records[0].offset == offset, (offset, got)
            values += [r.json() for r in got.records]
            answered[got.broker] = answered.get(got.broker, 0) + len(got.records)
            offset = got.next_offset
    assert values == [f"v{i}-" + "x" * 150 for i in range(400)]
    by_url = {m.url: m.name for m in c}
    below = sum(n for x in doc["ranges"] for n in [x["end_offset"] - x["base_offset"]] if x["end_offset"] <= 300)
    assert below >= 300
    # The ranges were read from their holders, every holder its share: the outsider holds no
    # replica, and answered from the copies it holds.
    assert by_url.get(outsider.url) and answered.get(outsider.url), answered
    served = {m.name: m.http.status()["ranges"]["served_bytes"] - served_before[m.name] for m in c}
    assert served[outsider.name] > 0 and sum(1 for v in served.values() if v > 0) >= 3, served


def stable(m: Member, topic: str, partition: int, past: int) -> dict:
    """Wait until every closed segment of the partition is a range on three holders and the replicas
    keep only their active segment (which starts past ``past``); the ranges answer."""
    return wait_for("ranges done", lambda: (lambda d: d if d["ranges"] and d["ranges"][-1]["end_offset"] ==
                    d["local_start_offset"] > past and all(len(x["holders"]) == 3 for x in d["ranges"]) else None)(
        ranges(m, topic, partition)), timeout_s=60)


def flip_bit(path, back: int) -> None:
    """Flip one bit ``back`` bytes before the end of a file (inside the last batch's records)."""
    with open(path, "r+b") as f:
        f.seek(-back, 2)
        b = f.read(1)
        f.seek(-back, 2)
        f.write(bytes([b[0] ^ 0x04]))


def holds(m: Member, topic: str, base: int, checksum: str) -> bool:
    r = m.peer.get(f"/peer/v1/ranges/{topic}/0", headers=m.auth)
    return r.status == 200 and [base, checksum] in [[b, s] for b, _, s in r.json()]


def test_a_flipped_bit_in_a_held_copy_is_never_served_and_the_copy_is_made_again(make_cluster, topic: str) -> None:
    c: TestCluster = make_cluster(4, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    produce(c[0], topic, 0, 400)
    doc = stable(c[0], topic, 0, 350)
    read, scrubbed = doc["ranges"][0], doc["ranges"][1]  # one found by a read, one by a scrub
    by_read, by_scrub = c.member(read["holders"][0]), c.member(scrubbed["holders"][-1])
    for r, m in ((read, by_read), (scrubbed, by_scrub)):
        flip_bit(m.local.data_dir / "ranges" / topic / "0" / f"{r['base_offset']:020d}.log", 20)
    # A read through the holder with the bad copy: its CRC check fails, another holder answers.
    got = by_read.http.fetch(topic, 0, offset=read["base_offset"], max_records=10_000)
    assert got.status == 200 and got.json()["records"][0]["value"] == f"v{read['base_offset']}-" + "x" * 150
    expected = [f"v{i}-" + "x" * 150 for i in range(400)]
    for m in c:
        assert read_all(m, topic, 400) == expected, m.name
    for r, m in ((read, by_read), (scrubbed, by_scrub)):  # the audit has the range copied to it again
        wait_for(f"{m.name} holds a sound copy of range {r['base_offset']} again",
                 lambda r=r, m=m: holds(m, topic, r["base_offset"], r["checksum"]), timeout_s=60)
    assert by_read.http.status()["ranges"]["damaged_dropped"] >= 1
    assert by_scrub.http.status()["ranges"]["damaged_dropped"] >= 1
    wait_for("three holders again", lambda: all(len(x["holders"]) == 3 for x in ranges(c[0], topic)["ranges"]))
    for m in c:
        assert read_all(m, topic, 400) == expected, m.name


def test_a_full_broker_takes_no_new_range_and_still_takes_appends(make_cluster, topic: str) -> None:
    import subprocess
    import sys

    c: TestCluster = make_cluster(4, *ARGS)
    full = c[3]
    full.local.args += ["--disk-free-min-bytes", str(10**18)]  # more than any disk has free
    full.restart()
    c.wait_statuses({m.name: "up" for m in c})
    wait_for("gossip says ring-3 is full", lambda: next(b for b in c[0].http.get("/v1/cluster").json()["brokers"]
                                                        if b["name"] == full.name)["load"].get("ranges_full"))
    assert c[0].http.create_topic(topic, partitions=4, replication_factor=3, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    doc = c[0].http.describe(topic)
    assert any(full.name in p["replicas"] for p in doc["partitions"])
    for p in range(4):  # appends go on, on the partitions the full broker holds too
        for i in range(0, 200, 20):
            body = orjson.dumps([f"p{p}-{j}-" + "x" * 150 for j in range(i, i + 20)])
            r = c[0].http.produce(topic, body, partition=p, consistency="all")
            assert r.status == 200, r.body
    for p in range(4):
        placed = stable(c[0], topic, p, 150)
        assert all(full.name not in x["holders"] for x in placed["ranges"]), (p, placed)
    order = {"base": 0, "end": 10, "size": 100, "checksum": "ab" * 20, "max_timestamp": 0,
             "created_ms": doc["created_ms"], "sources": [c[0].name]}
    refused = full.peer.post(f"/peer/v1/ranges/{topic}/0/copy", headers=full.auth, json_body=order)
    assert refused.status == 507 and refused.json()["error"] == "storage_full", refused.body
    human = subprocess.run([sys.executable, "-m", "ring", "cluster", "status", "--brokers", c[0].url],
                           capture_output=True, timeout=60, check=True).stdout.decode()
    assert "RANGES" in human and f"{full.name}: free disk below its floor" in human, human


def test_a_replica_that_lost_its_disk_serves_the_ranges_before_its_leader_hands_it_the_catalogue(
        make_cluster, topic: str) -> None:
    import shutil

    c: TestCluster = make_cluster(4, *ARGS)
    assert c[0].http.create_topic(topic, partitions=1, replication_factor=3, segment_bytes=SEGMENT,
                                  local_retention_bytes=0).status == 201
    produce(c[0], topic, 0, 300)
    doc = stable(c[0], topic, 0, 250)
    leader = c.leaders(topic)[0]
    follower = next(c.member(n) for n in c[0].http.describe(topic)["partitions"][0]["replicas"] if n != leader)
    follower.kill()
    shutil.rmtree(follower.local.data_dir)  # a new disk: it comes back knowing nothing
    follower.restart()
    wait_for(f"{follower.name} follows again from the leader's log start", lambda: follower.http.describe(topic)
             ["partitions"][0]["local_start_offset"] == doc["local_start_offset"], timeout_s=30)
    # Before its leader hands it the catalogue (unchanged: up to RANGE_CATALOGUE_RESEND_S), reads through it
    # below its log start are asked of the leader, and it asks the leader for the catalogue itself.
    first = follower.http.fetch(topic, 0, offset=0)
    assert first.status == 200 and first.json()["records"][0]["offset"] == 0, first.body
    assert read_all(follower, topic, 300) == [f"v{i}-" + "x" * 150 for i in range(300)]
    wait_for(f"{follower.name} has the catalogue", lambda: ranges(follower, topic)["earliest_offset"] == 0
             and len(ranges(follower, topic)["ranges"]) == len(doc["ranges"]), timeout_s=30)
