"""Every request one broker makes to another, through one client: ``PeerClient``.

The client holds two sessions from ``make_session``: a control session for
the small messages failover rides on (gossip, votes, transfers, repair's
checksums and resyncs), so they never queue behind forwarded produces, and a
data session for forwarded produces, proxied reads, relays to another
broker's client port and replication links. A request hook stamps every
request with the cluster secret, this broker's name (``Ring-Broker``) and,
when it is made while serving a client, that client's identity
(``Ring-Principal``, from ``auth.CURRENT``), so the other broker acts for the
same client without seeing its token. With TLS both connect with
``TlsConfig.outgoing_context`` (the peer CA checks the other broker and our
certificate is shown).

Errors are mapped here, once:

* control requests (``call``) answer the body of a 2xx, or None when the
  peer is unknown, unreachable, slow past the call's timeout or answers
  otherwise: the protocol cores treat a missing answer as a lost message;
* a forwarded produce (``POST /peer/v1/produce``) or a client-port request
  answered with an error raises it again with its status, code and fields
  (``Relayed``), so the client sees what the other broker said; a connection
  that fails before the request was sent is a 503 (nothing happened), one
  that fails after is a 504 for a produce (the leader may have appended: the
  outcome is unknown). At most ``FORWARDS_IN_FLIGHT_MAX`` produces are
  forwarded at once; beyond that a client gets 429 and retries.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, Callable

import aiohttp
import orjson

from ring import auth, limits
from ring.cluster import forwards
from ring.cluster.forwards import Answer, ForwardLinks
from ring.errors import Overloaded, RequestTimeout, RingError, Unavailable
from ring.produce import Produce
from ring.tls import PLAINTEXT, TlsConfig

log = logging.getLogger("ring.cluster")

H_SECRET = "Ring-Cluster-Secret"  # every peer request: the shared cluster secret
H_BROKER = "Ring-Broker"  # every peer request: the sending broker's name
H_PRINCIPAL = "Ring-Principal"
H_HIGH_WATERMARK = "Ring-High-Watermark"
# A gossip exchange's answer: the answering broker's wall clock, ms since the epoch (its sender
# measures the clock offset between them: ring.gossip.clocks). A header, so that a broker of a
# version without it gossips as before.
H_WALL_MS = "Ring-Wall-Ms"
CT_BATCH = "application/vnd.ring.batch"
CT_BATCHES = "application/vnd.ring.batches"
CT_MSGPACK = "application/msgpack"
# Control answers (gossip, votes, checksums) are read up to this many bytes.
CONTROL_ANSWER_BYTES_MAX = limits.GOSSIP_MESSAGE_BYTES_MAX + 1
# Connections of the control session: one exchange per peer at a time, a few votes beside.
CONTROL_CONNECTIONS_MAX = 32


class Relayed(RingError):
    """An error answer from another broker, passed on as it was."""

    def __init__(self, status: int, body: dict[str, Any], retry_after: str | None) -> None:
        extra = {k: v for k, v in body.items() if k not in ("error", "message")}
        super().__init__(str(body.get("message", "error from a peer")), **extra)
        self.status = status
        self.code = str(body.get("error", "internal"))
        if retry_after is not None and retry_after.isdigit():
            self.retry_after_s = float(retry_after)


async def _raise_for(resp: aiohttp.ClientResponse, who: str) -> None:
    if resp.status < 300:
        return
    raw = await resp.content.read(limits.ADMIN_BODY_BYTES_MAX)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        body = {"error": "internal", "message": f"{who} answered {resp.status}"}
    raise Relayed(resp.status, body, resp.headers.get("Retry-After"))


def answer_json(answer: Answer, who: str) -> Any:
    """The JSON of a forward link's 2xx answer; the leader's error raised as it was otherwise."""
    status, raw, retry_after = answer
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if status < 300 and body is not None:
        return body
    if not isinstance(body, dict):
        body = {"error": "internal", "message": f"{who} answered {status}"}
    raise Relayed(status, body, retry_after)


def make_session(secret: str | None, tls: TlsConfig = PLAINTEXT, timeout_s: float = limits.PEER_REQUEST_TIMEOUT_S,
                 connections_max: int = limits.PEER_CONNECTIONS_MAX, name: str | None = None) -> aiohttp.ClientSession:
    """A session for talking to other brokers (either port); see the module's docstring."""

    async def stamp(_session: aiohttp.ClientSession, _ctx: SimpleNamespace,
                    params: aiohttp.TraceRequestStartParams) -> None:
        headers = params.headers  # the very headers the request is about to send
        if H_SECRET not in headers:
            headers[H_SECRET] = secret or ""
        if name is not None and H_BROKER not in headers:
            headers[H_BROKER] = name
        principal = auth.current()
        if principal is not None and H_PRINCIPAL not in headers:
            headers[H_PRINCIPAL] = principal.to_header()

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(stamp)
    ssl_context = tls.outgoing_context()
    connector = aiohttp.TCPConnector(limit=connections_max, ssl=ssl_context if ssl_context is not None else True)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                 trace_configs=[trace])


