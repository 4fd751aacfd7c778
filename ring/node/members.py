"""Membership rules over the gossip core: joining, statuses, the ring, removals, and the view elections use.

``Members`` wraps ``GossipCore`` (ring/gossip: heartbeats, digests, phi
accrual) with the rules a broker applies to what gossip tells it:

* joining: a broker told about its peers only by seeds knows nothing of the
  ring until an exchange succeeds, so it is ``joining`` (the broker turns
  client requests away) until ``placement.joined`` says it has seen enough
  (a seed that never answers holds it back ``JOIN_SETTLE_S`` after its first
  exchange) and it has compared its clock with its live peers' (a broker
  with none has nothing to compare with);
* clocks: every exchange this broker starts measures the peer's wall clock
  (the driver passes the readings in), and every round judges this broker's
  clock against its peers' (``clockwatch.py``): out of bounds, it leads no
  partition, stamps no record and applies no retention by age;
* statuses: phi's ``up``/``suspect``/``down``, except that a peer known only
  from the state saved in an earlier run counts as ``down`` until it is
  heard from in this one, and a removed broker is ``removed``;
* the ring: brokers in it are the ones gossip knows, minus the removed
  (``placement.placement_ring``); a change is reported so the broker places
  partitions anew;
* removals: a broker down longer than the grace period (``down_grace_s``),
  while a majority of the ring is up here, is removed like a decommissioned
  one: ``{name: generation}`` in our gossip entry, saved first;
* the view elections decide on (``view``): who is alive or up, generations,
  the partitions each broker claims to lead, the replicas it has that are
  still catching up (``ring.gossip.leaders`` decodes them, once per change
  of a peer's entry), and our own claims put into our entry (encoded again
  only when they change).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Callable, Iterable

from ring import limits
from ring.errors import NotFound
from ring.gossip import leaders
from ring.gossip import clocks
from ring.gossip.core import Ack, Ack2, GossipCore, Message, Outgoing, Syn
from ring.gossip.state import ClusterState, EndpointState
from ring.hashing import Ring
from ring.node import placement
from ring.node.clockwatch import ClockWatch
from ring.replication import versions
from ring.replication.protocol import ALIVE_STATUSES
from ring.replication.replica import Replica

log = logging.getLogger("ring.cluster")

Key = tuple[str, int]
# A seed that never answers holds a starting broker back this long after its
# first successful exchange (the others may simply know nothing of it yet).
JOIN_SETTLE_S = 5.0


class Members:
    def __init__(self, me: EndpointState, seeds: Iterable[str], rng: random.Random,
                 down_grace_s: float = limits.DOWN_GRACE_S_DEFAULT,
                 max_clock_offset_ms: float = limits.CLOCK_OFFSET_MS_MAX_DEFAULT) -> None:
        self.name = me.name
        self.gossip = GossipCore(me, seeds, rng)
        self.clock = ClockWatch(me.name, max_clock_offset_ms, rng)
        self.down_grace_s = down_grace_s
        self.ring = Ring()
        self.joined = False
        self.stalled = False  # the last gossip round found we had been stopped
        self.dirty = False  # the state changed since it was last saved
        self._ring_key: tuple = ()
        self._removed: set[str] = set()
        self._extra: dict[str, Any] = {}
        self._down_since: dict[str, float] = {}
        self._first_exchange_s: float | None = None
        # Peers' claims and behind-sets, decoded once per change of their value (a heartbeat brings a new,
        # usually equal, copy every round), with a counter bumped on each change (news for elections),
        # and the partitions whose entries changed gathered in ``_moved``.
        self._claims_cache: dict[str, tuple[Any, dict[Key, int], int]] = {}
        self._behind_cache: dict[str, tuple[Any, set[Key], int]] = {}
        self._moved: set[Key] = set()  # partitions whose claims or behind-set entries changed (``moved``)
        self._published: tuple[dict[Key, int], set[Key]] | None = None
        self.set_extra(versions.EXTRA_KEY, versions.advertised())

    def restore(self, saved: ClusterState | None, removed: dict[str, int] | None, now: float,
                decommissioned: dict[str, str] | None = None) -> None:
        """What an earlier run saved: known brokers and topics (not heartbeats), our removals and our
        decommissions."""
        if saved is not None:
            saved.endpoints.pop(self.name, None)  # ours is this run's
            self.gossip.state.absorb(saved)
        if removed:
            self.set_extra("removed", removed)
        if decommissioned:
            self.set_extra("decommissioned", decommissioned)
        self.ring_changed()
        self.check_clock(now)
        self.check_joined(now)

    # --- gossip ---------------------------------------------------------------------------

    def tick(self, now: float, load: dict[str, Any]) -> list[Outgoing]:
        """One gossip round: the SYNs to send."""
        if load != self.gossip.self_state.load:  # gossiped with this round's heartbeat
            self.gossip.set_load(load)
        stalls = self.gossip.detector.stalls
        outs = self.gossip.tick(now)
        self.check_joined(now)
        self.stalled = self.gossip.detector.stalls != stalls  # we were stopped: statuses restart
        return outs

    def on_message(self, now: float, addr: str, message: Message) -> tuple[list[Outgoing], bool, bool]:
        """Step on a peer's message: (answers, the ring or the topic catalogue changed, the view
        elections decide on may have changed). The caller judges the clock, then ``check_joined``."""
        if not isinstance(message, (Ack, Ack2)):
            return self.gossip.on_message(now, addr, message), False, False
        before = [self._seen(name, now) for name in message.delta.endpoints]
        outs = self.gossip.on_message(now, addr, message)
        if self._first_exchange_s is None:
            self._first_exchange_s = now
        topics = self.gossip.state.topics
        topics_changed = any(topics.get(n) is t for n, t in message.delta.topics.items())
        ring_changed = self.ring_changed()
        self.dirty = self.dirty or topics_changed or ring_changed
        moved = before != [self._seen(name, now) for name in message.delta.endpoints]
        return outs, ring_changed or topics_changed, moved

    def _seen(self, name: str, now: float) -> tuple[Any, ...]:
        """What elections see of broker ``name``: its part of ``signature``, and changes of its claims and
        behind-set."""
        ep = self.gossip.state.endpoints.get(name)
        if ep is None or name == self.name:
            return ()
        return (*self._status(name, ep, now), self._leads(name, ep)[2], self._behind(name, ep)[2])

    def _status(self, name: str, ep: EndpointState, now: float) -> tuple[Any, ...]:
        return (self.status(name, now), ep.generation, self.clock_usable(name))

    def announce(self, now: float) -> list[Outgoing]:
        """A SYN to every live peer (after a local change, not in a round or two)."""
        syn = Syn(self.name, self.gossip.state.digest())
        return [Outgoing(ep.peer_addr, syn) for n, ep in sorted(self.gossip.state.endpoints.items())
                if n != self.name and self.status(n, now) not in ("down", "removed")]

    def addr_of(self, addr: str) -> str | None:
        """The broker at peer address ``addr``, if known."""
        return next((n for n, ep in self.gossip.state.endpoints.items() if ep.peer_addr == addr), None)

    # --- joining, the ring ----------------------------------------------------------------------

    def check_joined(self, now: float) -> bool:
        """Whether this broker just joined."""
        if self.joined:
            return False
        known = {ep.peer_addr for ep in self.gossip.state.endpoints.values()}
        since = 0.0 if self._first_exchange_s is None else now - self._first_exchange_s
        if not placement.joined(bool(self.gossip.seeds), self._first_exchange_s is not None,
                                all(s in known for s in self.gossip.seeds), since, JOIN_SETTLE_S) \
                or self.clock.verdict.state == clocks.UNKNOWN:  # compared with its peers' clocks first
            return False
        self.joined = True
        self.gossip.set_status("normal")
        self.ring_changed()
        log.info("%s joined the cluster: %s", self.name, ", ".join(n for _, n in self.ring.brokers))
        return True

    def ring_changed(self) -> bool:
        eps = self.gossip.state.endpoints.values()
        self._removed = placement.removed_brokers(eps, [leaders.decode_removed(e.extra.get("removed")) for e in eps],
                                                  [leaders.decode_decommissioned(e.extra.get("decommissioned"))
                                                   for e in eps])
        key = (tuple(sorted((e.name, e.token, e.status, placement.domain(e)) for e in eps)),
               tuple(sorted(self._removed)))
        if key == self._ring_key:
            return False
        self._ring_key = key
        ring = placement.placement_ring(eps, self._removed)
        changed = ring != self.ring
        self.ring = ring
        self.dirty = True
        return changed

    def past_grace(self, now: float) -> list[str]:
        """Brokers down longer than the grace period, while a majority of the ring is up here."""
        ring_names = [n for _, n in self.ring.brokers]
        for name in ring_names:
            if name != self.name and self.status(name, now) == "down":
                self._down_since.setdefault(name, now)
            else:
                self._down_since.pop(name, None)
        up = sum(1 for n in ring_names if self.alive(n, now))
        if up * 2 <= len(ring_names):
            return []
        gone = placement.past_grace(self._down_since, now, self.down_grace_s)
        for name in gone:
            log.warning("%s has been down for %.0f s (grace %.0f s)", name, now - self._down_since[name],
                        self.down_grace_s)
            self._down_since.pop(name, None)
        return gone

    def remove(self, name: str) -> dict[str, int] | None:
        """Take ``name`` (at its current generation) off the ring: our removals to save before they are
        gossiped, or None if it was removed already."""
        ep = self.endpoint(name)
        if ep is None:
            raise NotFound(f"unknown broker {name!r}")
        mine = dict(leaders.decode_removed(self._extra.get("removed")))
        if mine.get(name) == ep.generation:
            return None
        mine[name] = ep.generation
        log.warning("broker %s (generation %d) is removed from the ring", name, ep.generation)
        return mine

    def decommission(self, name: str) -> dict[str, str] | None:
        """Record that ``name`` is decommissioned on the data directory it runs on (its gossiped
        incarnation), so it stays off the ring when it starts again there: our decommissions to save
        before they are gossiped, or None if there is nothing new to record (recorded already, or a
        broker that gossips no incarnation, which its removal alone takes off the ring)."""
        ep = self.endpoint(name)
        incarnation = ep.extra.get("incarnation") if ep is not None else None
        mine = dict(leaders.decode_decommissioned(self._extra.get("decommissioned")))
        if not isinstance(incarnation, str) or mine.get(name) == incarnation:
            return None
        mine[name] = incarnation
        return mine

    # --- clocks ------------------------------------------------------------------------------------

    def live_peers(self, now: float) -> list[str]:
        """Peers whose clocks can be measured: heard from in this run and not down (joining ones too)."""
        return [n for n in sorted(self.gossip.state.endpoints)
                if n != self.name and self.status(n, now) not in ("down", "removed")]

    def check_clock(self, now: float) -> clocks.ClockVerdict | None:
        """Judge our clock and gossip the verdict; the verdict when the broker must hear of it."""
        verdict, changed = self.clock.check(now, len(self.live_peers(now)))
        self.set_extra("clock", clocks.to_gossip(verdict))
        return verdict if changed else None

    def clocks_to_measure(self, now: float) -> list[Outgoing]:
        """SYNs to the live peers whose clocks a judgement still needs measured."""
        syn = Syn(self.name, self.gossip.state.digest())
        return [Outgoing(self.gossip.state.endpoints[n].peer_addr, syn)
                for n in self.clock.to_measure(now, self.live_peers(now))]

    def clock_usable(self, name: str) -> bool:
        ep = self.gossip.state.endpoints.get(name)
        return self.clock.usable(name, ep.extra.get("clock") if ep is not None else None)

    def clock_of(self, name: str, now: float) -> dict[str, Any]:
        ep = self.gossip.state.endpoints.get(name)
        return self.clock.of(name, now, ep.extra.get("clock") if ep is not None else None)

    def removed(self) -> set[str]:
        return set(self._removed)

    # --- statuses ---------------------------------------------------------------------------------

    def status(self, name: str, now: float) -> str:
        """up, suspect, down, joining, leaving or removed, as this broker sees it."""
        if name in self._removed:
            return "removed"
        st = self.gossip.status_of(name, now)
        if name != self.name and st not in ("removed", "down") and self.gossip.detector.detector(name) is None:
            return "down"  # known from the saved state only: not heard from in this run
        return st

    def alive(self, name: str, now: float) -> bool:
        return name == self.name or (name in self.gossip.state.endpoints and self.status(name, now) in ALIVE_STATUSES)

    def endpoint(self, name: str) -> EndpointState | None:
        return self.gossip.state.endpoints.get(name)

    def protocol_version(self) -> int:
        """The peer-protocol version of the cluster: the highest every member (down ones included, the
        removed excepted) speaks, by the ranges they gossip (``ring.replication.versions``)."""
        removed = self.removed()
        return versions.cluster_version(versions.parse_range(ep.extra.get(versions.EXTRA_KEY))
                                        for name, ep in self.gossip.state.endpoints.items() if name not in removed)

    def version_for(self, peer: str | None) -> int:
        """The version to answer ``peer`` in: the cluster's, and none above what the peer gossips (one not
        heard of yet, as when this broker has just started with no saved state, may be of the older release)."""
        ep = self.gossip.state.endpoints.get(peer) if peer else None
        spoken = versions.parse_range(ep.extra.get(versions.EXTRA_KEY) if ep is not None else None)
        return min(self.protocol_version(), spoken[1])

    # --- our entry's extras, the claims -------------------------------------------------------------

    def set_extra(self, key: str, value: Any) -> None:
        """Gossip ``value`` under ``key`` in our entry's extra (a new version only when it changed)."""
        if self._extra.get(key) == value:
            return
        if value:
            self._extra[key] = value
        else:
            self._extra.pop(key, None)
        self.gossip.set_extra(dict(self._extra))

    def publish(self, reps: Iterable[Replica]) -> None:
        """Put what this broker leads (and what it holds that is behind) into its gossip entry."""
        leads: dict[Key, int] = {}
        behind: set[Key] = set()
        for r in reps:
            if r.is_leader:
                leads[(r.topic, r.index)] = r.epoch
            if not r.caught_up:
                behind.add((r.topic, r.index))
        if self._published != (leads, behind):
            self.set_extra("leads", leaders.encode_leads(leads))
            self.set_extra("behind", leaders.encode_partitions(behind))
            self._published = (leads, behind)

    def claims(self) -> dict[str, dict[Key, int]]:
        """Broker -> the partitions it says it leads, with their epochs (decoded once per change)."""
        return {name: self._leads(name, ep)[1] for name, ep in self.gossip.state.endpoints.items()
                if name != self.name}

    def _leads(self, name: str, ep: EndpointState) -> tuple[Any, dict[Key, int], int]:
        raw = ep.extra.get("leads")
        cached = self._claims_cache.get(name)
        if cached is None or (cached[0] is not raw and cached[0] != raw):
            leads, old = leaders.decode_leads(raw), cached[1] if cached else {}
            self._moved.update(k for k in old.keys() | leads.keys() if old.get(k) != leads.get(k))
            cached = self._claims_cache[name] = (raw, leads, cached[2] + 1 if cached else 0)
        return cached

    def behind(self, name: str) -> set[Key]:
        ep = self.endpoint(name)
        return self._behind(name, ep)[1] if ep is not None else set()

    def _behind(self, name: str, ep: EndpointState) -> tuple[Any, set[Key], int]:
        raw = ep.extra.get("behind")
        cached = self._behind_cache.get(name)
        if cached is None or (cached[0] is not raw and cached[0] != raw):
            behind = leaders.decode_partitions(raw)
            self._moved |= behind.symmetric_difference(cached[1] if cached else ())
            cached = self._behind_cache[name] = (raw, behind, cached[2] + 1 if cached else 0)
        return cached

    def signature(self, now: float) -> tuple:
        """What the view elections decide on amounts to for every replica, per broker (status, generation,
        clock): equal signatures, equal decisions for a replica whose own state did not change and whose
        partition is not in ``moved``."""
        return (self.clock.verdict.usable,
                *((name, self._status(name, ep, now)) for name, ep in sorted(self.gossip.state.endpoints.items())
                  if name != self.name))

    def moved(self) -> set[Key]:
        """The partitions whose entry in a peer's claims or behind-set changed since the last call: a
        decision about such a replica may change without the signature changing."""
        self.moving()
        moved, self._moved = self._moved, set()
        return moved

    def moving(self) -> bool:
        """Whether ``moved`` would give any partition."""
        for name, ep in self.gossip.state.endpoints.items():
            if name != self.name:
                self._leads(name, ep)
                self._behind(name, ep)
        return bool(self._moved)

    def next_change(self, now: float) -> float | None:
        """When a status seen now could next change without any message arriving (a silent peer's phi
        crossing suspicion or conviction)."""
        g = self.gossip
        return g.detector.next_crossing_s(now, (g.suspect_phi, g.convict_phi))

    def view(self, now: float, unreachable: frozenset[str] = frozenset()) -> View:
        return View(self, now, unreachable)


