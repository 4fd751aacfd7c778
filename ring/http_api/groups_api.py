"""Consumer-group routes, and PolarStreams-compatible aliases, on the client port.

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

PolarStreams' consumer API is an alias over the same groups: ``PUT
/v1/consumer/register?consumerId=&group=&topic=&onNewGroup=`` joins (and
tells every live broker which group the consumer id belongs to, as
PolarStreams registers on all brokers), ``POST /v1/consumer/poll`` polls
without waiting (204 when there is nothing; records grouped in PolarStreams'
shape; its token only in ``Ring-Poll-Token``), ``/commit`` commits the
positions, ``/goodbye`` commits and leaves: these acknowledge an answer by
their connection (or a ``token`` parameter) like the native routes. ``POST
/v1/topic/{topic}/messages?partitionKey=`` is the produce route with ``key``
spelled PolarStreams' way.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Awaitable, Callable

import aiohttp
import msgpack
import orjson
from aiohttp import web
from multidict import CIMultiDict, MultiDict

from ring import auth, limits
from ring.errors import BadRequest, Conflict, RingError, Unavailable
from ring.groups import delivery
from ring.groups.driver import Remote
from ring.groups.poller import Polled
from ring.groups.service import Groups, validate_name
from ring.hashing import partition_token
from ring.http_api import access, codec, link
from ring.http_api import answer as answers
from ring.http_api.groups_openapi import OPENAPI_PATHS

log = logging.getLogger("ring.groups")

H_FORWARDED = "Ring-Group-Forwarded"
H_POLL_TOKEN = "Ring-Poll-Token"
H_POLAR_NOTE = "Ring-Polar-Register-Only"
GROUPS_KEY: web.AppKey[Groups] = web.AppKey("groups", Groups)
POLAR_KEY: web.AppKey[OrderedDict] = web.AppKey("polar consumers", OrderedDict)
_INT32_MAX = 2**31 - 1
_TRUE = ("1", "true", "yes")
# PolarStreams drops a consumer after two minutes without a request; its clients expect that.
POLAR_SESSION_TIMEOUT_MS = 120_000


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _groups(request: web.Request) -> Groups:
    return request.app[GROUPS_KEY]


def _flag(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() not in (*_TRUE, "0", "false", "no"):
        raise BadRequest(f"{name} must be true or false", parameter=name)
    return raw.lower() in _TRUE


# --- finding the coordinator ---------------------------------------------------------------


async def _proxy(request: web.Request, remote: Remote, body: bytes | None, wait_ms: int = 0,
                 query: Any = None) -> web.Response:
    broker = _groups(request).broker
    peers = getattr(broker, "peers", None)
    if peers is None:
        raise Unavailable("the broker is starting; retry")
    timeout = aiohttp.ClientTimeout(total=wait_ms / 1000 + limits.PEER_REQUEST_TIMEOUT_S)
    headers = {H_FORWARDED: broker.config.name, "Content-Type": request.headers.get("Content-Type", "application/json"),
               "Accept": request.headers.get("Accept", "application/json")}
    try:
        async with peers.session.request(request.method, remote.url + request.rel_url.path,
                                         params=request.rel_url.query if query is None else query, data=body,
                                         headers=headers, timeout=timeout) as resp:
            data = await resp.read()
            out = answers.response(data, resp.content_type or "application/json", {}, status=resp.status)
            for name in ("Retry-After", H_POLL_TOKEN):
                if name in resp.headers:
                    out.headers[name] = resp.headers[name]
            return out
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise Unavailable(f"the coordinator {remote.name} did not answer: {exc!r}; retry",
                          coordinator=remote.name) from None


async def _at_coordinator(request: web.Request, group: str, body: bytes | None,
                          local: Callable[[], Awaitable[web.Response]], wait_ms: int = 0,
                          create: bool = True, query: Any = None) -> web.Response:
    remote = await _groups(request).coord.locate(group, create)
    if remote is None:
        _groups(request).coord.start()
        return await local()
    if request.headers.get(H_FORWARDED):
        raise Unavailable(f"{remote.name} coordinates group {group!r} now, not this broker; retry",
                          group=group, coordinator=remote.name)
    return await _proxy(request, remote, body, wait_ms, query)


def _group(request: web.Request) -> str:
    return validate_name(request.match_info["group"], "group")


# --- which poll answer a request acknowledges ---------------------------------------------------


def _via(request: web.Request) -> link.Via | None:
    """The client's connection; none for a forwarded request (the forwarding broker named its token)."""
    return None if request.headers.get(H_FORWARDED) else link.via_of(request)


