"""``spark.read.format("ring")`` and ``spark.readStream.format("ring")``.

Spark's Python data source API runs each method in a different process:
``schema`` and ``partitions`` in a planning worker, ``read`` in executor
workers (the reader pickled over), and a stream reader's offset methods in one
long-lived worker per query. So every object here holds only parsed options
and plain values, opens its HTTP connections inside the method that needs
them, and closes them before returning.

Batch: the planner resolves one offset range per partition, the range
calculator cuts them into splits, one Spark task reads each split.

Streaming: an offset is Kafka's ``{"topic": {"partition": next offset}}``
(plus when each topic was created, see ``sparkio.planner``), kept by Spark in
the checkpoint's offset log before a micro-batch runs, so a restarted query
re-reads exactly the ranges it had planned and then continues from their end:
nothing lost, nothing read twice (given an idempotent or transactional sink,
as with Kafka). ``maxOffsetsPerTrigger`` is a ``ReadMaxRows`` limit spread
over partitions by backlog; ``minOffsetsPerTrigger`` holds a trigger back
until that many records wait or ``maxTriggerDelay`` has passed since the last
batch (Kafka's delayBatch, kept in the reader, which lives as long as the
query); ``Trigger.AvailableNow`` pins the high watermarks seen at start and
reads up to them in as many rate-limited batches as needed (ignoring
minOffsetsPerTrigger, which could otherwise wait forever). Partitions and,
with ``subscribePattern``, topics that appear later are read from their
earliest offset; deleted or re-created topics are data loss
(``sparkio.stream_offsets``).

Every method Spark calls reports ring's errors as one line
(``sparkio.failures``), and a stream reader whose options are wrong is still
built (Spark's stream runner cannot report an error raised while building
it): it refuses at its first call.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from ring.clock import SystemClock
from ring.errors import BadRequest, RingError
from sparkio import planner, stream_offsets
from sparkio.client import BrokerClient
from sparkio.failures import plain_errors, plain_iter
from sparkio.fetch import read_split
from sparkio.holders import by_range
from sparkio.options import ReadOptions, _bool, lower_keys, parse_read_options
from sparkio.ranges import OffsetRange, rate_limit, split_ranges
from sparkio.schema import arrow_schema, spark_schema, to_arrow

log = logging.getLogger("sparkio")


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
        for pieces in read_split(client, split, fail_on_data_loss=opts.fail_on_data_loss,
                                 fetch_max_bytes=opts.fetch_max_bytes, poll_timeout_ms=opts.poll_timeout_ms):
            yield to_arrow(pieces, split.topic, split.partition, schema_pa, opts.include_headers)


def _splits(opts: ReadOptions, ranges: list[OffsetRange]) -> list[OffsetRange]:
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)


def _check_schema(schema, options: dict) -> None:
    """Kafka's source has a fixed schema and refuses a user's (Spark hands it
    over instead of asking ours, so one equal to ours cannot be told apart)."""
    ours = spark_schema(_bool("includeHeaders", lower_keys(options).get("includeheaders", "false")))
    if schema != ours:
        raise BadRequest(f"the ring source has a fixed schema ({ours.simpleString()}) and takes no other: "
                         "remove .schema(...) from the reader")


class RingBatchReader(DataSourceReader):
    def __init__(self, options, schema) -> None:
        _check_schema(schema, options)
        self.opts = parse_read_options(options, streaming=False)
        self.schema = schema
        for ignored in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if ignored.lower() in lower_keys(options):
                log.warning("option %s is ignored by batch queries", ignored)

    @plain_errors
    def partitions(self) -> list[SplitPartition]:
        with BrokerClient(self.opts.brokers) as client:
            splits = _splits(self.opts, by_range(client, planner.batch_ranges(client, self.opts)))
        # Spark wants at least one partition even when there is nothing to read.
        return [SplitPartition(s) for s in splits] or [SplitPartition(None)]

    def read(self, partition: SplitPartition) -> Iterator:
        return plain_iter(read_arrow(self.opts, partition.split, self.schema))


class RingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options, schema) -> None:
        self.schema = schema
        self.clock = SystemClock()
        # Trigger.AvailableNow: the high watermarks at query start, never passed.
        self.target: dict[str, Any] | None = None
        self.last_trigger_ms = 0  # when the last batch was let through (minOffsetsPerTrigger)
        self.refusal: RingError | None = None
        try:
            _check_schema(schema, options)
            self.opts: ReadOptions | None = parse_read_options(options, streaming=True)
        except RingError as exc:
            self.refusal, self.opts = exc, None

    def _options(self) -> ReadOptions:
        if self.refusal is not None:
            raise self.refusal
        assert self.opts is not None
        return self.opts

    @plain_errors
    def initialOffset(self) -> dict:
        opts = self._options()
        with BrokerClient(opts.brokers) as client:
            return planner.initial_offsets(client, opts)

    @plain_errors
    def getDefaultReadLimit(self) -> ReadLimit:
        opts = self._options()
        if opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    @plain_errors
    def prepareForTriggerAvailableNow(self) -> None:
        opts = self._options()
        with BrokerClient(opts.brokers) as client:
            states = planner.partition_states(client, opts.subscription, missing_ok=True)
        self.target = planner.to_json_offsets(planner.latest_offsets(states.values()),
                                              planner.created_ms(states.values()), planner.topic_ids(states.values()))

    @plain_errors
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        opts = self._options()
        nxt = stream_offsets.plan_next(start, self._states(opts, start), fail_on_data_loss=opts.fail_on_data_loss,
                                       target=self.target)
        for what in nxt.lost:
            log.warning("%s (failOnDataLoss=false: the query goes on)", what)
        if self._waits_for_more(opts, nxt.backlog()):
            return start
        end = nxt.latest
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(nxt.begin, nxt.latest, limit.max_rows)
        return nxt.to_json(end)

    def _states(self, opts: ReadOptions, start: dict) -> dict:
        """The partitions now, asked again while a watermark is below what was read (an older view)."""
        with BrokerClient(opts.brokers) as client:
            for attempt in range(opts.fetch_offset_retries):
                if attempt:
                    time.sleep(opts.fetch_offset_retry_interval_ms / 1000)
                states = planner.partition_states(client, opts.subscription, missing_ok=True)
                if not stream_offsets.stale(start, states):
                    break
        return states

    def _waits_for_more(self, opts: ReadOptions, backlog: int) -> bool:
        """Kafka's delayBatch: hold the trigger while fewer than minOffsetsPerTrigger
        records wait, unless maxTriggerDelay has passed since the last batch."""
        if opts.min_offsets_per_trigger is None or self.target is not None:
            return False
        now = self.clock.wall_ms()
        if now - self.last_trigger_ms < opts.max_trigger_delay_ms and backlog < opts.min_offsets_per_trigger:
            return True
        self.last_trigger_ms = now
        return False

    @plain_errors
    def partitions(self, start: dict, end: dict) -> list[SplitPartition]:
        opts = self._options()
        with BrokerClient(opts.brokers) as client:
            ranges = by_range(client, planner.stream_ranges(client, opts, start, end))
        return [SplitPartition(s) for s in _splits(opts, ranges)]

    def read(self, partition: SplitPartition) -> Iterator:
        return plain_iter(read_arrow(self._options(), partition.split, self.schema))

    def commit(self, end: dict) -> None:
        """Nothing to do: ring keeps no per-query state; the checkpoint is Spark's."""


class RingDataSource(DataSource):
    """Registered as ``ring``; see docs/SPARK.md for options."""

    @classmethod
    def name(cls) -> str:
        return "ring"

    @plain_errors
    def schema(self):
        return spark_schema(_bool("includeHeaders", lower_keys(self.options).get("includeheaders", "false")))

    @plain_errors
    def reader(self, schema) -> RingBatchReader:
        return RingBatchReader(self.options, schema)

    def streamReader(self, schema) -> RingStreamReader:
        return RingStreamReader(self.options, schema)

    @plain_errors
    def writer(self, schema, overwrite: bool):
        from sparkio.writer import RingWriter

        return RingWriter(self.options, schema, overwrite)

    @plain_errors
    def streamWriter(self, schema, overwrite: bool):
        from sparkio.writer import RingStreamWriter

        return RingStreamWriter(self.options, schema, overwrite)
