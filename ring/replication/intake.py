"""A produce request's way in: its topic (created on first use when auto-create is on), the
partitions its records go to, the batches they are framed into (``ring.log.framing``), and the
way each partition's batches go (``IntakeHost.produce_partition``: appended here as the
partition's leader, or forwarded to it).

``records_soon`` and ``batches_soon`` take no task where they can: when nothing need be awaited to
know the topic and one partition's write of this loop turn takes the batches
(``ring.replication.appends``), they answer an ``Appending``; else the awaited path's coroutine.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Protocol

from ring.catalog import Catalog, TopicConfig, check_not_internal, validate_topic_name, with_defaults
from ring.clock import Clock
from ring.config import BrokerConfig
from ring.errors import ClockUnusable, Conflict, UnknownTopic
from ring.log import batch as batchfmt
from ring.log import framing
from ring.replication import protocol
from ring.replication.appends import Appending

@dataclass(frozen=True)
class ProduceResult:
    topic: str
    partition: int
    base_offset: int
    count: int

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition,
                "base_offset": self.base_offset, "count": self.count}


class IntakeHost(Protocol):
    """What the intake uses of its broker."""

    config: BrokerConfig
    catalog: Catalog
    clock: Clock
    clock_refusal: str | None  # why records may not be stamped with this broker's clock (None: they may)

    def check_accepting(self) -> None:
        """Raise ``Unavailable`` unless produces are taken now (open; in a cluster, joined)."""

    def accepting_at_once(self) -> bool:
        """Whether ``check_accepting`` passes now."""

    async def add_topic(self, cfg: TopicConfig) -> dict[str, Any]: ...

    def unkeyed_partition(self, cfg: TopicConfig) -> int:
        """The partition a request with no key and no partition goes to."""

    async def produce_partition(self, cfg: TopicConfig, p: int, batches: list[bytearray],
                                level: str) -> ProduceResult: ...

    def produce_partition_soon(self, cfg: TopicConfig, p: int, batches: list[bytearray],
                               level: str) -> Appending | None:
        """``produce_partition`` in this turn's write when nothing need be awaited first, else None."""


class Intake:
    def __init__(self, host: IntakeHost) -> None:
        self.host = host

    async def records(self, topic: str, partition: int | None, records: list[batchfmt.RecordIn],
                      sizes: list[int], values_are_json: bool, keyed: bool, consistency: str | None = None,
                      producer: tuple[int, int] | None = None) -> list[ProduceResult]:
        """Frame records into batches (per partition, cut at BATCH_BYTES_MAX) and append them.

        Without ``keyed`` every record has the same key (or none), so the whole
        request lands on one partition; with it, records are grouped by the
        partition of their own key, keeping their order within each partition.
        ``producer`` (id, sequence) makes the batches idempotent: each gets the
        id and the sequence of its first record, counted from ``sequence`` per
        partition; unkeyed records then go to the partition of the producer id,
        so a retry lands where the first try did.
        """
        cfg = await self._topic(topic)
        framed = self._framed(cfg, partition, records, sizes, values_are_json, keyed, producer)
        return await self._produce_framed(cfg, framed, protocol.parse_consistency(consistency, cfg.consistency))

    def records_soon(self, topic: str, partition: int | None, records: list[batchfmt.RecordIn], sizes: list[int],
                     values_are_json: bool, keyed: bool, consistency: str | None = None,
                     producer: tuple[int, int] | None = None) -> Appending | Awaitable[list[ProduceResult]]:
        """``records`` without a task where it can."""
        cfg = self._topic_at_once(topic)
        if cfg is None:
            return self.records(topic, partition, records, sizes, values_are_json, keyed, consistency, producer)
        framed = self._framed(cfg, partition, records, sizes, values_are_json, keyed, producer)
        level = protocol.parse_consistency(consistency, cfg.consistency)
        if len(framed) == 1:
            ((p, batches),) = framed.items()
            soon = self.host.produce_partition_soon(cfg, p, batches, level)
            if soon is not None:
                return soon
        return self._produce_framed(cfg, framed, level)

    async def batches(self, topic: str, partition: int | None, key: bytes | None, batches: list[bytearray],
                      consistency: str | None = None) -> ProduceResult:
        """Append client-built stored batches as they are, all to one partition."""
        cfg = await self._topic(topic)
        p = self._choose_partition(cfg, partition, key)
        return await self.host.produce_partition(cfg, p, batches,
                                                 protocol.parse_consistency(consistency, cfg.consistency))

    def batches_soon(self, topic: str, partition: int | None, key: bytes | None, batches: list[bytearray],
                     consistency: str | None = None) -> Appending | Awaitable[ProduceResult]:
        """``batches`` without a task where it can."""
        cfg = self._topic_at_once(topic)
        if cfg is None:
            return self.batches(topic, partition, key, batches, consistency)
        p = self._choose_partition(cfg, partition, key)
        level = protocol.parse_consistency(consistency, cfg.consistency)
        host = self.host
        return host.produce_partition_soon(cfg, p, batches, level) or host.produce_partition(cfg, p, batches, level)

    async def _topic(self, topic: str) -> TopicConfig:
        host = self.host
        host.check_accepting()
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
        if not host.accepting_at_once() or topic not in host.catalog:
            return None
        check_not_internal(topic, "produce to")
        return host.catalog.get(topic)

    def _choose_partition(self, cfg: TopicConfig, partition: int | None, key: bytes | None) -> int:
        return framing.choose_partition(cfg.name, cfg.partitions, partition, key,
                                        lambda: self.host.unkeyed_partition(cfg))

    def _framed(self, cfg: TopicConfig, partition: int | None, records: list[batchfmt.RecordIn], sizes: list[int],
                values_are_json: bool, keyed: bool, producer: tuple[int, int] | None) -> dict[int, list[bytearray]]:
        """Partition -> the stored batches its records are framed into."""
        host = self.host
        groups = framing.group(cfg.name, cfg.partitions, partition, records, keyed, producer,
                               lambda: host.unkeyed_partition(cfg))
        if host.clock_refusal is not None:
            raise ClockUnusable(host.clock_refusal, broker=host.config.name)
        return framing.frame(groups, records, sizes, values_are_json, producer, batchfmt.CODECS[cfg.compression],
                             host.clock.wall_ms())

    async def _produce_framed(self, cfg: TopicConfig, framed: dict[int, list[bytearray]],
                              level: str) -> list[ProduceResult]:
        if len(framed) == 1:
            ((p, batches),) = framed.items()
            return [await self.host.produce_partition(cfg, p, batches, level)]
        return list(await asyncio.gather(*(self.host.produce_partition(cfg, p, b, level)
                                           for p, b in framed.items())))
