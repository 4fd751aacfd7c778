"""A small synchronous HTTP client for Spark's driver, planner and tasks.

Spark runs sparkio code in short-lived Python workers where an event loop
would only add start-up cost, so this is ``http.client`` with one keep-alive
connection per broker. Every request names the brokers to try first (a
partition's replicas when known) and falls back to every other broker it was
given: any broker answers any request in a ring cluster. Connection errors,
timeouts and 5xx/429 answers move on to the next broker; after a full round
the client backs off (doubling, capped) and tries again, until ``failover_s``
has passed (``ring.limits.SPARK_FAILOVER_*``: a minute, which a partition's
failover fits in several times over), and at most ``rounds`` rounds when
given. A 4xx answer is the request's fault, not
the broker's, and is raised at once as the matching ``ring.errors`` class with
the JSON body's fields (``earliest`` on a 416, for example).

Not thread-safe and not picklable on purpose: build one per task from the
URL list, which is what gets pickled.
"""

from __future__ import annotations

import http.client
import itertools
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import msgpack

from ring import errors, limits

CT_JSON = "application/json"
CT_MSGPACK = "application/msgpack"
CT_BATCHES = "application/vnd.ring.batches"
H_NEXT_OFFSET = "Ring-Next-Offset"
H_HIGH_WATERMARK = "Ring-High-Watermark"

_BY_STATUS: dict[int, type[errors.RingError]] = {
    400: errors.BadRequest,
    401: errors.Unauthorized,
    403: errors.Forbidden,
    404: errors.NotFound,
    409: errors.Conflict,
    413: errors.PayloadTooLarge,
    416: errors.OffsetOutOfRange,
}
_BY_CODE: dict[str, type[errors.RingError]] = {
    "unknown_topic": errors.UnknownTopic,
    "unknown_partition": errors.UnknownPartition,
}
# Worth asking another broker (or the same one later): overload and outages.
_RETRYABLE = {429, 500, 502, 503, 504}


class BrokersUnavailable(errors.Unavailable):
    """No broker answered usefully within ``failover_s`` (or the rounds given)."""

    code = "brokers_unavailable"


@dataclass
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str  # the broker that answered

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def header_int(self, name: str) -> int | None:
        value = self.headers.get(name.lower())
        return None if value is None else int(value)


def _error_from(status: int, body: bytes, what: str) -> errors.RingError:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = {"message": body[:200].decode("utf-8", "replace")}
    code = str(doc.get("error", ""))
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = errors.BadRequest if 400 <= status < 500 else errors.Unavailable
    extra = {k: v for k, v in doc.items() if k not in ("error", "message")}
    return cls(f"{what}: {status} {doc.get('message', '')}".rstrip(), status=status, **extra)


