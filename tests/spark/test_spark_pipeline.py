"""The clickstream job end to end: generated events in, per-minute
aggregates out, checked against the same numbers computed in plain Python,
and the aggregates written back to ring."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import sparkio
from ring import clickstream
from sparkio.pipeline import clickstream_job, produce_clickstream


def test_clickstream_job_matches_a_plain_python_count(spark, broker, client, topic, capsys):
    src, out = topic(4, prefix="clicks"), topic(2, prefix="per-minute")
    produce_clickstream(broker.url, src, 2_000, partitions=4)
    client.produce(src, [{"value": b"not json"}])  # a stray record must not break the job

    result = clickstream_job(spark, broker.url, src, out, top_n=3, min_partitions=5)

    events = list(clickstream.events(2_000))
    minutes: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        minutes[e["ts"] // 60_000 * 60_000].append(e)
    assert result.events == 2_000 and result.malformed == 1
    assert [r["minute_ms"] for r in result.rows] == sorted(minutes)
    for row in result.rows:
        evs = minutes[row["minute_ms"]]
        assert row["views"] == len(evs)
        assert row["sessions"] == len({e["session"] for e in evs})
        assert row["users"] == len({e["user"] for e in evs})
        pages = sorted(Counter(e["page"] for e in evs).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        assert [(p["page"], p["views"]) for p in row["top_pages"]] == pages
    printed = capsys.readouterr().out
    assert "top pages" in printed and result.rows[0]["minute"] in printed

    written = sparkio.read_rdd(spark.sparkContext, broker.url, out).rdd.collect()
    assert result.written == len(written) == len(result.rows)
    by_minute = {r.key.decode(): json.loads(r.value) for r in written}
    assert by_minute == {r["minute"]: r for r in result.rows}
