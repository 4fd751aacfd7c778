"""The client's pure parts: the accumulator's batching and draining rules,
topology parsing and routing, error classification, and fetch decoding."""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import errors
from ring.client import AsyncGroupConsumer, BrokersUnavailable
from ring.client.batcher import Accumulator, BufferFull, record_size
from ring.client.records import decode_fetch
from ring.client.retry import Retry
from ring.client.topology import Topology, normalize_url, parse_brokers, parse_cluster, parse_topic
from ring.client.transport import FATAL, RETRY, UNKNOWN, Reply, classify, retry_after_s
from ring.clock import ManualClock
from ring.log import batch as batchfmt


def acc(**kw) -> Accumulator:
    args = dict(linger_ms=10, batch_bytes=1000, buffer_bytes=10_000, request_bytes_max=3000,
                request_records_max=1000, delivery_timeout_ms=30_000)
    args.update(kw)
    return Accumulator(**args)


def rec(n: int = 100) -> tuple:
    return (1, None, b"x" * n, None)


def add(a: Accumulator, p: int, now: float, n: int = 100, movable: bool = False, json: bool = False,
        waiter: object = None) -> bool:
    return a.append("t", p, rec(n), record_size(None, b"x" * n, None), waiter, json, movable, now)


def test_linger_holds_a_batch_until_it_is_due() -> None:
    a = acc()
    assert add(a, 0, now=0)  # a new batch: the sender must learn its deadline
    assert not add(a, 0, now=1)
    assert a.drain(now_ms=5, max_requests=10) == []
    assert a.next_deadline_ms(5) == 10
    [(tp, batches)] = a.drain(now_ms=10, max_requests=10)
    assert tp == ("t", 0) and len(batches) == 1 and batches[0].count == 2


def test_a_full_batch_is_sent_without_waiting_for_linger() -> None:
    a = acc(linger_ms=10_000)
    for _ in range(8):
        add(a, 0, now=0)  # 8 * 116 bytes + header < 1000
    assert a.drain(0, 10) == []
    assert add(a, 0, now=0)  # this one does not fit: the open batch is sealed
    [(_, batches)] = a.drain(0, 10)
    assert [b.count for b in batches] == [8]  # the new open batch still lingers
    assert all(b.size <= 1000 for b in batches)


def test_one_request_per_partition_in_flight_keeps_order_across_retries() -> None:
    a = acc(linger_ms=0)
    w = iter(range(100))
    add(a, 0, 0, waiter=next(w))
    [(tp, first)] = a.drain(0, 10)
    add(a, 0, 1, waiter=next(w))
    assert a.drain(1, 10) == []  # busy: the second record waits for the first request
    a.retry(tp, first, retry_at_ms=50)
    assert a.drain(10, 10) == []  # backing off
    assert a.next_deadline_ms(10) == 50
    [(_, again)] = a.drain(50, 10)
    assert [x for b in again for x in b.waiters] == [0, 1]  # the retried batch first, then the newer one
    assert again[0].attempts == 1


def test_a_request_is_bounded_in_bytes_and_partitions_are_independent() -> None:
    a = acc(linger_ms=0, batch_bytes=600, request_bytes_max=1300)
    for _ in range(12):
        add(a, 0, 0)
    add(a, 1, 0)
    reqs = dict(a.drain(0, 10))
    assert sum(b.size for b in reqs[("t", 0)]) <= 1300
    assert len(reqs[("t", 1)]) == 1
    assert a.drain(0, 10) == []  # both busy
    a.done(("t", 0), reqs[("t", 0)])
    assert a.drain(0, 10)  # the rest of partition 0


def test_max_requests_bounds_one_drain() -> None:
    a = acc(linger_ms=0)
    for p in range(5):
        add(a, p, 0)
    assert len(a.drain(0, 2)) == 2
    assert len(a.drain(0, 10)) == 3


def test_json_and_raw_values_never_share_a_batch() -> None:
    a = acc(linger_ms=0)
    add(a, 0, 0, json=True)
    add(a, 0, 0, json=False)
    [(_, batches)] = a.drain(0, 10)
    assert [b.values_are_json for b in batches] == [True, False]


def test_buffer_bound_and_accounting() -> None:
    a = acc(linger_ms=0, buffer_bytes=1000)
    for _ in range(8):
        add(a, 0, 0)
    with pytest.raises(BufferFull):
        add(a, 0, 0)
    [(tp, batches)] = a.drain(0, 10)
    a.done(tp, batches)
    assert a.buffered_bytes == 0
    add(a, 0, 0)


