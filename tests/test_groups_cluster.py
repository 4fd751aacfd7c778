"""Consumer groups on three real brokers: pub/sub and point-to-point delivery, members coming and
going without skipped records or backwards commits, a killed coordinator (the offsets partition fails
over and the new coordinator replays it), and idempotent retries after a timeout and across a failover.

Every request goes to a broker chosen by the test, not to the coordinator, so forwarding is
exercised throughout. Tests that kill or pause a broker share one private cluster (module scope).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterator

import orjson
import pytest

from ring.hashing import partition_for_key
from tests.brokers import Member, TestCluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0
FAILOVER_S = 25.0  # conviction (5-13 s) plus an election and a reload of the offsets partition


# --- helpers ------------------------------------------------------------------------------------


def join(m: Member, group: str, consumer: str, topics: list[str], **extra: Any) -> dict[str, Any]:
    r = m.http.post(f"/v1/groups/{group}/members", json_body={"consumer": consumer, "topics": topics, **extra})
    assert r.status == 200, r.body
    return r.json()


TOKENS: dict[tuple[str, str], str] = {}  # (group, consumer) -> token of the last answer it read


def poll(m: Member, group: str, consumer: str, **query: Any):
    """A poll naming the token of the member's last answer, as clients do (which commits that answer)."""
    token = TOKENS.get((group, consumer))
    r = m.http.post(f"/v1/groups/{group}/members/{consumer}/poll",
                    query={**query, **({"token": token} if token else {})} or None)
    if r.status == 200:
        TOKENS[(group, consumer)] = r.json()["token"]
    return r


def leave(m: Member, group: str, consumer: str, **query: Any):
    token = TOKENS.get((group, consumer))
    return m.http.delete(f"/v1/groups/{group}/members/{consumer}",
                         query={**query, **({"token": token} if token else {})} or None)


def describe(m: Member, group: str) -> dict[str, Any]:
    r = m.http.get(f"/v1/groups/{group}")
    assert r.status == 200, r.body
    return r.json()


def committed(doc: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(o["topic"], o["partition"]): o["committed"] for o in doc["offsets"] if o["committed"] is not None}


def produce_to(m: Member, topic: str, partition: int, values: list[Any], **query: Any) -> dict[str, Any]:
    r = m.http.produce(topic, orjson.dumps(values), partition=partition, **query)
    assert r.status == 200, r.body
    return r.json()


# --- pub/sub and point-to-point -------------------------------------------------------------------


def test_two_groups_each_read_every_record_and_one_group_splits_them(shared_cluster: TestCluster,
                                                                     topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=6).status == 201
    sent = set()
    for p in range(6):
        produce_to(c[p % 3], topic, p, [{"p": p, "i": i} for i in range(20)])
        sent.update((p, o) for o in range(20))

    # One consumer alone gets everything.
    join(c[1], "solo", "only", [topic])
    solo: list[tuple[int, int]] = []
    deadline = time.monotonic() + WAIT_S
    while len(solo) < len(sent) and time.monotonic() < deadline:
        r = poll(c[2], "solo", "only", wait_ms=300, max_records=50)
        assert r.status == 200, r.body
        solo.extend((rec["partition"], rec["offset"]) for rec in r.json()["records"])
    assert sorted(solo) == sorted(sent)

    # Three consumers, joined through different brokers: disjoint partitions, each record once.
    trio = ["c-a", "c-b", "c-c"]
    for i, name in enumerate(trio):
        join(c[i], "trio", name, [topic])
    docs = {name: join(c[(i + 1) % 3], "trio", name, [topic]) for i, name in enumerate(trio)}  # heartbeats
    generation = docs["c-c"]["generation"]
    assert all(d["generation"] == generation for d in docs.values())
    owned = {name: {(a["topic"], a["partition"]) for a in d["assignment"]} for name, d in docs.items()}
    assert sorted(len(v) for v in owned.values()) == [2, 2, 2]
    assert set().union(*owned.values()) == {(topic, p) for p in range(6)}
    got: dict[str, list[tuple[int, int]]] = {name: [] for name in trio}
    deadline = time.monotonic() + WAIT_S
    for i in itertools.count():
        if sum(map(len, got.values())) >= len(sent) or time.monotonic() > deadline:
            break
        name = trio[i % 3]
        r = poll(c[i % 3], "trio", name, wait_ms=100, generation=generation)
        assert r.status == 200, r.body
        for rec in r.json()["records"]:
            assert (rec["topic"], rec["partition"]) in owned[name]
            got[name].append((rec["partition"], rec["offset"]))
    everything = [x for v in got.values() for x in v]
    assert len(everything) == len(set(everything)) == len(sent)
    assert set(everything) == sent
    for i, name in enumerate(trio):  # a last poll commits what the previous one returned
        assert poll(c[i], "trio", name, generation=generation).status == 200
    doc = describe(c[2], "trio")
    assert doc["generation"] == generation and len(doc["members"]) == 3
    assert all(o["lag"] == 0 and o["committed"] == 20 for o in doc["offsets"]), doc["offsets"]
    listed = {g["group"]: g for g in c[0].http.get("/v1/groups").json()["groups"]}
    assert {"solo", "trio"} <= set(listed) and listed["trio"]["generation"] == generation


