"""The node core's answers on where a produce goes and whether this broker may take it now.

A part of ``NodeCore`` (``core.py``), kept in a module of its own: it reads
the core's view of the members (``view``), its replication links
(``links``) and who leads what (``leader_of``); it changes no state but the
cached view, so the routing and admission of a produce never step the core.
"""

from __future__ import annotations

from typing import Callable

from ring import limits
from ring.errors import NotEnoughReplicas, NotLeader
from ring.node.links import Links
from ring.node.members import View
from ring.replication import election, protocol
from ring.replication.replica import Replica

ADMIT_VIEW_S = 0.001  # (see admit): nothing gossip hears within it changes who is alive
LINK_LOSS_GRACE_S = limits.LINK_LOSS_GRACE_MS / 1000


class RouteSteps:
    name: str
    links: Links
    _now: float
    _view: View | None
    view: Callable[[], View]
    leader_of: Callable[[str, int], str | None]

    def route(self, now: float, topic: str, partition: int, voters: list[str], level: str,
              hint: str | None = None) -> str | None:
        """Where a produce for the partition goes now: this broker, or a live leader it can reach
        (``hint``, else the leader it knows); None while an election may be running. NotEnoughReplicas
        when fewer than a majority of ``voters`` is alive and reachable: no election can win, so
        waiting is pointless."""
        self._now, self._view = now, None
        leader = hint or self.leader_of(topic, partition)
        if leader == self.name:
            return leader
        view = self.view()
        if leader is not None and view.alive(leader) and view.reachable(leader):
            return leader
        alive = sum(1 for v in voters if view.alive(v) and view.reachable(v))
        needed = election.majority(max(1, len(voters)))
        if alive < needed:
            raise NotEnoughReplicas(
                f"{topic}/{partition} has no live leader and {alive} of {len(voters)} replicas are alive; "
                f"electing one needs {needed}", topic=topic, partition=partition, alive=alive, needed=needed,
                replication_factor=len(voters), consistency=level)
        return None

    def reachable(self, now: float, name: str) -> bool:
        """Whether ``name`` is alive and its replication links to and from us are not closed past the grace."""
        self._now, self._view = now, None
        view = self.view()
        return view.alive(name) and view.reachable(name)

    def admit(self, now: float, rep: Replica | None, topic: str, partition: int, level: str) -> int | None:
        """The acknowledgements a produce at ``level`` needs from this leader; None while it hands the
        partition over (wait for the hand-off to end, then ask again). NotLeader, naming the leader,
        when it does not lead; NotEnoughReplicas when too few voters are alive for the level.

        Produces come many to a loop turn: the view of the last admit serves the next within
        ADMIT_VIEW_S when no step came between (a step starts a new one), not a phi per voter each."""
        if self._view is None or not 0 <= now - self._now <= ADMIT_VIEW_S:
            self._now, self._view = now, None
        if rep is not None and rep.is_leader and rep.frozen and not rep.deleted:
            return None
        self.check_leading(rep, topic, partition)
        assert rep is not None
        view = self.view()
        alive = sum(1 for v in rep.voters if view.alive(v) and self._reaches(v, now))
        return protocol.check_alive(topic, partition, alive, rep.rf, level)

    def _reaches(self, name: str, now: float) -> bool:
        """Whether this leader's replication link to ``name`` is up (or not closed for long)."""
        if name == self.name:
            return True
        link = self.links.link(name)
        return link is None or link.reaches(now, LINK_LOSS_GRACE_S)

    def check_leading(self, rep: Replica | None, topic: str, partition: int) -> None:
        """NotLeader unless ``rep`` leads and may be appended to now (not handing over, not closed)."""
        if rep is None or not rep.is_leader or rep.frozen or rep.deleted:
            hint = self.leader_of(topic, partition)
            raise NotLeader(f"{self.name} does not lead {topic}/{partition} now (leader: {hint}); retry",
                            topic=topic, partition=partition, leader=hint if hint != self.name else None)
