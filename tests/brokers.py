"""Real broker processes for integration tests, and a small blocking HTTP client.

``TestBroker`` runs ``python -m ring serve`` on a free loopback port with a
data directory under a temporary root, waits until ``/v1/status`` answers,
and stops it by PID with SIGTERM (clean) or SIGKILL (crash); ``restart``
reuses the same directory. ``Http`` speaks to it with ``http.client`` so a
test reads top to bottom without an event loop.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import orjson

from ring.localcluster import LocalBroker, free_port

REPO_ROOT = Path(__file__).resolve().parent.parent


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
    """Blocking requests to one broker: a fresh connection each, so no state leaks between tests."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s

    def request(self, method: str, path: str, body: bytes | Iterable[bytes] | None = None,
                headers: dict[str, str] | None = None, query: dict[str, Any] | None = None,
                json_body: Any = None) -> Reply:
        headers = dict(headers or {})
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers.setdefault("Content-Type", "application/json")
        if query:
            path += "?" + urllib.parse.urlencode(query)
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

    def produce(self, topic: str, body: bytes, content_type: str = "application/json", **query: Any) -> Reply:
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


class TestBroker:
    """One ``ring serve`` process; a thin layer over the launcher the demo and bench use."""

    __test__ = False  # not a pytest class

    def __init__(self, root: Path, name: str = "ring-0", args: Iterable[str] = (),
                 env: dict[str, str] | None = None) -> None:
        self.local = LocalBroker(name, root / name, free_port(), args=list(args),
                                 env={"PYTHONPATH": str(REPO_ROOT), **(env or {})},
                                 log_path=root / f"{name}.log")

    @property
    def url(self) -> str:
        return self.local.url

    @property
    def data_dir(self) -> Path:
        return self.local.data_dir

    @property
    def pid(self) -> int:
        assert self.local.proc is not None
        return self.local.proc.pid

    @property
    def http(self) -> Http:
        return Http(self.local.host, self.local.port)

    def log_text(self) -> str:
        path = self.local.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self) -> TestBroker:
        self.local.start()
        return self

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code."""
        return self.local.stop()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.local.kill()

    def restart(self) -> TestBroker:
        """Start again on the same data directory (a new port if the old one was taken)."""
        self.local.kill()
        try:
            self.local.start()
        except RuntimeError:
            self.local.port = free_port()
            self.local.start()
        return self

    def signal(self, sig: signal.Signals) -> None:
        assert self.local.proc is not None
        self.local.proc.send_signal(sig)

    def raw_socket(self, timeout_s: float = 30.0) -> socket.socket:
        return socket.create_connection((self.local.host, self.local.port), timeout=timeout_s)
