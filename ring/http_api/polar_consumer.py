"""PolarStreams' consumer port: register, poll, commit, goodbye, over ring's consumer groups.

A PolarStreams consumer (``polar_consumers``) is a member of the ring group it
registers in, with PolarStreams' session timeout; requests reach the group's
coordinator through ``groups_api`` (``join_member``, ``poll_member``,
``commit_member``, ``leave_member``) as ring's own group routes do.

Register (``PUT``, or ``POST`` as older clients do): ``?consumerId=&group=&topic=&onNewGroup=``
(``consumer_id`` for older clients) registers a stateless consumer on every
live broker (200 ``OK``, or ``Already registered``); without an id in the
query, a JSON body ``{"id", "group", "topics", "onNewGroup"?}`` binds the
consumer to the connection. 400 for an unknown ``onNewGroup``, an id
registered with another group or other topics, an empty id or topic list, or
a body that is not such JSON.

Poll: PolarStreams' clients poll every broker, and each answers with records
of the consumer's partitions it leads (``poll_member(..., leader=)``), so no
two brokers hand out the same records. 204 with ``Retry-After: 5`` when this
broker leads none of them, ``Retry-After: 1`` when they hold nothing new;
else the records, in PolarStreams' binary encoding unless ``Accept`` is
exactly ``application/json`` (``polar_codec``). A poll commits the consumer's
positions; they move past an answer only once the client has shown it got
it: PolarStreams' clients name no token, so that is when the next request on
the connection that carried the whole answer arrives (``link``). An answer
lost on the way is handed out again and nothing of it is committed.

Commit (204) commits the positions; goodbye (200 ``OK``) commits them unless
``commit=false`` and leaves the group. A consumer this broker does not know,
or whose group no longer has it, is answered 409 and must register again.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable

import aiohttp
import msgpack
import orjson

from ring import auth, limits
from ring.catalog import validate_topic_name
from ring.cluster.peers import H_SECRET
from ring.errors import BadRequest, Conflict, RingError, Unauthorized, Unavailable
from ring.group_requests import CommitOffsets, GroupPoll, validate_name
from ring.hashing import partition_token
from ring.http_api import access, codec, groups_api, polar_codec, web
from ring.http_api import answer as answers
from ring.http_api.keys import BROKER_KEY, POLAR_PORTS_KEY
from ring.http_api.polar_consumers import RESET_POLICIES, Consumer, Registry
from ring.http_api.web import Request, Response

NOT_REGISTERED = "Consumer not registered"  # PolarStreams' words (polar_api answers 409s with them)

log = logging.getLogger("ring.polar")

REGISTRY_KEY = "polar consumers"
H_NOTE = "Ring-Polar-Note"  # a broker telling another of a registration (or a goodbye): no group change
_NO_PARTITIONS_RETRY_S = "5"  # PolarStreams: no data led here for this consumer
_NO_DATA_RETRY_S = "1"  # PolarStreams: nothing new


def _ok(body: str = "OK") -> Response:
    return Response(body.encode(), content_type="text/html; charset=utf-8")


def _registry(request: Request) -> Registry:
    return request.app[REGISTRY_KEY]


def _id_param(request: Request) -> str | None:
    return request.query.get("consumerId") or request.query.get("consumer_id") or None


# --- register -------------------------------------------------------------------------


def _from_query(request: Request, consumer_id: str) -> Consumer:
    on_new = request.query.get("onNewGroup") or "startFromLatest"
    if on_new not in RESET_POLICIES:
        raise BadRequest("Invalid offset reset policy value")
    return Consumer(consumer_id, request.query.get("group") or "default", tuple(request.query.getall("topic", [])),
                    RESET_POLICIES[on_new])


def _from_body(request: Request) -> Consumer:
    try:
        doc = orjson.loads(request.body)
    except orjson.JSONDecodeError:
        doc = None
    topics = doc.get("topics") if isinstance(doc, dict) else None
    on_new = doc.get("onNewGroup") or "startFromLatest" if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not isinstance(doc.get("id", ""), str) or \
            not isinstance(doc.get("group") or "", str) or not isinstance(topics or [], list) or \
            not all(isinstance(t, str) for t in topics or []) or on_new not in RESET_POLICIES:
        raise BadRequest("Invalid ConsumerInfo payload")
    return Consumer(doc.get("id") or "", doc.get("group") or "default", tuple(topics or ()), RESET_POLICIES[on_new])


async def register(request: Request) -> Response:
    consumer_id = _id_param(request)
    consumer = _from_query(request, consumer_id) if consumer_id else _from_body(request)
    if not consumer.id or not consumer.topics:
        raise BadRequest("Consumer id and topics can not be empty")
    validate_name(consumer.id, "consumerId")
    validate_name(consumer.group, "group")
    for topic in consumer.topics:
        validate_topic_name(topic)
    registry = _registry(request)
    known = registry.get(consumer.id)
    if known is not None and not known.same_as(consumer):
        raise BadRequest("Consumer already registered with different parameters")
    if H_NOTE in request.headers:  # another broker registered it: remember the id, the group has it already
        _check_broker(request)
        registry.put(consumer)
        return _ok()
    access.require(request, auth.CONSUME, consumer.topics)
    answer = await groups_api.join_member(request, consumer.group, consumer.id, list(consumer.topics),
                                          limits.POLAR_SESSION_TIMEOUT_MS, "polar", consumer.reset)
    _raise_for(answer)
    registry.put(consumer)
    if consumer_id:
        await _tell_brokers(request, "register", consumer)
    else:
        registry.bind(request.conn, consumer)
    return _ok("Already registered" if known is not None else "OK")


def _check_broker(request: Request) -> None:
    if not auth.secret_matches(request.app[BROKER_KEY].config.cluster_secret, request.headers.get(H_SECRET)):
        raise Unauthorized("wrong cluster secret")


async def _tell_brokers(request: Request, what: str, consumer: Consumer) -> None:
    """Tell every other live broker of a registration (all must take it) or a goodbye (best effort)."""
    broker = request.app[BROKER_KEY]
    membership, peers = getattr(broker, "membership", None), getattr(broker, "peers", None)
    if membership is None or peers is None:
        return
    port = request.app[POLAR_PORTS_KEY].consumer
    on_new = next(k for k, v in RESET_POLICIES.items() if v == consumer.reset)
    query = [("consumerId", consumer.id), ("group", consumer.group), ("onNewGroup", on_new),
             *(("topic", t) for t in consumer.topics)]
    failed = []
    for b in broker.cluster()["brokers"]:
        url = membership.client_url(b["name"])
        if b["name"] == broker.config.name or url is None or not membership.alive(b["name"]):
            continue
        target = f"{broker.config.tls.scheme}://{_host_of(url)}:{port}/v1/consumer/{what}"
        try:
            method = "PUT" if what == "register" else "POST"
            async with peers.session.request(method, target, params=query, headers={H_NOTE: "1"}) as resp:
                await resp.read()
                if resp.status != 200:
                    failed.append(f"{b['name']} ({resp.status})")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            failed.append(f"{b['name']} ({exc!r})")
    if failed and what == "register":
        raise Unavailable(f"consumer {consumer.id!r} could not be registered on {', '.join(failed)}; retry")
    if failed:
        log.info("telling brokers of %s's goodbye failed: %s", consumer.id, ", ".join(failed))


def _host_of(url: str) -> str:
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return f"[{host}]" if ":" in host else host


# --- who is asking --------------------------------------------------------------------


def _who(request: Request) -> Consumer:
    """The consumer a request comes from: its connection's, else the id it names."""
    registry = _registry(request)
    consumer_id = _id_param(request)
    bound = registry.bound(request.conn)
    if bound is not None:
        if consumer_id and consumer_id != bound.id:
            raise Conflict(f"this connection is registered as consumer {bound.id!r}, not {consumer_id!r}")
        return bound
    found = registry.get(consumer_id) if consumer_id else None
    if found is None:
        raise Conflict(NOT_REGISTERED)
    return found


