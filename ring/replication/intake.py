"""A produce request's way in: its topic (created on first use when auto-create is on), the
partitions its records go to, the batches they are framed into (``ring.log.framing``), and the
way each partition's batches go (``IntakeRouting.produce_partition``: appended here as the
partition's leader, or forwarded to it).

A request comes as one ``ring.produce.Produce``, built by its front; the intake puts in the topic's
consistency when the request names none and hands it on with each partition's batches.
``produce`` takes no task where it can: when nothing need be awaited to know the topic and one
partition's write of this loop turn takes the batches (``ring.replication.appends``), it answers an
``Appending``, and when they go at once on the forward link to the partition's leader, the router's
``Forwarding`` (both futures of (base offset, count)); else the awaited path's coroutine.
``results_of`` gives any of them as the results. A request whose records go to several partitions
hands each partition's batches on the same way, and waits for them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Protocol

from ring.catalog import Catalog, TopicConfig, check_not_internal, validate_topic_name, with_defaults
from ring.clock import Clock
from ring.config import BrokerConfig
from ring.errors import ClockUnusable, Conflict, UnknownTopic
from ring.log import batch as batchfmt
from ring.log import framing
from ring.produce import Batches, Produce
from ring.replication.appends import Appending

log = logging.getLogger(__name__)

PAST_RETENTION_LOG_S = 60.0  # a topic fed old records logs it once a minute, not once a request


@dataclass(frozen=True)
class ProduceResult:
    topic: str
    partition: int
    base_offset: int
    count: int
    past_retention: int = 0  # of these records, how many were older than the topic's retention already
    retention_ms: int = -1  # the topic's retention, when past_retention says something

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"topic": self.topic, "partition": self.partition,
                               "base_offset": self.base_offset, "count": self.count}
        if self.past_retention:
            doc["past_retention"] = self.past_retention
            doc["warning"] = (f"{self.past_retention} of these records are older than the topic's retention "
                              f"(retention_ms {self.retention_ms}): retention deletes them once their segment "
                              f"closes, unless newer records share it")
        return doc


def is_pending(got: Any) -> bool:
    """Whether a produce's ``got`` is a future of (base offset, count) (a turn's write, a forward on
    the link), rather than an awaitable of its result."""
    return hasattr(got, "add_done_callback")


async def result_of(topic: str, got: Any) -> ProduceResult:
    """A partition's produce result, from ``produce_partition``'s answer whichever it is."""
    if not is_pending(got):
        return await got
    if not got.done():
        done = asyncio.get_running_loop().create_future()
        got.add_done_callback(lambda _: done.done() or done.set_result(None))
        await done
    base, count = got.result()
    return ProduceResult(topic, got.partition, base, count)


async def results_of(topic: str, got: Any) -> list[ProduceResult]:
    """A produce's results, from ``Intake.produce``'s answer whichever it is."""
    return [await result_of(topic, got)] if is_pending(got) else await got


async def _listed(got: Awaitable[ProduceResult]) -> list[ProduceResult]:
    return [await got]


class IntakeRouting(Protocol):
    """What the intake asks its broker's router (``IntakeHost.router``)."""

    def check_accepting(self) -> None:
        """Raise ``Unavailable`` unless produces are taken now (open; in a cluster, joined)."""

    def accepting_at_once(self) -> bool:
        """Whether ``check_accepting`` passes now."""

    def unkeyed_partition(self, cfg: TopicConfig) -> int:
        """The partition a request with no key and no partition goes to."""

    def produce_partition(self, req: Produce, cfg: TopicConfig, p: int,
                          batches: list[bytearray]) -> Appending | Awaitable[ProduceResult]:
        """``batches`` of ``req`` (its consistency resolved) on their way into partition ``p``: with no
        task when nothing need be awaited first (this turn's write, or the forward link's answer: a
        future of (base offset, count) either way, ``is_pending``), else an awaitable of the result."""


class IntakeHost(Protocol):
    """What the intake uses of its broker."""

    config: BrokerConfig
    catalog: Catalog
    clock: Clock
    clock_refusal: str | None  # why records may not be stamped with this broker's clock (None: they may)
    router: IntakeRouting  # where each partition's batches go

    async def add_topic(self, cfg: TopicConfig) -> dict[str, Any]: ...


