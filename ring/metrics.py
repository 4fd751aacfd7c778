"""Prometheus metrics of one broker, served at ``GET /metrics`` in the text format.

Two kinds of numbers. Counters and histograms of traffic are counted as
requests pass: an aiohttp middleware (outermost, so it sees the final status
of every answer, errors included) times each request and counts it by route
template, method and status, and for produce and fetch also counts records
and bytes per topic. Everything that is state (offsets, high watermarks,
replica lag, under-replicated partitions, gossip view, long-polls open, disk
used, consumer group lag) is read from the broker's own public answers
(``status()``, ``cluster()``, ``describe_topic()``) when Prometheus scrapes,
so it is never stale and costs nothing between scrapes.

Each app gets its own ``CollectorRegistry`` (several brokers can live in one
test process). Labels never take a raw path or an unchecked name: routes are
templates, and a topic label is only set once the broker has answered 2xx for
that topic, so a client cannot grow the series count by sending junk. Events
only broker internals see (elections, replication frames) are counters on
``Metrics`` for that code to bump; until it does they stay at zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Awaitable, Callable, Iterable, Iterator, NamedTuple

import orjson
from aiohttp import web
from prometheus_client import (CollectorRegistry, Counter, Histogram, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client import exposition
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ring import __version__

log = logging.getLogger("ring.metrics")

PRODUCE_ROUTE = "/v1/topics/{topic}/messages"
FETCH_ROUTE = "/v1/topics/{topic}/partitions/{partition}/messages"
NEXT_OFFSET_HEADER = "Ring-Next-Offset"
STATUSES = ("up", "suspect", "down", "joining", "leaving", "removed")
# Seconds: a produce is ~1 ms on a local disk, a long-poll fetch up to its wait (30 s at most).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GroupLag(NamedTuple):
    """One (group, topic, partition) as the group coordinator sees it."""

    group: str
    topic: str
    partition: int
    committed: int | None  # None: nothing committed yet
    end_offset: int  # the partition's high watermark
    members: int


class Metrics:
    """The registry of one broker's app and the instruments traffic and hooks update."""

    def __init__(self, broker: Any | None = None) -> None:
        disable_created_metrics()  # *_created series double the output and no dashboard reads them
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.http_requests = Counter("ring_http_requests", "HTTP requests answered, by route template and status",
                                     ["method", "route", "status"], registry=reg)
        self.http_latency = Histogram("ring_http_request_duration_seconds",
                                      "Time from request to answer (fetch includes its long-poll wait)",
                                      ["method", "route"], buckets=LATENCY_BUCKETS_S, registry=reg)
        self.produce_requests = Counter("ring_produce_requests", "Produce requests acknowledged", ["topic"],
                                        registry=reg)
        self.produce_records = Counter("ring_produce_records", "Records acknowledged to producers", ["topic"],
                                       registry=reg)
        self.produce_bytes = Counter("ring_produce_bytes", "Request body bytes of acknowledged produces",
                                     ["topic"], registry=reg)
        self.fetch_requests = Counter("ring_fetch_requests", "Fetch requests answered 200", ["topic"], registry=reg)
        self.fetch_records = Counter("ring_fetch_records",
                                     "Offsets consumers moved past (next offset - requested offset)",
                                     ["topic"], registry=reg)
        self.fetch_bytes = Counter("ring_fetch_bytes", "Response body bytes of fetches", ["topic"], registry=reg)
        # Bumped by broker internals (see docs/ADMIN.md, "hooks").
        self.elections = Counter("ring_elections", "Leader elections this broker ran, by result", ["result"],
                                 registry=reg)
        self.replication_bytes = Counter("ring_replication_sent_bytes", "Stored batch bytes sent to a follower",
                                         ["follower"], registry=reg)
        for result in ("won", "lost"):
            self.elections.labels(result)
        self._children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[tuple[str, str], Any] = {}
        self.group_source: Callable[[], Iterable[GroupLag]] | None = None
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        if broker is not None:
            reg.register(BrokerCollector(broker, self))

    # --- traffic -----------------------------------------------------------------------

    def observe(self, request: web.Request, status: int, elapsed_s: float,
                response: web.StreamResponse | None) -> None:
        info = request.match_info
        route = info.route.resource.canonical if info.route.resource is not None else "unmatched"
        method = request.method if request.method in _METHODS else "other"
        key = (method, route, str(status))
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.http_requests.labels(*key)
        child.inc()
        lkey = (method, route)
        hist = self._latency_children.get(lkey)
        if hist is None:
            hist = self._latency_children[lkey] = self.http_latency.labels(*lkey)
        hist.observe(elapsed_s)
        if not 200 <= status < 300 or response is None:
            return
        if route == PRODUCE_ROUTE and method == "POST":
            self._produced(request, response)
        elif route == FETCH_ROUTE and method == "GET":
            self._fetched(request, response)

    def _produced(self, request: web.Request, response: web.StreamResponse) -> None:
        topic = request.match_info["topic"]
        body = response.body if isinstance(response, web.Response) else None
        records = 0
        if isinstance(body, (bytes, bytearray)):
            try:
                doc = orjson.loads(body)
                results = doc.get("results", [doc])
                records = sum(int(r.get("count", 0)) for r in results)
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                records = 0
        size = request.content.total_bytes
        self.produce_requests.labels(topic).inc()
        self.produce_records.labels(topic).inc(records)
        self.produce_bytes.labels(topic).inc(size)

    def _fetched(self, request: web.Request, response: web.StreamResponse) -> None:
        topic = request.match_info["topic"]
        self.fetch_requests.labels(topic).inc()
        self.fetch_bytes.labels(topic).inc(response.content_length or 0)
        offset, next_offset = request.query.get("offset"), response.headers.get(NEXT_OFFSET_HEADER)
        if offset and next_offset and offset.isdigit() and next_offset.isdigit():
            self.fetch_records.labels(topic).inc(max(0, int(next_offset) - int(offset)))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class BrokerCollector:
    """State metrics, read from the broker when scraped."""

    def __init__(self, broker: Any, metrics: Metrics) -> None:
        self.broker = broker
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # the families depend on the broker's state: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        try:
            yield from self._collect()
        except Exception:  # a scrape must still answer; the broker log says what broke
            log.exception("collecting broker metrics failed")

    def _collect(self) -> Iterator[Metric]:
        b = self.broker
        me = b.config.name
        status = b.status()
        info = InfoMetricFamily("ring_broker", "This broker", labels=["broker", "version"])
        info.add_metric([me, __version__], {})
        yield info
        for key, name, doc in (("uptime_s", "ring_uptime_seconds", "Seconds since the broker opened"),
                               ("long_polls_open", "ring_long_polls_open", "Fetches waiting for data now"),
                               ("topics", "ring_topics", "Topics in the catalogue"),
                               ("partitions", "ring_partition_replicas_held", "Partition replicas on this broker")):
            if isinstance(status.get(key), (int, float)):
                yield GaugeMetricFamily(name, doc, value=status[key])
        if isinstance(status.get("fsyncs"), int):
            yield CounterMetricFamily("ring_fsyncs", "fsync calls on partition logs", value=status["fsyncs"])
        ready = _gauge("ring_broker_ready", "1 when /v1/status answers 200 (not joining, not shutting down)")
        ready.add_metric([], 1.0 if status.get("status") == "ok" else 0.0)
        yield ready
        yield from self._replication_links(status.get("replication"))
        brokers = b.cluster().get("brokers", [])
        yield from self._gossip(brokers, me)
        alive = {x["name"] for x in brokers if x.get("status") in ("up", "suspect", "joining", "leaving")}
        alive.add(me)
        yield from self._partitions(me, alive)
        yield from self._groups()

    def _replication_links(self, links: Any) -> Iterator[Metric]:
        links = links if isinstance(links, dict) else {}  # a broker alone has no followers
        connected = _gauge("ring_replication_link_connected", "1 while the link to a follower is open", ["follower"])
        inflight = _gauge("ring_replication_inflight_bytes", "Bytes sent to a follower and not yet acked",
                          ["follower"])
        for follower, link in sorted(links.items()):
            if isinstance(link, dict):
                connected.add_metric([follower], 1.0 if link.get("connected") else 0.0)
                inflight.add_metric([follower], float(link.get("inflight_bytes") or 0))
        yield connected
        yield inflight

    def _gossip(self, brokers: list[dict[str, Any]], me: str) -> Iterator[Metric]:
        state = _gauge("ring_cluster_broker_status", "1 for the status gossip gives each broker, 0 for the others",
                       ["broker", "status"])
        phi = _gauge("ring_cluster_broker_phi", "Phi-accrual suspicion of each peer (8 and above: down)", ["broker"])
        counts = _gauge("ring_cluster_brokers", "Brokers known to gossip, by status", ["status"])
        disk = _gauge("ring_disk_used_bytes", "Bytes of partition logs on this broker's disk")
        by_status = dict.fromkeys(STATUSES, 0)
        disk_bytes = None
        for x in brokers:
            st = x.get("status")
            by_status[st] = by_status.get(st, 0) + 1
            for s in STATUSES:
                state.add_metric([x["name"], s], 1.0 if st == s else 0.0)
            if isinstance(x.get("phi"), (int, float)):
                phi.add_metric([x["name"]], float(x["phi"]))
            if x.get("name") == me:
                disk_bytes = (x.get("load") or {}).get("disk_bytes")
        for s, n in by_status.items():
            counts.add_metric([s], n)
        if disk_bytes is None:
            disk_bytes = _dir_bytes(self.broker)
        disk.add_metric([], float(disk_bytes))
        yield from (state, phi, counts, disk)

    def _partitions(self, me: str, alive: set[str]) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        hw = _gauge("ring_partition_high_watermark", "End of what consumers may read", labels)
        end = _gauge("ring_partition_end_offset", "End of the local log", labels)
        start = _gauge("ring_partition_earliest_offset", "First offset still kept", labels)
        epoch = _gauge("ring_partition_leader_epoch", "Leader epoch of the local replica", labels)
        leader = _gauge("ring_partition_is_leader", "1 where this broker leads the partition", labels)
        lag = _gauge("ring_replication_lag_records",
                     "Leader's end offset minus the follower's acked end (leaders only)", [*labels, "replica"])
        urp = _gauge("ring_under_replicated_partitions",
                     "Partitions led here with a replica down, missing, or behind the high watermark")
        under = 0
        for cfg in self.broker.list_topics():
            try:
                doc = self.broker.describe_topic(cfg["name"])
            except Exception:  # deleted between the two calls
                continue
            for p in doc.get("partitions", []):
                if p.get("end_offset") is None:
                    continue  # not held here
                lv = [doc["name"], str(p["partition"])]
                hw.add_metric(lv, p["high_watermark"])
                end.add_metric(lv, p["end_offset"])
                start.add_metric(lv, p["earliest_offset"])
                if p.get("epoch") is not None:
                    epoch.add_metric(lv, p["epoch"])
                is_leader = p.get("leader") == me
                leader.add_metric(lv, 1.0 if is_leader else 0.0)
                if not is_leader:
                    continue
                ends = p.get("replica_end_offsets") or {}
                replicas = p.get("replicas") or [me]
                behind = any(r not in alive for r in replicas)
                for r in replicas:
                    if r == me:
                        continue
                    acked = ends.get(r)
                    lag.add_metric([*lv, r], p["end_offset"] - (acked or 0))
                    if (acked or 0) < p["high_watermark"]:
                        behind = True
                under += behind
        urp.add_metric([], under)
        yield from (hw, end, start, epoch, leader, lag, urp)

    def _groups(self) -> Iterator[Metric]:
        lag = _gauge("ring_group_lag_records", "High watermark minus the group's committed offset",
                     ["group", "topic", "partition"])
        members = _gauge("ring_group_members", "Members of each consumer group", ["group"])
        source = self.metrics.group_source
        seen: set[str] = set()
        if source is not None:
            for g in source():
                lag.add_metric([g.group, g.topic, str(g.partition)], max(0, g.end_offset - (g.committed or 0)))
                if g.group not in seen:
                    seen.add(g.group)
                    members.add_metric([g.group], g.members)
        yield lag
        yield members


