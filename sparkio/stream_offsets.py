"""Where a stream's next micro-batch ends, and what was lost on the way: pure.

``plan_next`` takes the previous end (a JSON offset from Spark's checkpoint)
and the partitions as the cluster describes them now, and returns where each
partition's records begin and how far there is to read, after the checks
Kafka's source makes (KafkaOffsetReaderAdmin.getOffsetRangesFromResolvedOffsets)
plus one it cannot make:

- a partition the query read is gone (its topic deleted): Kafka's "are gone";
- a topic was created again under the same name since the previous batch: its
  id (or, in an offset written without ids, its creation time) differs from
  the one the offset recorded. Kafka notices only
  when the new topic's offsets are still below the old ones ("offset was
  changed"); ring always does, so a query that read offsets 0-9 of the old
  topic does not skip offsets 0-9 of the new one;
- an offset went back (the high watermark below what was read) where the
  offset does not say when the topic was created: Kafka's "offset was changed";
- a partition that appeared during the query starts above 0: Kafka's "added
  partition starts from X instead of 0".

With ``failOnDataLoss`` each of these fails the query with one message; without
it they are logged and the query goes on: gone partitions are dropped, a topic
created again (or an offset gone back) is read from its earliest offset, as
Kafka reads the data that is there. A high watermark below what the query read
of the same topic is an older view from another broker (a high watermark
never moves back): the source asks again (fetchOffset.numRetries), and the
partition's end stays where it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from sparkio import planner
from sparkio.fetch import DataLoss
from sparkio.planner import PartitionKey, PartitionState

_SHOWN_MAX = 5  # partitions named in one message


@dataclass
class NextBatch:
    begin: dict[PartitionKey, int]  # where each partition's unread records start
    latest: dict[PartitionKey, int]  # how far there is to read, before read limits
    created_ms: dict[str, int]  # when each topic read was created
    lost: list[str] = field(default_factory=list)  # what failOnDataLoss=false let through
    topic_ids: dict[str, str] = field(default_factory=dict)  # the id of each topic read

    def backlog(self) -> int:
        return sum(max(0, self.latest[tp] - self.begin[tp]) for tp in self.latest)

    def to_json(self, end: Mapping[PartitionKey, int] | None = None) -> dict[str, Any]:
        return planner.to_json_offsets(self.latest if end is None else end, self.created_ms, self.topic_ids)


def _names(tps: list[PartitionKey], start: Mapping[PartitionKey, int]) -> str:
    shown = ", ".join(f"{t}/{p} (read up to offset {start[(t, p)]})" for t, p in tps[:_SHOWN_MAX])
    return shown + (f" and {len(tps) - _SHOWN_MAX} more" if len(tps) > _SHOWN_MAX else "")


def stale(start_doc: Mapping[str, Any], states: Mapping[PartitionKey, PartitionState]) -> list[PartitionKey]:
    """Partitions whose high watermark is below what the query read: ask again before judging."""
    start = planner.from_json_offsets(start_doc)
    return [tp for tp, off in start.items() if tp in states and states[tp].latest < off
            and not _recreated(start_doc, tp[0], states[tp])]


def _recreated(doc: Mapping[str, Any] | None, topic: str, st: PartitionState) -> bool:
    """``doc`` recorded another incarnation of ``topic`` than ``st``'s: by id where both have one,
    else by creation time (unknown: not another)."""
    was_id = planner.ids_of(doc).get(topic)
    if was_id and st.topic_id:
        return was_id != st.topic_id
    was = planner.created_of(doc).get(topic)
    return was is not None and was != st.created_ms


def plan_next(start_doc: Mapping[str, Any], states: Mapping[PartitionKey, PartitionState], *,
              fail_on_data_loss: bool, target: Mapping[str, Any] | None = None) -> NextBatch:
    """The records there are to read after ``start_doc``; raises DataLoss (failOnDataLoss) or notes it.

    ``target``: Trigger.AvailableNow's offsets, taken when the query started;
    nothing past them is read, and partitions born since are left for later.
    """
    start, was = planner.from_json_offsets(start_doc), planner.created_of(start_doc)
    now = planner.created_ms(states.values())
    first = {st.topic: st for st in states.values()}  # every partition of a topic tells its incarnation
    lost: list[str] = []
    gone = sorted(tp for tp in start if tp not in states)
    if gone:
        lost.append(f"partitions {_names(gone, start)} are gone: their topic was deleted, so records not read "
                    "from them may have been missed")
    again = sorted({t for t, _ in start if t in first and _recreated(start_doc, t, first[t])})
    for t in again:
        tps = sorted(tp for tp in start if tp[0] == t)
        lost.append(f"topic {t} was deleted and created again after the query read {_names(tps, start)}: "
                    "records of the old topic not yet read are lost")
    known = was.keys() | planner.ids_of(start_doc).keys()
    back = sorted(tp for tp in start if tp in states and tp[0] not in known and states[tp].latest < start[tp])
    for tp in back:
        lost.append(f"the offset of {tp[0]}/{tp[1]} went back from {start[tp]} to {states[tp].latest} "
                    "(its topic was probably deleted and created again)")
    added = sorted(tp for tp in states if tp not in start and states[tp].earliest > 0)
    for tp in added:
        lost.append(f"partition {tp[0]}/{tp[1]} appeared during the query but starts at offset "
                    f"{states[tp].earliest}, not 0: records below it were removed before the query saw them")
    if lost and fail_on_data_loss:
        raise DataLoss("data loss: " + "; ".join(lost) + ". Set the option failOnDataLoss=false to read on from "
                       "what is there (a topic created again from its earliest offset).")

    restart = set(back) | {tp for tp in states if tp[0] in again}
    begin: dict[PartitionKey, int] = {}
    latest: dict[PartitionKey, int] = {}
    cap = planner.from_json_offsets(target)
    for tp, st in states.items():
        fresh = tp not in start or tp in restart
        begin[tp] = st.earliest if fresh else start[tp]
        # Never plan backwards within one topic: a lower watermark is an older view.
        latest[tp] = max(st.latest, begin[tp])
        if target is not None:
            if tp not in cap or _recreated(target, tp[0], st):
                latest[tp] = begin[tp]  # born after the query started: not part of "now"
            else:
                latest[tp] = max(begin[tp], min(latest[tp], cap[tp]))
    return NextBatch(begin, latest, now, lost, planner.topic_ids(states.values()))

