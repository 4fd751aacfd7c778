"""``df.write.format("ring")`` and ``df.writeStream.format("ring")``.

Columns, as the Kafka sink: ``value`` (binary or string, required; a null
value writes a record without a value, Kafka's tombstone), ``key`` (binary or
string), ``topic`` (string; the ``topic`` option wins over it), ``partition``
(int; null lets the key place the record), ``headers``
(array<struct<key string, value binary>>, written in order, repeated names
kept), and ``timestamp`` (timestamp, which Kafka's sink does not take); other
columns are ignored. Rows are sent as msgpack records, buffered per (topic,
partition column) and cut at ``SPARK_WRITE_*_PER_REQUEST_MAX``. A keyed
record without a partition is placed by the broker with the same
``partition_for_key`` every producer goes through, so Spark-written records
land where any producer's would.

Delivery is at-least-once, as with Kafka's sink: a task Spark retries after a
partial write sends its rows again.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Iterator

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from ring import limits
from ring.errors import BadRequest
from sparkio.client import BrokerClient
from sparkio.failures import plain_errors
from sparkio.options import WriteOptions, parse_write_options

_RECORD_OVERHEAD_BYTES = 32  # msgpack map framing per record, for the byte budget


@dataclass
class WriteResult(WriterCommitMessage):
    records: dict[str, int] = field(default_factory=dict)  # per topic


@dataclass(frozen=True)
class Layout:
    """Where each column the writer uses sits in a row, and how to read it."""

    value: int
    value_is_string: bool
    key: int | None = None
    key_is_string: bool = False
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None
    timestamp: int | None = None


def layout_for(schema, topic_option: str | None) -> Layout:
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, ShortType,
                                   StringType, StructType, TimestampNTZType, TimestampType)

    cols = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}

    def col(name: str, *types) -> tuple[int | None, Any]:
        if name not in cols:
            return None, None
        i, t = cols[name]
        if not isinstance(t, types):
            allowed = " or ".join(tp.__name__.replace("Type", "").lower() for tp in types)
            raise BadRequest(f"column {name} must be {allowed}, not {t.simpleString()}")
        return i, t

    value, vt = col("value", BinaryType, StringType)
    if value is None:
        raise BadRequest("the DataFrame needs a value column (binary or string)")
    key, kt = col("key", BinaryType, StringType)
    topic, _ = col("topic", StringType)
    if topic is None and not topic_option:
        raise BadRequest("say where to write: the topic option or a topic column")
    partition, _ = col("partition", IntegerType, LongType, ShortType)
    headers, ht = col("headers", ArrayType)
    if headers is not None:
        et = ht.elementType
        names = [f.name for f in et.fields] if isinstance(et, StructType) else []
        if names != ["key", "value"] or not isinstance(et.fields[0].dataType, StringType) \
                or not isinstance(et.fields[1].dataType, (BinaryType, StringType)):
            raise BadRequest("column headers must be array<struct<key string, value binary>>")
    timestamp, _ = col("timestamp", TimestampType, TimestampNTZType)
    return Layout(value, isinstance(vt, StringType), key, isinstance(kt, StringType),
                  None if topic_option else topic, partition, headers, timestamp)


def _bytes(v: Any) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def _millis(t: dt.datetime) -> int:
    if t.tzinfo is None:
        t = t.astimezone()  # Spark hands TimestampType values over as local time
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)


def row_to_record(row: Any, lay: Layout) -> tuple[dict[str, Any], int]:
    """A msgpack record map for one row, and its approximate size."""
    rec: dict[str, Any] = {}
    size = _RECORD_OVERHEAD_BYTES
    value = row[lay.value]
    if value is not None:  # null: a record without a value (a tombstone), as Kafka writes it
        rec["value"] = _bytes(value)
        size += len(rec["value"])
    if lay.key is not None and row[lay.key] is not None:
        rec["key"] = _bytes(row[lay.key])
        size += len(rec["key"])
    if lay.headers is not None and row[lay.headers]:
        headers = [(h[0], None if h[1] is None else _bytes(h[1])) for h in row[lay.headers]]
        size += sum(len(k) + len(v or b"") for k, v in headers)
        rec["headers"] = headers
    if lay.timestamp is not None and row[lay.timestamp] is not None:
        rec["timestamp"] = _millis(row[lay.timestamp])
    return rec, size


class _Buffers:
    """Records waiting to be sent, per (topic, partition or None)."""

    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        self.pending: dict[tuple[str, int | None], tuple[list[dict], int]] = {}
        self.sent: dict[str, int] = {}

    def add(self, topic: str, partition: int | None, rec: dict, size: int) -> None:
        key = (topic, partition)
        recs, total = self.pending.get(key, ([], 0))
        recs.append(rec)
        total += size
        self.pending[key] = (recs, total)
        if len(recs) >= limits.SPARK_WRITE_RECORDS_PER_REQUEST_MAX or total >= limits.SPARK_WRITE_BYTES_PER_REQUEST_MAX:
            self.flush(key)

    def flush(self, key: tuple[str, int | None]) -> None:
        recs, _ = self.pending.pop(key)
        results = self.client.produce(key[0], recs, partition=key[1])
        written = sum(int(r.get("count", 0)) for r in results)
        if written != len(recs):
            raise BadRequest(f"{key[0]}: the broker acknowledged {written} of {len(recs)} records")
        self.sent[key[0]] = self.sent.get(key[0], 0) + written

    def flush_all(self) -> None:
        for key in list(self.pending):
            self.flush(key)


def write_rows(opts: WriteOptions, lay: Layout, rows: Iterator[Any]) -> WriteResult:
    """A task's whole write: every row acknowledged by the cluster, or an error."""
    with BrokerClient(opts.brokers) as client:
        buffers = _Buffers(client)
        for row in rows:
            topic = opts.topic or row[lay.topic]
            if not topic:
                raise BadRequest("a row has no topic and the topic option is not set")
            partition = None if lay.partition is None else row[lay.partition]
            rec, size = row_to_record(row, lay)
            buffers.add(topic, partition, rec, size)
        buffers.flush_all()
        return WriteResult(buffers.sent)


class RingWriter(DataSourceWriter):
    def __init__(self, options, schema, overwrite: bool) -> None:
        if overwrite:
            raise BadRequest("ring topics are append-only: use mode('append')")
        self.opts = parse_write_options(options)
        self.layout = layout_for(schema, self.opts.topic)

    @plain_errors
    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return write_rows(self.opts, self.layout, iterator)

    def commit(self, messages: list[WriteResult | None]) -> None:
        """Nothing to do: each task's records were acknowledged as it wrote them."""

    def abort(self, messages: list[WriteResult | None]) -> None:
        """Nothing can be taken back from a log; tasks that finished stay written."""


class RingStreamWriter(DataSourceStreamWriter):
    def __init__(self, options, schema, overwrite: bool) -> None:
        self.opts = parse_write_options(options)
        self.layout = layout_for(schema, self.opts.topic)

    @plain_errors
    def write(self, iterator: Iterator[Any]) -> WriteResult:
        return write_rows(self.opts, self.layout, iterator)

    def commit(self, messages: list[WriteResult | None], batchId: int) -> None:
        """Nothing to do: records were acknowledged as tasks wrote them."""

    def abort(self, messages: list[WriteResult | None], batchId: int) -> None:
        """Nothing can be taken back from a log."""
