"""The clickstream job: sessions and top pages per minute, read from ring
and written back to ring. ``examples/clickstream_job.py`` wraps it for
``spark-submit``; ``make demo`` calls ``clickstream_job`` directly.

Input values are JSON page views as ``ring.clickstream`` makes them:
``{"ts": ms, "user", "session", "page", "referrer", "device", "country",
"duration_ms"}``. For each minute of event time the job counts page views,
distinct sessions and users, the mean time on page, and the ``top_n`` pages
by views (ties broken by page name, so the answer is deterministic). Output
records are JSON, keyed by the minute, so re-running the job over the same
input writes the same keys to the same partitions.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Iterable

EVENT_DDL = ("ts long, user string, session string, page string, referrer string, device string, "
             "country string, duration_ms long")


@dataclass
class JobResult:
    rows: list[dict[str, Any]]  # one per minute, in time order (see minute_row)
    events: int  # page views read
    malformed: int  # values that were not clickstream JSON (skipped)
    written: int  # records written to out_topic (0 when not writing)
    out_topic: str | None

    def table(self) -> str:
        return format_table(self.rows)


def aggregates(raw, top_n: int = 3):
    """Per-minute aggregates of a DataFrame with the ring ``value`` column."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    events = (raw.select(F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e"))
              .select("e.*").where(F.col("ts").isNotNull() & F.col("page").isNotNull())
              .withColumn("minute_ms", (F.floor(F.col("ts") / 60_000) * 60_000).cast("long")))
    per_minute = events.groupBy("minute_ms").agg(
        F.count(F.lit(1)).alias("views"),
        F.countDistinct("session").alias("sessions"),
        F.countDistinct("user").alias("users"),
        F.round(F.avg("duration_ms")).cast("long").alias("avg_duration_ms"),
    )
    rank = Window.partitionBy("minute_ms").orderBy(F.desc("views"), F.asc("page"))
    top = (events.groupBy("minute_ms", "page").agg(F.count(F.lit(1)).alias("views"))
           .withColumn("rank", F.row_number().over(rank)).where(F.col("rank") <= top_n)
           .groupBy("minute_ms")
           .agg(F.sort_array(F.collect_list(F.struct("rank", "page", "views"))).alias("ranked"))
           .select("minute_ms", F.expr("transform(ranked, x -> named_struct('page', x.page, 'views', x.views))")
                   .alias("top_pages")))
    return per_minute.join(top, "minute_ms").orderBy("minute_ms")


def minute_row(row) -> dict[str, Any]:
    # Minutes travel as epoch milliseconds and are formatted here, in UTC:
    # Spark's own timestamp rendering depends on the session's time zone.
    minute = dt.datetime.fromtimestamp(row.minute_ms / 1000, tz=dt.timezone.utc)
    return {
        "minute": minute.strftime("%Y-%m-%dT%H:%MZ"),
        "minute_ms": row.minute_ms,
        "views": row.views,
        "sessions": row.sessions,
        "users": row.users,
        "avg_duration_ms": row.avg_duration_ms,
        "top_pages": [{"page": p.page, "views": p.views} for p in row.top_pages],
    }


def format_table(rows: Iterable[dict[str, Any]]) -> str:
    lines = [f"{'minute (UTC)':<18} {'views':>6} {'sessions':>8} {'users':>6} {'avg s':>6}  top pages"]
    for r in rows:
        top = ", ".join(f"{p['page']} ({p['views']})" for p in r["top_pages"])
        lines.append(f"{r['minute']:<18} {r['views']:>6} {r['sessions']:>8} {r['users']:>6} "
                     f"{r['avg_duration_ms'] / 1000:>6.1f}  {top}")
    return "\n".join(lines)


def clickstream_job(
    spark,
    brokers: str,
    topic: str = "clicks",
    out_topic: str | None = "clicks-per-minute",
    *,
    top_n: int = 3,
    min_partitions: int | None = None,
    show: bool = True,
) -> JobResult:
    """Read all of ``topic``, aggregate per minute, print, write to ``out_topic``.

    ``spark`` needs the ``ring`` source registered (``sparkio.register``, or
    a session from ``sparkio.session.local_session``). ``out_topic=None``
    skips the write. Returns the rows as plain dicts.
    """
    reader = spark.read.format("ring").option("brokers", brokers).option("subscribe", topic)
    if min_partitions:
        reader = reader.option("minPartitions", str(min_partitions))
    raw = reader.load().cache()
    try:
        total = raw.count()
        agg = aggregates(raw, top_n).cache()
        rows = [minute_row(r) for r in agg.collect()]
        events = sum(r["views"] for r in rows)
        written = 0
        if out_topic and rows:
            # One small record per minute: built from the collected rows.
            out = spark.createDataFrame([(r["minute"], json.dumps(r, separators=(",", ":"))) for r in rows],
                                        "key string, value string")
            out.write.format("ring").option("brokers", brokers).option("topic", out_topic).mode("append").save()
            written = len(rows)
        agg.unpersist()
    finally:
        raw.unpersist()
    result = JobResult(rows, events, total - events, written, out_topic)
    if show:
        print(f"{events} page views in {len(rows)} minutes from topic {topic!r}"
              + (f" ({result.malformed} malformed values skipped)" if result.malformed else ""))
        print(result.table())
        if out_topic:
            print(f"wrote {written} per-minute records to topic {out_topic!r}")
    return result


def produce_clickstream(brokers: str, topic: str, count: int, *, partitions: int = 6, seed: int = 7,
                        chunk: int = 1_000) -> int:
    """Create ``topic`` if needed and produce ``count`` clickstream events keyed
    by user, with the event time as the record timestamp. Returns ``count``."""
    from ring import clickstream, errors
    from sparkio.client import BrokerClient
    from sparkio.options import parse_brokers

    with BrokerClient(parse_brokers(brokers)) as client:
        try:
            # The events carry their own (past) times: kept forever, retention never takes them.
            client.create_topic(topic, partitions, retention_ms=-1)
        except errors.Conflict:
            pass
        batch: list[dict[str, Any]] = []
        for event in clickstream.events(count, seed=seed):
            batch.append({"key": event["user"], "value": json.dumps(event, separators=(",", ":")).encode(),
                          "timestamp": event["ts"]})
            if len(batch) >= chunk:
                client.produce(topic, batch)
                batch = []
        if batch:
            client.produce(topic, batch)
    return count
