"""``spark.read.format("ring")`` and ``spark.readStream.format("ring")``.

Spark's Python data source API runs each method in a different process:
``schema`` and ``partitions`` in a planning worker, ``read`` in executor
workers (the reader pickled over), and a stream reader's offset methods in one
long-lived worker per query. So every object here holds only parsed options
and plain values, opens its HTTP connections inside the method that needs
them, and closes them before returning.

Batch: the planner resolves one offset range per partition, the range
calculator cuts them into splits, one Spark task reads each split.

Streaming: an offset is Kafka's ``{"topic": {"partition": next offset}}``,
kept by Spark in the checkpoint's offset log before a micro-batch runs, so a
restarted query re-reads exactly the ranges it had planned and then continues
from their end: nothing lost, nothing read twice (given an idempotent or
transactional sink, as with Kafka). ``maxOffsetsPerTrigger`` is a
``ReadMaxRows`` limit spread over partitions by backlog; ``Trigger.AvailableNow``
pins the high watermarks seen at start and reads up to them in as many
rate-limited batches as needed. Partitions and, with ``subscribePattern``,
topics that appear later are read from their earliest offset.
"""

from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from sparkio import planner
from sparkio.client import BrokerClient
from sparkio.fetch import read_split
from sparkio.options import ReadOptions, _bool, lower_keys, parse_read_options
from sparkio.ranges import OffsetRange, rate_limit, split_ranges
from sparkio.schema import arrow_schema, spark_schema, to_arrow


class SplitPartition(InputPartition):
    """One Spark task's work: a split, or None for "nothing to read"."""

    def __init__(self, split: OffsetRange | None) -> None:
        super().__init__(split)
        self.split = split


def read_arrow(opts: ReadOptions, split: OffsetRange | None, schema) -> Iterator:
    """Arrow record batches of one split: what a task returns to Spark."""
    if split is None or split.size == 0:
        return
    schema_pa = arrow_schema(schema)
    with BrokerClient(opts.brokers) as client:
        for records in read_split(client, split, fail_on_data_loss=opts.fail_on_data_loss,
                                  fetch_max_bytes=opts.fetch_max_bytes, poll_timeout_ms=opts.poll_timeout_ms):
            yield to_arrow(records, split.topic, split.partition, schema_pa, opts.include_headers)


def _splits(opts: ReadOptions, ranges: list[OffsetRange]) -> list[OffsetRange]:
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


class RingBatchReader(DataSourceReader):
    def __init__(self, options, schema) -> None:
        self.opts = parse_read_options(options, streaming=False)
        self.schema = schema

    def partitions(self) -> list[SplitPartition]:
        with BrokerClient(self.opts.brokers) as client:
            splits = _splits(self.opts, planner.batch_ranges(client, self.opts))
        # Spark wants at least one partition even when there is nothing to read.
        return [SplitPartition(s) for s in splits] or [SplitPartition(None)]

    def read(self, partition: SplitPartition) -> Iterator:
        return read_arrow(self.opts, partition.split, self.schema)


class RingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options, schema) -> None:
        self.opts = parse_read_options(options, streaming=True)
        self.schema = schema
        # Trigger.AvailableNow: the high watermarks at query start, never passed.
        self.target: dict[planner.PartitionKey, int] | None = None

    def initialOffset(self) -> dict:
        with BrokerClient(self.opts.brokers) as client:
            return planner.to_json_offsets(planner.initial_offsets(client, self.opts))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with BrokerClient(self.opts.brokers) as client:
            states = planner.partition_states(client, self.opts.subscription, missing_ok=True)
        self.target = planner.latest_offsets(states.values())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = planner.from_json_offsets(start)
        with BrokerClient(self.opts.brokers) as client:
            states = planner.partition_states(client, self.opts.subscription, missing_ok=True)
        latest = planner.latest_offsets(states.values())
        if self.target is not None:
            # A partition born after the query started is not part of "now".
            latest = {tp: min(off, self.target[tp]) for tp, off in latest.items() if tp in self.target}
        for tp in latest:
            begin.setdefault(tp, states[tp].earliest)
            # A watermark never moves back, but a different broker may answer
            # with an older view: never plan backwards.
            latest[tp] = max(latest[tp], begin[tp])
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit({tp: begin[tp] for tp in latest}, latest, limit.max_rows)
        # Keep partitions that vanished (a deleted topic) where they were.
        return planner.to_json_offsets({**planner.from_json_offsets(start), **latest})

    def partitions(self, start: dict, end: dict) -> list[SplitPartition]:
        with BrokerClient(self.opts.brokers) as client:
            ranges = planner.stream_ranges(client, self.opts, planner.from_json_offsets(start),
                                           planner.from_json_offsets(end))
        return [SplitPartition(s) for s in _splits(self.opts, ranges)]

    def read(self, partition: SplitPartition) -> Iterator:
        return read_arrow(self.opts, partition.split, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: ring keeps no per-query state; the checkpoint is Spark's."""


class RingDataSource(DataSource):
    """Registered as ``ring``; see sparkio's package docstring for options."""

    @classmethod
    def name(cls) -> str:
        return "ring"

    def schema(self):
        return spark_schema(_bool("includeHeaders", lower_keys(self.options).get("includeheaders", "false")))

    def reader(self, schema) -> RingBatchReader:
        return RingBatchReader(self.options, schema)

    def streamReader(self, schema) -> RingStreamReader:
        return RingStreamReader(self.options, schema)

    def writer(self, schema, overwrite: bool):
        from sparkio.writer import RingWriter

        return RingWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from sparkio.writer import RingStreamWriter

        return RingStreamWriter(self.options, schema, overwrite)
