"""Which member of a consumer group reads which partition: an even spread that moves as little as it can.

``assign`` is a pure function of the members (each with the topics it
subscribes to), the partition count of each topic and the previous
assignment. It works in three steps:

1. keep: every partition stays with its previous owner while that owner is
   still a member, still subscribes to the topic and the partition still
   exists (a partition two members claim stays with the smaller name);
2. place: every partition without an owner goes to the eligible member (one
   that subscribes to its topic) holding the fewest partitions, ties to the
   smaller name;
3. balance: while some member holds two or more partitions more than another
   member that could take one of them, the last such partition moves. Each
   move lowers the sum of squared loads, so the loop ends; it is bounded
   anyway.

When every member subscribes to the same topics the loads then differ by at
most one, and a rebalance moves only the partitions it must: a member that
joins takes its share from the most loaded members, a member that leaves
hands on only its own partitions. Members beyond the number of partitions get
none. Same inputs, same output, on every broker.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

TopicPartition = tuple[str, int]


def assign(members: Mapping[str, Sequence[str]], partitions: Mapping[str, int],
           previous: Mapping[str, Iterable[TopicPartition]]) -> dict[str, list[TopicPartition]]:
    """Member -> sorted partitions it reads. ``members``: member -> subscribed topics;
    ``partitions``: topic -> partition count (a topic missing or at 0 has none yet);
    ``previous``: the assignment before this rebalance (any members, any partitions)."""
    subscribed = {m: frozenset(ts) for m, ts in members.items()}
    wanted = sorted((t, p) for t in set().union(*subscribed.values()) if t in partitions
                    for p in range(partitions[t]))
    owners: dict[TopicPartition, str] = {}
    held: dict[str, set[TopicPartition]] = {m: set() for m in members}
    wanted_set = set(wanted)
    for m in sorted(previous):
        if m not in held:
            continue
        for tp in sorted(previous[m]):
            if tp in wanted_set and tp[0] in subscribed[m] and tp not in owners:
                owners[tp] = m
                held[m].add(tp)
    for tp in wanted:
        if tp in owners:
            continue
        eligible = [m for m in held if tp[0] in subscribed[m]]
        if not eligible:
            continue  # cannot happen: tp's topic is one somebody subscribes to
        m = min(eligible, key=lambda e: (len(held[e]), e))
        owners[tp] = m
        held[m].add(tp)
    _balance(held, subscribed, bound=len(wanted) * max(1, len(members)) + 1)
    return {m: sorted(tps) for m, tps in held.items()}


def _balance(held: dict[str, set[TopicPartition]], subscribed: Mapping[str, frozenset[str]], bound: int) -> None:
    """Move partitions from loaded members to light ones until no move evens things out."""
    for _ in range(bound):
        move = _best_move(held, subscribed)
        if move is None:
            return
        src, dst, tp = move
        held[src].remove(tp)
        held[dst].add(tp)
    raise AssertionError("balancing did not settle within its bound")


def _best_move(held: Mapping[str, set[TopicPartition]],
               subscribed: Mapping[str, frozenset[str]]) -> tuple[str, str, TopicPartition] | None:
    """The move from the most loaded member to the least loaded one that can take a partition of it."""
    by_load_desc = sorted(held, key=lambda m: (-len(held[m]), m))
    by_load_asc = sorted(held, key=lambda m: (len(held[m]), m))
    for src in by_load_desc:
        for dst in by_load_asc:
            if len(held[src]) - len(held[dst]) < 2:
                break
            movable = sorted(tp for tp in held[src] if tp[0] in subscribed[dst])
            if movable:
                return src, dst, movable[-1]
    return None


def moved(before: Mapping[str, Iterable[TopicPartition]], after: Mapping[str, Iterable[TopicPartition]]) -> int:
    """Partitions whose owner differs between two assignments (new or gone ones count too)."""
    a = {tp: m for m, tps in before.items() for tp in tps}
    b = {tp: m for m, tps in after.items() for tp in tps}
    return sum(1 for tp in set(a) | set(b) if a.get(tp) != b.get(tp))
