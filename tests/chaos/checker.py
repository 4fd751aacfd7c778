"""The checker: a ``History`` in, the counts that say what the cluster did to its data out.

Pure and deterministic (no I/O, no clock), so hand-made histories test it
(tests/test_checker.py). What each count means:

* ``attempted`` / ``acknowledged`` / ``failed`` / ``unknown``: write attempts
  by outcome (every attempt carries a value no other attempt carries).
* ``lost``: acknowledged, yet absent from the final drain (every broker's
  client API, read to its high watermark after the faults healed).
* ``unexpected``: a value read that no write attempted.
* ``duplicated``: a value seen at more than one (partition, offset), over
  every observation (acknowledgements, consumer reads, final reads, replica
  logs): written twice, or moved.
* ``recovered``: outcome unknown to the client, yet a client read it later
  (not an error: the write happened). ``failed_but_read``: the broker said
  nothing was written (503/4xx) and a client read the value anyway (a lie).
* ``vanished``: read by a consumer during the run, absent from the final
  drain (a reader saw data the cluster later lost).
* ``inconsistent_offsets``: (partition, offset) pairs holding different
  values in different observations; ``inconsistent_visible`` counts those
  where the differing observations are all ones a client saw (acks and client
  reads), leaving out replica logs beyond a high watermark.
* ``order_violations``: acknowledged writes of a key that sit, in the final
  log, before a write of the same key acknowledged before they were sent.
* ``availability``: acknowledged / attempted; ``read_availability``: consumer
  fetches answered / tried; ``longest_outage_s``: the longest time any
  producer went without an acknowledgement while it kept trying.
* ``divergent_partitions``: partitions whose replicas, compared after
  healing, do not hold the same stored batches (or could not be read whole).
* ``starts_moved``: (broker, partition) replicas ever reported with a start
  offset above 0: a chaos run never truncates and its topic keeps records
  for days, so a moved start is records deleted by a wrong clock (or worse).
* ``stamped_off``: records whose stored timestamp lies more than
  ``STAMP_TOLERANCE_MS`` outside the time their produce was in flight, by
  the harness's clock (for a write not acknowledged, only before it was
  sent: a stopped broker stores what it holds when it resumes, after the
  producer gave the attempt up): stamped by a broker whose clock was off.
* ``timestamp_answers_changed``: a broker's first offset at or after a
  timestamp, asked before the faults and after the drain, differs.
* Runs with consumer-group members: ``group_delivered``, the (partition,
  offset) pairs a member handed to its application; ``group_redelivered``,
  those handed out more than once (at-least-once allows it: reported, not
  an error); ``committed_undelivered``, offsets below the group's committed
  offset (it starts at the earliest) that no member ever handed out: what a
  commit of a lost poll answer would skip. It must be 0.

Each anomaly keeps a few examples, so a report can be acted on.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from tests.chaos.history import CONSUMER, FAIL, FINAL, OK, REPLICA, UNKNOWN, History, ReplicaCopy, Write

EXAMPLES_MAX = 5  # per anomaly: enough to start debugging, short enough to print
# A record's timestamp may lie this far outside its produce's flight (the brokers' clocks are the
# harness machine's, unless a fault moved one): past ring's default hard clock bound of 2 s.
STAMP_TOLERANCE_MS = 5_000


@dataclass
class Report:
    attempted: int = 0
    acknowledged: int = 0
    failed: int = 0
    unknown: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicated: int = 0
    recovered: int = 0
    failed_but_read: int = 0
    vanished: int = 0
    inconsistent_offsets: int = 0
    inconsistent_visible: int = 0
    order_violations: int = 0
    availability: float = 1.0
    read_availability: float | None = None
    longest_outage_s: float = 0.0
    divergent_partitions: int = 0
    drain_errors: int = 0
    starts_moved: int = 0
    stamped_off: int = 0
    timestamp_answers_changed: int = 0
    group_delivered: int = 0
    group_redelivered: int = 0
    committed_undelivered: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def safe(self) -> bool:
        """What quorum and all promise: nothing acknowledged lost, one value per offset, key order kept,
        nothing committed for a group that no member handed out."""
        return (self.lost == 0 and self.inconsistent_offsets == 0 and self.order_violations == 0
                and self.committed_undelivered == 0)

    def note(self, kind: str, text: str) -> None:
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES_MAX:
            shown.append(text)


def check(history: History) -> Report:
    r = Report()
    writes = history.writes
    by_value: dict[str, Write] = {}
    for w in writes:
        assert w.value not in by_value, f"two attempts with value {w.value!r}: values must be unique"
        by_value[w.value] = w
    r.attempted = len(writes)
    r.acknowledged = sum(w.outcome == OK for w in writes)
    r.failed = sum(w.outcome == FAIL for w in writes)
    r.unknown = sum(w.outcome == UNKNOWN for w in writes)
    r.availability = r.acknowledged / r.attempted if r.attempted else 1.0
    tried = history.fetches_ok + history.fetches_failed
    r.read_availability = history.fetches_ok / tried if tried else None
    r.drain_errors = len(history.drain_errors)
    for e in history.drain_errors:
        r.note("drain_errors", e)

    final_values = {x.value for x in history.reads if x.source == FINAL}
    read_values = {x.value for x in history.reads if x.source != REPLICA}  # what a client could see
    _outcomes(r, writes, final_values, read_values)
    _reads(r, history, by_value, final_values)
    _offsets(r, history)
    r.order_violations = _order(r, writes, history)
    r.longest_outage_s = _longest_outage(writes)
    r.divergent_partitions = _divergence(r, history.replicas)
    r.starts_moved = _starts(r, history)
    r.stamped_off = _stamps(r, history, by_value)
    for broker, p, ts, before, after in history.timestamp_answers:
        if before != after:
            r.timestamp_answers_changed += 1
            r.note("timestamp_answers_changed", f"{broker} partition {p}: first offset at or after {ts} was "
                   f"{before} before the faults, {after} after")
    _group(r, history)
    return r


def _starts(r: Report, history: History) -> int:
    seen = [(at, broker, p, start) for at, broker, p, start in history.starts]
    for i, parts in (history.meta.get("partitions") or {}).items():
        seen += [(None, f"ring-{i}", x["partition"], x["earliest_offset"]) for x in parts or []
                 if x.get("earliest_offset") is not None]
    moved: set[tuple[str, int]] = set()
    for at, broker, p, start in seen:
        if start > 0 and (broker, p) not in moved:
            moved.add((broker, p))
            when = "after the drain" if at is None else f"at {at:.1f}s"
            r.note("starts_moved", f"{broker} partition {p} started at offset {start} {when}")
    return len(moved)


def _stamps(r: Report, history: History, by_value: dict[str, Write]) -> int:
    wall0 = history.meta.get("wall_ms_at_start")
    if wall0 is None:
        return 0
    off: set[str] = set()
    for x in history.reads:
        w = by_value.get(x.value)
        if x.source != FINAL or x.timestamp is None or w is None or x.value in off:
            continue
        # An unacknowledged write may be stored any time later: a stopped broker holds what it was sent.
        late = wall0 + w.end_s * 1000 + STAMP_TOLERANCE_MS if w.outcome == OK else float("inf")
        early = wall0 + w.start_s * 1000 - STAMP_TOLERANCE_MS
        if not early <= x.timestamp <= late:
            off.add(x.value)
            r.note("stamped_off", f"{x.value} at {x.partition}/{x.offset} stamped {x.timestamp - wall0:.0f} ms after "
                   f"the run began; its produce was in flight {w.start_s:.2f}-{w.end_s:.2f}s")
    return len(off)


def _group(r: Report, history: History) -> None:
    if not history.group_reads and history.group_committed is None:
        return
    times: dict[tuple[int, int], int] = defaultdict(int)
    for x in history.group_reads:
        times[(x.partition, x.offset)] += 1
    r.group_delivered = len(times)
    twice = sorted(k for k, n in times.items() if n > 1)
    r.group_redelivered = len(twice)
    for p, o in twice[:EXAMPLES_MAX]:
        r.note("group_redelivered", f"{p}/{o} handed out {times[(p, o)]} times")
    for p, committed in sorted((history.group_committed or {}).items()):
        skipped = [o for o in range(committed) if (p, o) not in times]
        r.committed_undelivered += len(skipped)
        if skipped:
            r.note("committed_undelivered", f"partition {p} committed at {committed}: {len(skipped)} offsets never "
                   f"handed out, from {skipped[0]}")


def _outcomes(r: Report, writes: list[Write], final_values: set[str], read_values: set[str]) -> None:
    for w in writes:
        if w.outcome == OK and w.value not in final_values:
            r.lost += 1
            r.note("lost", f"{w.value} acked at {w.partition}/{w.offset} by {w.broker} at {w.end_s:.2f}s")
        elif w.outcome == UNKNOWN and w.value in read_values:
            r.recovered += 1
        elif w.outcome == FAIL and w.value in read_values:
            r.failed_but_read += 1
            r.note("failed_but_read", f"{w.value}: {w.status} {w.error} from {w.broker}, yet read")


def _reads(r: Report, history: History, by_value: dict[str, Write], final_values: set[str]) -> None:
    unexpected: set[str] = set()
    vanished: set[str] = set()
    for x in history.reads:
        if x.value not in by_value and x.value not in unexpected:
            unexpected.add(x.value)
            r.note("unexpected", f"{x.value!r} at {x.partition}/{x.offset} from {x.broker} ({x.source})")
        if x.source == CONSUMER and x.value not in final_values and x.value not in vanished:
            vanished.add(x.value)
            r.note("vanished", f"{x.value} read at {x.partition}/{x.offset} from {x.broker} at {x.at_s:.2f}s")
    r.unexpected, r.vanished = len(unexpected), len(vanished)


def _observations(history: History) -> Iterable[tuple[int, int, str, bool, str]]:
    """(partition, offset, value, seen by a client, where) for every acknowledgement and read."""
    for w in history.writes:
        if w.outcome == OK:
            assert w.partition is not None and w.offset is not None
            yield w.partition, w.offset, w.value, True, f"ack from {w.broker}"
    for x in history.reads:
        yield x.partition, x.offset, x.value, x.source != REPLICA, f"{x.source} {x.broker}"


def _offsets(r: Report, history: History) -> None:
    at: dict[tuple[int, int], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    visible: dict[tuple[int, int], set[str]] = defaultdict(set)
    places: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for p, o, v, seen, where in _observations(history):
        at[(p, o)][v].append(where)
        places[v].add((p, o))
        if seen:
            visible[(p, o)].add(v)
    for (p, o), values in sorted(at.items()):
        if len(values) > 1:
            r.inconsistent_offsets += 1
            r.note("inconsistent_offsets", f"{p}/{o}: " + "; ".join(
                f"{v} ({', '.join(sorted(set(ws)))})" for v, ws in sorted(values.items())))
        if len(visible[(p, o)]) > 1:
            r.inconsistent_visible += 1
    for v, ps in sorted(places.items()):
        if len(ps) > 1:
            r.duplicated += 1
            r.note("duplicated", f"{v} at {', '.join(f'{p}/{o}' for p, o in sorted(ps))}")


def _order(r: Report, writes: list[Write], history: History) -> int:
    """Acked writes placed before an earlier-acknowledged write of the same key (final drain positions)."""
    pos: dict[str, tuple[int, int]] = {}
    for x in history.reads:
        if x.source == FINAL:
            here = (x.partition, x.offset)
            pos[x.value] = min(pos.get(x.value, here), here)
    by_key: dict[str, list[Write]] = defaultdict(list)
    for w in writes:
        if w.outcome == OK and w.value in pos:
            by_key[w.key].append(w)
    violations = 0
    for key, ws in sorted(by_key.items()):
        by_end = sorted(ws, key=lambda w: w.end_s)
        i, best = 0, None  # best: the acked write with the greatest position among those acked so far
        for w in sorted(ws, key=lambda w: w.start_s):
            while i < len(by_end) and by_end[i].end_s <= w.start_s:
                if best is None or pos[by_end[i].value] > pos[best.value]:
                    best = by_end[i]
                i += 1
            if best is not None and pos[w.value] < pos[best.value]:
                violations += 1
                r.note("order_violations", f"key {key}: {w.value} at {pos[w.value]} before {best.value} at "
                       f"{pos[best.value]}, acked at {best.end_s:.2f}s before {w.value} was sent at {w.start_s:.2f}s")
    return violations


def _longest_outage(writes: list[Write]) -> float:
    """Per producer: the longest stretch from its last acknowledgement (or its first attempt) to the next
    one (or its last attempt's end). The longest over producers."""
    by_producer: dict[int, list[Write]] = defaultdict(list)
    for w in writes:
        by_producer[w.producer].append(w)
    longest = 0.0
    for ws in by_producer.values():
        ws.sort(key=lambda w: w.start_s)
        since = ws[0].start_s
        for w in ws:
            if w.outcome == OK:
                longest = max(longest, w.end_s - since)
                since = w.end_s
        if ws[-1].outcome != OK:
            longest = max(longest, max(w.end_s for w in ws) - since)
    return longest


def _divergence(r: Report, replicas: list[ReplicaCopy]) -> int:
    by_partition: dict[int, list[ReplicaCopy]] = defaultdict(list)
    for c in replicas:
        by_partition[c.partition].append(c)
    divergent = 0
    for p, copies in sorted(by_partition.items()):
        why = _compare(copies)
        if why:
            divergent += 1
            r.note("divergent_partitions", f"partition {p}: {why}")
    return divergent


def _compare(copies: list[ReplicaCopy]) -> str:
    """Empty when every copy holds the same batches; else what differs."""
    broken = [f"{c.broker} unreadable ({c.error})" for c in copies if c.error]
    if broken:
        return "; ".join(broken)
    if len({c.batches for c in copies}) <= 1:
        return ""
    longest = max(copies, key=lambda c: len(c.batches))
    parts = []
    for c in copies:
        if c is longest or c.batches == longest.batches:
            continue
        n = len(c.batches)
        if longest.batches[:n] == c.batches:
            parts.append(f"{c.broker} behind {longest.broker}: ends at {c.end_offset}, not {longest.end_offset}")
        else:  # not a prefix of the longest, so they differ within c's length
            first = next(i for i, (a, b) in enumerate(zip(c.batches, longest.batches)) if a != b)
            parts.append(f"{c.broker} conflicts with {longest.broker} from offset {c.batches[first][0]}")
    return "; ".join(parts)
