"""The client API's routes and their handlers: parse, call the broker, encode.

Handlers stay thin: parameters and bodies are decoded by ``codec``, all
decisions (placement, durability, long-polls, offsets) are the broker's, and
errors are raised as ``ring.errors`` for the front to answer (``front.py``). Every
route here must be described in ``openapi.py``; a test compares the two.
"""

from __future__ import annotations

from typing import Any, Awaitable

from ring import answer_budget, auth, limits
from ring.broker import Broker
from ring.catalog import TopicConfig, check_not_internal, check_replicas_placeable, validate_topic_name
from ring.cluster import unclean
from ring.errors import BadRequest
from ring.fetch import Fetch
from ring.offsets import OffsetsAt, Truncate, parse_at
from ring.http_api import (access, admin, answer, cluster_api, codec, fetch_codec, groups_api, metrics, openapi,
                           ranges_api, web)
from ring.http_api.admission import AdmissionCollector, admission_of
from ring.http_api.budget import body_budget_of
from ring.http_api.codec import CT_BATCHES, CT_NDJSON, H_HIGH_WATERMARK, H_NEXT_OFFSET
from ring.http_api.web import Request, Response
from ring.http_api.keys import BROKER_KEY
from ring.log import selection
from ring.produce import Batches, Produce
from ring.replication import protocol
from ring.replication.intake import ProduceResult, is_pending
from ring.replication.reads import StoredRead

BUDGET_KEY = "answer budget"  # the broker's answer_budget.budget_of, looked up once

_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_json = web.json


def _broker(request: Request) -> Broker:
    return request.app[BROKER_KEY]


_VALID_TOPICS: set[str] = set()  # names that passed validate_topic_name: the check is a pure function of the name


def _topic(request: Request) -> str:
    name = request.match_info["topic"]
    if name in _VALID_TOPICS:
        return name
    validate_topic_name(name)
    if len(_VALID_TOPICS) >= limits.TOPIC_NAMES_REMEMBERED_MAX:
        _VALID_TOPICS.clear()
    _VALID_TOPICS.add(name)
    return name


def _partition(request: Request) -> int:
    raw = request.match_info["partition"]
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or int(raw) > _INT32_MAX:
        raise BadRequest(f"partition must be a non-negative 32-bit integer, not {raw[:20]!r}")
    return int(raw)


# --- broker and document --------------------------------------------------------


def get_status(request: Request) -> Response:
    doc = _broker(request).status()
    doc["admission"] = request.app.admission.snapshot()  # load, refusals and throttling: see docs/OPERATIONS.md
    # Not ready while joining: readiness probes and launchers wait for the cluster.
    return _json(doc, status=503 if doc["status"] == "joining" else 200)


def get_cluster(request: Request) -> Response:
    return _json(_broker(request).cluster())


def get_openapi(request: Request) -> Response:
    return Response(openapi.document_bytes())


# --- topics ---------------------------------------------------------------------


def list_topics(request: Request) -> Response:
    return _json({"topics": _broker(request).list_topics()})


async def create_topic(request: Request) -> Response:
    broker = _broker(request)
    body = codec.json_body(request.body)
    cfg = TopicConfig.from_request(body, now_ms=broker.clock.wall_ms())
    check_not_internal(cfg.name, "create")
    access.require(request, auth.ADMIN, [cfg.name])
    if "replication_factor" in body:
        check_replicas_placeable(cfg, broker.brokers_placed())
    return _json(await broker.add_topic(cfg), status=201)


def describe_topic(request: Request) -> Response:
    return _json(_broker(request).describe_topic(_topic(request)))


async def change_topic(request: Request) -> Response:
    topic = _topic(request)
    check_not_internal(topic, "change")
    body = codec.json_body(request.body)
    return _json(await _broker(request).change_topic(topic, body))


async def delete_topic(request: Request) -> Response:
    topic = _topic(request)
    check_not_internal(topic, "delete")
    await _broker(request).delete_topic(topic)
    return _json({"deleted": topic})


# --- records --------------------------------------------------------------------