class BrokerClient:
    def __init__(
        self,
        urls: Iterable[str],
        *,
        timeout_s: float = limits.SPARK_REQUEST_TIMEOUT_S,
        failover_s: float = limits.SPARK_FAILOVER_S,
        rounds: int | None = None,
        backoff_ms: int = limits.SPARK_FAILOVER_BACKOFF_MS,
    ) -> None:
        self.urls = tuple(dict.fromkeys(urls))
        assert self.urls, "at least one broker URL"
        self.timeout_s = timeout_s
        self.failover_s = failover_s
        self.rounds = rounds
        self.backoff_ms = backoff_ms
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self.failovers = 0  # requests that moved past a broker: for tests and logs

    # --- plumbing -----------------------------------------------------------------

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def __enter__(self) -> "BrokerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        raise TypeError("BrokerClient holds sockets; pickle its urls instead")

    def _conn(self, url: str) -> http.client.HTTPConnection:
        conn = self._conns.get(url)
        if conn is None:
            parts = urllib.parse.urlsplit(url)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname, parts.port, timeout=self.timeout_s)
            self._conns[url] = conn
        return conn

    def _drop(self, url: str) -> None:
        conn = self._conns.pop(url, None)
        if conn is not None:
            conn.close()

    def _once(self, url: str, method: str, target: str, body: bytes | None,
              headers: Mapping[str, str]) -> Response:
        # A keep-alive connection the broker closed while idle fails on first
        # use; one silent reconnect tells that apart from a dead broker.
        for attempt in (0, 1):
            conn = self._conn(url)
            try:
                conn.request(method, target, body=body, headers=dict(headers))
                r = conn.getresponse()
                data = r.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._drop(url)
                if attempt == 1:
                    raise
                continue
            except (OSError, http.client.HTTPException):
                self._drop(url)
                raise
            if r.getheader("Connection", "").lower() == "close":
                self._drop(url)
            return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data, url)
        raise AssertionError("unreachable")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        prefer: Iterable[str] = (),
        ok: Iterable[int] = (200,),
    ) -> Response:
        """Send to the preferred brokers, then the others, until one answers.

        Raises the matching ``ring.errors`` class on a 4xx answer and
        ``BrokersUnavailable`` when every broker failed every round for ``failover_s``.
        """
        target = path
        if query:
            target += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        order = [u for u in dict.fromkeys([*prefer, *self.urls])]
        ok = set(ok)
        last: str = "no broker tried"
        started = time.monotonic()
        for rnd in itertools.count():
            if rnd:
                left_s = started + self.failover_s - time.monotonic()
                if left_s <= 0 or (self.rounds is not None and rnd >= self.rounds):
                    break
                pause_ms = min(self.backoff_ms * 2 ** (rnd - 1), limits.SPARK_FAILOVER_BACKOFF_MS_MAX)
                time.sleep(min(pause_ms / 1000, left_s))  # the last round starts at the deadline
            for url in order:
                try:
                    resp = self._once(url, method, target, body, headers or {})
                except (OSError, http.client.HTTPException) as exc:
                    last = f"{url}: {type(exc).__name__}: {exc}"
                    self.failovers += 1
                    continue
                if resp.status in ok:
                    return resp
                if resp.status in _RETRYABLE:
                    last = f"{url}: {resp.status} {resp.body[:200]!r}"
                    self.failovers += 1
                    continue
                raise _error_from(resp.status, resp.body, f"{method} {url}{path}")
        raise BrokersUnavailable(f"{method} {path}: no broker answered in {rnd} rounds over "
                                 f"{time.monotonic() - started:.1f} s; last: {last}")

    def _json(self, method: str, path: str, doc: Any = None, **kw: Any) -> Any:
        body = None if doc is None else json.dumps(doc).encode()
        headers = {"Accept": CT_JSON}
        if body is not None:
            headers["Content-Type"] = CT_JSON
        return self.request(method, path, body=body, headers=headers, **kw).json()

    # --- the API sparkio uses -----------------------------------------------------

    def list_topics(self) -> list[str]:
        doc = self._json("GET", "/v1/topics")
        return sorted(t["name"] if isinstance(t, dict) else str(t) for t in doc.get("topics", []))

    def describe_topic(self, topic: str, prefer: Iterable[str] = ()) -> dict[str, Any]:
        return self._json("GET", f"/v1/topics/{_quote(topic)}", prefer=prefer)

    def create_topic(self, topic: str, partitions: int | None = None, **config: Any) -> dict[str, Any]:
        doc = {"name": topic, **config}
        if partitions is not None:
            doc["partitions"] = partitions
        return self._json("POST", "/v1/topics", doc, ok=(200, 201))

    def cluster(self) -> list[dict[str, Any]] | None:
        """The cluster's brokers, or None if this broker does not serve /v1/cluster."""
        try:
            doc = self._json("GET", "/v1/cluster")
        except errors.NotFound:
            return None
        return list(doc.get("brokers", [])) if isinstance(doc, dict) else None

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int,
                             prefer: Iterable[str] = ()) -> int | None:
        doc = self._json("GET", f"/v1/topics/{_quote(topic)}/partitions/{partition}/offsets",
                         query={"timestamp": timestamp_ms}, prefer=prefer)
        return doc.get("offset")

    def ranges(self, topic: str, partition: int) -> dict[str, Any]:
        """``GET .../ranges``: where the partition's ranges live (offsets below its replicas' local tails)."""
        return self._json("GET", f"/v1/topics/{_quote(topic)}/partitions/{partition}/ranges")

    def truncate(self, topic: str, partition: int, before_offset: int) -> dict[str, Any]:
        return self._json("POST", f"/v1/topics/{_quote(topic)}/partitions/{partition}/truncate",
                          {"before_offset": before_offset})

    def fetch(self, topic: str, partition: int, offset: int, *, max_bytes: int,
              max_records: int = limits.FETCH_RECORDS_MAX, wait_ms: int = 0,
              prefer: Iterable[str] = ()) -> Response:
        """Stored batches from ``offset`` (the first may start below it)."""
        return self.request(
            "GET", f"/v1/topics/{_quote(topic)}/partitions/{partition}/messages",
            query={"offset": offset, "max_bytes": max_bytes, "max_records": max_records, "wait_ms": wait_ms},
            headers={"Accept": f"{CT_BATCHES}, {CT_MSGPACK};q=0.5"}, prefer=prefer,
        )

    def produce(self, topic: str, records: list[dict[str, Any]], partition: int | None = None) -> list[dict]:
        """Send msgpack records ``{"value", "key"?, "headers"?, "timestamp"?}``;
        returns one ``{"partition", "base_offset", "count"}`` per partition written."""
        body = msgpack.packb(records, use_bin_type=True)
        doc = self.request(
            "POST", f"/v1/topics/{_quote(topic)}/messages", query={"partition": partition},
            body=body, headers={"Content-Type": CT_MSGPACK, "Accept": CT_JSON},
        ).json()
        return doc["results"] if "results" in doc else [doc]


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")
