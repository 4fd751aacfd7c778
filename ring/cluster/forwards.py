"""Forwarded produces on one standing link per leader: ``ForwardLinks``.

A broker that takes a produce for a partition another broker leads sends it
there. An HTTP request per produce costs more than the produce itself (a
client request through aiohttp's session, a second request parsed on the
leader), so forwards travel on a websocket to the leader's peer port
(``GET /peer/v1/forward``, subprotocol ``ring-forward.2``) that stays open
and carries many produces at once. Each websocket message is a msgpack list
of items, gathered during one event-loop turn and sent on the next
(``Outbox``: one message and one write for all the produces, or answers, of
a turn):

* a request item ``[id, topic, partition, consistency, batches]`` (the
  framed, unstamped batches as one byte string), followed by a map of the
  produce's options (``ring.produce.OPTIONS``, such as ``timeout_ms``) when
  it sets any;
* an answer item ``[id, status, body, retry_after]``: the status and JSON
  body the HTTP route ``POST /peer/v1/produce`` would answer, and its
  Retry-After (or nil).

Answers come back in any order, matched by id. A link that closes with
produces in flight fails them as 504 (the leader may have appended: the
outcome is unknown); a link that cannot be opened is a 503 (nothing was
sent). A leader that does not serve the link, or serves another version of
it (an older release: its handshake is refused, or names no subprotocol of
ours; ``ring-forward.1``'s items carry no options and its leaders refuse a
sixth field), is asked over HTTP instead, the options as one JSON query
parameter, and the link is tried again after
``limits.FORWARD_LINK_RETRY_S``. The codec is pure; the links
and outboxes are the only I/O here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping, Optional

import aiohttp
import msgpack
import orjson

from ring import limits, produce
from ring.catalog import validate_topic_name
from ring.errors import BadRequest, RequestTimeout, Unavailable
from ring.produce import Batches, Produce
from ring.replication import protocol

log = logging.getLogger("ring.cluster")

PATH = "/peer/v1/forward"
PROTOCOL = "ring-forward.2"  # .2: a request item may end with a map of the produce's options
# A message's items are flushed before their bodies pass a produce request's bound, so one message
# holds at most that plus the items' own few fields (bounded by FORWARDS_IN_FLIGHT_MAX items).
ITEM_BYTES = 64  # a request or answer item's fields besides its body and topic, packed
MESSAGE_BYTES_MAX = limits.REQUEST_BYTES_MAX + limits.FORWARDS_IN_FLIGHT_MAX * (ITEM_BYTES + 256)
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Forward:
    """One forwarded produce as the leader reads it off the link (or the query of ``POST
    /peer/v1/produce``, ``from_query``; its id is then 0), not yet validated."""

    id: int
    topic: str | None
    partition: int
    consistency: str | None
    body: bytes
    options: object = None  # a map of option name to value (checked by ``request``)

    @classmethod
    def from_query(cls, query: Mapping[str, str], partition: int, body: bytes) -> Forward:
        raw = query.get("options")
        try:
            options = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            raise BadRequest("options must be a JSON map of a produce's options", parameter="options") from None
        return cls(0, query.get("topic"), partition, query.get("consistency"), body, options)

    def request(self, split: Callable[[bytes], Batches]) -> Produce:
        """The produce, validated (BadRequest otherwise, answering this item alone), its body taken
        apart by ``split``."""
        name = validate_topic_name(self.topic)
        if not 0 <= self.partition <= _INT32_MAX:
            raise BadRequest(f"partition {self.partition} is out of range")
        level = protocol.parse_consistency(self.consistency)
        return produce.with_options(Produce(name, split(self.body), self.partition, None, level), self.options)


def request_item(rid: int, req: Produce, partition: int, body: bytes) -> list:
    """``req``'s batches for ``partition`` (``body``), as a link's request item."""
    item = [rid, req.topic, partition, req.consistency, body]
    options = produce.options(req)
    if options:
        item.append(options)
    return item


def query(req: Produce, partition: int) -> dict[str, str]:
    """``req`` for ``partition`` as the query of ``POST /peer/v1/produce`` (a leader that serves no link)."""
    params = {"topic": req.topic, "partition": str(partition), "consistency": req.consistency}
    options = produce.options(req)
    if options:
        params["options"] = orjson.dumps(options).decode()
    return params


def decode_requests(data: bytes) -> list[Forward]:
    """A message's request items; BadRequest when it is not one (the link is then closed: it has no id
    to answer)."""
    try:
        items = msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRequest(f"not a forward message: {exc}") from None
    if not isinstance(items, list) or len(items) > limits.FORWARDS_IN_FLIGHT_MAX:
        raise BadRequest(f"a forward message is a list of at most {limits.FORWARDS_IN_FLIGHT_MAX} items")
    out = []
    for item in items:
        if not (isinstance(item, list) and 5 <= len(item) <= 6):
            raise BadRequest("a forward item has five fields, or six with the produce's options")
        rid, topic, partition, consistency, body = item[:5]
        if not (isinstance(rid, int) and isinstance(topic, str) and isinstance(partition, int)
                and isinstance(consistency, str) and isinstance(body, bytes)):
            raise BadRequest("a forward item's fields have the wrong types")
        out.append(Forward(rid, topic, partition, consistency, body, item[5] if len(item) == 6 else None))
    return out


def answer_item(rid: int, status: int, body: bytes, retry_after: str | None) -> list:
    return [rid, status, body, retry_after]


def decode_answers(data: bytes) -> list[tuple[int, int, bytes, str | None]]:
    items = msgpack.unpackb(data, raw=False)
    if not isinstance(items, list):
        raise ValueError("a forward answer message is a list")
    out = []
    for rid, status, body, retry_after in items:
        if not (isinstance(rid, int) and isinstance(status, int) and isinstance(body, bytes)):
            raise ValueError("a forward answer's fields have the wrong types")
        out.append((rid, status, body, retry_after if isinstance(retry_after, str) else None))
    return out


class Outbox:
    """Items added during one loop turn, sent as one message on the next (sooner when their bodies
    reach a produce request's bound). ``send`` sends a message; ``lost`` is told the items of a
    message that could not be sent, with why."""

    def __init__(self, send: Callable[[bytes], Awaitable[None]], lost: Callable[[list, BaseException], None]) -> None:
        self.send = send
        self.lost = lost
        self.items: list | None = None
        self.size = 0

    def add(self, item: list, size: int) -> None:
        size += ITEM_BYTES
        if self.items is not None and self.size + size > limits.REQUEST_BYTES_MAX:
            self.flush()
        if self.items is None:
            self.items, self.size = [], 0
            asyncio.get_running_loop().call_soon(self.flush)
        self.items.append(item)
        self.size += size

    def flush(self) -> None:
        items, self.items = self.items, None
        if items:
            asyncio.ensure_future(self._send(items))

    async def _send(self, items: list) -> None:
        try:
            await self.send(msgpack.packb(items, use_bin_type=True))
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            self.lost(items, exc)


Answer = tuple[int, bytes, Optional[str]]  # status, JSON body, Retry-After


class _Link:
    """One open websocket to one leader and the produces waiting on it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, url: str) -> None:
        self.ws = ws
        self.url = url
        self.pending: dict[int, asyncio.Future[Answer]] = {}
        self.next_id = 0
        self.outbox = Outbox(ws.send_bytes, self._lost)
        self.reader = asyncio.ensure_future(self._read())

    @property
    def open(self) -> bool:
        return not self.ws.closed and not self.reader.done()

    def send(self, req: Produce, partition: int, body: bytes) -> asyncio.Future[Answer]:
        """The leader's answer to come, once this turn's message is sent: cancelling it (the caller bounds
        it, ring.cluster.routing) forgets the produce, whose outcome is then unknown."""
        rid = self.next_id = self.next_id + 1
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.pending[rid] = answer
        answer.add_done_callback(lambda _a: self.pending.pop(rid, None))
        self.outbox.add(request_item(rid, req, partition, body), len(body) + len(req.topic))
        return answer

    def _lost(self, items: list, exc: BaseException) -> None:
        for item in items:
            waiter = self.pending.get(item[0])
            if waiter is not None and not waiter.done():
                waiter.set_exception(RequestTimeout(
                    f"the link to {self.url} broke while sending a produce ({exc!r}); the outcome is unknown",
                    topic=item[1], partition=item[2]))

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                try:
                    answers = decode_answers(msg.data)
                except (ValueError, TypeError, msgpack.UnpackException) as exc:
                    log.warning("closing the forward link to %s: a malformed answer (%r)", self.url, exc)
                    break
                for rid, status, body, retry_after in answers:
                    waiter = self.pending.get(rid)
                    if waiter is not None and not waiter.done():
                        waiter.set_result((status, body, retry_after))
        except (aiohttp.ClientError, ConnectionError) as exc:
            log.debug("forward link to %s: %r", self.url, exc)
        finally:
            await self.ws.close()
            for waiter in list(self.pending.values()):
                if not waiter.done():
                    waiter.set_exception(RequestTimeout(
                        f"the link to the leader at {self.url} closed with the produce in flight; the outcome "
                        "is unknown"))

    async def close(self) -> None:
        self.reader.cancel()
        await self.ws.close()


