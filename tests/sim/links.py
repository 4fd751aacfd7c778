"""A simulated broker's replication links, as ``ring.cluster.leader`` and ``follower`` run them.

The leader's end (``out``): one ordered link per follower the node core
wants (``Ready.links``), connected over the simulated network, noticed
broken at once when the follower crashed and after the heartbeat's time
when it went dark or was cut, and connected again with backoff. The
follower's end (``accepted``): the leader's connection it takes frames on,
closed when the leader closes it, dies or goes dark; its answers wait for
the fsync their Ready asked for, in order. Every decision about what to send
and what a frame means is the node core's (``LinkUp``, ``LinkDown``,
``LeaderLink``, ``FromLeader``, ``FromFollower``, ``Flush``); this is only
the wire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ring import limits
from ring.node import ready as m
from ring.replication import protocol
from ring.replication.replica import Replica
from tests.sim.network import LINK_TIMEOUT_S

if TYPE_CHECKING:
    from tests.sim.broker import SimBroker

LINK_CHECK_S = 0.25  # how often a leader looks at its links (a crashed follower's link breaks at once)


class Link:
    """The leader's end of one replication link."""

    def __init__(self) -> None:
        self.conn: int | None = None  # connected on this connection number
        self.broken_at: float | None = None
        self.retry_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
        self.next_try = 0.0