def _acknowledged(request: web.Request, group: str, consumer: str, named: object) -> str | None:
    return link.acknowledged(_via(request), group, consumer, delivery.parse_token(named))


def _with_token(query: Any, token: str | None) -> Any:
    """The request's query with ``token`` as its token parameter (for forwarding)."""
    out = MultiDict(query)
    out.popall("token", None)
    if token is not None:
        out["token"] = token
    return out


def _carried(request: web.Request, resp: web.Response, group: str, consumer: str) -> web.Response:
    """``resp`` answers a poll: once its last byte goes out, the client's connection vouches for it."""
    if resp.status not in (200, 204):
        return resp
    sent = resp.status == 200 and isinstance(resp.body, answers.SentOnce)
    mark = link.answering(_via(request), group, consumer, resp.headers.get(H_POLL_TOKEN) if sent else None)
    if mark is not None:
        answers.before_last_piece(resp, mark)
    return resp


# --- native routes -----------------------------------------------------------------------------


async def join(request: web.Request) -> web.Response:
    group = _group(request)
    raw = await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX)
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
    reset = doc.get("reset", "earliest")

    async def local() -> web.Response:
        return _json(await _groups(request).join(group, consumer, topics, timeout, client, reset))

    return await _at_coordinator(request, group, raw, local)


def record_doc(topic: str, partition: int, rec: Any, is_json: bool) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, **codec.record_json(rec, is_json)}


async def poll(request: web.Request) -> web.Response:
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    q = request.query
    max_records = codec.int_param(q, "max_records", limits.FETCH_RECORDS_DEFAULT, 1, limits.FETCH_RECORDS_MAX)
    wait_ms = codec.int_param(q, "wait_ms", 0, 0, limits.LONG_POLL_WAIT_MS_MAX)
    generation = codec.int_param(q, "generation", None, 0, 2**62)
    auto_commit = _flag(request, "auto_commit", True)
    token = _acknowledged(request, group, consumer, q.get("token"))

    as_msgpack = codec.fetch_type(request.headers.get("Accept")) == codec.CT_MSGPACK

    async def local() -> web.Response:
        await _require_member_topics(request, group, consumer)
        got = await _groups(request).poll(group, consumer, generation, max_records, wait_ms, auto_commit, token)
        if as_msgpack:  # keys and values as bytes, for clients (ring.client.consumer)
            body = msgpack.packb({"generation": got.generation, "token": got.token, "records": [
                {"topic": t, "partition": p, "json": j, **codec.record_msgpack(r)} for t, p, r, j in got.records]},
                use_bin_type=True)
            ctype = codec.CT_MSGPACK
        else:
            body, ctype = orjson.dumps(_poll_doc(got)), codec.CT_JSON
        headers = {H_POLL_TOKEN: got.token}
        del got
        # Not kept once sent: an idle keep-alive connection would hold it until its next request.
        # (Not refused for want of room either: the answer is remembered already.)
        return answers.response(body, ctype, headers)

    answer = await _at_coordinator(request, group, None, local, wait_ms, query=_with_token(q, token))
    return _carried(request, answer, group, consumer)


async def _require_member_topics(request: web.Request, group: str, consumer: str) -> None:
    """403 unless the caller may consume every topic the member reads: checked before a poll reads
    anything (a refused poll must not move the member's positions) or a commit of its positions."""
    access.require(request, auth.CONSUME, await _groups(request).member_topics(group, consumer))


