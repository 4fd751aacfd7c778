"""Repair decisions: where a follower diverges from its leader, and what anti-entropy checksums say.

The divergence point is checked against brute force on logs built the way a
cluster builds them (each epoch's leader keeps a prefix of an earlier
leader's log and appends its own batches), including epochs that begin with
no batch. The follower steps (``steps.on_sync``) are run on real partition
logs: a returning leader's unreplicated suffix is cut, a follower behind the
leader's log start restarts there. Checksums are taken from real logs, one
with a bit flipped in a closed segment.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.clock import ManualClock
from ring.log import FsyncPolicy, LogConfig, PartitionLog
from ring.log import batch as B
from ring.log import recovery
from ring.replication import divergence as d
from ring.repair import entropy, mend
from ring.replication import protocol, state, steps
from ring.replication.replica import Replica
from ring.errors import StorageError

SETTINGS = settings(max_examples=200, deadline=None)
T0 = 1_700_000_000_000


# -- divergence ------------------------------------------------------------------------------


def history_of(epochs: list[int], begun: int | None = None) -> list[tuple[int, int]]:
    """(epoch, first offset) of a log whose offset i holds a batch of epoch epochs[i]; ``begun``: an epoch
    recorded at the log end with no batch yet."""
    out: list[tuple[int, int]] = []
    for i, e in enumerate(epochs):
        if not out or out[-1][0] != e:
            out.append((e, i))
    if begun is not None and (not out or begun > out[-1][0]):
        out.append((begun, len(epochs)))
    return out


def brute(mine: list[int], theirs: list[int]) -> int:
    n = 0
    while n < len(mine) and n < len(theirs) and mine[n] == theirs[n]:
        n += 1
    return n


@st.composite
def leader_logs(draw):
    """The log of each epoch's leader: a prefix of an earlier leader's log plus its own batches."""
    logs: dict[int, list[int]] = {0: []}
    for epoch in range(1, draw(st.integers(1, 8)) + 1):
        parent = draw(st.sampled_from(sorted(logs)))
        cut = draw(st.integers(0, len(logs[parent])))
        logs[epoch] = logs[parent][:cut] + [epoch] * draw(st.integers(0, 4))
    return logs


@SETTINGS
@given(leader_logs(), st.data())
def test_divergence_point_is_the_longest_common_prefix(logs, data) -> None:
    epochs = sorted(e for e in logs if e)
    a, b = data.draw(st.sampled_from(epochs)), data.draw(st.sampled_from(epochs))
    mine = logs[a][: data.draw(st.integers(0, len(logs[a])))]  # a follower holds a prefix of a leader's log
    mine_begun = a if len(mine) == len(logs[a]) and data.draw(st.booleans()) else None
    theirs = logs[b]
    got = d.divergence_point(history_of(mine, mine_begun), len(mine), history_of(theirs, b), len(theirs))
    assert got == brute(mine, theirs), (mine, theirs)


def test_divergence_examples() -> None:
    # the returning old leader: it wrote 3 batches in epoch 1 nobody else has; the new leader began epoch 2 at 5
    assert d.divergence_point([(1, 0)], 8, [(1, 0), (2, 5)], 9) == 5
    # a follower that is merely behind keeps everything
    assert d.divergence_point([(1, 0), (2, 5)], 7, [(1, 0), (2, 5)], 9) == 7
    # a follower that saw an epoch the leader never had
    assert d.divergence_point([(1, 0), (3, 4)], 6, [(1, 0), (2, 5)], 9) == 4
    # nothing in common
    assert d.divergence_point([(2, 0)], 3, [(1, 0), (3, 1)], 4) == 0
    assert d.divergence_point([], 0, [(1, 0)], 4) == 0
    assert d.end_offset_for([(1, 0), (3, 4)], 9, 2) == (1, 4)
    assert d.end_offset_for([(1, 0), (3, 4)], 9, 3) == (3, 9)
    assert d.end_offset_for([(1, 5)], 9, 0) == (-1, -1)


# -- following a leader on real logs --------------------------------------------------------


def mk(path: Path, segment_bytes: int = 1024) -> PartitionLog:
    return PartitionLog(path, LogConfig(segment_bytes=segment_bytes, index_interval_bytes=128,
                                        fsync=FsyncPolicy("never")), ManualClock(T0))


def put(log: PartitionLog, epoch: int, n: int = 1, tag: str = "v") -> None:
    for i in range(n):
        log.append(B.encode([(T0, None, f"{tag}{i}".encode() * 4, None)], now_ms=T0), epoch)


def replica(log: PartitionLog, name: str, epoch: int) -> Replica:
    rep = Replica("t", 0, log, name, ["a", "b", "c"], epoch=epoch)
    rep.leader, rep.aligned = None, False
    return rep


def sync_of(leader: Replica) -> protocol.Sync:
    return steps.sync_frame(leader)


def test_a_returning_leader_cuts_its_unreplicated_suffix_and_follows(tmp_path: Path) -> None:
    old = mk(tmp_path / "a")
    new = mk(tmp_path / "b")
    put(old, 1, 5, "x")
    new.append_replicated(old.read(0, 1 << 20, upto=None)[: _bytes_upto(old, 3)])  # b got the first 3
    put(old, 1, 2, "lost")  # a wrote 2 more in epoch 1, then died
    b = replica(new, "b", 2)
    b.voted_for = "b"
    assert steps.win(b, 2) and b.is_leader and b.epoch_start == 3
    put(new, 2, 4, "y")
    a = replica(old, "a", 1)
    ack = steps.on_sync(a, "b", sync_of(b))
    assert isinstance(ack, protocol.FollowerAck) and ack.epoch == 2
    assert a.leader == "b" and a.epoch == 2 and a.aligned and old.end_offset == 3
    frame = protocol.Append("t", 0, 2, 3, 0, new.read(3, 1 << 20))
    assert steps.on_append(a, "b", frame) == new.end_offset == 7
    assert old.read(0, 1 << 20) == new.read(0, 1 << 20)  # the very same bytes
    assert old.epochs() == new.epochs()
    # the deposed leader's frames are now refused as stale, so it learns at once
    stale = steps.on_hw(a, "b", protocol.Hw("t", 0, 1, 0))
    assert isinstance(stale, protocol.Reject) and stale.reason == protocol.STALE_EPOCH and stale.epoch == 2


def _bytes_upto(log: PartitionLog, offset: int) -> int:
    data = log.read(0, 1 << 20)
    return sum(h.size for h, _ in B.scan(data) if h.next_offset <= offset)


def test_a_follower_reaching_an_empty_epoch_records_it(tmp_path: Path) -> None:
    lead = replica(mk(tmp_path / "a"), "a", 1)
    put(lead.log, 1, 2)
    lead.voted_for = "a"
    lead.epoch = 3
    assert steps.win(lead, 3) and lead.log.epochs() == [(1, 0), (3, 2)]
    f = replica(mk(tmp_path / "b"), "b", 0)
    steps.on_sync(f, "a", sync_of(lead))
    assert f.log.latest_epoch == -1  # nothing yet
    steps.on_append(f, "a", protocol.Append("t", 0, 3, 0, 0, lead.log.read(0, 1 << 20)))
    assert f.log.epochs() == [(1, 0), (3, 2)] and f.key == lead.key


def test_an_empty_follower_drops_an_epoch_its_new_leader_never_had_and_takes_its_batches(tmp_path: Path) -> None:
    for start in (0, 30):  # a partition nobody wrote to, and one whose records were all deleted
        old = replica(mk(tmp_path / f"old{start}"), "b", 3)
        if start:
            put(old.log, 1, start)
            old.log.truncate_before(start)
        old.log.begin_epoch(3)  # the last leader's epoch, begun with no batch
        lead = replica(mk(tmp_path / f"lead{start}"), "a", 4)
        if start:
            lead.log.restart_at(start)
        lead.voted_for = "a"
        assert steps.win(lead, 4) and lead.log.epochs() == [(4, start)]
        ack = steps.on_sync(old, "a", sync_of(lead))
        assert isinstance(ack, protocol.FollowerAck) and ack.epoch == 4 and old.log.end_offset == old.log.start_offset == start
        assert old.log.epochs() == [(4, start)] and old.key == lead.key == (4, start)
        put(lead.log, 4, 3)
        frame = protocol.Append("t", 0, 4, start, 0, lead.log.read(start, 1 << 20))
        assert steps.on_append(old, "a", frame) == lead.log.end_offset == start + 3
        assert old.log.read(start, 1 << 20) == lead.log.read(start, 1 << 20)
        old.log.close()
        reopened = mk(tmp_path / f"old{start}")  # what a restart finds
        assert reopened.epochs() == [(4, start)] and reopened.start_offset == start
        assert reopened.end_offset == start + 3
        reopened.close()


def test_a_follower_behind_the_leaders_log_start_restarts_there(tmp_path: Path) -> None:
    lead = replica(mk(tmp_path / "a"), "a", 1)
    put(lead.log, 1, 40)
    lead.log.truncate_before(30)
    lead.voted_for = "a"
    lead.epoch = 2
    assert steps.win(lead, 2)
    f = replica(mk(tmp_path / "b"), "b", 0)
    put(f.log, 1, 3)
    ack = steps.on_sync(f, "a", sync_of(lead))
    assert isinstance(ack, protocol.FollowerAck) and f.log.start_offset == f.log.end_offset == lead.log.start_offset
    steps.on_append(f, "a", protocol.Append("t", 0, 2, f.log.end_offset, 0, lead.log.read(f.log.end_offset, 1 << 20)))
    assert f.log.end_offset == lead.log.end_offset


def _led_and_followed(tmp_path: Path, n: int = 40) -> tuple[Replica, Replica]:
    """A leader with ``n`` one-record batches, committed, and a follower synced and holding them all."""
    lead = replica(mk(tmp_path / "a"), "a", 1)
    lead.voted_for = "a"
    assert steps.win(lead, 1)
    put(lead.log, 1, n)
    lead.set_durable(n)
    lead.set_follower_end("b", n)
    assert lead.hw == n
    f = replica(mk(tmp_path / "b"), "b", 0)
    steps.on_sync(f, "a", sync_of(lead))
    assert steps.on_append(f, "a", protocol.Append("t", 0, 1, 0, lead.hw, lead.log.read(0, 1 << 20))) == n
    return lead, f


def test_a_follower_takes_its_leaders_log_start_from_an_hw_frame_and_reports_it(tmp_path: Path) -> None:
    lead, f = _led_and_followed(tmp_path)
    assert steps.hw_frame(lead) == protocol.Hw("t", 0, 1, 40, 0)
    lead.log.truncate_before(25)
    kept = max(b for b in f.log.segment_bases() if b <= 25)  # the segment holding offset 25 stays
    frame = steps.hw_frame(lead)
    assert frame.log_start == 25 and steps.start_behind(f, frame)
    ack = steps.on_hw(f, "a", frame)
    assert isinstance(ack, protocol.FollowerAck) and ack.log_start == 25 == f.log.start_offset
    assert kept > 0 and f.log.segment_bases()[0] == kept and not steps.start_behind(f, frame)
    reopened = mk(tmp_path / "b")  # saved: a restarted follower never serves below it
    assert reopened.start_offset == 25
    # From a broker it does not follow, or in an older epoch, nothing moves.
    assert isinstance(steps.on_hw(f, "c", protocol.Hw("t", 0, 1, 40, 30)), protocol.Reject)
    assert isinstance(steps.on_hw(f, "a", protocol.Hw("t", 0, 0, 40, 30)), protocol.Reject)
    assert f.log.start_offset == 25


def test_a_follower_whose_log_ends_below_its_leaders_start_starts_again_there(tmp_path: Path) -> None:
    lead, f = _led_and_followed(tmp_path, 10)
    put(lead.log, 1, 30)
    lead.set_durable(40)
    lead.set_follower_end("c", 40)  # a, c hold 40: committed without b
    lead.log.truncate_before(35)
    ack = steps.on_hw(f, "a", steps.hw_frame(lead))
    assert isinstance(ack, protocol.FollowerAck) and ack.log_start == 35
    assert f.log.start_offset == f.log.end_offset == f.durable == f.hw == 35
    frame = protocol.Append("t", 0, 1, 35, lead.hw, lead.log.read(35, 1 << 20))
    assert steps.on_append(f, "a", frame) == 40


def test_a_leader_moves_up_to_a_followers_later_start_within_its_high_watermark(tmp_path: Path) -> None:
    lead, f = _led_and_followed(tmp_path)
    f.log.truncate_before(30)  # a move this leader missed (it followed someone else then)
    cur = protocol.SendCursor(0.5)
    cur.reset(0.0)
    assert steps.on_answer(lead, cur, "b", steps.ack(f), 0.0) is None
    assert lead.peer_start == 30 and lead.log.start_offset == 0
    lead.hw = 20  # (as if its high watermark were behind: the start never passes it)
    assert steps.lead_start(lead) and lead.log.start_offset == 20
    lead.hw = 40
    assert steps.lead_start(lead) and lead.log.start_offset == 30
    assert not steps.lead_start(lead)


def test_a_vote_is_saved_and_survives_a_reopen(tmp_path: Path) -> None:
    rep = replica(mk(tmp_path / "a"), "b", 3)
    from ring.replication import election

    r = steps.on_vote_request(rep, election.VoteRequest("t", 0, 4, "a", -1, 0), leader_alive=False)
    assert r.granted and rep.ballot == election.Ballot(4, "a")
    assert state.load_state(tmp_path / "a") == (election.Ballot(4, "a"), ["a", "b", "c"], None)
    r = steps.on_vote_request(rep, election.VoteRequest("t", 0, 4, "c", -1, 0), leader_alive=False)
    assert not r.granted and r.reason == election.ALREADY_VOTED


def test_a_replica_cut_back_for_repair_votes_as_if_it_still_held_what_it_acknowledged(tmp_path: Path) -> None:
    """Else a follower cut for repair could grant its vote to a candidate missing batches its own ack
    committed, and they would be lost (the simulation's bit flips find that)."""
    from ring.replication import election

    log = mk(tmp_path / "b")
    put(log, 1, 40)
    rep = replica(log, "b", 1)
    rep.damaged_at = 38
    assert steps.cut_damaged(rep) and rep.log.end_offset == 38 and rep.vouched == (1, 40)
    short = election.VoteRequest("t", 0, 2, "c", 1, rep.log.end_offset)
    r = steps.on_vote_request(rep, short, leader_alive=False)
    assert not r.granted and r.reason == election.BEHIND
    _, _, vouched = state.load_state(tmp_path / "b")
    assert vouched == (1, 40)
    log.close()
    again = replica(mk(tmp_path / "b"), "b", 1)
    steps.restore(again, clean=True)
    assert again.vouched == (1, 40) and not again.caught_up  # a crash in between forgets nothing
    r = steps.on_vote_request(again, election.VoteRequest("t", 0, 3, "a", 1, 40), leader_alive=False)
    assert r.granted  # a candidate holding it all
    put(again.log, 1, 40 - again.log.end_offset)
    steps._progress(again)
    assert again.vouched is None and state.load_state(tmp_path / "b")[2] is None
    again.log.close()


def flip_payload_bit(directory: Path, offset: int) -> None:
    """One payload bit of the batch at ``offset`` in the last segment, as a failing disk would."""
    seg = sorted(directory.glob("*.log"))[-1]
    raw = seg.read_bytes()
    pos = next(p for h, p in B.scan(raw) if h.base_offset == offset)
    with open(seg, "r+b") as f:
        f.seek(pos + B.HEADER_SIZE + 2)
        f.write(bytes([raw[pos + B.HEADER_SIZE + 2] ^ 0x04]))


def test_damage_inside_the_log_found_by_recovery_is_kept_and_its_votes_count_it(tmp_path: Path) -> None:
    """A bit flipped in an acknowledged batch followed by whole ones, then a crash: recovery keeps the log
    (nothing is cut, nothing vouched for), marks the replica damaged at that batch, and its votes count
    every batch it holds (a candidate missing a write this replica acknowledged loses: the simulation's
    seed 1350)."""
    from ring.replication import election

    log = mk(tmp_path / "b", segment_bytes=1 << 20)
    put(log, 1, 40)
    log.sync()
    flip_payload_bit(tmp_path / "b", 30)
    log.abandon()
    rep = replica(mk(tmp_path / "b", segment_bytes=1 << 20), "b", 1)
    assert rep.log.end_offset == 40 and rep.log.recovered_damage == 30
    assert recovery.damaged_key(tmp_path / "b") is None
    steps.restore(rep, clean=False)
    assert rep.damaged_at == 30 and rep.vouched is None and rep.key == (1, 40) and not rep.caught_up
    r = steps.on_vote_request(rep, election.VoteRequest("t", 0, 2, "c", 1, 35), leader_alive=False)
    assert not r.granted and r.reason == election.BEHIND
    with pytest.raises(StorageError):
        rep.log.read(30, 1)  # never handed out
    assert rep.log.read(31, 1 << 20) and first_damaged(rep) == 30
    rep.log.close()


@pytest.mark.parametrize("byte", [5, 7, 11], ids=["base-offset", "base-offset-low", "leader-epoch"])
def test_a_flip_in_a_header_field_the_crc_skips_is_damage_too(tmp_path: Path, byte: int) -> None:
    """The CRC leaves out the base offset and the epoch (a leader stamps them in place): a bit flipped
    there, with whole batches after it, is damage inside the log, kept and marked as a payload flip is,
    not a torn tail that takes every acknowledged batch after it without a word."""
    log = mk(tmp_path / "b", segment_bytes=1 << 20)
    put(log, 1, 40)
    log.sync()
    seg = sorted((tmp_path / "b").glob("*.log"))[-1]
    raw = seg.read_bytes()
    pos = next(p for h, p in B.scan(raw) if h.base_offset == 30)
    with open(seg, "r+b") as f:
        f.seek(pos + byte)
        f.write(bytes([raw[pos + byte] ^ 0x01]))
    log.abandon()
    rep = replica(mk(tmp_path / "b", segment_bytes=1 << 20), "b", 1)
    assert rep.log.end_offset == 40 and recovery.damaged_key(tmp_path / "b") is None
    steps.restore(rep, clean=False)
    assert rep.damaged_at == 30 and rep.vouched is None
    rep.log.close()


def test_a_torn_tail_is_cut_and_vouches_for_nothing(tmp_path: Path) -> None:
    log = mk(tmp_path / "b", segment_bytes=1 << 20)
    put(log, 1, 10)
    log.abandon()
    seg = sorted((tmp_path / "b").glob("*.log"))[-1]
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 5)
    rep = replica(mk(tmp_path / "b", segment_bytes=1 << 20), "b", 1)
    steps.restore(rep, clean=False)
    assert rep.log.end_offset == 9 and rep.vouched is None and recovery.damaged_key(tmp_path / "b") is None


