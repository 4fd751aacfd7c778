"""HTTP to brokers for the client: one aiohttp session, answers as values, and
the rule that says which failures are worth another try.

``Transport.request`` sends one request to one broker URL and returns a
``Reply`` whatever the status; a connection that cannot be made or breaks
raises ``BrokerUnreachable``, whose ``maybe_sent`` says whether the broker
may have received the request (a connection that broke after it was made,
or a timeout) or certainly did not (refused, or not connected in time). ``classify`` decides, from a status and the
``error`` code of a JSON error body, whether to retry (elsewhere or later),
to give up, or to report that the outcome is unknown; ``retry_after_s`` how
long a refusal asked the client to wait before asking again. ``error_from`` turns an
error answer into the matching ``ring.errors`` class with the body's fields
(``earliest`` on a 416, ``alive``/``needed`` on a 503 ...).

``make_session`` takes the security options: ``token`` is sent as
``Authorization: Bearer`` on every request, and ``https://`` broker URLs are
checked against ``ca_file`` (a private CA's PEM) or else the system's CAs
(which ``SSL_CERT_FILE`` can also point at a file).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping

import aiohttp
import orjson

from ring import errors, limits, tls

CT_JSON = "application/json"
CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
H_NEXT_OFFSET = "Ring-Next-Offset"
H_HIGH_WATERMARK = "Ring-High-Watermark"
H_RETRY_AFTER = "Retry-After"

RETRY = "retry"  # the broker could not do it now: refresh topology, back off, try again
FATAL = "fatal"  # the request itself is wrong, or the broker refused it for good
UNKNOWN = "unknown"  # the broker may or may not have done it (504)

# Overload, outage, not enough replicas, and a leader that moved ("not leader"
# style answers, whatever status a broker gives them).
_RETRY_STATUSES = frozenset({421, 429, 502, 503})
_RETRY_CODES = frozenset({"not_leader", "leader_not_available", "not_enough_replicas", "unavailable",
                          "overloaded", "shutting_down", "stale_epoch"})

# Failures that happen before a connection exists: the request certainly did not reach the broker.
# (aiohttp before 3.10 has no ConnectionTimeoutError: a connect timeout then counts as "maybe sent".)
_NOT_CONNECTED = (aiohttp.ClientConnectorError, getattr(aiohttp, "ConnectionTimeoutError", aiohttp.ClientConnectorError))

_BY_STATUS: dict[int, type[errors.RingError]] = {
    400: errors.BadRequest, 401: errors.Unauthorized, 403: errors.Forbidden, 404: errors.NotFound,
    408: errors.BodyTimeout, 409: errors.Conflict, 413: errors.PayloadTooLarge,
    415: errors.UnsupportedMediaType, 416: errors.OffsetOutOfRange, 429: errors.Overloaded,
    500: errors.RingError, 504: errors.RequestTimeout,
}
_BY_CODE: dict[str, type[errors.RingError]] = {
    "unknown_topic": errors.UnknownTopic, "unknown_partition": errors.UnknownPartition,
    "invalid_topic_name": errors.InvalidTopicName, "corrupt_batch": errors.CorruptBatch,
    "not_enough_replicas": errors.NotEnoughReplicas, "storage_error": errors.StorageError,
    "topic_recreated": errors.TopicRecreated, "quota_exceeded": errors.QuotaExceeded,
}


class BrokerUnreachable(errors.Unavailable):
    """No answer from a broker: refused, reset, or timed out. ``maybe_sent``: the broker may have
    received the request (and done it); False when no connection was made."""

    code = "broker_unreachable"

    def __init__(self, message: str, maybe_sent: bool = True, **extra: Any) -> None:
        super().__init__(message, **extra)
        self.maybe_sent = maybe_sent


class ClientClosed(errors.Unavailable):
    """The client was closed: nothing more can be produced, fetched or asked through it."""

    code = "client_closed"


class BrokersUnavailable(errors.Unavailable):
    """Retries ran out: no broker did what was asked."""

    code = "brokers_unavailable"


class OutcomeUnknown(errors.RequestTimeout):
    """The records may be stored or not: a broker answered 504, or the connection broke after the
    request was sent, and the client could not settle it by an idempotent retry (idempotence off,
    or the delivery timeout ran out). ``extra["partition"]`` is where they may be."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes
    url: str  # the broker that answered

    def json(self) -> Any:
        return orjson.loads(self.body) if self.body else None

    def error_doc(self) -> dict[str, Any]:
        try:
            doc = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict):
            doc = {"message": self.body[:200].decode("utf-8", "replace")}
        return doc


def classify(status: int, code: str) -> str:
    if status == 504:
        return UNKNOWN
    if status in _RETRY_STATUSES or code in _RETRY_CODES:
        return RETRY
    return FATAL


