"""A group poll's answer is committed only once the client shows it got it: real brokers, answers lost
on the way.

An answer is lost here the way a killed pod or a proxy timeout loses it: the
poll is sent, its answer reaches the client's socket, and the connection is
closed without reading it. The next poll either names the token of the last
answer the client did read, names none, or comes on the connection that
carried the previous answer. In every case the records of the lost answer
are handed out again (to the same member or to the next one), and the
group's committed offset never passes what a client acknowledged. The same
holds through a broker that only forwards (neither coordinator nor leader),
and for ``GroupConsumer`` retrying elsewhere while that broker is stopped.
The Python client and ``ring consume --group`` name the token themselves:
through a relay that closes every connection after one answer (so no
connection can vouch for anything) they read each record once. A committed
offset past the end of the log skips none of the records still being
replicated.
"""

from __future__ import annotations

import asyncio
import http.client
import select
import socket
import threading
import time
import urllib.parse
from typing import Any, Iterator

import orjson
import pytest

from ring.client import AsyncGroupConsumer, Client, GroupConsumer
from ring.hashing import partition_for_key
from tests.brokers import Member, TestBroker, TestCluster
from tests.support import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 30.0


# --- helpers ------------------------------------------------------------------------------------


def _poll_path(group: str, consumer: str, **query: Any) -> str:
    query = {k: v for k, v in query.items() if v is not None}
    return f"/v1/groups/{group}/members/{consumer}/poll" + ("?" + urllib.parse.urlencode(query) if query else "")


def drop_poll(host: str, port: int, group: str, consumer: str, **query: Any) -> None:
    """Send a poll and close the connection once its answer has reached this socket, unread."""
    with socket.create_connection((host, port), timeout=WAIT_S) as s:
        s.sendall(f"POST {_poll_path(group, consumer, **query)} HTTP/1.1\r\nHost: ring\r\n"
                  "Content-Length: 0\r\n\r\n".encode())
        readable, _, _ = select.select([s], [], [], WAIT_S)
        assert readable, "the poll was not answered"


def poll(host: str, port: int, group: str, consumer: str, **query: Any) -> dict[str, Any]:
    conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
    try:
        conn.request("POST", _poll_path(group, consumer, **query))
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body
        return orjson.loads(body)
    finally:
        conn.close()


def read_answer(reader: Any) -> dict[str, Any]:
    """One 200 answer with a Content-Length body, from a connection's buffered reader."""
    status = reader.readline()
    assert status.split()[1] == b"200", status
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return orjson.loads(reader.read(length))


def offsets(doc: dict[str, Any]) -> list[int]:
    return [r["offset"] for r in doc["records"]]


def committed(api: Any, group: str) -> dict[int, int | None]:
    r = api.get(f"/v1/groups/{group}")
    assert r.status == 200, r.body
    return {o["partition"]: o["committed"] for o in r.json()["offsets"]}


def join(api: Any, group: str, consumer: str, topic: str) -> dict[str, Any]:
    r = api.post(f"/v1/groups/{group}/members", json_body={"consumer": consumer, "topics": [topic]})
    assert r.status == 200, r.body
    return r.json()


def fill(api: Any, topic: str, n: int) -> None:
    assert api.create_topic(topic, partitions=1).status == 201
    r = api.produce(topic, orjson.dumps([{"i": i} for i in range(n)]), partition=0)
    assert r.status == 200, r.body


# --- one broker ---------------------------------------------------------------------------------


def test_a_dropped_answer_is_handed_out_again_with_or_without_the_token(make_broker, topic: str) -> None:
    b: TestBroker = make_broker()
    host, port, api = b.local.host, b.local.port, b.http
    fill(api, topic, 50)
    join(api, "g", "c1", topic)

    # Lost, and the next poll names no token (a fresh connection): the same records again, nothing committed.
    drop_poll(host, port, "g", "c1", max_records=20)
    again = poll(host, port, "g", "c1", max_records=20)
    assert offsets(again) == list(range(20))
    assert committed(api, "g") == {0: 0}  # where reading starts (the reset policy), no further

    # Read (token T), then one lost: a poll naming T commits what T handed out, and hands out the lost
    # answer's records again.
    drop_poll(host, port, "g", "c1", max_records=20, token=again.get("token"))
    after = poll(host, port, "g", "c1", max_records=20, token=again.get("token"))
    assert offsets(after) == list(range(20, 40))
    assert committed(api, "g") == {0: 20}

    # Lost once more, then c1 leaves naming the last token it read: the next member gets the lost records.
    drop_poll(host, port, "g", "c1", max_records=20, token=after.get("token"))
    r = api.delete("/v1/groups/g/members/c1", query={"token": after.get("token")})
    assert r.status == 200, r.body
    assert committed(api, "g") == {0: 40}
    join(api, "g", "c2", topic)
    assert offsets(poll(host, port, "g", "c2", max_records=20)) == list(range(40, 50))
    assert committed(api, "g") == {0: 40}