def _poll_doc(got: Polled) -> dict[str, Any]:
    return {"records": [record_doc(t, p, r, j) for t, p, r, j in got.records], "generation": got.generation,
            "token": got.token}


async def leave(request: web.Request) -> web.Response:
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    commit = _flag(request, "commit", True)
    token = _acknowledged(request, group, consumer, request.query.get("token"))

    async def local() -> web.Response:
        # Leaving, with or without a commit, needs consume on the member's topics: else any token
        # could evict another group's members.
        await _require_member_topics(request, group, consumer)
        return _json(await _groups(request).leave(group, consumer, commit, token))

    return await _at_coordinator(request, group, None, local, query=_with_token(request.query, token))


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


async def commit(request: web.Request) -> web.Response:
    group = _group(request)
    raw = await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX)
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
        who = validate_name(consumer, "consumer")
        token = _acknowledged(request, group, who, doc.get("token"))

        async def positions() -> web.Response:
            await _require_member_topics(request, group, who)
            done = await _groups(request).commit_positions(group, who, generation, token)
            return _json({"group": group, "committed": [{"topic": t, "partition": p, "offset": o}
                                                        for t, p, o in done]})

        forwarded = raw if token == doc.get("token") else orjson.dumps({**doc, "token": token})
        return await _at_coordinator(request, group, forwarded, positions)
    offsets = _offsets(doc.get("offsets"))
    access.require(request, auth.CONSUME, {t for t, _, _ in offsets})

    async def local() -> web.Response:
        return _json(await _groups(request).commit(group, consumer, generation, offsets))

    return await _at_coordinator(request, group, raw, local)


async def positions(request: web.Request) -> web.Response:
    """GET: where the member's next poll reads; PUT {"generation"?, "positions": [...]}: seek there."""
    group = _group(request)
    consumer = validate_name(request.match_info["consumer"], "consumer")
    raw = await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX) if request.method == "PUT" else None
    doc = codec.json_body(raw) if raw is not None else {}
    if not isinstance(doc, dict) or (raw is not None and doc.get("positions") is None):
        raise BadRequest('the body must be {"generation"?, "positions": [{"topic", "partition", "offset"}]}')
    generation = doc.get("generation")
    if generation is not None and (type(generation) is not int or generation < 0):
        raise BadRequest("generation must be a non-negative integer")
    wanted = _offsets(doc["positions"]) if raw is not None else []

    async def local() -> web.Response:
        await _require_member_topics(request, group, consumer)
        if raw is None:
            return _json(await _groups(request).positions(group, consumer))
        return _json(await _groups(request).seek(group, consumer, generation, wanted))

    return await _at_coordinator(request, group, raw, local)


async def reset(request: web.Request) -> web.Response:
    group = _group(request)
    topic = request.match_info["topic"]
    raw = await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX)
    doc = codec.json_body(raw)
    if not isinstance(doc, dict) or not isinstance(doc.get("to"), str):
        raise BadRequest('the body must be {"to": "earliest"|"latest"|"offset"|"timestamp", "value"?, "partition"?}')
    partition = doc.get("partition")
    if partition is not None and (type(partition) is not int or not 0 <= partition <= _INT32_MAX):
        raise BadRequest("partition must be a non-negative integer")

    async def local() -> web.Response:
        return _json(await _groups(request).reset(group, topic, doc["to"], doc.get("value"), partition))

    return await _at_coordinator(request, group, raw, local)


async def describe(request: web.Request) -> web.Response:
    group = _group(request)

    async def local() -> web.Response:
        return _json(await _groups(request).describe(group))

    return await _at_coordinator(request, group, None, local, create=False)


async def list_groups(request: web.Request) -> web.Response:
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
            answer = await _proxy(request.clone(rel_url="/v1/groups?local=true"), Remote(name, url), None)
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


# --- PolarStreams aliases ----------------------------------------------------------------------


def _polar_id(request: web.Request) -> str:
    return validate_name(request.query.get("consumerId"), "consumerId")


