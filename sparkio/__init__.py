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

Reader options (Kafka's names; case does not matter):

==========================  ================================================
brokers                     comma-separated broker URLs (required)
subscribe                   comma-separated topics  \\
subscribePattern            regex over topic names   > exactly one of these
assign                      ``{"topic": [0, 1]}``    /
startingOffsets             earliest | latest | ``{"t": {"0": 23, "1": -2}}``
                            (-2 earliest, -1 latest; default earliest for
                            batch, latest for streams)
endingOffsets               latest | ``{"t": {"0": 50}}`` (batch only)
startingTimestamp           ms: first offset with timestamp >= it, per partition
endingTimestamp             ms: exclusive end, likewise (batch only)
startingOffsetsByTimestamp  ``{"t": {"0": ms}}``; endingOffsetsByTimestamp too
minPartitions               at least this many splits (big ranges are cut)
maxRecordsPerPartition      no split holds more records than this
maxOffsetsPerTrigger        streams: records per micro-batch, over all partitions
failOnDataLoss              true (default): offsets removed by retention or
                            truncation fail the query; false: skip them
includeHeaders              false (default); true adds the headers column
fetchMaxBytes, pollTimeoutMs  fetch size per request; how long a task waits
                            for committed offsets a replica does not serve yet
==========================  ================================================

Writer options: ``brokers``, ``topic`` (else a ``topic`` column). See
``sparkio.writer`` for the columns it reads.
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
