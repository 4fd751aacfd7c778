"""The replication protocol's decisions, as pure functions and one small state machine.

Everything a leader or follower decides lives here, with no I/O, clock or
asyncio: how many acknowledgements a consistency level needs, whether enough
replicas are alive to try, the high watermark (the majority-th largest
durable end over the voter set, counted only once the leader's own epoch is
on a majority), whether a follower accepts a frame, and the leader's
per-(follower, partition) send cursor (``SendCursor``). The drivers
(``leader.py``, ``follower.py``) only move bytes and call these; who leads is
decided by elections (``election.py``).

Frames travel as msgpack arrays on one websocket per (leader, follower) pair,
opened with a websocket subprotocol naming the frames' version: ``SUBPROTOCOL``
is this one's, and the link negotiates the highest both ends and the cluster
speak (``versions``: the previous version's frames lack the incarnations
below); a link that names no version a side speaks is refused, so brokers
never exchange frames of a shape the other cannot read::

    leader -> follower  ["sync", topic, partition, epoch, hw, epoch_start, log_start, log_end, history, voters,
                         voters_seq, incarnations]
                        ["append", topic, partition, epoch, prev_end, hw, data]
                        ["hw", topic, partition, epoch, hw, log_start]
    follower -> leader  ["ack", topic, partition, epoch, end_offset, log_start, voters_seq, incarnation]
                        ["reject", topic, partition, epoch, end_offset, reason]

A follower answers every sync and append frame exactly once, in the order
received, and an hw frame only when it refuses it (its ack would repeat the
last append's). A
leader's first frame for a partition on a link is a sync: it names the
leader's epoch, where that epoch began in its log, its log's bounds, its
leader-epoch history (packed) and the partition's voter set. The follower
adopts the epoch and the sender as its leader (refusing an older epoch),
cuts its log where it diverges from the leader's (``ring.repair``), and
acks its durable end, where the leader's cursor then starts. An append is
accepted only from the leader the follower synced with, in that epoch,
continuing its log exactly (``prev_end``); an ack names the follower's
durable end once the batches are durable by its fsync policy. A stale epoch
is refused before anything else, so a deposed leader learns it at once.

The voter set in a sync comes with its sequence number in the leader's
epoch (``voters_seq``), and every ack names the one the follower holds, so a
leader knows which voters hold its current voter set: it moves the set one
step further only once a majority of it does (Raft's rule: a configuration
is committed before the next change), else a majority of the set before could
still elect a leader the set after never heard of.

A sync also carries the incarnation of each voter as the leader records it
("name=id" lines), and every ack the follower's own data directory's id:
the leader learns each follower's, the followers keep the leader's record
(a candidate counts votes only from the incarnations it recorded,
``election.Tally``), and a follower acking from an incarnation other than
the recorded one lost its state: it does not count for acknowledgements or
the high watermark until it has caught up (``Replica.renewed``). Both are
appended to their arrays, so a frame from an older release, without them,
still decodes (and names no incarnation).

The partition's log start offset is the leader's to move (retention,
truncation) and travels like the high watermark: in the sync and hw frames
(an hw frame goes out when either moved), never above the high watermark,
so it only ever names committed offsets. A follower moves its own start up
to it and reports its start in every ack; a leader that finds a follower's
start ahead of its own (it missed a move while it followed) moves up to it,
within its high watermark: the start only ever grows, on every replica.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

import msgpack

from ring import limits
from ring.catalog import CONSISTENCY_DEFAULT, CONSISTENCY_LEVELS as LEVELS
from ring.errors import BadRequest, NotEnoughReplicas

# The websocket subprotocol of replication links: the version of the frames below (.4: syncs carry the
# voters' incarnations and acks the follower's; this release still decodes .3's frames without them).
SUBPROTOCOL = "ring-replication.4"
# The WebSocket close code of a link its leader closes on purpose (it leads nothing the follower
# replicates any more): the follower does not take the leader for lost, as it does when a link breaks.
LINK_RETIRED = 4000

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


def leader_high_watermark(ends: Sequence[int], voters: int, epoch_start: int, current: int) -> int:
    """The leader's high watermark: ``high_watermark`` over the voters, but only once it reaches
    ``epoch_start`` (where this leader's epoch began in its log).

    Offsets a previous leader wrote are committed by this leader only
    together with its own epoch's start (Raft's current-term rule): a
    majority holding an older epoch's batch is not enough, since a replica
    with a newer last epoch could still be elected without it.
    """
    hw = high_watermark(ends, voters)
    return hw if hw >= epoch_start else current


# -- frames ----------------------------------------------------------------


@dataclass(frozen=True)
class Sync:
    topic: str
    partition: int
    epoch: int
    hw: int
    epoch_start: int  # where the leader's epoch begins in its log
    log_start: int
    log_end: int
    history: tuple[tuple[int, int], ...]  # the leader's (epoch, first offset), oldest first
    voters: tuple[str, ...]
    voters_seq: int = 0  # which of the leader's voter sets in its epoch ``voters`` is (it counts changes)
    incarnations: tuple[tuple[str, str], ...] = ()  # (voter, incarnation) as the leader records them

    def to_wire(self) -> list[Any]:
        packed = b"".join(_HISTORY_ENTRY.pack(e, o) for e, o in self.history)
        return ["sync", self.topic, self.partition, self.epoch, self.hw, self.epoch_start, self.log_start,
                self.log_end, packed, "\n".join(self.voters), self.voters_seq,
                "\n".join(f"{v}={i}" for v, i in self.incarnations)]


@dataclass(frozen=True)
class Append:
    topic: str
    partition: int
    epoch: int
    prev_end: int
    hw: int
    data: bytes | memoryview  # decoded: a view into the frame as received

    def to_wire(self) -> list[Any]:
        return ["append", self.topic, self.partition, self.epoch, self.prev_end, self.hw, self.data]


@dataclass(frozen=True)
class Hw:
    topic: str
    partition: int
    epoch: int
    hw: int
    log_start: int = 0  # the leader's log start offset

    def to_wire(self) -> list[Any]:
        return ["hw", self.topic, self.partition, self.epoch, self.hw, self.log_start]


@dataclass(frozen=True)
class FollowerAck:
    topic: str
    partition: int
    epoch: int
    end_offset: int
    log_start: int = 0  # the follower's log start offset
    voters_seq: int = 0  # the voter set of the leader's sync it follows (``Sync.voters_seq``)
    incarnation: str = ""  # the follower's data directory's incarnation ("": an older release's ack)

    def to_wire(self) -> list[Any]:
        return ["ack", self.topic, self.partition, self.epoch, self.end_offset, self.log_start, self.voters_seq,
                self.incarnation]


@dataclass(frozen=True)
class Reject:
    topic: str
    partition: int
    epoch: int
    end_offset: int
    reason: str

    def to_wire(self) -> list[Any]:
        return ["reject", self.topic, self.partition, self.epoch, self.end_offset, self.reason]


Frame = Union[Sync, Append, Hw, FollowerAck, Reject]
# Frame lengths accepted; sync and ack may lack their last field (an older release's).
_ARITY = {"sync": (11, 12), "append": (7,), "hw": (6,), "ack": (7, 8), "reject": (6,)}
_HISTORY_ENTRY = struct.Struct(">iq")  # epoch (int32, as in batch headers), first offset (int64)
_VOTERS_BYTES_MAX = 64 * 1024
# An append frame's fields before its data: the tag, a topic name (at most 249 bytes,
# limits.TOPIC_NAME_BYTES_MAX, in a str8 header) and four integers; a frame whose head
# is longer is parsed the long way (and refused there if it is malformed).
_APPEND_HEAD_BYTES_MAX = 1 + 7 + 2 + 255 + 4 * 9
_INT64_MAX = 2**63 - 1
# Partitions and leader epochs are int32 where they are stored (topic configs, batch headers):
# a frame must not make a replica adopt an epoch it could never stamp on a batch.
_INT32_MAX = 2**31 - 1


def encode(frame: Frame) -> bytes:
    if type(frame) is Append:
        return _encode_append(frame)
    return msgpack.packb(frame.to_wire(), use_bin_type=True)


_APPEND_TAG = b"\xa6append"  # msgpack fixstr "append"


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _encode_append(f: Append) -> bytes:
    """The bytes msgpack gives for the frame's array, with the batches copied once: packing them
    inside the array copies them into msgpack's growing buffer first (megabytes a second)."""
    head = msgpack.packb(["append", f.topic, f.partition, f.epoch, f.prev_end, f.hw], use_bin_type=True)
    assert head[0] == 0x96, head[:1]  # a fixarray of 6; with the data it is one of 7
    return b"".join((b"\x97", head[1:], _bin_header(len(f.data)), f.data))


