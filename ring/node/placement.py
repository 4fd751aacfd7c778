"""Placement decisions from the gossiped state, as pure functions.

Every broker computes the same answers from the same membership: the ring
(every broker gossip knows that is not removed, by token, down ones
included: a down broker keeps its place and its partitions run on RF-1
replicas), each partition's preference list (RF capped at the ring size),
which partitions this broker holds, what the local catalogue must add or
drop to match the gossiped one, and when a starting broker has seen enough
of the cluster to take part in it.

Membership changes: a broker is taken off the ring when it is decommissioned
or has been down longer than the grace period (``removed_brokers``,
``past_grace``). A partition's voter set (the replicas that count for
quorum, the high watermark and elections) then moves toward the new
preference list one member at a time (``next_voters``): a new replica joins
once it holds everything committed, and only then does a replica that is no
longer placed leave, so any two consecutive voter sets share a majority.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from ring.catalog import TopicConfig
from ring.errors import BadRequest
from ring.gossip.state import EndpointState
from ring.hashing import Domain, Ring, partition_replicas

log = logging.getLogger("ring.cluster")

RING_STATUSES = ("joining", "normal", "leaving")


def domain(ep: EndpointState) -> Domain | None:
    """The host and zone a broker gossips (``extra``: "host", "zone"); None from a broker that gossips
    no host (it is placed as a host of its own)."""
    host, zone = ep.extra.get("host"), ep.extra.get("zone")
    if type(host) is not str or not host:
        return None
    return Domain(host, zone if type(zone) is str and zone else None)


def placement_ring(endpoints: Iterable[EndpointState], removed: Iterable[str] = ()) -> Ring:
    """The ring of every broker that is joining, normal or leaving, down or not, and not removed, each on
    the host and in the zone it gossips.

    Two brokers claiming one token cannot both be placed: the one with the
    smaller name keeps it (every broker picks the same) and the clash is logged.
    """
    by_token: dict[int, str] = {}
    domains: dict[str, Domain] = {}
    gone = set(removed)
    for ep in sorted(endpoints, key=lambda e: e.name):
        if ep.status not in RING_STATUSES or ep.name in gone:
            continue
        other = by_token.get(ep.token)
        if other is not None:
            log.error("brokers %s and %s claim token %d; %s is left off the ring", other, ep.name, ep.token, ep.name)
            continue
        by_token[ep.token] = ep.name
        dom = domain(ep)
        if dom is not None:
            domains[ep.name] = dom
    return Ring(((name, token) for token, name in by_token.items()), domains)


def preference_lists(ring: Ring, cfg: TopicConfig) -> list[list[str]]:
    """Replicas of every partition of a topic, the natural leader first."""
    return [preference_list(ring, cfg, p) for p in range(cfg.partitions)]


def preference_list(ring: Ring, cfg: TopicConfig, p: int) -> list[str]:
    """Replicas of partition ``p`` of a topic, the natural leader first."""
    if not len(ring):
        return []
    return partition_replicas(ring, cfg.name, p, cfg.partitions, cfg.replication_factor, cfg.base_partitions)


def held(ring: Ring, cfg: TopicConfig, name: str) -> dict[int, list[str]]:
    """Partition -> preference list, for the partitions broker ``name`` holds a replica of."""
    return {p: replicas for p, replicas in enumerate(preference_lists(ring, cfg)) if name in replicas}


def held_here(ring: Ring, cfg: TopicConfig, name: str, kept: Iterable[int]) -> dict[int, list[str]]:
    """What broker ``name`` holds of ``cfg``: the partitions placed on it, plus those placed elsewhere
    it keeps open (it leads them and hands them over first, or still votes for them)."""
    lists = preference_lists(ring, cfg)
    out = {p: replicas for p, replicas in enumerate(lists) if name in replicas}
    for p in kept:
        if p not in out and p < len(lists):
            out[p] = lists[p]
    return out


@dataclass(frozen=True)
class Replacement:
    close: list[int]  # open here, no longer held: close (the data stays)
    moved: dict[int, list[str]]  # open here with a new preference list
    open: dict[int, list[str]]  # held, not open yet


def replacement(held: Mapping[int, list[str]], open_: Mapping[int, Sequence[str]]) -> Replacement:
    """What the open partitions of a topic must do to match what is held (``open_``: partition ->
    its preference list as the open replica knows it)."""
    close = [p for p in open_ if p not in held]
    moved = {p: list(held[p]) for p, replicas in open_.items() if p in held and list(replicas) != held[p]}
    new = {p: list(r) for p, r in held.items() if p not in open_}
    return Replacement(close, moved, new)


@dataclass(frozen=True)
class CatalogChange:
    remove: list[str]  # topics to drop locally (deleted, or replaced by a new incarnation)
    add: list[TopicConfig]  # topics to open locally
    update: list[TopicConfig]  # topics kept whose settings changed (more partitions, retention ...)
    regrow: list[TopicConfig]  # of those, the ones gossip shrank: the local count is kept and written back


def catalog_change(local: Mapping[str, TopicConfig], live: Mapping[str, dict[str, Any]]) -> CatalogChange:
    """What the local catalogue must do to match the gossiped live topics.

    A topic whose gossiped config has another ``id`` is a new
    incarnation (deleted and created again while this broker was away): the
    old one's data goes. A config that does not validate (a buggy or newer
    peer) is skipped and logged, and the local topic of that name is kept as
    it is: only a valid config or a tombstone can remove data.

    The same incarnation with other settings is an update. Partition counts
    only grow: two changes made at once on two brokers (one growing the
    topic, one changing its retention) are settled by last writer wins, which
    could hand back the smaller count; the update then keeps the larger one
    and ``regrow`` says to gossip it again, so every broker ends up with it.
    """
    wanted: dict[str, TopicConfig] = {}
    unreadable: set[str] = set()
    for name, doc in live.items():
        try:
            cfg = TopicConfig.from_json({**doc, "name": name})
        except BadRequest as exc:
            log.error("ignoring gossiped topic %r: %s", name, exc.message)
            unreadable.add(name)  # says nothing about the topic: never a reason to drop its data
            continue
        wanted[name] = cfg
    remove = sorted(n for n, cfg in local.items() if n not in unreadable
                    and (n not in wanted or wanted[n].id != cfg.id))
    add = [wanted[n] for n in sorted(wanted) if n not in local or n in remove]
    update: list[TopicConfig] = []
    regrow: list[TopicConfig] = []
    for n in sorted(set(wanted) & set(local)):
        new, old = wanted[n], local[n]
        if n in remove or new == old:
            continue
        if new.partitions < old.partitions:
            new = replace(new, partitions=old.partitions, base_partitions=old.base_partitions)
            regrow.append(new)
        if new != old:
            update.append(new)
    return CatalogChange(remove, add, update, regrow)


def joined(has_other_seeds: bool, exchanged: bool, seeds_known: bool, since_first_exchange_s: float,
           settle_s: float) -> bool:
    """Whether a starting broker knows the cluster well enough to place partitions.

    A broker with no seeds but itself is a cluster of one (or the first of
    many): it has joined at once. Otherwise it needs one successful exchange
    (which brings the whole state a peer knows) and then either every seed
    known as a broker, or ``settle_s`` more seconds for an unreachable seed.
    """
    if not has_other_seeds:
        return True
    if not exchanged:
        return False
    return seeds_known or since_first_exchange_s >= settle_s


# -- membership changes ----------------------------------------------------------------


def removed_brokers(endpoints: Iterable[EndpointState], removals: Iterable[Mapping[str, int]],
                    decommissions: Iterable[Mapping[str, str]] = ()) -> set[str]:
    """Brokers taken off the ring: named with their current generation (or a later one) in any
    broker's gossiped ``removed`` map, or decommissioned on the data directory they run on (its
    incarnation, in any broker's gossiped ``decommissioned`` map). A broker removed for being down past
    the grace period that starts again has a newer generation and joins again; a decommissioned one
    joins again only on a new data directory (as a new broker)."""
    by_name = {ep.name: ep for ep in endpoints}
    out: set[str] = set()
    for removal in removals:
        for name, generation in removal.items():
            ep = by_name.get(name)
            if ep is not None and generation >= ep.generation:
                out.add(name)
    for decommission in decommissions:
        for name, incarnation in decommission.items():
            ep = by_name.get(name)
            if ep is not None and ep.extra.get("incarnation") == incarnation:
                out.add(name)
    return out


def past_grace(down_since_s: Mapping[str, float], now_s: float, grace_s: float) -> list[str]:
    """Brokers continuously down for at least ``grace_s``."""
    return sorted(n for n, since in down_since_s.items() if now_s - since >= grace_s)


def next_voters(voters: Sequence[str], replicas: Sequence[str], leader: str,
                filled: Callable[[str], bool]) -> list[str]:
    """One step of a partition's voter set toward its preference list (the same list when done).

    First a placed replica that is not a voter yet joins, once ``filled``
    (it holds everything committed); only when none is waiting does one voter
    that is no longer placed leave (never the leader: it hands the partition
    over first). One change per step keeps a majority of the old set inside
    every majority of the new one.
    """
    current = [v for v in voters]
    waiting = [r for r in replicas if r not in current]
    for r in waiting:
        if filled(r):
            return _ordered(current + [r], replicas)
    if not waiting:
        for v in current:
            if v not in replicas and v != leader:
                return _ordered([x for x in current if x != v], replicas)
    return _ordered(current, replicas)


def _ordered(voters: Iterable[str], replicas: Sequence[str]) -> list[str]:
    vs = set(voters)
    return [r for r in replicas if r in vs] + sorted(vs - set(replicas))
