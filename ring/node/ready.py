"""What goes into the node core (messages) and what comes out (``Ready``).

A driver hands the core one message at a time with ``NodeCore.step(now,
message)``, and ticks it with ``NodeCore.tick(now)``; both return a
``Ready``. The driver carries a Ready out through ``ring.node.executor``
(the one executor, which asserts the order), in this order:

1. Already done inside the step, before it returned: log appends and cuts
   (the log's own synchronous writes), and the replica state a cut or a new
   epoch's start in the log depends on (a repair's vouched key, a winner's
   record of its voters: saved before the log changes).
2. ``write``: replace each named file with the bytes given (atomically,
   with an fsync; a name is relative to the data directory, or absolute):
   membership's saved state, the brokers this one removed (a removal is
   saved before it is gossiped), and each replica state file the step
   changed (ballots, epochs, voter sets: ``ring.replication.state``),
   written once per step, before any vote, frame or answer that depends on
   them leaves.
3. ``persist``: make each listed log durable up to at least the given end
   (an fsync under ``--fsync always``; nothing to do under the other
   policies, which the core knows and never lists). Step ``Durable`` (or
   ``SyncFailed``) when it is done.
4. ``sends``: send each message, in list order per destination, and only
   once every ``persist`` of the same Ready is done: a follower's
   acknowledgement sits in the Ready that lists the fsync it depends on.
   Messages to one destination are never reordered across Readies either.
   Vote requests to one peer may travel together (``VoteRequested`` takes
   several, ``VoteAnswered`` gives their answers back together).
   Gossip messages are addressed to a peer address, the rest to a broker.
5. ``releases``: answer the waiting produces (a token and None for success,
   or the error to raise), also after ``persist``.
6. The rest, in any order: ``reply`` is the answer to the request that was
   stepped (votes, a transfer, a gossip SYN's ACK); ``reconcile``: place
   partitions anew (the ring or the topic catalogue changed, or a replica
   placed elsewhere is no longer led here); ``changed`` lists replicas whose
   leadership changed (wake what waits for a leader); ``clock``: the new
   verdict on this broker's wall clock (``ring.gossip.clocks``: it may stamp
   records and apply retention by age only while usable); ``announce``: tell
   every live peer this broker's claims now (it won an election);
   ``damaged`` lists stored batches that failed a check (repair them);
   ``links`` is the set of followers the leader's links must reach, when it
   changed; ``after_idle``: step each message once no fsync runs on the
   replica's log (its start moves: files go); ``flush``: the followers whose
   links have something to send, so step ``Flush`` for each once before the
   event loop's next turn (appends made in one turn then leave in one
   frame); ``next_tick_at``: tick again then at the latest.
"""

from __future__ import annotations

from typing import Any, Hashable, NamedTuple

from ring.replication.replica import Replica

Token = Hashable  # an answer waiting for acknowledgements: the driver's own handle (a future, a request id)


class Ready:
    """See the module's docstring. A field nothing was put in is the class's empty default, so a
    step that does little costs little (most steps of a produce put one thing in)."""

    write: list[tuple[str, bytes]] | tuple[()] = ()
    persist: list[tuple[Replica, int]] | tuple[()] = ()
    sends: list[tuple[str, Any]] | tuple[()] = ()
    releases: list[tuple[Token, BaseException | None]] | tuple[()] = ()
    reply: Any = None
    changed: list[Replica] | tuple[()] = ()
    damaged: list[tuple[Replica, int]] | tuple[()] = ()
    links: set[str] | None = None
    after_idle: list[tuple[Replica, Any]] | tuple[()] = ()
    flush: set[str] | frozenset[str] = frozenset()
    announce = False
    reconcile = False
    clock: Any = None
    next_tick_at: float | None = None

    def add(self, field: str, item: Any) -> None:
        """Append ``item`` to the list field ``field``."""
        items = self.__dict__.get(field)
        if items is None:
            setattr(self, field, [item])
        else:
            items.append(item)

    def __bool__(self) -> bool:
        return bool(self.write or self.persist or self.sends or self.releases or self.changed or self.damaged
                    or self.links is not None or self.after_idle or self.flush or self.announce or self.reconcile)

    def __repr__(self) -> str:
        return (f"Ready(persist={self.persist}, sends={self.sends}, releases={self.releases}, reply={self.reply}, "
                f"changed={self.changed}, links={self.links}, flush={self.flush}, next={self.next_tick_at})")


# --- the leader's side of replication ----------------------------------------------------


class Appended(NamedTuple):
    """New batches were appended to ``rep``, which this broker leads; ``durable``: its offsets below it are
    durable now (a policy that needs no fsync for them), else None (an fsync makes them so: ``Durable``)."""
    rep: Replica
    durable: int | None = None


class AwaitAcks(NamedTuple):
    """Release ``token`` once the consistency ``level``'s number of the voters (as the set is then) durably
    hold offsets below ``end`` (or fail it after ``timeout_s``, or when this broker stops leading)."""
    token: Token
    rep: Replica
    end: int
    level: str
    timeout_s: float