def _polar_group(request: web.Request, consumer: str) -> str:
    known: OrderedDict = request.app[POLAR_KEY]
    group = known.get(consumer)
    if group is None:
        raise Conflict(f"consumer {consumer!r} is not registered on this broker; register again",
                       consumer=consumer, rejoin=True)
    known.move_to_end(consumer)
    return group


def _remember(request: web.Request, consumer: str, group: str) -> None:
    known: OrderedDict = request.app[POLAR_KEY]
    known[consumer] = group
    known.move_to_end(consumer)
    while len(known) > limits.POLAR_CONSUMERS_MAX:
        known.popitem(last=False)


async def polar_register(request: web.Request) -> web.Response:
    consumer = _polar_id(request)
    group = validate_name(request.query.get("group") or "default", "group")
    _remember(request, consumer, group)
    if request.headers.get(H_POLAR_NOTE):
        return web.Response(status=200)
    topics = request.query.getall("topic", [])
    access.require(request, auth.CONSUME, topics)
    reset = "earliest" if request.query.get("onNewGroup") == "startFromEarliest" else "latest"
    native = request.clone(method="POST", rel_url=f"/v1/groups/{group}/members")
    body = orjson.dumps({"consumer": consumer, "topics": topics, "reset": reset, "client": "polar",
                         "session_timeout_ms": POLAR_SESSION_TIMEOUT_MS})

    async def local() -> web.Response:
        return _json(await _groups(request).join(group, consumer, list(topics), POLAR_SESSION_TIMEOUT_MS,
                                                 "polar", reset))

    answer = await _at_coordinator(native, group, body, local)
    if answer.status >= 300:
        return answer
    await _tell_brokers(request, consumer, group)
    return web.Response(status=200)


async def _tell_brokers(request: web.Request, consumer: str, group: str) -> None:
    broker = _groups(request).broker
    membership = getattr(broker, "membership", None)
    peers = getattr(broker, "peers", None)
    if membership is None or peers is None:
        return
    for b in broker.cluster()["brokers"]:
        url = membership.client_url(b["name"])
        if b["name"] == broker.config.name or url is None or not membership.alive(b["name"]):
            continue
        try:
            async with peers.session.put(url + "/v1/consumer/register", params={"consumerId": consumer, "group": group},
                                         headers={H_POLAR_NOTE: "1"}) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("telling %s about consumer %s failed: %s", b["name"], consumer, exc)


async def polar_poll(request: web.Request) -> web.Response:
    consumer = _polar_id(request)
    group = _polar_group(request, consumer)
    token = _acknowledged(request, group, consumer, request.query.get("token"))
    # Read as JSON here whatever the client accepts (PolarStreams' clients ask for its binary format).
    as_json = CIMultiDict(request.headers)
    as_json["Accept"] = codec.CT_JSON
    native = request.clone(rel_url=f"/v1/groups/{group}/members/{consumer}/poll", headers=as_json)

    async def local() -> web.Response:
        await _require_member_topics(request, group, consumer)
        got = await _groups(request).poll(group, consumer, None, limits.FETCH_RECORDS_DEFAULT, 0, True, token)
        return answers.response(orjson.dumps(_poll_doc(got)), codec.CT_JSON, {H_POLL_TOKEN: got.token})

    answer = await _at_coordinator(native, group, None, local, query=_with_token({}, token))
    if answer.status != 200:
        return answer
    headers = {H_POLL_TOKEN: answer.headers.get(H_POLL_TOKEN, "")}
    doc = orjson.loads(answers.body_bytes(answer))
    if not doc["records"]:
        return _carried(request, web.Response(status=204, headers=headers), group, consumer)
    items = orjson.dumps(_polar_items(request, doc))
    return _carried(request, answers.response(items, codec.CT_JSON, headers), group, consumer)


