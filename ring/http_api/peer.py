"""The peer API: what brokers say to each other, on their own port, behind the cluster secret.

Every route requires the ``Ring-Cluster-Secret`` header, compared in
constant time with the secret this broker was given; a request without it,
or with another one, is answered 401 before its handler runs, so it changes
nothing. A broker given no secret refuses every peer request (it is a
broker alone). Routes:

* ``POST /peer/v1/gossip``: a msgpack gossip message (SYN, ACK or ACK2); the
  answer, if any, is the response body, and ``Ring-Wall-Ms`` this broker's
  wall clock (the sender measures the offset between their clocks).
* ``GET /peer/v1/replicate``: the websocket a partition leader streams
  batches on (``ring.replication``); ``Ring-Broker`` names the leader, and
  the link offers replication protocol versions as subprotocols, highest first; the first this broker
  speaks is the link's (``ring.replication.versions``; none: 400).
* ``POST /peer/v1/produce?topic=&partition=&consistency=``: a produce
  forwarded by another broker; the body is the framed (unstamped) batches,
  the answer the leader's ProduceResult or error.
* ``GET /peer/v1/forward``: the websocket the same produces travel on
  from a broker that forwards many (``ring.cluster.forwards``), each frame
  one produce and its answer.
* ``GET /peer/v1/status``: the broker's status and its view of the cluster.
* ``GET /peer/v1/replicas/{topic}/{partition}``: this replica's own stored
  batches up to its log end (not the high watermark), for comparing replicas;
  ``Ring-Log-Start-Offset`` and ``Ring-Log-End-Offset`` headers.
* ``POST /peer/v1/votes``: (pre-)vote requests, a msgpack list of up to
  ``VOTES_PER_MESSAGE_MAX`` (``ring.replication.election``), judged in order;
  the answer is the list of votes, each saved before it is sent. A malformed
  one refuses the whole message (400) before any is judged; a ballot the
  voter cannot save answers 500 ``storage_error`` and grants nothing.
* ``POST /peer/v1/transfer?topic=&partition=&epoch=``: the leader of that
  epoch asks this broker to take the partition over (stand at once).
* ``POST /peer/v1/resync?topic=&partition=``: a follower that cut its log for
  repair asks its leader to sync it again.
* ``POST /peer/v1/unclean?topic=&partition=``: an operator's one-shot unclean
  election: this broker's leaderless replica stands counting the votes of
  voters that lost their state (409 when it holds none, or it has a leader).
* ``GET /peer/v1/checksums/{topic}/{partition}?upto=``: checksums of this
  replica's committed ranges (anti-entropy, ``ring.repair``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Awaitable, Callable

import msgpack
import orjson
from aiohttp import WSMsgType, web

from ring import limits
from ring.auth import secret_matches
from ring.catalog import validate_topic_name
from ring.cluster import forwards
from ring.cluster import follower
from ring.cluster.peers import H_BROKER, H_SECRET, H_WALL_MS
from ring.errors import BadRequest, Overloaded, RingError, StorageError, Unauthorized, Unavailable
from ring.http_api import codec, ranges_api
from ring.http_api import web as native
from ring.http_api.keys import NODE_KEY
from ring.http_api.middleware import errors_middleware
from ring.log import batch as batchfmt
from ring.node.elections import Transfer
from ring.node.ready import Resync, TransferRequested, UncleanElection, VoteRequested
from ring.produce import Batches
from ring.replication import election, versions
from ring.replication.intake import ProduceResult

log = logging.getLogger("ring.peer")

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

SECRET_KEY: web.AppKey = web.AppKey("secret", object)
SOCKETS_KEY: web.AppKey = web.AppKey("websockets", object)


@web.middleware
async def auth_middleware(request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    if not secret_matches(request.app[SECRET_KEY], request.headers.get(H_SECRET)):
        log.warning("refused a peer request from %s without the cluster secret: %s %s",
                    request.remote, request.method, request.path)
        raise Unauthorized("the peer API needs the cluster secret (header Ring-Cluster-Secret)")
    return await handler(request)


def _node(request: web.Request):
    node = request.app[NODE_KEY]
    if getattr(node, "membership", None) is None:
        raise Unavailable("the broker is starting")
    return node


async def gossip(request: web.Request) -> web.Response:
    node = _node(request)
    body = await codec.read_body(request, limits.GOSSIP_MESSAGE_BYTES_MAX)
    answer = node.membership.handle(body)
    # What the message changed (a new topic) is in place before the sender hears back:
    # a broker announcing a topic knows every live peer has opened its replicas.
    await node.settle()
    clock = {H_WALL_MS: str(node.clock.wall_ms())}  # the sender measures our clock's offset by it
    if answer is None:
        return web.Response(status=204, headers=clock)
    return web.Response(body=answer, content_type="application/msgpack", headers=clock)


async def replicate(request: web.Request) -> web.StreamResponse:
    node = _node(request)
    if node.pump is None:  # (a follower's answers go out through the pump's executor)
        raise Unavailable("the broker is starting")
    leader = request.headers.get(H_BROKER)
    if not leader:
        raise BadRequest("the replication link needs the leader's name (header Ring-Broker)")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    spoken = versions.spoken()
    version = next((versions.version_of(p) for p in offered if p in spoken), None)
    if version is None:
        log.warning("refused a replication link from %s offering %s: this broker speaks %s (another version?)",
                    leader, ", ".join(offered) or "no subprotocol", ", ".join(spoken))
        raise BadRequest(f"this broker speaks replication protocols {', '.join(spoken)}; the link offered "
                         f"{', '.join(offered) or 'none'} (brokers whose versions do not overlap do not replicate "
                         "to each other)", expected=list(spoken))
    ws = web.WebSocketResponse(max_msg_size=limits.REPLICATION_MESSAGE_BYTES_MAX,
                               heartbeat=limits.REPLICATION_HEARTBEAT_S, protocols=spoken)
    await ws.prepare(request)
    request.app[SOCKETS_KEY].add(ws)
    log.info("replication link from %s open", leader)
    try:
        await follower.serve(ws, leader, node, version)
    finally:
        await ws.close()
        log.info("replication link from %s closed", leader)
    return ws


async def produce(request: web.Request) -> web.Response:
    node = _node(request)
    q = request.query
    partition = codec.int_param(q, "partition", None, 0, _INT32_MAX)
    if partition is None:
        raise BadRequest("partition is required")
    body = await codec.read_body(request, limits.REQUEST_BYTES_MAX)
    answer = await _produce(node, forwards.Forward.from_query(q, partition, body))
    return web.Response(body=answer, content_type="application/json")


async def _produce(node, f: forwards.Forward) -> bytes:
    """A forwarded produce, however it came (a request or the forward link): the leader's answer."""
    req = f.request(_split_batches)
    result = await node.produce_as_leader(req, req.partition, req.records.batches)
    return orjson.dumps(result.to_json())