class Links:
    """One incarnation's links (a restart makes new ones)."""

    def __init__(self, broker: SimBroker) -> None:
        self.b = broker
        self.out: dict[str, Link] = {}  # follower -> the link to it
        self.accepted: dict[str, int] = {}  # leader -> the connection of its link we accept
        self.inbound_dark: dict[str, float] = {}  # leader -> since when its link has carried nothing
        # Answers to a leader's link waiting for the fsync their Ready asked for: (replica, fsync number).
        self.answers: dict[tuple[str, int], list[tuple[tuple[Replica, int] | None, Any]]] = {}
        self.flushing: set[str] = set()

    def answer(self, to: tuple[str, int], persisted: tuple[Replica, int] | None, frame: Any) -> None:
        """Send ``frame`` on the follower's end of link ``to`` once ``persisted`` (an fsync) is done."""
        self.answers.setdefault(to, []).append((persisted, frame))

    def flush_soon(self, names: set[str]) -> None:
        gen = self.b.generation
        for name in sorted(names):
            if name not in self.flushing:
                self.flushing.add(name)
                self.b.world.after(0, lambda name=name: self._flush(gen, name))

    def flush_all_answers(self) -> None:
        for key in list(self.answers):
            self.flush_answers(key)

    # --- replication links: the leader's end ---------------------------------------------------

    def relink(self, wanted: set[str]) -> None:
        for name in list(self.out):
            if name not in wanted:
                del self.out[name]
        for name in sorted(wanted):
            if name not in self.out:
                self.out[name] = Link()
                self._connect(name)

    def _connect(self, name: str) -> None:
        link = self.out.get(name)
        if link is None or link.conn is not None or self.b.world.now < link.next_try:
            return
        if not self.b.net.connectable(self.b.name, name):
            link.next_try = self.b.world.now + link.retry_s
            link.retry_s = min(link.retry_s * 2, limits.REPLICATION_RECONNECT_MS_MAX / 1000)
            return
        link.conn, link.broken_at = self.b.world.rng.randrange(1 << 40), None
        link.retry_s = limits.REPLICATION_RECONNECT_MS_MIN / 1000
        self.b.net.nodes[name].wire.accept(self.b.name, link.conn)  # the handshake: only while it runs and is reachable
        self.b.world.log(f"{self.b.name} connects to {name} ({link.conn})")
        self.b.step(m.LinkUp(name))

    def check(self, gen: int) -> None:
        """Notice broken links (at once for a crashed follower, after the heartbeat's time otherwise),
        and connect again."""
        if not self.b.live(gen):
            return
        self.b.world.after(LINK_CHECK_S, lambda: self.check(gen))
        if self.b.paused:
            return
        now = self.b.world.now
        self._check_inbound(now)
        for name, link in list(self.out.items()):
            if link.conn is not None:
                peer = self.b.net.nodes[name]
                dead = not peer.running or peer.wire.accepted.get(self.b.name) != link.conn
                if link.broken_at is None and (dead or self.b.net.broken(self.b.name, name, link.conn)
                                               or not self.b.net.connectable(self.b.name, name)):
                    link.broken_at = now
                if link.broken_at is not None and (dead or now - link.broken_at >= LINK_TIMEOUT_S):
                    self.b.net.break_link(self.b.name, name, link.conn)
                    link.conn = None
                    link.next_try = now + link.retry_s
                    self.b.step(m.LinkDown(name))
            if link.conn is None:
                self._connect(name)

    def accept(self, leader: str, conn: int) -> None:
        """A leader's replication link opens (on our peer port); one it had closes."""
        if leader in self.accepted:
            self._close_inbound(leader)
        self.accepted[leader] = conn
        self.inbound_dark.pop(leader, None)
        self.b.step(m.LeaderLink(leader, True))

    def _close_inbound(self, leader: str, retired: bool = False) -> None:
        self.accepted.pop(leader, None)
        self.inbound_dark.pop(leader, None)
        self.b.step(m.LeaderLink(leader, False, retired))

    def _check_inbound(self, now: float) -> None:
        """The leaders' links into this broker: closed at once when the leader closed it or died (a reset),
        after the heartbeat's time when it went dark (the leader stopped, or a cut). A link its running
        leader no longer wants closes as retired (``protocol.LINK_RETIRED``) when its close can get here."""
        for leader, conn in list(self.accepted.items()):
            peer = self.b.net.nodes[leader]
            link = peer.wire.out.get(self.b.name) if peer.running else None
            dark = (peer.paused or self.b.net.broken(leader, self.b.name, conn)
                    or not self.b.net.connectable(leader, self.b.name))
            if link is None and peer.running and not dark:
                self._close_inbound(leader, retired=True)
            elif not peer.running or (link is not None and link.conn != conn):
                self._close_inbound(leader)
            elif dark:
                if now - self.inbound_dark.setdefault(leader, now) >= LINK_TIMEOUT_S:
                    self._close_inbound(leader)
            else:
                self.inbound_dark.pop(leader, None)

    def send_frame(self, name: str, frame: Any) -> None:
        link = self.out.get(name)
        if link is not None and link.conn is not None:
            if not self.b.net.send_frame(self.b.name, name, link.conn, frame) and link.broken_at is None:
                link.broken_at = self.b.world.now

    def _flush(self, gen: int, name: str) -> None:
        if self.b.live(gen):
            self.flushing.discard(name)
            self.b.step(m.Flush(name), gen)

    # --- replication links: the follower's end --------------------------------------------------

    def receive_frame(self, src: str, conn: int, frame: Any) -> None:
        if not self.b.running:
            self.b.net.break_link(src, self.b.name, conn)
            return
        if self.b.paused:
            self.b.inbox.append((src, ("frame", src, conn, frame)))
            return
        if isinstance(frame, (protocol.FollowerAck, protocol.Reject)):
            link = self.out.get(src)
            if link is not None and link.conn == conn:
                self.b.step(m.FromFollower(src, frame))
            return
        if self.accepted.get(src) != conn:  # a connection of another incarnation, or superseded
            self.b.net.break_link(src, self.b.name, conn)
            return
        self.b.carry_out(self.b.core_step(m.FromLeader(src, frame)), answer_to=(src, conn))

    def flush_answers(self, key: tuple[str, int]) -> None:
        """Send the answers whose fsync is done, in order (as the follower's writer does: each waits for the
        fsync its Ready asked for to finish, not for the log to be durable to some end, which a repair's cut
        may have taken back meanwhile)."""
        queue = self.answers.get(key, [])
        src, conn = key
        while queue:
            persisted, frame = queue[0]
            if persisted is not None:
                rep, number = persisted
                if rep.deleted or self.b.replica(rep.topic, rep.index) is not rep:
                    self.b.net.break_link(src, self.b.name, conn)  # the fsync it waited for will never come
                    queue.clear()
                    break
                if not self.b.disk.synced(rep, number):
                    return
            queue.pop(0)
            self.b.net.send_frame(self.b.name, src, conn, frame)
        self.answers.pop(key, None)
