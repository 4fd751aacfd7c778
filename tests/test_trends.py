"""The samples behind the admin page's charts (``ring.http_api.trends``), on the broker, app and server ``ring
serve`` runs, in this process: a sample holds the records that moved since the one before, per topic, in
(acknowledged produces) and out (fetches and group polls), and each coordinated group's lag; quiet topics take
no room, and the busiest topics and most-behind groups are kept when there are more than a sample holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from ring import limits
from ring.http_api.trends import TRENDS_KEY, Trends
from tests.support import serve_alone


class Served:
    def __init__(self, url: str, trends: Trends, session: aiohttp.ClientSession) -> None:
        self.url, self.trends, self.session = url, trends, session

    async def call(self, method: str, path: str, **kw: Any) -> Any:
        async with self.session.request(method, self.url + path, **kw) as r:
            assert r.status < 300, (r.status, await r.text())
            return await r.json() if r.content_type == "application/json" else None

    async def produce(self, topic: str, n: int) -> None:
        await self.call("POST", f"/v1/topics/{topic}/messages", data=b"\n".join(b"%d" % i for i in range(n)),
                        headers={"Content-Type": "application/x-ndjson"})


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    broker, server = await serve_alone(tmp_path / "ring-0", "never")
    trends = server.app[TRENDS_KEY]
    await trends.close()  # no sample every TRENDS_INTERVAL_MS behind the test's back: it takes them itself
    async with aiohttp.ClientSession() as session:
        yield Served(server.url, trends, session)
    broker.begin_shutdown()
    await server.stop()
    await broker.close()


async def test_a_sample_holds_what_moved_since_the_last(served: Served) -> None:
    s = served
    for name in ("a", "b"):
        await s.call("POST", "/v1/topics", json={"name": name, "partitions": 1, "replication_factor": 1})
    await s.produce("a", 3)
    got = await s.call("GET", "/v1/topics/a/partitions/0/messages", params={"offset": "0", "max_records": "2"})
    assert len(got["records"]) == 2
    first = s.trends.sample()
    assert first["topics"] == {"a": [3, 2]} and first["groups"] == {} and first["ms"] >= 0
    await s.produce("b", 1)
    second = s.trends.sample()
    assert second["topics"] == {"b": [1, 0]}, "a topic with no traffic since takes no room"
    assert second["t"] >= first["t"]

    # A group: 5 in, a poll hands out 4 (out), the next commits them: 1 behind.
    await s.produce("a", 2)
    await s.call("POST", "/v1/groups/g/members", json={"consumer": "c", "topics": ["a"]})
    one = await s.call("POST", "/v1/groups/g/members/c/poll", params={"max_records": "4"})
    two = await s.call("POST", "/v1/groups/g/members/c/poll", params={"max_records": "4", "token": one["token"]})
    assert [len(p["records"]) for p in (one, two)] == [4, 1]
    third = s.trends.sample()
    assert third["topics"]["a"] == [2, 5] and third["groups"] == {"g": 1}

    doc = await s.call("GET", "/admin/trends")
    assert doc["interval_ms"] == limits.TRENDS_INTERVAL_MS and doc["samples_max"] == limits.TRENDS_SAMPLES_MAX
    assert doc["samples"] == [first, second, third]
    relayed = await s.call("GET", "/admin/brokers/ring-0/trends")
    assert relayed["samples"] == doc["samples"]


async def test_a_sample_keeps_the_busiest_topics_and_the_last_samples(served: Served,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    s = served
    for name, n in (("quiet", 1), ("busy", 5), ("middle", 3)):
        await s.call("POST", "/v1/topics", json={"name": name, "partitions": 1, "replication_factor": 1})
        await s.produce(name, n)
    monkeypatch.setattr(limits, "TRENDS_TOPICS_MAX", 2)
    assert s.trends.sample()["topics"] == {"busy": [5, 0], "middle": [3, 0]}
    for _ in range(limits.TRENDS_SAMPLES_MAX + 3):
        s.trends.sample()
    assert len(s.trends.samples) == limits.TRENDS_SAMPLES_MAX