async def forward(request: web.Request) -> web.StreamResponse:
    """The forward link (``ring.cluster.forwards``): produces from one broker, answered as they finish,
    the answers of one loop turn in one message."""
    node = _node(request)
    ws = web.WebSocketResponse(max_msg_size=forwards.MESSAGE_BYTES_MAX, heartbeat=limits.REPLICATION_HEARTBEAT_S,
                               protocols=(forwards.PROTOCOL,))
    await ws.prepare(request)
    request.app[SOCKETS_KEY].add(ws)
    outbox = forwards.Outbox(ws.send_bytes, lambda _items, _exc: None)  # lost with the link: the sender
    running: set[int] = set()  # ids of the produces under way: it fails what it waits for as unknown
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY:
                break
            try:
                items = forwards.decode_requests(msg.data)
            except BadRequest as exc:
                log.warning("closing a forward link from %s: %s", request.headers.get(H_BROKER), exc.message)
                break
            for f in items:
                if len(running) >= limits.FORWARDS_IN_FLIGHT_MAX:
                    _answer(outbox, f.id, Overloaded(f"{len(running)} forwarded produces are running on this "
                                                     "link already; retry later", topic=f.topic,
                                                     partition=f.partition))
                    continue
                _serve_forward(node, outbox, f, running)
    finally:
        await ws.close()
    return ws


def _serve_forward(node, outbox: forwards.Outbox, f: forwards.Forward, running: set[int]) -> None:
    """Answer ``f`` on ``outbox`` once the produce is done: from this turn's write of its partition, with no
    task, when the partition takes it at once (as a produce to this broker's own port); else through
    the awaited way (``node.produce_as_leader``)."""
    try:
        req = f.request(_split_batches)
        topic = req.topic
        pending = (node.router.append_soon(req, node.catalog.get(topic), req.partition, req.records.batches)
                   if topic in node.catalog else None)
    except RingError as exc:
        _answer(outbox, f.id, exc)
        return
    running.add(f.id)
    if pending is not None:
        pending.add_done_callback(lambda done: _forward_done(outbox, f, running, done.result))
        return
    task = asyncio.ensure_future(node.produce_as_leader(req, req.partition, req.records.batches))
    task.add_done_callback(lambda done: _forward_done(outbox, f, running, done.result))