def test_a_damaged_last_batch_below_a_begun_epoch_is_vouched_for_with_that_epoch(tmp_path: Path) -> None:
    """Nothing whole follows the bad batch, but an epoch begun after it (only over a synced log) says it
    was durable: vouched for as (that epoch, its end), and the cut log does not claim that epoch (its key
    would rank above a voter holding the batch: the simulation's seed 1567). With no such epoch the same
    bad last batch is a torn tail."""
    log = mk(tmp_path / "b", segment_bytes=1 << 20)
    put(log, 1, 4)
    log.sync()
    log.begin_epoch(2)
    flip_payload_bit(tmp_path / "b", 3)
    log.abandon()
    rep = replica(mk(tmp_path / "b", segment_bytes=1 << 20), "b", 2)
    steps.restore(rep, clean=False)
    assert rep.log.end_offset == 3 and rep.key == (1, 3) and rep.vouched == (2, 4)
    rep.log.close()

    log = mk(tmp_path / "c", segment_bytes=1 << 20)
    put(log, 1, 4)
    flip_payload_bit(tmp_path / "c", 3)
    log.abandon()
    rep = replica(mk(tmp_path / "c", segment_bytes=1 << 20), "c", 1)
    steps.restore(rep, clean=False)
    assert rep.log.end_offset == 3 and rep.vouched is None
    rep.log.close()