def test_movable_batches_move_and_keep_the_open_batch_last() -> None:
    a = acc(linger_ms=0)
    add(a, 0, 0, movable=True)
    [(tp, batches)] = a.drain(0, 10)
    add(a, 1, 0, movable=False)  # an open batch on partition 1
    a.move(tp, batches, 1)
    assert batches[0].partition == 1
    [(_, moved)] = a.drain(0, 10)
    assert moved[0] is batches[0] and len(moved) == 2


def test_an_exact_retry_is_sent_again_alone_and_whole() -> None:
    a = acc(linger_ms=0, batch_bytes=300)
    for i in range(4):
        add(a, 0, 0, waiter=i)  # two records per batch
    [(tp, first)] = a.drain(0, 10)
    assert [b.count for b in first] == [2, 2]
    add(a, 0, 1, waiter=4)
    a.retry(tp, first, retry_at_ms=5, exact=True)  # its answer was lost: the broker may hold it
    [(_, again)] = a.drain(5, 10)
    assert again == first  # not merged with the newer batch, even with room for it
    a.done(tp, again)
    [(_, rest)] = a.drain(5, 10)
    assert [w for b in rest for w in b.waiters] == [4]


def test_request_batches_max_bounds_a_request() -> None:
    a = acc(linger_ms=0, batch_bytes=200, request_batches_max=2)
    for _ in range(5):
        add(a, 0, 0)  # one record per batch
    [(tp, batches)] = a.drain(0, 10)
    assert len(batches) == 2


def test_queued_batches_past_their_deadline_expire() -> None:
    a = acc(linger_ms=10_000, delivery_timeout_ms=100)
    add(a, 0, 0, waiter="old")
    add(a, 1, 50, waiter="young")
    assert a.next_expiry_ms() == 100
    assert a.expire(99) == []
    [gone] = a.expire(100)
    assert gone.waiters == ["old"] and a.buffered_bytes == record_size(None, b"x" * 100, None)
    assert a.next_expiry_ms() == 150


def test_a_moved_batch_goes_at_once_and_is_not_counted_as_a_retry() -> None:
    a = acc(linger_ms=0)
    add(a, 0, 0, movable=True)
    [(tp, batches)] = a.drain(0, 10)
    a.move(tp, batches, 2, retry_at_ms=0.0)
    [(tp2, moved)] = a.drain(0, 10)
    assert tp2 == ("t", 2) and moved[0].attempts == 0


def test_flush_seals_everything() -> None:
    a = acc(linger_ms=10_000)
    add(a, 0, 0)
    add(a, 1, 0)
    assert len(a.seal_all()) == 2
    assert len(a.drain(0, 10)) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 900), st.integers(0, 30)), min_size=1, max_size=80))
def test_every_record_is_drained_once_in_order_per_partition(ops) -> None:
    a = acc(linger_ms=5, batch_bytes=1000, buffer_bytes=10**9)
    now = 0
    sent: dict[int, list[int]] = {}
    for i, (p, n, dt) in enumerate(ops):
        now += dt
        a.append("t", p, rec(n), record_size(None, b"x" * n, None), i, False, False, now)
        for tp, batches in a.drain(now, 2):
            assert all(b.size <= 1000 or b.count == 1 for b in batches)
            sent.setdefault(tp[1], []).extend(w for b in batches for w in b.waiters)
            a.done(tp, batches)
    a.seal_all()
    while True:
        got = a.drain(now, 10)
        if not got:
            break
        for tp, batches in got:
            sent.setdefault(tp[1], []).extend(w for b in batches for w in b.waiters)
            a.done(tp, batches)
    assert a.buffered_bytes == 0
    for p, waiters in sent.items():
        assert waiters == [i for i, op in enumerate(ops) if op[0] == p]
    assert sum(map(len, sent.values())) == len(ops)


# --- topology -----------------------------------------------------------------------

CLUSTER = {"brokers": [
    {"name": "ring-0", "token": 1, "status": "up", "phi": 0.1, "client_url": "http://127.0.0.1:9250", "peer_url": "x"},
    {"name": "ring-1", "token": 2, "status": "down", "phi": 12.0, "client_url": "http://127.0.0.1:9260", "peer_url": "x"},
    {"name": "ring-2", "token": 3, "status": "suspect", "phi": 5.0, "client_url": "127.0.0.1:9270/", "peer_url": "x"},
], "self": "ring-0"}
TOPIC = {"name": "t", "partitions": [
    {"partition": 1, "leader": "ring-1", "replicas": ["ring-1", "ring-2", "ring-0"], "epoch": 1,
     "high_watermark": 5, "earliest_offset": 0, "end_offset": 5},
    {"partition": 0, "leader": "ring-0", "replicas": ["ring-0", "ring-1", "ring-2"], "epoch": 1,
     "high_watermark": 3, "earliest_offset": 0, "end_offset": 4},
]}


