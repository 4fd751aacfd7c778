"""Consumer-group routes on the client port.

Any broker answers any group request: the handler asks the coordinator
(``Coordinator.locate``) whether the group is coordinated here and, if not,
proxies the request as it came (method, path, query, body) to the
coordinator's client port with a ``Ring-Group-Forwarded`` header; a
forwarded request that reaches a broker which does not coordinate the group
(placement changed in between) is answered 503 rather than sent on, so
requests never loop. ``GET /v1/groups`` asks every live broker for the groups
it coordinates (``?local=true``) and merges the answers.

A poll, a commit of positions and a leave acknowledge the member's previous
poll answer by its token (``ring.groups.delivery``). The broker holding the
client's connection decides which answer that is: the token the request
names, else the poll answer this connection wrote whole before the request
began (``link``); it forwards that as the request's token, so a coordinator
never takes the forwarding broker's connection for the client's. Every poll
answer carries its token in the body and in ``Ring-Poll-Token``.

PolarStreams' consumer API is served on its own ports (``polar_api``), over
the same groups: its listeners call ``Groups`` here, or the coordinator's
poll, commit and leave routes.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import aiohttp
import msgpack
import orjson

from ring import auth, limits
from ring.errors import BadRequest, RingError, Unavailable
from ring.group_requests import CommitOffsets, GroupPoll, checked_offsets, validate_name
from ring.groups import delivery
from ring.groups.driver import Remote
from ring.groups.poller import Polled
from ring.groups.service import Groups
from ring.http_api import access, codec, fetch_codec, link, web
from ring.http_api import answer as answers
from ring.http_api.groups_openapi import OPENAPI_PATHS
from ring.http_api.web import Request, Response
from ring.http_api.keys import BROKER_KEY

log = logging.getLogger("ring.groups")

H_FORWARDED = "Ring-Group-Forwarded"
H_POLL_TOKEN = "Ring-Poll-Token"
# A poll answer of stored batches: msgpack {"generation", "token", "batches": [[topic, partition, start, end,
# batches], ...]}, the records ``start <= offset < end`` of each partition's stored batches being handed out.
CT_POLL_BATCHES = "application/vnd.ring.poll-batches"
GROUPS_KEY = "groups"
_INT32_MAX = 2**31 - 1
_TRUE = ("1", "true", "yes")


_json = web.json


def _groups(request: Request) -> Groups:
    return request.app[GROUPS_KEY]


def _flag(request: Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() not in (*_TRUE, "0", "false", "no"):
        raise BadRequest(f"{name} must be true or false", parameter=name)
    return raw.lower() in _TRUE


# --- finding the coordinator ---------------------------------------------------------------


async def _proxy(request: Request, remote: Remote, body: bytes | None, wait_ms: int = 0,
                 query: Any = None, route: tuple[str, str] | None = None, accept: str | None = None) -> Response:
    broker = _groups(request).broker
    peers = getattr(broker, "peers", None)
    if peers is None:
        raise Unavailable("the broker is starting; retry")
    timeout = aiohttp.ClientTimeout(total=wait_ms / 1000 + limits.PEER_REQUEST_TIMEOUT_S)
    same = route is None  # the request as it came, else a call of the coordinator's route with a JSON body
    headers = {H_FORWARDED: broker.config.name,
               "Content-Type": request.headers.get("Content-Type", codec.CT_JSON) if same else codec.CT_JSON,
               "Accept": accept or request.headers.get("Accept", codec.CT_JSON)}
    try:
        method, path = route or (request.method, request.path)
        async with peers.session.request(method, remote.url + path,
                                         params=request.query.pairs if query is None else query, data=body,
                                         headers=headers, timeout=timeout) as resp:
            data = await resp.read()
            kept = {name: resp.headers[name] for name in ("Retry-After", H_POLL_TOKEN) if name in resp.headers}
            return answers.response(data, resp.content_type or codec.CT_JSON, kept, status=resp.status)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Unavailable(f"the coordinator {remote.name} did not answer: {exc!r}; retry",
                          coordinator=remote.name) from None


async def _at_coordinator(request: Request, group: str, body: bytes | None,
                          local: Callable[[], Awaitable[Response]], wait_ms: int = 0,
                          create: bool = True, query: Any = None,
                          route: tuple[str, str] | None = None, accept: str | None = None) -> Response:
    """``local()`` when this broker coordinates ``group``, else the request sent on to the coordinator
    (as it came, or as ``route``: the method and path of the coordinator's route to call)."""
    remote = await _groups(request).coord.locate(group, create)
    if remote is None:
        _groups(request).coord.start()
        return await local()
    if request.headers.get(H_FORWARDED):
        raise Unavailable(f"{remote.name} coordinates group {group!r} now, not this broker; retry",
                          group=group, coordinator=remote.name)
    return await _proxy(request, remote, body, wait_ms, query, route, accept)


def _group(request: Request) -> str:
    return validate_name(request.match_info["group"], "group")


# --- which poll answer a request acknowledges ---------------------------------------------------


def _via(request: Request) -> link.Via | None:
    """The client's connection; none for a forwarded request (the forwarding broker named its token)."""
    return None if request.headers.get(H_FORWARDED) else link.via_of(request)


def acknowledged(request: Request, group: str, consumer: str, named: object) -> str | None:
    """The token of the poll answer a request of ``consumer`` acknowledges: the one it ``named``, else
    the one its connection carried whole (a front's part of building a ``GroupPoll`` or a
    ``CommitOffsets``)."""
    return link.acknowledged(_via(request), group, consumer, delivery.parse_token(named))


def _with_token(query: dict[str, str], token: str | None) -> list[tuple[str, str]]:
    """The request's query with ``token`` as its token parameter (for forwarding)."""
    out = [(k, v) for k, v in query.items() if k != "token"]
    if token is not None:
        out.append(("token", token))
    return out


def _carried(request: Request, resp: Response, group: str, consumer: str) -> Response:
    """``resp`` answers a poll: once its last byte goes out, the client's connection vouches for it."""
    if resp.status not in (200, 204):
        return resp
    token = resp.headers.get(H_POLL_TOKEN) if resp.status == 200 and resp.headers else None
    mark = link.answering(_via(request), group, consumer, token)
    if mark is not None:
        resp.before_last = mark
    return resp


# --- native routes -----------------------------------------------------------------------------


async def join(request: Request) -> Response:
    group = _group(request)
    raw = request.body
    doc = codec.json_body(raw)
    if not isinstance(doc, dict):
        raise BadRequest('the body must be {"consumer": ID, "topics": [TOPIC, ...]}')
    consumer = validate_name(doc.get("consumer"), "consumer")
    topics = doc.get("topics")
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list):
        raise BadRequest("topics must be a list of topic names")
    access.require(request, auth.CONSUME, [t for t in topics if isinstance(t, str)])  # --auth-tokens
    timeout = doc.get("session_timeout_ms", limits.GROUP_SESSION_TIMEOUT_MS_DEFAULT)
    if type(timeout) is not int or not limits.GROUP_SESSION_TIMEOUT_MS_MIN <= timeout <= limits.GROUP_SESSION_TIMEOUT_MS_MAX:
        raise BadRequest(f"session_timeout_ms must be an integer in [{limits.GROUP_SESSION_TIMEOUT_MS_MIN}, "
                         f"{limits.GROUP_SESSION_TIMEOUT_MS_MAX}]")
    client = doc.get("client")
    if client is not None and (not isinstance(client, str) or len(client) > 256):
        raise BadRequest("client must be a short string")
    return await join_member(request, group, consumer, topics, timeout, client, doc.get("reset", "earliest"))


