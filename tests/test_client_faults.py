"""The producer under faults, against real brokers and with default settings unless a test says
otherwise: a partition leader SIGKILLed and restarted under a keyed and an unkeyed producer, every
broker down for 10 s, a connection dropped after the request reached the broker, and a process that
exits without closing its client. Every record is accounted for: acknowledged records are stored
exactly once where their metadata says, and a record reported failed is either not stored or
reported as ``OutcomeUnknown``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from typing import Any

import pytest

from ring import limits
from ring.client import AsyncClient, Client, OutcomeUnknown
from tests.brokers import REPO_ROOT, TestBroker, TestCluster

pytestmark = pytest.mark.integration

DEADLINE_S = 150.0  # the default delivery timeout (120 s) and a margin


async def read_values(c: AsyncClient, topic: str) -> dict[tuple[int, int], bytes]:
    """Every stored record of ``topic``: (partition, offset) -> value."""
    out: dict[tuple[int, int], bytes] = {}
    for p in range((await c.describe(topic))["partition_count"]):
        offset = 0
        for _ in range(10_000):  # bounded: each round returns at least one record or ends
            got = await c.fetch(topic, p, offset, max_records=5000)
            out.update(((p, r.offset), r.value) for r in got.records)
            if not got.records or got.next_offset >= got.high_watermark:
                break
            offset = got.next_offset
    return out


def check_exactly_once(acked: dict[bytes, Any], stored: dict[tuple[int, int], bytes]) -> None:
    """Each acknowledged value is stored once, at the place its RecordMetadata names."""
    copies = Counter(stored.values())
    assert {v: n for v, n in copies.items() if n > 1} == {}, "records stored twice"
    assert set(copies) == set(acked), "stored and acknowledged records differ"
    for value, md in acked.items():
        assert stored[(md.partition, md.offset)] == value


# --- a leader killed and restarted ---------------------------------------------------------------


@pytest.mark.parametrize(("keyed", "down_s"), [(True, 5.0), (True, 15.0), (False, 15.0)],
                         ids=["keyed-down-5s", "keyed-down-15s", "unkeyed-down-15s"])
async def test_a_leader_killed_and_restarted_costs_no_record(make_cluster, keyed: bool, down_s: float) -> None:
    """Down 5 s: restarted about when the others convict it. Down 15 s: a new leader is elected
    first, and the restarted broker takes leadership back later."""
    c: TestCluster = make_cluster(3)
    records = 3000
    async with AsyncClient([m.url for m in c]) as client:
        await client.create_topic("kill", partitions=6, replication_factor=3)
        victim = c.member(c.leaders("kill")[0])
        futs = []
        restart: asyncio.Future | None = None
        killed_at = 0.0
        for i in range(records):
            if i == records // 3:
                victim.kill()
                killed_at = time.monotonic()
            if killed_at and restart is None and time.monotonic() - killed_at >= down_s:
                restart = asyncio.ensure_future(asyncio.to_thread(victim.local.start))
            futs.append(client.produce("kill", b"%d" % i, key=b"k%d" % (i % 101) if keyed else None))
            await asyncio.sleep(0.004)  # the workload: about 250 records a second
        while restart is None:  # the victim stays down for down_s whatever the pace
            if time.monotonic() - killed_at >= down_s:
                restart = asyncio.ensure_future(asyncio.to_thread(victim.local.start))
            await asyncio.sleep(0.1)
        assert restart is not None
        await restart
        done, pending = await asyncio.wait(futs, timeout=DEADLINE_S)
        assert not pending
        failed = Counter(type(f.exception()).__name__ for f in futs if f.exception() is not None)
        assert failed == Counter()
        acked = {b"%d" % i: f.result() for i, f in enumerate(futs)}
        check_exactly_once(acked, await read_values(client, "kill"))
        if keyed:  # each key's records stay in the order they were produced
            for k in range(101):
                offsets = [acked[b"%d" % i].offset for i in range(k, records, 101)]
                assert offsets == sorted(offsets)


# --- every broker down for 10 s --------------------------------------------------------------------


def test_every_broker_down_for_10s_records_wait_then_succeed(make_cluster) -> None:
    c: TestCluster = make_cluster(3)
    buffer = 2 * limits.BATCH_BYTES_MAX
    value = b"v" * 1000
    with Client([m.url for m in c], buffer_bytes=buffer) as client:
        client.create_topic("down", partitions=6, replication_factor=3)
        first = [client.produce("down", b"before-%d" % i + value) for i in range(100)]
        client.flush()
        assert all(f.exception() is None for f in first)
        transport = client.async_client._transport
        assert transport is not None
        for m in c:
            m.kill()
        cpu0, wall0, requests0 = time.process_time(), time.monotonic(), transport.requests
        futs: list = []
        most_buffered = 0

        def produce() -> None:  # blocks while the buffer is full (max_block_ms is 60 s by default)
            for i in range(5000):
                futs.append(client.produce("down", b"during-%d" % i + value))

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        while time.monotonic() - wall0 < 10.0:
            most_buffered = max(most_buffered, client.async_client.buffered_bytes)
            assert not any(f.done() for f in list(futs)), "a record finished while every broker was down"
            time.sleep(0.05)
        cpu = time.process_time() - cpu0
        requests = transport.requests - requests0
        assert producer.is_alive()  # still blocked on the full buffer
        assert buffer - len(value) - 100 < most_buffered <= buffer
        for m in c:
            m.local.start(wait=False)
        for m in c:
            m.local.wait_ready()
        producer.join(DEADLINE_S)
        assert not producer.is_alive()
        client.flush()
        failed = Counter(type(f.exception()).__name__ for f in futs if f.exception() is not None)
        assert failed == Counter()
        acked = {b"before-%d" % i + value: f.result() for i, f in enumerate(first)}
        acked.update({b"during-%d" % i + value: f.result() for i, f in enumerate(futs)})
        stored = asyncio.run(_read_with_new_client([m.url for m in c], "down"))
    check_exactly_once(acked, stored)
    # Backing off, not spinning: under a tenth of a core, a request per partition a second or so.
    print(f"10 s with every broker down: {cpu:.2f} CPU-seconds, {requests} requests")
    assert cpu < 1.0, cpu
    assert requests < 300, requests


async def _read_with_new_client(urls: list[str], topic: str) -> dict[tuple[int, int], bytes]:
    async with AsyncClient(urls) as c:
        return await read_values(c, topic)


# --- a connection dropped after the broker got the request ----------------------------------------


class DroppingProxy:
    """A TCP proxy in front of one broker that closes the client's connection instead of relaying
    the answer to the first ``drops`` produce requests (the broker has handled them). The broker
    listens on 127.0.0.1 and advertises 127.0.0.2, where the proxy listens on the same port, so the
    client's every request crosses the proxy."""

    def __init__(self, target_port: int, drops: int, hold: bool = False) -> None:
        self.target_port = target_port
        self.drops = drops
        self.hold = hold  # keep the connection open and the answer unsent instead of closing it
        self.dropped = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.2", self.target_port)
        return f"http://127.0.0.2:{self.target_port}"

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        state = {"produce": False}

        async def upstream() -> None:
            while data := await reader.read(65536):
                if data.startswith(b"POST /v1/topics/"):
                    state["produce"] = b"/messages" in data.split(b"\r\n", 1)[0]
                elif data[:4] in (b"GET ", b"POST", b"PUT ", b"DELE", b"PATC"):
                    state["produce"] = False
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if state["produce"] and self.dropped < self.drops:
                    self.dropped += 1  # the broker answered: it has the records; the client never hears
                    if self.hold:
                        continue
                    writer.transport.abort()
                    up_writer.close()
                    return
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)
        writer.close()
        up_writer.close()


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
async def test_a_dropped_connection_is_never_reported_failed_for_a_stored_record(make_broker,
                                                                                idempotent: bool) -> None:
    b: TestBroker = make_broker("--advertise", "127.0.0.2")
    proxy = DroppingProxy(b.local.port, drops=3)
    url = await proxy.start()
    try:
        async with AsyncClient(url, linger_ms=20, **({} if idempotent else {"enable_idempotence": False})) as c:
            await c.create_topic("dropped", partitions=2)
            futs = {}
            for i in range(300):
                futs[b"r%d" % i] = c.produce("dropped", b"r%d" % i, key=b"k%d" % (i % 7))
                if i % 50 == 49:
                    await asyncio.sleep(0.05)  # six bursts: several requests per partition
            await asyncio.wait(futs.values(), timeout=DEADLINE_S)
            assert proxy.dropped == 3
            stored = await read_values(c, "dropped")
    finally:
        await proxy.close()
    outcomes = Counter("ok" if f.exception() is None else type(f.exception()).__name__ for f in futs.values())
    copies = Counter(stored.values())
    assert max(copies.values()) == 1  # never stored twice
    if idempotent:  # retried under the same sequence: stored once, acknowledged with the first offsets
        assert outcomes == Counter(ok=300)
        check_exactly_once({v: f.result() for v, f in futs.items()}, stored)
    else:
        unknown = {v for v, f in futs.items() if f.exception() is not None}
        assert set(outcomes) == {"ok", "OutcomeUnknown"} and outcomes["OutcomeUnknown"] == len(unknown)
        assert all(isinstance(futs[v].exception(), OutcomeUnknown) for v in unknown)
        assert unknown <= set(copies)  # the broker did store them: "unknown", never "failed"
        check_exactly_once({v: f.result() for v, f in futs.items() if v not in unknown},
                           {k: v for k, v in stored.items() if v not in unknown})


