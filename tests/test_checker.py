"""The chaos checker on hand-made histories: a clean history is clean, and each anomaly is counted
where it happens (and nowhere else); a history generated from a correct log is always clean and
stays so through JSON, and removing or moving one acknowledged record is always caught. Also the
harness's other pure parts: where a power loss may cut, producer keys, outcomes, producer ids."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring.hashing import partition_for_key
from ring.log import batch as batchfmt
from tests.chaos.checker import check
from tests.chaos.faults import choose_cut, position_of_offset
from tests.chaos.history import (CONSUMER, FAIL, FINAL, OK, REPLICA, UNKNOWN, GroupRead, History, Read, ReplicaCopy,
                                 Write)
from tests.chaos.workload import Session, classify, keys_for

ZEROS = dict(lost=0, unexpected=0, duplicated=0, recovered=0, failed_but_read=0, vanished=0,
             inconsistent_offsets=0, inconsistent_visible=0, order_violations=0, divergent_partitions=0)


def w(value: str, start: float, end: float, outcome: str = OK, partition: int | None = 0,
      offset: int | None = None, key: str = "k", producer: int = 0, status: int | None = 200) -> Write:
    if outcome != OK:
        partition = offset = None
    return Write(value, key, producer, 0, start, end, outcome, partition, offset, "ring-0", status)


def final(*pairs: tuple[int, str], partition: int = 0, broker: str = "ring-0") -> list[Read]:
    return [Read(FINAL, broker, partition, o, v) for o, v in pairs]


def counts(report) -> dict[str, int]:
    return {k: getattr(report, k) for k in ZEROS}


def clean_history() -> History:
    writes = [w("a", 0.0, 0.1, offset=0), w("b", 0.1, 0.2, offset=1), w("c", 0.2, 0.3, offset=2)]
    reads = [Read(CONSUMER, "ring-1", 0, 0, "a", 0.15), *final((0, "a"), (1, "b"), (2, "c")),
             *final((0, "a"), (1, "b"), (2, "c"), broker="ring-1")]
    batches = ((0, 1, 11, 1), (1, 1, 12, 1), (2, 1, 13, 1))
    replicas = [ReplicaCopy(b, 0, batches, 3) for b in ("ring-0", "ring-1", "ring-2")]
    return History(writes, reads, replicas, fetches_ok=9, fetches_failed=1)


def test_a_clean_history_has_no_anomaly() -> None:
    r = check(clean_history())
    assert counts(r) == ZEROS and r.safe
    assert (r.attempted, r.acknowledged, r.failed, r.unknown) == (3, 3, 0, 0)
    assert r.availability == 1.0 and r.read_availability == 0.9
    assert r.longest_outage_s == pytest.approx(0.1) and r.examples == {}


def test_group_commits_past_what_no_member_handed_out_are_counted_and_redeliveries_reported() -> None:
    h = clean_history()
    h.group_reads = [GroupRead("c1", 0, 0, "a"), GroupRead("c1", 0, 1, "b"), GroupRead("c2", 0, 1, "b")]
    h.group_committed = {0: 2}
    r = check(History.from_json(json.loads(json.dumps(h.to_json()))))
    assert (r.group_delivered, r.group_redelivered, r.committed_undelivered) == (2, 1, 0) and r.safe
    assert counts(r) == ZEROS
    h.group_reads = h.group_reads[1:]  # offset 0 never handed out, yet committed past
    h.group_committed = {0: 3}
    r = check(h)
    assert (r.group_delivered, r.group_redelivered, r.committed_undelivered) == (1, 1, 2) and not r.safe
    assert r.examples["committed_undelivered"] == ["partition 0 committed at 3: 2 offsets never handed out, from 0"]


def test_acknowledged_but_absent_from_the_final_drain_is_lost_and_what_a_consumer_saw_vanished() -> None:
    h = clean_history()
    h.reads = [x for x in h.reads if not (x.source == FINAL and x.value == "a")]
    r = check(h)
    assert counts(r) == {**ZEROS, "lost": 1, "vanished": 1} and not r.safe
    assert "a acked at 0/0" in r.examples["lost"][0]


def test_a_value_on_only_one_broker_is_not_lost() -> None:
    h = clean_history()
    h.reads = [x for x in h.reads if not (x.source == FINAL and x.value == "c" and x.broker == "ring-1")]
    assert check(h).lost == 0


def test_values_nobody_wrote_are_unexpected() -> None:
    h = clean_history()
    h.reads.append(Read(FINAL, "ring-0", 0, 3, "zzz"))
    r = check(h)
    assert counts(r) == {**ZEROS, "unexpected": 1}


def test_a_value_at_two_offsets_is_duplicated() -> None:
    h = clean_history()
    h.reads += final((3, "b"))
    assert counts(check(h)) == {**ZEROS, "duplicated": 1}


def test_unknown_outcomes_read_later_are_recovered_and_unread_ones_are_not_lost() -> None:
    h = clean_history()
    h.writes += [w("d", 0.3, 5.0, UNKNOWN, status=504), w("e", 5.0, 9.0, UNKNOWN, status=None)]
    h.reads += final((3, "d"))
    r = check(h)
    assert counts(r) == {**ZEROS, "recovered": 1}
    assert (r.attempted, r.acknowledged, r.unknown) == (5, 3, 2) and r.availability == 3 / 5


def test_a_refused_write_that_was_read_is_reported() -> None:
    h = clean_history()
    h.writes.append(w("d", 0.3, 0.4, FAIL, status=503))
    h.reads.append(Read(CONSUMER, "ring-2", 0, 3, "d", 1.0))
    h.reads += final((3, "d"))
    r = check(h)
    assert counts(r) == {**ZEROS, "failed_but_read": 1} and r.failed == 1
    assert "503" in r.examples["failed_but_read"][0]


def test_two_values_at_one_offset_are_inconsistent() -> None:
    h = clean_history()
    h.reads += final((1, "x"), broker="ring-2")  # ring-2 serves another value at the acked offset 1
    h.writes.append(w("x", 0.3, 0.4, UNKNOWN))
    r = check(h)
    assert (r.inconsistent_offsets, r.inconsistent_visible, r.duplicated) == (1, 1, 0)
    assert "0/1: b (ack from ring-0, final ring-0, final ring-1); x (final ring-2)" == r.examples["inconsistent_offsets"][0]


def test_a_conflict_only_in_a_replica_log_is_inconsistent_but_not_visible() -> None:
    h = clean_history()
    h.writes.append(w("x", 0.3, 0.4, UNKNOWN))
    h.reads += [Read(REPLICA, "ring-2", 0, 3, "x"), Read(REPLICA, "ring-1", 0, 3, "c2")]
    h.writes.append(w("c2", 0.3, 0.4, UNKNOWN, producer=1))
    r = check(h)
    assert (r.inconsistent_offsets, r.inconsistent_visible) == (1, 0) and not r.safe


def test_a_later_acknowledged_write_before_an_earlier_one_is_an_order_violation() -> None:
    writes = [w("a", 0.0, 0.1, offset=1), w("b", 0.2, 0.3, offset=0), w("c", 0.4, 0.5, offset=2)]
    r = check(History(writes, final((0, "b"), (1, "a"), (2, "c"))))
    assert counts(r) == {**ZEROS, "order_violations": 1}
    assert "b at (0, 0) before a at (0, 1)" in r.examples["order_violations"][0]


def test_overlapping_writes_and_other_keys_may_land_in_any_order() -> None:
    writes = [w("a", 0.0, 0.3, offset=1), w("b", 0.1, 0.2, offset=0),  # concurrent: either order is fine
              w("c", 0.4, 0.5, offset=3, key="k2"), w("d", 0.6, 0.7, offset=2, key="k3")]
    r = check(History(writes, final((0, "b"), (1, "a"), (2, "d"), (3, "c"))))
    assert counts(r) == ZEROS


def test_the_longest_outage_is_the_longest_wait_of_any_producer_for_an_ack() -> None:
    writes = [w("a", 0.0, 0.1, offset=0), w("b", 0.1, 3.0, UNKNOWN), w("c", 3.0, 4.0, FAIL),
              w("d", 4.0, 4.2, offset=1),
              w("e", 0.0, 0.1, offset=2, producer=1, key="k1"), w("f", 0.1, 6.5, FAIL, producer=1, key="k1")]
    r = check(History(writes, final((0, "a"), (1, "d"), (2, "e"))))
    assert r.longest_outage_s == pytest.approx(6.4)  # producer 1 never got another ack
    writes = writes[:4]
    assert check(History(writes, final((0, "a"), (1, "d")))).longest_outage_s == pytest.approx(4.1)


@pytest.mark.parametrize(("copies", "why"), [
    ({"ring-1": ((0, 1, 11, 1), (1, 1, 12, 1))}, "ring-1 behind ring-0: ends at 2, not 3"),
    ({"ring-2": ((0, 1, 11, 1), (1, 2, 99, 1), (2, 2, 98, 1))}, "ring-2 conflicts with ring-0 from offset 1"),
])
def test_replicas_that_differ_after_healing_are_divergent(copies, why) -> None:
    h = clean_history()
    h.replicas = [ReplicaCopy(c.broker, 0, copies.get(c.broker, c.batches), len(copies.get(c.broker, c.batches)))
                  for c in h.replicas]
    r = check(h)
    assert r.divergent_partitions == 1 and r.examples["divergent_partitions"] == [f"partition 0: {why}"]


def test_an_unreadable_replica_is_divergent() -> None:
    h = clean_history()
    h.replicas[2] = ReplicaCopy("ring-2", 0, h.replicas[2].batches[:1], None, "500 storage_error")
    r = check(h)
    assert r.divergent_partitions == 1 and "ring-2 unreadable (500 storage_error)" in r.examples["divergent_partitions"][0]


def test_final_read_errors_are_counted() -> None:
    h = clean_history()
    h.drain_errors = ["ring-2 partition 0: 500 storage_error"]
    r = check(h)
    assert r.drain_errors == 1 and counts(r) == ZEROS


def test_a_moved_start_offset_is_counted_once_per_replica() -> None:
    h = clean_history()
    h.starts = [(1.0, "ring-0", 0, 0), (1.0, "ring-2", 0, 0), (2.0, "ring-2", 0, 80), (3.0, "ring-2", 0, 80)]
    h.meta["partitions"] = {"0": [{"partition": 0, "earliest_offset": 0}], "1": [{"partition": 0, "earliest_offset": 3}]}
    r = check(History.from_json(json.loads(json.dumps(h.to_json()))))
    assert r.starts_moved == 2 and counts(r) == ZEROS
    assert r.examples["starts_moved"] == ["ring-2 partition 0 started at offset 80 at 2.0s",
                                          "ring-1 partition 0 started at offset 3 after the drain"]
    assert check(clean_history()).starts_moved == 0


def test_a_record_stamped_off_the_clock_of_its_produce_is_counted() -> None:
    h = clean_history()
    h.meta["wall_ms_at_start"] = 1_000_000
    h.reads = [Read(x.source, x.broker, x.partition, x.offset, x.value, x.at_s,
                    1_000_000 + 100 if x.value != "c" else 1_000_000 + 8 * 86_400_000) for x in h.reads]
    r = check(h)
    assert r.stamped_off == 1 and "c at 0/2" in r.examples["stamped_off"][0] and counts(r) == ZEROS
    h.meta["wall_ms_at_start"] = 1_000_000 + 4_000  # within the tolerance still
    h.reads = [x for x in h.reads if x.value != "c"]
    assert check(h).stamped_off == 0


def test_a_write_given_up_and_stored_later_is_not_stamped_off_but_an_early_stamp_is() -> None:
    """A producer gives up an attempt a stopped broker holds; resumed, the broker may store it long after
    (an unknown outcome, recovered): no bound on when, only that it is not stamped before it was sent."""
    h = clean_history()
    h.meta["wall_ms_at_start"] = 1_000_000
    h.writes.append(w("d", 1.0, 2.0, UNKNOWN, status=None))
    h.reads += final((3, "d"))
    h.reads = [Read(x.source, x.broker, x.partition, x.offset, x.value, x.at_s,
                    1_000_000 + (60_000 if x.value == "d" else 100)) for x in h.reads]
    assert check(h).stamped_off == 0
    h.reads = [dataclasses.replace(x, timestamp=1_000_000 - 10_000) if x.value == "d" else x for x in h.reads]
    assert check(h).stamped_off == 1


def test_an_offset_by_timestamp_answer_that_changed_is_counted() -> None:
    h = clean_history()
    h.timestamp_answers = [("ring-0", 0, 5, 2, 2), ("ring-1", 0, 5, 2, 0)]
    r = check(History.from_json(json.loads(json.dumps(h.to_json()))))
    assert r.timestamp_answers_changed == 1 and "ring-1 partition 0" in r.examples["timestamp_answers_changed"][0]


def test_two_attempts_with_one_value_are_a_harness_bug() -> None:
    h = clean_history()
    h.writes.append(w("a", 1.0, 1.1, FAIL))
    with pytest.raises(AssertionError, match="unique"):
        check(h)


# --- generated histories: a correct log, then one fault put in by hand ----------------------------------

@st.composite
def correct_histories(draw) -> History:
    """Producers writing one at a time to their key's partition of a log that loses nothing."""
    partitions, producers = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    ends = [0] * partitions
    clock = [0.0] * producers
    writes, reads = [], []
    for n in range(draw(st.integers(1, 40))):
        p = draw(st.integers(0, producers - 1))
        part = p % partitions
        start = clock[p] + draw(st.floats(0, 1))
        end = start + draw(st.floats(0.001, 2))
        clock[p] = end
        outcome = draw(st.sampled_from([OK, OK, OK, FAIL, UNKNOWN]))
        written = outcome == OK or (outcome == UNKNOWN and draw(st.booleans()))
        offset = ends[part] if written else None
        if written:
            ends[part] += 1
            for b in ("ring-0", "ring-1"):
                reads.append(Read(FINAL, b, part, offset, f"v{n}"))
        writes.append(Write(f"v{n}", f"key{p}", p, n, start, end, outcome,
                            part if outcome == OK else None, offset if outcome == OK else None, "ring-0"))
    return History(writes, reads)


