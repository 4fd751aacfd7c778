"""Topic administration, offsets by timestamp, status, the auto-create switch, shutdown."""

from __future__ import annotations

import signal
import threading
import time

import msgpack
import orjson
import pytest

from ring import limits
from tests.brokers import Http, TestBroker
from tests.support import wait_for

pytestmark = pytest.mark.integration


def test_topic_crud(http: Http, broker: TestBroker, topic: str) -> None:
    r = http.create_topic(topic, partitions=3, retention_ms=3_600_000, segment_bytes=1 << 20, compression="zstd")
    assert r.status == 201, r.body
    doc = r.json()
    assert doc["name"] == topic and doc["partition_count"] == 3 and doc["compression"] == "zstd"
    assert doc["unclean_leader_election"] is False
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    p0 = doc["partitions"][0]
    assert p0 == {"partition": 0, "earliest_offset": 0, "local_start_offset": 0, "end_offset": 0, "high_watermark": 0,
                  "leader": "ring-0", "replicas": ["ring-0"], "epoch": 1, "replica_end_offsets": {"ring-0": 0},
                  "lost_state": [], "no_eligible_leader": False, "unclean_elections": []}
    assert http.create_topic(topic).status == 409
    listed = http.get("/v1/topics").json()["topics"]
    assert {"name": topic, "partitions": 3}.items() <= next(t for t in listed if t["name"] == topic).items()

    assert http.produce(topic, b'["a", "b"]', partition=1).status == 200
    described = http.get(f"/v1/topics/{topic}").json()
    assert described["partitions"][1]["end_offset"] == 2 and described["partitions"][1]["high_watermark"] == 2
    assert [r["value"] for r in http.fetch(topic, 1).json()["records"]] == ["a", "b"]  # zstd batches

    assert http.delete(f"/v1/topics/{topic}").status == 200
    assert http.get(f"/v1/topics/{topic}").status == 404
    assert http.delete(f"/v1/topics/{topic}").status == 404
    assert not (broker.data_dir / "topics" / topic).exists()
    # the name is free again, and the new topic starts empty
    assert http.create_topic(topic, partitions=1).status == 201
    assert http.fetch(topic, 0).json()["records"] == []


def test_defaults_of_a_created_topic(http: Http, topic: str) -> None:
    doc = http.create_topic(topic).json()
    assert doc["partition_count"] == limits.TOPIC_PARTITIONS_DEFAULT
    assert doc["retention_ms"] == limits.RETENTION_MS_DEFAULT and doc["compression"] == "none"


def test_the_smallest_segments_roll_and_serve(http: Http, topic: str) -> None:
    # Segments below the index interval once failed to open: a 500, and a topic left half-made.
    r = http.create_topic(topic, partitions=1, segment_bytes=limits.SEGMENT_BYTES_MIN)
    assert r.status == 201, r.body
    values = ["x" * 300 + str(i) for i in range(20)]  # about 6 KiB: several segments
    assert http.produce(topic, orjson.dumps(values), partition=0).status == 200
    got = http.fetch(topic, 0, max_records=100).json()["records"]
    assert [rec["value"] for rec in got] == values


def test_delete_wakes_long_polls_with_404(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=1)
    result = {}

    def poll() -> None:
        result["reply"] = http.fetch(topic, 0, wait_ms=10_000)

    parked = http.status()["long_polls_open"]
    t = threading.Thread(target=poll)
    t.start()
    wait_for("the fetch parked as a long poll", lambda: http.status()["long_polls_open"] > parked)
    assert http.delete(f"/v1/topics/{topic}").status == 200
    t.join(10)
    assert result["reply"].status == 404 and result["reply"].json()["error"] == "unknown_topic"


def test_offsets_by_timestamp(http: Http, topic: str) -> None:
    http.create_topic(topic, partitions=1)
    items = [{"value": b"x", "timestamp": ts} for ts in (1000, 2000, 3000)]
    assert http.produce(topic, msgpack.packb(items), "application/msgpack", partition=0).status == 200
    later = [{"value": b"y", "timestamp": 5000}]
    assert http.produce(topic, msgpack.packb(later), "application/msgpack", partition=0).status == 200

    def offset(ts) -> int:
        r = http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": ts})
        assert r.status == 200, r.body
        return r.json()["offset"]

    assert [offset(ts) for ts in (0, 1000, 1500, 2000, 3001, 5000)] == [0, 0, 1, 1, 3, 3]
    assert offset(6000) == 4  # all older: the high watermark
    assert offset("earliest") == 0 and offset("latest") == 4
    r = http.get(f"/v1/topics/{topic}/partitions/0/offsets", query={"timestamp": "noon"})
    assert r.status == 400


