"""The replication protocol's pure decisions: acks per level, alive counting, the high
watermark, leader choice, the follower's accept/reject rule, frames, and the leader's cursor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import limits
from ring.errors import BadRequest, NotEnoughReplicas
from ring.replication import protocol as p

SETTINGS = settings(max_examples=200, deadline=None)


# -- consistency levels ------------------------------------------------------


@pytest.mark.parametrize("rf,one,quorum,all_", [(1, 1, 1, 1), (2, 1, 2, 2), (3, 1, 2, 3), (4, 1, 3, 4), (5, 1, 3, 5)])
def test_needed_acks_per_level(rf: int, one: int, quorum: int, all_: int) -> None:
    assert (p.needed_acks("one", rf), p.needed_acks("quorum", rf), p.needed_acks("all", rf)) == (one, quorum, all_)


def test_parse_consistency() -> None:
    assert p.parse_consistency(None) == "quorum" and p.parse_consistency("", "all") == "all"
    assert p.parse_consistency("one") == "one"
    with pytest.raises(BadRequest):
        p.parse_consistency("QUORUM")
    with pytest.raises(BadRequest):
        p.parse_consistency("two")


def test_alive_counting_uses_up_and_suspect_only() -> None:
    status = {"a": "up", "b": "suspect", "c": "down", "d": "joining", "e": "leaving", "f": "removed"}
    assert p.count_alive(status, status.__getitem__) == 2
    assert p.count_alive(["a", "a"], status.__getitem__) == 2  # each replica counted as listed
    assert p.count_alive([], status.__getitem__) == 0


def test_check_alive_says_how_many_are_alive_and_needed() -> None:
    assert p.check_alive("t", 0, 2, 3, "quorum") == 2
    assert p.check_alive("t", 0, 1, 3, "one") == 1
    with pytest.raises(NotEnoughReplicas) as exc:
        p.check_alive("t", 4, 2, 3, "all")
    err = exc.value
    assert err.status == 503 and err.retry_after_s
    assert err.message == "2 of 3 replicas of t/4 are alive; consistency=all needs 3"
    assert err.extra["alive"] == 2 and err.extra["needed"] == 3
    with pytest.raises(NotEnoughReplicas):
        p.check_alive("t", 0, 1, 3, "quorum")


@SETTINGS
@given(st.integers(1, 7), st.integers(0, 7), st.sampled_from(p.LEVELS))
def test_check_alive_refuses_exactly_when_too_few(rf: int, alive: int, level: str) -> None:
    alive = min(alive, rf)
    needed = p.needed_acks(level, rf)
    assert 1 <= needed <= rf
    if alive >= needed:
        assert p.check_alive("t", 0, alive, rf, level) == needed
    else:
        with pytest.raises(NotEnoughReplicas):
            p.check_alive("t", 0, alive, rf, level)


# -- high watermark ------------------------------------------------------------


def test_high_watermark_is_the_majority_th_largest() -> None:
    assert p.high_watermark([10, 7, 3], 3) == 7
    assert p.high_watermark([10, 3, 7], 3) == 7
    assert p.high_watermark([10], 3) == 0  # two followers never heard from count 0
    assert p.high_watermark([10, 4], 3) == 4
    assert p.high_watermark([10], 1) == 10
    assert p.high_watermark([10, 8], 2) == 8  # a majority of 2 is both
    assert p.high_watermark([9, 1, 5, 7, 3], 5) == 5


@SETTINGS
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=7), st.integers(0, 3))
def test_high_watermark_is_held_by_a_majority(ends: list[int], missing: int) -> None:
    rf = len(ends) + missing
    hw = p.high_watermark(ends, rf)
    assert p.replicas_reaching(ends, hw) >= p.majority(rf) or hw == 0
    # and it is the largest such offset: one more is held by fewer than a majority
    assert p.replicas_reaching(ends, hw + 1) < p.majority(rf)
    # monotone: raising any replica's end never lowers it
    raised = [e + 1 if i == 0 else e for i, e in enumerate(ends)]
    assert p.high_watermark(raised, rf) >= hw


def test_leader_high_watermark_waits_for_the_leaders_own_epoch_on_a_majority() -> None:
    # A new leader whose epoch began at 10: older batches on a majority are not yet committed by it.
    assert p.leader_high_watermark([12, 9, 9], 3, epoch_start=10, current=5) == 5
    assert p.leader_high_watermark([12, 10, 9], 3, epoch_start=10, current=5) == 10
    assert p.leader_high_watermark([12, 12, 11], 3, epoch_start=10, current=5) == 12
    assert p.leader_high_watermark([7], 1, epoch_start=0, current=3) == 7


# -- the follower's accept/reject rule -----------------------------------------


def test_follower_accepts_only_a_contiguous_frame_from_the_leader_it_synced_with() -> None:
    assert p.judge_append(my_epoch=1, my_end=10, following=True, frame_epoch=1, prev_end=10) is None
    assert p.judge_append(2, 10, True, 1, 10) == p.STALE_EPOCH
    assert p.judge_append(1, 10, True, 1, 12) == p.GAP
    assert p.judge_append(1, 10, True, 1, 8) == p.OVERLAP
    assert p.judge_append(1, 10, False, 1, 10) == p.NOT_FOLLOWER
    assert p.judge_append(1, 10, False, 2, 10) == p.NOT_FOLLOWER  # a newer epoch: sync first
    # a stale epoch is reported before anything else: the sender must learn it is deposed
    assert p.judge_append(3, 10, True, 2, 99) == p.STALE_EPOCH
    assert p.judge_append(3, 10, False, 2, 10) == p.STALE_EPOCH


def test_sync_is_taken_from_one_leader_per_epoch() -> None:
    assert p.judge_sync(2, "a", "a", 2) is None  # the leader we follow, again (a reconnect)
    assert p.judge_sync(2, None, "b", 2) is None  # we voted in 2 but did not know who won
    assert p.judge_sync(2, "a", "b", 2) == p.NOT_FOLLOWER
    assert p.judge_sync(2, "a", "b", 3) is None  # a newer epoch: follow its leader
    assert p.judge_sync(3, "a", "b", 2) == p.STALE_EPOCH


@SETTINGS
@given(st.integers(0, 5), st.integers(0, 100), st.integers(0, 5), st.integers(0, 100))
def test_follower_rule_accepts_iff_epoch_fresh_and_offsets_contiguous(my_epoch, my_end, epoch, prev) -> None:
    verdict = p.judge_append(my_epoch, my_end, True, epoch, prev)
    assert (verdict is None) == (epoch >= my_epoch and prev == my_end)


# -- frames ----------------------------------------------------------------------


@pytest.mark.parametrize("frame", [
    p.Sync("t", 3, 4, 8, 10, 0, 12, ((1, 0), (3, 7), (4, 10)), ("ring-0", "ring-1", "ring-2")),
    p.Sync("t", 0, 1, 0, 0, 0, 0, (), ("ring-0",)),
    p.Sync("t", 0, 1, 0, 0, 0, 0, (), ("ring-0", "ring-1"), 3),
    p.Append("t", 3, 1, 10, 8, b"\x00batches"),
    p.Hw("topic.a", 0, 2, 77),
    p.FollowerAck("t", 1, 1, 12),
    p.FollowerAck("t", 1, 1, 12, 4, 2),
    p.Reject("t", 1, 1, 5, p.GAP),
    p.Reject("t", 1, 1, -1, p.UNKNOWN_PARTITION),
])
def test_frames_round_trip(frame) -> None:
    assert p.decode(p.encode(frame), 1 << 20) == frame


@pytest.mark.parametrize("raw", [
    b"", b"\xc1", b"\x90", b"\x93\xa3ack\x01\x02",
    p.encode(p.FollowerAck("t", 1, 1, 12))[:-1],
    __import__("msgpack").packb(["ack", "t", -1, 1, 12, 0, 0]),
    __import__("msgpack").packb(["ack", "", 1, 1, 12, 0, 0]),
    __import__("msgpack").packb(["ack", "t", 1, 1, 12, 0, -1]),  # a negative voter-set number
    __import__("msgpack").packb(["ack", "t", 1, 1, 12, 0]),  # an ack of ring-replication.2
    __import__("msgpack").packb(["append", "t", 1, 1, 0, 0, "not bytes"]),
    __import__("msgpack").packb(["reject", "t", 1, 1, 0, "because"]),
    __import__("msgpack").packb(["nope", "t", 1, 1, 0]),
    __import__("msgpack").packb({"ack": 1}),
    __import__("msgpack").packb(["sync", "t", 1, 1, 0, 0, 0, 0, b"\x00" * 5, "a", 0]),  # history not whole pairs
    __import__("msgpack").packb(["sync", "t", 1, 1, 0, 0, 0, 0, b"", "", 0]),  # no voters
    __import__("msgpack").packb(["sync", "t", 1, 1, 0, 0, 0, 0, b"", "a\na", 0]),  # a voter twice
    __import__("msgpack").packb(["sync", "t", 1, 1, 5, 0, 0, 3, b"", "a", 0]),  # hw past the log end
    __import__("msgpack").packb(["sync", "t", 1, 1, 0, 0, 0, 0, b"", "a", "0"]),  # voters_seq not an integer
    p.encode(p.Sync("t", 1, 2, 0, 0, 0, 9, ((2, 0), (1, 5)), ("a",))),  # history going back
])
def test_malformed_frames_are_bad_requests(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        p.decode(raw, 1 << 20)


def test_frame_data_over_the_limit_is_refused() -> None:
    with pytest.raises(BadRequest):
        p.decode(p.encode(p.Append("t", 0, 1, 0, 0, b"x" * 100)), 50)


# -- the leader's send cursor -----------------------------------------------------


def test_cursor_starts_at_the_followers_answer_to_the_probe() -> None:
    c = p.SendCursor(probe_retry_s=0.5)
    assert c.wants_probe(0.0) and not c.can_send()
    c.probed(0.0, 0, 0)
    assert not c.wants_probe(0.2) and c.wants_probe(0.5)
    c.on_ack(7, leader_end=20)
    assert c.next == 7 and c.acked == 7 and c.can_send() and not c.wants_probe(1.0)


def test_cursor_pipelines_and_acks_free_inflight_bytes() -> None:
    c = p.SendCursor(0.5)
    c.on_ack(0, 100)
    c.sent(0, 10, 1000)
    c.sent(10, 25, 1500)  # without waiting for the first ack
    assert c.next == 25 and c.inflight_bytes == 2500
    c.on_ack(10, 100)
    assert c.inflight_bytes == 1500 and c.acked == 10
    c.on_ack(25, 100)
    assert c.inflight_bytes == 0 and c.acked == 25
    c.on_ack(12, 100)  # a late answer (a probe) never moves acked back
    assert c.acked == 25


def test_cursor_holds_a_few_records_while_a_frame_is_unanswered() -> None:
    c = p.SendCursor(0.5)
    assert not c.should_send(10, hold_records=64)  # where the follower ends is not known yet
    c.on_ack(0, 100)
    assert not c.should_send(0, 64)  # nothing new
    assert c.should_send(1, 64)  # one record, nothing out: sent at once (one request at a time)
    c.sent(0, 1, 100)
    assert not c.should_send(5, 64)  # four more while that frame is out: they wait for its answer
    assert c.should_send(65, 64)  # 64 or more new records (a batched produce) go at once, pipelined
    c.on_ack(1, 100)
    assert c.should_send(5, 64)  # the answer came: the held records leave together
    c.on_reject(1, p.STALE_EPOCH, 100, 0.0)
    assert not c.should_send(500, 64)  # parked


def test_the_hold_limit_holds_a_batched_produce_but_not_a_frames_worth() -> None:
    hold = limits.REPLICATION_FRAME_HOLD_RECORDS_MAX
    c = p.SendCursor(0.5)
    c.on_ack(0, 0)
    c.sent(0, 100, 100 * 1024)  # a produce of 100 records is out
    assert not c.should_send(200, hold)  # the next 100 wait for its answer, to leave with what follows
    assert c.should_send(100 + hold, hold)  # a frame's worth goes at once
    c.on_ack(100, 1000)
    assert c.should_send(200, hold)


def test_cursor_resends_once_from_the_followers_end_after_a_gap() -> None:
    c = p.SendCursor(0.5)
    c.on_ack(50, 100)
    c.sent(50, 60, 10)
    c.sent(60, 70, 10)
    c.sent(70, 80, 10)
    c.on_reject(40, p.GAP, leader_end=100, now_s=1.0)  # the follower ends at 40
    assert c.next == 40 and c.inflight_bytes == 0
    c.sent(40, 80, 40)
    # the answers to the two later frames name the same end: ignored, no second resend
    c.on_reject(40, p.GAP, 100, 1.0)
    c.on_reject(40, p.GAP, 100, 1.0)
    assert c.next == 80 and c.inflight_bytes == 40
    c.on_ack(80, 100)
    assert c.inflight_bytes == 0 and c.acked == 80


def test_cursor_moves_forward_on_overlap_and_parks_a_follower_ahead() -> None:
    c = p.SendCursor(0.5)
    c.on_ack(10, 100)
    c.sent(10, 20, 5)
    c.on_reject(20, p.OVERLAP, 100, 0.0)
    assert c.next == 20
    d = p.SendCursor(0.5)
    d.on_ack(150, leader_end=100)  # the follower holds more than the leader: repair's job
    assert d.parked and not d.can_send() and not d.wants_probe(99.0)
    e = p.SendCursor(0.5)
    e.on_ack(10, 100)
    e.sent(10, 20, 5)
    e.on_reject(120, p.GAP, 100, 0.0)
    assert e.parked and e.inflight_bytes == 0


def test_cursor_probes_again_when_the_follower_lacks_the_partition_and_parks_on_stale_epoch() -> None:
    c = p.SendCursor(0.5)
    c.probed(0.0, 0, 0)
    c.on_reject(-1, p.UNKNOWN_PARTITION, 100, now_s=1.0)
    assert c.next is None and not c.wants_probe(1.2) and c.wants_probe(1.5)
    c.on_ack(0, 100)
    c.sent(0, 5, 3)
    c.on_reject(0, p.STALE_EPOCH, 100, 2.0)
    assert c.parked and c.inflight_bytes == 0
    c.reset(3.0)  # a new connection asks again
    assert c.parked is None and c.wants_probe(3.0) and c.next is None


class _Follower:
    """A follower on a reliable, ordered link: accepts only contiguous frames, answers in order."""

    def __init__(self, cursor: p.SendCursor, leader_end: int) -> None:
        self.c, self.leader_end, self.end, self.wire = cursor, leader_end, 0, []

    def deliver(self) -> bool:
        """Answer the oldest frame on the wire; True if it was accepted."""
        prev, end = self.wire.pop(0)
        if prev == self.end:
            self.end = end
            self.c.on_ack(self.end, self.leader_end)
            return True
        self.c.on_reject(self.end, p.GAP if prev > self.end else p.OVERLAP, self.leader_end, 0.0)
        return False

    def reconnect(self, lag: int) -> None:
        """A new connection: the wire is empty; the probe is answered with an end up to ``lag`` behind
        (a durable end behind the log end), so the first frames may overlap."""
        self.wire.clear()
        self.c.reset(0.0)
        self.c.on_ack(max(0, self.end - lag), self.leader_end)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(["send", "deliver", "reconnect"]), st.integers(0, 20)), max_size=60))
def test_cursor_converges_on_the_followers_log(ops) -> None:
    c = p.SendCursor(0.5)
    f = _Follower(c, leader_end=100_000)
    f.reconnect(0)
    for op, n in ops:
        if op == "send" and c.can_send():
            prev = c.next
            c.sent(prev, prev + n + 1, n + 1)
            f.wire.append((prev, prev + n + 1))
        elif op == "deliver" and f.wire:
            f.deliver()
        elif op == "reconnect":
            f.reconnect(n)
        assert c.inflight_bytes >= 0 and c.acked <= f.end
    while f.wire:
        f.deliver()
    # nothing in flight: within two frames (one refused as an overlap after a lagging
    # probe answer) the cursor continues the follower's log exactly
    accepted = False
    for _ in range(2):
        assert c.can_send() and c.inflight_bytes == 0
        c.sent(c.next, c.next + 1, 1)
        f.wire.append((c.next - 1, c.next))
        accepted = f.deliver()
        if accepted:
            break
    assert accepted and c.next == f.end == c.acked
