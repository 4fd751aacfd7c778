"""What a replica does with each replication or election message, as synchronous steps on a ``Replica``.

The decisions are the pure functions of ``protocol``, ``election`` and
``ring.replication.divergence``; these steps apply them to a replica and its log
(truncating, appending, persisting the ballot) in the order safety needs:
the ballot is saved before any answer that depends on it, and a follower
cuts its log back to where it agrees with its leader before it acknowledges
anything in the leader's epoch. They never await: the node core
(``ring.node``) calls them, in the broker and in the simulation (tests/sim)
alike. A caller must not run a step beside an
fsync of the same log (``GroupCommit.idle`` first).

The ballot, the voter set and each voter's incarnation as recorded are saved
in ``replica-state`` (``ring.replication.state``). A record absent (a new
partition, or a file an older release wrote) is learned from the voter's
first vote or ack; once recorded, a voter answering from another incarnation
lost its state (``election.Tally``, ``note_incarnation``).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging

from ring import limits
from ring.errors import BadRequest, RequestTimeout, StorageError
from ring.log import batch as batchfmt
from ring.log import recovery
from ring.replication.divergence import divergence_point
from ring.replication import election, protocol
from ring.replication.replica import Replica
from ring.replication.state import load_full_state, save_state

log = logging.getLogger("ring.replication")

# --- opening and closing a replica -----------------------------------------------------------


def restore(rep: Replica, clean: bool, lost: bool = False) -> None:
    """A clustered replica as it opens: its saved ballot and voters, no leader (elected, never assumed:
    it may have lost a tail or missed an election), not caught up after an unclean shutdown, nor while
    a repair has not brought back what it vouched for; damaged where recovery kept a damaged batch.
    ``lost``: the broker knows this partition held state here that its data directory lost (a new
    directory, the partition older than it): with no saved state, and other voters, it is ``blank``."""
    saved = load_full_state(rep.log.directory)
    ballot, voters, vouched = saved.ballot, saved.voters, saved.vouched
    rep.epoch, rep.voted_for = ballot.epoch, ballot.voted_for
    rep.voters = voters if voters else list(rep.replicas)
    rep.incarnations = {v: i for v, i in saved.incarnations.items() if v != rep.self_name}
    if rep.incarnation:
        rep.incarnations[rep.self_name] = rep.incarnation
    # (A partition this replica alone votes for has nobody to catch up from and no other vote to
    # protect: what its directory lost is lost, and it leads what is left.)
    rep.unclean_history = list(saved.unclean)
    rep.blank = (saved.blank or lost and voters is None) and rep.voters != [rep.self_name]
    if rep.blank and not saved.blank:
        save_state(rep)  # (so it stays blank if it restarts before it caught up)
    # Recovery cut damage inside the log (not a torn tail): what it took may have been acknowledged,
    # so it is vouched for as after a repair's cut (saved with the ballot before the log forgets it).
    lost = recovery.damaged_key(rep.log.directory)
    if lost is not None and (vouched is None or vouched < lost):
        vouched = lost
    rep.vouched = vouched if vouched is not None and rep.key < vouched else None
    if lost is not None:
        save_state(rep)
        recovery.forget_damaged_key(rep.log.directory)
    rep.leader = None
    rep.aligned = False
    rep.caught_up = clean and rep.vouched is None and not rep.blank
    # Damage recovery kept inside the log (whole batches follow it): never served from here, mended in
    # place from another replica's copy (the broker steps ``Damaged`` once it runs).
    rep.damaged_at = rep.log.recovered_damage


def close(rep: Replica, exc: BaseException) -> None:
    """The replica leaves this broker (deleted, or placed elsewhere): nothing more is served or
    acknowledged from it; produces waiting on it get ``exc``."""
    rep.deleted = True
    rep.wake()
    rep.fail_waiters(exc)


def stepped_down(rep: Replica, epoch: int) -> RequestTimeout:
    return RequestTimeout(
        f"{rep.self_name} stopped leading {rep.topic}/{rep.index} (epoch {epoch} began elsewhere) before enough "
        "replicas acknowledged; the outcome is unknown", topic=rep.topic, partition=rep.index)


def adopt_epoch(rep: Replica, epoch: int, leader: str | None = None) -> bool:
    """Move to a newer epoch (saved); a leader steps down. Returns whether anything changed."""
    if epoch <= rep.epoch:
        return False
    was_leader = rep.is_leader
    rep.epoch, rep.voted_for = epoch, None
    save_state(rep)
    rep.unlead(leader, stepped_down(rep, epoch))
    if was_leader:
        log.warning("%s/%d: %s steps down, epoch %d began", rep.topic, rep.index, rep.self_name, epoch)
    return True


# --- the follower ----------------------------------------------------------------------------


def following(rep: Replica, sender: str, epoch: int) -> bool:
    return not rep.is_leader and rep.leader == sender and rep.epoch == epoch and rep.aligned


def _reject(rep: Replica | None, topic: str, partition: int, epoch: int, reason: str) -> protocol.Reject:
    if rep is None:
        return protocol.Reject(topic, partition, epoch, -1, reason)
    return protocol.Reject(topic, partition, rep.epoch, rep.log.end_offset, reason)


def on_sync(rep: Replica, sender: str, frame: protocol.Sync) -> protocol.Frame:
    """Follow ``sender`` in the frame's epoch: cut the log where it diverges from the leader's, ack."""
    verdict = protocol.judge_sync(rep.epoch, rep.leader, sender, frame.epoch)
    if verdict is not None:
        return _reject(rep, frame.topic, frame.partition, frame.epoch, verdict)
    adopt_epoch(rep, frame.epoch)
    rep.leader = sender
    known = _known_from(rep, frame.incarnations)
    if list(frame.voters) != rep.voters or known != rep.incarnations:
        if list(frame.voters) != rep.voters:
            rep.set_voters(list(frame.voters), frame.voters_seq)
        rep.incarnations = known
        save_state(rep)
    rep.voters_seq = frame.voters_seq
    rep.lost_state = frozenset()
    cut = divergence_point(rep.log.epochs(), rep.log.end_offset, frame.history, frame.log_end)
    if cut < rep.log.end_offset:
        log.warning("%s/%d: dropping offsets %d-%d, which diverge from leader %s (epoch %d)", rep.topic,
                    rep.index, cut, rep.log.end_offset - 1, sender, frame.epoch)
        rep.log.truncate_after(cut)
        rep.truncated()
    _drop_stray_epoch(rep, frame)
    follow_start(rep, frame.log_start)
    rep.epoch_start = frame.epoch_start
    rep.aligned = rep.synced = True
    if not rep.caught_up:
        rep.catch_up_to = frame.log_end
    _progress(rep)
    rep.set_leader_hw(frame.hw)
    return ack(rep)


def _known_from(rep: Replica, sent: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The voters' incarnations a follower keeps after its leader's sync: ours, where the leader's record
    (none from an older leader) says otherwise the leader's, and its own directory's, which it knows
    better."""
    known = {v: i for v, i in rep.incarnations.items() if v in rep.voters}
    known.update(sent)
    if rep.incarnation:
        known[rep.self_name] = rep.incarnation
    return known


