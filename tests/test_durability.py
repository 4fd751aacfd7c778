"""With --fsync always, every acknowledged record survives SIGKILL, and offsets continue without reuse or gap."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from tests.brokers import Http

pytestmark = pytest.mark.integration

TOPIC = "durable"
PARTITIONS = 2


def _produce_many(http: Http, requests: int, tag: str, stop: threading.Event | None = None) -> list[tuple[int, int, list]]:
    """Concurrent produce requests; returns (partition, base_offset, values) of each acknowledged one."""

    def one(i: int):
        if stop is not None and stop.is_set():
            return None
        values = [{"tag": tag, "req": i, "n": n} for n in range(1 + i % 4)]
        try:
            r = http.produce(TOPIC, orjson.dumps(values), partition=i % PARTITIONS)
        except OSError:
            return None  # the broker died under us: not acknowledged
        if r.status != 200:
            return None
        doc = r.json()
        assert doc["count"] == len(values)
        return doc["partition"], doc["base_offset"], values

    with ThreadPoolExecutor(8) as pool:
        return [x for x in pool.map(one, range(requests)) if x is not None]


def _all_records(http: Http, partition: int) -> dict[int, object]:
    out, offset = {}, 0
    while True:
        doc = http.fetch(TOPIC, partition, offset=offset, max_records=10_000).json()
        out.update({r["offset"]: r["value"] for r in doc["records"]})
        if doc["next_offset"] >= doc["high_watermark"]:
            return out
        offset = doc["next_offset"]


def _check_acked_served(http: Http, acked: list[tuple[int, int, list]]) -> None:
    served = {p: _all_records(http, p) for p in range(PARTITIONS)}
    for partition, base, values in acked:
        got = [served[partition].get(base + i) for i in range(len(values))]
        assert got == values, (partition, base)


def test_acknowledged_records_survive_sigkill_and_offsets_continue(make_broker) -> None:
    b = make_broker("--fsync", "always")
    assert b.http.create_topic(TOPIC, partitions=PARTITIONS).status == 201
    acked = _produce_many(b.http, 60, "phase1")
    assert len(acked) == 60
    ends = {p: max(base + len(v) for q, base, v in acked if q == p) for p in range(PARTITIONS)}
    # offsets were handed out without gaps or overlaps
    for p in range(PARTITIONS):
        spans = sorted((base, base + len(v)) for q, base, v in acked if q == p)
        assert spans[0][0] == 0 and all(a[1] == b_[0] for a, b_ in zip(spans, spans[1:]))

    b.kill()
    b.restart()
    http = b.http
    _check_acked_served(http, acked)
    for p in range(PARTITIONS):
        r = http.produce(TOPIC, b'"after"', partition=p)
        assert r.status == 200 and r.json()["base_offset"] == ends[p], "offset reused or skipped"


def test_acknowledged_records_survive_sigkill_mid_stream(make_broker) -> None:
    b = make_broker("--fsync", "always")
    assert b.http.create_topic(TOPIC, partitions=PARTITIONS).status == 201
    stop = threading.Event()
    result: list = []
    producer = threading.Thread(target=lambda: result.extend(_produce_many(b.http, 400, "mid", stop)))
    producer.start()
    deadline = time.monotonic() + 20
    while len(_all_records(b.http, 0)) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    b.kill()  # requests are in flight right now
    stop.set()
    producer.join(30)
    assert result, "nothing was acknowledged before the kill"
    b.restart()
    _check_acked_served(b.http, result)
    for p in range(PARTITIONS):
        end = b.http.end_offsets(TOPIC)[p]
        acked_end = max((base + len(v) for q, base, v in result if q == p), default=0)
        assert end >= acked_end
        assert b.http.produce(TOPIC, b"1", partition=p).json()["base_offset"] == end
