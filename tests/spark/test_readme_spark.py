"""The Spark examples run as written: docs/SPARK.md's (broker addresses and checkpoint directory
swapped for this test's) and the README tour's Spark step, after the tour's shell block on three
brokers."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

from tests.docs import Shell, code, run_cluster_stop
from tests.test_readme import finish_tour, run_tour


def _run(source: str, name: str) -> list[str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, name, "exec"), {})
    return out.getvalue().splitlines()


def test_spark_example_runs_as_written(spark, broker, tmp_path) -> None:
    source = (code("spark-example")
              .replace("http://localhost:9250", broker.url)
              .replace("/tmp/ring-readme-checkpoint", str(tmp_path / "checkpoint")))
    lines = _run(source, "docs/SPARK.md")
    per_user = lines[0]
    assert per_user.count("Row(user=") == 7 and sum(map(int, re.findall(r"count=(\d+)", per_user))) == 100
    count, splits = re.fullmatch(r"(\d+) records in (\d+) splits", lines[1]).groups()
    assert int(count) == 100 and int(splits) >= 4
    assert lines[2] == "[Row(count(1)=100)]"


def test_kafka_style_example_runs_as_written(spark, broker, client) -> None:
    if "clicks" not in client.list_topics():
        client.create_topic("clicks", 2)
    client.produce("clicks", [{"value": b"a"}, {"value": b"b"}])
    address = broker.url.removeprefix("http://")
    source = code("spark-kafka-example").replace("localhost:9250", address).replace("localhost:9260", address)
    scope: dict = {}
    exec(compile(source, "docs/SPARK.md", "exec"), scope)
    ends = sum(p["high_watermark"] for p in client.describe_topic("clicks")["partitions"])
    assert ends >= 2 and scope["df"].count() == ends


def test_the_tours_spark_step_runs_as_written(spark, tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    try:
        run_tour(shell)
        lines = _run(shell.local(code("tour-spark")), "README.md")
        rows = [re.split(r"\s*\|\s*", line.strip("|").strip()) for line in lines if line.startswith("|")]
        assert rows[0] == ["partition", "offset", "value"]
        values = {(int(p), int(o)): json.loads(v) for p, o, v in rows[1:]}
        assert values[(2, 0)] == {"item": "book", "qty": 1} and values[(2, 1)] == {"item": "lamp", "qty": 2}
        assert len(values) == 4 and {"bob", "carol"} == {v.get("user") for v in values.values()} - {None}
        finish_tour(shell)
    finally:
        run_cluster_stop(shell)