def _forward_done(outbox: forwards.Outbox, f: forwards.Forward, running: set[int], result: Callable) -> None:
    """The answer item of a forwarded produce that is done: ``result()`` is its (base, count) or its
    ``ProduceResult``, or raises its error."""
    running.discard(f.id)
    try:
        got = result()
        base, count = (got.base_offset, got.count) if isinstance(got, ProduceResult) else got
    except asyncio.CancelledError:  # the broker is stopping: the link closes, and its sender counts it unknown
        return
    except RingError as exc:
        _answer(outbox, f.id, exc)
        return
    except Exception:
        log.exception("unexpected error in a forwarded produce to %s/%s", f.topic, f.partition)
        answer = native.http_error(500, "internal error; the broker log has the details")
        outbox.add(forwards.answer_item(f.id, 500, answer.body, None), len(answer.body))
        return
    body = b'{"topic":"%s","partition":%d,"base_offset":%d,"count":%d}' % (
        f.topic.encode(), f.partition, base, count)
    outbox.add(forwards.answer_item(f.id, 200, body, None), len(body))


def _answer(outbox: forwards.Outbox, rid: int, exc: RingError) -> None:
    if exc.status >= 500:
        log.warning("forwarded produce: %s", exc.message)
    answer = native.ring_error(exc)
    outbox.add(forwards.answer_item(rid, answer.status, answer.body, (answer.headers or {}).get("Retry-After")),
               len(answer.body))


def _split_batches(body: bytes) -> Batches:
    """Whole batches from a trusted peer: framing and CRC checked, records not looked at."""
    if not body:
        raise BadRequest("empty body")
    view, out, pos, count = memoryview(body), [], 0, 0
    while pos < len(body):
        h = batchfmt.check(view, pos)
        if h.size > limits.BATCH_BYTES_MAX:
            raise BadRequest(f"a batch is over {limits.BATCH_BYTES_MAX} bytes")
        out.append(bytearray(view[pos : pos + h.size]))
        pos += h.size
        count += h.record_count
    return Batches(out, count)


async def status(request: web.Request) -> web.Response:
    node = _node(request)
    return web.Response(body=orjson.dumps({**node.status(), "cluster": node.cluster()}),
                        content_type="application/json")