def _decode_append(raw: bytes, max_bytes: int) -> Append | None:
    """An append frame with its data a view into ``raw`` (not a copy); None to parse it the long way."""
    if len(raw) < 16 or raw[0] != 0x97 or raw[1:8] != _APPEND_TAG:
        return None
    u = msgpack.Unpacker(raw=False, max_str_len=_VOTERS_BYTES_MAX, max_bin_len=0, max_array_len=0,
                         max_map_len=0, max_ext_len=0)
    u.feed(raw[1:_APPEND_HEAD_BYTES_MAX])
    try:
        w = [u.unpack() for _ in range(6)]
    except (ValueError, TypeError, msgpack.UnpackException):
        return None  # the long way says what is wrong
    pos = 1 + u.tell()
    kind = raw[pos] if pos < len(raw) else None
    size = {0xc4: 1, 0xc5: 2, 0xc6: 4}.get(kind)  # type: ignore[arg-type]
    if size is None or pos + 1 + size > len(raw):
        return None
    n = int.from_bytes(raw[pos + 1:pos + 1 + size], "big")
    start = pos + 1 + size
    if start + n != len(raw) or n > max_bytes:
        return None
    topic = w[1]
    if type(topic) is not str or not topic:
        raise BadRequest("malformed replication frame: topic must be a non-empty string")
    return Append(topic, _int(w[2], "partition", 0, _INT32_MAX), _int(w[3], "epoch", 0, _INT32_MAX),
                  _int(w[4], "prev_end"), _int(w[5], "hw"), memoryview(raw)[start:])


