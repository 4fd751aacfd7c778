"""Fixtures for the Spark suite: one local SparkSession and one real broker
for the whole session, and helpers that create a fresh topic per test.

Spark needs Java and the ``spark`` extra (pyspark, pyarrow), both of which
``make test`` installs; without them the suite is skipped with the reason,
never half-run, and under CI=true the run fails. The session also carries
Spark's own Kafka source (``ring.bench.spark_kafka_jars``, from Maven
Central, which ``make test`` installs and a run installs when missing);
without it the tests marked ``kafka_source`` skip with the reason, and under
CI=true the run fails.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
from pathlib import Path

import pytest

from ring.bench.spark import missing
from ring.localcluster import LocalBroker, free_port
from sparkio.client import BrokerClient

SKIP_REASON = missing()


@functools.cache
def kafka_source_jars() -> tuple[str, list[str]] | str:
    """(connector version, jars) of Spark's Kafka source, installed when missing; or why not."""
    from ring.bench.spark_kafka_jars import jars

    return jars()


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(item.fspath).parents]
    if SKIP_REASON is not None:
        if ours and os.environ.get("CI") == "true":
            raise pytest.UsageError(f"{SKIP_REASON} (CI=true: `make test` installs the Spark extra and Java)")
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
        return
    kafka = [item for item in ours if item.get_closest_marker("kafka_source")]
    if kafka and isinstance(kafka_source_jars(), str):
        why = f"Spark's Kafka source is not installed: {kafka_source_jars()}"
        if os.environ.get("CI") == "true":
            raise pytest.UsageError(f"{why} (CI=true: `make test` installs it with mvn)")
        for item in kafka:
            item.add_marker(pytest.mark.skip(reason=why))


_names = itertools.count()


@pytest.fixture(scope="session")
def spark():
    from sparkio.session import local_session

    # py4j logs "Closing down clientserver connection" at INFO from __del__ while the
    # interpreter exits, into pytest's already closed capture stream: a traceback
    # printed after the summary line. Its warnings and errors still show.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    kafka = kafka_source_jars()  # on the classpath from the start: a session cannot load a source later
    conf = {"spark.jars": ",".join(kafka[1])} if not isinstance(kafka, str) else {}
    session = local_session("ring-tests", cores=2, shuffle_partitions=2, conf=conf)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    root: Path = tmp_path_factory.mktemp("spark-broker")
    b = LocalBroker("ring-0", root / "ring-0", free_port(), args=["--fsync", "never", "--log-level", "warning"])
    b.start()
    yield b
    b.stop()


@pytest.fixture
def client(broker):
    with BrokerClient([broker.url]) as c:
        yield c


@pytest.fixture
def topic(request, client):
    """A factory of fresh topic names (created with ``partitions``)."""

    def make(partitions: int = 3, prefix: str | None = None) -> str:
        base = prefix or request.node.name.split("[")[0].replace("test_", "")[:40]
        name = f"{base}-{next(_names)}".replace("_", "-")
        client.create_topic(name, partitions)
        return name

    return make


def produce_numbered(client: BrokerClient, topic: str, count: int, *, first: int = 0, keyed: bool = True,
                     timestamp_ms: int | None = None, headers: bool = False, chunk: int = 500) -> list[bytes]:
    """Produce values b"v<n>" (n = first .. first+count-1); returns the values."""
    values = []
    for lo in range(first, first + count, chunk):
        recs = []
        for n in range(lo, min(lo + chunk, first + count)):
            rec = {"value": b"v%06d" % n}
            if keyed:
                rec["key"] = b"k%d" % (n % 97)
            if timestamp_ms is not None:
                rec["timestamp"] = timestamp_ms + n
            if headers:
                rec["headers"] = [("n", str(n).encode()), ("src", b"test")]
            recs.append(rec)
            values.append(rec["value"])
        client.produce(topic, recs)
    return values


def read_df(spark, urls: str | None, **options):
    """``spark.read.format("ring")`` with ``brokers`` (unless None) and options (JSON for non-strings)."""
    r = spark.read.format("ring")
    if urls is not None:
        r = r.option("brokers", urls)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    return r.load()


def offsets(df) -> dict[int, list[int]]:
    """The offsets a DataFrame read, per partition, sorted."""
    out: dict[int, list[int]] = {}
    for row in df.select("partition", "offset").collect():
        out.setdefault(row.partition, []).append(row.offset)
    return {p: sorted(v) for p, v in sorted(out.items())}
