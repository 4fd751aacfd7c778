"""Where a follower's log stops agreeing with its leader's, from the two leader-epoch histories alone.

A history lists ``(epoch, first offset of that epoch)``, oldest first; the
newest entry may have no batch yet (a leader records its epoch when elected).
Two replicas hold the same batch at an offset exactly when they hold it in
the same epoch: an epoch has one leader, and a follower only ever appends
what that leader sent after cutting its log back to where they agree. So the
point of divergence follows from the histories, as in Kafka's
OffsetsForLeaderEpoch exchange: the follower asks the leader where its own
latest epoch ends in the leader's log (``end_offset_for``, as the log's
``LeaderEpochCache.end_offset_for``), cuts its log there, and repeats with its new latest
epoch until the leader answers with the same epoch. ``divergence_point`` runs
that loop against the leader's history (which the leader sends with its
first frame to a follower), bounded by the follower's number of epochs.
"""

from __future__ import annotations

import bisect
from typing import Sequence

History = Sequence[tuple[int, int]]


def end_offset_for(history: History, log_end: int, epoch: int) -> tuple[int, int]:
    """(largest epoch <= ``epoch`` in ``history``, the offset where it ends); (-1, -1) if none.

    The same answer as ``LeaderEpochCache.end_offset_for``: the latest epoch
    ends at the log end, any other where the next one begins.
    """
    epochs = [e for e, _ in history]
    i = bisect.bisect_right(epochs, epoch) - 1
    if i < 0:
        return -1, -1
    end = history[i + 1][1] if i + 1 < len(history) else log_end
    return epochs[i], end


def divergence_point(mine: History, my_end: int, leader: History, leader_end: int) -> int:
    """The offset from which the follower must drop its log (``my_end``: nothing to drop).

    Everything below the answer is identical on both replicas.
    """
    hist = list(mine)
    end = my_end
    for _ in range(len(hist) + 1):
        if not hist:
            return end if end == 0 else _no_common_epoch(mine, end)
        my_epoch = hist[-1][0]
        their_epoch, their_end = end_offset_for(leader, leader_end, my_epoch)
        if their_epoch == -1:
            return _no_common_epoch(mine, end)
        if their_epoch == my_epoch:
            return min(their_end, end)
        # The leader never had our latest epoch(s): everything we hold from them on diverges,
        # and so does what we hold past where the leader's epoch ``their_epoch`` ended.
        first_newer = next(s for e, s in hist if e > their_epoch)
        end = min(end, their_end, first_newer)
        hist = [(e, s) for e, s in hist if s < end]
    raise AssertionError("the loop drops at least one epoch per round")


def _no_common_epoch(mine: History, end: int) -> int:
    """No epoch in common: keep nothing the history speaks for."""
    return min(end, mine[0][1]) if mine else 0
