"""``Client``: the blocking face of ``AsyncClient`` for code without an event loop.

It runs an ``AsyncClient`` on its own event loop in a daemon thread and
offers the same methods, blocking until each is done. The exception is
``produce``: it returns a ``concurrent.futures.Future`` at once (Kafka's
``send``), so a loop of ``produce`` calls still batches; call ``.result()`` on
it to wait for that record, or ``flush()`` for all of them. When
``buffer_bytes`` of records wait for acknowledgement, ``produce`` blocks
until there is room (Kafka's ``max.block.ms``) instead of failing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from typing import Any, Coroutine, Iterable, TypeVar

from ring.client.aio import AsyncClient
from ring.client.producer import NO_JSON
from ring.catalog import validate_topic_name
from ring.client.records import FetchResult, RecordMetadata
from ring.log.batch import RecordIn

T = TypeVar("T")
# Records moved from the caller's thread onto the loop per loop turn: a few
# milliseconds of work, then sockets and timers get their turn.
_PUMP_RECORDS_MAX = 2_000


class Client:
    def __init__(self, brokers: str | Iterable[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ring-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def build() -> AsyncClient:
            return AsyncClient(brokers, **options)

        try:
            self._client = self._call(build())
        except BaseException:
            self._stop_loop()
            raise
        # Bytes of records handed to the loop and not yet acknowledged; produce
        # waits on the condition when the next record would pass buffer_bytes.
        self._room = threading.Condition()
        self._reserved = 0
        self._handoff: deque[tuple] = deque()  # records on their way to the loop, in order
        self._pump_scheduled = False

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    @property
    def async_client(self) -> AsyncClient:
        """The client running on the background loop (for its stats and settings)."""
        return self._client

    def start(self) -> Client:
        self._call(self._client.start())
        return self

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, flush: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._client.close(flush=flush))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- producing ------------------------------------------------------------------

    def produce(self, topic: str, value: bytes | str | None = None, *, key: bytes | str | None = None,
                headers: dict[str, bytes | str | None] | None = None, partition: int | None = None,
                timestamp: int | None = None, json: Any = NO_JSON) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; ``.result()`` on the answer gives its ``RecordMetadata``.

        The record is checked and encoded here, in the caller's thread: bad
        input raises at once, and the loop thread only queues it.
        """
        validate_topic_name(topic)
        record, size, is_json = self._client._record(value, key, headers, timestamp, json)
        limit = self._client.buffer_bytes
        out: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        with self._room:
            while self._reserved > 0 and self._reserved + size > limit:
                self._room.wait()
            self._reserved += size
            self._handoff.append((out, topic, record, size, is_json, partition))
            wake = not self._pump_scheduled
            self._pump_scheduled = True
        if wake:  # one loop wake-up per burst of records, not one per record
            self._loop.call_soon_threadsafe(self._pump)
        return out

    def _pump(self, limit: int = _PUMP_RECORDS_MAX) -> None:
        """On the loop: queue handed-over records, at most ``limit`` per turn so
        a fast producer thread cannot keep the loop from its sockets and timers."""
        with self._room:
            items = [self._handoff.popleft() for _ in range(min(limit, len(self._handoff)))]
            more = bool(self._handoff)
            self._pump_scheduled = more
        for item in items:
            self._enqueue(*item)
        if more:
            self._loop.call_soon(self._pump)

    def _release(self, size: int) -> None:
        with self._room:
            self._reserved -= size
            self._room.notify_all()

    def _enqueue(self, out: concurrent.futures.Future, topic: str, record: RecordIn, size: int,
                 is_json: bool, partition: int | None) -> None:
        """On the loop: hand the record to the async client, mirror its future."""
        try:
            fut = self._client._enqueue(topic, record, size, is_json, partition)
        except Exception as exc:  # a closed client: the caller's future says so
            self._release(size)
            out.set_exception(exc)
            return

        def settle(f: asyncio.Future) -> None:
            self._release(size)
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(f.result())

        fut.add_done_callback(settle)

    def flush(self) -> None:
        self._call(self._flush())

    async def _flush(self) -> None:
        # Records handed over before this call may still wait for their pump.
        self._pump(limit=len(self._handoff))
        await self._client.flush()

    def send_batch(self, topic: str, records: Iterable[Any], *, partition: int | None = None) -> list[RecordMetadata]:
        return self._call(self._client.send_batch(topic, list(records), partition=partition))

    # --- everything else: the async method, blocking ------------------------------

    def fetch(self, topic: str, partition: int, offset: int | None = None, **kw: Any) -> FetchResult:
        return self._call(self._client.fetch(topic, partition, offset, **kw))

    def create_topic(self, name: str, partitions: int | None = None, replication_factor: int | None = None,
                     **config: Any) -> dict[str, Any]:
        return self._call(self._client.create_topic(name, partitions, replication_factor, **config))

    def change_topic(self, name: str, **settings: Any) -> dict[str, Any]:
        return self._call(self._client.change_topic(name, **settings))

    def delete_topic(self, name: str) -> None:
        self._call(self._client.delete_topic(name))

    def topics(self) -> list[dict[str, Any]]:
        return self._call(self._client.topics())

    def describe(self, topic: str) -> dict[str, Any]:
        return self._call(self._client.describe(topic))

    def cluster(self) -> dict[str, Any]:
        return self._call(self._client.cluster())

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._client.stats)