async def join_member(request: Request, group: str, consumer: str, topics: list[Any], session_timeout_ms: int,
                      client: str | None, reset: str) -> Response:
    """Join (or heartbeat) ``consumer`` at the group's coordinator; its answer."""
    body = orjson.dumps({"consumer": consumer, "topics": topics, "session_timeout_ms": session_timeout_ms,
                         "client": client, "reset": reset})

    async def local() -> Response:
        return _json(await _groups(request).join(group, consumer, topics, session_timeout_ms, client, reset))

    return await _at_coordinator(request, group, body, local, route=("POST", f"/v1/groups/{group}/members"))


def record_doc(topic: str, partition: int, rec: Any, is_json: bool) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, **fetch_codec.record_json(rec, is_json)}


async def poll(request: Request) -> Response:
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    q = request.query
    max_records = codec.int_param(q, "max_records", limits.FETCH_RECORDS_DEFAULT, 1, limits.FETCH_RECORDS_MAX)
    wait_ms = codec.int_param(q, "wait_ms", 0, 0, limits.LONG_POLL_WAIT_MS_MAX)
    generation = codec.int_param(q, "generation", None, 0, 2**62)
    auto_commit = _flag(request, "auto_commit", True)
    leader = q.get("leader")
    if leader is not None:
        validate_name(leader, "leader")
    accept = _poll_type(request.headers.get("Accept"))
    req = GroupPoll(group, consumer, generation, max_records, wait_ms, auto_commit,
                    acknowledged(request, group, consumer, q.get("token")), leader, accept == CT_POLL_BATCHES)
    return _carried(request, await poll_member(request, req, accept), group, consumer)