def test_a_group_without_members_lags_on_partitions_it_never_committed(shared_cluster: TestCluster,
                                                                      topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=3).status == 201
    for p in range(3):
        produce_to(c[p], topic, p, list(range(5)))
    group = "empty-" + topic
    r = c[1].http.post(f"/v1/groups/{group}/offsets", json_body={
        "offsets": [{"topic": topic, "partition": 0, "offset": 2}]})
    assert r.status == 200, r.body
    doc = describe(c[2], group)
    assert doc["members"] == []
    lag = {o["partition"]: (o["committed"], o["lag"]) for o in doc["offsets"] if o["topic"] == topic}
    assert lag == {0: (2, 3), 1: (None, 5), 2: (None, 5)}


def test_a_stale_generation_is_told_to_rejoin(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    assert c[0].http.create_topic(topic, partitions=2).status == 201
    first = join(c[0], "stale", "x", [topic])
    [moved] = join(c[1], "stale", "y", [topic])["assignment"]
    kept = 1 - moved["partition"]
    r = poll(c[2], "stale", "x", generation=first["generation"])
    assert r.status == 409, r.body
    body = r.json()
    assert body["rejoin"] is True and body["reason"] == "stale_generation" and body["generation"] == first["generation"] + 1
    r = c[1].http.post("/v1/groups/stale/offsets", json_body={
        "consumer": "x", "generation": first["generation"],
        "offsets": [{"topic": topic, "partition": moved["partition"], "offset": 1}]})
    assert r.status == 409 and r.json()["rejoin"] is True
    # A partition x held all along: its commit counts, whatever generation x last heard of.
    r = c[1].http.post("/v1/groups/stale/offsets", json_body={
        "consumer": "x", "generation": first["generation"], "offsets": [{"topic": topic, "partition": kept, "offset": 1}]})
    assert r.status == 200 and r.json()["committed"] == [{"topic": topic, "partition": kept, "offset": 1}], r.body
    assert poll(c[0], "stale", "nobody").status == 409
    # More consumers than partitions: the third gets none and says so.
    doc = join(c[2], "stale", "z", [topic])
    assert doc["assignment"] == [] and doc["idle"] is True and "gets none" in doc["message"]


def test_members_come_and_go_without_skips_or_backwards_commits(shared_cluster: TestCluster, topic: str) -> None:
    c = shared_cluster
    parts = 6
    assert c[0].http.create_topic(topic, partitions=parts).status == 201
    group = "churn"
    sent: set[tuple[int, int]] = set()
    ends = [0] * parts
    live: dict[str, int] = {}  # consumer -> broker index it talks to
    silent: set[str] = set()  # stopped polling without leaving (their session runs out)
    deliveries: list[tuple[str, int, int]] = []
    last_committed: dict[tuple[str, int], int] = {}
    schedule = {0: [("join", "c1"), ("join", "c2")], 2: [("join", "c3")], 4: [("leave", "c1")],
                5: [("join", "c4")], 7: [("die", "c4")], 9: [("quit", "c2")], 10: [("join", "c5")]}

    def check_commits() -> dict[tuple[str, int], int]:
        now = committed(describe(c[len(deliveries) % 3], group))
        for tp, o in now.items():
            assert o >= last_committed.get(tp, 0), f"committed offset of {tp} went back from {last_committed[tp]} to {o}"
        last_committed.update(now)
        return now

    def poll_round(floor: dict[tuple[str, int], int]) -> None:
        for name, b in list(live.items()):
            if name in silent:
                continue
            r = poll(c[b], group, name, wait_ms=50, max_records=40)
            if r.status == 409:  # a rebalance: join again and go on
                assert r.json()["rejoin"] is True
                join(c[b], group, name, [topic])
                continue
            assert r.status == 200, r.body
            for rec in r.json()["records"]:
                p, o = rec["partition"], rec["offset"]
                # Only records at or past the committed offset come (again): duplicates stay
                # within what was handed out and not yet committed.
                assert o >= floor.get((topic, p), 0), (name, p, o, floor)
                deliveries.append((name, p, o))

    for rnd in range(14):
        for action, name in schedule.get(rnd, []):
            if action == "join":
                live[name] = len(live) % 3
                join(c[live[name]], group, name, [topic], session_timeout_ms=1500 if name == "c4" else 10_000)
            elif action == "leave":  # a clean leave commits the last poll
                assert leave(c[live.pop(name)], group, name).status == 200
            elif action == "quit":  # leaves without committing its last poll: those are read again
                assert leave(c[live.pop(name)], group, name, commit="false").status == 200
            else:
                silent.add(name)
        if rnd < 10:
            for p in range(parts):
                produce_to(c[(rnd + p) % 3], topic, p, [{"r": rnd, "p": p, "i": i} for i in range(5)])
                sent.update((p, ends[p] + i) for i in range(5))
                ends[p] += 5
        poll_round(check_commits())

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        poll_round(check_commits())
        seen = {(p, o) for _, p, o in deliveries}
        if seen >= sent and all(last_committed.get((topic, p)) == ends[p] for p in range(parts)):
            break
        time.sleep(0.1)
    seen = {(p, o) for _, p, o in deliveries}
    assert sent - seen == set(), f"records never delivered: {sorted(sent - seen)[:10]}"
    assert seen <= sent
    doc = describe(c[0], group)
    assert sorted(m["member"] for m in doc["members"]) == ["c3", "c5"]  # c4's session ran out
    assert all(last_committed[(topic, p)] == ends[p] for p in range(parts)), (last_committed, ends)
    print(f"{len(deliveries) - len(seen)} duplicate deliveries over {doc['generation']} generations")


# --- a killed broker (one private cluster for the module) -------------------------------------------


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("groups-faults"), 3, args=["--fsync", "interval:100"])
    c.start()
    try:
        yield c
    finally:
        c.kill()