def test_the_same_connection_acknowledges_an_answer_written_before_the_next_poll(make_broker,
                                                                                  topic: str) -> None:
    b: TestBroker = make_broker()
    host, port, api = b.local.host, b.local.port, b.http
    fill(api, topic, 50)
    join(api, "g", "c1", topic)
    conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
    try:
        got = []
        for _ in range(2):  # keep-alive, no token: the second poll commits what the first handed out
            conn.request("POST", _poll_path("g", "c1", max_records=20))
            r = conn.getresponse()
            got.append(orjson.loads(r.read()))
        assert [offsets(d) for d in got] == [list(range(20)), list(range(20, 40))]
        assert committed(api, "g") == {0: 20}
    finally:
        conn.close()

    # Two polls sent at once on one connection (pipelined): the second was on its way before the first
    # answer was written, so it acknowledges nothing and gets the same records.
    with socket.create_connection((host, port), timeout=WAIT_S) as s:
        one = f"POST {_poll_path('g', 'c1', max_records=5)} HTTP/1.1\r\nHost: ring\r\nContent-Length: 0\r\n\r\n"
        s.sendall((one + one).encode())
        with s.makefile("rb") as reader:
            answers = [read_answer(reader) for _ in range(2)]
    assert [offsets(d) for d in answers] == [list(range(20, 25)), list(range(20, 25))]
    assert committed(api, "g") == {0: 20}


# --- clients that name the token ------------------------------------------------------------------


