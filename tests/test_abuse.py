"""The bounds that hold a hostile client in check, on the broker, app and server ``ring serve`` runs, in
this process with small limits: the connection bound, the deadline for taking an answer, the budget of
request bodies being received (counted by the bytes that arrive), and the bound on forwarded produces."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import AsyncIterator

import pytest

from ring import limits
from ring.catalog import TopicConfig
from ring.cluster.node import ClusterBroker
from ring.cluster.peers import PeerClient
from ring.errors import Overloaded
from ring.http_api.budget import body_budget_of
from ring.http_api.server import Server
from ring.produce import Batches, Produce, Records
from ring.replication.intake import results_of
from tests.support import serve_alone

_REQ = Produce("t", Batches([bytearray(b"x")], 1), 0, None, "one")  # a forwarded produce's request


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[list]:
    started: list[tuple[ClusterBroker, Server]] = []

    async def start(**kw) -> tuple[ClusterBroker, Server]:
        started.append(await serve_alone(tmp_path / str(len(started)) / "data", "never", **kw))
        return started[-1]

    yield start
    for broker, server in started:
        broker.begin_shutdown()
        await server.stop()
        await broker.close()


async def _request(port: int, raw: bytes, timeout_s: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await asyncio.wait_for(reader.read(1 << 20), timeout_s)
    finally:
        writer.close()


STATUS = b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


async def test_connections_over_the_bound_get_503_and_are_closed(stack) -> None:
    _, server = await stack(connections_max=3)
    held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
    await asyncio.sleep(0.1)
    answer = await _request(server.port, STATUS)
    assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer and b'"error"' in answer, answer
    for reader, writer in held[:1]:  # the connections that were let in are served
        writer.write(STATUS)
        assert (await asyncio.wait_for(reader.read(1 << 16), 5)).startswith(b"HTTP/1.1 200")
        writer.close()
    await asyncio.sleep(0.1)
    assert (await _request(server.port, STATUS)).startswith(b"HTTP/1.1 200")  # a slot was freed
    for _, writer in held[1:]:
        writer.close()


async def test_an_answer_the_client_never_reads_is_dropped_with_its_connection(stack) -> None:
    broker, server = await stack(send_timeout_s=0.5)
    await broker.add_topic(TopicConfig(name="big", partitions=1))
    value = b'"' + b"x" * (limits.MESSAGE_BYTES_MAX - 100) + b'"'
    for _ in range(6):  # ~6 MiB to fetch
        await results_of("big", broker.intake.produce(Produce("big", Records([(None, None, value, None)], [len(value)],
                                                                         True, False), 0, consistency="one")))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"GET /v1/topics/big/partitions/0/messages?max_bytes=16777216 HTTP/1.1\r\nHost: x\r\n"
                 b"Accept: application/vnd.ring.batches\r\n\r\n")
    deadline = time.monotonic() + 1.0
    while not server.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(server.connections) == 1
    await asyncio.sleep(1.5)  # the deadline is 0.5 s: the connection was aborted, its bytes dropped
    assert not server.connections
    sock.setblocking(False)
    got, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < 5:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.01)
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += len(chunk)
    sock.close()
    assert got < 6 * limits.MESSAGE_BYTES_MAX  # the answer was cut, not delivered late
    assert (await _request(server.port, STATUS)).startswith(b"HTTP/1.1 200")


async def _held_at_least(budget, nbytes: int) -> None:
    deadline = time.monotonic() + 5
    while budget.used < nbytes and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert budget.used >= nbytes, budget.used


async def test_request_bodies_hold_the_budget_by_the_bytes_that_arrived(stack, monkeypatch) -> None:
    monkeypatch.setattr(limits, "REQUEST_BODY_BYTES_IN_FLIGHT_MAX", 1000)
    broker, server = await stack()
    budget = body_budget_of(broker)
    head = (b"POST /v1/topics/budget/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 900\r\n\r\n")
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", server.port)
    slow_w.write(head + b"[")  # declares 900 bytes, sends 1: holds 1
    await _held_at_least(budget, 1)
    body = b"[" + b"1," * 149 + b"1]"
    second = (b"POST /v1/topics/budget/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert (await _request(server.port, second)).startswith(b"HTTP/1.1 200")  # a declared size reserves nothing
    slow_w.write(b"1," * 400)  # now it holds 801 bytes it sent
    await _held_at_least(budget, 801)
    answer = await _request(server.port, second)
    assert answer.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in answer and b"overloaded" in answer, answer
    small = b"[3]"
    assert (await _request(server.port, second.replace(b"Content-Length: " + str(len(body)).encode(),
                                                       b"Content-Length: 3").replace(body, small))
            ).startswith(b"HTTP/1.1 200")  # a small body still fits beside the slow one
    slow_w.write(b"1" + b" " * 97 + b"]")
    assert (await asyncio.wait_for(slow_r.read(1 << 16), 5)).startswith(b"HTTP/1.1 200")
    slow_w.close()
    assert budget.used == 0 and budget.refused == 1
    assert (await _request(server.port, second)).startswith(b"HTTP/1.1 200")  # the budget was given back


def _produce_request(body: bytes, declared: int | None = None) -> bytes:
    return (b"POST /v1/topics/budget/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % (len(body) if declared is None else declared) + body)


async def test_a_request_with_a_body_is_refused_before_it_is_read_once_the_budget_is_spent(stack,
                                                                                           monkeypatch) -> None:
    monkeypatch.setattr(limits, "REQUEST_BODY_BYTES_IN_FLIGHT_MAX", 1000)
    _, server = await stack()
    slow_r, slow_w = await asyncio.open_connection("127.0.0.1", server.port)
    slow_w.write(_produce_request(b"[" + b" " * 998, declared=1000))  # all but a byte of the budget, then stalls
    await asyncio.sleep(0.2)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_produce_request(b"", declared=3)[:-2] + b"Expect: 100-continue\r\n\r\n")  # no byte of the body
    answer = await asyncio.wait_for(reader.read(1 << 16), 5)
    assert answer.startswith(b"HTTP/1.1 429") and b"100 Continue" not in answer, answer
    writer.close()
    slow_w.close()


async def test_forwarded_produces_over_the_bound_get_429(monkeypatch) -> None:
    monkeypatch.setattr(limits, "FORWARDS_IN_FLIGHT_MAX", 2)
    hang = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await hang.wait()  # a leader that never answers
        writer.close()

    leader = await asyncio.start_server(handler, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{leader.sockets[0].getsockname()[1]}"
    from ring.cluster.peers import make_session

    async with make_session("s", timeout_s=2.0) as session:
        client = PeerClient("ring-0", "s", session)
        await client.control.close()  # only the data session is used here
        stuck = [client.forward("ring-1", url, _REQ, 0, [bytearray(b"x")]) for _ in range(2)]
        assert client.forwards_in_flight == 2
        with pytest.raises(Overloaded):
            await client.forward("ring-1", url, _REQ, 0, [bytearray(b"x")])
        assert client.forwards_in_flight == 2
        hang.set()
        await asyncio.gather(*stuck, return_exceptions=True)
        assert client.forwards_in_flight == 0
    leader.close()
