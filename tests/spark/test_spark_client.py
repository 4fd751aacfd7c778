"""The client every Spark task uses, against real brokers: failover past
dead addresses and through a leader's failover, 4xx raised as ring errors
with the body's fields, and a bounded give-up when no broker answers."""

from __future__ import annotations

import time

import pytest

import sparkio
from ring import errors
from ring.localcluster import free_port
from sparkio.client import BrokerClient, BrokersUnavailable
from sparkio.fetch import decode_answer
from tests.spark.conftest import produce_numbered


def test_fails_over_past_a_dead_broker(broker, topic, client):
    t = topic(2)
    produce_numbered(client, t, 50)
    dead = f"http://127.0.0.1:{free_port()}"
    with BrokerClient([dead, broker.url]) as c:
        assert c.describe_topic(t)["name"] == t
        assert c.failovers == 1
        # The preferred broker is tried first, then the others.
        assert c.fetch(t, 0, 0, max_bytes=1 << 16, prefer=[dead]).status == 200
        assert c.failovers == 2


def test_errors_carry_the_brokers_fields(broker, topic, client):
    t = topic(1)
    produce_numbered(client, t, 20, keyed=False)
    client.truncate(t, 0, 5)
    with pytest.raises(errors.OffsetOutOfRange) as info:
        client.fetch(t, 0, 2, max_bytes=1024)
    assert info.value.extra["earliest"] == 5
    with pytest.raises(errors.UnknownTopic):
        client.describe_topic("never-created")


def test_gives_up_after_bounded_rounds_or_time():
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    t0 = time.monotonic()
    with BrokerClient(dead, rounds=3, backoff_ms=50) as c, pytest.raises(BrokersUnavailable):
        c.list_topics()
    assert time.monotonic() - t0 < 5
    t0 = time.monotonic()
    with BrokerClient(dead, failover_s=1.0, backoff_ms=50) as c, pytest.raises(BrokersUnavailable, match=r"1\.\d s"):
        c.list_topics()
    assert 1.0 <= time.monotonic() - t0 < 3


def test_rdd_read_with_a_dead_broker_listed_first(spark, broker, client, topic):
    t = topic(3)
    values = produce_numbered(client, t, 300)
    dead = f"http://127.0.0.1:{free_port()}"
    res = sparkio.read_rdd(spark.sparkContext, f"{dead},{broker.url}", t, min_partitions=4)
    assert sorted(r.value for r in res.rdd.collect()) == sorted(values)


def test_a_write_waits_out_its_leaders_failover(make_cluster):
    """A partition's leader SIGKILLed: the client's requests (a writer task's produce, then a read)
    keep failing over until a new leader is elected (conviction alone takes 5-13 s), with the
    default settings, and every record is stored once."""
    c = make_cluster(3)
    urls = [m.url for m in c]
    with BrokerClient(urls) as client:
        client.create_topic("writes", 1, replication_factor=3)
        first = [{"value": b"a%d" % i} for i in range(100)]
        deadline = time.monotonic() + 30
        while client.describe_topic("writes")["partitions"][0].get("leader") is None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        client.produce("writes", first, partition=0)
        victim = c.member(c.leaders("writes")[0])
        victim.kill()
        then = [{"value": b"b%d" % i} for i in range(100)]
        started = time.monotonic()
        client.produce("writes", then, partition=0)
        took_s = time.monotonic() - started
        answer = client.fetch("writes", 0, 0, max_bytes=1 << 20, prefer=[victim.url])
        values = [r.value for piece in decode_answer(answer, 0, 200) for r in piece.records()]
    assert values == [r["value"] for r in first + then], took_s
