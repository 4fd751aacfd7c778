"""``sparkio.read_rdd``: a partitioned RDD of ring records, one Spark partition per split.

The driver plans exactly as the DataFrame source does (watermarks, offset
options, the range calculator), then ships the splits with
``sc.parallelize(splits, len(splits))``, which puts one split in each Spark
partition, and maps each to its records. What the RDD read is returned with
it, so a job can record the ranges it processed (to resume from their ends,
or to audit exactly-once delivery).
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

from sparkio.client import BrokerClient
from sparkio.failures import plain_iter
from sparkio.fetch import read_records
from sparkio.holders import by_range
from sparkio.options import ReadOptions, parse_read_options
from sparkio.planner import batch_ranges
from sparkio.ranges import OffsetRange, split_ranges


class RingRecord(NamedTuple):
    key: bytes | None
    value: bytes | None  # None: a record without a value (a tombstone)
    topic: str
    partition: int
    offset: int
    timestamp: int  # ms since the epoch
    headers: list[tuple[str, bytes | None]] | None  # in order; a name may repeat


class ReadResult(NamedTuple):
    """``rdd``: RingRecords, in offset order within each Spark partition;
    ``ranges``: the splits, ``ranges[i]`` is what Spark partition ``i`` holds."""

    rdd: Any
    ranges: list[OffsetRange]


def _read_partition(opts: ReadOptions, splits: Iterable[OffsetRange]) -> Iterator[RingRecord]:
    return plain_iter(_records(opts, splits))


def _records(opts: ReadOptions, splits: Iterable[OffsetRange]) -> Iterator[RingRecord]:
    # Runs in an executor: connections are opened here, never pickled.
    with BrokerClient(opts.brokers) as client:
        for split in splits:
            for records in read_records(client, split, fail_on_data_loss=opts.fail_on_data_loss,
                                        fetch_max_bytes=opts.fetch_max_bytes,
                                        poll_timeout_ms=opts.poll_timeout_ms):
                for r in records:
                    yield RingRecord(r.key, r.value, split.topic, split.partition, r.offset,
                                     r.timestamp, r.headers)


def read_rdd(
    sc: Any,
    brokers: str | Iterable[str],
    topics: str | Iterable[str],
    starting_offsets: str | Mapping[str, Mapping[Any, int]] = "earliest",
    ending_offsets: str | Mapping[str, Mapping[Any, int]] = "latest",
    min_partitions: int | None = None,
    max_records_per_partition: int | None = None,
    *,
    fail_on_data_loss: bool = True,
    fetch_max_bytes: int | None = None,
) -> ReadResult:
    """Read ``topics`` between two offset positions as an RDD of RingRecord.

    ``starting_offsets``/``ending_offsets``: ``"earliest"``, ``"latest"`` (an
    end only), or ``{"topic": {partition: offset}}`` naming every partition (a
    dict or its JSON text; -2 earliest, -1 latest), as the DataFrame options. Raises
    ``ring.errors`` on bad arguments, unknown topics, and (with
    ``fail_on_data_loss``) offsets the brokers no longer hold.
    """
    names = [topics] if isinstance(topics, str) else list(topics)
    options: dict[str, Any] = {
        "brokers": brokers if isinstance(brokers, str) else ",".join(brokers),
        "subscribe": ",".join(names),
        "startingOffsets": starting_offsets,
        "endingOffsets": ending_offsets,
        "failOnDataLoss": fail_on_data_loss,
    }
    if min_partitions is not None:
        options["minPartitions"] = min_partitions
    if max_records_per_partition is not None:
        options["maxRecordsPerPartition"] = max_records_per_partition
    if fetch_max_bytes is not None:
        options["fetchMaxBytes"] = fetch_max_bytes
    opts = parse_read_options(options, streaming=False)
    with BrokerClient(opts.brokers) as client:
        splits = split_ranges(by_range(client, batch_ranges(client, opts)), opts.min_partitions,
                              opts.max_records_per_partition)
    rdd = sc.parallelize(splits, max(len(splits), 1)).mapPartitions(
        functools.partial(_read_partition, opts), preservesPartitioning=True)
    return ReadResult(rdd, splits)
