"""NATS JetStream's load-generator driver (nats-py).

One FILE stream with ``num_replicas=3`` over subjects ``<stream>.>``. A
request of one record is one ``publish_async`` and its PubAck; a request of
100 records is 100 ``publish_async`` calls (NATS 2.9 has no batch publish)
and the wait for their 100 PubAcks. Keyed records go to the subject
``<stream>.<key>``, NATS's way of addressing by key; unkeyed ones to
``<stream>.clicks``. Consume is an ordered push consumer from the first
message with a callback per message, as the RabbitMQ driver's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

from ring.bench.records import with_seq

STREAM_READY_S = 30.0


class NatsDriver:
    def __init__(self, spec: dict[str, Any], records: list[tuple[bytes, bytes]]) -> None:
        self.spec = spec
        self.records = records
        self.servers: list[str] = spec["target"]["servers"]
        self.replicas: int = spec["target"].get("replicas", 3)
        self.stream = spec["topic"].replace("-", "_")
        self.nc: Any = None
        self.js: Any = None
        self._sub: Any = None

    async def open(self) -> None:
        import nats
        from nats.js.api import StorageType

        self.nc = await nats.connect(servers=self.servers, max_reconnect_attempts=3, connect_timeout=5)
        window = self.spec.get("window", 1) * self.spec.get("records_per_request", 100)
        self.js = self.nc.jetstream(timeout=30, publish_async_max_pending=max(4000, window + 100))
        deadline = time.monotonic() + STREAM_READY_S
        while True:  # JetStream answers only once the nodes have elected a meta leader
            try:
                await self.js.add_stream(name=self.stream, subjects=[f"{self.stream}.>"],
                                         storage=StorageType.FILE, num_replicas=self.replicas)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    def _subject(self, key: bytes | None) -> str:
        return f"{self.stream}.{key.decode()}" if key else f"{self.stream}.clicks"

    def sender(self, per_request: int, keyed: bool, seq_stamp: bool = False) -> Callable[[int], Any]:
        js = self.js
        records = self.records
        msgs = [(self._subject(k if keyed else None), v) for k, v in records]
        n = len(msgs)

        async def send(i: int) -> int:
            base = i * per_request
            futures = []
            for j in range(base, base + per_request):
                subject, value = msgs[j % n]
                if seq_stamp:
                    value = with_seq(value, i)
                futures.append(await js.publish_async(subject, value))
            for f in futures:
                await f
            return per_request

        return send

    async def consume(self, expected: int, seconds_max: float) -> int:
        """An ordered push consumer from the first message, a callback per
        message: nats-py's fastest way to read a stream (about 3x its pull
        consumer's fetch of 1,000 here)."""
        from nats.js.api import DeliverPolicy

        got = 0
        done = asyncio.Event()

        async def cb(msg: Any) -> None:
            nonlocal got
            got += 1
            if got >= expected:
                done.set()

        sub = await self.js.subscribe(f"{self.stream}.>", cb=cb, ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.ALL)
        try:
            await asyncio.wait_for(done.wait(), seconds_max)
        except asyncio.TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        return got

    async def e2e_start(self, delivered: Callable[[bytes], None]) -> None:
        from nats.js.api import DeliverPolicy

        async def cb(msg: Any) -> None:
            delivered(msg.data)

        self._sub = await self.js.subscribe(f"{self.stream}.>", cb=cb, ordered_consumer=True,
                                            deliver_policy=DeliverPolicy.NEW)

    async def e2e_stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def close(self) -> None:
        if self.nc is None:
            return
        try:
            await self.js.delete_stream(self.stream)
        finally:
            await self.nc.close()