def test_addresses_normalize() -> None:
    assert normalize_url("h:1/") == "http://h:1"
    assert parse_brokers("h:1, http://h:1,h:2") == ["http://h:1", "http://h:2"]
    with pytest.raises(errors.BadRequest):
        parse_brokers(" , ")


def test_routing_from_a_cluster_document() -> None:
    topo = Topology().with_brokers(parse_cluster(CLUSTER), clustered=True).with_topic(parse_topic(TOPIC, "http://a"))
    assert [p.partition for p in topo.topics["t"].partitions] == [0, 1]
    assert topo.leader_url("t", 0) == "http://127.0.0.1:9250"
    assert topo.leader_url("t", 1) == "http://127.0.0.1:9260"  # down, but still the leader
    assert topo.live_leader_partitions("t") == [0]
    # the down leader is skipped for reads; the suspect replica is still tried
    assert topo.read_urls("t", 1) == ["http://127.0.0.1:9270", "http://127.0.0.1:9250"]
    assert topo.leader_url("t", 7) is None and topo.leader_url("u", 0) is None


def test_standalone_topology_falls_back_to_the_answering_url() -> None:
    topo = Topology().with_topic(parse_topic({"name": "t", "partitions": [
        {"partition": 0, "leader": "elsewhere", "replicas": ["elsewhere"]}]}, "http://b"))
    assert topo.leader_url("t", 0) == "http://b"
    assert topo.read_urls("t", 0) == ["http://b"]


def test_bad_topic_documents_are_refused() -> None:
    with pytest.raises(errors.BadRequest):
        parse_topic({"name": "t", "partitions": []}, "u")
    with pytest.raises(errors.BadRequest):
        parse_topic({"name": "t", "partitions": [{"partition": 1, "leader": "a"}]}, "u")


def test_classification() -> None:
    assert classify(503, "not_enough_replicas") == RETRY
    assert classify(503, "unavailable") == RETRY
    assert classify(429, "overloaded") == RETRY
    assert classify(409, "not_leader") == RETRY
    assert classify(504, "timeout") == UNKNOWN
    assert classify(400, "bad_request") == FATAL
    assert classify(413, "payload_too_large") == FATAL


# --- fetch decoding -----------------------------------------------------------------

def _stored(base: int, values: list[bytes], json: bool = False) -> bytes:
    buf = batchfmt.encode([(1000 + i, None, v, None) for i, v in enumerate(values)], now_ms=0,
                          values_are_json=json)
    batchfmt.stamp(buf, 0, base, 1)
    return bytes(buf)


def test_decode_fetch_skips_below_offset_and_stops_at_the_watermark() -> None:
    data = _stored(0, [b"a", b"b", b"c"]) + _stored(3, [b"1", b"2"], json=True)
    recs, nxt = decode_fetch("t", 0, data, 1, 4, 100, None)
    assert [(r.offset, r.value) for r in recs] == [(1, b"b"), (2, b"c"), (3, b"1")]
    assert nxt == 4 and recs[-1].value_is_json and recs[-1].json() == 1
    recs, nxt = decode_fetch("t", 0, data, 0, 5, 2, None)
    assert [r.offset for r in recs] == [0, 1] and nxt == 2
    assert decode_fetch("t", 0, b"", 7, 7, 10, None) == ([], 7)


def test_decode_fetch_refuses_a_damaged_batch() -> None:
    data = bytearray(_stored(0, [b"abc"]))
    data[-1] ^= 0xFF
    with pytest.raises(errors.CorruptBatch):
        decode_fetch("t", 0, bytes(data), 0, 1, 10, None)


def test_set_producer_renumbers_a_batch_and_keeps_its_crc_valid() -> None:
    buf = batchfmt.encode([(1, None, b"a", None), (2, b"k", b"b", None)], now_ms=0, producer_id=5, base_sequence=10)
    batchfmt.set_producer(buf, 7, 42)
    h = batchfmt.check(buf)
    assert (h.producer_id, h.base_sequence, h.record_count) == (7, 42, 2)


# --- a group consumer's own positions ------------------------------------------------------------


def crec(p: int, o: int):
    from ring.client.records import ConsumerRecord

    return ConsumerRecord("t", p, o, 0, None, b"v", None, False)