async def read_replica(request: web.Request) -> web.Response:
    node = _node(request)
    raw = request.match_info["partition"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > _INT32_MAX:
        raise BadRequest("partition must be a non-negative 32-bit integer")
    offset = codec.int_param(request.query, "offset", None, 0, _INT64_MAX)
    max_bytes = codec.int_param(request.query, "max_bytes", limits.FETCH_BYTES_DEFAULT, 1, limits.FETCH_BYTES_MAX)
    data, start, end = node.read_replica(request.match_info["topic"], int(raw), offset, max_bytes)
    return web.Response(body=data, content_type=codec.CT_BATCHES,
                        headers={"Ring-Log-Start-Offset": str(start), "Ring-Log-End-Offset": str(end)})


def _key(request: web.Request) -> tuple[str, int]:
    q = request.query
    topic = validate_topic_name(q.get("topic"))
    partition = codec.int_param(q, "partition", None, 0, _INT32_MAX)
    if partition is None:
        raise BadRequest("partition is required")
    return topic, partition


_VOTE_BYTES_MAX = 4 * 1024  # a vote request's wire form: a topic, two names of 253 characters, a few integers


async def _votes_body(request: web.Request, count_max: int) -> object:
    body = await codec.read_body(request, count_max * _VOTE_BYTES_MAX)
    try:
        return msgpack.unpackb(body, raw=False, max_array_len=max(16, count_max), max_map_len=0,
                               max_str_len=4096)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRequest(f"malformed vote: {exc}") from None


async def votes(request: web.Request) -> web.Response:
    wire = await _votes_body(request, limits.VOTES_PER_MESSAGE_MAX)
    if type(wire) is not list or not 1 <= len(wire) <= limits.VOTES_PER_MESSAGE_MAX:
        raise BadRequest(f"malformed votes: not a list of 1 to {limits.VOTES_PER_MESSAGE_MAX} vote requests")
    reqs = tuple(election.request_from_wire(w) for w in wire)  # all checked before any is judged
    try:
        replies = _node(request).step(VoteRequested(reqs)).reply
    except (OSError, StorageError) as exc:  # a ballot (or an epoch) that could not be saved: no vote leaves
        why = exc.message if isinstance(exc, StorageError) else f"{exc.filename}: {exc.strerror or exc}"
        raise StorageError(f"could not save this broker's ballot ({why}); no vote is granted by this answer") \
            from None
    # (a candidate of the older release reads no newer reply)
    version = _node(request).membership.members.version_for(request.headers.get(H_BROKER))
    return web.Response(body=msgpack.packb([versions.vote_reply_wire(r, version) for r in replies],
                                           use_bin_type=True),
                        content_type="application/msgpack")


async def transfer(request: web.Request) -> web.Response:
    node = _node(request)
    topic, partition = _key(request)
    epoch = codec.int_param(request.query, "epoch", None, 0, _INT32_MAX)
    sender = request.headers.get(H_BROKER)
    if epoch is None or not sender:
        raise BadRequest("a transfer needs the epoch and the leader's name (header Ring-Broker)")
    started = node.step(TransferRequested(sender, Transfer(topic, partition, epoch))).reply
    return web.Response(status=200 if started else 409, body=orjson.dumps({"started": started}),
                        content_type="application/json")


async def resync(request: web.Request) -> web.Response:
    node = _node(request)
    topic, partition = _key(request)
    rep = node.replica(topic, partition)
    ok = rep is not None and rep.is_leader and node.pump is not None
    if ok:
        node.step(Resync(rep))
    return web.Response(status=200 if ok else 409, body=orjson.dumps({"resynced": ok}),
                        content_type="application/json")


async def unclean(request: web.Request) -> web.Response:
    """An operator's one-shot unclean election (``ClusterBroker.unclean_election``): this broker's
    replica of the partition, leaderless, stands counting the votes of voters that lost their state."""
    node = _node(request)
    topic, partition = _key(request)
    rep = node.replica(topic, partition)
    ok = rep is not None and rep.leader is None and node.pump is not None
    if ok:
        node.step(UncleanElection(rep))
    return web.Response(status=200 if ok else 409, body=orjson.dumps({"asked": ok}), content_type="application/json")


async def checksums(request: web.Request) -> web.Response:
    node = _node(request)
    raw = request.match_info["partition"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > _INT32_MAX:
        raise BadRequest("partition must be a non-negative 32-bit integer")
    rep = node.replica(validate_topic_name(request.match_info["topic"]), int(raw))
    if rep is None:
        raise Unavailable(f"{node.name} holds no replica of {request.match_info['topic']}/{raw}")
    upto = codec.int_param(request.query, "upto", rep.hw, 0, _INT64_MAX)
    sums = await node.repair.sums(rep, upto)
    bad = next((r.base for r in sums if r.digest is None), None)
    if bad is not None:
        node.damaged(rep, bad)
    return web.Response(body=orjson.dumps([r.to_wire() for r in sums]), content_type="application/json")


ROUTES = [
    ("POST", "/peer/v1/gossip", gossip),
    ("GET", "/peer/v1/replicate", replicate),
    ("POST", "/peer/v1/produce", produce),
    ("GET", forwards.PATH, forward),
    ("GET", "/peer/v1/status", status),
    ("GET", "/peer/v1/replicas/{topic}/{partition}", read_replica),
    ("POST", "/peer/v1/votes", votes),
    ("POST", "/peer/v1/transfer", transfer),
    ("POST", "/peer/v1/resync", resync),
    ("POST", "/peer/v1/unclean", unclean),
    ("GET", "/peer/v1/checksums/{topic}/{partition}", checksums),
]


def make_peer_app(node: object, secret: str | None) -> web.Application:
    if not secret:
        log.warning("no cluster secret is set: the peer port refuses every request (a broker alone)")
    app = web.Application(middlewares=[errors_middleware, auth_middleware],
                          client_max_size=max(limits.REQUEST_BYTES_MAX, limits.GOSSIP_MESSAGE_BYTES_MAX))
    app[NODE_KEY] = node
    app[SECRET_KEY] = secret
    app[SOCKETS_KEY] = weakref.WeakSet()
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    app.on_shutdown.append(_close_websockets)
    ranges_api.register_peer(app)  # ring.ranges: catalogues, copies, audits
    return app


async def _close_websockets(app: web.Application) -> None:
    """Replication links never end by themselves: close them so shutdown does not wait out its grace."""
    for ws in list(app[SOCKETS_KEY]):
        await ws.close(code=1001, message=b"shutting down")