@settings(max_examples=60, deadline=None)
@given(correct_histories())
def test_a_correct_log_is_always_clean_and_survives_json(h: History) -> None:
    r = check(h)
    assert r.lost == r.unexpected == r.duplicated == r.inconsistent_offsets == r.vanished == 0
    assert r.order_violations == r.failed_but_read == r.divergent_partitions == 0 and r.safe
    assert r.recovered == sum(w.outcome == UNKNOWN and any(x.value == w.value for x in h.reads) for w in h.writes)
    assert check(History.from_json(json.loads(json.dumps(h.to_json())))) == r


@settings(max_examples=60, deadline=None)
@given(correct_histories(), st.data())
def test_dropping_or_moving_one_acknowledged_record_is_caught(h: History, data) -> None:
    acked = [w for w in h.writes if w.outcome == OK]
    if not acked:
        return
    victim = data.draw(st.sampled_from(acked))
    if data.draw(st.booleans()):
        h.reads = [x for x in h.reads if x.value != victim.value]
        assert check(h).lost == 1
    else:
        h.reads.append(Read(FINAL, "ring-2", victim.partition, victim.offset + 1000, victim.value))
        assert check(h).duplicated == 1


# --- the harness's other pure parts ---------------------------------------------------------------------

def _segment(*counts: int) -> tuple[bytes, list[int]]:
    """Stamped batches of ``counts`` records each, back to back; and where each starts."""
    data, starts, base = bytearray(), [], 0
    for n in counts:
        b = batchfmt.encode([(None, None, b"x" * 10, None)] * n, now_ms=1)
        batchfmt.stamp(b, 0, base, 1)
        starts.append(len(data))
        data += b
        base += n
    return bytes(data), starts


