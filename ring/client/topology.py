"""What a client knows about the cluster: brokers, their addresses and status,
and each topic's partitions with leader and replicas.

Built from two answers any broker gives: ``GET /v1/cluster`` (the brokers
gossip knows, with client URL and status) and ``GET /v1/topics/{t}`` (each
partition's leader and replica names). A standalone broker has no
``/v1/cluster``; the client then treats each URL it was given as a broker
known by the name its ``/v1/status`` reports. Pure values and functions: no
I/O, no clock; the client's driver fetches the documents and swaps in a new
``Topology`` when they change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from ring.errors import BadRequest

# Statuses worth sending to: "suspect" may be a slow broker, not a dead one.
LIVE_STATUSES = frozenset({"up", "suspect", "joining", "leaving", "normal"})


def normalize_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port``."""
    url = url.strip()
    if not url:
        raise BadRequest("an empty broker address")
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def parse_brokers(brokers: str | Iterable[str]) -> list[str]:
    """A comma-separated string or a list of addresses -> unique normalized URLs, in order."""
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    urls = [normalize_url(u) for u in items if u and u.strip()]
    if not urls:
        raise BadRequest("at least one broker address is needed")
    return list(dict.fromkeys(urls))


@dataclass(frozen=True)
class BrokerInfo:
    name: str
    client_url: str
    status: str = "up"

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    leader: str | None
    replicas: tuple[str, ...]
    epoch: int = 0
    high_watermark: int = 0
    earliest_offset: int = 0
    end_offset: int = 0


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: tuple[PartitionInfo, ...]
    answered_by: str  # URL of the broker that described it: the fallback for unknown names
    ranged: bool = False  # its partitions may keep only a local tail, the rest in ranges (ring.ranges)

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


def parse_cluster(doc: Any) -> dict[str, BrokerInfo]:
    """``GET /v1/cluster`` -> brokers by name (entries without a client URL are skipped)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("brokers"), list):
        raise BadRequest("a cluster document must hold a list of brokers")
    out: dict[str, BrokerInfo] = {}
    for b in doc["brokers"]:
        if not isinstance(b, dict) or not isinstance(b.get("name"), str) or not b.get("client_url"):
            continue
        out[b["name"]] = BrokerInfo(b["name"], normalize_url(str(b["client_url"])), str(b.get("status", "up")))
    return out


def parse_topic(doc: Any, answered_by: str) -> TopicInfo:
    """``GET /v1/topics/{t}`` -> TopicInfo with partitions in index order."""
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list) or not doc["partitions"]:
        raise BadRequest("a topic document must hold a non-empty list of partitions")
    parts = []
    for p in doc["partitions"]:
        replicas = p.get("replicas") or ([p["leader"]] if p.get("leader") else [])
        # A broker without a replica of the partition describes its offsets and epoch as null.
        parts.append(PartitionInfo(
            partition=int(p["partition"]), leader=p.get("leader"), replicas=tuple(replicas),
            epoch=int(p.get("epoch") or 0), high_watermark=int(p.get("high_watermark") or 0),
            earliest_offset=int(p.get("earliest_offset") or 0), end_offset=int(p.get("end_offset") or 0),
        ))
    parts.sort(key=lambda p: p.partition)
    if [p.partition for p in parts] != list(range(len(parts))):
        raise BadRequest(f"topic {doc.get('name')!r} lists partitions out of order or with gaps")
    local_retention = doc.get("local_retention_bytes")
    return TopicInfo(str(doc.get("name", "")), tuple(parts), answered_by,
                     ranged=type(local_retention) is int and local_retention >= 0)


@dataclass(frozen=True)
class Topology:
    """Brokers and described topics; ``clustered`` is False for a standalone broker."""

    brokers: dict[str, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    clustered: bool = False

    def with_brokers(self, brokers: dict[str, BrokerInfo], clustered: bool) -> Topology:
        return replace(self, brokers=dict(brokers), clustered=clustered)

    def with_topic(self, info: TopicInfo) -> Topology:
        return replace(self, topics={**self.topics, info.name: info})

    def without_topic(self, name: str) -> Topology:
        return replace(self, topics={k: v for k, v in self.topics.items() if k != name})

    def url_of(self, name: str | None) -> str | None:
        b = self.brokers.get(name) if name else None
        return b.client_url if b else None

    def is_live(self, name: str | None) -> bool:
        """Unknown names count as live: only a broker reported down is skipped."""
        b = self.brokers.get(name) if name else None
        return b is None or b.live

    def leader_url(self, topic: str, partition: int) -> str | None:
        info = self.topics.get(topic)
        if info is None or not 0 <= partition < info.partition_count:
            return None
        p = info.partitions[partition]
        return self.url_of(p.leader) or (None if self.clustered else info.answered_by)

    def live_broker_urls(self, exclude: Iterable[str] = ()) -> list[str]:
        skip = set(exclude)
        return [b.client_url for b in self.brokers.values() if b.live and b.client_url not in skip]

    def read_urls(self, topic: str, partition: int) -> list[str]:
        """Where to fetch from, best first: the leader (freshest high watermark),
        the other live replicas, then every other live broker (which proxies)."""
        urls: list[str] = []
        info = self.topics.get(topic)
        if info is not None and 0 <= partition < info.partition_count:
            p = info.partitions[partition]
            names = [p.leader, *[r for r in p.replicas if r != p.leader]]
            urls += [u for n in names if self.is_live(n) and (u := self.url_of(n))]
            if not self.clustered:
                urls.append(info.answered_by)
        urls += self.live_broker_urls()
        return list(dict.fromkeys(urls))

    def live_leader_partitions(self, topic: str) -> list[int]:
        """Partitions whose leader is not reported down (all of them when none qualifies)."""
        info = self.topics.get(topic)
        if info is None:
            return []
        live = [p.partition for p in info.partitions if p.leader is not None and self.is_live(p.leader)]
        return live or [p.partition for p in info.partitions]
