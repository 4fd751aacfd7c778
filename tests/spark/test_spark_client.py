"""The client every Spark task uses, against a real broker: failover past
dead addresses, 4xx raised as ring errors with the body's fields, and a
bounded give-up when no broker answers."""

from __future__ import annotations

import time

import pytest

import sparkio
from ring import errors
from ring.localcluster import free_port
from sparkio.client import BrokerClient, BrokersUnavailable
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


def test_gives_up_after_bounded_rounds():
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    t0 = time.monotonic()
    with BrokerClient(dead, rounds=3, backoff_ms=50) as c, pytest.raises(BrokersUnavailable):
        c.list_topics()
    assert time.monotonic() - t0 < 5


def test_rdd_read_with_a_dead_broker_listed_first(spark, broker, client, topic):
    t = topic(3)
    values = produce_numbered(client, t, 300)
    dead = f"http://127.0.0.1:{free_port()}"
    res = sparkio.read_rdd(spark.sparkContext, f"{dead},{broker.url}", t, min_partitions=4)
    assert sorted(r.value for r in res.rdd.collect()) == sorted(values)
