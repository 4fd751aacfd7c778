"""A group poll answered with stored batches (``Accept: application/vnd.ring.poll-batches``) hands out
exactly the records a msgpack poll does, answer by answer, with the same tokens, commits and
redelivery: a real broker, batches cut by ``max_records`` in their middle, keys, headers and values
without a value.
"""

from __future__ import annotations

from typing import Any

import msgpack
import orjson
import pytest

from ring.log import batch as batchfmt
from tests.brokers import TestBroker

pytestmark = pytest.mark.integration

CT_POLL_BATCHES = "application/vnd.ring.poll-batches"
CT_MSGPACK = "application/msgpack"
PARTITIONS = 2
BATCHES_PER_PARTITION = 6
RECORDS_PER_BATCH = 7  # max_records below cuts batches in their middle
MAX_RECORDS = 10


def _fill(api: Any, topic: str) -> int:
    """Batches of several records in every partition: keys, headers, JSON values and records without a value."""
    assert api.create_topic(topic, partitions=PARTITIONS).status == 201
    n = 0
    for b in range(BATCHES_PER_PARTITION):
        for p in range(PARTITIONS):
            records = [{"key": f"k{p}-{b}-{i}", "value": None if i == 3 else orjson.dumps({"p": p, "n": n + i}),
                        "headers": [["h", f"{b}".encode()]] if i % 2 else []} for i in range(RECORDS_PER_BATCH)]
            r = api.produce(topic, msgpack.packb(records, use_bin_type=True), "application/msgpack", partition=p)
            assert r.status == 200, r.body
            n += RECORDS_PER_BATCH
    return n


def _poll(api: Any, group: str, accept: str, token: str | None) -> tuple[list[tuple[Any, ...]], str, dict[str, Any]]:
    """One poll: its records as (topic, partition, offset, timestamp, key, value, headers), its token and doc."""
    query = {"max_records": MAX_RECORDS, "generation": 1, **({"token": token} if token else {})}
    r = api.post(f"/v1/groups/{group}/members/c/poll", headers={"Accept": accept}, query=query)
    assert r.status == 200, r.body
    assert r.content_type == accept
    doc = msgpack.unpackb(r.body, raw=False)
    assert r.headers["Ring-Poll-Token"] == doc["token"]
    if accept == CT_MSGPACK:
        got = [(x["topic"], x["partition"], x["offset"], x["timestamp"], x["key"], x["value"],
                batchfmt.header_pairs(x["headers"])) for x in doc["records"]]
    else:
        assert "records" not in doc
        got = [(t, p, r.offset, r.timestamp, r.key, r.value, r.headers)
               for t, p, start, end, data in doc["batches"]
               for r, _ in batchfmt.records_between(data, start, end, end - start, verify=True)]
    return got, doc["token"], doc


def _committed(api: Any, group: str) -> dict[int, int | None]:
    r = api.get(f"/v1/groups/{group}")
    assert r.status == 200, r.body
    return {o["partition"]: o["committed"] for o in r.json()["offsets"]}


def test_a_batches_poll_hands_out_what_a_msgpack_poll_does(make_broker, topic: str) -> None:
    b: TestBroker = make_broker()
    api = b.http
    total = _fill(api, topic)
    answers: dict[str, list[list[tuple[Any, ...]]]] = {}
    for accept, group in ((CT_MSGPACK, "records"), (CT_POLL_BATCHES, "batches")):
        r = api.post(f"/v1/groups/{group}/members", json_body={"consumer": "c", "topics": [topic]})
        assert r.status == 200 and r.json()["generation"] == 1, r.body
        token, seen = None, answers.setdefault(group, [])
        for _ in range(total):  # bounded: every answer hands out at least one record until all are out
            got, token, doc = _poll(api, group, accept, token)
            if not got:
                break
            assert len(got) <= MAX_RECORDS
            seen.append(got)
        # The last answer's token commits what it handed out: everything.
        assert not _poll(api, group, accept, token)[0]
        assert _committed(api, group) == {p: total // PARTITIONS for p in range(PARTITIONS)}
    assert answers["batches"] == answers["records"]
    flat = [x for a in answers["batches"] for x in a]
    assert len(flat) == total and len({(x[1], x[2]) for x in flat}) == total
    assert any(x[5] is None for x in flat) and any(x[6] for x in flat)


def test_a_batches_answer_never_acknowledged_is_handed_out_again(make_broker, topic: str) -> None:
    b: TestBroker = make_broker()
    api = b.http
    _fill(api, topic)
    r = api.post("/v1/groups/g/members", json_body={"consumer": "c", "topics": [topic]})
    assert r.status == 200, r.body
    first, token, doc = _poll(api, "g", CT_POLL_BATCHES, None)
    # A batch cut in its middle: the answer carries whole stored batches, and says which records are handed out.
    assert any((end - start) % RECORDS_PER_BATCH for _, _, start, end, _ in doc["batches"])
    # No token, a fresh connection: the answer was not received, so the same records come again.
    again, token2, _ = _poll(api, "g", CT_POLL_BATCHES, None)
    assert again == first and token2 == token
    assert set(_committed(api, "g").values()) <= {0, None}
    # Naming it commits exactly those records, and the next answer starts where it stopped (mid-batch).
    after, _, _ = _poll(api, "g", CT_POLL_BATCHES, token)
    ends = {}
    for t, p, o, *_ in first:
        ends[p] = o + 1
    assert {p: o for p, o in _committed(api, "g").items() if p in ends} == ends
    assert after and all(o >= ends.get(p, 0) for _, p, o, *_ in after)
    assert not {(p, o) for _, p, o, *_ in after} & {(p, o) for _, p, o, *_ in first}