def ack(rep: Replica) -> protocol.FollowerAck:
    """A follower's answer: its durable end, its log start offset and its incarnation."""
    return protocol.FollowerAck(rep.topic, rep.index, rep.epoch, rep.durable, rep.log.start_offset, rep.voters_seq,
                        rep.incarnation)


def follow_start(rep: Replica, log_start: int) -> bool:
    """Move a follower's log start offset up to its leader's (never down); whether it moved.

    The leader moves its start only within its high watermark, so the
    offsets dropped here are committed ones the partition has deleted. A
    log that ends below it holds nothing the partition still has: it starts
    again, empty, there. The new start is on disk before any file goes, so a
    restarted follower never serves below it. A caller must not run this
    beside an fsync of the log (``GroupCommit.idle`` first).
    """
    if log_start <= rep.log.start_offset:
        return False
    if log_start <= rep.log.end_offset:
        rep.log.truncate_before(log_start)
        log.debug("%s/%d: log start moves to %d, as the leader's", rep.topic, rep.index, log_start)
    else:
        log.info("%s/%d: the leader's log starts at %d, past all this replica holds (up to %d): starting again there",
                 rep.topic, rep.index, log_start, rep.log.end_offset)
        rep.log.restart_at(log_start)  # synced: durable at once
        rep.truncated()
        rep.set_durable(rep.log.end_offset)
        rep.refresh()
    return True