class AwaitStart(NamedTuple):
    """Release ``token`` once a majority of ``rep``'s voters (this leader counted) hold a log start of at
    least ``start`` (or fail it after ``timeout_s``, or when this broker stops leading): a truncate."""
    token: Token
    rep: Replica
    start: int
    timeout_s: float


class Durable(NamedTuple):
    """Offsets of ``rep`` below ``end`` are durable here (an fsync finished, or the policy needs none)."""
    rep: Replica
    end: int


class SyncFailed(NamedTuple):
    """An fsync of ``rep`` failed: what it covered may be gone."""
    rep: Replica


class LinkUp(NamedTuple):
    """The replication link to ``follower`` is connected (again)."""
    follower: str


class LinkDown(NamedTuple):
    follower: str


class FromFollower(NamedTuple):
    """A follower's answer (ack or reject) on its link."""
    follower: str
    frame: Any


class Flush(NamedTuple):
    """Send what ``follower``'s link has ready (all links: None), once per event-loop turn when a Ready
    named it in ``flush``."""
    follower: str | None = None


class PlacementChanged(NamedTuple):
    """Replicas were opened, closed or placed anew: the links follow."""


class StartMoved(NamedTuple):
    """The leader moved ``rep``'s log start offset (retention, truncation): tell the followers."""
    rep: Replica


class LeadStart(NamedTuple):
    """Move ``rep``'s log start up to the largest a follower reported (no fsync runs on it now)."""
    rep: Replica


class Resync(NamedTuple):
    """Sync every follower of ``rep`` again (a follower repairing its copy asked)."""
    rep: Replica


class UncleanElection(NamedTuple):
    """An operator asked for one unclean election of ``rep``'s partition: its next candidacy counts the
    votes of voters that lost their state (``election.UNCLEAN``)."""
    rep: Replica


class Reprobe(NamedTuple):
    """Probe now the followers that did not know a partition yet (a topic was just announced)."""


# --- the follower's side ------------------------------------------------------------------


class LeaderLink(NamedTuple):
    """A replication link from ``leader`` opened (``up``) or closed on this broker's peer port;
    ``retired`` when the leader closed it on purpose (``protocol.LINK_RETIRED``), not lost."""
    leader: str
    up: bool
    retired: bool = False


class FromLeader(NamedTuple):
    """A frame from ``leader`` on its link (a sync, append or hw frame); answers go back on the same link."""
    leader: str
    frame: Any


# --- elections ------------------------------------------------------------------------------


class VoteRequested(NamedTuple):
    """Another broker's (pre-)vote requests, judged in order; the answers are the Ready's ``reply``, a
    list in the same order (each ballot saved before it returns)."""
    reqs: tuple[Any, ...]


class VoteAnswered(NamedTuple):
    """A voter's answers to our requests: (request, reply) pairs, a reply None when it did not answer
    in time or could not be reached."""
    peer: str
    answers: tuple[tuple[Any, Any], ...]


class TransferRequested(NamedTuple):
    """``sender``, leading ``transfer.epoch``, asks us to take a partition over; ``reply`` says whether we stand."""
    sender: str
    transfer: Any


class TransferAnswered(NamedTuple):
    """Whether the target of our ``transfer`` started standing."""
    peer: str
    transfer: Any
    started: bool


# --- membership -------------------------------------------------------------------------------


class GossipIn(NamedTuple):
    """A gossip message from the peer at address ``addr``; a SYN's ACK is the Ready's ``reply``. An ACK
    answering our SYN carries ``clock``: (when the SYN left on the monotonic clock, our wall clock then,
    the peer's wall clock as it answered), to measure the offset between the clocks."""
    addr: str
    message: Any
    clock: tuple[float, int, int] | None = None


class ClockRead(NamedTuple):
    """The wall clock, read now: a clock set since the last reading is noticed at once."""
    wall_ms: int


class Announce(NamedTuple):
    """Exchange with every live peer now (a local change of the catalogue, or of who leads what)."""


class PutTopic(NamedTuple):
    """Create or reconfigure a topic in the gossiped catalogue (last writer wins, by ``wall_ms``)."""
    name: str
    config: dict[str, Any]
    wall_ms: int


class DeleteTopic(NamedTuple):
    name: str
    wall_ms: int


class RemoveBroker(NamedTuple):
    """Take broker ``name`` off the ring (decommission)."""
    name: str


class HandOver(NamedTuple):
    """This broker is stopping (controlled shutdown): hand every partition it leads to a caught-up follower,
    and stand for none."""


# --- damage -----------------------------------------------------------------------------------


class Damaged(NamedTuple):
    """A stored batch of ``rep`` near ``offset`` failed its check: never serve it from here, repair it (a
    damaged leader hands its partition over first). The Ready's ``damaged`` says to start the repair."""
    rep: Replica
    offset: int


class Repaired(NamedTuple):
    """``rep`` was refetched past its damage."""
    rep: Replica