# -- anti-entropy --------------------------------------------------------------------------


def test_checksums_find_a_flipped_bit_and_say_who_holds_it(tmp_path: Path) -> None:
    a, b = mk(tmp_path / "a"), mk(tmp_path / "b")
    put(a, 1, 60)
    b.append_replicated(a.read(0, 1 << 20))
    assert a.segment_bases() == b.segment_bases() and len(a.segment_bases()) > 3
    spans = entropy.leader_ranges(a.segment_bases(), a.start_offset, a.end_offset, 100)
    assert spans[0][0] == 0 and spans[-1][1] == a.end_offset
    assert entropy.leader_ranges(a.segment_bases(), 0, a.end_offset, 2) == spans[-2:]
    sums_a = entropy.range_sums(a.read, spans, a.start_offset, a.end_offset, 300)
    sums_b = entropy.range_sums(b.read, spans, b.start_offset, b.end_offset, 300)
    assert sums_a == sums_b and all(r.digest for r in sums_a)
    assert entropy.plan(sums_a, sums_b) == entropy.Plan(checked=len(spans))
    # flip a bit in b's second segment
    b.close()
    seg = sorted((tmp_path / "b").glob("*.log"))[1]
    raw = bytearray(seg.read_bytes())
    raw[40] ^= 0x10
    seg.write_bytes(bytes(raw))
    b = mk(tmp_path / "b")
    sums_b = entropy.range_sums(b.read, spans, b.start_offset, b.end_offset, 300)
    assert sums_b[1].digest is None and sums_b[0] == sums_a[0]
    assert entropy.plan(sums_a, sums_b).truncate_at == spans[1][0]
    assert entropy.plan(sums_b, sums_a).leader_damaged_at == spans[1][0]  # the other way round
    assert entropy.sums_from_wire([r.to_wire() for r in sums_b], 100) == sums_b