class Intake:
    def __init__(self, host: IntakeHost) -> None:
        self.host = host
        self._past_retention_logged: dict[str, float] = {}  # topic -> when it was last logged (monotonic)

    def produce(self, req: Produce) -> Appending | Awaitable[list[ProduceResult]]:
        """Append ``req``'s records: framed into batches (``Records``, per partition, cut at
        BATCH_BYTES_MAX) or as they are (``Batches``, all to one partition).

        Records without ``keyed`` all have the same key (or none), so the
        whole request lands on one partition; with it, records are grouped by
        the partition of their own key, keeping their order within each
        partition. ``req.producer`` (id, sequence) makes the batches
        idempotent: each gets the id and the sequence of its first record,
        counted from ``sequence`` per partition; unkeyed records then go to
        the partition of the producer id, so a retry lands where the first
        try did.

        With no task where nothing need be awaited first (the topic exists, the records go to one
        partition, which takes them in this turn's write or on the forward link): a future of
        (base offset, count), ``is_pending``; else an awaitable of the results (``results_of`` gives
        either as the results).
        """
        cfg = self._topic_at_once(req.topic)
        if cfg is None:
            return self._produce_awaited(req)
        framed = self._framed(req, cfg)
        if req.consistency is None:
            req = req._replace(consistency=cfg.consistency)
        old = self._past_retention(cfg, framed)
        if old:  # rare: answered on the awaited path, which carries the warning
            return self._produce_warned(req, cfg, framed, old)
        if len(framed) == 1:
            ((p, batches),) = framed.items()
            got = self.host.router.produce_partition(req, cfg, p, batches)
            return got if is_pending(got) else _listed(got)
        return self._produce_framed(req, cfg, framed)

    async def _produce_awaited(self, req: Produce) -> list[ProduceResult]:
        """``produce`` once the topic is known (created first if it is new and auto-create is on)."""
        cfg = await self._topic(req.topic)
        if req.consistency is None:
            req = req._replace(consistency=cfg.consistency)
        framed = self._framed(req, cfg)
        old = self._past_retention(cfg, framed)
        results = await self._produce_framed(req, cfg, framed)
        return self._warned(cfg, results, old) if old else results

    def _past_retention(self, cfg: TopicConfig, framed: dict[int, list[bytearray]]) -> dict[int, int]:
        """Partition -> how many of its records are older than the topic's retention already (a batch's
        newest record older than it: retention deletes the batch once its segment closes, unless newer
        records share the segment). Accepted as Kafka accepts them; the answer and the log say so."""
        if cfg.retention_ms < 0:
            return {}
        cutoff = self.host.clock.wall_ms() - cfg.retention_ms
        old: dict[int, int] = {}
        for p, batches in framed.items():
            for b in batches:
                count, newest = batchfmt.count_and_newest(b)
                if newest < cutoff:
                    old[p] = old.get(p, 0) + count
        return old

    async def _produce_warned(self, req: Produce, cfg: TopicConfig, framed: dict[int, list[bytearray]],
                              old: dict[int, int]) -> list[ProduceResult]:
        return self._warned(cfg, await self._produce_framed(req, cfg, framed), old)

    def _warned(self, cfg: TopicConfig, results: list[ProduceResult], old: dict[int, int]) -> list[ProduceResult]:
        now = self.host.clock.monotonic()
        last = self._past_retention_logged.get(cfg.name)
        if last is None or now - last >= PAST_RETENTION_LOG_S:
            self._past_retention_logged[cfg.name] = now
            log.warning("topic %r took %d records older than its retention (retention_ms %d): retention deletes "
                        "them once their segment closes (logged at most once a minute per topic)",
                        cfg.name, sum(old.values()), cfg.retention_ms)
        return [dataclasses.replace(r, past_retention=old[r.partition], retention_ms=cfg.retention_ms)
                if old.get(r.partition) else r for r in results]

    async def _topic(self, topic: str) -> TopicConfig:
        host = self.host
        host.router.check_accepting()
        check_not_internal(validate_topic_name(topic), "produce to")
        if topic not in host.catalog:
            if not host.config.auto_create:
                raise UnknownTopic(f"unknown topic {topic!r} (auto-create is off)", topic=topic)
            try:
                await host.add_topic(with_defaults(topic, host.clock.wall_ms()))
            except Conflict:
                pass  # created meanwhile, by another request or another broker
        return host.catalog.get(topic)

    def _topic_at_once(self, topic: str) -> TopicConfig | None:
        """The topic a produce goes to when nothing need be awaited to know it (it exists), else None."""
        host = self.host
        if not host.router.accepting_at_once() or topic not in host.catalog:
            return None
        check_not_internal(topic, "produce to")
        return host.catalog.get(topic)

    def _framed(self, req: Produce, cfg: TopicConfig) -> dict[int, list[bytearray]]:
        """Partition -> the stored batches the request's records are framed into (or its own batches)."""
        host = self.host
        body = req.records
        if type(body) is Batches:
            p = framing.choose_partition(cfg.name, cfg.partitions, req.partition, req.key,
                                         lambda: host.router.unkeyed_partition(cfg))
            return {p: body.batches}
        groups = framing.group(cfg.name, cfg.partitions, req.partition, body.records, body.keyed, req.producer,
                               lambda: host.router.unkeyed_partition(cfg))
        if host.clock_refusal is not None:
            raise ClockUnusable(host.clock_refusal, broker=host.config.name)
        return framing.frame(groups, body.records, body.sizes, body.values_are_json, req.producer,
                             batchfmt.CODECS[cfg.compression], host.clock.wall_ms(), req.sequences_contiguous)

    async def _produce_framed(self, req: Produce, cfg: TopicConfig,
                              framed: dict[int, list[bytearray]]) -> list[ProduceResult]:
        if len(framed) == 1:
            ((p, batches),) = framed.items()
            return [await result_of(req.topic, self.host.router.produce_partition(req, cfg, p, batches))]
        return list(await asyncio.gather(*(result_of(req.topic, self.host.router.produce_partition(req, cfg, p, b))
                                           for p, b in framed.items())))
