"""A broker's memory stays bounded when its fetch answers are not taken, and no answer outlives its sending.

Integration tests on a real broker process. Forty clients each ask for the
largest fetch (``FETCH_BYTES_MAX``) and then read nothing, with a tiny receive
window: the broker's VmRSS (/proc/PID/status) must stay within
``FETCH_ANSWER_BYTES_IN_FLIGHT_MAX`` plus a fixed allowance of the figure it
had after one such fetch was read normally, and once they go it answers
fetches again (without the budget, or with it lifted, the figure grows by
hundreds of MiB). Stalled answers that take the whole budget make the next
fetch 429 with Retry-After. After answers were read on many keep-alive
connections that then stay idle, the broker holds none of them (a connection
must not keep its last answer until its next request). And unit tests of the
budget and of the answer body.
"""

from __future__ import annotations

import gc
import socket
import time

import pytest

from ring import answer_budget, limits
from ring.errors import Overloaded
from ring.http_api import answer
from ring.log import batch as batchfmt
from tests.brokers import TestBroker

CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
RECORD = b"x" * 1000
RECORDS_PER_BATCH = 900  # about 0.9 MiB a batch, under BATCH_BYTES_MAX
BATCHES_PER_REQUEST = 12  # about 11 MiB a request, under REQUEST_BYTES_MAX
FILL_REQUESTS = 4  # about 44 MiB in the partition: every stalled fetch can take FETCH_BYTES_MAX
STALLED_CLIENTS = 40
# What the broker may grow by besides the answers the budget lets it hold: the
# connections and requests themselves, allocator slack, one read being encoded.
ALLOWANCE_BYTES = 40 * 2**20
SETTLE_S = 4.0


def vm_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def fill(broker: TestBroker, topic: str) -> int:
    http = broker.http
    assert http.create_topic(topic, partitions=1).status == 201
    batch = bytes(batchfmt.encode([(None, None, RECORD, None)] * RECORDS_PER_BATCH, now_ms=int(time.time() * 1000)))
    body = batch * BATCHES_PER_REQUEST
    for _ in range(FILL_REQUESTS):
        r = http.produce(topic, body, content_type=CT_BATCH, partition=0)
        assert r.status == 200, r.body
    return len(body) * FILL_REQUESTS


def fetch_request(topic: str, max_bytes: int) -> bytes:
    return (f"GET /v1/topics/{topic}/partitions/0/messages?offset=0&max_bytes={max_bytes} HTTP/1.1\r\n"
            f"Host: 127.0.0.1\r\nAccept: {CT_BATCHES}\r\n\r\n").encode()