def test_the_cut_floor_is_the_first_whole_batch_at_or_after_the_durable_end() -> None:
    data, starts = _segment(3, 2, 1)  # offsets 0-2, 3-4, 5
    assert position_of_offset(data, 0) == 0
    assert position_of_offset(data, 3) == starts[1]
    assert position_of_offset(data, 4) == starts[2]  # inside a batch: keep it whole
    assert position_of_offset(data, 5) == starts[2]
    assert position_of_offset(data, 6) == position_of_offset(data, 99) == len(data)
    torn = data[: starts[2] + 5]
    assert position_of_offset(torn, 6) == starts[2]


def test_a_cut_lands_between_the_floor_and_the_end() -> None:
    rng = random.Random(3)
    cuts = {choose_cut(10, 20, rng) for _ in range(200)}
    assert min(cuts) == 10 and max(cuts) == 20
    assert choose_cut(30, 20, rng) == 20 and choose_cut(-5, 0, rng) == 0


def test_producer_keys_cover_every_partition_and_outcomes_follow_the_status() -> None:
    keys = keys_for(9, 6)
    assert len(set(keys)) == 9
    assert [partition_for_key(k.encode(), 6) for k in keys] == [i % 6 for i in range(9)]
    assert [classify(s) for s in (200, 503, 400, 409, 429, 504, 500, 502, None)] == \
        [OK, FAIL, FAIL, FAIL, FAIL, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN]


def test_an_idempotent_producer_retires_its_id_after_an_unknown_outcome() -> None:
    ids = iter(range(10, 20))
    s = Session(next(ids))
    s.after(OK, ids)
    s.after(FAIL, ids)  # nothing was written under sequence 1: the next value takes it
    assert (s.producer_id, s.seq) == (10, 1)
    s.after(UNKNOWN, ids)
    assert (s.producer_id, s.seq) == (11, 0)
