"""The DataFrame layout of ring records, and records to Arrow batches.

Columns are the Kafka connector's, in its order, so queries written against
Kafka run unchanged: key binary, value binary, topic string, partition int,
offset long, timestamp timestamp, timestampType int, and, with
``includeHeaders``, headers array<struct<key string, value binary>> (in the
producer's order, a name possibly repeated). A record without a value (a
tombstone) has a null value.
``timestampType`` is always 0 (create time): ring keeps the producer's
timestamp, or the broker's clock when the producer gave none, and does not
record which. A record without headers has null headers, as in Kafka.

Tasks hand Spark one Arrow record batch per fetch answer instead of a tuple
per record: Spark's tuple path converts value by value in Python. The batch
is built column by column from the stored batches' msgpack payloads (keys
and values straight from the decoded lists, offsets and timestamps as
arithmetic in Arrow), with no object per record.
"""

from __future__ import annotations

from typing import Sequence

from ring.log.batch import Header, header_pairs

DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"


def spark_schema(include_headers: bool):
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                                   StructField, StructType, TimestampType)

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def arrow_schema(schema):
    """The exact Arrow schema Spark checks returned batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def headers_list(headers: list[Header] | None) -> list[dict] | None:
    if not headers:
        return None
    return [{"key": k, "value": v} for k, v in headers]


def to_arrow(pieces: Sequence, topic: str, partition: int, schema_pa, include_headers: bool):
    """One Arrow record batch of ``pieces`` (``sparkio.fetch.Piece``, consecutive, one partition)."""
    import pyarrow as pa

    keys: list = []
    values: list = []
    headers: list = []
    micros: list[int] = []  # Spark's timestamps are µs
    for piece in pieces:
        deltas, ks, vs, hs = zip(*piece.items())
        keys.extend(ks)
        values.extend(vs)
        if include_headers:
            headers.extend(hs)
        first_us = piece.header.first_timestamp * 1000
        micros.extend([first_us + d * 1000 for d in deltas])
    n = len(values)
    first = pieces[0].first if pieces else 0
    # No pyarrow.compute here: each of its calls retries a failed import (~0.2 ms).
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(range(first, first + n), pa.int64()),
        pa.array(micros, schema_pa.field("timestamp").type),
        pa.repeat(pa.scalar(0, pa.int32()), n),
    ]
    if include_headers:
        columns.append(pa.array([headers_list(header_pairs(h)) if h else None for h in headers],
                                schema_pa.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema_pa)