class PeerClient:
    """See the module's docstring. ``peer_url`` maps a broker's name to its peer port's URL."""

    def __init__(self, name: str, secret: str | None, session: aiohttp.ClientSession | None = None,
                 tls: TlsConfig = PLAINTEXT, peer_url: Callable[[str], str | None] = lambda name: None,
                 monotonic: Callable[[], float] = lambda: 0.0) -> None:
        self.name = name
        self.scheme = tls.scheme
        self.peer_url = peer_url
        self.session = session if session is not None else make_session(secret, tls, name=name)
        self.control = make_session(secret, tls, limits.GOSSIP_REQUEST_TIMEOUT_S, CONTROL_CONNECTIONS_MAX, name)
        self.links = ForwardLinks(self.session, monotonic)
        self.forwards_in_flight = 0
        self.forwards = 0  # produces forwarded to their leader since start (GET /v1/status)

    async def close(self) -> None:
        await self.links.close()
        await self.control.close()
        await self.session.close()

    # --- control messages ---------------------------------------------------------------

    async def call(self, peer: str, path: str, body: bytes = b"", params: dict[str, str] | None = None,
                   method: str = "POST", timeout_s: float = limits.VOTE_REQUEST_TIMEOUT_S) -> bytes | None:
        """A control request to broker ``peer``'s peer port: the answer's body, or None (see the module)."""
        url = self.peer_url(peer)
        return None if url is None else (await self.call_url(url, path, body, params, method, timeout_s))[0]

    async def call_url(self, url: str, path: str, body: bytes = b"", params: dict[str, str] | None = None,
                       method: str = "POST", timeout_s: float = limits.VOTE_REQUEST_TIMEOUT_S,
                       answer_header: str | None = None) -> tuple[bytes | None, str | None]:
        """A control request to ``url``: the answer's body (None, see the module), and the answer's
        ``answer_header``."""
        headers = {"Content-Type": CT_MSGPACK} if body else None
        try:
            async with self.control.request(method, url + path, data=body or None, params=params, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                raw = await resp.content.read(CONTROL_ANSWER_BYTES_MAX)
                if resp.status >= 300:
                    log.debug("%s%s answered %d: %s", url, path, resp.status, raw[:200])
                    return None, None
                return raw, resp.headers.get(answer_header) if answer_header else None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("%s%s: %r", url, path, exc)
            return None, None

    def addr_url(self, addr: str) -> str:
        """The URL of a peer port known only by its address (gossip's seeds)."""
        return f"{self.scheme}://{addr}"

    # --- replication links ---------------------------------------------------------------

    def ws_connect(self, url: str, path: str, protocols: tuple[str, ...]) -> Any:
        """A replication link's websocket (an async context manager), offering ``protocols``."""
        return self.session.ws_connect(url + path, heartbeat=limits.REPLICATION_HEARTBEAT_S,
                                       max_msg_size=limits.REPLICATION_MESSAGE_BYTES_MAX, protocols=protocols)

    # --- on a client's behalf ------------------------------------------------------------

    def forward(self, leader: str, peer_url: str, req: Produce, partition: int,
                batches: list[bytearray]) -> asyncio.Future[Answer | dict[str, Any]]:
        """A produce sent on to ``leader``, its partition's leader, at ``peer_url``: the future of its
        answer, which the caller bounds. Sent at once on the open forward link (an ``Answer``), else
        by a task that opens one, or posts it when none can be (the leader's JSON document). With
        ``FORWARDS_IN_FLIGHT_MAX`` in flight already, a future failed with ``Overloaded``: nothing sent."""
        if self.forwards_in_flight >= limits.FORWARDS_IN_FLIGHT_MAX:
            refused: asyncio.Future = asyncio.get_running_loop().create_future()
            refused.set_exception(Overloaded(f"{self.forwards_in_flight} produces are being forwarded to leaders "
                                             "already; retry later", topic=req.topic, partition=partition))
            return refused
        self.forwards_in_flight += 1
        self.forwards += 1
        link = self.links.open_link(peer_url)
        if link is not None:
            sent = link.send(req, partition, b"".join(batches))
        else:
            sent = asyncio.ensure_future(self._forward_produce(leader, peer_url, req, partition, batches))
        sent.add_done_callback(self._forward_done)
        return sent

    def _forward_done(self, _answer: asyncio.Future) -> None:
        self.forwards_in_flight -= 1

    async def _forward_produce(self, leader: str, peer_url: str, req: Produce, partition: int,
                               batches: list[bytearray]) -> Answer | dict[str, Any]:
        body = b"".join(batches)
        answer = await self.links.call(peer_url, req, partition, body)
        if answer is not None:
            return answer
        params, topic = forwards.query(req, partition), req.topic
        try:
            async with self.session.post(f"{peer_url}/peer/v1/produce", params=params,
                                         headers={"Content-Type": CT_BATCH}, data=body) as resp:
                await _raise_for(resp, leader)
                return orjson.loads(await resp.read())
        except aiohttp.ClientConnectorError as exc:
            raise Unavailable(f"leader {leader} of {topic}/{partition} is unreachable: {exc}",
                              topic=topic, partition=partition, leader=leader) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RequestTimeout(
                f"forwarding to leader {leader} of {topic}/{partition} failed ({exc!r}); the outcome is unknown",
                topic=topic, partition=partition, leader=leader) from None

    async def fetch(self, url: str, topic: str, partition: int, offset: int | None, max_bytes: int,
                    wait_ms: int) -> tuple[bytes, int]:
        """Stored batches and the high watermark from the broker at ``url`` (a replica)."""
        params = {"max_bytes": str(max_bytes), "wait_ms": str(wait_ms)}
        if offset is not None:
            params["offset"] = str(offset)
        try:
            async with self.session.get(f"{url}/v1/topics/{topic}/partitions/{partition}/messages",
                                        params=params, headers={"Accept": CT_BATCHES}) as resp:
                await _raise_for(resp, url)
                return await resp.read(), int(resp.headers.get(H_HIGH_WATERMARK, "0"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise Unavailable(f"replica at {url} of {topic}/{partition} did not answer: {exc!r}",
                              topic=topic, partition=partition) from None

    async def request(self, method: str, peer: str, path: str, *, params: dict[str, str] | None = None,
                      body: bytes | None = None, timeout_s: float = limits.PEER_REQUEST_TIMEOUT_S) -> bytes:
        """A request to broker ``peer``'s peer port: the answer's body, its error answer raised as it
        was (``Relayed``), no answer as ``Unavailable``."""
        url = self.peer_url(peer)
        if url is None:
            raise Unavailable(f"{peer} is not known")
        try:
            async with self.session.request(method, url + path, params=params, data=body,
                                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await _raise_for(resp, peer)
                return await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"{peer} did not answer {method} {path}: {exc!r}") from None

    async def json(self, method: str, url: str, path: str, params: dict[str, str] | None = None,
                   body: Any = None) -> Any:
        """A client-API request to another broker, its JSON answer or its error raised."""
        try:
            async with self.session.request(method, url + path, params=params,
                                            data=None if body is None else orjson.dumps(body),
                                            headers={"Content-Type": "application/json"}) as resp:
                await _raise_for(resp, url)
                return orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"broker at {url} did not answer: {exc!r}") from None