def test_malformed_checksum_lists_are_refused() -> None:
    import pytest

    for bad in ({}, [[0, 0, None]], [[0, 5, "short"]], [[0, 5]], [["0", 5, None]], [[0, 1, None]] * 3):
        with pytest.raises(ValueError):
            entropy.sums_from_wire(bad, 2)


def test_a_missing_segment_shows_as_an_unreadable_range(tmp_path: Path) -> None:
    a = mk(tmp_path / "a")
    put(a, 1, 60)
    bases = a.segment_bases()
    a.close()
    sorted((tmp_path / "a").glob("*.log"))[2].unlink()  # a segment lost on disk
    a = mk(tmp_path / "a")
    spans = entropy.leader_ranges(bases, 0, a.end_offset, 100)
    sums = entropy.range_sums(a.read, spans, a.start_offset, a.end_offset, 300)
    assert [r.digest is None for r in sums] == [i == 2 for i in range(len(spans))]
    healthy = [entropy.RangeSum(r.base, r.end, r.digest or "0" * entropy.DIGEST_HEX) for r in sums]
    assert entropy.plan(healthy, sums).truncate_at == spans[2][0]  # refetched from there


def test_remembered_digests_equal_whole_reads_and_read_only_new_bytes(tmp_path: Path) -> None:
    a = mk(tmp_path / "a", segment_bytes=1 << 20)  # one segment: its range grows round after round
    put(a, 1, 40)
    digests = entropy.Digests(reread_s=100.0)
    reads: list[int] = []

    def counting_read(offset: int, max_bytes: int, upto: int) -> bytes:
        reads.append(offset)
        return a.read(offset, max_bytes, upto)

    def digest(end: int, now_s: float) -> entropy.RangeSum:
        hasher = digests.hasher(0, end, now_s)
        while not hasher.step(counting_read, 300):
            pass
        digests.done(hasher)
        assert hasher.result is not None
        return hasher.result

    first = digest(a.end_offset, 0.0)
    assert first == entropy.range_sum(a.read, 0, 40, 300) and first.digest
    put(a, 1, 20)
    reads.clear()
    grown = digest(a.end_offset, 1.0)
    assert grown == entropy.range_sum(a.read, 0, 60, 300)  # resumed at 40: the same digest as a whole read
    assert min(reads) == 40 and digests.bytes_skipped == 40
    assert digest(50, 2.0) == entropy.range_sum(a.read, 0, 50, 300)  # an end between two marks
    reads.clear()
    assert digest(60, 200.0) == grown and min(reads) == 0  # too old to trust: read whole again