class OneAnswerPerConnection:
    """A TCP relay to a broker that closes each client connection after one answer (adding
    ``Connection: close``): no poll can be acknowledged by its connection, only by its token."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        for _ in range(10_000):
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream, timeout=WAIT_S) as up:
            client.settimeout(WAIT_S)
            with client.makefile("rb") as src, up.makefile("rb") as back:
                up.sendall(_message(src))
                answer = _message(back)
            status, _, rest = answer.partition(b"\r\n")
            client.sendall(status + b"\r\nConnection: close" + (b"\r\n" + rest if rest else b""))

    def close(self) -> None:
        self.listener.close()


def _message(reader: Any) -> bytes:
    """One HTTP message (headers and a Content-Length body) from a buffered reader."""
    head = b""
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        head += line
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return head + b"\r\n" + reader.read(length)


def test_the_client_and_the_cli_name_the_token_where_no_connection_vouches(make_broker, topic: str) -> None:
    from tests.test_cli_commands import cli, ok

    b: TestBroker = make_broker()
    fill(b.http, topic, 30)
    relay = OneAnswerPerConnection(b.local.host, b.local.port)
    try:
        with GroupConsumer([relay.url], "py", topic, wait_ms=100) as consumer:
            got = [[r.offset for r in consumer.poll(max_records=10)] for _ in range(4)]
            assert got == [list(range(10)), list(range(10, 20)), list(range(20, 30)), []]
            assert committed(b.http, "py") == {0: 30}  # the last poll named the third answer's token
        # Asking for 45 of 30 records: the second poll names the first answer's token, finds nothing, ends.
        lines = ok(cli(relay.url, "consume", topic, "--group", "cli", "-n", "45")).splitlines()
        assert [orjson.loads(x)["i"] for x in lines] == list(range(30))
    finally:
        relay.close()


def test_records_of_a_poll_that_had_to_rejoin_first_are_handed_out(shared_cluster: TestCluster, topic: str) -> None:
    """The consumer's poll meets a rebalance (409), rejoins, loses a partition and polls again: the records
    that poll returns reach the application, async and blocking alike, so the next poll's token commits
    nothing that was not handed out."""
    c = shared_cluster
    urls = [m.url for m in c]
    assert c[0].http.create_topic(topic, partitions=2).status == 201

    def produce(n: int) -> None:
        for p in range(2):
            assert c[p].http.produce(topic, orjson.dumps([{"p": p, "i": i} for i in range(n)]), partition=p).status == 200

    produce(5)

    async def with_async() -> list[tuple[int, int]]:
        a = await AsyncGroupConsumer(urls, f"{topic}-async", topic, wait_ms=100).start()
        b = None
        try:
            assert sorted((r.partition, r.offset) for r in [await a.__anext__() for _ in range(10)]) == \
                [(p, o) for p in range(2) for o in range(5)]
            b = await AsyncGroupConsumer(urls[::-1], f"{topic}-async", topic, wait_ms=100).start()  # a rebalance
            produce(3)
            return [(r.partition, r.offset) for r in [await asyncio.wait_for(a.__anext__(), WAIT_S) for _ in range(3)]]
        finally:
            await a.close()
            if b is not None:
                await b.close()

    got = asyncio.run(with_async())
    assert [o for _, o in got] == [5, 6, 7] and len({p for p, _ in got}) == 1, got

    with GroupConsumer(urls, f"{topic}-sync", topic, wait_ms=100) as a:
        assert len({(r.partition, r.offset) for r in [next(a) for _ in range(16)]}) == 16  # both partitions
        with GroupConsumer(urls[::-1], f"{topic}-sync", topic, wait_ms=100):
            produce(3)
            got = [next(a) for _ in range(3)]
    assert [r.offset for r in got] == [8, 9, 10] and len({r.partition for r in got}) == 1, got


# --- through a broker that only forwards --------------------------------------------------------


def _coordinator(c: TestCluster, group: str) -> str:
    doc = c[0].http.get("/v1/topics/__offsets").json()
    return doc["partitions"][partition_for_key(group.encode(), doc["partition_count"])]["leader"]


def forwarding_setup(c: TestCluster, topic: str, n: int) -> tuple[str, Member, Member, Member]:
    """A one-partition topic of ``n`` records and a group whose coordinator is not the partition's
    leader: (group, forwarder, coordinator, leader), the forwarder being neither."""
    fill(c[0].http, topic, n)
    join(c[0].http, f"{topic}-warmup", "w", topic)  # creates the offsets topic
    leader = c.leaders(topic)[0]
    group = next(g for g in (f"{topic}-g{i}" for i in range(500)) if _coordinator(c, g) != leader)
    coord = _coordinator(c, group)
    forwarder = next(m for m in c if m.name not in (leader, coord))
    return group, forwarder, c.member(coord), c.member(leader)


def test_an_answer_lost_between_the_forwarder_and_the_client_is_handed_out_again(
        shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    group, fwd, coord, leader = forwarding_setup(c, topic, 50)
    host, port = fwd.local.host, fwd.local.port
    join(fwd.http, group, "c1", topic)

    # The coordinator wrote its answer whole to the forwarder, whose client then vanished.
    drop_poll(host, port, group, "c1", max_records=20)
    again = poll(host, port, group, "c1", max_records=20)
    assert offsets(again) == list(range(20))
    assert committed(coord.http, group) == {0: 0}  # where reading starts, no further

    drop_poll(host, port, group, "c1", max_records=20, token=again.get("token"))
    # Retried at another broker, naming the last answer read.
    after = poll(leader.local.host, leader.local.port, group, "c1", max_records=20, token=again.get("token"))
    assert offsets(after) == list(range(20, 40))
    assert committed(fwd.http, group) == {0: 20}

    # The forwarder's own connection knowledge: a keep-alive connection acknowledges through it.
    conn = http.client.HTTPConnection(host, port, timeout=WAIT_S)
    try:
        docs = []
        for token in (after.get("token"), None):
            conn.request("POST", _poll_path(group, "c1", max_records=5, token=token))
            docs.append(orjson.loads(conn.getresponse().read()))
    finally:
        conn.close()
    assert [offsets(d) for d in docs] == [list(range(40, 45)), list(range(45, 50))]
    assert committed(coord.http, group) == {0: 45}

    # The next member gets what c1 was handed and never acknowledged.
    assert fwd.http.delete(f"/v1/groups/{group}/members/c1").status == 200
    join(coord.http, group, "c2", topic)
    assert offsets(poll(coord.local.host, coord.local.port, group, "c2")) == list(range(45, 50))


# --- the client, retrying elsewhere while the forwarder is stopped --------------------------------


@pytest.fixture(scope="module")
def paused_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("groups-delivery"), 3, args=["--fsync", "interval:100"])
    c.start()
    try:
        yield c
    finally:
        c.kill()


def _long_polls_open(m: Member) -> int:
    r = m.http.get("/v1/status")
    return int(r.json().get("long_polls_open", 0)) if r.status == 200 else 0


@pytest.mark.parametrize("auto_commit", [True, False], ids=["auto-commit", "commit-each-record"])
def test_group_consumer_retrying_past_a_stopped_forwarder_misses_nothing(paused_cluster: TestCluster,
                                                                          topic: str, auto_commit: bool) -> None:
    c = paused_cluster
    group, fwd, coord, leader = forwarding_setup(c, topic, 200)
    delivered: list[int] = []
    stop = threading.Event()
    # A session that outlives the retries: the member keeps its server-side position throughout.
    consumer = GroupConsumer([fwd.url, leader.url, coord.url], group, topic, auto_commit=auto_commit,
                             wait_ms=5_000, timeout_s=2.0, retry_backoff_ms=50, session_timeout_ms=60_000)

    def consume() -> None:
        while not stop.is_set():
            for record in consumer.poll():
                delivered.append(record.offset)
                if not auto_commit:
                    consumer.commit()  # after each record: at-least-once by hand

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(set(delivered)) < n and time.monotonic() < deadline:
            time.sleep(0.05)

    reader = threading.Thread(target=consume, daemon=True)
    with consumer:
        reader.start()
        try:
            wait_for(200)
            assert sorted(set(delivered)) == list(range(200))
            # Caught up: the member's long-poll waits at the coordinator, forwarded by ``fwd``. Stop ``fwd``
            # while it does (a poll that has not reached the coordinator yet would prove nothing).
            parked = False
            for _ in range(10):
                deadline = time.monotonic() + WAIT_S
                while _long_polls_open(coord) < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                fwd.pause()
                parked = _long_polls_open(coord) >= 1
                if parked:
                    break
                fwd.resume()
            assert parked, "the member's long-poll never waited at the coordinator"
            try:
                with Client([leader.url]) as producer:
                    for i in range(100):
                        producer.produce(topic, json={"i": 200 + i}, partition=0)
                    producer.flush()
                # The coordinator answers the stopped forwarder; the consumer gives up on it, polls elsewhere.
                wait_for(300)
            finally:
                fwd.resume()
        finally:
            stop.set()
            reader.join(timeout=WAIT_S)
    missing = sorted(set(range(300)) - set(delivered))
    assert not missing, f"never delivered: {missing[:10]} ({len(missing)} in all)"
    done = committed(leader.http, group)
    assert done[0] is not None and done[0] <= max(delivered) + 1


# --- a committed offset past the end of the log ----------------------------------------------------


def test_a_topic_deleted_and_created_again_is_read_from_the_members_reset_policy(make_broker, topic: str) -> None:
    """The group read the first topic of that name to offset 20; the new one holds 3 records. Its
    committed offset is past the new log's end: out of range, as Kafka's consumer sees it, so the
    member's reset policy says where reading starts (earliest, the default: from 0)."""
    b: TestBroker = make_broker()
    host, port, api = b.local.host, b.local.port, b.http
    fill(api, topic, 20)
    join(api, "g", "c1", topic)
    got = poll(host, port, "g", "c1", max_records=20)
    assert api.delete("/v1/groups/g/members/c1", query={"token": got.get("token")}).status == 200
    assert committed(api, "g") == {0: 20}
    assert api.delete(f"/v1/topics/{topic}").status == 200
    fill(api, topic, 3)
    join(api, "g", "c1", topic)
    assert offsets(poll(host, port, "g", "c1")) == [0, 1, 2]