async def test_records_in_flight_when_the_client_closes_are_outcome_unknown(make_broker) -> None:
    """``close(flush=False)`` while a produce request is out (the broker stored it; its answer has not
    come): its records may be stored, so they fail as ``OutcomeUnknown``, not as never sent."""
    b: TestBroker = make_broker("--advertise", "127.0.0.2")
    proxy = DroppingProxy(b.local.port, drops=1, hold=True)
    url = await proxy.start()
    try:
        c = AsyncClient(url)
        await c.create_topic("held", partitions=1)
        fut = c.produce("held", b"x", partition=0)
        deadline = time.monotonic() + DEADLINE_S
        while b.http.end_offsets("held") != [1] or proxy.dropped < 1:  # stored, and its answer held back
            assert time.monotonic() < deadline and not fut.done()
            await asyncio.sleep(0.01)
        await c.close(flush=False)
    finally:
        await proxy.close()
    assert isinstance(fut.exception(), OutcomeUnknown), repr(fut.exception())


# --- a process that exits without close() -------------------------------------------------------


def _run(script: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), url], capture_output=True, text=True,
                          timeout=120, cwd=REPO_ROOT, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})


def test_exit_without_close_flushes_what_was_produced(make_broker) -> None:
    b: TestBroker = make_broker()
    assert b.http.create_topic("atexit", partitions=2).status == 201
    done = _run("""
        import sys
        from ring.client import Client
        c = Client(sys.argv[1], linger_ms=1000)
        for i in range(2000):
            c.produce("atexit", b"%d" % i)
        """, b.url)
    assert done.returncode == 0, done.stderr
    assert sum(b.http.end_offsets("atexit")) == 2000


def test_an_async_client_left_unclosed_says_how_many_records_it_lost(make_broker) -> None:
    b: TestBroker = make_broker()
    assert b.http.create_topic("atexit-async", partitions=1).status == 201
    done = _run("""
        import asyncio, sys
        from ring.client import AsyncClient

        async def main():
            c = AsyncClient(sys.argv[1], linger_ms=60_000)
            for i in range(2000):
                c.produce("atexit-async", b"%d" % i)

        asyncio.run(main())
        """, b.url)
    assert sum(b.http.end_offsets("atexit-async")) == 0
    assert "2000 records" in done.stderr and "were never sent" in done.stderr, done.stderr