def test_an_idempotent_retry_after_a_timeout_is_stored_once(faulty: TestCluster, topic: str) -> None:
    c = faulty
    assert c[0].http.create_topic(topic, partitions=3).status == 201
    leaders = c.leaders(topic)
    p = next(p for p, name in leaders.items() if name == "ring-0")
    follower = c.member("ring-1")  # every broker holds a replica (RF 3): ring-1 follows p
    first = produce_to(c[1], topic, p, ["a", "b"], producer_id=7, sequence=0, consistency="all")
    follower.pause()
    try:
        r = c[2].http.produce(topic, orjson.dumps(["c", "d", "e"]), partition=p, producer_id=7, sequence=2,
                              consistency="all")
        assert r.status == 504 and r.json()["error"] == "timeout", r.body  # the outcome is unknown
    finally:
        follower.resume()
    deadline = time.monotonic() + WAIT_S
    while True:  # the same request again, as a client would after the timeout
        r = c[2].http.produce(topic, orjson.dumps(["c", "d", "e"]), partition=p, producer_id=7, sequence=2,
                              consistency="all")
        if r.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert r.status == 200, r.body
    assert r.json()["base_offset"] == first["base_offset"] + 2 and r.json()["count"] == 3
    values = [rec["value"] for rec in c[0].http.fetch(topic, p, offset=0).json()["records"]]
    assert values == ["a", "b", "c", "d", "e"]
    again = produce_to(c[0], topic, p, ["a", "b"], producer_id=7, sequence=0)  # the first one, once more
    assert again == first
    stale = c[0].http.produce(topic, orjson.dumps(["z"]), partition=p, producer_id=7, sequence=1)
    assert stale.status == 409 and stale.json()["reason"] == "out_of_order_sequence"


