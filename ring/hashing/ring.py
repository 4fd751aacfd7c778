"""The broker ring: who owns which token range, and who replicates what.

A ``Ring`` is an immutable, sorted view of (token, broker) pairs, one token per
broker. A broker at token t owns the range (previous token, t], wrapping at
the top of the token space, so the owner of a token is the first broker
clockwise whose token is >= it. The preference list of a token is the first
RF distinct brokers clockwise from its owner: the first is the natural leader,
the rest are followers. Lookups are a bisect plus RF steps. Membership changes
build a new Ring (``with_broker`` / ``without_broker``) so readers never see a
half-updated ring. Names and tokens are unique: two brokers on one token would
make ownership depend on name order, so it is refused.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable

from ring.errors import Unavailable
from ring.hashing.murmur import is_token
from ring.hashing.tokens import partition_token


class Ring:
    """Immutable brokers-on-a-token-ring view, built from (name, token) pairs."""

    __slots__ = ("_tokens", "_names", "_token_by_name")

    def __init__(self, brokers: Iterable[tuple[str, int]] = ()) -> None:
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

    # --- lookups -------------------------------------------------------------

    def _owner_index(self, tok: int) -> int:
        if not is_token(tok):
            raise ValueError(f"not a signed 64-bit token: {tok!r}")
        index = bisect_left(self._tokens, tok)
        return 0 if index == len(self._tokens) else index

    def preference_list(self, token: int, rf: int) -> list[str]:
        """First ``rf`` distinct brokers clockwise from ``token``'s owner.

        ``rf`` is capped at the number of brokers; an empty ring gives [].
        """
        if not isinstance(rf, int) or rf < 1:
            raise ValueError(f"replication factor must be an int >= 1, got {rf!r}")
        count = len(self._names)
        if count == 0:
            return []
        start = self._owner_index(token)
        return [self._names[(start + step) % count] for step in range(min(rf, count))]

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

    # --- changes -------------------------------------------------------------

    def with_broker(self, name: str, token: int) -> Ring:
        """This ring plus one broker; ValueError on a duplicate name or token."""
        return Ring([*self._token_by_name.items(), (name, token)])

    def without_broker(self, name: str) -> Ring:
        """This ring minus broker ``name``; KeyError if it is not on the ring."""
        if name not in self._token_by_name:
            raise KeyError(name)
        return Ring(item for item in self._token_by_name.items() if item[0] != name)

    # --- value behaviour -----------------------------------------------------

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._token_by_name

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Ring):
            return NotImplemented
        return self._tokens == other._tokens and self._names == other._names

    def __hash__(self) -> int:
        return hash((self._tokens, self._names))

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}@{tok}" for tok, name in self.brokers)
        return f"Ring({inner})"


def partition_replicas(
    ring: Ring, topic: str, partition: int, partitions: int, rf: int, base: int | None = None
) -> list[str]:
    """Preference list of a partition; the first name is its natural leader."""
    return ring.preference_list(partition_token(topic, partition, partitions, base), rf)
