"""Faults against a private 3-broker cluster: brokers SIGKILLed and SIGSTOPped.

One follower down: quorum writes go on, ``all`` is refused with 503 once the
follower is marked down (before that it times out: 504, outcome unknown); a
partition whose leader went down is led by another replica.
Two down: quorum is refused, ``one`` still succeeds while the leader lives.
The stopped brokers are marked down by the others within the documented
time (phi accrual: ~4-13 s), and up again after they
return; restarted on their data directories they catch up, and nothing
acknowledged at quorum is missing from any replica.
"""

from __future__ import annotations

import time

import orjson
import pytest

from tests.brokers import Member, TestCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "faults"
PARTITIONS = 6
# The documented bound is ~4-13 s from the stop; a loaded 2-core machine gets some slack.
DOWN_WITHIN_S = 16.0
UP_WITHIN_S = 10.0


def _produce(m: Member, partition: int, tag: str, consistency: str) -> tuple[int, dict]:
    values = [{"tag": tag, "n": n} for n in range(3)]
    r = m.http.produce(TOPIC, orjson.dumps(values), partition=partition, consistency=consistency)
    return r.status, {"body": r.json(), "retry_after": r.headers.get("Retry-After"), "values": values}


def _ack(acked: dict[int, dict[int, object]], partition: int, reply: dict) -> None:
    base = reply["body"]["base_offset"]
    for n, v in enumerate(reply["values"]):
        acked[partition][base + n] = v


def _time_until_down(c: TestCluster, victim: Member, killed_at: float) -> float:
    observers = [m for m in c if m is not victim and m.local.proc and m.local.proc.poll() is None]
    c.wait_statuses({victim.name: "down"}, observers, timeout_s=DOWN_WITHIN_S + 10)
    elapsed = time.monotonic() - killed_at
    print(f"{victim.name} down after {elapsed:.1f} s")
    return elapsed


def test_kills_and_pauses(make_cluster) -> None:
    c: TestCluster = make_cluster(3, "--fsync", "interval:100")
    r0, r1, r2 = c[0], c[1], c[2]
    assert r0.http.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3).status == 201
    leaders = c.leaders(TOPIC)
    led_by = {name: [p for p, n in leaders.items() if n == name] for name in ("ring-0", "ring-1", "ring-2")}
    acked: dict[int, dict[int, object]] = {p: {} for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        status, reply = _produce(c[p % 3], p, "all-up", "all")
        assert status == 200, reply
        _ack(acked, p, reply)

    # --- one follower (ring-2) killed -----------------------------------------------------
    r2.kill()
    killed_at = time.monotonic()
    for p in led_by["ring-0"] + led_by["ring-1"]:  # quorum needs the leader and one follower: still fine
        status, reply = _produce(r0, p, "one-down", "quorum")
        assert status == 200, reply
        _ack(acked, p, reply)
    elapsed = _time_until_down(c, r2, killed_at)
    assert elapsed <= DOWN_WITHIN_S, f"ring-2 marked down after {elapsed:.1f} s"
    for p in led_by["ring-0"]:
        status, reply = _produce(r1, p, "all-refused", "all")  # forwarded: the leader's 503 comes back
        assert status == 503, reply
        body = reply["body"]
        assert body["error"] == "not_enough_replicas" and (body["alive"], body["needed"]) == (2, 3)
        assert body["message"] == f"2 of 3 replicas of {TOPIC}/{p} are alive; consistency=all needs 3"
        assert reply["retry_after"] is not None
        status, reply = _produce(r1, p, "one-down", "quorum")
        assert status == 200, reply
        _ack(acked, p, reply)
    for p in led_by["ring-2"]:  # its leader is down: ring-0 or ring-1 took over (tests/test_failover.py)
        status, reply = _produce(r0, p, "failed-over", "quorum")
        assert status == 200, reply
        _ack(acked, p, reply)

    # --- two replicas down: only ring-0 lives -------------------------------------------------
    r1.kill()
    killed_at = time.monotonic()
    elapsed = _time_until_down(c, r1, killed_at)
    assert elapsed <= DOWN_WITHIN_S, f"ring-1 marked down after {elapsed:.1f} s"
    for p in led_by["ring-0"]:
        status, reply = _produce(r0, p, "quorum-refused", "quorum")
        assert status == 503 and (reply["body"]["alive"], reply["body"]["needed"]) == (1, 2), reply
        status, reply = _produce(r0, p, "alone", "one")
        assert status == 200, reply
        _ack(acked, p, reply)  # acknowledged by the leader alone; it lives, so it must not be lost

    # --- both return on their data directories and catch up ------------------------------------
    restarted_at = time.monotonic()
    r1.restart()
    r2.restart()
    c.wait_statuses({m.name: "up" for m in c}, timeout_s=UP_WITHIN_S)
    assert time.monotonic() - restarted_at <= UP_WITHIN_S + 15  # the restarts themselves included
    deadline = time.monotonic() + 20
    for p in range(PARTITIONS):
        for m in c:
            got = m.http.read_all(TOPIC, p, end=max(acked[p], default=-1) + 1, timeout_s=deadline - time.monotonic())
            missing = {o: v for o, v in acked[p].items() if got.get(o) != v}
            assert not missing, (m.name, p, sorted(missing)[:5])
    for p in range(PARTITIONS):  # and the replicas are the same bytes
        while True:
            copies = [m.replica_log(TOPIC, p) for m in c]
            if len(set(copies)) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(set(copies)) == 1, (p, [end for _, end in copies])

    # --- a paused broker (SIGSTOP: the kernel still accepts its connections) ------------------
    r1.pause()
    paused_at = time.monotonic()
    try:
        # not marked down yet, so the leader tries; the paused follower never answers: 504, outcome unknown
        p = led_by["ring-0"][0]
        status, reply = _produce(r0, p, "unknown", "all")
        waited = time.monotonic() - paused_at
        assert status == 504 and reply["body"]["error"] == "timeout", reply
        assert "outcome is unknown" in reply["body"]["message"] and 4.5 <= waited <= 10, (waited, reply)
        elapsed = _time_until_down(c, r1, paused_at)
        assert elapsed <= DOWN_WITHIN_S, f"paused ring-1 marked down after {elapsed:.1f} s"
        p = led_by["ring-0"][0]
        status, reply = _produce(r2, p, "while-paused", "quorum")
        assert status == 200, reply
        _ack(acked, p, reply)
    finally:
        r1.resume()
    resumed_at = time.monotonic()
    c.wait_statuses({"ring-1": "up"}, timeout_s=UP_WITHIN_S)
    assert time.monotonic() - resumed_at <= UP_WITHIN_S
    deadline = time.monotonic() + 20
    for m in c:
        got = m.http.read_all(TOPIC, p, end=max(acked[p], default=-1) + 1, timeout_s=deadline - time.monotonic())
        missing = sorted(o for o, v in acked[p].items() if got.get(o) != v)
        assert not missing, (m.name, missing, m.http.get(f"/v1/topics/{TOPIC}").json()["partitions"][p])