def _coordinator(c: TestCluster, group: str) -> str:
    doc = c[0].http.get("/v1/topics/__offsets").json()
    return doc["partitions"][partition_for_key(group.encode(), doc["partition_count"])]["leader"]


@pytest.fixture(scope="module")
def killed(faulty: TestCluster) -> dict[str, Any]:
    """ring-2 coordinates a group with committed offsets and leads a partition with an idempotent batch;
    then it is killed."""
    c = faulty
    topic = "after-kill"
    assert c[0].http.create_topic(topic, partitions=3).status == 201
    join(c[0], "warmup", "w", [topic])  # creates the offsets topic
    group = next(g for g in (f"g{i}" for i in range(200)) if _coordinator(c, g) == "ring-2")
    for p in range(3):
        produce_to(c[p], topic, p, [{"p": p, "i": i} for i in range(10)], consistency="all")
    join(c[0], group, "survivor", [topic])
    r = c[1].http.post(f"/v1/groups/{group}/offsets", json_body={
        "consumer": "survivor", "offsets": [{"topic": topic, "partition": p, "offset": 4} for p in range(3)]})
    assert r.status == 200, r.body
    p = next(p for p, name in c.leaders(topic).items() if name == "ring-2")
    first = produce_to(c[0], topic, p, ["x"], producer_id=99, sequence=0, consistency="all")
    c.member("ring-2").kill()
    c.wait_statuses({"ring-2": "down"}, observers=[c[0], c[1]])
    return {"topic": topic, "group": group, "partition": p, "first": first}


def test_the_coordinators_broker_is_killed_and_the_group_carries_on(faulty: TestCluster,
                                                                     killed: dict[str, Any]) -> None:
    c, topic, group = faulty, killed["topic"], killed["group"]
    deadline = time.monotonic() + FAILOVER_S
    while True:
        r = c[0].http.get(f"/v1/groups/{group}")
        if r.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status == 200, r.body
    assert committed(r.json()) == {(topic, p): 4 for p in range(3)}
    join(c[1], group, "survivor", [topic])
    ends = {p: 10 + (p == killed["partition"]) for p in range(3)}  # and the idempotent record
    want = {(p, o) for p in range(3) for o in range(4, ends[p])}  # from the committed offsets on
    got: set[tuple[int, int]] = set()
    while len(got) < len(want) and time.monotonic() < deadline + WAIT_S:
        r = poll(c[0], group, "survivor", wait_ms=200)
        if r.status == 409:  # the new coordinator may have rebalanced: join again
            join(c[1], group, "survivor", [topic])
            continue
        assert r.status == 200, r.body
        got.update((rec["partition"], rec["offset"]) for rec in r.json()["records"])
    assert got == want


def test_an_idempotent_retry_across_a_leader_failover_is_stored_once(faulty: TestCluster,
                                                                      killed: dict[str, Any]) -> None:
    c, topic, p, first = faulty, killed["topic"], killed["partition"], killed["first"]
    deadline = time.monotonic() + FAILOVER_S
    while True:
        r = c[1].http.produce(topic, orjson.dumps(["x"]), partition=p, producer_id=99, sequence=0)
        if r.status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.status == 200, r.body
    assert r.json() == first  # the original offsets: nothing written twice
    values = [rec["value"] for rec in c[0].http.fetch(topic, p, offset=0, max_records=100).json()["records"]]
    assert values.count("x") == 1