def test_records_older_than_retention_are_taken_and_the_answer_and_log_say_so(broker, http: Http,
                                                                               topic: str) -> None:
    hour_ms = 3_600_000
    http.create_topic(topic, partitions=2, retention_ms=hour_ms)
    now_ms = int(time.time() * 1000)
    old = [{"value": b"old", "timestamp": now_ms - 2 * hour_ms} for _ in range(3)]
    r = http.produce(topic, msgpack.packb(old), "application/msgpack", partition=1)
    assert r.status == 200, r.body
    doc = r.json()
    assert (doc["partition"], doc["base_offset"], doc["count"], doc["past_retention"]) == (1, 0, 3, 3)
    assert "older than the topic's retention" in doc["warning"] and str(hour_ms) in doc["warning"]
    wait_for("the broker's log names the topic", lambda: f"topic {topic!r} took 3 records older than its retention"
             in broker.log_text())
    # Records within retention, and a batch whose newest record is within it, answer as always.
    fresh = [{"value": b"old", "timestamp": now_ms - 2 * hour_ms}, {"value": b"new", "timestamp": now_ms}]
    for items in ([{"value": b"new"}], fresh):
        r = http.produce(topic, msgpack.packb(items), "application/msgpack", partition=1)
        assert r.status == 200 and set(r.json()) == {"topic", "partition", "base_offset", "count"}, r.body
    assert http.fetch(topic, 1).json()["high_watermark"] == 6  # nothing refused: every record is there
    # When keys spread a request, each partition's answer counts its own records.
    keyed = [{"key": b"k%d" % i, "value": b"v", "timestamp": now_ms - 2 * hour_ms} for i in range(12)]
    results = http.produce(topic, msgpack.packb(keyed), "application/msgpack").json()["results"]
    assert len(results) == 2 and all(r["past_retention"] == r["count"] > 0 for r in results), results
    # A topic that keeps records forever takes history silently.
    forever = topic + "-forever"
    http.create_topic(forever, partitions=1, retention_ms=-1)
    r = http.produce(forever, msgpack.packb(old), "application/msgpack", partition=0)
    assert r.status == 200 and "past_retention" not in r.json()


def test_status_and_openapi(http: Http) -> None:
    doc = http.get("/v1/status").json()
    assert doc["name"] == "ring-0" and doc["status"] == "ok" and doc["clean_shutdown"] is True
    assert doc["uptime_s"] >= 0 and isinstance(doc["topics"], int) and doc["version"]
    api = http.get("/v1/openapi.json").json()
    assert api["openapi"].startswith("3.1")


def test_auto_create_switch(make_broker) -> None:
    off = make_broker("--no-auto-create", name="no-auto")
    r = off.http.produce("fresh", b"1")
    assert r.status == 404 and r.json()["error"] == "unknown_topic"
    assert off.http.end_offsets("fresh") is None
    assert off.http.get("/v1/status").json()["auto_create"] is False
    assert off.http.create_topic("fresh", partitions=1).status == 201
    assert off.http.produce("fresh", b"1").status == 200

    env_off = make_broker(name="env-off", env={"RING_AUTO_CREATE": "false"})
    assert env_off.http.produce("fresh", b"1").status == 404

    on = make_broker(name="auto")
    r = on.http.produce("fresh", b'{"x": 1}')
    assert r.status == 200
    assert len(on.http.end_offsets("fresh")) == limits.TOPIC_PARTITIONS_DEFAULT


def test_sigterm_finishes_cleanly_and_keeps_everything(make_broker) -> None:
    b = make_broker("--fsync", "never")
    for i in range(5):
        assert b.http.produce("kept", orjson.dumps([i, i]), partition=0).status == 200
    assert b.stop() == 0
    assert "listening on" in b.log_text()
    assert (b.data_dir / "clean-shutdown").exists()
    b.restart()
    status = b.http.get("/v1/status").json()
    assert status["clean_shutdown"] is True
    values = [r["value"] for r in b.http.fetch("kept", 0).json()["records"]]
    assert values == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_sigterm_answers_an_open_long_poll(make_broker) -> None:
    b = make_broker()
    b.http.create_topic("waiting", partitions=1)
    result = {}

    def poll() -> None:
        result["reply"] = b.http.fetch("waiting", 0, wait_ms=20_000)

    t = threading.Thread(target=poll)
    t.start()
    wait_for("the fetch parked as a long poll", lambda: b.http.status()["long_polls_open"] == 1)
    t0 = time.monotonic()
    b.signal(signal.SIGTERM)
    t.join(10)
    assert result["reply"].status == 200 and result["reply"].json()["records"] == []
    assert b.local.proc.wait(10) == 0
    assert time.monotonic() - t0 < limits.SHUTDOWN_GRACE_S + 3


def test_sigkill_is_reported_as_unclean(make_broker) -> None:
    b = make_broker()
    assert b.http.produce("crash", b"1", partition=0).status == 200
    b.kill()
    b.restart()
    assert b.http.get("/v1/status").json()["clean_shutdown"] is False
    assert [r["value"] for r in b.http.fetch("crash", 0).json()["records"]] == [1]


def test_two_brokers_cannot_share_a_data_directory(make_broker, tmp_path) -> None:
    first = make_broker()
    second = TestBroker(tmp_path, name=first.local.name)
    with pytest.raises(RuntimeError):
        second.start()
    assert "in use" in second.log_text()
    second.kill()
