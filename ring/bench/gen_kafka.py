"""Apache Kafka's load-generator driver: librdkafka through confluent-kafka.

One topic of 3 partitions, replication factor 3, ``min.insync.replicas=2``
(created with the admin client; the driver waits until every partition has a
leader and all three replicas in sync). Producers send with ``acks=all``: the
leader answers once every in-sync replica has the batch (with three in sync,
all of them; with one down, two). Idempotence is off (librdkafka's default),
as ring's produce does not deduplicate either; no compression.

One request carries what ring's does, a batch of 1 or 100 records to one
partition: request *i* goes to partition *i* mod 3, as ring's does, as one
``produce_batch()`` of its records, and is done when every record in it is
acknowledged. ``batch.num.messages`` (the most records librdkafka puts in one
partition's batch) is the request's size, 1 or 100, so a batch never spans
two requests. Unbatched, ``linger.ms=0``: each record leaves at once, alone.
Batched, ``linger.ms=5``: librdkafka sends a batch as soon as it holds
``batch.num.messages`` records, so a request's 100 records leave together the
moment the last one is handed over and linger never delays them; with
``linger.ms=0`` librdkafka picks up a partition's queue while the records are
still being handed over and splits a request into about two ProduceRequests
(measured here: 57 requests for 30 batches of 100, 30 with ``linger.ms=5``).
The driver reads librdkafka's statistics and reports the ProduceRequests sent
and their records, so the records per request are measured, not assumed.
Keyed records carry their key and go where Kafka's Java client would send
them (``partitioner`` = ``murmur2_random``).

Requests in flight: a Kafka broker reads one request at a time from a
connection (it mutes the connection until it has answered), and librdkafka
has one connection per broker, so one producer has at most one request in
flight per broker however many it pipelines. ring's load generator keeps
``window`` requests in flight on ``window`` connections; here ``window`` / 3
producers (rounded up), each with a connection to every broker, keep the
same number in flight: request *i* goes through producer (*i* // 3) mod the
pool's size.

librdkafka calls back on the thread that polls it: a thread per producer
polls, counts each request's acknowledgements and wakes the request's future
on the event loop once all are in (one wake-up per request, not per record).

Consume assigns every partition from its first offset (no group, as ring's
fetch reads each partition from offset 0) and reads with ``consume()`` of up
to 10,000 messages, touching each message's value; the fetch size per
partition is ring's (4 MiB). End to end assigns every partition at its
current end and delivers each message as it comes (librdkafka's fetch
long-polls up to ``fetch.wait.max.ms``, 500 ms by default, as ring's does).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

import orjson

from ring.bench.records import with_seq

TOPIC_READY_S = 60.0
POLL_S = 0.5  # a poll returns as soon as there is something to serve: this bounds only the stop
CONSUME_BATCH = 10_000
FETCH_BYTES = 4 << 20  # ring's fetch size per partition (gen_ring.FETCH_BYTES)
STATS_MS = 1000
POOL_REQUESTS = 64
BATCH_LINGER_MS = 5  # holds only a batch not yet full: a request's records while they are handed over


def producer_config(bootstrap: str, per_request: int) -> dict[str, Any]:
    """The producer's whole configuration (what is not here is librdkafka's default)."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 0 if per_request == 1 else BATCH_LINGER_MS,
        "batch.num.messages": per_request,
        "enable.idempotence": False,
        "compression.type": "none",
        "partitioner": "murmur2_random",
        "statistics.interval.ms": STATS_MS,
    }


def consumer_config(bootstrap: str, group: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,  # librdkafka wants one; partitions are assigned, the group is never joined
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "max.partition.fetch.bytes": FETCH_BYTES,
        "enable.partition.eof": False,
    }


def admin_config(bootstrap: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap}


