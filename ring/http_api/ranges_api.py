"""The HTTP side of ranges (``ring.ranges``): one client route, the peer routes, their OpenAPI item.

Client port:

* ``GET /v1/topics/{topic}/partitions/{partition}/ranges``: the partition's
  ranges as a replica's catalogue lists them (a broker without a replica
  asks one): ``{"earliest_offset", "local_start_offset", "ranges":
  [{"base_offset", "end_offset", "bytes", "holders", "local", ...}]}``.

Peer port (behind the cluster secret, like every peer route):

* ``POST /peer/v1/ranges/{t}/{p}/catalogue``: a leader's catalogue
  (msgpack); the answer is this replica's, merged with it and saved first.
  ``GET`` the same path: this replica's catalogue (a follower whose log
  starts past the ranges it knows of asks its leader).
* ``POST /peer/v1/ranges/{t}/{p}/copy``: hold a range (JSON order: offsets,
  size, checksum, sources); answered once the copy is verified and on disk,
  507 when this broker's free disk is below its floor.
* ``GET /peer/v1/ranges/{t}/{p}/bytes?base=&end=``: a range's bytes, from
  a held copy or this broker's replica log (a copy's source).
* ``GET /peer/v1/ranges/{t}/{p}``: the ranges held here, ``[[base, end,
  checksum], ...]`` (the leader's audit).
* ``DELETE /peer/v1/ranges/{t}/{p}?base=``: drop a held range.
* ``POST /peer/v1/ranges/{t}/{p}/start?offset=``: the partition starts
  there (retention, truncation): nothing below is served from here.
* ``GET /peer/v1/ranges/{t}/{p}/offset?base=&timestamp=``: the first offset
  at or after ``timestamp`` in a held range.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ring import limits
from ring.catalog import validate_topic_name
from ring.errors import BadRequest, Unavailable
from ring.http_api import codec
from ring.http_api import web as front
from ring.http_api.keys import BROKER_KEY, NODE_KEY

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
CT_MSGPACK = "application/msgpack"


def _json(doc: Any) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


def _key(request: web.Request | front.Request) -> tuple[str, int]:
    raw = request.match_info["partition"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > _INT32_MAX:
        raise BadRequest(f"partition must be a non-negative 32-bit integer, not {raw[:20]!r}")
    return validate_topic_name(request.match_info["topic"]), int(raw)


def _ranges_of(node: Any) -> Any:
    ranges = getattr(node, "ranges", None)
    if ranges is None or getattr(node, "membership", None) is None:
        raise Unavailable("the broker is starting")
    return ranges


def _int(request: web.Request, name: str, hi: int = _INT64_MAX) -> int:
    value = codec.int_param(request.query, name, None, 0, hi)
    if value is None:
        raise BadRequest(f"{name} is required")
    return value


# --- the client route ---------------------------------------------------------------


async def get_ranges(request: front.Request) -> front.Response:
    broker = request.app[BROKER_KEY]
    topic, partition = _key(request)
    describe = getattr(broker, "describe_ranges", None)
    if describe is None:
        raise Unavailable("a broker alone keeps every partition whole: it has no ranges")
    return front.json(await describe(topic, partition))


ROUTES = [
    ("GET", "/v1/topics/{topic}/partitions/{partition}/ranges", get_ranges),
]


def register(app: front.App) -> None:
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler)


_ERROR = {"$ref": "#/components/schemas/Error"}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


_RANGE = {"type": "object", "required": ["base_offset", "end_offset", "bytes", "holders", "local"], "properties": {
    "base_offset": {"type": "integer"}, "end_offset": {"type": "integer", "description": "exclusive"},
    "bytes": {"type": "integer"}, "holders": {"type": "array", "items": {"type": "string"}},
    "copies": {"type": "integer", "description": "holders the range should have"},
    "local": {"type": "boolean", "description": "the answering replica's own log still has these offsets"},
    "checksum": {"type": "string"}, "max_timestamp": {"type": "integer"}}}

OPENAPI_PATHS: dict[str, Any] = {
    "/v1/topics/{topic}/partitions/{partition}/ranges": {
        "get": {
            "summary": "Where a partition's ranges live",
            "operationId": "getRanges",
            "description": "The partition's closed segments spread over the ring (topics with "
                           "local_retention_bytes >= 0): offsets, bytes, and the brokers holding each. "
                           "A broker that holds a range answers fetches in it; offsets below "
                           "local_start_offset are read from the holders.",
            "parameters": [{"name": "topic", "in": "path", "required": True, "schema": {"type": "string"}},
                           {"name": "partition", "in": "path", "required": True,
                            "schema": {"type": "integer", "minimum": 0}}],
            "responses": {
                "200": {"description": "the partition's ranges", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["ranges"], "properties": {
                        "earliest_offset": {"type": "integer"}, "local_start_offset": {"type": "integer"},
                        "ranges": {"type": "array", "items": _RANGE}}}}}},
                "400": _err("malformed topic or partition"),
                "404": _err("unknown topic or partition"),
                "503": _err("no replica of the partition answered; retry"),
            },
        },
    },
}


# --- the peer routes --------------------------------------------------------------------


def _node(request: web.Request) -> Any:
    return request.app[NODE_KEY]


async def catalogue(request: web.Request) -> web.Response:
    node = _node(request)
    topic, partition = _key(request)
    body = await codec.read_body(request, limits.RANGES_PER_PARTITION_MAX * 256)
    return web.Response(body=_ranges_of(node).on_catalogue(topic, partition, body), content_type=CT_MSGPACK)


async def get_catalogue(request: web.Request) -> web.Response:
    topic, partition = _key(request)
    return web.Response(body=_ranges_of(_node(request)).catalogue_bytes(topic, partition), content_type=CT_MSGPACK)


async def copy(request: web.Request) -> web.Response:
    node = _node(request)
    topic, partition = _key(request)
    doc = codec.json_body(await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX))
    return _json(await _ranges_of(node).copier.on_order(topic, partition, doc))


async def range_bytes(request: web.Request) -> web.StreamResponse:
    node = _node(request)
    key = _key(request)
    base, end = _int(request, "base"), _int(request, "end")
    chunks = _ranges_of(node).copier.local_chunks(key, base, end)  # raises before anything is sent
    first = next(chunks, b"")
    resp = web.StreamResponse(headers={"Content-Type": "application/vnd.ring.batches"})
    await resp.prepare(request)
    await resp.write(first)
    for chunk in chunks:
        await resp.write(chunk)
    await resp.write_eof()
    return resp


async def held(request: web.Request) -> web.Response:
    ranges = _ranges_of(_node(request))
    return _json([[m.base, m.end, m.checksum] for m in ranges.store.ranges(_key(request))])


async def drop(request: web.Request) -> web.Response:
    ranges = _ranges_of(_node(request))
    base = _int(request, "base")
    ranges.store.drop(_key(request), base, "its partition's leader let it go")
    return _json({"dropped": base})


async def start(request: web.Request) -> web.Response:
    ranges = _ranges_of(_node(request))
    offset = _int(request, "offset")
    ranges.store.set_start(_key(request), offset)
    return _json({"start": ranges.store.start(_key(request))})


async def offset(request: web.Request) -> web.Response:
    ranges = _ranges_of(_node(request))
    topic, partition = _key(request)
    found = ranges.reads.offset_in_held(topic, partition, _int(request, "base"), _int(request, "timestamp"))
    return _json({"offset": found})


PEER_ROUTES = [
    ("POST", "/peer/v1/ranges/{topic}/{partition}/catalogue", catalogue),
    ("GET", "/peer/v1/ranges/{topic}/{partition}/catalogue", get_catalogue),
    ("POST", "/peer/v1/ranges/{topic}/{partition}/copy", copy),
    ("GET", "/peer/v1/ranges/{topic}/{partition}/bytes", range_bytes),
    ("GET", "/peer/v1/ranges/{topic}/{partition}", held),
    ("DELETE", "/peer/v1/ranges/{topic}/{partition}", drop),
    ("POST", "/peer/v1/ranges/{topic}/{partition}/start", start),
    ("GET", "/peer/v1/ranges/{topic}/{partition}/offset", offset),
]


def register_peer(app: web.Application) -> None:
    for method, path, handler in PEER_ROUTES:
        app.router.add_route(method, path, handler)
