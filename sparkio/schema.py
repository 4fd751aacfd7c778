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
per record: Spark's tuple path converts value by value in Python.
"""

from __future__ import annotations

from typing import Sequence

from ring.log.batch import Header, Record

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


def to_arrow(records: Sequence[Record], topic: str, partition: int, schema_pa, include_headers: bool):
    """One Arrow record batch of ``records`` (all from one partition)."""
    import pyarrow as pa

    n = len(records)
    columns = [
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.value for r in records], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp * 1000 for r in records], pa.int64()).cast(schema_pa.field("timestamp").type),
        pa.array([0] * n, pa.int32()),
    ]
    if include_headers:
        columns.append(pa.array([headers_list(r.headers) for r in records], schema_pa.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema_pa)