async def poll_member(request: Request, req: GroupPoll, accept: str) -> Response:
    """``req`` at the group's coordinator; the answer (``accept``: JSON, msgpack or, as ``req.batches``
    asks, stored batches), its token in ``Ring-Poll-Token``. With ``req.leader``, it says how many of
    the consumer's partitions that broker leads."""
    group, consumer = req.group, req.consumer
    assert req.batches == (accept == CT_POLL_BATCHES), (req, accept)

    async def local() -> Response:
        await _require_member_topics(request, group, consumer)
        got = await _groups(request).poll(req)
        extra = {} if req.leader is None else {"partitions": got.partitions}
        if req.batches:  # the fetch's stored bytes, for clients (ring.client.consumer)
            body, ctype = _batches_body(got, extra), CT_POLL_BATCHES
        elif accept == codec.CT_MSGPACK:  # keys and values as bytes
            body = msgpack.packb({"generation": got.generation, "token": got.token, **extra, "records": [
                {"topic": t, "partition": p, "json": j, **fetch_codec.record_msgpack(r)}
                for t, p, r, j in got.records]}, use_bin_type=True)
            ctype = codec.CT_MSGPACK
        else:
            body, ctype = orjson.dumps({**_poll_doc(got), **extra}), codec.CT_JSON
        headers = {H_POLL_TOKEN: got.token}
        del got
        # Not kept once sent: an idle keep-alive connection would hold it until its next request.
        # (Not refused for want of room either: the answer is remembered already.)
        return answers.response(body, ctype, headers)

    query: dict[str, Any] = {"max_records": req.max_records, "wait_ms": req.wait_ms,
                             "auto_commit": "true" if req.auto_commit else "false"}
    for name, value in (("generation", req.generation), ("token", req.token), ("leader", req.leader)):
        if value is not None:
            query[name] = value
    return await _at_coordinator(request, group, None, local, req.wait_ms, query=query,
                                 route=("POST", f"/v1/groups/{group}/members/{consumer}/poll"), accept=accept)


def _batches_body(got: Polled, extra: dict[str, Any]) -> bytes:
    """The msgpack map of a stored-batches poll answer, its batches copied once (``packb`` would copy
    them into a buffer it grows as it goes)."""
    pack = msgpack.Packer(use_bin_type=True).pack
    head = {"generation": got.generation, "token": got.token, **extra}
    assert len(head) < 15
    parts: list[Any] = [bytes([0x80 | (len(head) + 1)])]  # fixmap: a few keys
    for k, v in head.items():
        parts += [pack(k), pack(v)]
    parts += [pack("batches"), b"\xdd" + len(got.batches).to_bytes(4, "big")]  # array 32
    for b in got.batches:
        parts += [b"\x95", pack(b.topic), pack(b.partition), pack(b.start), pack(b.end),
                  b"\xc6" + len(b.data).to_bytes(4, "big"), b.data]  # fixarray of 5; bin 32
    return b"".join(parts)


def _poll_type(accept: str | None) -> str:
    """What a poll answers with: stored batches when Accept names them first, msgpack, else JSON."""
    for part in (accept or "").split(","):
        mime = part.split(";", 1)[0].strip().lower()
        if mime == CT_POLL_BATCHES:
            return mime
        if mime in codec.FETCH_TYPES:
            break
    return codec.CT_MSGPACK if codec.fetch_type(accept) == codec.CT_MSGPACK else codec.CT_JSON


async def _require_member_topics(request: Request, group: str, consumer: str) -> None:
    """403 unless the caller may consume every topic the member reads: checked before a poll reads
    anything (a refused poll must not move the member's positions) or a commit of its positions."""
    access.require(request, auth.CONSUME, await _groups(request).member_topics(group, consumer))


