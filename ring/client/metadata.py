"""The client's view of the cluster, kept fresh: a thin async driver around
``Topology``.

It learns the brokers from ``GET /v1/cluster`` (or, from a standalone broker
that has no such route, from each given URL's ``/v1/status``) and topics from
``GET /v1/topics/{t}``, asking any broker that answers: the ones it knows to
be live first, then the URLs it was given. Refreshes are single-flight and at
most one per ``CLIENT_METADATA_REFRESH_MS_MIN``, so a burst of failures costs
one round of metadata requests. It also remembers which URLs refused a
connection lately, so the producer can route around them before gossip has
convicted the broker.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any, Awaitable, Callable, Iterable

from ring import errors, limits
from ring.client.retry import Retry
from ring.client.topology import BrokerInfo, TopicInfo, Topology, parse_cluster, parse_topic
from ring.client.transport import RETRY, BrokersUnavailable, BrokerUnreachable, Reply, Transport, classify, \
    error_from, gave_up, retry_after_s
from ring.clock import Clock

log = logging.getLogger("ring.client")

# A URL that refused a connection is avoided for this long (then tried again).
_UNREACHABLE_MS = 2_000


def quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


class Metadata:
    def __init__(self, bootstrap: list[str], transport: Transport, clock: Clock, *,
                 retry_timeout_s: float, retries: int | None, backoff_ms: float) -> None:
        self.bootstrap = bootstrap
        self.transport = transport
        self.clock = clock
        self.retry_timeout_s = retry_timeout_s
        self.retries = retries
        self.backoff_ms = backoff_ms
        self.topology = Topology()
        self._cluster_loaded = False
        self._refresh: asyncio.Task[None] | None = None
        self._refreshed_ms = float("-inf")
        self._unreachable: dict[str, float] = {}  # url -> monotonic ms of the last refusal
        self._refresh_failing = False

    def now_ms(self) -> float:
        return self.clock.monotonic() * 1000

    # --- unreachable URLs --------------------------------------------------------

    def mark_unreachable(self, url: str) -> None:
        self._unreachable[url] = self.now_ms()

    def mark_reachable(self, url: str) -> None:
        self._unreachable.pop(url, None)

    def recently_unreachable(self, url: str | None) -> bool:
        at = self._unreachable.get(url) if url else None
        return at is not None and self.now_ms() - at < _UNREACHABLE_MS

    # --- asking any broker -------------------------------------------------------

    def any_urls(self) -> list[str]:
        known = self.topology.live_broker_urls()
        urls = list(dict.fromkeys([*known, *self.bootstrap]))
        # Known-refusing URLs last, not dropped: they may be back.
        return sorted(urls, key=self.recently_unreachable)

    async def ask_any(self, method: str, path: str, doc: Any = None, *, ok: Iterable[int] = (200,),
                      urls: Callable[[], list[str]] | None = None, **kw: Any) -> Reply:
        """The first useful answer from any broker, retrying rounds with backoff until
        ``retry_timeout_s`` (``ring.client.retry``).

        A 4xx answer (other than 421/429) is raised at once as ``ring.errors``;
        a 504 as ``OutcomeUnknown``; when every round fails, ``transport.gave_up``'s error.
        """
        ok = set(ok)
        last = "no broker tried"
        refused: errors.RingError | None = None  # the last refusal, when it was the last failure
        retry = Retry(self.clock, self.retry_timeout_s, self.retries, self.backoff_ms)
        while True:
            wait_s = 0.0  # the longest Retry-After of this round's refusals
            for url in (urls or self.any_urls)():
                try:
                    reply = await self.transport.json(method, url, path, doc, **kw)
                except BrokerUnreachable as exc:
                    self.mark_unreachable(url)
                    last, refused = exc.message, None
                    continue
                self.mark_reachable(url)
                if reply.status in ok:
                    return reply
                code = str(reply.error_doc().get("error", ""))
                kind = classify(reply.status, code)
                if kind == RETRY:
                    last, refused = f"{url}: {reply.status} {code}", error_from(reply, f"{method} {path}")
                    wait_s = max(wait_s, retry_after_s(reply))
                    continue
                raise error_from(reply, f"{method} {path}")
            if not await retry.pause(wait_s):
                raise gave_up(f"{method} {path}: no broker answered ({retry.spent()}); last: {last}", refused)

    # --- brokers -----------------------------------------------------------------

    async def load_cluster(self) -> None:
        try:
            reply = await self.ask_any("GET", "/v1/cluster")
        except errors.NotFound:
            await self._load_standalone()
            return
        brokers = parse_cluster(reply.json())
        if not brokers:
            raise errors.Unavailable(f"{reply.url} knows no broker with a client URL")
        self.topology = self.topology.with_brokers(brokers, clustered=True)
        self._cluster_loaded = True

    async def _load_standalone(self) -> None:
        """No /v1/cluster: every given URL is a broker of its own, named by its status."""
        brokers: dict[str, BrokerInfo] = {}
        for url in self.bootstrap:
            try:
                reply = await self.transport.json("GET", url, "/v1/status")
            except BrokerUnreachable:
                self.mark_unreachable(url)
                continue
            if reply.status == 200:
                name = str((reply.json() or {}).get("name") or url)
                brokers.setdefault(name, BrokerInfo(name, url, "up"))
        if not brokers:
            raise BrokersUnavailable(f"none of {', '.join(self.bootstrap)} answered /v1/status")
        self.topology = self.topology.with_brokers(brokers, clustered=False)
        self._cluster_loaded = True

    async def ensure_cluster(self) -> None:
        if not self._cluster_loaded:
            await self.refresh(force=True, topics=False)

    # --- topics ------------------------------------------------------------------

    async def describe(self, topic: str) -> tuple[dict[str, Any], TopicInfo]:
        await self.ensure_cluster()
        reply = await self.ask_any("GET", f"/v1/topics/{quote(topic)}")
        doc = reply.json()
        info = parse_topic(doc, reply.url)
        self.topology = self.topology.with_topic(info)
        return doc, info

    async def topic(self, topic: str) -> TopicInfo:
        info = self.topology.topics.get(topic)
        if info is None:
            _, info = await self.describe(topic)
        return info

    async def await_everywhere(self, name: str) -> None:
        """Until every live broker describes the topic with a leader for each partition (bounded by
        ``CLIENT_TOPIC_PROPAGATION_S_MAX``; past it a warning is logged)."""
        if not self.topology.clustered:
            return
        deadline = self.now_ms() + limits.CLIENT_TOPIC_PROPAGATION_S_MAX * 1000
        waiting = set(self.topology.live_broker_urls())
        while waiting and self.now_ms() < deadline:
            for url in list(waiting):
                try:
                    reply = await self.transport.json("GET", url, f"/v1/topics/{quote(name)}",
                                                      timeout_s=limits.CLIENT_CONNECT_TIMEOUT_S)
                except BrokerUnreachable:
                    waiting.discard(url)  # a dead broker learns it when it comes back
                    continue
                doc = reply.json() if reply.status == 200 else None
                if isinstance(doc, dict) and all(p.get("leader") for p in doc.get("partitions") or [{}]):
                    waiting.discard(url)
            if waiting:
                await self.clock.sleep(0.05)
        if waiting:
            log.warning("topic %s: not yet known, or without a leader for every partition, on %s",
                        name, ", ".join(sorted(waiting)))

    def forget(self, topic: str) -> None:
        self.topology = self.topology.without_topic(topic)

    # --- refresh -----------------------------------------------------------------

    def stale(self) -> bool:
        return self.now_ms() - self._refreshed_ms > limits.CLIENT_METADATA_MAX_AGE_MS

    async def refresh(self, force: bool = False, topics: bool = True, quiet: bool = False) -> None:
        """Reload brokers (and described topics): single-flight, rate-limited. ``quiet`` (a refresh
        spawned in the background): a failure is logged, once per outage, instead of raised."""
        if self._refresh is not None and not self._refresh.done():
            await self._settled(asyncio.shield(self._refresh), quiet)
            return
        if not force and self.now_ms() - self._refreshed_ms < limits.CLIENT_METADATA_REFRESH_MS_MIN:
            return
        self._refreshed_ms = self.now_ms()
        self._refresh = asyncio.get_running_loop().create_task(self._reload(topics))
        await self._settled(asyncio.shield(self._refresh), quiet)

    async def _settled(self, refresh: Awaitable[None], quiet: bool) -> None:
        if not quiet:
            await refresh
            return
        try:
            await refresh
        except errors.RingError as exc:  # said once per outage, not at every attempt
            log.log(logging.DEBUG if self._refresh_failing else logging.WARNING, "topology refresh failed: %s", exc)
            self._refresh_failing = True
        else:
            if self._refresh_failing:
                log.info("topology refresh works again")
            self._refresh_failing = False

    async def _reload(self, topics: bool) -> None:
        await self.load_cluster()
        if topics:
            names = list(self.topology.topics)
            results = await asyncio.gather(*(self.describe(n) for n in names), return_exceptions=True)
            for name, res in zip(names, results):
                if isinstance(res, errors.UnknownTopic):
                    self.forget(name)
                elif isinstance(res, BaseException):
                    log.debug("refreshing topic %s: %s", name, res)

    async def close(self) -> None:
        """Stop a refresh in flight (the client is closing)."""
        task = self._refresh
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
