"""Prometheus metrics of one broker, served at ``GET /metrics`` in the text format.

Two kinds of numbers. Counters and histograms of traffic are counted as
requests are answered: the client port's front (``ring.http_api.front``)
hands every answer, errors included, to ``Metrics.observe``, which adds one
to a plain integer of its route (``RouteStats``, by method and status), one
to its latency bucket, and for produce and fetch the records and bytes of
its topic (the event loop is the only writer, so a request costs a few
integer additions, not prometheus_client's locks); they become metric
families only when Prometheus scrapes.
Everything that is state (offsets, high watermarks, replica lag,
under-replicated partitions, gossip view, long-polls open, disk used,
consumer group lag) is read from the broker's own public answers
(``status()``, ``cluster()``, ``describe_topic()``) when Prometheus scrapes,
so it is never stale and costs nothing between scrapes.

Each app gets its own ``CollectorRegistry`` (several brokers can live in one
test process). Labels never take a raw path or an unchecked name: routes are
templates, and a topic label is only set once the broker has answered 2xx for
that topic, so a client cannot grow the series count by sending junk. Events
only broker internals see are counted by that code calling
``Metrics.sent(follower, nbytes)`` and ``Metrics.delivered(topics)`` (group
polls), or read at scrape time (elections, from the node core's counts);
consumer group lag comes from ``Metrics.group_source`` (the groups this
broker coordinates).
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, disable_created_metrics
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
                                   Metric)
from prometheus_client import exposition
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ring import __version__
from ring.groups.service import GroupLag
from ring.http_api.budget import body_budget_of

log = logging.getLogger("ring.http_api.metrics")

PRODUCE_ROUTE = "/v1/topics/{topic}/messages"
FETCH_ROUTE = "/v1/topics/{topic}/partitions/{partition}/messages"
STATUSES = ("up", "suspect", "down", "joining", "leaving", "removed")
CLOCK_STATES = ("unknown", "ok", "warning", "out_of_bounds")
# Seconds: a produce is ~1 ms on a local disk, a long-poll fetch up to its wait (30 s at most).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _Histogram:
    """Bucket counts and a sum: one list index per observation, no lock (the loop is the only writer)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, value)] += 1  # first bucket with le >= value
        self.total += value


class RouteStats:
    """One route and method's requests: counts by status and a latency histogram, plain integers."""

    __slots__ = ("method", "route", "statuses", "hist", "kind")

    def __init__(self, method: str, route: str) -> None:
        self.method = method
        self.route = route
        self.statuses: dict[int, int] = {}
        self.hist = _Histogram()
        # Produce and fetch also count records and bytes per topic.
        self.kind = "produce" if (route, method) == (PRODUCE_ROUTE, "POST") else \
            "fetch" if (route, method) == (FETCH_ROUTE, "GET") else ""


