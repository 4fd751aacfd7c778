"""A yardstick for the Spark part of ``ring bench``: the cheapest possible
Python data source with ring's schema.

It reads nothing: each task yields one prebuilt Arrow batch again and again
until it has handed over its share of ``rows`` rows of ``value_bytes``-byte
values, in ``PARTITIONS`` tasks. What Spark spends on it (a planning worker,
a Python worker per task, Arrow from Python to the JVM, rows out of it) is
what any Python source pays before it reads a byte, so the ring source's time
reads against it as well as against a local file.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

PARTITIONS = 6
BATCH_ROWS = 1_000  # about what ring's 1 MiB fetch answers hold of 1 KiB records


class _Share(InputPartition):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _Reader(DataSourceReader):
    def __init__(self, schema, rows: int, value_bytes: int, partitions: int) -> None:
        self.schema, self.rows, self.value_bytes, self.parts = schema, rows, value_bytes, partitions

    def partitions(self):
        return [_Share(self.rows // self.parts + (i < self.rows % self.parts)) for i in range(self.parts)]

    def read(self, share: _Share):
        import pyarrow as pa

        from sparkio.schema import arrow_schema

        schema_pa = arrow_schema(self.schema)
        n = BATCH_ROWS
        batch = pa.RecordBatch.from_arrays([
            pa.array([b"u00001"] * n, pa.binary()),
            pa.array([b"x" * self.value_bytes] * n, pa.binary()),
            pa.repeat(pa.scalar("t", pa.string()), n),
            pa.repeat(pa.scalar(0, pa.int32()), n),
            pa.array(range(n), pa.int64()),
            pa.array([1_700_000_000_000_000] * n, schema_pa.field("timestamp").type),
            pa.repeat(pa.scalar(0, pa.int32()), n),
        ], schema=schema_pa)
        left = share.rows
        while left > 0:
            yield batch if left >= n else batch.slice(0, left)
            left -= n


class FloorSource(DataSource):
    """``spark.read.format("ring-floor").option("rows", N).option("valueBytes", B)``
    (and ``partitions``, default ``PARTITIONS``, as many as the bench's topic)."""

    @classmethod
    def name(cls) -> str:
        return "ring-floor"

    def schema(self):
        from sparkio.schema import spark_schema

        return spark_schema(False)

    def reader(self, schema) -> _Reader:
        return _Reader(schema, int(self.options["rows"]), int(self.options.get("valueBytes", "1024")),
                       int(self.options.get("partitions", PARTITIONS)))
