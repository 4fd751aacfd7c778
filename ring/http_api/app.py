"""The client API's routes and their handlers: parse, call the broker, encode.

Handlers stay thin: parameters and bodies are decoded by ``codec``, all
decisions (placement, durability, long-polls, offsets) are the broker's, and
errors are raised as ``ring.errors`` for the middleware to answer. Every
route here must be described in ``openapi.py``; a test compares the two.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ring import auth, limits, metrics
from ring.broker import Broker
from ring.catalog import TopicConfig, check_not_internal, validate_topic_name
from ring.errors import BadRequest, PayloadTooLarge
from ring.http_api import access, admin, answer, cluster_api, codec, groups_api, openapi, ranges_api
from ring.http_api import budget as body_budget
from ring.http_api.codec import CT_BATCHES, CT_NDJSON, H_HIGH_WATERMARK, H_NEXT_OFFSET
from ring.http_api.middleware import errors_middleware
from ring.replication import protocol

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker", Broker)

_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def _broker(request: web.Request) -> Broker:
    return request.app[BROKER_KEY]


def _topic(request: web.Request) -> str:
    return validate_topic_name(request.match_info["topic"])


def _partition(request: web.Request) -> int:
    raw = request.match_info["partition"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > _INT32_MAX:
        raise BadRequest(f"partition must be a non-negative 32-bit integer, not {raw[:20]!r}")
    return int(raw)


# --- broker and document --------------------------------------------------------


async def get_status(request: web.Request) -> web.Response:
    doc = _broker(request).status()
    # Not ready while joining: readiness probes and launchers wait for the cluster.
    return _json(doc, status=503 if doc["status"] == "joining" else 200)


async def get_cluster(request: web.Request) -> web.Response:
    return _json(_broker(request).cluster())


async def get_openapi(request: web.Request) -> web.Response:
    return _json(openapi.document())


# --- topics ---------------------------------------------------------------------


async def list_topics(request: web.Request) -> web.Response:
    return _json({"topics": _broker(request).list_topics()})


async def create_topic(request: web.Request) -> web.Response:
    broker = _broker(request)
    body = codec.json_body(await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX))
    cfg = TopicConfig.from_request(body, now_ms=broker.clock.wall_ms())
    check_not_internal(cfg.name, "create")
    access.require(request, auth.ADMIN, [cfg.name])
    placed = broker.brokers_placed()
    if "replication_factor" in body and cfg.replication_factor > placed:
        # Kafka's InvalidReplicationFactor. Left out, the factor is the default, capped at the ring's size.
        raise BadRequest(f"replication_factor {cfg.replication_factor} is larger than the {placed} broker(s) "
                         "of the cluster", field="replication_factor", brokers=placed)
    return _json(await broker.add_topic(cfg), status=201)


async def describe_topic(request: web.Request) -> web.Response:
    return _json(_broker(request).describe_topic(_topic(request)))


async def change_topic(request: web.Request) -> web.Response:
    topic = _topic(request)
    check_not_internal(topic, "change")
    body = codec.json_body(await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX))
    return _json(await _broker(request).change_topic(topic, body))


async def delete_topic(request: web.Request) -> web.Response:
    topic = _topic(request)
    check_not_internal(topic, "delete")
    await _broker(request).delete_topic(topic)
    return _json({"deleted": topic})


# --- records --------------------------------------------------------------------


def _arrived_body(request: web.Request) -> bytes | None:
    """The body when all of it came in with the request's head, as a small produce's does: taken
    at once, without the streaming read and its timer. None when some of it is still to come."""
    declared, content = request.content_length, request.content
    if declared is None or declared > limits.REQUEST_BYTES_MAX or not content.is_eof():
        return None
    try:
        body = content.read_nowait(-1)
    except (RequestPayloadError, HttpProcessingError) as exc:
        raise BadRequest(f"request body is incomplete or malformed: {exc}") from None
    if len(body) > limits.REQUEST_BYTES_MAX:  # a Content-Encoding'd body, inflated by aiohttp
        raise PayloadTooLarge(f"request body is over the limit of {limits.REQUEST_BYTES_MAX} bytes",
                              limit_bytes=limits.REQUEST_BYTES_MAX)
    body_budget.charge(request, len(body))
    return body


async def produce(request: web.Request) -> web.Response:
    broker = _broker(request)
    topic = _topic(request)
    partition = codec.int_param(request.query, "partition", None, 0, _INT32_MAX)
    key = codec.key_param(request.query)
    consistency = request.query.get("consistency") or None  # None: the topic's default
    if consistency is not None:
        protocol.parse_consistency(consistency)  # 400 before reading the body
    producer_id = codec.int_param(request.query, "producer_id", None, 0, _INT64_MAX)
    sequence = codec.int_param(request.query, "sequence", None, 0, _INT32_MAX)
    if (producer_id is None) != (sequence is None):
        raise BadRequest("producer_id and sequence go together (an idempotent produce)")
    ctype = codec.produce_type(request)  # 415 before reading a byte of the body
    body = _arrived_body(request) if ctype != CT_NDJSON else None
    if body is None:
        line_max = limits.NDJSON_LINE_BYTES_MAX if ctype == CT_NDJSON else None
        body = await codec.read_body(request, limits.REQUEST_BYTES_MAX, line_max)
    decoded = codec.decode_produce(ctype, body, key)
    del body  # the decoded records are copies: the body is not held while replicas acknowledge
    if isinstance(decoded, codec.Batches):
        if producer_id is not None:
            raise BadRequest("stored batches carry producer_id and base_sequence in their headers, not the query")
        return _json((await broker.produce_batches(topic, partition, key, decoded.batches, consistency)).to_json())
    results = await broker.produce_records(topic, partition, decoded.records, decoded.sizes,
                                           decoded.values_are_json, decoded.keyed, consistency,
                                           None if producer_id is None else (producer_id, sequence))
    if len(results) == 1:
        return _json(results[0].to_json())
    return _json({"results": [r.to_json() for r in results]})


async def fetch(request: web.Request) -> web.Response:
    broker = _broker(request)
    topic, partition = _topic(request), _partition(request)
    q = request.query
    offset = codec.int_param(q, "offset", None, 0, _INT64_MAX)
    max_records = codec.int_param(q, "max_records", limits.FETCH_RECORDS_DEFAULT, 1, limits.FETCH_RECORDS_MAX)
    max_bytes = codec.int_param(q, "max_bytes", limits.FETCH_BYTES_DEFAULT, 1, limits.FETCH_BYTES_MAX)
    wait_ms = codec.int_param(q, "wait_ms", 0, 0, limits.LONG_POLL_WAIT_MS_MAX)
    accept = codec.fetch_type(request.headers.get("Accept"))
    budget = answer.budget_of(broker)
    # Ask for no more than the answers in flight leave room for; no await from the
    # read to the hold, so what was read is counted before anything else runs.
    result = await broker.fetch(topic, partition, offset, budget.grant(max_bytes), wait_ms)
    hold = budget.hold(len(result.data))
    try:
        if accept == CT_BATCHES:
            next_offset = codec.batches_next_offset(result.data, result.offset)
            body = result.data
        else:
            selected, next_offset = codec.select_records(result.data, result.offset, max_records,
                                                         result.high_watermark)
            body = codec.encode_fetch(accept, topic, partition, selected, next_offset, result.high_watermark)
            del selected
            hold.resize(len(body))
    except BaseException:
        hold.release()
        raise
    headers = {H_NEXT_OFFSET: str(next_offset), H_HIGH_WATERMARK: str(result.high_watermark)}
    return answer.response(body, accept, headers, hold)


async def offsets(request: web.Request) -> web.Response:
    timestamp = request.query.get("timestamp")
    if not timestamp or (timestamp not in ("earliest", "latest") and not codec.is_integer(timestamp)):
        raise BadRequest("timestamp is required: milliseconds since the epoch (ASCII digits), earliest or latest")
    return _json(await _broker(request).offsets(_topic(request), _partition(request), timestamp))


async def truncate(request: web.Request) -> web.Response:
    topic, partition = _topic(request), _partition(request)
    body = codec.json_body(await codec.read_body(request, limits.ADMIN_BODY_BYTES_MAX))
    before = body.get("before_offset") if isinstance(body, dict) else None
    if type(before) is not int or before < 0:
        raise BadRequest('the body must be {"before_offset": <non-negative integer>}')
    return _json(await _broker(request).truncate(topic, partition, before))


ROUTES = [
    ("GET", "/v1/status", get_status),
    ("GET", "/v1/cluster", get_cluster),
    ("GET", "/v1/openapi.json", get_openapi),
    ("GET", "/v1/topics", list_topics),
    ("POST", "/v1/topics", create_topic),
    ("GET", "/v1/topics/{topic}", describe_topic),
    ("PATCH", "/v1/topics/{topic}", change_topic),
    ("DELETE", "/v1/topics/{topic}", delete_topic),
    ("POST", "/v1/topics/{topic}/messages", produce),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/messages", fetch),
    ("GET", "/v1/topics/{topic}/partitions/{partition}/offsets", offsets),
    ("POST", "/v1/topics/{topic}/partitions/{partition}/truncate", truncate),
]


def make_app(broker: Broker, tokens: auth.TokenTable | None = None) -> web.Application:
    """The client API; ``tokens`` (from --auth-tokens) turns client authentication on."""
    # client_max_size is a backstop: every body is read by codec.read_body,
    # which counts bytes itself with the limit of its route.
    guard = access.make_middleware(tokens, broker.config.cluster_secret, broker.config.tls.mutual)
    app = web.Application(middlewares=[errors_middleware, guard, body_budget.body_budget_of(broker).middleware()],
                          client_max_size=limits.REQUEST_BYTES_MAX)
    app[BROKER_KEY] = broker
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    admin.install(app, broker)  # the admin page at /
    broker.metrics = metrics.install(app, broker)  # GET /metrics, and counts every request
    groups_api.register(app)  # consumer groups
    cluster_api.register(app)  # membership changes (decommission)
    ranges_api.register(app)  # where a partition's ranges live
    return app