def _raise_for(answer: Response) -> None:
    """An error answer of the coordinator, raised as the error it stands for."""
    if answer.status < 300:
        return
    from ring.cluster.peers import Relayed

    try:
        doc = orjson.loads(answers.body_bytes(answer))
    except orjson.JSONDecodeError:
        doc = {}
    raise Relayed(answer.status, doc if isinstance(doc, dict) else {}, (answer.headers or {}).get("Retry-After"))


async def _answered(request: Request, consumer: Consumer, call: Awaitable[Response]) -> Response:
    """The coordinator's answer to ``call``, its errors raised; a 409 (the group does not have the
    consumer) also forgets the consumer here."""
    try:
        answer = await call
        _raise_for(answer)
        return answer
    except RingError as exc:
        if exc.status == 409:
            _gone(request, consumer)
        raise


def _gone(request: Request, consumer: Consumer) -> None:
    """The group no longer has ``consumer``: forget it here, it must register again."""
    _registry(request).forget(consumer.id)
    _registry(request).unbind(request.conn)


# --- poll, commit, goodbye ------------------------------------------------------------


def _token_of(broker: Any) -> Any:
    def token(topic: str, partition: int) -> int:
        cfg = broker.catalog.get(topic) if topic in broker.catalog else None
        if cfg is None or partition >= cfg.partitions:
            return 0
        return partition_token(topic, partition, cfg.partitions, cfg.base_partitions)

    return token


