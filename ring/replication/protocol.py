"""The replication protocol's decisions, as pure functions and one small state machine.

Everything a leader or follower decides lives here, with no I/O, clock or
asyncio: how many acknowledgements a consistency level needs, whether enough
replicas are alive to try, the high watermark (the majority-th largest
durable end over the replica set), which replica leads, whether a follower
accepts an append frame, and the leader's per-(follower, partition) send
cursor (``SendCursor``). The drivers (``leader.py``, ``follower.py``) only
move bytes and call these.

Frames travel as msgpack arrays on one websocket per (leader, follower) pair::

    leader -> follower  ["append", topic, partition, epoch, prev_end, hw, data]
                        ["hw", topic, partition, epoch, hw]
    follower -> leader  ["ack", topic, partition, epoch, end_offset]
                        ["reject", topic, partition, epoch, end_offset, reason]

A follower answers every frame exactly once, in the order received: an
append with an ack of its durable end once the batches are durable by its
fsync policy (or a reject), an hw frame with an ack of its durable end (the
leader's first hw frame for a partition is the probe that tells it where the
follower's log ends). ``prev_end`` is the offset the frame's first batch
starts at: the follower accepts only a frame that continues its log exactly,
from a leader epoch no older than its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

import msgpack

from ring.catalog import CONSISTENCY_DEFAULT, CONSISTENCY_LEVELS as LEVELS
from ring.errors import BadRequest, NotEnoughReplicas

# Statuses (from gossip) that count a replica as alive for a consistency level.
ALIVE_STATUSES = ("up", "suspect")

# Reject reasons.
STALE_EPOCH = "stale_epoch"  # the frame's epoch is older than the follower's
GAP = "gap"  # the frame starts past the follower's end: the leader must go back
OVERLAP = "overlap"  # the frame starts before the follower's end: the leader must go forward
UNKNOWN_PARTITION = "unknown_partition"  # the follower does not hold it (yet)
NOT_FOLLOWER = "not_follower"  # the follower's placement disagrees about the leader
STORAGE = "storage"  # the follower's disk or the frame's bytes failed
REASONS = (STALE_EPOCH, GAP, OVERLAP, UNKNOWN_PARTITION, NOT_FOLLOWER, STORAGE)


# -- consistency -----------------------------------------------------------


def parse_consistency(text: str | None, default: str = CONSISTENCY_DEFAULT) -> str:
    if text is None or text == "":
        return default
    if text not in LEVELS:
        raise BadRequest(f"consistency must be one of {', '.join(LEVELS)}, not {text[:20]!r}",
                         field="consistency")
    return text


def majority(rf: int) -> int:
    assert rf >= 1, rf
    return rf // 2 + 1


def needed_acks(level: str, rf: int) -> int:
    """Replicas (the leader included) that must hold a batch before it is acknowledged."""
    assert rf >= 1, rf
    if level == "one":
        return 1
    if level == "quorum":
        return majority(rf)
    assert level == "all", level
    return rf


def count_alive(replicas: Iterable[str], status_of: Callable[[str], str]) -> int:
    return sum(1 for r in replicas if status_of(r) in ALIVE_STATUSES)


def check_alive(topic: str, partition: int, alive: int, rf: int, level: str) -> int:
    """The acks ``level`` needs; NotEnoughReplicas (503, nothing written) when fewer are alive."""
    needed = needed_acks(level, rf)
    if alive < needed:
        raise NotEnoughReplicas(
            f"{alive} of {rf} replicas of {topic}/{partition} are alive; consistency={level} needs {needed}",
            topic=topic, partition=partition, alive=alive, needed=needed, replication_factor=rf,
            consistency=level)
    return needed


# -- high watermark and acknowledgement counting -----------------------------


def high_watermark(ends: Sequence[int], rf: int) -> int:
    """The majority-th largest durable end over ``rf`` replicas; missing ones count 0.

    Every offset below it is held by a majority, so any majority (the ones a
    future election needs) contains a replica that holds it.
    """
    assert len(ends) <= rf, (ends, rf)
    ordered = sorted(ends, reverse=True) + [0] * (rf - len(ends))
    return ordered[majority(rf) - 1]


def replicas_reaching(ends: Iterable[int], offset: int) -> int:
    """How many replicas hold everything below ``offset``."""
    return sum(1 for e in ends if e >= offset)


def choose_leader(replicas: Sequence[str]) -> str:
    """The leader of a partition: its natural leader, the first of the preference list.

    The one place leadership is decided; failover (electing the next live
    replica under a new epoch) replaces this.
    """
    assert replicas, "a partition without replicas has no leader"
    return replicas[0]


# -- frames ----------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    topic: str
    partition: int
    epoch: int
    prev_end: int
    hw: int
    data: bytes

    def to_wire(self) -> list[Any]:
        return ["append", self.topic, self.partition, self.epoch, self.prev_end, self.hw, self.data]


@dataclass(frozen=True)
class Hw:
    topic: str
    partition: int
    epoch: int
    hw: int

    def to_wire(self) -> list[Any]:
        return ["hw", self.topic, self.partition, self.epoch, self.hw]


@dataclass(frozen=True)
class Ack:
    topic: str
    partition: int
    epoch: int
    end_offset: int

    def to_wire(self) -> list[Any]:
        return ["ack", self.topic, self.partition, self.epoch, self.end_offset]


@dataclass(frozen=True)
class Reject:
    topic: str
    partition: int
    epoch: int
    end_offset: int
    reason: str

    def to_wire(self) -> list[Any]:
        return ["reject", self.topic, self.partition, self.epoch, self.end_offset, self.reason]


Frame = Union[Append, Hw, Ack, Reject]
_ARITY = {"append": 7, "hw": 5, "ack": 5, "reject": 6}
_INT64_MAX = 2**63 - 1
# Partitions and leader epochs are int32 where they are stored (topic configs, batch headers):
# a frame must not make a replica adopt an epoch it could never stamp on a batch.
_INT32_MAX = 2**31 - 1


def encode(frame: Frame) -> bytes:
    return msgpack.packb(frame.to_wire(), use_bin_type=True)


def _int(v: Any, what: str, lo: int = 0, hi: int = _INT64_MAX) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"malformed replication frame: {what} must be an integer in [{lo}, {hi}]")
    return v


def decode(raw: bytes, max_bytes: int) -> Frame:
    """Parse one frame; BadRequest on anything malformed."""
    try:
        w = msgpack.unpackb(raw, raw=False, max_bin_len=max_bytes, max_str_len=4096, max_array_len=8,
                            max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRequest(f"malformed replication frame: {exc}") from None
    if type(w) is not list or not w or type(w[0]) is not str or _ARITY.get(w[0]) != len(w):
        raise BadRequest("malformed replication frame: not an append, hw, ack or reject array")
    kind, topic = w[0], w[1]
    if type(topic) is not str or not topic:
        raise BadRequest("malformed replication frame: topic must be a non-empty string")
    partition, epoch = _int(w[2], "partition", 0, _INT32_MAX), _int(w[3], "epoch", 0, _INT32_MAX)
    if kind == "append":
        if type(w[6]) is not bytes:
            raise BadRequest("malformed replication frame: data must be bytes")
        return Append(topic, partition, epoch, _int(w[4], "prev_end"), _int(w[5], "hw"), w[6])
    if kind == "hw":
        return Hw(topic, partition, epoch, _int(w[4], "hw"))
    if kind == "ack":
        return Ack(topic, partition, epoch, _int(w[4], "end_offset"))
    if w[5] not in REASONS:
        raise BadRequest("malformed replication frame: unknown reject reason")
    return Reject(topic, partition, epoch, _int(w[4], "end_offset", -1), w[5])


# -- the follower's rule ---------------------------------------------------


def judge_append(my_epoch: int, my_end: int, leader_is_sender: bool, frame_epoch: int,
                 prev_end: int) -> str | None:
    """Why a follower refuses an append frame, or None to accept it.

    ``leader_is_sender``: the follower's own placement names the sender as
    the partition's leader (and not itself). The order matters: a stale epoch
    is refused before the offsets are looked at, so a deposed leader learns
    it is deposed rather than being asked to resend.
    """
    if not leader_is_sender:
        return NOT_FOLLOWER
    if frame_epoch < my_epoch:
        return STALE_EPOCH
    if prev_end > my_end:
        return GAP
    if prev_end < my_end:
        return OVERLAP
    return None


# -- the leader's send cursor ----------------------------------------------


class SendCursor:
    """Where a leader stands with one follower on one partition.

    ``next`` is the offset of the next frame to send (None: unknown, the
    follower has to be probed first); ``acked`` the largest end the follower
    acknowledged as durable; in-flight frames are (end, bytes) awaiting an
    answer. ``parked`` names why sending stopped (a follower ahead of the
    leader, a newer epoch): repair, not retransmission, fixes those.
    """

    def __init__(self, probe_retry_s: float) -> None:
        self.probe_retry_s = probe_retry_s
        self.next: int | None = None
        self.acked = 0
        self.hw_sent = -1
        self.probe_at = 0.0
        self.parked: str | None = None
        self._inflight: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0
        self._resent_from: int | None = None

    def reset(self, now_s: float) -> None:
        """A new connection: nothing in flight, where the follower stands must be asked again."""
        self.next = None
        self.hw_sent = -1
        self.probe_at = now_s
        self.parked = None
        self._drop_inflight()
        self._resent_from = None

    def wants_probe(self, now_s: float) -> bool:
        return self.next is None and self.parked is None and now_s >= self.probe_at

    def probed(self, now_s: float) -> None:
        self.probe_at = now_s + self.probe_retry_s

    def can_send(self) -> bool:
        return self.next is not None and self.parked is None

    def sent(self, prev_end: int, end: int, nbytes: int) -> None:
        assert self.next == prev_end and end > prev_end, (self.next, prev_end, end)
        self.next = end
        self._inflight.append((end, nbytes))
        self.inflight_bytes += nbytes

    def on_ack(self, end: int, leader_end: int) -> None:
        self.acked = max(self.acked, end)
        while self._inflight and self._inflight[0][0] <= end:
            self.inflight_bytes -= self._inflight.popleft()[1]
        if self._resent_from is not None and end > self._resent_from:
            self._resent_from = None
        if self.next is None and self.parked is None:
            if end > leader_end:
                self.parked = f"follower log ends at {end}, past the leader's end {leader_end}: needs repair"
            else:
                self.next = end

    def on_reject(self, end: int, reason: str, leader_end: int, now_s: float) -> None:
        if reason in (GAP, OVERLAP):
            if end > leader_end:
                self.parked = f"follower log ends at {end}, past the leader's end {leader_end}: needs repair"
                self._drop_inflight()
            elif end != self._resent_from:
                # Frames sent after the refused one will be refused too: resend once from the
                # follower's end and ignore those answers (they name the same end).
                self.next = end
                self._resent_from = end
                self._drop_inflight()
        elif reason in (UNKNOWN_PARTITION, NOT_FOLLOWER, STORAGE):
            self.next = None
            self.probe_at = now_s + self.probe_retry_s
            self._drop_inflight()
        else:
            assert reason == STALE_EPOCH, reason
            self.parked = "the follower has seen a newer leader epoch"
            self._drop_inflight()

    def _drop_inflight(self) -> None:
        self._inflight.clear()
        self.inflight_bytes = 0