def _dir_bytes(broker: Any) -> int:
    """Bytes under the data directory, for a broker whose cluster view carries no load."""
    total = 0
    stack = [str(broker.data_dir)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


# --- aiohttp -----------------------------------------------------------------------------

METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
# The classic text format every Prometheus reads; the names here need nothing newer.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", CONTENT_TYPE_LATEST)
METRICS_PATH = "/metrics"

OPENAPI_PATHS: dict[str, Any] = {
    METRICS_PATH: {"get": {
        "summary": "Prometheus metrics of this broker", "operationId": "metrics",
        "responses": {"200": {"description": "Prometheus text format 0.0.4",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
}


def middleware(metrics: Metrics) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def metrics_middleware(request: web.Request,
                                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # redirects, and errors when no error middleware runs inside
            metrics.observe(request, exc.status, time.perf_counter() - started, None)
            raise
        except asyncio.CancelledError:  # the client went away first (nginx's 499)
            metrics.observe(request, 499, time.perf_counter() - started, None)
            raise
        except Exception:
            metrics.observe(request, 500, time.perf_counter() - started, None)
            raise
        metrics.observe(request, response.status, time.perf_counter() - started, response)
        return response

    return metrics_middleware


async def get_metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def install(app: web.Application, broker: Any | None = None) -> Metrics:
    """Count every request of ``app`` and serve ``GET /metrics``; call before the app starts."""
    metrics = Metrics(broker)
    app[METRICS_KEY] = metrics
    app.middlewares.insert(0, middleware(metrics))  # outermost: sees the final status of every answer
    app.router.add_route("GET", METRICS_PATH, get_metrics)
    return metrics