def _int(v: Any, what: str, lo: int = 0, hi: int = _INT64_MAX) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise BadRequest(f"malformed replication frame: {what} must be an integer in [{lo}, {hi}]")
    return v


def decode(raw: bytes, max_bytes: int) -> Frame:
    """Parse one frame; BadRequest on anything malformed. An append's data is a view into ``raw``."""
    fast = _decode_append(raw, max_bytes)
    if fast is not None:
        return fast
    try:
        w = msgpack.unpackb(raw, raw=False, max_bin_len=max_bytes, max_str_len=_VOTERS_BYTES_MAX,
                            max_array_len=12, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadRequest(f"malformed replication frame: {exc}") from None
    if type(w) is not list or not w or type(w[0]) is not str or len(w) not in _ARITY.get(w[0], ()):
        raise BadRequest("malformed replication frame: not a sync, append, hw, ack or reject array")
    kind, topic = w[0], w[1]
    if type(topic) is not str or not topic:
        raise BadRequest("malformed replication frame: topic must be a non-empty string")
    partition, epoch = _int(w[2], "partition", 0, _INT32_MAX), _int(w[3], "epoch", 0, _INT32_MAX)
    if kind == "sync":
        return _sync(topic, partition, epoch, w)
    if kind == "append":
        if type(w[6]) is not bytes:
            raise BadRequest("malformed replication frame: data must be bytes")
        return Append(topic, partition, epoch, _int(w[4], "prev_end"), _int(w[5], "hw"), w[6])
    if kind == "hw":
        return Hw(topic, partition, epoch, _int(w[4], "hw"), _int(w[5], "log_start"))
    if kind == "ack":
        return FollowerAck(topic, partition, epoch, _int(w[4], "end_offset"), _int(w[5], "log_start"),
                   _int(w[6], "voters_seq"), _incarnation(w[7]) if len(w) == 8 else "")
    if w[5] not in REASONS:
        raise BadRequest("malformed replication frame: unknown reject reason")
    return Reject(topic, partition, epoch, _int(w[4], "end_offset", -1), w[5])


def _sync(topic: str, partition: int, epoch: int, w: list[Any]) -> Sync:
    hw, epoch_start, log_start, log_end = (_int(w[i], n) for i, n in
                                           ((4, "hw"), (5, "epoch_start"), (6, "log_start"), (7, "log_end")))
    if type(w[8]) is not bytes or len(w[8]) % _HISTORY_ENTRY.size:
        raise BadRequest("malformed replication frame: history must be packed (epoch, offset) pairs")
    history = tuple(_HISTORY_ENTRY.iter_unpack(w[8]))
    if any(e < 0 or o < 0 for e, o in history) or any(
            a[0] >= b[0] or a[1] >= b[1] for a, b in zip(history, history[1:])):
        raise BadRequest("malformed replication frame: history must grow strictly in epoch and offset")
    if type(w[9]) is not str or len(w[9]) > _VOTERS_BYTES_MAX:
        raise BadRequest("malformed replication frame: voters must be a string")
    voters = tuple(v for v in w[9].split("\n") if v)
    if not voters or len(set(voters)) != len(voters):
        raise BadRequest("malformed replication frame: voters must name distinct brokers")
    if not log_start <= log_end or hw > log_end or epoch_start > log_end:
        raise BadRequest("malformed replication frame: sync offsets out of order")
    incarnations: tuple[tuple[str, str], ...] = ()
    if len(w) == 12:
        if type(w[11]) is not str or len(w[11]) > _VOTERS_BYTES_MAX:
            raise BadRequest("malformed replication frame: incarnations must be a string")
        pairs = [line.partition("=") for line in w[11].split("\n") if line]
        incarnations = tuple((v, _incarnation(i)) for v, eq, i in pairs if eq and v in voters)
        if len(incarnations) != len(pairs) or len({v for v, _ in incarnations}) != len(incarnations):
            raise BadRequest("malformed replication frame: incarnations must be voter=id lines, one per voter")
    return Sync(topic, partition, epoch, hw, epoch_start, log_start, log_end, history, voters,
                _int(w[10], "voters_seq"), incarnations)


def _incarnation(v: Any) -> str:
    if type(v) is not str or len(v) > limits.INCARNATION_CHARS_MAX:
        raise BadRequest(f"malformed replication frame: an incarnation is a string of at most "
                         f"{limits.INCARNATION_CHARS_MAX} characters")
    return v


# -- the follower's rule ---------------------------------------------------


def judge_sync(my_epoch: int, my_leader: str | None, sender: str, frame_epoch: int) -> str | None:
    """Why a follower refuses a sync, or None to follow ``sender`` in ``frame_epoch``.

    An epoch has one leader: in its own epoch a follower takes a sync only
    from the leader it already follows, or from anyone when it knows no
    leader of that epoch yet (it voted, or heard of the epoch, but not who won).
    """
    if frame_epoch < my_epoch:
        return STALE_EPOCH
    if frame_epoch == my_epoch and my_leader not in (None, sender):
        return NOT_FOLLOWER
    return None


def judge_append(my_epoch: int, my_end: int, following: bool, frame_epoch: int,
                 prev_end: int) -> str | None:
    """Why a follower refuses an append frame, or None to accept it.

    ``following``: the follower synced with the sender in ``frame_epoch``.
    The order matters: a stale epoch is refused before anything else, so a
    deposed leader learns it is deposed (and steps down) rather than being
    asked to probe or resend.
    """
    if frame_epoch < my_epoch:
        return STALE_EPOCH
    if not following:
        return NOT_FOLLOWER
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
        self.start_sent = -1  # the log start offset last told (sync or hw frame)
        self.probe_at = 0.0
        self.parked: str | None = None
        self._inflight: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0
        self._resent_from: int | None = None

    def reset(self, now_s: float) -> None:
        """A new connection: nothing in flight, where the follower stands must be asked again."""
        self.next = None
        self.hw_sent = -1
        self.start_sent = -1
        self.probe_at = now_s
        self.parked = None
        self._drop_inflight()
        self._resent_from = None

    def wants_probe(self, now_s: float) -> bool:
        return self.next is None and self.parked is None and now_s >= self.probe_at

    def probed(self, now_s: float, hw: int, log_start: int) -> None:
        """A sync frame went out, naming ``hw`` and ``log_start``."""
        self.probe_at = now_s + self.probe_retry_s
        self.hw_sent, self.start_sent = hw, log_start

    def wants_hw(self, hw: int, log_start: int) -> bool:
        """Whether to send an hw frame: the high watermark or the log start moved past what was told."""
        return self.can_send() and (self.hw_sent < hw or self.start_sent < log_start)

    def told(self, hw: int, log_start: int) -> None:
        """An hw frame went out."""
        self.hw_sent, self.start_sent = max(self.hw_sent, hw), max(self.start_sent, log_start)

    def can_send(self) -> bool:
        return self.next is not None and self.parked is None

    def should_send(self, log_end: int, hold_records: int) -> bool:
        """Whether to send a frame now of what lies between ``next`` and ``log_end``: fewer than
        ``hold_records`` new records wait while a frame is unanswered, to leave with what comes
        next in one frame when the answer does (as Nagle's algorithm holds small segments)."""
        if not self.can_send() or self.next >= log_end:
            return False
        return not self._inflight or log_end - self.next >= hold_records

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
