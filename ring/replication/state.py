"""What a partition replica keeps beside its log for elections: ``replica-state`` in its directory.

JSON, replaced atomically with an fsync (``save_state``) before any answer that depends on it
(``ring.replication.steps`` keeps that order; inside a node core's step the file is a write of that
step's Ready, which its executor carries out first): the ballot (epoch and vote), the voter set, the log
key a replica vouches for after a cut (``Replica.vouched``), each voter's incarnation as recorded
(``Replica.incarnations``), whether the replica's own state was lost and it has not caught up
since (``Replica.blank``), and the unclean elections it won (``Replica.unclean_history``). A record of incarnations absent (a new partition, or a file an older
release wrote) is learned from each voter's first vote or ack.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import orjson

from ring.log.fsync import write_atomically
from ring.replication import election
from ring.replication.replica import Replica

log = logging.getLogger("ring.replication")

STATE_FILE = "replica-state"


def load_state(directory: Path) -> tuple[election.Ballot, list[str] | None, election.LogKey | None]:
    """The saved ballot, voter set (None: never saved) and vouched log key; a damaged file counts as none."""
    saved = load_full_state(directory)
    return saved.ballot, saved.voters, saved.vouched


@dataclasses.dataclass(frozen=True)
class Saved:
    """What ``replica-state`` holds (``load_full_state``)."""

    ballot: election.Ballot = election.Ballot(0, None)
    voters: list[str] | None = None  # None: never saved
    vouched: election.LogKey | None = None
    incarnations: dict[str, str] = dataclasses.field(default_factory=dict)  # each voter's, as recorded
    blank: bool = False  # its state was lost and it has not caught up since
    unclean: list[dict[str, int]] = dataclasses.field(default_factory=list)  # unclean elections won here


def load_full_state(directory: Path) -> Saved:
    """Everything ``replica-state`` holds; a damaged file counts as none."""
    try:
        doc = orjson.loads((directory / STATE_FILE).read_bytes())
        epoch, voted_for, voters = doc["epoch"], doc["voted_for"], doc["voters"]
        vouched, incarnations, blank = doc.get("vouched"), doc.get("incarnations", {}), doc.get("blank", False)
        unclean = doc.get("unclean", [])
        if type(epoch) is int and epoch >= 0 and (voted_for is None or type(voted_for) is str) \
                and type(voters) is list and voters and all(type(v) is str for v in voters) \
                and (vouched is None or type(vouched) is list and len(vouched) == 2
                     and all(type(x) is int for x in vouched)) \
                and type(incarnations) is dict and all(type(i) is str for i in incarnations.values()) \
                and type(blank) is bool and type(unclean) is list \
                and all(type(u) is dict and all(type(u.get(k)) is int for k in ("epoch", "from_offset"))
                        for u in unclean):
            return Saved(election.Ballot(epoch, voted_for), voters, tuple(vouched) if vouched else None,
                         incarnations, blank, [{"epoch": u["epoch"], "from_offset": u["from_offset"]} for u in unclean])
        log.error("ignoring malformed %s", directory / STATE_FILE)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("ignoring unreadable %s: %s", directory / STATE_FILE, exc)
    return Saved()


def voting_here(topic_dir: Path, name: str, partitions: int) -> list[int]:
    """The partitions of a topic whose replica saved under ``topic_dir`` counts broker ``name`` among its
    voters: a broker that starts opens them, placed on it or not, since its leader's elections may need
    that vote (``NodeCore.keep`` closes them once a leader that leaves it out has claimed them)."""
    try:
        found = [int(d.name) for d in topic_dir.iterdir() if d.name.isdigit()]
    except FileNotFoundError:
        return []
    return sorted(p for p in found if p < partitions and name in (load_state(topic_dir / str(p))[1] or ()))


def save_state(rep: Replica, before_log_changes: bool = False) -> None:
    """Save ``rep``'s state: in the Ready of the node core's step that changed it, when the core is
    stepping and its Readys are carried out (the executor writes files before anything that Ready
    sends or answers, ``ring.node.executor``); at once otherwise (a replica being opened), and at once
    when the step goes on to change the log on the strength of it (``before_log_changes``: a crash
    between the two must find the state saved)."""
    writes = rep.state_writes
    if not before_log_changes and writes is not None and writes.defer_state(rep):
        return
    path, data = state_file(rep)
    write_atomically(path, data)


def state_file(rep: Replica) -> tuple[Path, bytes]:
    """Where ``rep``'s state file goes, and what it holds now."""
    doc: dict = {"epoch": rep.epoch, "voted_for": rep.voted_for, "voters": rep.voters}
    if rep.vouched is not None:
        doc["vouched"] = list(rep.vouched)
    if rep.incarnations:
        doc["incarnations"] = rep.incarnations
    if rep.blank:
        doc["blank"] = True  # (a restart before it caught up must not make it whole)
    if rep.unclean_history:
        doc["unclean"] = rep.unclean_history
    return rep.log.directory / STATE_FILE, orjson.dumps(doc)