def start_behind(rep: Replica, frame: protocol.Sync | protocol.Hw) -> bool:
    """Whether the frame moves this replica's log start (the caller first waits for a running fsync)."""
    return frame.log_start > rep.log.start_offset


def _drop_stray_epoch(rep: Replica, frame: protocol.Sync) -> None:
    """An epoch our history begins at our log end, with no batch of it, where the leader's history has no
    such entry (recovery after a crash moves the newest epoch back to where the surviving data ends):
    the leader's batches from here are of older epochs, and the log would refuse them. Cut back one batch
    (the cut takes the entry with it), so we refetch from there."""
    hist, end = rep.log.epochs(), rep.log.end_offset
    if not hist or hist[-1][1] < end or hist[-1] in frame.history:
        return
    log.warning("%s/%d: epoch %d is recorded at offset %d with no batch, unlike leader's history; refetching "
                "the last batch", rep.topic, rep.index, hist[-1][0], end)
    if end > rep.log.start_offset:
        rep.log.truncate_after(end - 1)
    else:  # an empty log (every empty partition, when its leader changes): no batch to refetch
        rep.log.forget_epochs_at_end()
    rep.truncated()


def _progress(rep: Replica) -> None:
    """After the log grew or was aligned: begin the leader's epoch where it began; note catching up."""
    end = rep.log.end_offset
    if end == rep.epoch_start and rep.log.latest_epoch < rep.epoch:
        rep.log.sync()  # the history never claims an epoch over data a power loss could take back
        rep.log.begin_epoch(rep.epoch)
    if not rep.caught_up and rep.catch_up_to is not None and end >= rep.catch_up_to:
        rep.caught_up = True
        if rep.blank:
            rep.blank = False  # it holds what a leader elected without it held: it may vote again
            save_state(rep)
        log.info("%s/%d caught up with leader %s at offset %d", rep.topic, rep.index, rep.leader, end)
    if rep.vouched is not None and rep.key >= rep.vouched:
        rep.vouched = None  # it holds what it vouched for again (or a newer leader's log past it)
        save_state(rep)


def on_append(rep: Replica, sender: str, frame: protocol.Append) -> protocol.Reject | int:
    """Append the leader's batches; the new log end, or the reject to send."""
    verdict = protocol.judge_append(rep.epoch, rep.log.end_offset, following(rep, sender, frame.epoch),
                                    frame.epoch, frame.prev_end)
    if verdict is not None:
        return _reject(rep, frame.topic, frame.partition, frame.epoch, verdict)
    if frame.data and batchfmt.read_header(frame.data).leader_epoch > rep.log.latest_epoch:
        # A new epoch starts here: what precedes it is synced before the history records the epoch, so a
        # power loss never leaves the history claiming an epoch over data it took back (recovery keeps the
        # newest epoch, at the end of what survived). Frames never span epochs (``frame_upto``).
        rep.log.sync()
    end = rep.log.append_replicated(frame.data)  # CorruptBatch / Conflict / StorageError: the caller rejects
    _progress(rep)
    rep.set_leader_hw(frame.hw)
    return end


def on_hw(rep: Replica, sender: str, frame: protocol.Hw) -> protocol.Frame:
    if frame.epoch < rep.epoch:
        return _reject(rep, frame.topic, frame.partition, frame.epoch, protocol.STALE_EPOCH)
    if not following(rep, sender, frame.epoch):
        return _reject(rep, frame.topic, frame.partition, frame.epoch, protocol.NOT_FOLLOWER)
    rep.set_leader_hw(frame.hw)
    follow_start(rep, frame.log_start)
    return ack(rep)


