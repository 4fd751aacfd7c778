"""The node core's steps on membership: gossip rounds and exchanges, the wall clock, the catalogue, removals.

A part of ``NodeCore`` (``core.py``), kept in a module of its own: it uses
the core's ``members`` (``members.py``), its Ready under construction
(``_ready``), its replicas and its ``_view_moved`` (elections look again
when what they decide on changed).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import msgpack
import orjson

from ring.gossip import clocks
from ring.gossip.core import Ack, Ack2, Syn
from ring.node import ready as msg
from ring.node.members import Members
from ring.node.ready import Ready
from ring.replication.replica import Replica

STATE_FILE = "cluster-state.json"  # in the data directory: known brokers and the topic catalogue
REMOVED_FILE = "removed-brokers.json"  # in the data directory: the brokers this one removed
DECOMMISSIONED_FILE = "decommissioned-brokers.json"  # in the data directory: the brokers this one
# decommissioned, each with the incarnation of the data directory it ran on


class GossipSteps:
    members: Members
    _ready: Ready
    replicas: Callable[[], Iterable[Replica]]
    _view_moved: Callable[[float], None]
    load_extra: dict[str, Any]

    def _gossip_round(self, now: float) -> None:
        reps = list(self.replicas())
        load = {"disk_bytes": sum(r.log.size_bytes for r in reps),
                "partitions_led": sum(1 for r in reps if r.is_leader), "replicas": len(reps), **self.load_extra}
        m = self.members
        joined_before = m.joined
        self._gossip_out(m.tick(now, load))
        self._judge_clock(now)
        self._gossip_out(m.clocks_to_measure(now))
        m.check_joined(now)
        if m.stalled:
            self._view_moved(now)  # we were stopped: the detector forgave every silence
        if m.joined and not joined_before:
            self._gossip_out(m.announce(now))  # tell the others now, not in a round or two
            self._ready.reconcile = True
        for name in m.past_grace(now):
            self._remove(name)
        if m.ring_changed():
            self._ready.reconcile = True
        if m.dirty:
            m.dirty = False
            self._ready.add("write", (STATE_FILE, msgpack.packb(m.gossip.state.to_wire(), use_bin_type=True)))

    def _gossip_out(self, outs: Iterable[Any]) -> None:
        for out in outs:
            self._ready.add("sends", (out.to_addr, out.message))

    def _gossip_in(self, now: float, m: msg.GossipIn) -> None:
        if m.clock is not None and isinstance(m.message, Ack):  # the exchange measured the peer's clock
            self.members.clock.sample(m.message.sender, now, *m.clock)
        outs, reconcile, moved = self.members.on_message(now, m.addr, m.message)
        if isinstance(m.message, (Ack, Ack2)):
            # An ACK brings a measurement; an ACK2 (a peer's exchange) may make a peer live that no clock
            # was measured against: judged again before ``check_joined`` reads the judgement.
            if self._judge_clock(now) == clocks.UNKNOWN:
                self._gossip_out(self.members.clocks_to_measure(now))  # a joining broker needs the others too
            self.members.check_joined(now)
        if isinstance(m.message, Syn):
            self._ready.reply = outs[0].message if outs else None
        else:
            self._gossip_out(outs)
        if moved:
            self._view_moved(now)  # news of who is up or leads what
        self._ready.reconcile |= reconcile

    def _clock_read(self, now: float, m: msg.ClockRead) -> None:
        self._observe_clock(now, m.wall_ms)

    def _observe_clock(self, now: float, wall_ms: int) -> None:
        if self.members.clock.observe(now, wall_ms):
            self._judge_clock(now)

    def _judge_clock(self, now: float) -> str:
        """Judge this broker's clock; a verdict the broker must hear of goes in the Ready (and a change
        of what elections see is looked at)."""
        verdict = self.members.check_clock(now)
        if verdict is not None:
            self._ready.clock = verdict
            self._view_moved(now)
        return self.members.clock.verdict.state

    def _announce_msg(self, now: float, m: msg.Announce) -> None:
        self.members.publish(self.replicas())  # what we lead now goes along
        self._gossip_out(self.members.announce(now))

    def _put_topic(self, now: float, m: msg.PutTopic) -> None:
        self.members.gossip.put_topic(m.name, m.config, m.wall_ms)
        self.members.dirty = self._ready.reconcile = True

    def _delete_topic(self, now: float, m: msg.DeleteTopic) -> None:
        self.members.gossip.delete_topic(m.name, m.wall_ms)
        self.members.dirty = self._ready.reconcile = True

    def _remove_broker(self, now: float, m: msg.RemoveBroker) -> None:
        """A decommission: removed at its generation, and recorded with its data directory's incarnation,
        so a restart on the same directory does not bring it back."""
        self._remove(m.name)
        self._record(DECOMMISSIONED_FILE, "decommissioned", self.members.decommission(m.name))

    def _remove(self, name: str) -> None:
        self._record(REMOVED_FILE, "removed", self.members.remove(name))

    def _record(self, file: str, key: str, mine: dict[str, Any] | None) -> None:
        """Our removals or decommissions (``mine``, None: nothing new) are saved before they are gossiped
        (the Ready's write comes before its sends)."""
        if mine is None:
            return
        self._ready.add("write", (file, orjson.dumps(mine, option=orjson.OPT_SORT_KEYS)))
        self.members.set_extra(key, mine)
        if self.members.ring_changed():
            self._ready.reconcile = True