def _polar_items(request: web.Request, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Records in PolarStreams' shape: runs of consecutive offsets of one partition."""
    catalog = _groups(request).broker.catalog
    items: list[dict[str, Any]] = []
    for r in doc["records"]:
        last = items[-1] if items else None
        if last is None or last["topic"] != r["topic"] or last["rangeIndex"] != r["partition"] or \
                int(last["startOffset"]) + len(last["values"]) != r["offset"]:
            count = catalog.get(r["topic"]).partitions if r["topic"] in catalog else 1
            last = {"topic": r["topic"], "token": str(partition_token(r["topic"], r["partition"], count)),
                    "rangeIndex": r["partition"], "version": doc["generation"], "startOffset": str(r["offset"]),
                    "values": []}
            items.append(last)
        last["values"].append(r["value"])
    return items


async def polar_commit(request: web.Request) -> web.Response:
    consumer = _polar_id(request)
    group = _polar_group(request, consumer)
    token = _acknowledged(request, group, consumer, request.query.get("token"))
    body = orjson.dumps({"consumer": consumer, "token": token})
    native = request.clone(method="POST", rel_url=f"/v1/groups/{group}/offsets")

    async def local() -> web.Response:
        await _require_member_topics(request, group, consumer)
        await _groups(request).commit_positions(group, consumer, None, token)
        return web.Response(status=204)

    answer = await _at_coordinator(native, group, body, local)
    return web.Response(status=204) if answer.status < 300 else answer


async def polar_goodbye(request: web.Request) -> web.Response:
    consumer = _polar_id(request)
    group = _polar_group(request, consumer)
    token = _acknowledged(request, group, consumer, request.query.get("token"))
    native = request.clone(method="DELETE", rel_url=f"/v1/groups/{group}/members/{consumer}")

    async def local() -> web.Response:
        await _require_member_topics(request, group, consumer)
        await _groups(request).leave(group, consumer, True, token)
        return web.Response(status=200)

    answer = await _at_coordinator(native, group, None, local, query=_with_token({"commit": "true"}, token))
    if answer.status < 300:
        request.app[POLAR_KEY].pop(consumer, None)
        return web.Response(status=200)
    return answer


async def polar_produce(request: web.Request) -> web.Response:
    from ring.http_api import app as app_module  # the one produce handler; app imports this module

    query = dict(request.query)
    key = query.pop("partitionKey", None)
    if key:
        query["key"] = key
    return await app_module.produce(request.clone(rel_url=request.rel_url.with_query(query)))


ROUTES = [
    ("GET", "/v1/groups", list_groups),
    ("GET", "/v1/groups/{group}", describe),
    ("POST", "/v1/groups/{group}/members", join),
    ("POST", "/v1/groups/{group}/members/{consumer}/poll", poll),
    ("DELETE", "/v1/groups/{group}/members/{consumer}", leave),
    ("GET", "/v1/groups/{group}/members/{consumer}/positions", positions),
    ("PUT", "/v1/groups/{group}/members/{consumer}/positions", positions),
    ("POST", "/v1/groups/{group}/offsets", commit),
    ("PUT", "/v1/groups/{group}/offsets/{topic}", reset),
    ("PUT", "/v1/consumer/register", polar_register),
    ("POST", "/v1/consumer/poll", polar_poll),
    ("POST", "/v1/consumer/commit", polar_commit),
    ("POST", "/v1/consumer/goodbye", polar_goodbye),
    ("POST", "/v1/topic/{topic}/messages", polar_produce),
]


def register(app: web.Application) -> None:
    """Add the group routes and the coordinator's lifecycle to the client app (``app.make_app``)."""
    from ring.http_api.app import BROKER_KEY

    groups = Groups(app[BROKER_KEY])
    app[GROUPS_KEY] = groups
    metrics = getattr(groups.broker, "metrics", None)
    if metrics is not None:
        metrics.group_source = groups.lag_rows
    app[POLAR_KEY] = OrderedDict()
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)

    async def stop(_: web.Application) -> None:
        await groups.coord.close()

    app.on_cleanup.append(stop)


__all__ = ["OPENAPI_PATHS", "ROUTES", "register"]