def test_a_flipped_bit_under_a_remembered_digest_is_found_by_the_reread(tmp_path: Path) -> None:
    a = mk(tmp_path / "a")
    put(a, 1, 60)
    rep = Replica("t", 0, a, "a")
    digests = entropy.Digests(reread_s=10.0)
    spans = entropy.leader_ranges(a.segment_bases(), a.start_offset, a.end_offset, 100)

    def round_at(now_s: float) -> list[entropy.RangeSum]:
        out = []
        for base, end in spans:
            hasher = digests.hasher(base, end, now_s)
            while not hasher.step(rep.log.read, 300):
                pass
            digests.done(hasher)
            out.append(hasher.result)
        return out

    healthy = round_at(0.0)
    a.close()
    seg = sorted((tmp_path / "a").glob("*.log"))[1]
    raw = bytearray(seg.read_bytes())
    raw[60] ^= 0x10  # a payload byte of the segment's first batch
    seg.write_bytes(bytes(raw))
    rep.log = a = mk(tmp_path / "a")
    assert round_at(5.0) == healthy  # remembered: not read again yet
    damaged = round_at(11.0)
    assert damaged[1].digest is None and damaged[0] == healthy[0]
    assert entropy.plan(healthy, damaged).truncate_at == spans[1][0]


def test_digests_tell_diverged_copies_apart_and_go_when_the_log_is_cut(tmp_path: Path) -> None:
    a, b = mk(tmp_path / "a"), mk(tmp_path / "b")
    put(a, 1, 30)
    b.append_replicated(a.read(0, 1 << 20, 20))
    put(a, 1, 10, tag="x")
    put(b, 2, 10, tag="y")  # same offsets 20..29, other batches: a follower that led alone for a while
    spans = entropy.leader_ranges(a.segment_bases(), 0, 30, 100)
    sums_a = entropy.range_sums(a.read, spans, 0, 30, 300)
    sums_b = entropy.range_sums(b.read, spans, 0, 30, 300)
    plan = entropy.plan(sums_a, sums_b)
    assert plan.truncate_at is not None and plan.truncate_at <= 20 < max(e for _, e in spans)
    rep = Replica("t", 0, b, "b")
    rep.sums = entropy.Digests(10.0)
    b.truncate_after(19)
    rep.truncated()
    assert rep.sums is None  # what was remembered described bytes that are gone