def reject_unknown(topic: str, partition: int, epoch: int) -> protocol.Reject:
    return _reject(None, topic, partition, epoch, protocol.UNKNOWN_PARTITION)


def reject_storage(rep: Replica, epoch: int) -> protocol.Reject:
    return _reject(rep, rep.topic, rep.index, epoch, protocol.STORAGE)


# --- the leader ------------------------------------------------------------------------------


def append_as_leader(rep: Replica, batches: list[bytearray]) -> tuple[int, int]:
    """Stamp and append a produce's batches (decoded and CRC-checked, or built by this broker) in
    this leader's epoch: (base offset, end offset)."""
    base = rep.log.end_offset
    for b in batches:
        rep.log.append(b, rep.epoch, checked=True)
    return base, rep.log.end_offset


def frame_upto(rep: Replica, prev: int) -> int | None:
    """Where an append frame starting at ``prev`` must end: the next epoch's first offset (None: anywhere)."""
    starts = [s for _, s in rep.log.epochs()]
    i = bisect.bisect_right(starts, prev)
    return starts[i] if i < len(starts) else None


def hw_frame(rep: Replica) -> protocol.Hw:
    assert rep.is_leader
    return protocol.Hw(rep.topic, rep.index, rep.epoch, rep.hw, rep.log.start_offset)


def lead_start(rep: Replica) -> bool:
    """A leader moves its log start up to the largest one a follower reported (a move this replica
    missed while it followed), within its high watermark; whether it moved. Not beside an fsync."""
    target = min(rep.peer_start, rep.hw)
    if not rep.is_leader or target <= rep.log.start_offset:
        return False
    log.info("%s/%d: a follower's log starts at %d, past ours (%d): moving up to %d", rep.topic, rep.index,
             rep.peer_start, rep.log.start_offset, target)
    rep.log.truncate_before(target)
    return True


def sync_frame(rep: Replica) -> protocol.Sync:
    assert rep.is_leader
    history = tuple(rep.log.epochs()[-limits.LEADER_EPOCHS_SENT_MAX:])
    incarnations = tuple((v, rep.incarnations[v]) for v in rep.voters if v in rep.incarnations)
    return protocol.Sync(rep.topic, rep.index, rep.epoch, rep.hw, rep.epoch_start, rep.log.start_offset,
                         rep.log.end_offset, history, tuple(rep.voters), rep.voters_seq, incarnations)


def on_answer(rep: Replica, cursor: protocol.SendCursor, follower: str, frame: protocol.Frame,
              now_s: float) -> int | None:
    """A follower's ack or reject, applied to its cursor and to the replica; returns a newer epoch
    the follower is in (the caller steps this leader down), else None."""
    if isinstance(frame, protocol.FollowerAck):
        if frame.epoch == rep.epoch:
            cursor.on_ack(frame.end_offset, rep.log.end_offset)
            rep.set_follower_end(follower, frame.end_offset)
            if frame.voters_seq == rep.voters_seq:
                if follower in rep.voters:
                    rep.voters_known.add(follower)  # it holds our current voter set
                rep.leaving.discard(follower)  # it knows it left (and closes its replica)
            rep.peer_start = max(rep.peer_start, frame.log_start)  # ``lead_start`` catches up with it
            rep.set_follower_start(follower, frame.log_start)  # truncates wait for a majority's
        return None
    if isinstance(frame, protocol.Reject):
        if frame.reason == protocol.UNKNOWN_PARTITION:
            rep.leaving.discard(follower)  # it closed its replica already
        if frame.epoch > rep.epoch and frame.reason in (protocol.STALE_EPOCH, protocol.NOT_FOLLOWER):
            return frame.epoch
        cursor.on_reject(frame.end_offset, frame.reason, rep.log.end_offset, now_s)
        return None
    raise BadRequest(f"{follower} sent a leader's frame")


