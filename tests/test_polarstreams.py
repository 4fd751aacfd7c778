"""PolarStreams' REST API on its own ports (``ring serve --polarstreams``), against a 3-broker cluster.

The brokers listen at 127.0.0.1, .2 and .3, each with the same PolarStreams
ports, as PolarStreams' brokers do; ``tests.polar_client`` is a client written
from PolarStreams' documented formats. Ring's own API (``Member.http``) is
used only to look: leaders, high watermarks, committed offsets.
"""

from __future__ import annotations

import socket
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import orjson
import pytest

from ring.localcluster import free_port
from tests.brokers import TestCluster
from tests.polar_client import BINARY, Connection, PolarClient, decode_binary, decode_json
from tests.support import WAIT_S, wait_for

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


def _free_on_all(hosts: list[str], count: int) -> list[int]:
    """``count`` ports free on every host (PolarStreams' ports are the same on every broker)."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = free_port(hosts[0])
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        if port not in chosen:
            chosen.append(port)
    return chosen


@pytest.fixture(scope="module")
def polar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestCluster, list[int]]]:
    ports = _free_on_all(HOSTS, 3)
    c = TestCluster(Path(tmp_path_factory.mktemp("polar-cluster")), 3, hosts=HOSTS,
                    args=["--fsync", "interval:100", "--polarstreams",
                          "--polarstreams-ports", ",".join(map(str, ports))])
    c.start()
    try:
        yield c, ports
    finally:
        c.stop()


@pytest.fixture
def client(polar: tuple[TestCluster, list[int]]) -> Iterator[PolarClient]:
    _, ports = polar
    pc = PolarClient(HOSTS[0], ports[0])
    try:
        yield pc
    finally:
        pc.close()


def _committed(c: TestCluster, group: str) -> dict[tuple[str, int], int | None]:
    doc = c[0].http.get(f"/v1/groups/{group}").json()
    return {(o["topic"], o["partition"]): o["committed"] for o in doc["offsets"]}


def _leader_of_data(c: TestCluster, topic: str) -> int:
    """The broker index leading the one partition of ``topic`` that holds records."""
    doc = c[0].http.get(f"/v1/topics/{topic}").json()
    (p,) = [p for p in doc["partitions"] if p["high_watermark"]]
    return [m.name for m in c].index(p["leader"])


def _create(c: TestCluster, topic: str, partitions: int) -> None:
    assert c[0].http.create_topic(topic, partitions=partitions).status == 201
    wait_for(f"{topic} has leaders", lambda: all(c.leaders(topic).values()) and
             all(m.http.get(f"/v1/topics/{topic}").status == 200 for m in c))


# --- status and discovery ---------------------------------------------------------------


def test_every_port_answers_status_and_discovery_names_every_broker(polar) -> None:
    c, (discovery, producer, consumer) = polar
    texts = {discovery: "Client discovery server listening on {}\n", producer: "Producer server listening on {}\n",
             consumer: "Consumer server listening on {}\n"}
    for host in HOSTS:
        for port, expected in texts.items():
            r = Connection(host, port).request("GET", "/status")
            assert (r.status, r.text) == (200, expected.format(port))
    r = Connection(HOSTS[1], discovery).request("GET", "/v1/brokers")
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert orjson.loads(r.body) == {"length": 3, "names": HOSTS, "producerPort": producer, "consumerPort": consumer}


# --- the whole flow ---------------------------------------------------------------------


def test_a_polarstreams_client_gets_every_record_once_in_key_order(polar, client: PolarClient, topic: str) -> None:
    c, _ = polar
    _create(c, topic, 6)
    keys = [f"key-{k}" for k in range(6)]
    sent = Counter()
    for i in range(90):  # JSON bodies and NDJSON bodies, through every broker in turn
        key = keys[i % len(keys)]
        if i % 3:
            body, ctype = orjson.dumps({"k": key, "n": sent[key]}), "application/json"
            sent[key] += 1
        else:
            lines = []
            for _ in range(3):
                lines.append(orjson.dumps({"k": key, "n": sent[key]}))
                sent[key] += 1
            body, ctype = b"\n".join(lines) + b"\n", "application/x-ndjson"
        r = client.produce(i % 3, topic, body, ctype, partition_key=key)
        assert (r.status, r.text) == (200, "OK"), r.text
    assert client.register("c-1", "flow", [topic], "startFromEarliest").text == "OK"

    got: list[dict] = []
    quiet, rounds, deadline = 0, 0, time.monotonic() + WAIT_S
    while quiet < 3 and time.monotonic() < deadline:  # until every broker has nothing, once all acknowledged
        rounds += 1
        for b in range(3):
            reply, items = client.poll(b, "c-1", as_json=(rounds + b) % 2 == 1)
            if reply.status == 204:
                assert reply.headers["retry-after"] in ("1", "5")
                quiet += 1
                continue
            assert reply.status == 200, reply.text
            quiet = 0
            for item in items:
                assert item.topic == topic and item.version >= 1
                got.extend(orjson.loads(v) for v in item.values)
    assert sum(sent.values()) == 150
    assert Counter((g["k"], g["n"]) for g in got) == Counter({(k, n): 1 for k in keys for n in range(sent[k])})
    for key in keys:  # each key's records in the order they were produced
        assert [g["n"] for g in got if g["k"] == key] == list(range(sent[key]))
    r = client.commit(1, "c-1")
    assert r.status == 204
    ends = {(topic, p["partition"]): p["high_watermark"] for p in c[0].http.get(f"/v1/topics/{topic}").json()["partitions"]}
    assert _committed(c, "flow") == ends
    r = client.goodbye(2, "c-1")
    assert (r.status, r.text) == (200, "OK")
    assert client.poll(0, "c-1")[0].status == 409
    assert c[0].http.get("/v1/groups/flow").json()["members"] == []


# --- register -------------------------------------------------------------------------------


def test_register_forms_and_their_errors(polar, client: PolarClient, topic: str) -> None:
    c, (_, _, consumer) = polar
    _create(c, topic, 3)
    bad = client.register("r-1", "reg", [topic], "startFromTheMiddle")
    assert (bad.status, bad.text) == (400, "Invalid offset reset policy value")
    assert client.register("r-1", "reg", [topic]).text == "OK"
    again = client.register("r-1", "reg", [topic])
    assert (again.status, again.text) == (200, "Already registered")
    for b in range(3):  # registered on every broker: each knows the id's group
        moved = client.consumers[b].request("PUT", "/v1/consumer/register",
                                            {"consumerId": "r-1", "group": "other", "topic": topic})
        assert (moved.status, moved.text) == (400, "Consumer already registered with different parameters")
    empty = client.consumers[0].request("PUT", "/v1/consumer/register", {"consumerId": "r-2", "group": "reg"})
    assert (empty.status, empty.text) == (400, "Consumer id and topics can not be empty")
    legacy = client.consumers[1].request("PUT", "/v1/consumer/register",
                                         {"consumer_id": "r-3", "group": "reg", "topic": topic})
    assert legacy.status == 200
    assert client.consumers[1].request("POST", "/v1/consumer/poll", {"consumer_id": "r-3"}).status in (200, 204)
    unknown = client.consumers[2].request("POST", "/v1/consumer/poll", {"consumerId": "nobody"})
    assert (unknown.status, unknown.text) == (409, "Consumer not registered")

    # A JSON body (PolarStreams' connection-bound consumers): known by its connection only.
    bound = Connection(HOSTS[0], consumer)
    r = bound.request("POST", "/v1/consumer/register", body=orjson.dumps({"id": "r-4", "group": "reg",
                                                                         "topics": [topic]}))
    assert (r.status, r.text) == (200, "OK")
    assert bound.request("POST", "/v1/consumer/poll").status in (200, 204)
    assert Connection(HOSTS[0], consumer).request("POST", "/v1/consumer/poll").status == 409
    garbage = bound.request("POST", "/v1/consumer/register", body=b"{not json")
    assert (garbage.status, garbage.text) == (400, "Invalid ConsumerInfo payload")
    assert {m["member"] for m in c[0].http.get("/v1/groups/reg").json()["members"]} == {"r-1", "r-3", "r-4"}


# --- produce --------------------------------------------------------------------------------


def _stored(c: TestCluster, topic: str) -> list[tuple[object, bool]]:
    out = []
    for p in c[0].http.get(f"/v1/topics/{topic}").json()["partitions"]:
        r = c[0].http.get(f"/v1/topics/{topic}/partitions/{p['partition']}/messages", query={"offset": 0})
        out += [(rec["value"], "value_encoding" in rec) for rec in r.json()["records"]]
    return out


def test_produce_bodies_are_stored_as_polarstreams_stores_them(polar, client: PolarClient, topic: str) -> None:
    c, _ = polar
    _create(c, topic, 1)
    as_sent = b'[{"a": 1},  {"b": 2}]'  # one record, whitespace and all: PolarStreams does not split it
    r = client.produce(0, topic, as_sent)
    assert (r.status, r.text, r.headers["content-type"]) == (200, "OK", "text/html; charset=utf-8")
    assert client.produce(1, topic, b'{"l": 1}\r\n\n{"l": 2}\n', "application/x-ndjson").status == 200
    assert client.produce(2, topic, b"plain words", "text/plain").status == 200
    stored = _stored(c, topic)
    assert [v for v, _ in stored] == [[{"a": 1}, {"b": 2}], {"l": 1}, {"l": 2}, "plain words"]
    polled = Connection(HOSTS[_leader_of_data(c, topic)], polar[1][2])
    assert client.register("p-1", "prod", [topic], "startFromEarliest").status == 200
    r = polled.request("POST", "/v1/consumer/poll", {"consumerId": "p-1"})
    values = [v for item in decode_binary(r.body) for v in item.values]
    assert values == [as_sent, b'{"l": 1}', b'{"l": 2}', b"plain words"]


def test_produce_errors_answer_polarstreams_statuses(polar, client: PolarClient) -> None:
    _, (_, producer, _) = polar
    conn = client.producers[0]
    bad_name = conn.request("POST", "/v1/topic/bad%2Fname/messages", body=b"{}",
                            headers={"Content-Type": "application/json"})
    assert (bad_name.status, bad_name.text) == (400, "Invalid topic")
    chunked = Connection(HOSTS[0], producer)
    chunked.conn.putrequest("POST", "/v1/topic/anything/messages")
    chunked.conn.putheader("Transfer-Encoding", "chunked")
    chunked.conn.endheaders()
    chunked.conn.send(b"2\r\n{}\r\n0\r\n\r\n")
    resp = chunked.conn.getresponse()
    assert resp.status == 400 and resp.read().decode().startswith("Content length must be defined")
    big = conn.request("POST", "/v1/topic/anything/messages", body=b"x" * (1024 * 1024 + 1),
                       headers={"Content-Type": "text/plain"})
    assert big.status == 400 and big.text.startswith("Content length must be defined")
    get = conn.request("GET", "/v1/topic/anything/messages")
    assert (get.status, get.text) == (405, "Producer server doesn't allow getting topic messages\n")


# --- poll, commit, goodbye ---------------------------------------------------------------


def test_polls_answer_204_with_retry_after(polar, client: PolarClient, topic: str) -> None:
    c, _ = polar
    _create(c, topic, 1)
    assert client.register("e-1", "empty", [topic], "startFromEarliest").status == 200
    leader = [m.name for m in c].index(c.leaders(topic)[0])
    for b in range(3):
        reply, _ = client.poll(b, "e-1")
        assert reply.status == 204
        assert reply.headers["retry-after"] == ("1" if b == leader else "5"), (b, leader)


def test_goodbye_commits_unless_commit_false(polar, client: PolarClient, topic: str) -> None:
    c, (_, _, consumer) = polar
    _create(c, topic, 1)
    assert client.produce(0, topic, b"\n".join(b'{"n": %d}' % n for n in range(5)), "application/x-ndjson",
                          partition_key="k").status == 200
    leader = _leader_of_data(c, topic)
    for group, commit, expected in (("bye-keep", False, None), ("bye-commit", True, 5)):
        assert client.register(group, group, [topic], "startFromEarliest").status == 200
        conn = Connection(HOSTS[leader], consumer)
        r = conn.request("POST", "/v1/consumer/poll", {"consumerId": group})
        assert r.status == 200 and len(decode_binary(r.body)[0].values) == 5
        query = {"consumerId": group, **({} if commit else {"commit": "false"})}
        assert conn.request("POST", "/v1/consumer/goodbye", query).text == "OK"
        assert _committed(c, group).get((topic, 0)) == expected  # a group that never committed lists none


def test_a_lost_binary_answer_is_handed_out_again_and_never_committed(polar, client: PolarClient,
                                                                       topic: str) -> None:
    """An answer the client never got (its connection dropped after the broker wrote it) commits
    nothing: the next poll, on another connection, gets the same records again."""
    c, (_, _, consumer) = polar
    _create(c, topic, 1)
    assert client.produce(0, topic, b"\n".join(b'{"n": %d}' % n for n in range(4)), "application/x-ndjson",
                          partition_key="k").status == 200
    leader = _leader_of_data(c, topic)
    assert client.register("lost-1", "lost", [topic], "startFromEarliest").status == 200
    first = Connection(HOSTS[leader], consumer)
    r = first.request("POST", "/v1/consumer/poll", {"consumerId": "lost-1"})
    assert r.status == 200 and r.headers["content-type"] == BINARY
    lost = decode_binary(r.body)
    first.close()  # the answer is lost with its connection: the client never acknowledges it
    second = Connection(HOSTS[leader], consumer)
    r = second.request("POST", "/v1/consumer/poll", {"consumerId": "lost-1"})
    assert r.status == 200, r.text
    again = decode_binary(r.body)
    assert [i.values for i in again] == [i.values for i in lost] and again[0].start_offset == 0
    assert _committed(c, "lost").get((topic, 0)) in (None, 0)  # nothing acknowledged: nothing past it committed
    assert second.request("POST", "/v1/consumer/commit", {"consumerId": "lost-1"}).status == 204
    assert _committed(c, "lost") == {(topic, 0): 4}  # the answer this connection carried whole
    r = second.request("POST", "/v1/consumer/poll", {"consumerId": "lost-1"}, headers={"Accept": "application/json"})
    assert r.status == 204 and decode_json(b"[]") == []