# -- mending a damaged batch in place ---------------------------------------------------------


def flip_at(directory: Path, offset: int, byte: int) -> None:
    """Flip one bit of byte ``byte`` of the stored batch at ``offset`` (in whichever segment holds it)."""
    for seg in sorted(directory.glob("*.log")):
        raw = seg.read_bytes()
        pos = next((p for h, p in B.scan(raw, verify=False) if h.base_offset == offset), None)
        if pos is not None:
            with open(seg, "r+b") as f:
                f.seek(pos + byte)
                f.write(bytes([raw[pos + byte] ^ 0x04]))
            return
    raise AssertionError(f"no batch at {offset}")


def first_damaged(rep: Replica) -> int | None:
    offset, bad = rep.log.start_offset, False
    while not bad and offset < rep.log.end_offset:
        offset, bad = mend.scan(rep, offset)
    return offset if bad else None


@pytest.mark.parametrize("byte", [B.HEADER_SIZE + 2, 5, 11], ids=["payload", "base-offset", "leader-epoch"])
def test_two_replicas_damaged_in_different_batches_mend_each_other_in_place(tmp_path: Path, byte: int) -> None:
    """Bits flip in two replicas, each in a different batch: each mends its batch from the other's whole
    copy and keeps every batch above it (a cut there would drop the only whole copy of the other's damaged
    batch: the simulation's seeds 3271 and 3660)."""
    a, b = mk(tmp_path / "a"), mk(tmp_path / "b")
    put(a, 1, 20)
    put(a, 2, 20)
    b.append_replicated(a.read(0, 1 << 20))
    assert len(b.segment_bases()) > 2
    a.sync(), b.sync()
    whole = a.read(0, 1 << 20)
    flip_at(tmp_path / "a", 25, byte)
    flip_at(tmp_path / "b", 10, byte)
    ra, rb = replica(a, "a", 2), replica(b, "b", 2)
    assert (first_damaged(ra), first_damaged(rb)) == (25, 10)
    wrong = a.read(11, 1)  # a whole batch, but not the damaged one
    assert not mend.put(rb, 10, wrong) and first_damaged(rb) == 10
    assert not mend.put(rb, 10, bytearray()) and first_damaged(rb) == 10
    for rep, other, at in ((rb, ra, 10), (ra, rb, 25)):
        copy = bytes(other.log.read(at, 1))
        torn = bytearray(copy)
        torn[-1] ^= 1
        assert not mend.put(rep, at, bytes(torn)) and first_damaged(rep) == at  # not whole: nothing written
        assert mend.put(rep, at, copy) and first_damaged(rep) is None
    assert a.end_offset == b.end_offset == 40
    assert a.read(0, 1 << 20) == b.read(0, 1 << 20) == whole
    a.close(), b.close()
    for name in ("a", "b"):  # and so it is on disk: a reopened log recovers all of it
        again = mk(tmp_path / name)
        assert again.end_offset == 40 and again.read(0, 1 << 20) == whole
        again.close()


