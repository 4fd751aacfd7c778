"""Placement decisions from the gossiped state, as pure functions.

Every broker computes the same answers from the same membership: the ring
(every broker gossip knows that is not removed, by token, down ones
included: a down broker keeps its place and its partitions run on RF-1
replicas), each partition's preference list (RF capped at the ring size),
which partitions this broker holds, what the local catalogue must add or
drop to match the gossiped one, and when a starting broker has seen enough
of the cluster to take part in it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ring.catalog import TopicConfig
from ring.errors import BadRequest
from ring.gossip.state import EndpointState
from ring.hashing import Ring, partition_replicas

log = logging.getLogger("ring.cluster")

RING_STATUSES = ("joining", "normal", "leaving")


def placement_ring(endpoints: Iterable[EndpointState]) -> Ring:
    """The ring of every broker that is joining, normal or leaving, down or not.

    Two brokers claiming one token cannot both be placed: the one with the
    smaller name keeps it (every broker picks the same) and the clash is logged.
    """
    by_token: dict[int, str] = {}
    for ep in sorted(endpoints, key=lambda e: e.name):
        if ep.status not in RING_STATUSES:
            continue
        other = by_token.get(ep.token)
        if other is not None:
            log.error("brokers %s and %s claim token %d; %s is left off the ring", other, ep.name, ep.token, ep.name)
            continue
        by_token[ep.token] = ep.name
    return Ring((name, token) for token, name in by_token.items())


def preference_lists(ring: Ring, cfg: TopicConfig) -> list[list[str]]:
    """Replicas of every partition of a topic, the natural leader first."""
    if not len(ring):
        return [[] for _ in range(cfg.partitions)]
    return [partition_replicas(ring, cfg.name, p, cfg.partitions, cfg.replication_factor)
            for p in range(cfg.partitions)]


def held(ring: Ring, cfg: TopicConfig, name: str) -> dict[int, list[str]]:
    """Partition -> preference list, for the partitions broker ``name`` holds a replica of."""
    return {p: replicas for p, replicas in enumerate(preference_lists(ring, cfg)) if name in replicas}


@dataclass(frozen=True)
class CatalogChange:
    remove: list[str]  # topics to drop locally (deleted, or replaced by a new incarnation)
    add: list[TopicConfig]  # topics to open locally


def catalog_change(local: Mapping[str, TopicConfig], live: Mapping[str, dict[str, Any]]) -> CatalogChange:
    """What the local catalogue must do to match the gossiped live topics.

    A topic whose gossiped config has another ``created_ms`` is a new
    incarnation (deleted and created again while this broker was away): the
    old one's data goes. A config that does not validate is skipped and logged.
    """
    wanted: dict[str, TopicConfig] = {}
    for name, doc in live.items():
        try:
            cfg = TopicConfig.from_json({**doc, "name": name})
        except BadRequest as exc:
            log.error("ignoring gossiped topic %r: %s", name, exc.message)
            continue
        wanted[name] = cfg
    remove = sorted(n for n, cfg in local.items() if n not in wanted or wanted[n].created_ms != cfg.created_ms)
    add = [wanted[n] for n in sorted(wanted) if n not in local or n in remove]
    return CatalogChange(remove, add)


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
