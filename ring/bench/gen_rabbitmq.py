"""RabbitMQ streams' load-generator driver (rstream).

One stream created with ``initial-cluster-size`` 3 (a leader and two
replicas; RabbitMQ confirms a publish once a quorum of them has it). A
request is one ``Producer.send_batch`` of 1 or 100 messages; it is done when
every message in it is confirmed. Unkeyed records go as raw bodies; keyed ones
as AMQP 1.0 messages carrying the key as an application property, encoded
once up front as ring's stored batches are (a single stream has no key
routing: that would take a super stream, a set of streams). Consume is a
``Consumer`` subscribed from the first offset, its callback counting records.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable

from ring.bench.records import with_seq

USER = PASSWORD = "guest"  # RabbitMQ's default user, allowed from loopback only


class RabbitDriver:
    def __init__(self, spec: dict[str, Any], records: list[tuple[bytes, bytes]]) -> None:
        self.spec = spec
        self.records = records
        self.host: str = spec["target"].get("host", "127.0.0.1")
        self.port: int = spec["target"]["ports"][0]
        self.replicas: int = spec["target"].get("replicas", 3)
        self.stream = spec["topic"]
        self.producer: Any = None
        self.consumer: Any = None
        self._waiting: dict[int, list] = {}  # publishing id -> [future, remaining] of its request
        self._ids = itertools.count(1)

    async def open(self) -> None:
        from rstream import Producer

        self.producer = Producer(self.host, self.port, username=USER, password=PASSWORD, max_retries=3)
        await self.producer.start()
        await self.producer.create_stream(
            self.stream, arguments={"initial-cluster-size": str(self.replicas)}, exists_ok=True)

    def _confirmed(self, status: Any) -> None:
        entry = self._waiting.pop(status.message_id, None)
        if entry is None:
            return
        fut = entry[0]
        if fut.done():
            return
        if not status.is_confirmed:
            fut.set_exception(RuntimeError(f"publish not confirmed (code {status.response_code})"))
            return
        entry[1] -= 1
        if entry[1] == 0:
            fut.set_result(None)

    def _bodies(self, keyed: bool) -> list[bytes]:
        if not keyed:
            return [v for _, v in self.records]
        from rstream import AMQPMessage

        return [bytes(AMQPMessage(body=v, application_properties={"key": k.decode()})) for k, v in self.records]

    def sender(self, per_request: int, keyed: bool, seq_stamp: bool = False) -> Callable[[int], Any]:
        from rstream import RawMessage

        producer = self.producer
        bodies = self._bodies(keyed)
        n = len(bodies)
        ids = self._ids
        waiting = self._waiting
        stream = self.stream
        loop = asyncio.get_running_loop()
        confirmed = self._confirmed

        async def send(i: int) -> int:
            fut = loop.create_future()
            entry = [fut, per_request]
            batch = []
            for j in range(i * per_request, (i + 1) * per_request):
                pid = next(ids)
                waiting[pid] = entry
                body = with_seq(bodies[j % n], i) if seq_stamp else bodies[j % n]
                batch.append(RawMessage(body, publishing_id=pid))
            await producer.send_batch(stream, batch, on_publish_confirm=confirmed)
            await fut
            return per_request

        return send

    async def _consumer(self) -> Any:
        from rstream import Consumer

        self.consumer = Consumer(self.host, self.port, username=USER, password=PASSWORD, max_retries=3)
        await self.consumer.start()
        return self.consumer

    async def consume(self, expected: int, seconds_max: float) -> int:
        from rstream import ConsumerOffsetSpecification, OffsetType

        consumer = await self._consumer()
        got = 0
        done = asyncio.Event()

        def cb(message: bytes, ctx: Any) -> None:
            nonlocal got
            got += 1
            if got >= expected:
                done.set()

        await consumer.subscribe(self.stream, cb, offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
        try:
            await asyncio.wait_for(done.wait(), seconds_max)
        except asyncio.TimeoutError:
            pass
        return got

    async def e2e_start(self, delivered: Callable[[bytes], None]) -> None:
        from rstream import ConsumerOffsetSpecification, OffsetType

        consumer = await self._consumer()
        await consumer.subscribe(self.stream, lambda message, ctx: delivered(message),
                                 offset_specification=ConsumerOffsetSpecification(OffsetType.NEXT))

    async def e2e_stop(self) -> None:
        pass  # the consumer closes with the driver

    async def close(self) -> None:
        try:
            if self.consumer is not None:
                await self.consumer.close()
            if self.producer is not None:
                await self.producer.delete_stream(self.stream, missing_ok=True)
        finally:
            if self.producer is not None:
                await self.producer.close()
