"""One partition replica held by this broker: its log and the state replication and elections keep beside it.

A ``Replica`` knows its preference list (``replicas``, from placement), its
voter set (``voters``: the replicas that count for quorum, the high watermark
and elections; a new replica joins it once filled), its ballot (``epoch``,
``voted_for``), its leader (None while it knows of none), its own durable end
(what the fsync policy has made safe), and the high watermark (``hw``): what
consumers may see. Its log's start offset is the partition's as the leader
set it (a follower's moves only when replication says so). On the leader the
high watermark is ``protocol.leader_high_watermark`` over its own durable end and the ends its
followers acknowledged in its epoch; on a follower it is the leader's high
watermark as last told, capped at its own log end. A replica alone (a single
broker) is its own majority: its high watermark is its durable end.

A follower is ``aligned`` once it has taken its leader's sync in the current
epoch (its log cut back to where it agrees with the leader's); it accepts
appends only then. ``synced`` says it took one since it was opened: before
that its log start may be below the one its leader set while this broker was
down, so its reads go to the leader. ``caught_up`` is False after an unclean shutdown until the
replica has reached a leader's log end: such a replica is not elected before.

A replica also knows the incarnation of its own data directory
(``incarnation``) and of each voter as last recorded (``incarnations``,
saved with the ballot): a voter answering from another incarnation lost its
disk. On a leader such a follower is ``renewed``: it is replicated to but
counts for neither acknowledgements nor the high watermark until it has
caught up, and is then recorded with its new incarnation. A replica that
knows its own state is gone (``blank``: opened empty in a new data directory
for a partition older than it) grants no vote until it has caught up from
a leader. ``lost_state`` names the voters an election here found to have
lost their state (what a partition that cannot elect says).

The broker's event loop is the only caller. Long-polls wait on ``waiter``
(resolved when hw moves). Produces waiting until enough replicas hold their
batches are kept in ``ack_waiters`` and released by the node core's
``AckWaiters`` (``acks``), told whenever the durable ends move. The
group-commit fields (``next_sync``, ``running_sync``) belong to
``commit.GroupCommit``, which serialises appends with fsyncs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ring.log.partition import PartitionLog
from ring.replication import protocol
from ring.replication.election import Ballot, LogKey


class Replica:
    __slots__ = ("topic", "index", "log", "self_name", "replicas", "voters", "leader", "epoch", "voted_for",
                 "epoch_start", "aligned", "caught_up", "catch_up_to", "durable", "hw", "follower_ends",
                 "leader_hw", "next_sync", "running_sync", "waiter", "deleted", "failed", "ack_waiters", "acks",
                 "on_hw", "frozen", "damaged_at", "sums", "peer_start", "synced", "voters_seq", "voters_known",
                 "leaving", "vouched", "catalogue", "appends", "follower_starts", "start_waiters", "incarnation",
                 "incarnations", "renewed", "blank", "lost_state", "unclean_allowed", "unclean_once",
                 "unclean_history", "state_writes")

    def __init__(self, topic: str, index: int, plog: PartitionLog, self_name: str,
                 replicas: list[str] | None = None, epoch: int = 1, hw: int | None = None) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self.self_name = self_name
        self.replicas: list[str] = list(replicas or [self_name])
        self.voters: list[str] = list(self.replicas)
        # Alone, a replica leads from the start; a clustered broker clears this and elects.
        self.leader: str | None = self_name
        self.epoch = epoch
        self.voted_for: str | None = None
        self.epoch_start = 0  # leader: where its epoch began in its log; follower: the leader's, from its sync
        self.aligned = True
        self.caught_up = True
        self.catch_up_to: int | None = None  # a leader's log end this replica must reach to count as caught up
        # What survived to this open counts as durable: it was read back from disk.
        self.durable: int = plog.end_offset
        # Below the log start everything is committed (a leader moves it only within its high
        # watermark), whatever an older high-watermark checkpoint says.
        self.hw: int = plog.end_offset if hw is None else min(max(hw, plog.start_offset), plog.end_offset)
        self.follower_ends: dict[str, int] = {}
        self.leader_hw = self.hw
        self.next_sync: asyncio.Future[None] | None = None  # resolves after a sync not yet started
        self.running_sync: asyncio.Future[None] | None = None  # set while an fsync thread runs
        self.waiter: asyncio.Future[None] | None = None  # long-polls; resolved when hw moves
        self.deleted = False
        self.failed: str | None = None  # an fsync failed: what was acknowledged may be gone
        # needed acknowledgements -> heap of (end, arrival, waiter); kept by ``acks`` (ring.node.waiters)
        self.ack_waiters: dict[int, list[tuple[int, int, Any]]] = {}
        self.acks: Any = None  # the node core's AckWaiters, told when the durable ends move
        # The node core, which writes this replica's state file in the Ready of the step that changed it
        # (``ring.replication.state.save_state``); None: written at once.
        self.state_writes: Any = None
        self.sums: object | None = None  # anti-entropy's digests of this log (ring.repair), dropped when cut
        self.on_hw: Callable[[Replica], None] | None = None  # told when hw moves (leaders tell followers)
        self.frozen = False  # a leader handing its partition over takes no new appends
        self.damaged_at: int | None = None  # an offset whose stored batch failed its check here
        self.peer_start = 0  # leader: the largest log start a follower acknowledged, or a voter that elected it held
        self.follower_starts: dict[str, int] = {}  # leader: each follower's log start, as acknowledged in its epoch
        # truncates waiting until a majority of the voters hold their new start: (start, waiter); kept by ``acks``
        self.start_waiters: list[tuple[int, Any]] = []
        self.synced = False  # took a leader's sync since it was opened (so its log start is the leader's)
        # The voter set's sequence number in the leader's epoch (a follower: as its leader's sync
        # said), and on a leader the voters known to hold the current set (their acks say so).
        self.voters_seq = 0
        self.voters_known: set[str] = {self_name}
        # Leader: voters it removed that are placed elsewhere, linked until they acknowledge the set
        # without them (else they would stay open, counting themselves voters, for nothing).
        self.leaving: set[str] = set()
        # (last epoch, end) of the log before a repair cut it back (saved with the ballot): what it
        # acknowledged, so its votes compare candidates with this, not with what is left, until it
        # has it again.
        self.vouched: LogKey | None = None
        self.catalogue: object | None = None  # the partition's ranges (ring.ranges), loaded when first needed
        self.appends: list | None = None  # produces waiting for this loop turn's write (appends.TurnAppends)
        self.incarnation = ""  # this broker's data directory's (ring.log.datadir)
        self.incarnations: dict[str, str] = {}  # each voter's, as recorded (saved with the ballot)
        self.renewed: dict[str, str] = {}  # leader: followers acking from an unrecorded incarnation -> it
        self.blank = False  # its own state was lost: it grants no vote until it has caught up
        self.lost_state: frozenset[str] = frozenset()  # voters an election here found without their state
        self.unclean_allowed = False  # its topic elects uncleanly when it must (``unclean_leader_election``)
        self.unclean_once = False  # an operator asked for one unclean election (until it wins or restarts)
        # The unclean elections this replica won: {"epoch", "from_offset"}: what any replica held at or past
        # from_offset in an earlier epoch, acknowledged or not, is gone (saved with the ballot).
        self.unclean_history: list[dict[str, int]] = []

    # --- placement and leadership -----------------------------------------------------

    def set_placement(self, replicas: list[str]) -> None:
        self.replicas = list(replicas)
        self.refresh()

    def set_voters(self, voters: list[str], seq: int | None = None) -> None:
        """A new voter set: on a leader the next in its epoch (``seq`` None), on a follower the one its
        leader's sync named."""
        assert voters, "a partition needs voters"
        if seq is None:
            self.leaving |= set(self.voters) - set(voters) - set(self.replicas) - {self.self_name}
        self.leaving -= set(voters)
        self.voters = list(voters)
        self.voters_seq = self.voters_seq + 1 if seq is None else seq
        self.voters_known = {self.self_name}
        self.follower_ends = {r: e for r, e in self.follower_ends.items() if r in self.members()}
        self.follower_starts = {r: e for r, e in self.follower_starts.items() if r in self.members()}
        self.refresh()

    def voters_committed(self) -> bool:
        """Leader: whether a majority of the voters holds the current voter set (it may change again)."""
        return len(self.voters_known.intersection(self.voters)) >= len(self.voters) // 2 + 1

    def members(self) -> list[str]:
        """Every broker that holds this partition or should: placed replicas, then voters not placed."""
        return self.replicas + [v for v in self.voters if v not in self.replicas]

    def linked(self) -> list[str]:
        """Leader: the brokers it replicates to, its members and the voters leaving."""
        members = self.members()
        return members + sorted(self.leaving.difference(members))

    @property
    def is_leader(self) -> bool:
        return self.leader == self.self_name

    @property
    def rf(self) -> int:
        return len(self.voters)

    @property
    def serves_from(self) -> int:
        """The lowest offset this replica may serve: its log start, or on a leader the start a voter or
        follower told it of, if higher, until ``lead_start`` moved its log there."""
        start = self.log.start_offset
        return max(start, self.peer_start) if self.is_leader else start

    @property
    def ballot(self) -> Ballot:
        return Ballot(self.epoch, self.voted_for)

    @property
    def key(self) -> LogKey:
        """(last epoch, log end): what elections compare."""
        return (self.log.latest_epoch, self.log.end_offset)

    @property
    def vote_key(self) -> LogKey:
        """What this replica's votes compare a candidate's log with: its own, or what it vouched for."""
        key = self.key
        return key if self.vouched is None or key >= self.vouched else self.vouched

    def lead(self) -> None:
        """This replica won the election for ``epoch`` (its log has begun that epoch)."""
        self.leader = self.self_name
        self.epoch_start = self.log.end_offset
        self.follower_ends = {}
        self.follower_starts = {}
        self.peer_start = 0
        self.voters_seq, self.voters_known = 0, {self.self_name}
        self.leaving = set()
        self.aligned = True
        self.frozen = False
        self.refresh()

    def unlead(self, leader: str | None, exc: BaseException) -> None:
        """Stop leading or following; produces still waiting for acknowledgements get ``exc``."""
        self.leader = leader
        self.aligned = False
        self.frozen = False
        self.follower_ends = {}
        self.follower_starts = {}
        self.fail_waiters(exc)

    def truncated(self) -> None:
        """The log was cut (repair): nothing past its new end is durable or visible here."""
        end = self.log.end_offset
        self.sums = None  # digests of what was cut no longer describe this log
        self.durable = min(self.durable, end)
        if self.hw > end:
            self.hw = end
        if self.catch_up_to is not None:
            self.caught_up = False

    def replica_ends(self) -> dict[str, int | None]:
        """Each member's durable end as known here (None: not known)."""
        if not self.is_leader:
            return {r: (self.durable if r == self.self_name else None) for r in self.members()}
        return {r: (self.durable if r == self.self_name else self.follower_ends.get(r)) for r in self.members()}

    def lost_voters(self) -> list[str]:
        """The voters known here to have lost their state: on a leader the followers still catching up
        from a new data directory, elsewhere those an election found, and this replica if it is blank."""
        if self.is_leader:
            return sorted(self.renewed)
        return sorted(self.lost_state | ({self.self_name} if self.blank else set()))

    # --- progress -------------------------------------------------------------------

    def set_durable(self, end: int) -> None:
        if end > self.durable:
            self.durable = min(end, self.log.end_offset)
            self.refresh()

    def set_follower_end(self, name: str, end: int) -> None:
        if name in self.members() and name != self.self_name and end > self.follower_ends.get(name, -1):
            self.follower_ends[name] = end
            self.refresh()

    def set_follower_start(self, name: str, start: int) -> None:
        if name in self.members() and name != self.self_name and start > self.follower_starts.get(name, -1):
            self.follower_starts[name] = start
            if self.start_waiters and self.acks is not None:
                self.acks.check(self)

    def voters_starting_at(self, start: int) -> int:
        """Leader: how many voters (itself included) are known to hold a log start of at least ``start``."""
        held = self.log.start_offset >= start
        return held + sum(1 for v in self.voters if v != self.self_name and self.follower_starts.get(v, -1) >= start)

    def set_leader_hw(self, hw: int) -> None:
        if hw > self.leader_hw:
            self.leader_hw = hw
            self.refresh()

    def voter_ends(self) -> list[int]:
        """The durable end of each voter as known here (this replica's own first); a voter that lost its
        state counts as holding nothing until it has caught up (``renewed``)."""
        return [self.durable] + [0 if r in self.renewed else self.follower_ends.get(r, 0)
                                 for r in self.voters if r != self.self_name]

    def refresh(self) -> None:
        if self.is_leader:
            hw = protocol.leader_high_watermark(self.voter_ends(), max(1, len(self.voters)), self.epoch_start, self.hw)
        else:
            hw = self.leader_hw
        self.advance(min(hw, self.log.end_offset))
        if (self.ack_waiters or self.start_waiters) and self.acks is not None:
            self.acks.check(self)

    def advance(self, hw: int) -> None:
        if hw > self.hw:
            self.hw = hw
            self.wake()
            if self.on_hw is not None:
                self.on_hw(self)

    def wake(self) -> None:
        if self.waiter is not None:
            if not self.waiter.done():
                self.waiter.set_result(None)
            self.waiter = None

    # --- waiting for acknowledgements ------------------------------------------------

    def fail_waiters(self, exc: BaseException) -> None:
        if (self.ack_waiters or self.start_waiters) and self.acks is not None:
            self.acks.fail(self, exc)