def stalled_client(broker: TestBroker, request: bytes) -> socket.socket:
    """A connection that sends ``request`` and reads no more than its status line, with a tiny window."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    s.settimeout(10)
    s.connect((broker.local.host, broker.local.port))
    s.sendall(request)
    return s


def status_line(s: socket.socket) -> bytes:
    head = b""
    while b"\r\n" not in head and len(head) < 200:
        chunk = s.recv(1)  # one byte at a time: very slow, and no more than the status line
        if not chunk:
            break
        head += chunk
    return head.split(b"\r\n", 1)[0]


@pytest.mark.integration
def test_stalled_fetches_hold_at_most_the_budget(make_broker) -> None:
    broker = make_broker("--fsync", "never")
    topic = "stalled"
    assert fill(broker, topic) > limits.FETCH_BYTES_MAX * 2
    # One maximal fetch read to the end: the reads, the allocator and aiohttp are warm.
    r = broker.http.fetch(topic, 0, accept=CT_BATCHES, offset=0, max_bytes=limits.FETCH_BYTES_MAX)
    assert r.status == 200 and len(r.body) > limits.FETCH_BYTES_MAX // 2
    del r
    time.sleep(0.5)
    before = vm_rss_bytes(broker.pid)

    clients = [stalled_client(broker, fetch_request(topic, limits.FETCH_BYTES_MAX)) for _ in range(STALLED_CLIENTS)]
    try:
        peak = before
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            peak = max(peak, vm_rss_bytes(broker.pid))
            time.sleep(0.05)
        grown = peak - before
        bound = limits.FETCH_ANSWER_BYTES_IN_FLIGHT_MAX + ALLOWANCE_BYTES
        assert grown <= bound, (
            f"RSS grew by {grown / 2**20:.0f} MiB with {STALLED_CLIENTS} stalled fetches of "
            f"{limits.FETCH_BYTES_MAX >> 20} MiB (bound {bound / 2**20:.0f} MiB)")
        # Each was answered (the later ones with less than they asked for, to fit) or refused.
        statuses = [status_line(s) for s in clients]
        assert all(b" 200 " in line or b" 429 " in line for line in statuses), statuses
    finally:
        for s in clients:
            s.close()

    # The stalled answers' room comes back when their clients go: fetches are answered again.
    deadline = time.monotonic() + 10
    while True:
        r = broker.http.fetch(topic, 0, accept=CT_BATCHES, offset=0, max_bytes=limits.FETCH_BYTES_MAX)
        if r.status == 200 and len(r.body) > limits.FETCH_BYTES_MAX // 2:
            break
        assert r.status == 429 and time.monotonic() < deadline, (r.status, r.body[:200])
        time.sleep(0.2)


@pytest.mark.integration
def test_fetch_is_refused_when_no_answer_fits(make_broker) -> None:
    """Stalled answers take the whole budget (each bigger than what the kernel's socket buffer
    takes off the broker, so each stays held): the next fetch gets 429 with Retry-After, and an
    answer again once they go."""
    broker = make_broker("--fsync", "never")
    topic = "refused"
    fill(broker, topic)
    batch_bytes = len(batchfmt.encode([(None, None, RECORD, None)] * RECORDS_PER_BATCH, now_ms=0))
    big = limits.FETCH_BYTES_MAX // batch_bytes  # batches in a maximal answer
    room = limits.FETCH_ANSWER_BYTES_IN_FLIGHT_MAX // batch_bytes - 3 * big  # batches left after three
    sizes = [big] * 3 + [4] * (room // 4)
    sizes[-1] += room % 4  # now less than one batch of room is left
    assert min(sizes) * batch_bytes > 3 * 2**20  # more than a loopback socket buffer takes
    clients = []
    try:
        for n in sizes:  # one at a time, so each is held before the next asks
            clients.append(stalled_client(broker, fetch_request(topic, n * batch_bytes)))
            assert status_line(clients[-1]).startswith(b"HTTP/1.1 200")
        r = broker.http.fetch(topic, 0, accept=CT_BATCHES, offset=0, max_bytes=limits.FETCH_BYTES_MAX)
        assert r.status == 429, (r.status, r.body[:200])
        assert r.headers["Retry-After"] and r.json()["error"] == "overloaded"
    finally:
        for s in clients:
            s.close()
    deadline = time.monotonic() + 10
    while (r := broker.http.fetch(topic, 0, accept=CT_BATCHES, offset=0, max_bytes=1)).status != 200:
        assert r.status == 429 and time.monotonic() < deadline, (r.status, r.body[:200])
        time.sleep(0.2)


@pytest.mark.integration
def test_idle_keepalive_connections_keep_no_answer(make_broker) -> None:
    """Answers read on connections that then stay open idle are not held by the broker."""
    broker = make_broker("--fsync", "never")
    topic = "idle"
    fill(broker, topic)
    request = fetch_request(topic, 4 * 2**20)
    conns = []
    before = vm_rss_bytes(broker.pid)
    try:
        for _ in range(24):  # read 4 MiB answers on 24 keep-alive connections, then leave them idle
            s = socket.create_connection((broker.local.host, broker.local.port), timeout=10)
            s.sendall(request)
            head = b""
            while b"\r\n\r\n" not in head:
                head += s.recv(65536)
            headers, _, got = head.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in headers.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(got) < length:
                got += s.recv(1 << 20)
            assert headers.startswith(b"HTTP/1.1 200") and len(got) == length
            conns.append(s)
        time.sleep(0.5)
        grown = vm_rss_bytes(broker.pid) - before
        # Held answers would be 24 x 4 MiB = 96 MiB.
        assert grown < 40 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB with 24 idle connections"
    finally:
        for s in conns:
            s.close()


# --- the budget alone ---------------------------------------------------------------------


def test_budget_grants_what_is_left_and_refuses_when_full() -> None:
    budget = answer_budget.AnswerBudget(100)
    assert budget.grant(60) == 60
    first = budget.hold(60)
    assert budget.grant(60) == 40  # a read asks for less
    with pytest.raises(Overloaded):
        budget.hold(41)
    second = budget.hold(40)
    with pytest.raises(Overloaded):
        budget.grant(1)
    second.release()
    second.release()  # idempotent
    assert budget.used == 60
    first.resize(90)
    assert budget.used == 90
    with pytest.raises(Overloaded):
        first.resize(101)
    assert budget.used == 0 and budget.refused == 3


async def test_unsent_answer_gives_its_room_back_when_dropped() -> None:
    budget = answer_budget.AnswerBudget(100)
    resp = answer.response(b"x" * 80, CT_BATCHES, {}, budget.hold(80))
    assert budget.used == 80 and len(resp.body) == 80
    del resp
    gc.collect()
    assert budget.used == 0


async def test_sent_answer_is_dropped_and_its_room_given_back() -> None:
    """The front writes a large answer in pieces (copies) as the transport takes them, and keeps none of it."""
    from ring.http_api import web
    from ring.http_api.server import Front

    class Transport:
        def __init__(self) -> None:
            self.pieces: list[bytes] = []

        def write(self, chunk: bytes) -> None:
            self.pieces.append(chunk)

        def get_write_buffer_size(self) -> int:
            return 0

        def close(self) -> None:
            pass

    budget = answer_budget.AnswerBudget(1 << 30)
    data = bytes(range(256)) * (limits.ANSWER_WRITE_CHUNK_BYTES // 100)
    sent: list[web.Response] = []

    def handler(request: web.Request) -> web.Response:
        sent.append(answer.response(data, CT_BATCHES, {}, budget.hold(len(data))))
        return sent[-1]

    app = web.App()
    app.router.add("GET", "/big", handler)
    front = Front(app, 10.0, 10.0, 10)
    try:
        conn = front.protocol()
        transport = Transport()
        conn.connection_made(transport)
        conn.data_received(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = transport.pieces[0], b"".join(transport.pieces[1:])
        assert head.startswith(b"HTTP/1.1 200") and b"Content-Length: %d" % len(data) in head
        assert body == data
        assert max(map(len, transport.pieces[1:])) == limits.ANSWER_WRITE_CHUNK_BYTES
        assert budget.used == 0 and sent[0].body == b""  # nothing kept once sent
    finally:
        front.stop_sweeping()
