"""The gossip protocol as a deterministic state machine (no I/O, no clock).

Theory of operation. Every round the driver calls ``tick(now)``: the core
bumps its own heartbeat version, then picks whom to send a SYN carrying the
digest of its whole ``ClusterState``, by Cassandra's rule: one random live
peer; then, with probability ``down / (live + 1)``, one random convicted peer
(so a returning broker is noticed even if it cannot reach us); then, if the
live peer was not a seed or fewer peers are live than there are seeds, a
random seed, always when nobody is live, else with probability ``seeds /
(live + down)`` (so partitions heal through the seeds). The exchange is
push-pull in three messages::

    A --SYN(digest of A)-----------------------> B
    A <--ACK(what A lacks, request for what B lacks)-- B
    A --ACK2(what B asked for)-----------------> B

Absorbing an entry whose (generation, version) is newer than ours is a
heartbeat arrival for the failure detector; a new generation (a restart)
starts that broker's detector afresh. Our own entry is never taken from a
peer: if a peer shows a newer one (we restarted with a clock set back), we
move our version past it so ours wins again. ``status_of`` combines the
gossiped status with phi: convicted (phi >= 8) is "down", phi >= 5 is
"suspect". Drivers call ``tick`` every ``GOSSIP_INTERVAL_S``, pass every
message to ``on_message`` with the address to answer, and send what both
return; they may drop or reorder messages freely, gossip repairs that.
Message wire forms are plain dicts (``to_wire`` / ``message_from_wire``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Iterable, Union

from ring.errors import BadRequest, InvalidTopicName, NotFound, UnknownTopic
from ring.gossip.phi import CONVICT_PHI_DEFAULT, FailureDetector
from ring.gossip.state import (
    STATUSES,
    ClusterState,
    Digest,
    EndpointState,
    TopicEntry,
    _plain_map,
    _str,
    _topic_name,
)

_INT64_MAX = 2**63 - 1

# How often the driver ticks. The phi defaults are tuned for this.
GOSSIP_INTERVAL_S = 1.0
# phi at which a broker is reported "suspect": about 0.5 s before conviction
# with the default detector; a hint for dashboards, not a decision.
SUSPECT_PHI_DEFAULT = 5.0


# -- messages ----------------------------------------------------------------


@dataclass(frozen=True)
class Syn:
    sender: str
    digest: Digest

    def to_wire(self) -> dict[str, Any]:
        return {"type": "syn", "sender": self.sender, "digest": self.digest.to_wire()}


@dataclass(frozen=True)
class Ack:
    sender: str
    delta: ClusterState
    request: Digest

    def to_wire(self) -> dict[str, Any]:
        return {"type": "ack", "sender": self.sender, "delta": self.delta.to_wire(),
                "request": self.request.to_wire()}  # fmt: skip


@dataclass(frozen=True)
class Ack2:
    sender: str
    delta: ClusterState

    def to_wire(self) -> dict[str, Any]:
        return {"type": "ack2", "sender": self.sender, "delta": self.delta.to_wire()}


Message = Union[Syn, Ack, Ack2]
_FIELDS = {"syn": {"type", "sender", "digest"}, "ack": {"type", "sender", "delta", "request"},
           "ack2": {"type", "sender", "delta"}}  # fmt: skip


def message_from_wire(w: Any) -> Message:
    """Parse a gossip message; BadRequest on anything malformed."""
    kind = w.get("type") if type(w) is dict else None
    if type(kind) is not str or kind not in _FIELDS or set(w) != _FIELDS[kind]:
        raise BadRequest("malformed gossip: not a syn, ack or ack2 message")
    sender = _str(w["sender"], "sender")
    if kind == "syn":
        return Syn(sender, Digest.from_wire(w["digest"]))
    if kind == "ack":
        return Ack(sender, ClusterState.from_wire(w["delta"]), Digest.from_wire(w["request"]))
    return Ack2(sender, ClusterState.from_wire(w["delta"]))


@dataclass(frozen=True)
class Outgoing:
    """Send ``message`` to the peer address ``to_addr``."""

    to_addr: str
    message: Message


# -- the core ----------------------------------------------------------------


class GossipCore:
    def __init__(
        self,
        self_state: EndpointState,
        seeds: Iterable[str],
        rng: random.Random,
        *,
        detector: FailureDetector | None = None,
        suspect_phi: float = SUSPECT_PHI_DEFAULT,
        convict_phi: float = CONVICT_PHI_DEFAULT,
    ) -> None:
        assert 0 < suspect_phi <= convict_phi
        self.name = self_state.name
        self.state = ClusterState.of([self_state])
        # Sorted: choices must not depend on set order (hash seeds differ per process).
        self.seeds = sorted(set(seeds) - {self_state.peer_addr})
        self.rng = rng
        self.detector = detector if detector is not None else FailureDetector()
        self.suspect_phi = suspect_phi
        self.convict_phi = convict_phi

    @property
    def self_state(self) -> EndpointState:
        return self.state.endpoints[self.name]

    # -- protocol --------------------------------------------------------------

    def tick(self, now_s: float) -> list[Outgoing]:
        """One gossip round: heartbeat, then SYNs to the chosen peers."""
        self.detector.tick(now_s)
        self._replace_self(self.self_state.bumped())
        live, down = self._live_and_down(now_s)
        rng, seeds = self.rng, self.seeds
        targets: list[str] = []
        to_seed = False
        if live:
            targets.append(self.state.endpoints[rng.choice(live)].peer_addr)
            to_seed = targets[0] in seeds
        if down and rng.random() < len(down) / (len(live) + 1):
            targets.append(self.state.endpoints[rng.choice(down)].peer_addr)
        if seeds and (not to_seed or len(live) < len(seeds)):
            if not live or rng.random() < len(seeds) / (len(live) + len(down)):
                targets.append(rng.choice(seeds))
        syn = Syn(self.name, self.state.digest())
        return [Outgoing(addr, syn) for addr in dict.fromkeys(targets)]

    def on_message(self, now_s: float, sender: str, msg: Message) -> list[Outgoing]:
        """Step on a message from the peer at address ``sender``; answers go there."""
        if msg.sender == self.name:
            return []  # misrouted to ourselves
        if isinstance(msg, Syn):
            delta, request = self.state.delta_for(msg.digest), self.state.wants(msg.digest)
            return [Outgoing(sender, Ack(self.name, delta, request))]
        if isinstance(msg, Ack):
            self._absorb(now_s, msg.delta)
            if not len(msg.request):
                return []
            reply = self.state.delta_for(msg.request)
            return [Outgoing(sender, Ack2(self.name, reply))] if reply.endpoints or reply.topics else []
        assert isinstance(msg, Ack2), type(msg)
        self._absorb(now_s, msg.delta)
        return []

    def _absorb(self, now_s: float, delta: ClusterState) -> None:
        theirs = delta.endpoints.get(self.name)
        if theirs is not None:
            mine = self.self_state
            if (theirs.generation, theirs.version) >= (mine.generation, mine.version):
                self._replace_self(replace(mine, generation=theirs.generation, version=theirs.version + 1))
            delta = ClusterState({n: e for n, e in delta.endpoints.items() if n != self.name}, delta.topics)
        changes = self.state.absorb(delta)
        for old, new in changes.endpoints:
            if new.status == "removed":
                self.detector.forget(new.name)
            elif old is None or old.generation != new.generation:
                self.detector.forget(new.name)  # a new incarnation: fresh history
                self.detector.heartbeat(new.name, now_s)
            elif new.version > old.version:
                self.detector.heartbeat(new.name, now_s)

    def _replace_self(self, new: EndpointState) -> None:
        assert new.name == self.name
        if new.version > _INT64_MAX:
            # Versions are int64 on the wire: past the top, a new generation wins over any version;
            # at the top generation too, stay there (valid, if no longer sure to win).
            new = (replace(new, generation=new.generation + 1, version=0) if new.generation < _INT64_MAX
                   else replace(new, version=_INT64_MAX))
        self.state.endpoints[self.name] = new

    def _live_and_down(self, now_s: float) -> tuple[list[str], list[str]]:
        live, down = [], []
        for name in sorted(self.state.endpoints):
            ep = self.state.endpoints[name]
            if name == self.name or ep.status == "removed":
                continue
            (down if self.detector.is_convicted(name, now_s, self.convict_phi) else live).append(name)
        return live, down

    # -- queries ---------------------------------------------------------------

    def status_of(self, name: str, now_s: float) -> str:
        """"up", "suspect", "down", "joining", "leaving" or "removed"."""
        ep = self.state.endpoints.get(name)
        if ep is None:
            raise NotFound(f"unknown broker {name!r}")
        if ep.status == "removed":
            return "removed"
        if name != self.name:
            phi = self.detector.phi(name, now_s)
            if phi >= self.convict_phi:
                return "down"
            if phi >= self.suspect_phi:
                return "suspect"
        return "up" if ep.status == "normal" else ep.status

    def statuses(self, now_s: float) -> dict[str, str]:
        return {n: self.status_of(n, now_s) for n in sorted(self.state.endpoints)}

    def phi(self, name: str, now_s: float) -> float:
        return 0.0 if name == self.name else self.detector.phi(name, now_s)

    def topics(self) -> dict[str, dict[str, Any]]:
        """Live topics and their configs (deleted ones left out)."""
        return self.state.live_topics()

    # -- local mutations (each moves our version or the topic's forward) --------

    def set_status(self, status: str) -> None:
        assert status in STATUSES, status
        self._replace_self(self.self_state.bumped(status=status))

    def set_load(self, load: dict[str, Any]) -> None:
        self._replace_self(self.self_state.bumped(load=_plain_map(load, "load")))

    def set_extra(self, extra: dict[str, Any]) -> None:
        self._replace_self(self.self_state.bumped(extra=_plain_map(extra, "extra")))

    def put_topic(self, name: str, config: dict[str, Any], now_ms: int) -> TopicEntry:
        """Create or reconfigure a topic; wins over every version we know."""
        try:
            _topic_name(name)
        except BadRequest as e:
            raise InvalidTopicName(e.message) from None
        return self._write_topic(name, _plain_map(config, "topic config"), now_ms)

    def delete_topic(self, name: str, now_ms: int) -> TopicEntry:
        entry = self.state.topics.get(name)
        if entry is None or entry.config is None:
            raise UnknownTopic(f"unknown topic {name!r}", topic=name)
        return self._write_topic(name, None, now_ms)

    def _write_topic(self, name: str, config: dict[str, Any] | None, now_ms: int) -> TopicEntry:
        assert type(now_ms) is int and now_ms >= 0, now_ms
        old = self.state.topics.get(name)
        # Capped at int64 (the wire's bound): a peer's entry at the very top then wins ties.
        ts = now_ms if old is None else min(max(now_ms, old.timestamp_ms + 1), _INT64_MAX)
        entry = TopicEntry(ts, self.name, config)
        self.state.topics[name] = entry
        return entry