class _ProduceParams:
    """A produce's parameters, checked before its body is read (``prepare_produce``)."""

    __slots__ = ("topic", "partition", "key", "consistency", "producer", "timeout_ms", "ctype", "line_bytes_max")


def prepare_produce(request: Request) -> None:
    """400 for a bad parameter and 415 for a body produce does not speak, before a byte of the body."""
    q = request.query
    args = _ProduceParams()
    args.topic = _topic(request)
    args.partition = codec.int_param(q, "partition", None, 0, _INT32_MAX)
    args.key = codec.key_param(q)
    consistency = q.get("consistency") or None  # None: the topic's default
    if consistency is not None:
        protocol.parse_consistency(consistency)
    args.consistency = consistency
    producer_id = codec.int_param(q, "producer_id", None, 0, _INT64_MAX)
    sequence = codec.int_param(q, "sequence", None, 0, _INT32_MAX)
    if (producer_id is None) != (sequence is None):
        raise BadRequest("producer_id and sequence go together (an idempotent produce)")
    args.producer = None if producer_id is None else (producer_id, sequence)
    args.timeout_ms = codec.int_param(q, "timeout_ms", None, 1, limits.PRODUCE_TIMEOUT_MS_MAX)
    args.ctype = codec.produce_type(request)
    args.line_bytes_max = limits.NDJSON_LINE_BYTES_MAX if args.ctype == CT_NDJSON else None
    request.state = args


def produce(request: Request) -> web.Answer:
    """Decode into one ``Produce`` and hand it to the broker: answered with no task from the partition's
    turn write, or from the forward link's answer, when the broker can send the records on at once
    (an ``Appending`` or a ``Forwarding``: each a future of (base offset, count)), else through the
    awaited path (a coroutine)."""
    broker = _broker(request)
    args: _ProduceParams = request.state
    decoded = codec.decode_produce(args.ctype, request.body, args.key)
    request.body = b""  # the decoded records are copies: the body is not held while they are framed and acknowledged
    if args.producer is not None and type(decoded) is Batches:
        raise BadRequest("stored batches carry producer_id and base_sequence in their headers, not the query")
    got = broker.intake.produce(Produce(args.topic, decoded, args.partition, args.key, args.consistency,
                                        args.producer, args.timeout_ms))
    if is_pending(got):
        return web.Later(got, lambda _: _produced(args.topic, got.partition, *got.result()))
    return _produce_answer(got)


def _produced(topic: str, partition: int, base: int, count: int) -> Response:
    resp = Response(b'{"topic":"%s","partition":%d,"base_offset":%d,"count":%d}'
                    % (topic.encode(), partition, base, count))
    resp.records = count
    return resp


async def _produce_answer(pending: Awaitable[list[ProduceResult]]) -> Response:
    results = await pending
    resp = _json(results[0].to_json()) if len(results) == 1 else _json({"results": [r.to_json() for r in results]})
    resp.records = sum(r.count for r in results)
    return resp


def fetch(request: Request) -> web.Answer:
    broker = _broker(request)
    topic, partition = _topic(request), _partition(request)
    q = request.query
    offset = codec.int_param(q, "offset", None, 0, _INT64_MAX)
    max_records = codec.int_param(q, "max_records", limits.FETCH_RECORDS_DEFAULT, 1, limits.FETCH_RECORDS_MAX)
    max_bytes = codec.int_param(q, "max_bytes", limits.FETCH_BYTES_DEFAULT, 1, limits.FETCH_BYTES_MAX)
    wait_ms = codec.int_param(q, "wait_ms", 0, 0, limits.LONG_POLL_WAIT_MS_MAX)
    accept = codec.fetch_type(request.headers.get("Accept"))
    budget: answer_budget.AnswerBudget = request.app[BUDGET_KEY]
    # Ask for no more than the answers in flight leave room for; no await from the
    # read to the hold, so what was read is counted before anything else runs.
    # Decoded answers hold at most max_records, so the read stops at the batch holding the last;
    # stored batches are answered up to max_bytes, whatever max_records says (the fast path).
    result = broker.fetch(Fetch(topic, partition, offset, budget.grant(max_bytes), wait_ms,
                                None if accept == CT_BATCHES else max_records))
    if not isinstance(result, StoredRead):  # a long-poll, or a read another replica answers
        return _fetch_later(budget, result, offset, max_records, accept)
    return _fetched(budget, result, offset, max_records, accept)


