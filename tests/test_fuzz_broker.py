"""Hostile produce requests against a real broker process: never a 5xx, and what is accepted can be read.

The bodies, Content-Types and query strings of ``test_fuzz_decoders`` go to
the real ``POST /v1/topics/{topic}/messages`` of the session broker. Each
answer must be a 200 or a documented client error in the JSON error shape.
After every accepted request the partitions it wrote to are fetched in every
answer format (JSON, NDJSON, msgpack, stored batches): each fetch must
succeed and return at least the records the produce reported, so nothing a
broker accepts can make a later read fail.
"""

from __future__ import annotations

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.brokers import Http, TestBroker
from ring.http_api import codec
from tests.test_fuzz_decoders import CTYPES, INT_EDGES, crafted_batches, http_bodies, json_docs, queries

msgpack_records = st.fixed_dictionaries(
    {"value": st.binary(max_size=10) | st.text(max_size=10)},
    optional={"key": st.none() | st.binary(max_size=6) | st.text(max_size=6),
              "headers": st.none() | st.dictionaries(st.text(min_size=1, max_size=4),
                                                      st.none() | st.binary(max_size=4), max_size=3),
              "timestamp": st.none() | st.sampled_from(INT_EDGES)},
)
# Garbage of every kind with any Content-Type, and bodies that mostly fit their type, so that
# many requests are accepted and the fetch side is exercised too.
requests = st.one_of(
    st.tuples(http_bodies, st.sampled_from(CTYPES)),
    st.tuples(json_docs, st.just(codec.CT_JSON)),
    st.tuples(st.lists(json_docs, min_size=1, max_size=4).map(b"\n".join), st.just(codec.CT_NDJSON)),
    st.tuples(msgpack_records.map(msgpack.packb) | st.lists(msgpack_records, min_size=1, max_size=4).map(msgpack.packb),
              st.just(codec.CT_MSGPACK)),
    st.tuples(st.lists(crafted_batches(), min_size=1, max_size=2).map(b"".join), st.just(codec.CT_BATCH)),
    st.tuples(st.binary(min_size=1, max_size=20), st.just(codec.CT_TEXT)),
)

TOPIC = "fuzz-produce"
PARTITIONS = 2
ACCEPTS = ["application/json", "application/x-ndjson", "application/msgpack", "application/vnd.ring.batches"]


@pytest.fixture(scope="module")
def fuzz_http(broker: TestBroker) -> Http:
    http = broker.http
    r = http.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1, consistency="one")
    assert r.status in (201, 409), r.body
    return http


def _check_error(status: int, body: bytes) -> None:
    assert status in (400, 404, 408, 413, 415), (status, body[:300])
    doc = orjson.loads(body)
    assert type(doc["error"]) is str and type(doc["message"]) is str


def _fetch_all_formats(http: Http, partition: int, base_offset: int, count: int) -> None:
    for accept in ACCEPTS:
        r = http.fetch(TOPIC, partition, accept, offset=base_offset, max_records=count)
        assert r.status == 200, (accept, r.status, r.body[:300])
        assert int(r.headers["Ring-Next-Offset"]) >= base_offset + count, (accept, dict(r.headers))
        if accept == "application/json":
            assert len(orjson.loads(r.body)["records"]) == count
        elif accept == "application/x-ndjson":
            assert len([orjson.loads(line) for line in r.body.splitlines()]) == count
        elif accept == "application/msgpack":
            assert len(msgpack.unpackb(r.body, raw=False)["records"]) == count


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(requests, queries)
def test_produce_garbage_to_a_real_broker(fuzz_http: Http, request: tuple[bytes, str | None],
                                          query: dict[str, str]) -> None:
    body, ctype = request
    headers = {"Content-Type": ctype if ctype is not None else ""}
    r = fuzz_http.post(f"/v1/topics/{TOPIC}/messages", body=body, headers=headers, query=query or None)
    if r.status != 200:
        _check_error(r.status, r.body)
        return
    doc = r.json()
    for result in doc.get("results", [doc]):
        _fetch_all_formats(fuzz_http, result["partition"], result["base_offset"], result["count"])