def note_incarnation(rep: Replica, follower: str, frame: protocol.Frame) -> bool:
    """Leader: a follower's ack names its incarnation. Unrecorded: learn it. Another than recorded: the
    follower lost its state; it is ``renewed`` (what it acknowledged from its old directory is
    forgotten, and it counts for nothing) until it holds everything committed in this epoch (where
    ``placement.next_voters`` admits a new replica), then recorded with its new incarnation. Whether
    the record changed (saved here; the caller syncs the followers again, so they keep the same
    record). The caller steps it before the ack is counted (so a renewed follower's end never counts)
    and after (so it is admitted on the ack that fills it)."""
    if not isinstance(frame, protocol.FollowerAck) or not frame.incarnation or frame.epoch != rep.epoch \
            or follower not in rep.voters:
        return False
    recorded = rep.incarnations.get(follower)
    if recorded == frame.incarnation:
        return False
    if recorded is not None:
        if rep.renewed.get(follower) != frame.incarnation:
            rep.renewed[follower] = frame.incarnation
            rep.follower_ends.pop(follower, None)  # acknowledged by a directory that is gone
            rep.follower_starts.pop(follower, None)
            log.warning("%s/%d: %s answers from a new data directory (incarnation %s, was %s): it lost its "
                        "state, and counts for nothing until it has caught up", rep.topic, rep.index, follower,
                        frame.incarnation, recorded)
            rep.refresh()
            return False
        if rep.follower_ends.get(follower, -1) < max(rep.hw, rep.epoch_start):
            return False
        log.info("%s/%d: %s caught up from its new data directory (incarnation %s): a voter again", rep.topic,
                 rep.index, follower, frame.incarnation)
    rep.renewed.pop(follower, None)
    rep.incarnations[follower] = frame.incarnation
    save_state(rep)
    rep.refresh()
    return True


# --- elections -------------------------------------------------------------------------------


def vote_request(rep: Replica, pre: bool, transfer: bool = False) -> election.VoteRequest:
    """The request of a candidacy round. A real round first moves to the next epoch and votes for
    itself, saved before any request leaves."""
    if not pre:
        epoch = rep.epoch + 1
        was_leader = rep.is_leader
        rep.epoch, rep.voted_for = epoch, rep.self_name
        save_state(rep)
        rep.unlead(None, stepped_down(rep, epoch))
        if was_leader:
            log.info("%s/%d: %s stands again for epoch %d", rep.topic, rep.index, rep.self_name, epoch)
    if rep.incarnation and rep.incarnations.get(rep.self_name) != rep.incarnation:
        rep.incarnations[rep.self_name] = rep.incarnation
        if not pre:
            save_state(rep)
    last_epoch, end = rep.key
    return election.VoteRequest(rep.topic, rep.index, rep.epoch + 1 if pre else rep.epoch, rep.self_name,
                                last_epoch, end, pre, transfer, rep.unclean_allowed or rep.unclean_once)


def on_vote_request(rep: Replica, req: election.VoteRequest, leader_alive: bool) -> election.VoteReply:
    """Judge a vote; the ballot is saved (and a leader steps down) before the reply is returned."""
    if rep.blank and not req.unclean:  # its state is gone: whatever it would say, it may have said otherwise
        return election.VoteReply(req.topic, req.partition, rep.epoch, rep.self_name, False, election.LOST_STATE,
                                  req.pre, rep.log.start_offset, rep.incarnation)
    me = election.Voter(rep.self_name, rep.ballot, rep.vote_key, frozenset(rep.voters), leader_alive,
                        rep.is_leader)
    verdict = election.judge_vote(me, req)
    if verdict.ballot is not None:
        newer, was_leader = verdict.ballot.epoch > rep.epoch, rep.is_leader
        rep.epoch, rep.voted_for = verdict.ballot.epoch, verdict.ballot.voted_for
        save_state(rep)
        if newer:
            rep.unlead(None, stepped_down(rep, rep.epoch))
            if was_leader:
                log.warning("%s/%d: %s steps down for %s's candidacy in epoch %d", rep.topic, rep.index,
                            rep.self_name, req.candidate, rep.epoch)
    reply = dataclasses.replace(verdict.reply, log_start=rep.log.start_offset, incarnation=rep.incarnation)
    if rep.blank and reply.granted:  # an unclean round: the vote says its state is gone, so the win is recorded
        reply = dataclasses.replace(reply, reason=election.LOST_STATE)
    return reply