def _poll_doc(got: Polled) -> dict[str, Any]:
    return {"records": [record_doc(t, p, r, j) for t, p, r, j in got.records], "generation": got.generation,
            "token": got.token}


async def leave(request: Request) -> Response:
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    return await leave_member(request, group, consumer, _flag(request, "commit", True), request.query.get("token"))


async def leave_member(request: Request, group: str, consumer: str, commit: bool, named: object) -> Response:
    """``consumer`` leaves its group at the coordinator, first committing its positions with ``commit``
    (after acknowledging the answer ``named``, else the one its connection carried whole)."""
    token = acknowledged(request, group, consumer, named)

    async def local() -> Response:
        # Leaving, with or without a commit, needs consume on the member's topics: else any token
        # could evict another group's members.
        await _require_member_topics(request, group, consumer)
        return _json(await _groups(request).leave(group, consumer, commit, token))

    query = _with_token({"commit": "true" if commit else "false"}, token)
    return await _at_coordinator(request, group, None, local, query=query,
                                 route=("DELETE", f"/v1/groups/{group}/members/{consumer}"))


def _offsets(raw: Any) -> list[tuple[str, int, int]]:
    if not isinstance(raw, list):
        raise BadRequest('offsets must be a list of {"topic", "partition", "offset"}')
    out = []
    for item in raw[: limits.TOPIC_PARTITIONS_MAX * limits.GROUP_MEMBER_TOPICS_MAX]:
        if not isinstance(item, dict):
            raise BadRequest('offsets must be a list of {"topic", "partition", "offset"}')
        t, p, o = item.get("topic"), item.get("partition"), item.get("offset")
        if not isinstance(t, str) or type(p) is not int or type(o) is not int or p < 0 or o < 0:
            raise BadRequest('each offset needs a "topic", a non-negative "partition" and "offset"')
        out.append((t, p, o))
    return out


async def commit(request: Request) -> Response:
    group = _group(request)
    raw = request.body
    doc = codec.json_body(raw)
    if not isinstance(doc, dict):
        raise BadRequest('the body must be {"consumer", "offsets": [{"topic", "partition", "offset"}]}')
    consumer = doc.get("consumer")
    if consumer is not None:
        validate_name(consumer, "consumer")
    generation = doc.get("generation")
    if generation is not None and (type(generation) is not int or generation < 0):
        raise BadRequest("generation must be a non-negative integer")
    if doc.get("offsets") is None:
        # No offsets: commit the consumer's positions (a poll's implicit commit, alone).
        consumer = validate_name(consumer, "consumer")
        return await commit_member(request, CommitOffsets(group, consumer, generation, None,
                                                          acknowledged(request, group, consumer, doc.get("token"))))
    offsets = _offsets(doc.get("offsets"))
    access.require(request, auth.CONSUME, {t for t, _, _ in offsets})
    req = CommitOffsets(group, consumer, generation, checked_offsets(offsets, "offsets"))

    async def local() -> Response:
        return _json(await _groups(request).commit(req))

    return await _at_coordinator(request, group, raw, local)


async def commit_member(request: Request, req: CommitOffsets) -> Response:
    """``req``, a commit of a consumer's positions (a poll's implicit commit, alone), at the coordinator."""
    group, consumer = req.group, req.consumer
    assert req.offsets is None and consumer is not None, req

    async def local() -> Response:
        await _require_member_topics(request, group, consumer)
        return _json(await _groups(request).commit(req))

    body = orjson.dumps({"consumer": consumer, "generation": req.generation, "token": req.token})
    return await _at_coordinator(request, group, body, local, route=("POST", f"/v1/groups/{group}/offsets"))


async def positions(request: Request) -> Response:
    """GET: where the member's next poll reads; PUT {"generation"?, "positions": [...]}: seek there."""
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    raw = request.body if request.method == "PUT" else None
    doc = codec.json_body(raw) if raw is not None else {}
    if not isinstance(doc, dict) or (raw is not None and doc.get("positions") is None):
        raise BadRequest('the body must be {"generation"?, "positions": [{"topic", "partition", "offset"}]}')
    generation = doc.get("generation")
    if generation is not None and (type(generation) is not int or generation < 0):
        raise BadRequest("generation must be a non-negative integer")
    wanted = checked_offsets(_offsets(doc["positions"]), "positions") if raw is not None else ()

    async def local() -> Response:
        await _require_member_topics(request, group, consumer)
        if raw is None:
            return _json(await _groups(request).positions(group, consumer))
        return _json(await _groups(request).seek(group, consumer, generation, wanted))

    return await _at_coordinator(request, group, raw, local)


