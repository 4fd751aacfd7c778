"""The gossiped cluster state: a map that merges like a CRDT.

Two kinds of entries, each with a version that totally orders its values:

* one ``EndpointState`` per broker (name, token, addresses, status, load),
  written only by that broker. Its key is ``(generation, version,
  fingerprint)``: generation is the broker's start time (a restart wins over
  anything the old incarnation said), version is bumped by the owner on every
  heartbeat and change.
* one ``TopicEntry`` per topic name: last writer wins by ``(timestamp_ms,
  writer_name)``; a ``None`` config is the tombstone of a deleted topic.

The fingerprint (63 bits of BLAKE2b over the canonical JSON of the entry) ends
the key so that two different values never tie: should an owner ever reuse a
version (a clock set back across a restart), every replica still picks the
same winner, and the digest, which carries the whole key, still tells the two
apart. So ``merge`` (keep the entry with the larger key) is commutative,
associative and idempotent, and digest-driven push-pull converges.

``digest()`` lists every key; ``delta_for(digest)`` is what the digest's owner
lacks or has older; ``wants(digest)`` is the part of a digest that is newer
than ours, sent back as a request. ``to_wire``/``from_wire`` speak plain
dicts/lists (msgpack or JSON); ``from_wire`` raises ``BadRequest`` and
nothing else on any malformed input.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from ring import limits
from ring.errors import BadRequest

STATUSES = ("joining", "normal", "leaving", "removed")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

EndpointKey = tuple[int, int, int]  # (generation, version, fingerprint)
TopicKey = tuple[int, str, int]  # (timestamp_ms, writer, fingerprint)


def _fingerprint(wire: Any) -> int:
    canon = json.dumps(wire, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return int.from_bytes(hashlib.blake2b(canon.encode(), digest_size=8).digest(), "big") >> 1


# -- validation of untrusted input -------------------------------------------


def _bad(what: str) -> BadRequest:
    return BadRequest(f"malformed gossip: {what}")


def _int(v: Any, what: str, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(f"{what} must be an integer in [{lo}, {hi}]")
    return v


def _str(v: Any, what: str, max_bytes: int = limits.BROKER_NAME_BYTES_MAX, empty: bool = False) -> str:
    if type(v) is not str or (not v and not empty):
        raise _bad(f"{what} must be a {'' if empty else 'non-empty '}string")
    try:
        n = len(v.encode())
    except UnicodeEncodeError:
        raise _bad(f"{what} is not valid unicode") from None
    if n > max_bytes:
        raise _bad(f"{what} longer than {max_bytes} bytes")
    return v


def _seq(v: Any, what: str, n: int | None = None) -> list | tuple:
    if type(v) not in (list, tuple) or (n is not None and len(v) != n):
        raise _bad(f"{what} must be a list" + (f" of {n}" if n is not None else ""))
    return v


def _map(v: Any, what: str) -> dict:
    if type(v) is not dict:
        raise _bad(f"{what} must be a map")
    return v


def _topic_name(v: Any, what: str = "topic name") -> str:
    _str(v, what, limits.TOPIC_NAME_BYTES_MAX)
    if not limits.TOPIC_NAME_PATTERN.fullmatch(v) or v in (".", ".."):
        raise _bad(f"{what} {v!r} is not a valid topic name")
    return v


def plain(v: Any, what: str, depth: int = 0) -> Any:
    """Check a free-form gossiped value (load, extra, topic config); copy it."""
    if depth > limits.GOSSIP_VALUE_DEPTH_MAX:
        raise _bad(f"{what} nested deeper than {limits.GOSSIP_VALUE_DEPTH_MAX}")
    t = type(v)
    if v is None or t is bool:
        return v
    if t is int:
        return _int(v, what)
    if t is float:
        if not math.isfinite(v):
            raise _bad(f"{what} must be a finite number")
        return v
    if t is str:
        return _str(v, what, limits.GOSSIP_STRING_BYTES_MAX, empty=True)
    if t in (list, tuple):
        if len(v) > limits.GOSSIP_MAP_KEYS_MAX:
            raise _bad(f"{what} has more than {limits.GOSSIP_MAP_KEYS_MAX} items")
        return [plain(x, what, depth + 1) for x in v]
    if t is dict:
        return _plain_map(v, what, depth)
    raise _bad(f"{what} holds a {t.__name__}")


def _plain_map(v: Any, what: str, depth: int = 0) -> dict[str, Any]:
    _map(v, what)
    if len(v) > limits.GOSSIP_MAP_KEYS_MAX:
        raise _bad(f"{what} has more than {limits.GOSSIP_MAP_KEYS_MAX} keys")
    out = {}
    for k, x in v.items():
        _str(k, f"key of {what}", limits.GOSSIP_STRING_BYTES_MAX, empty=True)
        out[k] = plain(x, what, depth + 1)
    return out


# -- entries -----------------------------------------------------------------


@dataclass(frozen=True)
class EndpointState:
    """What one broker says about itself. Treat as immutable (load/extra too)."""

    name: str
    token: int
    client_addr: str
    peer_addr: str
    generation: int
    version: int = 0
    status: str = "joining"
    load: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    @cached_property
    def key(self) -> EndpointKey:
        return (self.generation, self.version, _fingerprint(self.to_wire()))

    def bumped(self, **changes: Any) -> EndpointState:
        """A copy with changes applied and the version moved past this one."""
        return dataclasses.replace(self, version=self.version + 1, **changes)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name, "token": self.token, "client_addr": self.client_addr,
            "peer_addr": self.peer_addr, "generation": self.generation,
            "version": self.version, "status": self.status,
            "load": self.load, "extra": self.extra,
        }  # fmt: skip

    @classmethod
    def from_wire(cls, w: Any) -> EndpointState:
        _map(w, "endpoint")
        if set(w) != _ENDPOINT_FIELDS:
            raise _bad(f"endpoint fields must be {sorted(_ENDPOINT_FIELDS)}")
        status = w["status"]
        if status not in STATUSES:
            raise _bad(f"endpoint status must be one of {STATUSES}")
        return cls(
            name=_str(w["name"], "endpoint name"),
            token=_int(w["token"], "token"),
            client_addr=_str(w["client_addr"], "client_addr"),
            peer_addr=_str(w["peer_addr"], "peer_addr"),
            generation=_int(w["generation"], "generation", 0),
            version=_int(w["version"], "version", 0),
            status=status,
            load=_plain_map(w["load"], "load"),
            extra=_plain_map(w["extra"], "extra"),
        )


_ENDPOINT_FIELDS = frozenset(f.name for f in dataclasses.fields(EndpointState))


@dataclass(frozen=True)
class TopicEntry:
    """One catalogue entry; ``config is None`` marks a deleted topic."""

    timestamp_ms: int
    writer: str
    config: dict[str, Any] | None

    @property
    def version(self) -> tuple[int, str]:
        return (self.timestamp_ms, self.writer)

    @property
    def deleted(self) -> bool:
        return self.config is None

    @cached_property
    def key(self) -> TopicKey:
        return (self.timestamp_ms, self.writer, _fingerprint(self.to_wire()))

    def to_wire(self) -> list[Any]:
        return [self.timestamp_ms, self.writer, self.config]

    @classmethod
    def from_wire(cls, w: Any) -> TopicEntry:
        ts, writer, config = _seq(w, "topic entry", 3)
        return cls(
            timestamp_ms=_int(ts, "topic timestamp", 0),
            writer=_str(writer, "topic writer"),
            config=None if config is None else _plain_map(config, "topic config"),
        )


# -- digests -----------------------------------------------------------------


@dataclass
class Digest:
    """Keys of a state, for push-pull. ``complete``: a name missing from a
    complete digest is one its owner lacks; a partial digest (a request) only
    speaks about the names it lists, and ``None`` there means "I have none"."""

    endpoints: dict[str, EndpointKey | None] = field(default_factory=dict)
    topics: dict[str, TopicKey | None] = field(default_factory=dict)
    complete: bool = True

    def __len__(self) -> int:
        return len(self.endpoints) + len(self.topics)

    def to_wire(self) -> dict[str, Any]:
        return {
            "endpoints": {n: None if k is None else list(k) for n, k in self.endpoints.items()},
            "topics": {n: None if k is None else list(k) for n, k in self.topics.items()},
            "complete": self.complete,
        }

    @classmethod
    def from_wire(cls, w: Any) -> Digest:
        _map(w, "digest")
        if set(w) != {"endpoints", "topics", "complete"} or type(w["complete"]) is not bool:
            raise _bad("digest must hold endpoints, topics and complete")
        eps, tops = _map(w["endpoints"], "digest endpoints"), _map(w["topics"], "digest topics")
        if len(eps) > limits.BROKERS_MAX or len(tops) > limits.GOSSIP_TOPIC_ENTRIES_MAX:
            raise _bad("digest too large")
        d = cls(complete=w["complete"])
        for n, k in eps.items():
            _str(n, "endpoint name")
            if k is not None:
                g, v, fp = _seq(k, "endpoint key", 3)
                k = (_int(g, "generation", 0), _int(v, "version", 0), _int(fp, "fingerprint"))
            d.endpoints[n] = k
        for n, k in tops.items():
            _topic_name(n)
            if k is not None:
                ts, writer, fp = _seq(k, "topic key", 3)
                k = (_int(ts, "topic timestamp", 0), _str(writer, "topic writer"), _int(fp, "fingerprint"))
            d.topics[n] = k
        return d


def _newer(mine: Any, theirs: Any, listed: bool, complete: bool) -> bool:
    if not listed:
        return complete
    return theirs is None or mine > theirs


# -- the state ---------------------------------------------------------------


@dataclass
class Absorbed:
    """What an absorb changed: (old or None, new) per endpoint, topic names."""

    endpoints: list[tuple[EndpointState | None, EndpointState]] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.endpoints or self.topics)


@dataclass
class ClusterState:
    endpoints: dict[str, EndpointState] = field(default_factory=dict)
    topics: dict[str, TopicEntry] = field(default_factory=dict)

    def copy(self) -> ClusterState:
        # Entries are immutable, so sharing them is safe.
        return ClusterState(dict(self.endpoints), dict(self.topics))

    # -- merging ---------------------------------------------------------------

    def absorb(self, other: ClusterState) -> Absorbed:
        """Merge other into self in place; report what changed."""
        out = Absorbed()
        for name in sorted(other.endpoints):
            new, old = other.endpoints[name], self.endpoints.get(name)
            if old is None or new.key > old.key:
                self.endpoints[name] = new
                out.endpoints.append((old, new))
        for name in sorted(other.topics):
            new, old = other.topics[name], self.topics.get(name)
            if old is None or new.key > old.key:
                self.topics[name] = new
                out.topics.append(name)
        return out

    def merge(self, other: ClusterState) -> ClusterState:
        merged = self.copy()
        merged.absorb(other)
        return merged

    # -- push-pull -------------------------------------------------------------

    def digest(self) -> Digest:
        return Digest(
            {n: e.key for n, e in self.endpoints.items()},
            {n: t.key for n, t in self.topics.items()},
        )

    def delta_for(self, digest: Digest) -> ClusterState:
        """Entries the digest's owner lacks or has older (only the names a
        partial digest lists)."""
        de, dt, c = digest.endpoints, digest.topics, digest.complete
        return ClusterState(
            {n: e for n, e in self.endpoints.items() if _newer(e.key, de.get(n), n in de, c)},
            {n: t for n, t in self.topics.items() if _newer(t.key, dt.get(n), n in dt, c)},
        )

    def wants(self, digest: Digest) -> Digest:
        """A partial digest of ours naming what the digest has newer than us."""
        mine_e = {n: e.key for n, e in self.endpoints.items()}
        mine_t = {n: t.key for n, t in self.topics.items()}
        return Digest(
            {n: mine_e.get(n) for n, k in digest.endpoints.items() if k is not None and (n not in mine_e or k > mine_e[n])},
            {n: mine_t.get(n) for n, k in digest.topics.items() if k is not None and (n not in mine_t or k > mine_t[n])},
            complete=False,
        )

    # -- topics ----------------------------------------------------------------

    def live_topics(self) -> dict[str, dict[str, Any]]:
        return {n: t.config for n, t in sorted(self.topics.items()) if t.config is not None}

    def purge_tombstones(self, before_ms: int) -> list[str]:
        """Forget deletions older than before_ms. Only safe once every replica
        that could still hold the live entry has seen the tombstone (the
        caller picks before_ms far enough back, as Cassandra's gc_grace)."""
        gone = [n for n, t in self.topics.items() if t.config is None and t.timestamp_ms < before_ms]
        for n in gone:
            del self.topics[n]
        return sorted(gone)

    # -- wire ------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        return {
            "endpoints": [e.to_wire() for _, e in sorted(self.endpoints.items())],
            "topics": {n: t.to_wire() for n, t in sorted(self.topics.items())},
        }

    @classmethod
    def from_wire(cls, w: Any) -> ClusterState:
        _map(w, "cluster state")
        if set(w) != {"endpoints", "topics"}:
            raise _bad("cluster state must hold endpoints and topics")
        eps, tops = _seq(w["endpoints"], "endpoints"), _map(w["topics"], "topics")
        if len(eps) > limits.BROKERS_MAX or len(tops) > limits.GOSSIP_TOPIC_ENTRIES_MAX:
            raise _bad("cluster state too large")
        st = cls()
        for x in eps:
            e = EndpointState.from_wire(x)
            if e.name in st.endpoints:
                raise _bad(f"endpoint {e.name!r} listed twice")
            st.endpoints[e.name] = e
        for n, x in tops.items():
            st.topics[_topic_name(n)] = TopicEntry.from_wire(x)
        return st

    @classmethod
    def of(cls, endpoints: Iterable[EndpointState] = (), topics: Mapping[str, TopicEntry] | None = None) -> ClusterState:
        return cls({e.name: e for e in endpoints}, dict(topics or {}))