def test_a_copy_of_another_epoch_is_refused(tmp_path: Path) -> None:
    """The same offsets written in another epoch are another batch: never written over this one."""
    a, b = mk(tmp_path / "a"), mk(tmp_path / "b")
    put(a, 1, 10)
    put(b, 1, 5)
    put(b, 3, 5)
    flip_at(tmp_path / "a", 7, B.HEADER_SIZE + 2)
    ra = replica(a, "a", 3)
    assert first_damaged(ra) == 7
    assert not mend.put(ra, 7, bytes(b.read(7, 1))) and first_damaged(ra) == 7
    a.close(), b.close()


@pytest.mark.parametrize("byte", [B.HEADER_SIZE + 2, 5, 11, 15, 12, 17],
                         ids=["payload", "base-offset", "leader-epoch", "length", "length-high", "crc"])
@pytest.mark.parametrize("segment_bytes", [1 << 20, 1024], ids=["one-segment", "many-segments"])
def test_damage_recovery_finds_inside_the_log_is_kept_and_mended_not_cut(tmp_path: Path, byte: int,
                                                                         segment_bytes: int) -> None:
    """Bits flip in two replicas, each in a different batch, then one crashes and recovers: its batches above
    its damaged one stay (they hold the only whole copy of the other's damaged batch), it is marked damaged
    there, and the two mend each other in place: every batch survives."""
    a, b = mk(tmp_path / "a", segment_bytes), mk(tmp_path / "b", segment_bytes)
    put(a, 1, 20)
    put(a, 2, 20)
    b.append_replicated(a.read(0, 1 << 20))
    a.sync()
    whole = a.read(0, 1 << 20)
    flip_at(tmp_path / "a", 25, byte)
    flip_at(tmp_path / "b", 10, byte)
    b.abandon()  # a crash: nothing of b was synced, recovery walks every segment
    rb = replica(mk(tmp_path / "b", segment_bytes), "b", 2)
    steps.restore(rb, clean=False)
    assert rb.log.end_offset == 40 and rb.damaged_at == 10 and rb.vouched is None and not rb.caught_up
    assert recovery.damaged_key(tmp_path / "b") is None
    ra = replica(a, "a", 2)
    assert (first_damaged(ra), first_damaged(rb)) == (25, 10)
    for rep, other, at in ((rb, ra, 10), (ra, rb, 25)):
        assert mend.put(rep, at, bytes(other.log.read(at, 1))) and first_damaged(rep) is None
    assert a.read(0, 1 << 20) == rb.log.read(0, 1 << 20) == whole
    a.close(), rb.log.close()