class View:
    """The cluster as gossip shows it at one moment, worked out once per step rather than once per
    replica (nothing changes within a step). With hundreds of partitions the per-replica phi and
    decode work was most of an idle broker's CPU."""

    def __init__(self, members: Members, now: float, unreachable: frozenset[str]) -> None:
        self._m = members
        self._now = now
        self._unreachable = unreachable  # brokers whose replication links to us closed a while ago
        self._alive: dict[str, bool] = {}
        self._up: dict[str, bool] = {}
        self._generation: dict[str | None, int | None] = {}
        self._behind: dict[str, set[Key]] = {}
        self._clock_usable: dict[str, bool] = {}
        self._claims: dict[str, dict[Key, int]] | None = None

    @staticmethod
    def _once(table: dict[Any, Any], name: Any, compute: Callable[[Any], Any]) -> Any:
        if name not in table:
            table[name] = compute(name)
        return table[name]

    def alive(self, name: str) -> bool:
        return self._once(self._alive, name, lambda n: self._m.alive(n, self._now))

    def up(self, name: str) -> bool:
        """Reported up and not stopping (a broker in controlled shutdown gossips "stopping"): a broker a
        partition may be handed to."""
        def up(n: str) -> bool:
            ep = self._m.gossip.state.endpoints.get(n)
            return n == self._m.name or (ep is not None and self._m.status(n, self._now) == "up"
                                         and not ep.extra.get("stopping"))
        return self._once(self._up, name, up)

    def generation(self, name: str | None) -> int | None:
        def gen(n: str | None) -> int | None:
            ep = self._m.endpoint(n) if n is not None else None
            return ep.generation if ep is not None else None
        return self._once(self._generation, name, gen)

    def behind(self, name: str) -> set[Key]:
        return self._once(self._behind, name, self._m.behind)

    def claims(self) -> dict[str, dict[Key, int]]:
        if self._claims is None:
            self._claims = self._m.claims()
        return self._claims

    def clock_usable(self, name: str) -> bool:
        return self._once(self._clock_usable, name, self._m.clock_usable)

    def reachable(self, name: str) -> bool:
        return name not in self._unreachable
