"""What many tests share: a blocking HTTP client, polling for a condition, reading a partition back,
and the rule for system packages a test drives for real.

``Http`` speaks to one port (client or peer, http or https, with or without a
bearer token) with ``http.client``, a fresh connection per request, so a test
reads top to bottom without an event loop and no state leaks between tests.
``wait_for`` polls a condition with a deadline: the way a test waits for
something it can observe, instead of sleeping. ``require`` turns a missing
system package into a skip on a developer's machine and a failure under
CI=true, where ``make test`` must have installed it. ``lone_broker`` and
``serve_alone`` build, in the test's own process, the broker ``ring serve``
runs (a ``ClusterBroker``, alone), for tests that need small limits or a
look inside; everything else starts real processes (``tests.brokers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import inspect
import json
import os
import ssl
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, TypeVar

import orjson
import pytest

if TYPE_CHECKING:
    from ring.cluster.node import ClusterBroker
    from ring.http_api.server import Server

T = TypeVar("T")

WAIT_S = 30.0  # a condition a loaded 2-core machine reaches in seconds; the bound only ends a hung test


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0]


class Http:
    """Blocking requests to one port: a fresh connection each, http or https, with an optional token."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0, *, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, https: bool = False) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.token = token
        self.ssl_context = ssl_context
        self.https = https

    @classmethod
    def to(cls, url: str, token: str | None = None, ssl_context: ssl.SSLContext | None = None,
           timeout_s: float = 30.0) -> Http:
        parts = urllib.parse.urlsplit(url)
        https = parts.scheme == "https"
        return cls(parts.hostname or "127.0.0.1", parts.port or (443 if https else 80), timeout_s,
                   token=token, ssl_context=ssl_context, https=https)

    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}"

    def with_token(self, token: str | None) -> Http:
        return Http(self.host, self.port, self.timeout_s, token=token, ssl_context=self.ssl_context,
                    https=self.https)

    def request(self, method: str, path: str, body: bytes | Iterable[bytes] | None = None,
                headers: dict[str, str] | None = None, query: dict[str, Any] | None = None,
                json_body: Any = None) -> Reply:
        headers = dict(headers or {})
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers.setdefault("Content-Type", "application/json")
        if query:
            path += "?" + urllib.parse.urlencode(query)
        if self.https:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout_s, context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            chunked = body is not None and not isinstance(body, (bytes, bytearray))
            conn.request(method, path, body=body, headers=headers, encode_chunked=chunked)
            resp = conn.getresponse()
            return Reply(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Reply:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> Reply:
        return self.request("DELETE", path, **kw)

    # conveniences used across the suite

    def produce(self, topic: str, body: bytes | list[Any], content_type: str = "application/json",
                **query: Any) -> Reply:
        """POST records: ``body`` as it is, or a list of values sent as NDJSON (one record each)."""
        if isinstance(body, list):
            body, content_type = b"\n".join(orjson.dumps(v) for v in body), "application/x-ndjson"
        return self.post(f"/v1/topics/{topic}/messages", body=body, headers={"Content-Type": content_type},
                         query=query or None)

    def fetch(self, topic: str, partition: int, accept: str = "application/json", **query: Any) -> Reply:
        return self.get(f"/v1/topics/{topic}/partitions/{partition}/messages", headers={"Accept": accept},
                        query=query or None)

    def end_offsets(self, topic: str) -> list[int] | None:
        """End offset of every partition, None when the topic does not exist."""
        r = self.get(f"/v1/topics/{topic}")
        if r.status == 404:
            return None
        assert r.status == 200, r.body
        return [p["end_offset"] for p in r.json()["partitions"]]

    def create_topic(self, name: str, **settings: Any) -> Reply:
        return self.post("/v1/topics", json_body={"name": name, **settings})

    def describe(self, topic: str) -> dict[str, Any]:
        """GET /v1/topics/{topic}, which must answer 200."""
        r = self.get(f"/v1/topics/{topic}")
        assert r.status == 200, r.body
        return r.json()

    def status(self) -> dict[str, Any]:
        r = self.get("/v1/status")
        assert r.status == 200, r.body
        return r.json()

    def read_all(self, topic: str, partition: int, *, end: int | None = None, want: int = 0,
                 timeout_s: float = 20.0) -> dict[int, Any]:
        """Offset -> value of a partition from this broker, from offset 0: until past ``end`` when given,
        else until a fetch brings nothing new and at least ``want`` records are in. Answers other than
        200 (a broker electing or catching up) are retried; whatever was read by ``timeout_s`` is returned."""
        out: dict[int, Any] = {}
        offset, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline and (end is None or offset < end):
            r = self.fetch(topic, partition, offset=offset, max_records=10_000, wait_ms=200)
            if r.status != 200:
                time.sleep(0.2)
                continue
            doc = r.json()
            out.update({rec["offset"]: rec["value"] for rec in doc["records"]})
            if end is None and doc["next_offset"] == offset and len(out) >= want:
                break
            offset = doc["next_offset"]
        return out


def wait_for(what: str, check: Callable[[], T], timeout_s: float = WAIT_S, interval_s: float = 0.2,
             errors: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``check`` until it returns something true and return that; TimeoutError naming ``what`` and the
    last value after ``timeout_s``. Exceptions of the ``errors`` types count as not yet."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except errors as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s (last: {last!r})"[:2000])
        time.sleep(interval_s)


async def until(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S, interval_s: float = 0.01) -> Any:
    """``wait_for`` inside an event loop: ``check`` (plain, or returning an awaitable) is polled between
    turns of the loop, so the tasks it waits on run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s (last: {last!r})"[:2000])
        await asyncio.sleep(interval_s)


def require(missing: str | None) -> None:
    """A system package a test drives for real: skip saying which when ``missing`` names one, except under
    CI=true, where ``make test`` installs it and its absence fails the run."""
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{missing} (CI=true: `make test` installs it)", pytrace=False)
    pytest.skip(missing)


# --- a broker in this process, as `ring serve` builds it ------------------------------------------


def _cluster_broker(data_dir: Path, fsync: str, **settings: Any) -> ClusterBroker:
    import random

    from ring.config import BrokerConfig
    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.log.fsync import FsyncPolicy

    config = BrokerConfig(name="ring-0", data_dir=data_dir, fsync=FsyncPolicy.parse(fsync), **settings)
    return ClusterBroker(config, SystemClock(), random.Random())


async def lone_broker(data_dir: Path, fsync: str = "interval:100", **settings: Any) -> ClusterBroker:
    """The broker ``ring serve`` runs (``ring.cli.serve``) when given no seeds, in this process, with no
    HTTP in front: a ``ClusterBroker`` opened and started, alone in its cluster. For tests that look
    inside it; close it with ``await broker.close()``."""
    broker = _cluster_broker(data_dir, fsync, **settings)
    broker.open()
    await broker.start()
    return broker


@contextlib.asynccontextmanager
async def serving_alone(data_dir: Path, fsync: str = "interval:100", tokens: Any = None,
                        **server_kw: Any) -> AsyncIterator[tuple[ClusterBroker, Server]]:
    """``serve_alone`` for the length of a ``with``: stopped as ``serve`` stops, whatever the test did."""
    broker, server = await serve_alone(data_dir, fsync, tokens, **server_kw)
    try:
        yield broker, server
    finally:
        broker.begin_shutdown()
        await server.stop()
        await broker.close()


async def serve_alone(data_dir: Path, fsync: str = "interval:100", tokens: Any = None,
                      **server_kw: Any) -> tuple[ClusterBroker, Server]:
    """``ring serve`` alone, in this process, in ``serve``'s order: the client app (``make_app``) on a
    ``Server`` on a free loopback port, then the broker bound to that port, opened and started.
    ``server_kw`` makes the server's bounds (header timeout, connections) small for a test. Stop with
    ``broker.begin_shutdown()``, ``await server.stop()``, ``await broker.close()``, as ``serve`` does."""
    from ring.http_api.app import make_app
    from ring.http_api.server import Server

    broker = _cluster_broker(data_dir, fsync)
    server = Server(make_app(broker, tokens), "127.0.0.1", 0, **server_kw)
    await server.start()
    broker.bind(server.port, 0)  # alone: no peer ever calls, as in serve with no seeds
    broker.open()
    await broker.start()
    return broker, server
