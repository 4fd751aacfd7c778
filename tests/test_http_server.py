"""The broker, app and server ``ring serve`` runs, in this process, for what needs short timeouts or a look inside:
the header deadline, body timeout, long-poll cap and group commit."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import orjson
import pytest

from ring import limits
from ring.catalog import TopicConfig
from ring.cluster.node import ClusterBroker
from ring.fetch import Fetch
from ring.http_api.server import Server
from ring.produce import Produce, Records
from ring.replication.intake import results_of
from ring.replication.reads import settled
from tests.support import lone_broker, serving_alone

HEADER_TIMEOUT_S = 0.6


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[ClusterBroker, Server]]:
    async with serving_alone(tmp_path / "data", header_timeout_s=HEADER_TIMEOUT_S) as served:
        yield served


async def _closed_after(reader: asyncio.StreamReader, limit_s: float) -> float | None:
    """Seconds until the peer closes (EOF), None if it stays open for ``limit_s``."""
    t0 = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(65536), limit_s)
    except asyncio.TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - t0
    assert data == b"", data
    return time.monotonic() - t0


async def test_dribbled_headers_are_cut_off(running) -> None:
    _, server = running
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    t0 = time.monotonic()
    closed = False
    for byte in b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaa":
        writer.write(bytes([byte]))
        if await _closed_after(reader, 0.2) is not None:
            closed = True
            break
    took = time.monotonic() - t0
    writer.close()
    assert closed and HEADER_TIMEOUT_S * 0.9 < took < HEADER_TIMEOUT_S + 1.5


async def test_a_silent_connection_is_cut_off(running) -> None:
    _, server = running
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    took = await _closed_after(reader, HEADER_TIMEOUT_S + 2)
    writer.close()
    assert took is not None and took > HEADER_TIMEOUT_S * 0.9


async def test_a_slow_body_and_an_idle_keepalive_are_not_header_timeouts(running) -> None:
    _, server = running
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    body = b'["slow", "body"]'
    writer.write(b"POST /v1/topics/slow/messages?partition=0 HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    for i in range(len(body)):  # the body takes twice the header deadline
        writer.write(body[i : i + 1])
        await writer.drain()
        await asyncio.sleep(2 * HEADER_TIMEOUT_S / len(body))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    assert orjson.loads(await reader.readexactly(length))["count"] == 2
    await asyncio.sleep(HEADER_TIMEOUT_S * 1.5)  # idle between requests: keep-alive rules, not the header deadline
    writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200"), head
    writer.close()


async def test_body_not_sent_in_time_is_408(running, monkeypatch) -> None:
    monkeypatch.setattr(limits, "BODY_READ_TIMEOUT_S", 0.5)
    _, server = running
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /v1/topics/late/messages HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n[1,")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head


async def test_long_polls_over_the_cap_get_429(running, monkeypatch) -> None:
    monkeypatch.setattr(limits, "LONG_POLLS_OPEN_MAX", 2)
    broker, server = running
    await broker.add_topic(TopicConfig(name="polled", partitions=1))
    url = f"{server.url}/v1/topics/polled/partitions/0/messages?wait_ms=3000"
    async with aiohttp.ClientSession() as s:
        async def poll():
            async with s.get(url) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()

        first = [asyncio.create_task(poll()) for _ in range(2)]
        while broker.status()["long_polls_open"] < 2:  # both parked (the test's timeout bounds this)
            await asyncio.sleep(0.01)
        status, retry_after, body = await poll()
        assert status == 429 and retry_after == "1" and body["error"] == "overloaded"
        async with s.post(f"{server.url}/v1/topics/polled/messages", data=b"1",
                          headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200
        for task in first:
            status, _, body = await task
            assert status == 200 and [r["value"] for r in body["records"]] == [1]


async def test_group_commit_acknowledges_only_after_one_shared_fsync(tmp_path: Path) -> None:
    broker = await lone_broker(tmp_path / "gc", "always")
    try:
        await broker.add_topic(TopicConfig(name="gc", partitions=1))
        part = broker._parts["gc"][0]
        records = [(None, None, b"v", None)]
        tasks = [asyncio.create_task(results_of("gc", broker.intake.produce(Produce("gc", Records(records, [20], False, False), 0)))) for _ in range(40)]
        await asyncio.sleep(0)  # every task appends in this turn; the fsync has not run
        assert part.log.end_offset == 40 and part.hw == 0
        fetched = await settled(broker.fetch(Fetch("gc", 0, 0, 1 << 20)))
        assert fetched.data == b"" and fetched.high_watermark == 0  # nothing visible before the fsync
        results = await asyncio.gather(*tasks)
        assert sorted(r[0].base_offset for r in results) == list(range(40))
        assert part.hw == 40 and part.log.unsynced_bytes == 0
        assert broker.fsyncs <= 2, broker.fsyncs  # one shared fsync, not forty
        # appends that arrive while an fsync runs wait, then share the next one
        before = broker.fsyncs
        wave1 = [asyncio.create_task(results_of("gc", broker.intake.produce(Produce("gc", Records(records, [20], False, False), 0)))) for _ in range(5)]
        await asyncio.sleep(0)
        wave2 = [asyncio.create_task(results_of("gc", broker.intake.produce(Produce("gc", Records(records, [20], False, False), 0)))) for _ in range(5)]
        await asyncio.gather(*wave1, *wave2)
        assert broker.fsyncs - before <= 2 and part.hw == 50
    finally:
        await broker.close()


async def test_interval_policy_starts_writeback_between_fsyncs(tmp_path: Path) -> None:
    # A long interval, so the writes below meet no fsync: only the writeback loop sees them.
    broker = await lone_broker(tmp_path / "wb", "interval:60000")
    try:
        await broker.add_topic(TopicConfig(name="wb", partitions=1))
        part = broker._parts["wb"][0]
        value = b"x" * 1000
        small = [(None, None, value, None)] * 100
        await results_of("wb", broker.intake.produce(Produce("wb", Records(small, [1016] * 100, False, False), 0)))  # ~100 KB: under the threshold
        await asyncio.sleep(3 * limits.WRITEBACK_CHECK_INTERVAL_MS / 1000)
        assert broker.status()["writebacks"] == 0 and part.log.writeback_due(1)
        for _ in range(2 * limits.WRITEBACK_START_BYTES // (100 * 1016) + 1):
            await results_of("wb", broker.intake.produce(Produce("wb", Records(small, [1016] * 100, False, False), 0)))
        def under_way() -> bool:  # a writeback started, and less than its threshold is left since
            return broker.status()["writebacks"] >= 1 and not part.log.writeback_due(limits.WRITEBACK_START_BYTES)

        deadline = time.monotonic() + 5
        while not under_way() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert under_way()
        assert broker.fsyncs == 0 and part.log.unsynced_bytes > 0  # and none of it is called durable
    finally:
        await broker.close()