class KafkaDriver:
    def __init__(self, spec: dict[str, Any], records: list[tuple[bytes, bytes]]) -> None:
        self.spec = spec
        self.records = records
        target = spec["target"]
        self.bootstrap: str = target["bootstrap"]
        self.replicas: int = target.get("replicas", 3)
        self.partitions: int = target.get("partitions", 3)
        self.topic_config: dict[str, str] = target.get("topic_config", {"min.insync.replicas": "2"})
        self.topic = spec["topic"]
        self.admin: Any = None
        self.producers: list[Any] = []
        self.consumer: Any = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stats: dict[int, dict[str, Any]] = {}  # producer index -> its last statistics

    async def open(self) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        self.admin = AdminClient(admin_config(self.bootstrap))
        futures = self.admin.create_topics([NewTopic(self.topic, num_partitions=self.partitions,
                                                     replication_factor=self.replicas, config=self.topic_config)])
        await asyncio.wrap_future(futures[self.topic])
        deadline = time.monotonic() + TOPIC_READY_S
        while True:  # every partition led, every replica in sync
            md = await asyncio.to_thread(self.admin.list_topics, self.topic, 5)
            parts = md.topics[self.topic].partitions if self.topic in md.topics else {}
            if len(parts) == self.partitions and all(
                    p.leader >= 0 and len(p.isrs) == self.replicas for p in parts.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {self.topic} not led and in sync within {TOPIC_READY_S:g} s")
            await asyncio.sleep(0.1)

    def _poll_thread(self, client: Any) -> None:
        def run() -> None:
            while not self._stop.is_set():
                client.poll(POLL_S)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    def sender(self, per_request: int, keyed: bool, seq_stamp: bool = False) -> Callable[[int], Any]:
        from confluent_kafka import Producer

        count = max(1, -(-self.spec.get("window", 1) // self.partitions))  # ceil(window / partitions)
        pool = []
        for _ in range(count):
            index = len(self.producers)

            def on_stats(text: str, index: int = index) -> None:
                self._stats[index] = orjson.loads(text)

            producer = Producer({**producer_config(self.bootstrap, per_request), "stats_cb": on_stats})
            self.producers.append(producer)
            self._poll_thread(producer)
            pool.append(producer.produce_batch)
        loop = asyncio.get_running_loop()
        records = self.records
        n = len(records)
        parts = self.partitions
        topic = self.topic
        # POOL_REQUESTS requests' messages built once and reused in rotation, as ring's driver does
        pre = [[{"value": records[j % n][1], **({"key": records[j % n][0]} if keyed else {})}
                for j in range(r * per_request, (r + 1) * per_request)] for r in range(POOL_REQUESTS)]

        def settle(fut: asyncio.Future, err: Any) -> None:
            if fut.done():
                return
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(f"produce failed: {err}"))

        async def send(i: int) -> int:
            fut = loop.create_future()
            state = [per_request, None]  # records not yet acknowledged, the first error

            def delivered(err: Any, msg: Any) -> None:  # on the poll thread
                if err is not None and state[1] is None:
                    state[1] = err
                state[0] -= 1
                if state[0] == 0:
                    loop.call_soon_threadsafe(settle, fut, state[1])

            produce = pool[(i // parts) % count]
            if seq_stamp:
                msgs = [{"value": with_seq(records[j % n][1], i)}
                        for j in range(i * per_request, (i + 1) * per_request)]
            else:
                msgs = pre[i % POOL_REQUESTS]
            if keyed:
                produce(topic, msgs, on_delivery=delivered)
            else:
                produce(topic, msgs, partition=i % parts, on_delivery=delivered)
            await fut
            return per_request

        return send

    def produce_stats(self) -> dict[str, Any]:
        """ProduceRequests sent and records acknowledged, from librdkafka's last statistics."""
        requests = sum(b.get("req", {}).get("Produce", 0)
                       for s in self._stats.values() for b in s.get("brokers", {}).values())
        acked = sum(s.get("txmsgs", 0) for s in self._stats.values())
        return {"produce_requests": requests, "records_sent": acked,
                "records_per_produce_request": acked / requests if requests else None}

    def _consumer(self) -> Any:
        from confluent_kafka import Consumer

        self.consumer = Consumer(consumer_config(self.bootstrap, f"{self.topic}-reader"))
        return self.consumer

    async def consume(self, expected: int, seconds_max: float) -> int:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        consumer = self._consumer()
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])

        def read() -> int:
            got = 0
            deadline = time.perf_counter() + seconds_max
            while got < expected and time.perf_counter() < deadline:
                for msg in consumer.consume(CONSUME_BATCH, 0.5):
                    if msg.error() is None and msg.value() is not None:
                        got += 1
            return got

        return await asyncio.to_thread(read)

    async def e2e_start(self, delivered: Callable[[bytes], None]) -> None:
        from confluent_kafka import TopicPartition

        consumer = self._consumer()
        consumer.list_topics(self.topic, timeout=10)  # the partitions' leaders, which the watermarks ask
        ends = [consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(self.partitions)]
        consumer.assign([TopicPartition(self.topic, p, end) for p, end in enumerate(ends)])
        loop = asyncio.get_running_loop()

        def run() -> None:
            while not self._stop.is_set():
                msg = consumer.poll(POLL_S)
                if msg is not None and msg.error() is None:
                    loop.call_soon_threadsafe(delivered, msg.value())

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self._threads.append(t)

    async def e2e_stop(self) -> None:
        pass  # the polling threads stop with the driver

    async def close(self) -> None:
        for p in self.producers:
            await asyncio.to_thread(p.flush, 10)
        self._stop.set()
        for t in self._threads:
            await asyncio.to_thread(t.join, 5)
        if self.consumer is not None:
            self.consumer.close()
        if self.admin is not None:
            try:
                await asyncio.wrap_future(self.admin.delete_topics([self.topic])[self.topic])
            except Exception:
                pass  # a bench run's topic; the run's root goes with the cluster
