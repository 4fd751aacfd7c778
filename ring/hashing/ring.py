"""The broker ring: who owns which token range, and who replicates what.

A ``Ring`` is an immutable, sorted view of (token, broker) pairs, one token per
broker. A broker at token t owns the range (previous token, t], wrapping at
the top of the token space, so the owner of a token is the first broker
clockwise whose token is >= it. Lookups are a bisect plus a walk. Membership
changes build a new Ring (``with_broker`` / ``without_broker``) so readers
never see a half-updated ring. Names and tokens are unique: two brokers on one
token would make ownership depend on name order, so it is refused.

Failure domains. Every broker sits on a host and optionally in a zone
(``Domain``; a broker given none is a host of its own). The preference list of
a token walks clockwise from its owner, as Cassandra's
NetworkTopologyStrategy walks racks, in up to three passes over the same
order: first brokers on a host not chosen yet and in a zone not chosen yet
(once every zone has a replica, any zone), then brokers on a host not chosen
yet, then anyone. So no host holds two replicas while at least RF hosts have
brokers, replicas sit in distinct zones while there are at least RF zones, the
owner is always the natural leader, and a ring whose brokers each have a host
of their own places exactly as a walk over the next RF brokers does. A broker
that no pass picks changes nothing, so a broker joining (or leaving) changes
only the preference lists it is in after (or was in before).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Mapping, NamedTuple

from ring.errors import Unavailable
from ring.hashing.murmur import is_token
from ring.hashing.tokens import partition_token


class Domain(NamedTuple):
    """Where a broker runs, for placement: its host and its zone (None: no zone)."""

    host: str
    zone: str | None = None


class Ring:
    """Immutable brokers-on-a-token-ring view, built from (name, token) pairs and each broker's
    ``Domain`` (a broker missing from ``domains`` is a host of its own, in no zone)."""

    __slots__ = ("_tokens", "_names", "_token_by_name", "_domains", "_hosts", "_zones", "_spread")

    def __init__(self, brokers: Iterable[tuple[str, int]] = (),
                 domains: Mapping[str, Domain] | None = None) -> None:
        token_by_name: dict[str, int] = {}
        name_by_token: dict[int, str] = {}
        for name, tok in brokers:
            if not isinstance(name, str) or not name:
                raise ValueError(f"broker name must be a non-empty str: {name!r}")
            if not is_token(tok):
                raise ValueError(f"token of {name!r} is not a signed 64-bit int: {tok!r}")
            if name in token_by_name:
                raise ValueError(f"broker {name!r} appears twice")
            if tok in name_by_token:
                raise ValueError(
                    f"brokers {name_by_token[tok]!r} and {name!r} share token {tok}"
                )
            token_by_name[name] = tok
            name_by_token[tok] = name
        ordered = sorted(name_by_token.items())
        self._tokens: tuple[int, ...] = tuple(tok for tok, _ in ordered)
        self._names: tuple[str, ...] = tuple(name for _, name in ordered)
        self._token_by_name = token_by_name
        domains = domains or {}
        self._domains: dict[str, Domain] = {n: domains[n] for n in self._names if n in domains}
        # Per broker in token order, its host and zone as small ints (a host of its own: its name).
        host_ids: dict[str, int] = {}
        zone_ids: dict[str | None, int] = {}
        hosts, zones = [], []
        for name in self._names:
            dom = self._domains.get(name)
            hosts.append(host_ids.setdefault(("h", dom.host) if dom else ("b", name), len(host_ids)))
            zones.append(zone_ids.setdefault(dom.zone if dom else None, len(zone_ids)))
        self._hosts: tuple[int, ...] = tuple(hosts)
        self._zones: tuple[int, ...] = tuple(zones)
        # Every broker on a host of its own, or all on one host, in one zone: every pass takes the next
        # brokers clockwise, so the plain walk gives the same lists.
        self._spread = 1 < len(host_ids) < len(self._names) or len(zone_ids) > 1

    # --- lookups -------------------------------------------------------------

    def _owner_index(self, tok: int) -> int:
        if not is_token(tok):
            raise ValueError(f"not a signed 64-bit token: {tok!r}")
        index = bisect_left(self._tokens, tok)
        return 0 if index == len(self._tokens) else index

    def preference_list(self, token: int, rf: int) -> list[str]:
        """``rf`` distinct brokers from ``token``'s owner clockwise, spread over hosts and zones (see the
        module's doc); the owner first.

        ``rf`` is capped at the number of brokers; an empty ring gives [].
        """
        if not isinstance(rf, int) or rf < 1:
            raise ValueError(f"replication factor must be an int >= 1, got {rf!r}")
        count = len(self._names)
        if count == 0:
            return []
        start = self._owner_index(token)
        want = min(rf, count)
        if not self._spread:
            return [self._names[(start + step) % count] for step in range(want)]
        return [self._names[i] for i in self._spread_walk(start, want)]

    def _spread_walk(self, start: int, want: int) -> list[int]:
        count = len(self._names)
        order = [(start + step) % count for step in range(count)]
        hosts, zones = self._hosts, self._zones
        zone_count = len(set(zones))
        chosen: list[int] = []
        taken: set[int] = set()
        hosts_used: set[int] = set()
        zones_used: set[int] = set()
        for relaxed in range(3):  # 0: new host and new zone; 1: new host; 2: anyone
            for i in order:
                if len(chosen) == want:
                    return chosen
                if i in taken:
                    continue
                if relaxed < 2 and hosts[i] in hosts_used:
                    continue
                if relaxed == 0 and zones[i] in zones_used and len(zones_used) < zone_count:
                    continue
                chosen.append(i)
                taken.add(i)
                hosts_used.add(hosts[i])
                zones_used.add(zones[i])
        return chosen

    def leader(self, token: int) -> str:
        """The broker owning ``token`` (natural leader of anything placed there)."""
        if not self._names:
            raise Unavailable("the ring has no brokers")
        return self._names[self._owner_index(token)]

    @property
    def brokers(self) -> list[tuple[int, str]]:
        """(token, name) pairs in token order."""
        return list(zip(self._tokens, self._names))

    def ranges(self) -> list[tuple[int, int, str]]:
        """(start_exclusive, end_inclusive, name) of every broker, in token order.

        The first range wraps (its start is the highest token). With a single
        broker the range is (t, t]: read as the whole ring.
        """
        return [
            (self._tokens[index - 1], self._tokens[index], self._names[index])
            for index in range(len(self._tokens))
        ]

    def token_of(self, name: str) -> int:
        """Token of broker ``name``; KeyError if it is not on the ring."""
        return self._token_by_name[name]

    def domain_of(self, name: str) -> Domain:
        """Host and zone of broker ``name`` as placement sees them; KeyError if it is not on the ring."""
        if name not in self._token_by_name:
            raise KeyError(name)
        return self._domains.get(name) or Domain(name)

    # --- changes -------------------------------------------------------------

    def with_broker(self, name: str, token: int, domain: Domain | None = None) -> Ring:
        """This ring plus one broker; ValueError on a duplicate name or token."""
        domains = dict(self._domains)
        if domain is not None:
            domains[name] = domain
        return Ring([*self._token_by_name.items(), (name, token)], domains)

    def without_broker(self, name: str) -> Ring:
        """This ring minus broker ``name``; KeyError if it is not on the ring."""
        if name not in self._token_by_name:
            raise KeyError(name)
        return Ring((item for item in self._token_by_name.items() if item[0] != name), self._domains)

    # --- value behaviour -----------------------------------------------------

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._token_by_name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return self._tokens == other._tokens and self._names == other._names and self._domains == other._domains

    def __hash__(self) -> int:
        return hash((self._tokens, self._names))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}@{tok}" + (f"[{self._domains[name].host}/{self._domains[name].zone}]"
                                              if name in self._domains else "") for tok, name in self.brokers)
        return f"Ring({inner})"


def partition_replicas(
    ring: Ring, topic: str, partition: int, partitions: int, rf: int, base: int | None = None
) -> list[str]:
    """Preference list of a partition; the first name is its natural leader."""
    return ring.preference_list(partition_token(topic, partition, partitions, base), rf)