def no_eligible_leader(rep: Replica, lost_state: frozenset[str]) -> None:
    """A candidacy found voters that lost their state (``election.Tally.lost_state``), so no leader holding
    what was acknowledged can be elected now: the replica follows nobody (its lost leader is not named as
    if it led) and says why until a leader syncs it or it wins."""
    rep.lost_state = lost_state
    if lost_state and not rep.is_leader and rep.leader is not None:
        rep.unlead(None, stepped_down(rep, rep.epoch))


def win(rep: Replica, epoch: int, voters_start: int = 0, learned: dict[str, str] | None = None,
        unclean: frozenset[str] = frozenset()) -> bool:
    """The candidacy for ``epoch`` won a majority: lead, if nothing newer happened meanwhile.
    ``voters_start``: the largest log start offset a voter that granted its vote holds. A truncate
    was answered once a majority held its start, and a majority voted, so one of the voters holds it:
    this leader reads nothing below it (``Replica.serves_from``) until ``lead_start`` moves its own
    log there (after this step: files go, and an fsync may be running)."""
    if rep.epoch != epoch or rep.voted_for != rep.self_name or rep.leader is not None:
        return False
    if learned:  # incarnations of voters that elected it, not recorded before: recorded from now on
        rep.incarnations.update({v: i for v, i in learned.items() if v not in rep.incarnations})
        save_state(rep, before_log_changes=True)  # (the log begins the epoch below)
    rep.unclean_once = False
    if unclean:  # elected with votes of voters that lost their state: what they alone held is gone
        rep.unclean_history.append({"epoch": epoch, "from_offset": rep.log.end_offset})
        del rep.unclean_history[:-limits.UNCLEAN_HISTORY_MAX]
        save_state(rep, before_log_changes=True)
        log.error("%s/%d: %s leads epoch %d by an UNCLEAN election (with the votes of %s, which lost their "
                  "state): records any replica held at or past offset %d in an earlier epoch, acknowledged "
                  "or not, are lost", rep.topic, rep.index, rep.self_name, epoch, ",".join(sorted(unclean)),
                  rep.log.end_offset)
    rep.renewed = {}
    rep.lost_state = frozenset()
    rep.log.sync()  # (see _progress)
    rep.log.begin_epoch(epoch)
    rep.lead()
    rep.peer_start = voters_start
    rep.caught_up = True  # the leader's log is what the others catch up with
    log.info("%s/%d: %s leads epoch %d from offset %d", rep.topic, rep.index, rep.self_name, epoch,
             rep.epoch_start)
    return True


def cut_damaged(rep: Replica) -> bool:
    """Cut a damaged replica's log back to its damaged batch (to the start of the segment holding it, or
    an earlier one, if that cut fails), for its leader to send the rest again; whether a cut was made.
    The undamaged batches below the damage stay: they may be the only whole copy of some batch when the
    leader's own log is damaged lower down. The caller made sure no fsync runs on the log, and that this
    replica does not lead."""
    assert rep.damaged_at is not None and not rep.is_leader
    had = rep.log.end_offset
    # What it acknowledged may be committed by its ack alone: its votes go on counting it (saved first).
    rep.vouched = rep.vote_key
    save_state(rep, before_log_changes=True)
    bases = [b for b in rep.log.segment_bases() if b < rep.damaged_at]
    for base in [rep.damaged_at, *reversed(bases or [rep.log.start_offset])]:
        try:
            rep.log.truncate_after(base)
            break
        except StorageError as exc:
            log.warning("%s/%d: cutting at %d failed (%s); trying an earlier segment", rep.topic, rep.index,
                        base, exc.message)
    else:
        log.error("%s/%d: no segment could be cut; reads stay with other replicas", rep.topic, rep.index)
        return False
    rep.truncated()
    log.warning("%s/%d: cut at %d to refetch from the leader (had up to %d)", rep.topic, rep.index,
                rep.log.end_offset, had)
    return True