@pytest.mark.parametrize("flips", [{25: 0x04}, {15: 0x0C}, {20: 0x04}],
                         ids=["record-count", "length-two-bits", "magic"])
def test_a_bad_batch_the_walk_cannot_step_past_is_cut_there(tmp_path: Path, flips: dict[int, int]) -> None:
    """A flipped record count, magic, or a length more than one bit off leads nowhere whole: nothing tells
    where the log goes on after that batch, nor damage from a torn tail, so recovery cuts there (and,
    with no epoch begun after it, vouches for nothing)."""
    log = mk(tmp_path / "b", segment_bytes=1 << 20)
    put(log, 1, 40)
    log.sync()
    seg = sorted((tmp_path / "b").glob("*.log"))[-1]
    raw = bytearray(seg.read_bytes())
    pos = next(p for h, p in B.scan(bytes(raw)) if h.base_offset == 30)
    for byte, mask in flips.items():
        raw[pos + byte] ^= mask
    seg.write_bytes(bytes(raw))
    log.abandon()
    rep = replica(mk(tmp_path / "b", segment_bytes=1 << 20), "b", 1)
    steps.restore(rep, clean=False)
    assert rep.log.end_offset == 30 and rep.damaged_at is None and rep.vouched is None
    assert rep.log.read(0, 1 << 20) == bytes(raw[:pos])
    rep.log.close()


def test_damage_a_sync_cut_away_leaves_nothing_to_mend_or_cut(tmp_path: Path) -> None:
    """A replica marked damaged whose damaged batch a new leader's sync then cut off has nothing left to
    mend or to cut (waiting to refetch up to its old end would wait forever on an idle partition)."""
    a = mk(tmp_path / "a", 1 << 20)
    put(a, 1, 40)
    a.sync()
    flip_at(tmp_path / "a", 30, 0x20)
    a.abandon()
    rep = replica(mk(tmp_path / "a", 1 << 20), "a", 1)
    steps.restore(rep, clean=False)
    assert rep.damaged_at == 30 and not mend.cut_away(rep)
    rep.log.truncate_after(20)  # the divergence cut of a new leader's sync
    assert mend.cut_away(rep)
    rep.log.close()