def test_records_received_again_are_dropped_and_positions_go_back_to_the_coordinator() -> None:
    from ring.client.positions import Positions

    pos = Positions()
    assert pos.assign([("t", 0), ("t", 1)]) == ([], [("t", 0), ("t", 1)])
    assert [r.offset for r in pos.accept([crec(0, 0), crec(0, 1), crec(1, 0)])] == [0, 1, 0]
    assert pos.take_seeks() == {}
    # a new coordinator starts partition 0 from its committed offset again
    assert [(r.partition, r.offset) for r in pos.accept([crec(0, 0), crec(0, 1), crec(0, 2)])] == [(0, 2)]
    assert pos.dropped == 2 and pos.take_seeks() == {("t", 0): 3, ("t", 1): 1}


def test_pause_gives_buffered_records_back_and_seek_moves_the_position() -> None:
    from ring.client.positions import Positions

    pos = Positions()
    pos.assign([("t", 0), ("t", 1)])
    pos.buffer.extend(pos.accept([crec(0, 5), crec(1, 7), crec(0, 6)]))
    pos.pause([("t", 0)])
    assert [(r.partition, r.offset) for r in pos.buffer] == [(1, 7)] and pos.take_seeks() == {("t", 0): 5}
    assert pos.accept([crec(0, 5), crec(1, 8)]) == [crec(1, 8)]  # paused: read again once resumed
    assert pos.take_seeks() == {("t", 0): 5} and pos.position(("t", 0)) == 5
    pos.resume([("t", 0)])
    assert pos.accept([crec(0, 5)]) == [crec(0, 5)]
    pos.seek(("t", 1), 2)
    assert pos.position(("t", 1)) == 2 and not pos.buffer and pos.handed[("t", 1)] == 2
    assert pos.accept([crec(1, 2)]) == [crec(1, 2)]
    with pytest.raises(errors.BadRequest):
        pos.seek(("t", 9), 0)
    revoked, added = pos.assign([("t", 1)])
    assert revoked == [("t", 0)] and added == [] and ("t", 0) not in pos.fetched


def test_a_topic_described_by_a_broker_without_its_replicas() -> None:
    # A broker that holds no replica of a partition describes it with null offsets and epoch (the
    # partition's leader and replicas are still named): the client once failed on int(None).
    doc = {"name": "t", "partitions": [{"partition": 0, "leader": "a", "replicas": ["a", "b", "c"], "epoch": None,
                                        "earliest_offset": None, "end_offset": None, "high_watermark": None,
                                        "local_start_offset": None}]}
    info = parse_topic(doc, "http://d")
    p = info.partitions[0]
    assert (p.leader, p.replicas, p.epoch, p.high_watermark, p.earliest_offset, p.end_offset) == (
        "a", ("a", "b", "c"), 0, 0, 0, 0)


# --- how long calls keep trying ----------------------------------------------------------------


async def test_retry_pauses_double_until_the_deadline_then_stop() -> None:
    clock = ManualClock()
    slept: list[float] = []

    async def pauses(retry: Retry, at_least_s: float = 0.0) -> bool:  # the clock moves by exactly each pause
        task = asyncio.create_task(retry.pause(at_least_s))
        while not task.done():
            await asyncio.sleep(0)
            deadline = clock.next_deadline()
            if deadline is not None:
                slept.append(deadline - clock.monotonic())
                clock.advance(deadline - clock.monotonic())
        return task.result()

    retry = Retry(clock, timeout_s=5.0, retries=None, backoff_ms=500)
    while await pauses(retry):
        pass
    # 0.5, 1, 2 (the cap), then what is left: the last attempt starts at the deadline
    assert slept == [0.5, 1.0, 2.0, 1.5] and clock.monotonic() == 5.0 and retry.attempts == 5
    assert not await pauses(retry) and len(slept) == 4

    counted = Retry(clock, timeout_s=60.0, retries=2, backoff_ms=500)
    assert await pauses(counted) and await pauses(counted) and not await pauses(counted)
    assert counted.attempts == 3

    # A refusal's Retry-After is waited when longer than the backoff, and cut at the deadline.
    told = Retry(clock, timeout_s=10.0, retries=None, backoff_ms=500)
    slept.clear()
    assert await pauses(told, 3.0) and await pauses(told, 0.2) and await pauses(told, 30.0)
    assert slept == [3.0, 1.0, 6.0] and not await pauses(told)