def retry_after_s(reply: Reply) -> float:
    """Seconds a 429 asked the client to wait before asking again: the larger of its ``Retry-After``
    (in seconds, as ring's brokers send it) and its body's ``retry_after_ms``, 0 without either. A 429 is a refusal for load or for the token's quota, and
    says how long: asked sooner, the broker would refuse again. A 503's Retry-After is a generic second
    (a leader moving, too few replicas, a broker starting) that the client's own pause, following the
    leader through its metadata, already covers."""
    if reply.status != 429:
        return 0.0
    raw = reply.headers.get(H_RETRY_AFTER)
    try:
        header_s = float(raw) if raw is not None else 0.0
    except ValueError:  # an HTTP date: no broker of ring sends one
        header_s = 0.0
    body_ms = reply.error_doc().get("retry_after_ms")  # a quota's refusal: the header rounded up to seconds
    body_s = body_ms / 1000 if isinstance(body_ms, (int, float)) and not isinstance(body_ms, bool) else 0.0
    wait_s = max(w for w in (header_s, body_s) if w == w)  # the larger of the two, NaN left out
    return wait_s if 0 < wait_s < float("inf") else 0.0


def error_from(reply: Reply, what: str) -> errors.RingError:
    doc = reply.error_doc()
    code = str(doc.get("error", ""))
    if reply.status == 504:
        cls: type[errors.RingError] = OutcomeUnknown
    else:
        cls = _BY_CODE.get(code) or _BY_STATUS.get(reply.status) or (
            errors.BadRequest if 400 <= reply.status < 500 else errors.Unavailable)
    extra = {k: v for k, v in doc.items() if k not in ("error", "message")}
    extra.setdefault("status", reply.status)
    extra["broker"] = reply.url
    message = f"{what}: {reply.status} {doc.get('message', '')}".rstrip()
    if cls is errors.QuotaExceeded:  # the wait is its own argument (and goes back into the extras)
        extra.pop("retry_after_ms", None)
        return errors.QuotaExceeded(message, retry_after_s(reply) or errors.Overloaded.retry_after_s, **extra)
    return cls(message, **extra)


def gave_up(message: str, last: errors.RingError | None, **extra: Any) -> errors.RingError:
    """What a call raises when its retries or its deadline run out: when its last attempt was refused
    for load (``Overloaded``) or for the token's quota (``QuotaExceeded``), a 429, that error, for the
    brokers are up and asked for less, which an application answers by sending less, not as an outage;
    ``BrokersUnavailable`` otherwise. ``message`` says what was tried and how long."""
    if isinstance(last, errors.QuotaExceeded):
        return errors.QuotaExceeded(message, last.retry_after_s, **extra)
    if isinstance(last, errors.Overloaded):
        return errors.Overloaded(message, **extra)
    return BrokersUnavailable(message, **extra)


def make_session(connections_max: int = limits.CLIENT_CONNECTIONS_MAX, *, token: str | None = None,
                 ca_file: str | None = None) -> aiohttp.ClientSession:
    ssl_context = tls.client_context(ca_file) if ca_file else True  # True: the system's CAs for https
    connector = aiohttp.TCPConnector(limit=connections_max, limit_per_host=0, ttl_dns_cache=300,
                                     keepalive_timeout=limits.KEEPALIVE_TIMEOUT_S / 2, ssl=ssl_context)
    # Half the broker's keep-alive: the client closes an idle connection before
    # the broker does, so a request never lands on a socket being closed.
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return aiohttp.ClientSession(connector=connector, auto_decompress=False, headers=headers,
                                 json_serialize=lambda o: orjson.dumps(o).decode())


class Transport:
    def __init__(self, session: aiohttp.ClientSession, timeout_s: float) -> None:
        self.session = session
        self.timeout_s = timeout_s
        self.requests = 0  # for stats and tests

    async def request(self, method: str, url: str, path: str, *, params: Mapping[str, Any] | None = None,
                      body: bytes | None = None, headers: Mapping[str, str] | None = None,
                      timeout_s: float | None = None, answer_timeout_s: float | None = None) -> Reply:
        """``answer_timeout_s``: give up when no byte of the answer came this long after the request was
        sent (a broker that stopped keeps its connection open)."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s,
                                        sock_connect=limits.CLIENT_CONNECT_TIMEOUT_S, sock_read=answer_timeout_s)
        self.requests += 1
        try:
            async with self.session.request(method, url + path, params=params, data=body,
                                            headers=headers, timeout=timeout) as resp:
                data = await resp.read()
                return Reply(resp.status, resp.headers, data, url)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            not_sent = isinstance(exc, _NOT_CONNECTED)
            raise BrokerUnreachable(f"{method} {url}{path}: {type(exc).__name__}: {exc}".rstrip(": "),
                                    maybe_sent=not not_sent, broker=url) from None

    async def json(self, method: str, url: str, path: str, doc: Any = None, **kw: Any) -> Reply:
        headers = {"Accept": CT_JSON}
        body = None
        if doc is not None:
            body = orjson.dumps(doc)
            headers["Content-Type"] = CT_JSON
        return await self.request(method, url, path, body=body, headers=headers, **kw)