class Metrics:
    """One broker's registry, and the counters traffic and broker internals bump.

    Requests are counted in plain integers on the event loop (no locks) and
    turned into metric families when scraped.
    """

    def __init__(self, broker: Any | None = None) -> None:
        disable_created_metrics()  # *_created series double the output and no dashboard reads them
        self.registry = CollectorRegistry(auto_describe=True)
        self.broker = broker
        self.routes: dict[tuple[str, str], RouteStats] = {}  # (method, route template) -> its counts
        self.produced: dict[str, list[int]] = {}  # topic -> [requests, records, bytes]
        self.fetched: dict[str, list[int]] = {}  # topic -> [requests, records, bytes]
        self.polled: dict[str, int] = {}  # topic -> records group polls handed to consumers
        self.replication_sent: dict[str, int] = {}  # follower -> bytes
        self.group_source: Callable[[], Iterable[GroupLag]] | None = None
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(TrafficCollector(self))
        if broker is not None:
            self.registry.register(BrokerCollector(broker, self))

    # --- hooks for broker internals -------------------------------------------------------

    def sent(self, follower: str, nbytes: int) -> None:
        """Stored batch bytes the replication sender handed to ``follower``'s link."""
        self.replication_sent[follower] = self.replication_sent.get(follower, 0) + nbytes

    def delivered(self, topics: Iterable[str]) -> None:
        """A group poll this broker answered handed consumers one record of each topic named."""
        polled = self.polled
        for topic in topics:
            polled[topic] = polled.get(topic, 0) + 1

    # --- traffic -----------------------------------------------------------------------

    def stats(self, method: str, route: str) -> RouteStats:
        """The counters of one method on one route template ("unmatched" for no route)."""
        method = method if method in _METHODS else "other"
        st = self.routes.get((method, route))
        if st is None:
            st = self.routes[(method, route)] = RouteStats(method, route)
        return st

    def observe(self, request: Any, response: Any, elapsed_s: float) -> None:
        """One answer of the client port (``web.Request``, ``web.Response``), errors included."""
        route = request.route
        st = route.stats if route is not None and request.method == route.method else None
        if st is None:
            st = self.stats(request.method, route.template if route is not None else "unmatched")
        status = response.status
        counts = st.statuses
        counts[status] = counts.get(status, 0) + 1
        st.hist.observe(elapsed_s)
        if st.kind and 200 <= status < 300:
            table = self.produced if st.kind == "produce" else self.fetched
            topic = request.match_info["topic"]
            row = table.get(topic)
            if row is None:
                row = table[topic] = [0, 0, 0]
            row[0] += 1
            row[1] += response.records
            row[2] += request.body_size if st.kind == "produce" else len(response.body)

    def forget_topics(self, keep: set[str]) -> None:
        """Drop the counters of deleted topics, so series do not pile up over a long life."""
        for table in (self.produced, self.fetched, self.polled):
            for topic in [t for t in table if t not in keep]:
                del table[topic]

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class TrafficCollector:
    """The request counters as metric families."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m = self.m
        if m.broker is not None:
            m.forget_topics({t["name"] for t in m.broker.list_topics()})
        requests = CounterMetricFamily("ring_http_requests", "HTTP requests answered, by route template and status",
                                       labels=["method", "route", "status"])
        stats = [m.routes[k] for k in sorted(m.routes)]
        for st in stats:
            for status, n in sorted(st.statuses.items()):
                requests.add_metric([st.method, st.route, str(status)], n)
        yield requests
        latency = HistogramMetricFamily("ring_http_request_duration_seconds",
                                        "Time from request to answer (fetch includes its long-poll wait)",
                                        labels=["method", "route"])
        for st in stats:
            hist = st.hist
            if not sum(hist.counts):
                continue
            key = (st.method, st.route)
            cumulative, buckets = 0, []
            for le, n in zip((*map(str, LATENCY_BUCKETS_S), "+Inf"), hist.counts):
                cumulative += n
                buckets.append((le, cumulative))
            latency.add_metric(list(key), buckets, hist.total)
        yield latency
        for table, kind, docs in ((m.produced, "produce", ("Produce requests acknowledged",
                                                            "Records acknowledged to producers",
                                                            "Request body bytes of acknowledged produces")),
                                  (m.fetched, "fetch", ("Fetch requests answered 200",
                                                        "Offsets consumers moved past (next offset - requested offset)",
                                                        "Response body bytes of fetches"))):
            families = [CounterMetricFamily(f"ring_{kind}_{what}", doc, labels=["topic"])
                        for what, doc in zip(("requests", "records", "bytes"), docs)]
            for topic, row in sorted(table.items()):
                for family, n in zip(families, row):
                    family.add_metric([topic], n)
            yield from families
        polled = CounterMetricFamily("ring_group_poll_records", "Records group polls handed to consumers",
                                     labels=["topic"])
        for topic, n in sorted(m.polled.items()):
            polled.add_metric([topic], n)
        yield polled
        elections = CounterMetricFamily("ring_elections", "Leader elections this broker ran, by result",
                                        labels=["result"])
        core = getattr(m.broker, "core", None)
        for result, n in (core.elections.counts if core is not None else {"won": 0, "lost": 0}).items():
            elections.add_metric([result], n)
        yield elections
        sent = CounterMetricFamily("ring_replication_sent_bytes", "Stored batch bytes sent to a follower",
                                   labels=["follower"])
        for follower, n in sorted(m.replication_sent.items()):
            sent.add_metric([follower], n)
        yield sent


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
        if isinstance(status.get("writebacks"), int):
            yield CounterMetricFamily("ring_writebacks_started", "writebacks of partition logs started before their fsync",
                                      value=status["writebacks"])
        bodies = body_budget_of(b)
        yield GaugeMetricFamily("ring_request_body_bytes_held", "Bytes of request bodies received and held now",
                                value=bodies.used)
        yield CounterMetricFamily("ring_request_bodies_refused", "Requests answered 429 for want of body budget",
                                  value=bodies.refused)
        ready = _gauge("ring_broker_ready", "1 when /v1/status answers 200 (not joining, not shutting down)")
        ready.add_metric([], 1.0 if status.get("status") == "ok" else 0.0)
        yield ready
        if isinstance(status.get("retention_sweeps"), int):
            yield CounterMetricFamily("ring_retention_sweeps", "Retention checks of the partitions led here",
                                      value=status["retention_sweeps"])
        yield from self._clock(status.get("clock"))
        yield from self._replication_links(status.get("replication"))
        brokers = b.cluster().get("brokers", [])
        yield from self._gossip(brokers)
        alive = {x["name"] for x in brokers if x.get("status") in ("up", "suspect", "joining", "leaving")}
        alive.add(me)
        yield from self._partitions(me, alive)
        yield from self._groups()

    def _clock(self, clock: Any) -> Iterator[Metric]:
        if not isinstance(clock, dict):
            return  # a broker alone: its clock is the only one
        state = _gauge("ring_clock_state", "1 for this broker's clock judgement against its peers' (unknown, ok, "
                       "warning, out_of_bounds), 0 for the others", ["state"])
        for s in CLOCK_STATES:
            state.add_metric([s], 1.0 if clock.get("state") == s else 0.0)
        yield state
        offset = _gauge("ring_clock_offset_seconds", "This broker's wall clock minus the cluster's (most peers')")
        uncertainty = _gauge("ring_clock_offset_uncertainty_seconds", "How far that estimate may be off")
        if isinstance(clock.get("offset_ms"), (int, float)):
            offset.add_metric([], clock["offset_ms"] / 1000)
            uncertainty.add_metric([], (clock.get("uncertainty_ms") or 0) / 1000)
        peers = _gauge("ring_clock_peer_offset_seconds", "Each peer's wall clock minus this broker's, as last "
                       "measured over gossip", ["broker"])
        for name, seen in sorted((clock.get("peers") or {}).items()):
            peers.add_metric([name], seen["offset_ms"] / 1000)
        bound = _gauge("ring_clock_offset_max_seconds", "The hard bound (--max-clock-offset)")
        bound.add_metric([], (clock.get("max_offset_ms") or 0) / 1000)
        yield from (offset, uncertainty, peers, bound)

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

    def _gossip(self, brokers: list[dict[str, Any]]) -> Iterator[Metric]:
        state = _gauge("ring_cluster_broker_status", "1 for the status gossip gives each broker, 0 for the others",
                       ["broker", "status"])
        phi = _gauge("ring_cluster_broker_phi", "Phi-accrual suspicion of each peer (8 and above: down)", ["broker"])
        counts = _gauge("ring_cluster_brokers", "Brokers known to gossip, by status", ["status"])
        disk = _gauge("ring_disk_used_bytes", "Bytes of partition logs on this broker's disk")
        by_status = dict.fromkeys(STATUSES, 0)
        for x in brokers:
            st = x.get("status")
            by_status[st] = by_status.get(st, 0) + 1
            for s in STATUSES:
                state.add_metric([x["name"], s], 1.0 if st == s else 0.0)
            if isinstance(x.get("phi"), (int, float)):
                phi.add_metric([x["name"]], float(x["phi"]))
        for s, n in by_status.items():
            counts.add_metric([s], n)
        # Read now: the load gossip carries for this broker is as old as its last heartbeat.
        disk.add_metric([], float(sum(r.log.size_bytes for r in self.broker.replicas())))
        yield from (state, phi, counts, disk)

    def _partitions(self, me: str, alive: set[str]) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        hw = _gauge("ring_partition_high_watermark", "End of what consumers may read", labels)
        end = _gauge("ring_partition_end_offset", "End of the local log", labels)
        start = _gauge("ring_partition_earliest_offset", "First offset still kept", labels)
        epoch = _gauge("ring_partition_leader_epoch", "Leader epoch of the local replica", labels)
        leader = _gauge("ring_partition_is_leader", "1 where this broker leads the partition", labels)
        stuck = _gauge("ring_partition_no_eligible_leader",
                       "1 where the partition cannot elect a leader holding what was acknowledged (its voters "
                       "that hold it are gone, the others lost their state)", labels)
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
                stuck.add_metric(lv, 1.0 if p.get("no_eligible_leader") else 0.0)
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
        yield from (hw, end, start, epoch, leader, stuck, lag, urp)

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


# --- the client app ----------------------------------------------------------------------

METRICS_KEY = "metrics"
# The classic text format every Prometheus reads; the names here need nothing newer.
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", CONTENT_TYPE_LATEST)
METRICS_PATH = "/metrics"

OPENAPI_PATHS: dict[str, Any] = {
    METRICS_PATH: {"get": {
        "summary": "Prometheus metrics of this broker", "operationId": "metrics",
        "responses": {"200": {"description": "Prometheus text format 0.0.4",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
}


def get_metrics(request: Any) -> Any:
    from ring.http_api.web import Response

    return Response(request.app[METRICS_KEY].exposition(), 200, CONTENT_TYPE)


def install(app: Any, broker: Any | None = None) -> Metrics:
    """Count every request of ``app`` (a ``web.App``) and serve ``GET /metrics``; call before it starts."""
    metrics = Metrics(broker)
    app[METRICS_KEY] = metrics
    app.metrics = metrics
    app.router.add("GET", METRICS_PATH, get_metrics)
    app.router.route_added = lambda route: setattr(route, "stats", metrics.stats(route.method, route.template))
    for route in app.router.routes():
        app.router.route_added(route)
    return metrics