def test_the_wait_a_refusal_asks_for() -> None:
    def reply(status: int, code: str, retry_after: str | None) -> Reply:
        body = f'{{"error": "{code}", "message": "m"}}'.encode()
        return Reply(status, {} if retry_after is None else {"Retry-After": retry_after}, body, "http://b")

    assert retry_after_s(reply(429, "quota_exceeded", "8")) == 8.0
    assert retry_after_s(reply(429, "overloaded", "1")) == 1.0
    for code in ("not_leader", "not_enough_replicas", "unavailable"):  # the doubling pause, following the leader
        assert retry_after_s(reply(503, code, "1")) == 0.0
    assert retry_after_s(reply(429, "overloaded", None)) == 0.0
    assert retry_after_s(reply(429, "overloaded", "Wed, 21 Oct 2026 07:28:00 GMT")) == 0.0
    assert retry_after_s(reply(429, "overloaded", "-5")) == 0.0
    assert retry_after_s(reply(429, "overloaded", "inf")) == 0.0
    assert retry_after_s(reply(400, "bad_request", "3")) == 0.0

    def quota(retry_after: str | None, retry_after_ms: object) -> Reply:
        body = orjson.dumps({"error": "quota_exceeded", "message": "m", "retry_after_ms": retry_after_ms})
        return Reply(429, {} if retry_after is None else {"Retry-After": retry_after}, body, "http://b")

    assert retry_after_s(quota(None, 2500)) == 2.5  # the body alone
    assert retry_after_s(quota("3", 2500)) == 3.0 and retry_after_s(quota("1", 2500)) == 2.5  # the larger
    assert retry_after_s(quota("2", "soon")) == 2.0 and retry_after_s(quota("2", True)) == 2.0


def test_a_refusal_read_back_and_the_error_a_call_gives_up_with() -> None:
    from ring import errors
    from ring.client.transport import BrokersUnavailable, error_from, gave_up

    def refusal(code: str, headers: dict[str, str], **body: object) -> Reply:
        return Reply(429, headers, orjson.dumps({"error": code, "message": "m", **body}), "http://b")

    quota = error_from(refusal("quota_exceeded", {"Retry-After": "3"}, retry_after_ms=2500), "produce to t/0")
    assert type(quota) is errors.QuotaExceeded and quota.retry_after_s == 3.0
    assert quota.extra["retry_after_ms"] == 3000 and quota.extra["status"] == 429 and quota.extra["broker"] == "http://b"
    bare = error_from(refusal("quota_exceeded", {}), "fetch t/0")  # no wait given: the default refusal's second
    assert type(bare) is errors.QuotaExceeded and bare.retry_after_s == errors.Overloaded.retry_after_s
    load = error_from(refusal("overloaded", {"Retry-After": "1"}), "produce to t/0")
    assert type(load) is errors.Overloaded

    given_up = gave_up("tried 4 times", quota, partition=0)
    assert type(given_up) is errors.QuotaExceeded and given_up.retry_after_s == 3.0
    assert given_up.message == "tried 4 times" and given_up.extra["partition"] == 0
    assert type(gave_up("tried", load)) is errors.Overloaded
    for last in (None, errors.Unavailable("no leader"), BrokersUnavailable("x")):
        assert type(gave_up("tried", last)) is BrokersUnavailable


async def test_a_group_consumer_with_no_broker_raises_once_its_retry_time_is_spent() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    consumer = AsyncGroupConsumer(dead, "g", "t", retry_timeout_s=1.0, retry_backoff_ms=50)
    try:
        for _ in range(2):  # a failed start is tried again, not left as a consumer that never joined
            started = time.monotonic()
            with pytest.raises(BrokersUnavailable, match=r"attempts in 1\.\d s, retry_timeout_s=1\)"):
                await consumer.start()
            assert 1.0 <= time.monotonic() - started < 2.0
        assert consumer._transport is not None and consumer._transport.requests <= 2 * 8  # no spinning
    finally:
        await consumer.close()


async def test_a_group_consumer_given_a_clock_retries_on_that_clock() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    clock = ManualClock()
    consumer = AsyncGroupConsumer(dead, "g", "t", retry_timeout_s=60.0, retry_backoff_ms=50, clock=clock)
    try:
        start = asyncio.create_task(consumer.start())
        for _ in range(1000):  # the first attempt fails, then it pauses on the clock
            if clock.next_deadline() is not None:
                break
            assert not start.done()
            await asyncio.sleep(0.01)
        assert clock.next_deadline() == 0.05
        while not start.done():  # a minute of its retries, at once: time moves only as told
            deadline = clock.next_deadline()
            if deadline is not None:
                clock.advance(deadline - clock.monotonic())
            await asyncio.sleep(0.01)
        with pytest.raises(BrokersUnavailable, match=r"attempts in 60\.0 s, retry_timeout_s=60\)"):
            start.result()
    finally:
        await consumer.close()
