"""Blocking JSON calls to any broker, for the commands the client library does
not cover (consumer groups, offsets by time) and for telling "no broker
answers" (exit 3) from "the broker said no" (exit 1).

``Api.call`` sends one request to the broker that answered last, then to the
others in the order given: a refused or broken connection, a 429 or a 503
moves on to the next broker, and a round over all of them is retried a few
times with a doubling pause (any broker relays a group request to its
coordinator, so any one will do); an ``Api`` given ``retry_timeout_s`` (a
long-running command: ``ring consume --group``) goes on for that long
instead, also while no broker listens, so it rides out a failover or a
restart. A request the caller marks ``repeatable`` (a group's join, poll,
commit or leave: sending it twice does no harm) is tried again after a 504
(outcome unknown) too. Other error answers are raised at once as
the matching ``ring.errors`` class, with the body's fields. Connections are
kept open per broker for the command's lifetime.
"""

from __future__ import annotations

import http.client
import itertools
import ssl
import time
import urllib.parse
from typing import Any, Mapping

import orjson

from ring import errors, limits
from ring.client.transport import BrokersUnavailable, BrokerUnreachable, Reply, error_from

# Rounds over every broker for an answer that says "not now" (503, 429): a
# coordinator moving or a leader being elected settles within a few seconds.
ROUNDS_MAX = 4
ROUND_PAUSE_S = 0.25  # doubled each round: 0.25, 0.5, 1 s
ROUND_PAUSE_S_MAX = 2.0  # with retry_timeout_s: the pause stops doubling here
PROBE_TIMEOUT_S = 2.0  # a broker on a LAN that cannot accept a connection in this is down
_RETRY_STATUSES = frozenset({429, 502, 503})


class Api:
    def __init__(self, urls: list[str], token: str | None = None, *, timeout_s: float | None = None,
                 ca_file: str | None = None, retry_timeout_s: float | None = None) -> None:
        assert urls
        self.urls = list(urls)
        self.headers = {"Accept": "application/json", "User-Agent": "ring-cli"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s or limits.CLIENT_REQUEST_TIMEOUT_S_DEFAULT
        self.ca_file = ca_file
        self.retry_timeout_s = retry_timeout_s  # None: ROUNDS_MAX rounds, fewer if no broker listens
        self._tls: ssl.SSLContext | None = None  # made on the first https:// broker
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._good: str | None = None  # the broker that answered last
        self._deadline: float | None = None  # see within()
        self._request_timeout_s: float | None = None

    def within(self, total_s: float, request_timeout_s: float) -> None:
        """From now on, every call together ends within ``total_s`` (and one request's timeout),
        each request waiting ``request_timeout_s`` at most; a request left unanswered is sent
        again on a fresh connection while time is left."""
        self._deadline = time.monotonic() + total_s
        self._request_timeout_s = request_timeout_s

    def _order(self) -> list[str]:
        return [self._good, *(u for u in self.urls if u != self._good)] if self._good else list(self.urls)

    def _connection(self, url: str, timeout_s: float) -> http.client.HTTPConnection:
        conn = self._conns.get(url)
        if conn is None:
            parts = urllib.parse.urlsplit(url)
            host = parts.hostname or "127.0.0.1"
            if parts.scheme == "https":
                if self._tls is None:
                    from ring import tls

                    self._tls = tls.client_context(self.ca_file)
                conn = http.client.HTTPSConnection(host, parts.port, timeout=timeout_s, context=self._tls)
            else:
                conn = http.client.HTTPConnection(host, parts.port, timeout=timeout_s)
            self._conns[url] = conn
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def send(self, url: str, method: str, path: str, body: bytes | None = None,
             timeout_s: float | None = None) -> Reply:
        """One request to one broker; ``BrokerUnreachable`` when no answer comes."""
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        base = urllib.parse.urlsplit(url).path.rstrip("/")
        conn = self._connection(url, timeout_s or self.timeout_s)
        try:
            conn.request(method, base + path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            self._conns.pop(url, None)
            raise BrokerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}".rstrip(": "),
                                    broker=url) from None
        except BaseException:  # Ctrl-C mid-request: the connection is half used, never to be reused
            conn.close()
            self._conns.pop(url, None)
            raise
        if resp.getheader("Connection", "").lower() == "close":
            conn.close()
            self._conns.pop(url, None)
        return Reply(resp.status, {k: v for k, v in resp.getheaders()}, data, url)

    def call(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, doc: Any = None,
             ok: tuple[int, ...] = (200,), timeout_s: float | None = None, repeatable: bool = False) -> Any:
        """The JSON answer of the first broker that gives a useful one. ``repeatable``: sending the
        request twice does no harm (a group's join, poll, commit or leave), so a 504 (outcome
        unknown) is tried again like a 503 instead of raised."""
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        body = None if doc is None else orjson.dumps(doc)
        if self._deadline is not None:
            left_s = max(self._deadline - time.monotonic(), 0.5)
            self.retry_timeout_s = left_s
            timeout_s = min(timeout_s or self.timeout_s, self._request_timeout_s or left_s, left_s)
        last = "no broker tried"
        reached = False
        started = time.monotonic()
        for attempt in itertools.count():
            if attempt:
                pause_s = self._pause_s(attempt, reached, started)
                if pause_s is None:
                    break
                time.sleep(pause_s)
            for url in self._order():
                try:
                    reply = self.send(url, method, path, body, timeout_s)
                except BrokerUnreachable as exc:
                    last = exc.message
                    continue
                reached = True
                if reply.status in ok:
                    self._good = url
                    return reply.json()
                if reply.status in _RETRY_STATUSES or (repeatable and reply.status == 504):
                    last = f"{url}: {reply.status} {reply.error_doc().get('message', '')}".rstrip()
                    continue
                raise error_from(reply, f"{method} {path}")
        spent = f"{attempt} rounds in {time.monotonic() - started:.1f} s"
        if not reached:
            raise BrokerUnreachable(f"cannot reach any broker ({', '.join(self.urls)}; {spent}); last: {last}")
        raise BrokersUnavailable(f"{method} {path}: no broker could answer ({spent}); last: {last}")

    def _pause_s(self, attempt: int, reached: bool, started: float) -> float | None:
        """The pause before round ``attempt`` (1-based), or None when no round is left."""
        pause_s = ROUND_PAUSE_S * 2 ** (attempt - 1)
        if self.retry_timeout_s is None:  # nobody listening: no point waiting for a round that cannot differ
            return pause_s if reached and attempt < ROUNDS_MAX else None
        left_s = started + self.retry_timeout_s - time.monotonic()
        return min(pause_s, ROUND_PAUSE_S_MAX, left_s) if left_s > 0 else None

    def probe(self) -> str | None:
        """The first broker that answers anything at all (even 401), or None."""
        for url in self._order():
            try:
                self.send(url, "GET", "/v1/status", timeout_s=PROBE_TIMEOUT_S)
            except BrokerUnreachable:
                continue
            self._good = url
            return url
        return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
