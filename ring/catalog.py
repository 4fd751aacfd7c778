"""The topic catalogue: which topics exist and how each is configured.

A plain value class with no I/O: it validates names and settings (raising
``ring.errors``), applies changes to an existing topic (``TopicConfig.changed``:
the partition count only grows, the replication factor and segment size are
fixed), and converts to and from JSON. The broker persists it under its data
directory with ``dumps``/``loads`` and an atomic file replace; gossip carries
each topic's JSON between brokers, last writer wins. ``base_partitions`` (the
count at creation) is written by the broker only: placement keeps it, so a
grown topic's older partitions stay where they were.

A topic's ``id`` names this incarnation of the name, as Kafka's topic ids do:
16 random bytes (22 characters of unpadded base64url) drawn by the broker that
creates the topic (``encode_id``), a new one when the name is created again,
so nothing kept for the old topic (a group's committed offsets, a client's
cache) is taken for the new one. A config stored by a release without ids
gets one derived from its name and creation time (``derived_id``): the same
on every broker, and different for every incarnation those two tell apart.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterator

import orjson

from ring import limits
from ring.errors import BadRequest, Conflict, InvalidTopicName, StorageError, UnknownPartition, UnknownTopic

COMPRESSIONS = ("none", "zstd", "lz4")
REPLICATION_FACTOR_DEFAULT = 3
# Replicas of one partition: each is a copy on another broker; more than this is waste.
REPLICATION_FACTOR_MAX = 7

_FIELDS = ("name", "partitions", "replication_factor", "retention_ms", "retention_bytes",
           "segment_bytes", "compression", "consistency", "auto_partitions", "local_retention_bytes",
           "unclean_leader_election")
# What a change to an existing topic may set (``TopicConfig.changed``); the others are fixed at creation.
CHANGEABLE = ("partitions", "auto_partitions", "retention_ms", "retention_bytes", "compression", "consistency",
              "local_retention_bytes", "unclean_leader_election")
# Written by the broker only: the partition count the topic was created with (placement keeps it),
# and the id of this incarnation of the name.
_STORED_FIELDS = ("base_partitions", "id")
TOPIC_ID_BYTES = 16  # as Kafka's topic ids: a random collision is out of reach
_TOPIC_ID = re.compile(r"[A-Za-z0-9_-]{22}")
# Per-request consistency levels; a topic's ``consistency`` is the default of its produces.
CONSISTENCY_LEVELS = ("one", "quorum", "all")
CONSISTENCY_DEFAULT = "quorum"
# The consumer groups' committed offsets (ring.groups): a group's coordinator is the leader of the
# partition its name hashes to, so the count must never change, and only coordinators write it.
OFFSETS_TOPIC = "__offsets"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})


def check_not_internal(name: str, action: str) -> None:
    """BadRequest (400) when ``name`` is an internal topic: clients may read it, not change it."""
    if name in INTERNAL_TOPICS:
        raise BadRequest(f"cannot {action} {name}: it is internal to the cluster (consumer groups' committed "
                         "offsets); it may be read, not written, changed or deleted", topic=name)


def check_replicas_placeable(cfg: TopicConfig, placed: int) -> None:
    """BadRequest (Kafka's InvalidReplicationFactor) when a replication factor asked for is larger than the
    ``placed`` brokers of the ring. (A factor left to its default is capped at the ring's size instead.)"""
    if cfg.replication_factor > placed:
        raise BadRequest(f"replication_factor {cfg.replication_factor} is larger than the {placed} broker(s) "
                         "of the cluster", field="replication_factor", brokers=placed)


def validate_topic_name(name: object) -> str:
    """The name if it is a safe topic name, else InvalidTopicName (400).

    Names become directory names, so besides the pattern "." and ".." are
    refused; the pattern already excludes "/", NUL and anything non-ASCII.
    """
    if not isinstance(name, str) or not limits.TOPIC_NAME_PATTERN.fullmatch(name) or name in (".", ".."):
        shown = repr(name)[:80] if isinstance(name, str) else type(name).__name__
        raise InvalidTopicName(
            f"invalid topic name {shown}: use 1-{limits.TOPIC_NAME_BYTES_MAX} of "
            "A-Z a-z 0-9 . _ - (not '.' or '..')"
        )
    return name


def encode_id(raw: bytes) -> str:
    """A topic id from ``TOPIC_ID_BYTES`` bytes: unpadded base64url, as Kafka shows its topic ids."""
    assert len(raw) == TOPIC_ID_BYTES, len(raw)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def derived_id(name: str, created_ms: int) -> str:
    """The id of a topic stored without one (by a release without ids): a hash of its name and creation
    time, so every broker derives the same one."""
    digest = hashlib.blake2b(f"{name}\x00{created_ms}".encode(), digest_size=TOPIC_ID_BYTES).digest()
    return encode_id(digest)


def _topic_id(body: dict[str, Any]) -> str:
    value = body.get("id")
    if value is None:
        return ""
    if not isinstance(value, str) or not _TOPIC_ID.fullmatch(value):
        raise BadRequest("id must be 22 characters of base64url", field="id")
    return value


def _bool_field(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if type(value) is not bool:
        raise BadRequest(f"{name} must be true or false", field=name)
    return value


def _int_field(body: dict[str, Any], field: str, default: int, lo: int, hi: int) -> int:
    value = body.get(field, default)
    if value is None:
        return default
    if type(value) is not int or not lo <= value <= hi:
        raise BadRequest(f"{field} must be an integer in [{lo}, {hi}]", field=field)
    return value


def _retention_ms(body: dict[str, Any]) -> int:
    value = _int_field(body, "retention_ms", limits.RETENTION_MS_DEFAULT, -1, 2**62)
    if value == 0:
        raise BadRequest("retention_ms must be positive, or -1 to keep records forever", field="retention_ms")
    return value


def _partitions(body: dict[str, Any], default: int) -> tuple[int, bool | None]:
    """(count, auto) from a body's ``partitions``: an integer, or "auto" (start at one, grow with
    the groups reading the topic); auto is None when the body does not say."""
    value = body.get("partitions")
    if value == "auto":
        return limits.AUTO_PARTITIONS_INITIAL, True
    auto = body.get("auto_partitions")
    if auto is not None and type(auto) is not bool:
        raise BadRequest("auto_partitions must be true or false", field="auto_partitions")
    count = _int_field(body, "partitions", default, 1, limits.TOPIC_PARTITIONS_MAX)
    return count, auto


@dataclass(frozen=True)
class TopicConfig:
    name: str
    partitions: int = limits.TOPIC_PARTITIONS_DEFAULT
    replication_factor: int = REPLICATION_FACTOR_DEFAULT
    retention_ms: int = limits.RETENTION_MS_DEFAULT  # -1: keep forever
    retention_bytes: int = limits.RETENTION_BYTES_DEFAULT  # -1: no size limit
    segment_bytes: int = limits.SEGMENT_BYTES_DEFAULT
    compression: str = "none"
    consistency: str = CONSISTENCY_DEFAULT
    created_ms: int = 0
    auto_partitions: bool = False  # grows when a group has more consumers than partitions
    base_partitions: int = 0  # the count at creation, which placement keeps (0: ``partitions``)
    # Bytes of closed segments a partition's replicas keep once they are safe as ranges on other
    # brokers (ring.ranges); -1 keeps everything local and makes no ranges.
    local_retention_bytes: int = -1
    id: str = ""  # this incarnation of the name (empty: derived from the name and ``created_ms``)
    # A partition whose only voters holding what was acknowledged are gone elects its most up-to-date
    # live replica anyway (Kafka's unclean.leader.election.enable): availability over what those
    # voters held. Off: it stays without a leader (``no_eligible_leader``) until one returns.
    unclean_leader_election: bool = False

    def __post_init__(self) -> None:
        if not self.base_partitions:
            object.__setattr__(self, "base_partitions", self.partitions)
        if not self.id:
            object.__setattr__(self, "id", derived_id(self.name, self.created_ms))

    @classmethod
    def from_request(cls, body: object, now_ms: int, stored: bool = False) -> TopicConfig:
        """Validate a create-topic body (only "name" required); ``stored``: a config the broker wrote."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object with at least a name")
        unknown = sorted(set(body) - set(_FIELDS) - (set(_STORED_FIELDS) if stored else set()))
        if unknown:
            raise BadRequest(f"unknown topic settings: {', '.join(map(str, unknown))[:200]}")
        compression = body.get("compression") or "none"
        if compression not in COMPRESSIONS:
            raise BadRequest(f"compression must be one of {', '.join(COMPRESSIONS)}", field="compression")
        consistency = body.get("consistency") or CONSISTENCY_DEFAULT
        if consistency not in CONSISTENCY_LEVELS:
            raise BadRequest(f"consistency must be one of {', '.join(CONSISTENCY_LEVELS)}", field="consistency")
        partitions, auto = _partitions(body, limits.TOPIC_PARTITIONS_DEFAULT)
        base = _int_field(body, "base_partitions", partitions, 1, partitions) if stored else partitions
        return cls(
            name=validate_topic_name(body.get("name")),
            partitions=partitions,
            auto_partitions=bool(auto),
            base_partitions=base,
            replication_factor=_int_field(body, "replication_factor", REPLICATION_FACTOR_DEFAULT, 1, REPLICATION_FACTOR_MAX),
            retention_ms=_retention_ms(body),
            retention_bytes=_int_field(body, "retention_bytes", limits.RETENTION_BYTES_DEFAULT, -1, 2**62),
            local_retention_bytes=_int_field(body, "local_retention_bytes", -1, -1, 2**62),
            segment_bytes=_int_field(body, "segment_bytes", limits.SEGMENT_BYTES_DEFAULT,
                                     limits.SEGMENT_BYTES_MIN, limits.SEGMENT_BYTES_MAX),
            compression=compression,
            consistency=consistency,
            created_ms=now_ms,
            id=_topic_id(body) if stored else "",
            unclean_leader_election=_bool_field(body, "unclean_leader_election"),
        )

    def check_partition(self, partition: int) -> None:
        """UnknownPartition unless ``partition`` is one of this topic's."""
        if not 0 <= partition < self.partitions:
            raise UnknownPartition(f"topic {self.name!r} has partitions 0..{self.partitions - 1}, not {partition}",
                                   topic=self.name, partition=partition)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if not self.unclean_leader_election:
            del doc["unclean_leader_election"]  # (so configs that do not use it read as before everywhere)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TopicConfig:
        """Load a stored config; re-validated so a hand-edited file cannot smuggle in a bad name."""
        created_ms = doc.get("created_ms", 0)
        return cls.from_request(
            {k: doc[k] for k in _FIELDS + _STORED_FIELDS if k in doc},
            now_ms=created_ms if type(created_ms) is int else 0, stored=True,
        )

    def changed(self, body: object) -> TopicConfig:
        """This topic with a change request's settings (``CHANGEABLE``) applied.

        The partition count only grows ("auto" keeps the count and turns
        growth on); the name, replication factor and segment size are fixed.
        """
        if not isinstance(body, dict) or not body:
            raise BadRequest(f"the body must be a JSON object with one or more of {', '.join(CHANGEABLE)}")
        fixed = sorted(set(body) & (set(_FIELDS) - set(CHANGEABLE)))
        if fixed:
            raise BadRequest(f"{', '.join(fixed)} cannot be changed after a topic is created "
                             f"(changeable: {', '.join(CHANGEABLE)})", field=fixed[0])
        unknown = sorted(set(body) - set(CHANGEABLE))
        if unknown:
            raise BadRequest(f"unknown topic settings: {', '.join(map(str, unknown))[:200]}")
        merged = {**self.to_json(), **body}
        if body.get("partitions") == "auto":
            merged.update(partitions=self.partitions, auto_partitions=True)
        elif "partitions" in body and type(body["partitions"]) is int and body["partitions"] < self.partitions:
            raise BadRequest(f"topic {self.name!r} has {self.partitions} partitions: the count can grow, "
                             f"never shrink (asked for {body['partitions']})", field="partitions")
        return TopicConfig.from_json(merged)


class Catalog:
    """Topic name -> TopicConfig, with a version bumped on every change."""

    def __init__(self, topics: dict[str, TopicConfig] | None = None, version: int = 0) -> None:
        self._topics: dict[str, TopicConfig] = dict(topics or {})
        self.version = version

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    def __iter__(self) -> Iterator[TopicConfig]:
        return iter(sorted(self._topics.values(), key=lambda t: t.name))

    def get(self, name: str) -> TopicConfig:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopic(f"unknown topic {name!r}", topic=name) from None

    def add(self, config: TopicConfig) -> None:
        if config.name in self._topics:
            raise Conflict(f"topic {config.name!r} already exists", topic=config.name)
        if len(self._topics) >= limits.TOPICS_MAX:
            raise Conflict(f"the cluster already holds the maximum of {limits.TOPICS_MAX} topics")
        self._topics[config.name] = config
        self.version += 1

    def replace(self, config: TopicConfig) -> None:
        """A changed config of a topic in the catalogue (same incarnation)."""
        assert self._topics[config.name].id == config.id, config.name
        self._topics[config.name] = config
        self.version += 1

    def remove(self, name: str) -> TopicConfig:
        config = self.get(name)
        del self._topics[name]
        self.version += 1
        return config

    def dumps(self) -> bytes:
        doc = {"version": self.version, "topics": [t.to_json() for t in self]}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    @classmethod
    def loads(cls, data: bytes) -> Catalog:
        try:
            doc = orjson.loads(data)
            topics = [TopicConfig.from_json(t) for t in doc["topics"]]
            version = int(doc.get("version", 0))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, BadRequest) as exc:
            raise StorageError(f"the topic catalogue is damaged: {exc}") from None
        return cls({t.name: t for t in topics}, version)


def with_defaults(name: str, now_ms: int) -> TopicConfig:
    """The config of a topic created implicitly by a first produce."""
    return replace(TopicConfig(name=validate_topic_name(name)), created_ms=now_ms)