async def _fetch_later(budget: answer_budget.AnswerBudget, later: Awaitable[StoredRead], offset: int | None,
                       max_records: int, accept: str) -> Response:
    return _fetched(budget, await later, offset, max_records, accept)


def _fetched(budget: answer_budget.AnswerBudget, result: StoredRead, offset: int | None, max_records: int,
             accept: str) -> Response:
    hold = budget.hold(len(result.data))
    try:
        if accept == CT_BATCHES:
            next_offset = selection.batches_next_offset(result.data, result.offset)
            body = result.data
        else:
            selected, next_offset = selection.select_records(result.data, result.offset, max_records,
                                                         result.high_watermark)
            body = fetch_codec.encode_fetch(accept, result.topic, result.partition, selected, next_offset,
                                      result.high_watermark)
            del selected
            hold.resize(len(body))
    except BaseException:
        hold.release()
        raise
    headers = {H_NEXT_OFFSET: str(next_offset), H_HIGH_WATERMARK: str(result.high_watermark)}
    resp = answer.response(body, accept, headers, hold)
    resp.records = max(0, next_offset - offset) if offset is not None else 0
    return resp


async def offsets(request: Request) -> Response:
    at = parse_at(request.query.get("timestamp"))
    return _json(await _broker(request).offsets(OffsetsAt(_topic(request), _partition(request), at)))


async def truncate(request: Request) -> Response:
    topic, partition = _topic(request), _partition(request)
    body = codec.json_body(request.body)
    before = body.get("before_offset") if isinstance(body, dict) else None
    if type(before) is not int or before < 0:
        raise BadRequest('the body must be {"before_offset": <non-negative integer>}')
    return _json(await _broker(request).truncate(Truncate(topic, partition, before)))


async def unclean_election(request: Request) -> Response:
    topic, partition = _topic(request), _partition(request)
    check_not_internal(topic, "elect uncleanly in")
    broker = _broker(request)
    if getattr(broker, "core", None) is None:
        raise unclean.ElectionNotNeeded("a broker alone leads every partition it holds: no election is needed",
                                        topic=topic, partition=partition)
    return _json(await unclean.unclean_election(broker, topic, partition))


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
    ("POST", "/v1/topics/{topic}/partitions/{partition}/unclean-election", unclean_election),
]


# Routes that read a body, and how much of one they take; the others drop a body as it comes.
ADMIN_BODY = {"body_max": limits.ADMIN_BODY_BYTES_MAX}
BODIES: dict[Any, dict[str, Any]] = {
    create_topic: ADMIN_BODY, change_topic: ADMIN_BODY, truncate: ADMIN_BODY,
    produce: {"body_max": limits.REQUEST_BYTES_MAX, "prepare": prepare_produce},
}


def make_app(broker: Broker, tokens: auth.TokenTable | None = None) -> web.App:
    """The client API; ``tokens`` (from --auth-tokens) turns client authentication on."""
    app = web.App()
    app.body_budget = body_budget_of(broker)  # shared with /metrics
    app.admission = admission_of(broker)  # shared with PolarStreams' ports
    app.clock = broker.clock
    app[BROKER_KEY] = broker
    app[BUDGET_KEY] = answer_budget.budget_of(broker)
    if tokens is not None:
        app.guard = access.Guard(tokens, broker.config.cluster_secret, broker.config.tls.mutual)
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler, **BODIES.get(handler, {}))
    admin.install(app, broker)  # the admin page at /
    broker.metrics = metrics.install(app, broker)  # GET /metrics, and counts every request
    broker.metrics.registry.register(AdmissionCollector(app.admission))
    groups_api.register(app)  # consumer groups
    cluster_api.register(app)  # membership changes (decommission)
    ranges_api.register(app)  # where a partition's ranges live
    return app