class ForwardLinks:
    """One link per leader URL, opened on first use; see the module's docstring."""

    def __init__(self, session: aiohttp.ClientSession, monotonic: Callable[[], float]) -> None:
        self.session = session
        self.monotonic = monotonic
        self.links: dict[str, _Link] = {}
        self.opening: dict[str, asyncio.Future[_Link | None]] = {}
        self.refused_until: dict[str, float] = {}

    async def call(self, url: str, req: Produce, partition: int, body: bytes) -> Answer | None:
        """The leader's answer, or None when the leader at ``url`` serves no link (ask it over HTTP). It
        waits as long as the link is open: the caller bounds it (cancelling it is safe)."""
        link = self.links.get(url)
        if link is None or not link.open:
            link = await self._open(url, req.topic, partition)
            if link is None:
                return None
        return await link.send(req, partition, body)

    def open_link(self, url: str) -> _Link | None:
        """The open link to the leader at ``url``, if there is one (``call`` opens one)."""
        link = self.links.get(url)
        return link if link is not None and link.open else None

    async def _open(self, url: str, topic: str, partition: int) -> _Link | None:
        if self.refused_until.get(url, 0.0) > self.monotonic():
            return None
        opening = self.opening.get(url)
        if opening is None:  # the first caller opens it; the others wait for the same handshake
            opening = self.opening[url] = asyncio.ensure_future(self._connect(url))
            opening.add_done_callback(lambda _f: self.opening.pop(url, None))
        try:
            return await asyncio.shield(opening)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unavailable(f"the leader at {url} of {topic}/{partition} is unreachable: {exc!r}",
                              topic=topic, partition=partition) from None

    async def _connect(self, url: str) -> _Link | None:
        try:
            ws = await self.session.ws_connect(url + PATH, protocols=(PROTOCOL,), max_msg_size=MESSAGE_BYTES_MAX,
                                               heartbeat=limits.REPLICATION_HEARTBEAT_S)
        except aiohttp.WSServerHandshakeError as exc:
            log.info("the broker at %s serves no forward link (%s); forwarding to it over HTTP", url, exc.status)
            self.refused_until[url] = self.monotonic() + limits.FORWARD_LINK_RETRY_S
            return None
        if ws.protocol != PROTOCOL:
            await ws.close()
            self.refused_until[url] = self.monotonic() + limits.FORWARD_LINK_RETRY_S
            return None
        old = self.links.pop(url, None)
        if old is not None:
            await old.close()
        link = self.links[url] = _Link(ws, url)
        return link

    def open(self) -> int:
        """How many links are open (``/v1/status``'s ``forward_links``)."""
        return sum(link.open for link in self.links.values())

    async def close(self) -> None:
        for link in list(self.links.values()):
            await link.close()
        self.links.clear()