async def poll(request: Request) -> Response:
    consumer = _who(request)
    broker = request.app[BROKER_KEY]
    req = GroupPoll(consumer.group, consumer.id, None, limits.FETCH_RECORDS_DEFAULT, 0, True,
                    groups_api.acknowledged(request, consumer.group, consumer.id, None), broker.config.name)
    answer = await _answered(request, consumer, groups_api.poll_member(request, req, codec.CT_MSGPACK))
    doc = msgpack.unpackb(answers.body_bytes(answer), raw=False)
    token_header = {groups_api.H_POLL_TOKEN: (answer.headers or {}).get(groups_api.H_POLL_TOKEN, "")}
    if not doc["records"]:
        retry = _NO_PARTITIONS_RETRY_S if doc.get("partitions") == 0 else _NO_DATA_RETRY_S
        empty = Response(b"", 204, None, {"Retry-After": retry, **token_header})
        return groups_api._carried(request, empty, consumer.group, consumer.id)
    items = polar_codec.items_of(doc["records"], _token_of(broker), doc["generation"])
    del doc
    if request.headers.get("Accept") == polar_codec.CT_JSON:
        body, ctype = polar_codec.encode_json(items), polar_codec.CT_JSON
    else:
        body, ctype = polar_codec.encode_binary(items), polar_codec.CT_CONSUMER_MESSAGE
    out = answers.response(body, ctype, token_header)
    return groups_api._carried(request, out, consumer.group, consumer.id)


async def commit(request: Request) -> Response:
    consumer = _who(request)
    req = CommitOffsets(consumer.group, consumer.id, None, None,
                        groups_api.acknowledged(request, consumer.group, consumer.id, None))
    await _answered(request, consumer, groups_api.commit_member(request, req))
    return Response(b"", 204, None, {"Retry-After": _NO_DATA_RETRY_S})


async def goodbye(request: Request) -> Response:
    if H_NOTE in request.headers:  # another broker said goodbye to this consumer
        _check_broker(request)
        if (consumer_id := _id_param(request)) is not None:
            _registry(request).forget(consumer_id)
        return _ok()
    consumer = _who(request)
    commit_first = request.query.get("commit") != "false"
    await _answered(request, consumer, groups_api.leave_member(request, consumer.group, consumer.id, commit_first,
                                                               None))
    _gone(request, consumer)
    await _tell_brokers(request, "goodbye", consumer)
    return _ok()


def install(app: web.App) -> None:
    """The consumer routes on the consumer port's app."""
    app[REGISTRY_KEY] = Registry(app[BROKER_KEY].clock.monotonic)
    for method in ("PUT", "POST"):  # a registration by body (connection-bound) reads one
        app.router.add(method, "/v1/consumer/register", register, body_max=limits.ADMIN_BODY_BYTES_MAX)
    app.router.add("POST", "/v1/consumer/poll", poll)
    app.router.add("POST", "/v1/consumer/commit", commit)
    app.router.add("POST", "/v1/consumer/goodbye", goodbye)
