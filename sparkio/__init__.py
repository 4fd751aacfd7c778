"""sparkio: Spark reads and writes ring, in pure Python.

Three ways in, all sharing one planner (``planner``), one range calculator
(``ranges``) and one split reader (``fetch``):

- ``read_rdd(sc, brokers, topics, starting_offsets, ending_offsets,
  min_partitions, max_records_per_partition)`` -> ``ReadResult(rdd, ranges)``:
  an RDD of ``RingRecord(key, value, topic, partition, offset, timestamp,
  headers)`` with one Spark partition per split, and the splits it read.
- ``register(spark)`` registers the data source ``ring`` for
  ``spark.read``/``readStream``/``write``/``writeStream``.
- ``pipeline.clickstream_job(spark, brokers, ...)``: the demo's job.

Options, columns and refusals are the Kafka connector's (``subscribe``,
``startingOffsets``, ``kafka.bootstrap.servers`` ...); docs/SPARK.md has the
table, option by option, with every difference from Kafka and why.
"""

from __future__ import annotations

from typing import Any

from sparkio.ranges import OffsetRange, split_ranges

__all__ = ["OffsetRange", "ReadResult", "RingRecord", "read_rdd", "register", "split_ranges"]


def register(spark: Any) -> None:
    """Make ``format("ring")`` available in this SparkSession."""
    from sparkio.source import RingDataSource

    spark.dataSource.register(RingDataSource)


def __getattr__(name: str) -> Any:
    # The RDD reader needs only the driver's pyspark; imported lazily so the
    # pure modules work without Spark installed.
    if name in ("read_rdd", "ReadResult", "RingRecord"):
        from sparkio import rdd

        return getattr(rdd, name)
    raise AttributeError(name)
