"""Hostile peer traffic against a real broker's peer port (behind the cluster secret).

A ``ring serve`` with a cluster secret gets, on its peer port, gossip bodies
(random bytes, garbage msgpack, and valid SYN/ACK/ACK2 messages about made-up
brokers and topics with odd configs), forwarded produce bodies (damaged and
hand-made batches), replica reads with odd parameters, and a replication
websocket fed garbage frames. Every HTTP answer must be a 2xx or a client
error in the JSON error shape, never a 5xx; without the secret everything is
401; and the broker's log must show no traceback, so nothing it accepted
broke a background task (gossip rounds, placement, replication links).

Made-up brokers all live at 127.0.0.1:9 (nothing listens there), so the
broker's attempts to reach them fail at once and stay on loopback.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import aiohttp
import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring import limits
from ring.cluster import forwards
from ring.gossip.core import Ack2
from ring.replication import protocol
from ring.gossip.state import STATUSES, ClusterState, EndpointState, TopicEntry
from ring.localcluster import free_port
from ring.produce import Batches, Produce
from ring.replication import protocol
from tests.brokers import Http, TestBroker
from tests.test_fuzz_decoders import _valid_batches, crafted_batches, damaged
from tests.test_fuzz_peer_messages import garbage, hand_made_msgpack, messages, packed, plain_maps, vote_requests

SECRET = "fuzz-secret"
NOWHERE = "127.0.0.1:9"
HEADERS = {"Ring-Cluster-Secret": SECRET, "Content-Type": "application/msgpack"}
PEER_SETTINGS = settings(max_examples=25, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TOPIC = "fuzz-peer"


class PeerBroker:
    def __init__(self, broker: TestBroker, peer_port: int) -> None:
        self.broker = broker
        self.peer = Http("127.0.0.1", peer_port)
        self.peer_port = peer_port


def _start(root: Any) -> PeerBroker:
    peer_port = free_port()
    b = TestBroker(root, args=["--fsync", "never", "--cluster-secret", SECRET,
                               "--peer-listen", f"127.0.0.1:{peer_port}"])
    b.start()
    return PeerBroker(b, peer_port)


def _stop(node: PeerBroker) -> None:
    node.broker.stop()
    log = node.broker.log_text()
    assert "Traceback" not in log, log[-4000:]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerBroker]:
    """A broker for forwarded produces, replica reads and replication frames."""
    n = _start(tmp_path_factory.mktemp("peer-fuzz"))
    try:
        assert n.broker.http.create_topic(TOPIC, partitions=2, replication_factor=1).status == 201
        yield n
    finally:
        _stop(n)


@pytest.fixture(scope="module")
def gossip_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerBroker]:
    """A broker of its own for gossip: made-up brokers join its ring and move its partitions."""
    n = _start(tmp_path_factory.mktemp("gossip-fuzz"))
    try:
        yield n
    finally:
        _stop(n)


def _check(status: int, body: bytes) -> None:
    assert status < 500, (status, body[:400])
    if status >= 400:
        doc = orjson.loads(body)
        assert type(doc["error"]) is str and type(doc["message"]) is str


# --- gossip ----------------------------------------------------------------------------

made_up_names = st.sampled_from(["fz-1", "fz-2", "ring-0"])


@st.composite
def made_up_endpoints(draw: st.DrawFn) -> EndpointState:
    big = st.sampled_from([0, 1, 2**31, 2**62, 2**63 - 1])
    return EndpointState(draw(made_up_names), draw(st.sampled_from([-(2**63), 0, 2**62, 2**63 - 1])), NOWHERE,
                         NOWHERE, draw(big), draw(big), draw(st.sampled_from(STATUSES)), draw(plain_maps),
                         draw(plain_maps))


topic_configs = st.none() | plain_maps | st.fixed_dictionaries({}, optional={
    "partitions": st.sampled_from([0, 1, 3, -1, 2**31, 10**6, True, "8", None]),
    "replication_factor": st.sampled_from([0, 1, 3, -5, 2**40, 1.5]),
    "retention_ms": st.sampled_from([-1, 0, -2, 2**63 - 1]),
    "segment_bytes": st.sampled_from([0, 1024, 2**40]),
    "compression": st.sampled_from(["zstd", "none", "rot13", 3]),
    "consistency": st.sampled_from(["one", "quorum", "none", None]),
})
made_up_states = st.builds(
    lambda eps, tops: ClusterState({e.name: e for e in eps}, tops),
    st.lists(made_up_endpoints(), max_size=3),
    st.dictionaries(st.sampled_from(["fz-topic", "fz.t-2"]),
                    st.builds(TopicEntry, st.sampled_from([0, 1, 2**62, 2**63 - 1]), made_up_names, topic_configs),
                    max_size=2),
)


def gossip_messages() -> st.SearchStrategy[dict[str, Any]]:
    return messages(made_up_states, ("fz-1", "fz-2"))


@PEER_SETTINGS
@given(st.binary(max_size=100) | hand_made_msgpack() | packed(garbage) | packed(gossip_messages()))
def test_gossip_bodies(gossip_node: PeerBroker, body: bytes) -> None:
    r = gossip_node.peer.post("/peer/v1/gossip", body=body, headers=HEADERS)
    _check(r.status, r.body)
    if r.status == 200:
        assert r.headers.get("Content-Type", "").startswith("application/msgpack")
        msgpack.unpackb(r.body, raw=False)


def test_a_replication_link_of_another_protocol_version_is_refused_saying_so(node: PeerBroker) -> None:
    ws = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
          "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Ring-Broker": "fz-old", "Ring-Cluster-Secret": SECRET}
    for offered in (None, "ring-replication.1", "ring-replication.1, other"):
        headers = {**ws, **({"Sec-WebSocket-Protocol": offered} if offered else {})}
        r = node.peer.get("/peer/v1/replicate", headers=headers)
        assert r.status == 400, (offered, r.status, r.body)
        body = r.json()
        assert body["expected"] == ["ring-replication.4", "ring-replication.3"], body
        assert "versions do not overlap" in body["message"]
    assert "refused a replication link from fz-old" in node.broker.log_text()
    # The first offered that this version speaks is let in, and named back: the previous release's too.
    async def link(offer: tuple[str, ...]) -> str | None:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(f"http://127.0.0.1:{node.peer_port}/peer/v1/replicate", protocols=offer,
                                          headers={"Ring-Cluster-Secret": SECRET, "Ring-Broker": "fz-new"}) as c:
                return c.protocol
    assert asyncio.run(link(("ring-replication.1", protocol.SUBPROTOCOL))) == protocol.SUBPROTOCOL
    assert asyncio.run(link(("ring-replication.3",))) == "ring-replication.3"
    assert asyncio.run(link(("ring-replication.3", protocol.SUBPROTOCOL))) == "ring-replication.3"


@settings(PEER_SETTINGS, max_examples=15)
@given(st.binary(max_size=60) | packed(garbage) | packed(st.lists(garbage, max_size=3))
       | st.lists(vote_requests, min_size=1, max_size=3).map(lambda vs: msgpack.packb([v.to_wire() for v in vs])))
def test_votes_bodies(gossip_node: PeerBroker, body: bytes) -> None:
    r = gossip_node.peer.post("/peer/v1/votes", body=body, headers=HEADERS)
    _check(r.status, r.body)
    if r.status == 200:
        msgpack.unpackb(r.body, raw=False)


def test_an_invalid_gossiped_config_does_not_delete_a_topic(tmp_path_factory: pytest.TempPathFactory) -> None:
    n = _start(tmp_path_factory.mktemp("gossip-config"))
    try:
        http = n.broker.http
        assert http.create_topic("kept", partitions=1, replication_factor=1).status == 201
        assert http.produce("kept", b'{"a": 1}', partition=0).status == 200
        bad = Ack2("fz-1", ClusterState.of([], {"kept": TopicEntry(2**62, "fz-1", {"partitions": -1})}))
        r = n.peer.post("/peer/v1/gossip", body=msgpack.packb(bad.to_wire()), headers=HEADERS)
        assert r.status in (200, 204), r.body
        for _ in range(20):  # the catalogue is reconciled in the background
            if http.get("/v1/topics/kept").status != 200:
                break
            time.sleep(0.05)
        r = http.fetch("kept", 0)
        assert r.status == 200 and len(r.json()["records"]) == 1, (r.status, r.body[:200])
    finally:
        _stop(n)


# --- forwarded produce and replica reads -------------------------------------------------


@PEER_SETTINGS
@given(damaged(_valid_batches()) | crafted_batches() | st.binary(max_size=80),
       st.fixed_dictionaries({
           "topic": st.sampled_from([TOPIC] * 4 + ["no-such", ".."]),
           "partition": st.sampled_from(["0", "1"] * 3 + ["7", "-1", "x", "4294967296"]),
       }, optional={"consistency": st.sampled_from(["one", "quorum", "all", "most"])}))
def test_forwarded_produce_bodies(node: PeerBroker, body: bytes, query: dict[str, str]) -> None:
    r = node.peer.post("/peer/v1/produce", body=body, query=query or None,
                       headers={**HEADERS, "Content-Type": "application/vnd.ring.batch"})
    if r.status == 503 and (query["topic"], query["partition"]) not in ((TOPIC, "0"), (TOPIC, "1")):
        # A partition this broker has not heard of (yet): the forwarding broker is told to retry,
        # as it would be while gossip is still carrying a new topic here.
        assert r.json()["error"] in ("unavailable", "not_leader") and "Retry-After" in r.headers, r.body
        return
    _check(r.status, r.body)


@settings(PEER_SETTINGS, max_examples=20)
@given(st.sampled_from([TOPIC, "no-such", "..", "%2e%2e", "a" * 300]),
       st.sampled_from(["0", "1", "9", "-1", "x", "99999999999"]),
       st.fixed_dictionaries({}, optional={"offset": st.sampled_from(["0", "-1", "x", str(2**63)]),
                                           "max_bytes": st.sampled_from(["0", "1", "x", str(2**40)])}))
def test_replica_reads(node: PeerBroker, topic: str, partition: str, query: dict[str, str]) -> None:
    r = node.peer.get(f"/peer/v1/replicas/{topic}/{partition}", query=query or None, headers=HEADERS)
    _check(r.status, r.body)


def test_without_the_secret_everything_is_refused(node: PeerBroker) -> None:
    for method, path in (("POST", "/peer/v1/gossip"), ("POST", f"/peer/v1/produce?topic={TOPIC}&partition=0"),
                         ("GET", "/peer/v1/status"), ("GET", f"/peer/v1/replicas/{TOPIC}/0")):
        for headers in ({}, {"Ring-Cluster-Secret": "wrong"}, {"Ring-Cluster-Secret": ""}):
            r = node.peer.request(method, path, body=b"\x80", headers=headers)
            assert r.status == 401, (method, path, headers, r.status)
            _check(r.status, r.body)


# --- the replication websocket ------------------------------------------------------------


async def _feed_replication_link(port: int, frames: list[bytes]) -> list[bytes]:
    """Open the follower side as a leader would and send frames; what came back before it closed."""
    answers: list[bytes] = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.ws_connect(f"http://127.0.0.1:{port}/peer/v1/replicate", protocols=(protocol.SUBPROTOCOL,),
                                      headers={"Ring-Cluster-Secret": SECRET, "Ring-Broker": "fz-1"}) as ws:
            for frame in frames:
                if ws.closed:
                    break
                await ws.send_bytes(frame)
            await ws.send_str("not a frame")
            try:
                async with asyncio.timeout(2):
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            answers.append(msg.data)
                        if len(answers) >= sum(len(f) for f in frames if isinstance(f, list)):
                            break
            except TimeoutError:
                pass
    return answers


@settings(PEER_SETTINGS, max_examples=15)
@given(st.lists(packed(garbage) | st.binary(max_size=40) | packed(st.tuples(
    st.sampled_from(["append", "hw", "ack", "reject", "sync"]), st.sampled_from([TOPIC, "nope"]),
    st.sampled_from([0, 1, 2**31]), st.sampled_from([0, 1, 2**31 - 1]), st.sampled_from([0, 5, -1]),
    st.sampled_from([0, 5]), st.binary(max_size=10)).map(list)), min_size=1, max_size=4))
def test_replication_link_frames(node: PeerBroker, frames: list[bytes]) -> None:
    for answer in asyncio.run(_feed_replication_link(node.peer_port, frames)):
        # Every answer is a well-formed frame a follower sends (the leader's own decoder, BadRequest if not).
        frame = protocol.decode(answer, limits.REPLICATION_MESSAGE_BYTES_MAX)
        assert isinstance(frame, (protocol.FollowerAck, protocol.Reject)), frame
    assert node.peer.get("/peer/v1/status", headers=HEADERS).status == 200  # still serving


# --- the forward link ------------------------------------------------------------------------


async def _feed_forward_link(port: int, frames: list) -> list[tuple[int, int, bytes, str | None]]:
    """Open a forward link as a forwarding broker would and send frames; the answers before it closed."""
    answers = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async with session.ws_connect(f"http://127.0.0.1:{port}{forwards.PATH}", protocols=(forwards.PROTOCOL,),
                                      headers={"Ring-Cluster-Secret": SECRET, "Ring-Broker": "fz-1"}) as ws:
            assert ws.protocol == forwards.PROTOCOL
            for frame in frames:
                if ws.closed:
                    break
                await ws.send_bytes(frame if isinstance(frame, bytes) else msgpack.packb(frame, use_bin_type=True))
            try:
                async with asyncio.timeout(5):
                    async for msg in ws:
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            answers.extend(forwards.decode_answers(msg.data))
                        if len(answers) >= sum(len(f) for f in frames if isinstance(f, list)):
                            break
            except TimeoutError:
                pass
    return answers


_junk = (st.none() | st.integers(-2**63, 2**63 - 1) | st.binary(max_size=8)
         | st.text(st.characters(blacklist_categories=("Cs",)), max_size=8) | st.lists(st.integers(0, 9), max_size=6))
_forward_items = st.tuples(
    st.integers(0, 2**31), st.sampled_from([TOPIC, "no-such", ".."]), st.sampled_from([0, 1, 7, -1, 2**40]),
    st.sampled_from(["one", "quorum", "most"]), crafted_batches() | damaged(_valid_batches())).map(
        lambda t: forwards.request_item(t[0], Produce(t[1], Batches([], 0), t[2], None, t[3]), t[2], t[4])) | _junk


@settings(PEER_SETTINGS, max_examples=20)
@given(st.lists(packed(garbage) | st.binary(max_size=40) | st.lists(_forward_items, min_size=1, max_size=4),
                min_size=1, max_size=4))
def test_forward_link_frames(node: PeerBroker, frames: list) -> None:
    """Every answer on the link is a 2xx or a client error in the JSON error shape; a message that is not a
    list of request items closes the link (it has no id to answer)."""
    sent = {item[0]: (item[1], item[2]) for f in frames if isinstance(f, list) for item in f
            if isinstance(item, list) and len(item) == 5}
    for rid, status, body, retry in asyncio.run(_feed_forward_link(node.peer_port, frames)):
        if status == 503 and sent[rid] not in ((TOPIC, 0), (TOPIC, 1)):  # as test_forwarded_produce_bodies
            assert orjson.loads(body)["error"] in ("unavailable", "not_leader") and retry is not None, body
            continue
        _check(status, body)
    assert node.peer.get("/peer/v1/status", headers=HEADERS).status == 200  # still serving


def test_the_forward_link_needs_the_secret(node: PeerBroker) -> None:
    for headers in ({}, {"Ring-Cluster-Secret": "wrong"}):
        r = node.peer.get(forwards.PATH, headers={**headers, "Connection": "Upgrade", "Upgrade": "websocket",
                                                  "Sec-WebSocket-Version": "13",
                                                  "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
        assert r.status == 401, r.status
        _check(r.status, r.body)
