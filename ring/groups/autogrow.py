"""When a topic whose partition count is ``auto`` should grow, from the groups that read it.

A group with more members subscribed to a topic than the topic has
partitions leaves members idle. ``AutoGrowth`` watches that demand per topic
(the largest such group) and, once it has lasted ``grace_ms`` without a break,
answers the partition count to grow to: one partition per member of that
group, never more than ``TOPIC_PARTITIONS_MAX``, never fewer than the topic
has. The grace keeps a rolling restart (members leaving and joining again)
from growing anything. Pure: the coordinator's timer passes the demand, the
partition counts and ``now_ms``, and carries out the answer.

Growing moves keys as little as jump hashing allows: from P to P+1
partitions about 1/(P+1) of the keys move, all of them to the new partition,
and none moves between old partitions.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from ring import limits


def demand(groups: Iterable[Iterable[Iterable[str]]]) -> dict[str, int]:
    """Topic -> the most members one group has subscribed to it (each group given as its members' topics)."""
    out: dict[str, int] = {}
    for members in groups:
        counts: dict[str, int] = {}
        for topics in members:
            for t in set(topics):
                counts[t] = counts.get(t, 0) + 1
        for t, n in counts.items():
            out[t] = max(out.get(t, 0), n)
    return out


class AutoGrowth:
    def __init__(self, grace_ms: int = limits.AUTO_PARTITIONS_GRACE_MS) -> None:
        self.grace_ms = grace_ms
        self._since: dict[str, int] = {}  # topic -> when its demand first exceeded its partitions

    def observe(self, wanted: Mapping[str, int], partitions: Mapping[str, int], auto: Iterable[str],
                now_ms: int) -> dict[str, int]:
        """Topic -> the partition count to grow it to now (only ``auto`` topics, after the grace)."""
        grow: dict[str, int] = {}
        auto_set = set(auto)
        for t in list(self._since):
            if t not in auto_set:
                del self._since[t]
        for t in sorted(auto_set):
            have, want = partitions.get(t, 0), min(wanted.get(t, 0), limits.TOPIC_PARTITIONS_MAX)
            if have < 1 or want <= have:
                self._since.pop(t, None)
                continue
            since = self._since.setdefault(t, now_ms)
            if now_ms - since >= self.grace_ms:
                grow[t] = want
                del self._since[t]
        return grow