def test_a_committed_offset_past_the_log_end_skips_no_record_still_replicating(paused_cluster: TestCluster,
                                                                                 topic: str) -> None:
    """A group's committed offset beyond a partition's end (here an explicit commit) is out of range: a
    member reading from ``latest`` starts again at the partition's high watermark, not at its leader's
    log end, so records the leader holds and its followers have not acknowledged yet are handed out
    once they are, not skipped."""
    c = paused_cluster
    assert c[0].http.create_topic(topic, partitions=1).status == 201
    wait_for("a leader", lambda: c.leaders(topic)[0])
    join(c[0].http, f"{topic}-warmup", "w", topic)  # creates the offsets topic
    leader = c.member(c.leaders(topic)[0])
    group = next(g for g in (f"{topic}-g{i}" for i in range(500)) if _coordinator(c, g) == leader.name)
    host, port, api = leader.local.host, leader.local.port, leader.http
    r = api.post(f"/v1/groups/{group}/members", json_body={"consumer": "c1", "topics": [topic], "reset": "latest"})
    assert r.status == 200, r.body
    r = api.post(f"/v1/groups/{group}/offsets",
                 json_body={"consumer": "c1", "offsets": [{"topic": topic, "partition": 0, "offset": 1000}]})
    assert r.status == 200, r.body
    followers = [m for m in c if m is not leader]
    for m in followers:
        m.pause()
    try:  # the leader appends, alone: its high watermark stays where the followers left it
        r = api.produce(topic, orjson.dumps([{"i": i} for i in range(5)]), partition=0, consistency="one")
        assert r.status == 200, r.body
        first = poll(host, port, group, "c1")
        assert offsets(first) == []
    finally:
        for m in followers:
            m.resume()
    wait_for("the records committed on the followers",
             lambda: api.describe(topic)["partitions"][0]["high_watermark"] == 5)
    after = poll(host, port, group, "c1", token=first.get("token"))
    assert offsets(after) == list(range(5))
