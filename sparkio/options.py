"""Reader and writer options: Spark's case-insensitive strings to typed values.

Spark hands a data source its options as strings whose names are matched
without regard to case, and the planner, the executors and the streaming
worker each receive a pickled copy; so parsing is a pure function run once
per copy and every mistake becomes a ``BadRequest`` naming the option. The
option names and meanings are the Kafka connector's (``subscribe``,
``startingOffsets`` with ``-2``/``-1`` in JSON, ``failOnDataLoss`` ...) and
its refusals are Kafka's (``latest`` as a batch query's start, ``endingOffsets``
in a stream, ``minOffsetsPerTrigger`` above ``maxOffsetsPerTrigger``), so a
Kafka job moves over by changing ``format("kafka")`` to ``format("ring")``:
``kafka.bootstrap.servers`` is taken as ``brokers``, and the other ``kafka.*``
options (consumer and producer settings) are ignored. Options this module
does not know are ignored, as Kafka does, because Spark itself adds some
(``path``, ``checkpointLocation``). docs/SPARK.md lists every option.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ring import limits
from ring.errors import BadRequest

EARLIEST = -2  # Kafka's JSON sentinel for "the log start offset"
LATEST = -1  # Kafka's JSON sentinel for "the high watermark"

BOOTSTRAP = "kafka.bootstrap.servers"  # Kafka's name for ``brokers``
MAX_TRIGGER_DELAY_DEFAULT = "15m"  # Kafka's default
FETCH_OFFSET_RETRIES_DEFAULT = 3  # Kafka's fetchOffset.numRetries
FETCH_OFFSET_RETRY_INTERVAL_MS_DEFAULT = 1_000  # Kafka's (admin-client) fetchOffset.retryIntervalMs
STRATEGIES = ("error", "latest")  # startingOffsetsByTimestampStrategy

PartitionKey = tuple[str, int]


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: one of ``earliest``/``latest`` for every
    partition (``default``), overridden per partition by ``per_partition``
    (offsets, or the EARLIEST/LATEST sentinels)."""

    default: int  # EARLIEST or LATEST
    per_partition: tuple[tuple[PartitionKey, int], ...] = ()  # given as JSON: names every partition read

    def for_partition(self, topic: str, partition: int) -> int:
        return dict(self.per_partition).get((topic, partition), self.default)

    def topics(self) -> set[str]:
        return {t for (t, _), _ in self.per_partition}


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: named topics, a topic-name regex, or an
    explicit partition list (Kafka's subscribe / subscribePattern / assign)."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[PartitionKey, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            # Kafka's SubscribePatternStrategy: the regex found anywhere in the name.
            return re.search(self.pattern, topic) is not None
        if self.assign:
            return any(t == topic for t, _ in self.assign)
        return topic in self.topics


@dataclass(frozen=True)
class ReadOptions:
    brokers: tuple[str, ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None  # None for streaming queries
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    starting_by_timestamp: tuple[tuple[PartitionKey, int], ...] = ()
    ending_by_timestamp: tuple[tuple[PartitionKey, int], ...] = ()
    starting_strategy: str = "error"  # startingOffsetsByTimestampStrategy: error | latest
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    fetch_max_bytes: int = limits.FETCH_BYTES_DEFAULT
    poll_timeout_ms: int = limits.SPARK_POLL_TIMEOUT_MS_DEFAULT
    fetch_offset_retries: int = FETCH_OFFSET_RETRIES_DEFAULT
    fetch_offset_retry_interval_ms: int = FETCH_OFFSET_RETRY_INTERVAL_MS_DEFAULT


@dataclass(frozen=True)
class WriteOptions:
    brokers: tuple[str, ...]
    topic: str | None


def lower_keys(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in options.items()}


def parse_brokers(text: Any) -> tuple[str, ...]:
    """``"http://a:1, b:2"`` -> ``("http://a:1", "http://b:2")``."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    else:
        parts = str(text or "").split(",")
    urls = []
    for part in parts:
        part = part.strip().rstrip("/")
        if not part:
            continue
        if "://" not in part:
            part = "http://" + part
        if not part.startswith(("http://", "https://")):
            raise BadRequest(f"option brokers: {part!r} is not an http(s) URL")
        urls.append(part)
    if not urls:
        raise BadRequest(f"option brokers (or {BOOTSTRAP}) is required: a comma-separated list of broker URLs")
    return tuple(dict.fromkeys(urls))


def brokers_of(opts: Mapping[str, Any]) -> tuple[str, ...]:
    """``brokers``, or Kafka's ``kafka.bootstrap.servers``; both given must agree."""
    ours, kafkas = opts.get("brokers"), opts.get(BOOTSTRAP)
    if ours not in (None, "") and kafkas not in (None, ""):
        if parse_brokers(ours) != parse_brokers(kafkas):
            raise BadRequest(f"options brokers and {BOOTSTRAP} name different brokers; give one of them")
    return parse_brokers(ours if ours not in (None, "") else kafkas)


def _int(name: str, text: Any, minimum: int | None = None) -> int:
    try:
        if isinstance(text, bool):
            raise ValueError
        value = int(str(text).strip())
    except ValueError:
        raise BadRequest(f"option {name}: {text!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise BadRequest(f"option {name}: must be >= {minimum}, got {value}")
    return value


def _bool(name: str, text: Any) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise BadRequest(f"option {name}: expected true or false, got {text!r}")


def _json(name: str, text: Any) -> Any:
    if isinstance(text, Mapping):
        return text
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"option {name}: not valid JSON ({exc})") from None


def _per_partition(name: str, text: Any, *, minimum: int) -> tuple[tuple[PartitionKey, int], ...]:
    """Kafka's ``{"topic": {"0": 23, "1": -2}}``; partition keys may be ints
    (Python callers) or strings (JSON, where keys are always strings)."""
    doc = _json(name, text)
    if not isinstance(doc, Mapping) or not doc:
        raise BadRequest(f'option {name}: expected a JSON object like {{"topic": {{"0": 23}}}}')
    out = []
    for topic, parts in doc.items():
        if not isinstance(parts, Mapping):
            raise BadRequest(f"option {name}: topic {topic!r} must map partitions to numbers")
        for p, value in parts.items():
            partition = _int(f"{name} partition of {topic}", p, minimum=0)
            out.append(((str(topic), partition), _int(f"{name} {topic}/{p}", value, minimum=minimum)))
    return tuple(sorted(out))


def parse_offsets(name: str, text: Any, *, default: int, allow_earliest: bool = True,
                  allow_latest: bool = True, why: str = "") -> OffsetSpec:
    """``earliest``, ``latest`` or per-partition JSON (or a Python mapping)."""
    if text is None:
        return OffsetSpec(default)
    if isinstance(text, str) and text.strip().lower() in ("earliest", "latest"):
        word = text.strip().lower()
        if (word == "earliest" and not allow_earliest) or (word == "latest" and not allow_latest):
            raise BadRequest(f"option {name}: {word} is not allowed{why}")
        return OffsetSpec(EARLIEST if word == "earliest" else LATEST)
    pairs = _per_partition(name, text, minimum=EARLIEST)
    for (t, p), off in pairs:
        if off == EARLIEST and not allow_earliest:
            raise BadRequest(f"option {name}: -2 (earliest) is not allowed for {t}/{p}{why}")
        if off == LATEST and not allow_latest:
            raise BadRequest(f"option {name}: -1 (latest) is not allowed for {t}/{p}{why}")
    return OffsetSpec(default, pairs)


def parse_subscription(opts: Mapping[str, Any]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k) not in (None, "")]
    if len(given) != 1:
        raise BadRequest("exactly one of the options subscribe, subscribePattern, assign is required"
                         f" (got {len(given)})")
    kind, value = given[0], opts[given[0]]
    if kind == "subscribe":
        names = value if isinstance(value, (list, tuple)) else str(value).split(",")
        topics = tuple(dict.fromkeys(t.strip() for t in names if t.strip()))
        if not topics:
            raise BadRequest(f"option subscribe: no topic named in {str(value)[:80]!r}")
        return Subscription(topics=topics)
    if kind == "subscribepattern":
        pattern = str(value).strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadRequest(f"option subscribePattern: bad regex ({exc})") from None
        if not pattern:
            raise BadRequest("option subscribePattern: the pattern is empty")
        return Subscription(pattern=pattern)
    if isinstance(value, str) and not value.strip().startswith("{"):
        raise BadRequest(f'option assign: expected a JSON object like {{"topic": [0, 1]}}, got {value[:80]!r}')
    doc = _json("assign", value)
    if not isinstance(doc, Mapping) or not doc:
        raise BadRequest('option assign: expected a JSON object like {"topic": [0, 1]}')
    pairs = []
    for topic, parts in doc.items():
        if not isinstance(parts, (list, tuple)) or not parts:
            raise BadRequest(f"option assign: topic {topic!r} needs a list of partitions")
        pairs.extend((str(topic), _int(f"assign {topic}", p, minimum=0)) for p in parts)
    return Subscription(assign=tuple(sorted(set(pairs))))


_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_TIME = re.compile(r"\s*(\d+)\s*([a-z]*)\s*", re.I)


def parse_duration_ms(name: str, text: Any) -> int:
    """Spark's time strings (``15m``, ``10s``, ``250ms``, ``1h``; a bare number is ms)."""
    m = _TIME.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in _TIME_UNITS_MS):
        raise BadRequest(f"option {name}: {text!r} is not a duration like 15m, 10s or 500ms")
    return int(int(m.group(1)) * _TIME_UNITS_MS[unit or "ms"])


