"""Hostile pipelining against a real broker process: what a connection that sends many requests in
one write, and reads slowly or never, makes the broker hold, and that a long pipeline behind one slow
request is answered whole, in order, without the front recursing.

Memory is read from the broker's own counters, as in ``test_hostile_input``: the peak resident set is
reset (``/proc/PID/clear_refs``) before the connections open, and the peak after is compared with the
bound the front states per connection (``limits.connection_bytes_max``) times the connections, plus
the allocator's slack."""

from __future__ import annotations

import threading

import pytest

from ring import limits
from ring.bench import pipelining
from ring.bench.measure import reset_peak, vm_kib
from tests.brokers import TestBroker

pytestmark = pytest.mark.integration

OPENAPI_GET = b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
RSS_SLACK_BYTES = 8 * 2**20  # the allocator's slack and what a request's path warms up
SETTLE_S = 30.0  # bound on waiting for the broker to do all it will do for a client that does not read


def _settled(b: TestBroker, route: str) -> int:
    """The broker's count of answers for ``route`` once it stops moving: a client that does not read
    has had all the answers the broker will make for it before it stops running its requests."""
    return pipelining.settle(b.local.host, b.local.port, route, SETTLE_S)


def _doc_bytes(b: TestBroker) -> int:
    r = b.http.get("/v1/openapi.json")
    assert r.status == 200
    return len(r.body)


@pytest.mark.parametrize("connections", [1, 4])
def test_pipelined_requests_of_a_client_that_does_not_read_hold_bounded_memory(make_broker,
                                                                             connections: int) -> None:
    b = make_broker("--fsync", "interval:100")
    doc = _doc_bytes(b)  # warm: the document is built
    reset_peak(b.pid)
    before = vm_kib(b.pid, "VmRSS") * 1024
    socks = [b.raw_socket(timeout_s=60) for _ in range(connections)]
    try:
        for s in socks:
            s.sendall(OPENAPI_GET * 3000)  # 126 KB, read by the broker in one or two reads
        answered = _settled(b, "/v1/openapi.json")
        rise = vm_kib(b.pid, "VmHWM") * 1024 - before
        bound = connections * limits.connection_bytes_max(doc) + RSS_SLACK_BYTES
        assert rise <= bound, (f"{connections} connections pipelining 3000 requests each and reading nothing "
                               f"raised the broker's RSS {rise >> 20} MiB (bound {bound >> 20} MiB; "
                               f"{answered} answers made)")
        # Nothing was lost by waiting: once read, every request has its answer, in order.
        for s in socks:
            assert pipelining.read_answers(s, 3000) == [(200, doc)] * 3000
    finally:
        for s in socks:
            s.close()


def test_a_long_pipeline_behind_one_slow_request_is_answered_whole_and_in_order(make_broker, topic: str) -> None:
    b = make_broker("--fsync", "interval:100")
    assert b.http.create_topic(topic, partitions=1).status == 201
    n = 100_000
    kinds = [(f"GET /v1/topics/{topic} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 200),
             (b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n", 404),
             (b"DELETE /v1/status HTTP/1.1\r\nHost: x\r\n\r\n", 405)]
    slow = f"GET /v1/topics/{topic}/partitions/0/messages?offset=0&wait_ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n"
    payload = slow.encode() + b"".join(kinds[i % 3][0] for i in range(n))
    s = b.raw_socket(timeout_s=60)
    sent: list[BaseException] = []

    def send() -> None:  # the broker reads as it answers: the answers must be read meanwhile
        try:
            s.sendall(payload)
        except OSError as exc:
            sent.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    try:
        sender.start()
        got = pipelining.read_answers(s, n + 1)
        sender.join(10)
        assert not sent, sent
        assert got[0][0] == 200  # the long poll, answered empty when its wait ended
        statuses = [status for status, _ in got[1:]]
        expected = [kinds[i % 3][1] for i in range(n)]
        assert statuses == expected, next(i for i, (x, y) in enumerate(zip(statuses, expected)) if x != y)
    finally:
        s.close()
    assert "RecursionError" not in b.log_text() and "Traceback" not in b.log_text(), b.log_text()[-3000:]
