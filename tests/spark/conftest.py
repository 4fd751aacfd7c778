"""Fixtures for the Spark suite: one local SparkSession and one real broker
for the whole session, and helpers that create a fresh topic per test.

Spark needs Java and the ``spark`` extra (pyspark, pyarrow), both of which
``make test`` installs; without them the suite is skipped with the reason,
never half-run, and under CI=true the run fails.
"""

from __future__ import annotations

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


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(item.fspath).parents]
    if ours and os.environ.get("CI") == "true":
        raise pytest.UsageError(f"{SKIP_REASON} (CI=true: `make test` installs the Spark extra and Java)")
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


_names = itertools.count()


@pytest.fixture(scope="session")
def spark():
    from sparkio.session import local_session

    # py4j logs "Closing down clientserver connection" at INFO from __del__ while the
    # interpreter exits, into pytest's already closed capture stream: a traceback
    # printed after the summary line. Its warnings and errors still show.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    session = local_session("ring-tests", cores=2, shuffle_partitions=2)
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
