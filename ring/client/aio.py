"""``AsyncClient``: produce straight to partition leaders, fetch from any
replica, and administer topics, over one pooled aiohttp session.

    async with AsyncClient("http://127.0.0.1:9250,http://127.0.0.1:9260") as c:
        md = await c.produce("clicks", json={"page": "/"}, key="user-1")
        futs = [c.produce("clicks", b"...") for _ in range(10_000)]  # batched
        await c.flush()
        got = await c.fetch("clicks", md.partition, md.offset)

The latency/throughput knob is ``linger_ms``: a partition's open batch is
sent when it reaches ``batch_bytes`` or has waited ``linger_ms`` since its
first record, whichever comes first (0 sends at once, still batching what
arrived meanwhile; larger values trade per-record latency for fewer, bigger
requests). Each partition has at most one request in flight, which keeps its
records in order across retries; ``max_in_flight`` bounds requests across
partitions and ``buffer_bytes`` the records waiting for acknowledgement.
The producer is idempotent by default: a request whose answer was lost is
sent again under the same producer id and sequences, and the leader stores
it once. Records produced but not yet acknowledged when the event loop ends
without ``close()``/``flush()`` are lost; the client logs how many.
Placement, batching and retries are ``ring.client.producer``'s; the cluster
view is ``ring.client.metadata``'s; this module wires them together and adds
fetch and topic administration.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import weakref
from collections import Counter
from typing import Any, Callable, Iterable

from ring import errors, limits
from ring.catalog import validate_topic_name
from ring.client.batcher import Accumulator, BufferFull
from ring.client.metadata import Metadata, quote
from ring.client.producer import NO_JSON, Partitioner, Producer, make_record, new_producer_id
from ring.client.ranges import RangeMaps
from ring.client.records import FetchResult, Headers, RecordMetadata, decode_fetch
from ring.client.retry import Retry
from ring.client.topology import TopicInfo, parse_brokers
from ring.client.transport import CT_BATCHES, H_HIGH_WATERMARK, H_NEXT_OFFSET, RETRY, \
    BrokerUnreachable, ClientClosed, Transport, classify, error_from, make_session, gave_up, retry_after_s
from ring.clock import Clock, SystemClock
from ring.log import batch as batchfmt
from ring.log.batch import RecordIn

log = logging.getLogger("ring.client")

CONSISTENCIES = ("one", "quorum", "all")
# Called with (error, metadata) once a record is acknowledged (error None) or has failed (metadata None).
DeliveryCallback = Callable[[BaseException | None, RecordMetadata | None], Any]
_LIVE: weakref.WeakSet[AsyncClient] = weakref.WeakSet()  # clients not closed yet, for the exit check


class AsyncClient:
    """A ring client: produce, fetch and topic administration over one pooled session.

    ``brokers``: URLs (or ``host:port``), a list or a comma-separated string;
    any one is enough to learn the rest. ``consistency`` (one|quorum|all) is
    sent with every produce; None leaves it to each topic's own setting
    (quorum unless the topic says otherwise); ``compression`` (none|zstd|lz4) is applied per
    batch; ``auto_create`` creates unknown topics on first produce unless
    the brokers run with auto-create off. ``token`` is sent as
    ``Authorization: Bearer`` (brokers with --auth-tokens); ``ca_file`` is the
    PEM CA that ``https://`` brokers' certificates are checked against.

    A produce request that fails is tried again, following its partition's
    leader, until ``delivery_timeout_s`` after the record was produced;
    ``retries`` (None: no count) also bounds the attempts that reached a
    broker. Fetches and administrative calls are tried again (other
    brokers, doubling pauses) until ``retry_timeout_s`` has passed, and no
    more than ``retries`` times when given. ``enable_idempotence`` (Kafka's name):
    retries after a lost answer are stored once; off, such records fail as
    ``OutcomeUnknown``. ``max_block_ms``: how long ``send`` (and the sync
    client's ``produce``) waits for room in a full buffer."""

    def __init__(self, brokers: str | Iterable[str], *,
                 linger_ms: float = limits.CLIENT_LINGER_MS_DEFAULT,
                 batch_bytes: int = limits.CLIENT_BATCH_BYTES_DEFAULT,
                 max_in_flight: int = limits.CLIENT_IN_FLIGHT_REQUESTS_DEFAULT,
                 partitioner: Partitioner | None = None,
                 consistency: str | None = None,
                 timeout_s: float = limits.CLIENT_REQUEST_TIMEOUT_S_DEFAULT,
                 retries: int | None = None,
                 retry_timeout_s: float = limits.CLIENT_RETRY_TIMEOUT_S_DEFAULT,
                 retry_backoff_ms: float = limits.CLIENT_RETRY_BACKOFF_MS,
                 delivery_timeout_s: float = limits.CLIENT_DELIVERY_TIMEOUT_S_DEFAULT,
                 enable_idempotence: bool = True,
                 buffer_bytes: int = limits.CLIENT_BUFFER_BYTES_DEFAULT,
                 max_block_ms: float = limits.CLIENT_MAX_BLOCK_MS_DEFAULT,
                 compression: str = "none",
                 auto_create: bool = True,
                 token: str | None = None,
                 ca_file: str | None = None,
                 clock: Clock | None = None) -> None:
        _check_settings(consistency, compression, batch_bytes, buffer_bytes, max_in_flight, retries, linger_ms,
                        delivery_timeout_s, max_block_ms)
        self.bootstrap = parse_brokers(brokers)
        self.linger_ms = linger_ms
        self.batch_bytes = batch_bytes
        self.max_in_flight = max_in_flight
        self.partitioner = partitioner
        self.consistency = consistency
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_timeout_s = retry_timeout_s
        self.retry_backoff_ms = retry_backoff_ms
        self.delivery_timeout_s = delivery_timeout_s
        self.enable_idempotence = enable_idempotence
        self.buffer_bytes = buffer_bytes
        self.max_block_ms = max_block_ms
        self.codec = batchfmt.CODECS[compression]
        self.auto_create = auto_create
        self._token = token
        self._ca_file = ca_file
        self.clock = clock or SystemClock()
        # Counters for tests and operators (requests, batches, records, retries ...).
        self.stats: Counter[str] = Counter()
        self._meta: Metadata | None = None
        self._ranges: RangeMaps | None = None
        self._transport: Transport | None = None
        self._producer: Producer | None = None
        self._sender: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._loss_reported = False
        _LIVE.add(self)

    # --- lifecycle ------------------------------------------------------------------

    def _start(self) -> Metadata:
        """Build the session and the sender on first use, inside the running loop."""
        if self._closed:
            raise ClientClosed("the client is closed")
        if self._meta is None:
            self._transport = Transport(make_session(token=self._token, ca_file=self._ca_file), self.timeout_s)
            self._meta = Metadata(self.bootstrap, self._transport, self.clock,
                                  retry_timeout_s=self.retry_timeout_s, retries=self.retries,
                                  backoff_ms=self.retry_backoff_ms)
            # An idempotent broker remembers a producer's last PRODUCER_BATCHES_KEPT batches per
            # partition: a retried request must not hold more, or it is not recognised.
            acc = Accumulator(linger_ms=self.linger_ms, batch_bytes=self.batch_bytes,
                              buffer_bytes=self.buffer_bytes, request_bytes_max=limits.CLIENT_REQUEST_BYTES_MAX,
                              request_records_max=limits.CLIENT_REQUEST_RECORDS_MAX,
                              delivery_timeout_ms=self.delivery_timeout_s * 1000,
                              request_batches_max=limits.PRODUCER_BATCHES_KEPT if self.enable_idempotence else None)
            self._producer = Producer(
                self._meta, self._transport, self.clock, acc, max_in_flight=self.max_in_flight,
                partitioner=self.partitioner, consistency=self.consistency, retries=self.retries,
                retry_backoff_ms=self.retry_backoff_ms, codec=self.codec,
                producer_id=new_producer_id() if self.enable_idempotence else None,
                resolve_topic=self._topic_info, spawn=self._spawn, stats=self.stats)
            self._sender = asyncio.get_running_loop().create_task(self._producer.run())
            self._sender.add_done_callback(self._sender_ended)
        return self._meta

    def _sender_ended(self, task: asyncio.Task) -> None:
        # Only close() cancels the sender, or the end of the event loop (asyncio.run cancels what is
        # left): then the records not acknowledged are lost, and the user must hear it. Anything
        # else is a bug, and records must fail loudly rather than wait forever.
        if self._producer is None:
            return
        if task.cancelled():
            if not self._closed:
                self.report_loss("its event loop ended")
            return
        exc = task.exception()
        log.error("the producer's sender stopped: %r", exc)
        self._closed = True
        self._producer.fail_everything(errors.RingError(f"the producer's sender stopped: {exc!r}"))

    def _started_producer(self) -> Producer:
        self._start()
        assert self._producer is not None
        return self._producer

    async def start(self) -> AsyncClient:
        """Learn the topology now (otherwise the first call does)."""
        await self._start().ensure_cluster()
        return self

    async def __aenter__(self) -> AsyncClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def report_loss(self, why: str) -> None:
        """Say, once, how many records this client will never deliver because it was not closed."""
        lost = 0 if self._producer is None else self._producer.unfinished()
        if lost and not self._loss_reported:
            self._loss_reported = True
            log.error("%d records were never sent or acknowledged: the client was not closed (or flushed) "
                      "before %s; call close() or flush() first", lost, why)

    async def close(self, flush: bool = True) -> None:
        """Flush (unless told not to), then fail whatever is left and close the pool."""
        if self._closed:
            return
        if flush and self._producer is not None:
            await self._producer.flush()
        self._closed = True
        _LIVE.discard(self)
        tasks = [t for t in [self._sender, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._meta is not None:
            await self._meta.close()
        if self._producer is not None:
            self._producer.fail_everything(ClientClosed("the client was closed before the record was acknowledged"))
        if self._transport is not None:
            await self._transport.session.close()

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records produced and not yet acknowledged or failed."""
        return 0 if self._producer is None else self._producer.buffered_bytes

    @property
    def produce_requests(self) -> Counter[tuple[str, str, int]]:
        """Produce requests sent, by (broker URL, topic, partition)."""
        return Counter() if self._producer is None else self._producer.requests_to

    # --- producing ------------------------------------------------------------------

    def produce(self, topic: str, value: bytes | str | None = None, *, key: bytes | str | None = None,
                headers: Headers | None = None, partition: int | None = None,
                timestamp: int | None = None, json: Any = NO_JSON,
                on_delivery: DeliveryCallback | None = None) -> asyncio.Future[RecordMetadata]:
        """Queue one record; the returned future resolves to its ``RecordMetadata``
        once its batch is acknowledged (``await client.produce(...)``), or fails.

        ``value`` is bytes or str (UTF-8), or None for a record without a value
        (Kafka's tombstone); or pass ``json=`` any JSON-able value (stored as
        JSON, shown as JSON by fetches). ``headers``: ``(name, value)`` pairs,
        kept in order (a name may repeat), or a dict. ``timestamp`` defaults to
        now (ms). ``on_delivery(error, metadata)`` is called on the event loop
        when the record is acknowledged (error None) or has failed (metadata
        None). Raises at once on bad input, and ``BufferFull`` when
        ``buffer_bytes`` of records wait (``await drain()`` first, or use ``send``).
        """
        producer = self._started_producer()
        validate_topic_name(topic)
        record, size, is_json = self._record(value, key, headers, timestamp, json)
        fut = producer.enqueue(topic, record, size, is_json, partition)
        if on_delivery is not None:
            fut.add_done_callback(delivery_reporter(on_delivery))
        return fut

    async def send(self, topic: str, value: bytes | str | None = None, **kw: Any) -> asyncio.Future[RecordMetadata]:
        """``produce``, waiting up to ``max_block_ms`` for room when the buffer is full (aiokafka's
        ``send``); then raises ``BufferFull``. Returns the record's future: ``await`` it for the
        ``RecordMetadata``."""
        producer = self._started_producer()
        deadline = self._meta_now() + self.max_block_ms
        while True:
            try:
                return self.produce(topic, value, **kw)
            except BufferFull:
                remaining = deadline - self._meta_now()
                if remaining <= 0:
                    raise
                try:
                    async with asyncio.timeout(remaining / 1000):
                        await producer.drain()
                except TimeoutError:
                    pass

    async def send_and_wait(self, topic: str, value: bytes | str | None = None, **kw: Any) -> RecordMetadata:
        """``send`` and wait for the acknowledgement."""
        return await (await self.send(topic, value, **kw))

    def _record(self, value: Any, key: Any, headers: Any, timestamp: int | None,
                json: Any) -> tuple[RecordIn, int, bool]:
        return make_record(value, key, headers, timestamp, json, self.clock.wall_ms())

    def _enqueue(self, topic: str, record: RecordIn, size: int, is_json: bool,
                 partition: int | None) -> asyncio.Future[RecordMetadata]:
        """A record already checked by ``_record`` (the sync client does that in its own thread)."""
        return self._started_producer().enqueue(topic, record, size, is_json, partition)

    async def drain(self) -> None:
        """Wait until at most half of ``buffer_bytes`` waits for acknowledgement
        (asyncio's StreamWriter.drain, for producers)."""
        await self._started_producer().drain()

    async def flush(self) -> None:
        """Send everything produced so far now (no linger) and wait until each
        record is acknowledged or has failed (failures stay on their futures)."""
        await self._started_producer().flush()

    async def send_batch(self, topic: str, records: Iterable[Any], *,
                         partition: int | None = None) -> list[RecordMetadata]:
        """Produce many records and wait for all; each is a value (bytes/str) or a
        dict of ``produce`` arguments (``value`` or ``json``, ``key``, ``headers``,
        ``partition``, ``timestamp``). Raises the first failure."""
        producer = self._started_producer()
        futs = []
        for rec in records:
            if producer.buffered_bytes > self.buffer_bytes // 2:
                await producer.drain()
            if isinstance(rec, dict):
                futs.append(self.produce(topic, **{"partition": partition, **rec}))
            else:
                futs.append(self.produce(topic, rec, partition=partition))
        return list(await asyncio.gather(*futs))

    async def _topic_info(self, topic: str) -> TopicInfo:
        """The topic's partitions; an unknown topic is created if the brokers auto-create."""
        meta = self._start()
        try:
            return await meta.topic(topic)
        except errors.UnknownTopic:
            if not self.auto_create:
                raise
            status = (await meta.ask_any("GET", "/v1/status")).json() or {}
            if status.get("auto_create") is False:
                raise
            await self.create_topic(topic, exist_ok=True)
            return await meta.topic(topic)

    def _meta_now(self) -> float:
        return self.clock.monotonic() * 1000

    # --- fetching -------------------------------------------------------------------

    async def fetch(self, topic: str, partition: int, offset: int | None = None, *,
                    max_records: int = limits.FETCH_RECORDS_DEFAULT, max_bytes: int | None = None,
                    wait_ms: int = 0) -> FetchResult:
        """Committed records of one partition from ``offset`` (None: the earliest),
        from the leader or, failing that, any replica; long-polls up to ``wait_ms``."""
        meta = self._start()
        validate_topic_name(topic)
        info = await meta.topic(topic)
        holders: list[str] = []
        if info.ranged and offset is not None:  # below the replicas' local tails: ask the range's holders
            if self._ranges is None:
                self._ranges = RangeMaps(meta)
            holders = await self._ranges.urls(topic, partition, offset)
        params: dict[str, Any] = {"wait_ms": wait_ms, "max_records": max_records}
        if offset is not None:
            params["offset"] = offset
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        path = f"/v1/topics/{quote(topic)}/partitions/{partition}/messages"
        timeout_s = self.timeout_s + wait_ms / 1000
        last: errors.RingError | None = None
        too_far: errors.RingError | None = None
        retry = Retry(self.clock, self.retry_timeout_s, self.retries, self.retry_backoff_ms)
        while True:
            wait_s = 0.0  # the longest Retry-After of this round's refusals
            urls = list(dict.fromkeys([*holders, *meta.topology.read_urls(topic, partition)]))
            for url in sorted(urls, key=meta.recently_unreachable):
                self.stats["fetch_requests"] += 1
                try:
                    reply = await self._transport.request(  # type: ignore[union-attr]
                        "GET", url, path, params=params, headers={"Accept": CT_BATCHES}, timeout_s=timeout_s)
                except BrokerUnreachable as exc:
                    meta.mark_unreachable(url)
                    last = exc
                    continue
                meta.mark_reachable(url)
                if reply.status == 200:
                    hw = int(reply.headers.get(H_HIGH_WATERMARK, "0"))
                    hint = reply.headers.get(H_NEXT_OFFSET)
                    records, next_offset = decode_fetch(topic, partition, reply.body, offset, hw, max_records,
                                                        int(hint) if hint else None)
                    return FetchResult(topic, partition, records, next_offset, hw, url)
                err = error_from(reply, f"fetch {topic}/{partition}")
                code = str(reply.error_doc().get("error", ""))
                if reply.status == 416 and offset is not None and offset > int(err.extra.get("latest", -1)):
                    too_far = too_far or err  # a follower behind the leader: ask another replica
                    continue
                if classify(reply.status, code) != RETRY:
                    raise err
                last = err
                wait_s = max(wait_s, retry_after_s(reply))
            if too_far is not None:
                raise too_far
            self._spawn(meta.refresh(quiet=True))  # a leader may have moved; the next round uses what it learns
            if not await retry.pause(wait_s):
                raise gave_up(f"fetch {topic}/{partition}: no replica answered ({retry.spent()}); "
                              f"last: {last.message if last else 'none'}", last, topic=topic, partition=partition)

    # --- administration -------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int | None = None, replication_factor: int | None = None,
                           *, exist_ok: bool = False, **config: Any) -> dict[str, Any]:
        """Create a topic (settings as the broker's POST /v1/topics) and wait until
        every live broker knows it and a leader for each of its partitions, so
        producing to any leader works at once. After ``CLIENT_TOPIC_PROPAGATION_S_MAX``
        it returns anyway (a warning is logged); the description it answers then
        shows the partitions still without a leader as ``"leader": null``."""
        meta = self._start()
        doc: dict[str, Any] = {"name": validate_topic_name(name), **config}
        if partitions is not None:
            doc["partitions"] = partitions
        if replication_factor is not None:
            doc["replication_factor"] = replication_factor
        await meta.ensure_cluster()
        try:
            await meta.ask_any("POST", "/v1/topics", doc, ok=(200, 201))
        except errors.Conflict:
            if not exist_ok:
                raise
        await meta.await_everywhere(name)
        described, _ = await meta.describe(name)
        return described

    async def change_topic(self, name: str, **settings: Any) -> dict[str, Any]:
        """Change a topic's settings (the broker's PATCH /v1/topics/{topic}: partitions grow only, or
        "auto"; retention_ms, retention_bytes, compression, consistency, auto_partitions). Answers the
        topic as described once any new partitions have leaders; this client's next use of the
        topic sees the new partition count."""
        meta = self._start()
        reply = await meta.ask_any("PATCH", f"/v1/topics/{quote(validate_topic_name(name))}", settings)
        meta.forget(name)
        return dict(reply.json() or {})

    async def unclean_election(self, topic: str, partition: int) -> dict[str, Any]:
        """Elect a leader for a partition left without one by replicas that lost their state, losing what
        only they held (POST .../unclean-election): the leader elected and the partition as it says."""
        meta = self._start()
        reply = await meta.ask_any(
            "POST", f"/v1/topics/{quote(validate_topic_name(topic))}/partitions/{int(partition)}/unclean-election")
        return dict(reply.json() or {})

    async def delete_topic(self, name: str) -> None:
        meta = self._start()
        await meta.ask_any("DELETE", f"/v1/topics/{quote(validate_topic_name(name))}")
        meta.forget(name)

    async def topics(self) -> list[dict[str, Any]]:
        """Every topic's configuration."""
        reply = await self._start().ask_any("GET", "/v1/topics")
        return list((reply.json() or {}).get("topics", []))

    async def describe(self, topic: str) -> dict[str, Any]:
        """A topic's configuration and partitions (leader, replicas, epoch, watermarks)."""
        doc, _ = await self._start().describe(validate_topic_name(topic))
        return doc

    async def cluster(self) -> dict[str, Any]:
        """``GET /v1/cluster``; a standalone broker is shown as a cluster of itself."""
        meta = self._start()
        try:
            return (await meta.ask_any("GET", "/v1/cluster")).json()
        except errors.NotFound:
            await meta.refresh(force=True, topics=False)
            brokers = [{"name": b.name, "token": None, "status": b.status, "client_url": b.client_url,
                        "peer_url": None} for b in meta.topology.brokers.values()]
            return {"brokers": brokers, "self": brokers[0]["name"] if brokers else None, "standalone": True}


def _check_settings(consistency: str | None, compression: str, batch_bytes: int, buffer_bytes: int,
                    max_in_flight: int, retries: int | None, linger_ms: float, delivery_timeout_s: float,
                    max_block_ms: float) -> None:
    """Raise ``BadRequest`` naming the first setting of a client that is out of its bounds."""
    if consistency is not None and consistency not in CONSISTENCIES:
        raise errors.BadRequest(f"consistency must be one of {', '.join(CONSISTENCIES)}")
    if compression not in batchfmt.CODECS:
        raise errors.BadRequest(f"compression must be one of {', '.join(batchfmt.CODECS)}")
    if not batchfmt.HEADER_SIZE < batch_bytes <= limits.CLIENT_BATCH_BYTES_MAX:
        raise errors.BadRequest(f"batch_bytes must be in ({batchfmt.HEADER_SIZE}, {limits.CLIENT_BATCH_BYTES_MAX}]")
    if buffer_bytes < limits.BATCH_BYTES_MAX or max_in_flight < 1 or (retries is not None and retries < 0) \
            or linger_ms < 0 or delivery_timeout_s <= 0 or max_block_ms < 0:
        raise errors.BadRequest("buffer_bytes must hold a maximal batch; max_in_flight >= 1; "
                                "retries, linger_ms and max_block_ms >= 0; delivery_timeout_s > 0")


def delivery_reporter(callback: DeliveryCallback) -> Callable[[Any], None]:
    """A done-callback (for an asyncio or a concurrent future) calling ``callback(error, metadata)``;
    the callback's own failures are logged, not raised."""
    def report(fut: Any) -> None:
        try:
            if fut.cancelled():
                callback(asyncio.CancelledError(), None)
            elif fut.exception() is not None:
                callback(fut.exception(), None)
            else:
                callback(None, fut.result())
        except Exception:  # the application's callback: its bug must not stop the producer
            log.exception("on_delivery callback failed")
    return report


@atexit.register
def _report_unclosed() -> None:
    for client in list(_LIVE):
        client.report_loss("the interpreter exited")