async def reset(request: Request) -> Response:
    group = _group(request)
    topic = request.match_info["topic"]
    raw = request.body
    doc = codec.json_body(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("to"), str):
        raise BadRequest('the body must be {"to": "earliest"|"latest"|"offset"|"timestamp", "value"?, "partition"?}')
    partition = doc.get("partition")
    if partition is not None and (type(partition) is not int or not 0 <= partition <= _INT32_MAX):
        raise BadRequest("partition must be a non-negative integer")

    async def local() -> Response:
        return _json(await _groups(request).reset(group, topic, doc["to"], doc.get("value"), partition))

    return await _at_coordinator(request, group, raw, local)


async def describe(request: Request) -> Response:
    group = _group(request)

    async def local() -> Response:
        return _json(await _groups(request).describe(group))

    return await _at_coordinator(request, group, None, local, create=False)


async def delete_group(request: Request) -> Response:
    """Delete a group with no members and its committed offsets (``Groups.delete``: what the Kafka
    listener's DeleteGroups does too)."""
    group = _group(request)

    async def local() -> Response:
        await _groups(request).delete(group)
        return _json({"deleted": group})

    return await _at_coordinator(request, group, None, local, create=False)


async def list_groups(request: Request) -> Response:
    groups = _groups(request)
    if _flag(request, "local", False) or request.headers.get(H_FORWARDED):
        return _json({"groups": await groups.list_local()})
    found: dict[str, dict[str, Any]] = {g["group"]: g for g in await groups.list_local()}
    unreachable = []
    broker = groups.broker
    membership = getattr(broker, "membership", None)
    names = [b["name"] for b in broker.cluster()["brokers"] if b["name"] != broker.config.name]
    for name in names:
        url = membership.client_url(name) if membership is not None else None
        if url is None or not membership.alive(name):
            unreachable.append(name)
            continue
        try:
            answer = await _proxy(request.replace(path="/v1/groups?local=true"), Remote(name, url), None)
            for g in orjson.loads(answers.body_bytes(answer))["groups"]:
                have = found.get(g["group"])
                if have is None or g["generation"] > have["generation"]:
                    found[g["group"]] = g
        except (RingError, ValueError, KeyError, TypeError) as exc:
            log.info("listing groups: %s did not answer: %s", name, exc)
            unreachable.append(name)
    doc: dict[str, Any] = {"groups": [found[k] for k in sorted(found)]}
    if unreachable:
        doc["unreachable"] = unreachable
    return _json(doc)


ROUTES = [
    ("GET", "/v1/groups", list_groups),
    ("GET", "/v1/groups/{group}", describe),
    ("DELETE", "/v1/groups/{group}", delete_group),
    ("POST", "/v1/groups/{group}/members", join),
    ("POST", "/v1/groups/{group}/members/{consumer}/poll", poll),
    ("DELETE", "/v1/groups/{group}/members/{consumer}", leave),
    ("GET", "/v1/groups/{group}/members/{consumer}/positions", positions),
    ("PUT", "/v1/groups/{group}/members/{consumer}/positions", positions),
    ("POST", "/v1/groups/{group}/offsets", commit),
    ("PUT", "/v1/groups/{group}/offsets/{topic}", reset),
]


# Routes that read a body, and how much of one they take; the others drop a body as it comes.
_ADMIN_BODY = {"body_max": limits.ADMIN_BODY_BYTES_MAX}
BODIES: dict[Any, dict[str, Any]] = {join: _ADMIN_BODY, commit: _ADMIN_BODY, reset: _ADMIN_BODY, positions: _ADMIN_BODY}


def register(app: web.App) -> None:
    """Add the group routes and the coordinator's lifecycle to the client app (``app.make_app``)."""
    groups = Groups(app[BROKER_KEY])
    app[GROUPS_KEY] = groups
    metrics = getattr(groups.broker, "metrics", None)
    if metrics is not None:
        metrics.group_source = groups.lag_rows
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler, **BODIES.get(handler, {}))
    app.on_cleanup.append(groups.membership.close)
    app.on_cleanup.append(groups.coord.close)


__all__ = ["OPENAPI_PATHS", "ROUTES", "register"]