def _first(opts: Mapping[str, Any], *names: str) -> tuple[str, Any]:
    """The first of ``names`` given (Kafka's name first), as (name, value)."""
    for n in names:
        if opts.get(n.lower()) not in (None, ""):
            return n, opts[n.lower()]
    return names[0], None


def parse_read_options(options: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    """Validate everything a reader needs, once, before any I/O."""
    opts = lower_keys(options)
    sub = parse_subscription(opts)
    if streaming:
        for batch_only in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if opts.get(batch_only.lower()) is not None:
                raise BadRequest(f"option {batch_only} is for batch queries only; a stream has no end")

    def ts(name: str) -> int | None:
        value = opts.get(name.lower())
        return None if value in (None, "") else _int(name, value, minimum=0)

    def by_ts(name: str) -> tuple[tuple[PartitionKey, int], ...]:
        value = opts.get(name.lower())
        return () if value in (None, "") else _per_partition(name, value, minimum=0)

    def positive(name: str) -> int | None:
        value = opts.get(name.lower())
        return None if value in (None, "") else _int(name, value, minimum=1)

    start_ts, start_by_ts = ts("startingTimestamp"), by_ts("startingOffsetsByTimestamp")
    # Kafka reads the first of startingTimestamp, startingOffsetsByTimestamp,
    # startingOffsets that is given; a batch query may not start at latest.
    starting_in_effect = start_ts is None and not start_by_ts
    starting = parse_offsets("startingOffsets", opts.get("startingoffsets"),
                             default=LATEST if streaming else EARLIEST,
                             allow_latest=streaming or not starting_in_effect,
                             why=" for batch queries (as with Kafka): a batch starts at earliest or at given offsets")
    ending = None if streaming else parse_offsets(
        "endingOffsets", opts.get("endingoffsets"), default=LATEST, allow_earliest=False,
        why=" (as with Kafka): a batch ends at latest or at given offsets")
    strategy = str(opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in STRATEGIES:
        raise BadRequest(f"option startingOffsetsByTimestampStrategy: expected error or latest, got {strategy!r}")
    min_rows, max_rows = positive("minOffsetsPerTrigger"), positive("maxOffsetsPerTrigger")
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise BadRequest(f"option minOffsetsPerTrigger ({min_rows}) is higher than maxOffsetsPerTrigger ({max_rows})")
    poll_name, poll = _first(opts, "kafkaConsumer.pollTimeoutMs", "pollTimeoutMs")

    parsed = ReadOptions(
        brokers=brokers_of(opts),
        subscription=sub,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=start_ts,
        ending_timestamp_ms=None if streaming else ts("endingTimestamp"),
        starting_by_timestamp=start_by_ts,
        ending_by_timestamp=() if streaming else by_ts("endingOffsetsByTimestamp"),
        starting_strategy=strategy,
        min_partitions=positive("minPartitions"),
        max_records_per_partition=positive("maxRecordsPerPartition"),
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_ms=parse_duration_ms("maxTriggerDelay", opts.get("maxtriggerdelay")
                                               or MAX_TRIGGER_DELAY_DEFAULT),
        fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_headers=_bool("includeHeaders", opts.get("includeheaders", "false")),
        fetch_max_bytes=min(positive("fetchMaxBytes") or limits.FETCH_BYTES_DEFAULT, limits.FETCH_BYTES_MAX),
        poll_timeout_ms=limits.SPARK_POLL_TIMEOUT_MS_DEFAULT if poll is None else _int(poll_name, poll, minimum=0),
        fetch_offset_retries=_int("fetchOffset.numRetries", opts.get("fetchoffset.numretries",
                                                                     FETCH_OFFSET_RETRIES_DEFAULT), minimum=1),
        fetch_offset_retry_interval_ms=_int("fetchOffset.retryIntervalMs", opts.get(
            "fetchoffset.retryintervalms", FETCH_OFFSET_RETRY_INTERVAL_MS_DEFAULT), minimum=0),
    )
    _check_topics_named(parsed)
    return parsed


def _check_topics_named(o: ReadOptions) -> None:
    """Offsets given for a topic the query does not read are a typo, not a wish."""
    named = o.starting.topics() | (o.ending.topics() if o.ending else set())
    named |= {t for (t, _), _ in o.starting_by_timestamp + o.ending_by_timestamp}
    for topic in sorted(named):
        if not o.subscription.matches(topic):
            raise BadRequest(f"offsets are given for topic {topic!r}, which this query does not read")


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    """``brokers`` (or ``kafka.bootstrap.servers``) and ``topic``; the sink's
    ``includeHeaders`` is accepted as Kafka's is: a headers column is always written."""
    opts = lower_keys(options)
    topic = str(opts.get("topic") or "").strip()
    return WriteOptions(brokers=brokers_of(opts), topic=topic or None)
