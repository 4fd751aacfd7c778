"""``Client`` and ``GroupConsumer``: the blocking faces of ``AsyncClient`` and ``AsyncGroupConsumer``
for code without an event loop.

It runs an ``AsyncClient`` on its own event loop in a daemon thread and
offers the same methods, blocking until each is done. The exception is
``produce``: it returns a ``concurrent.futures.Future`` at once (Kafka's
``send``), so a loop of ``produce`` calls still batches; call ``.result()`` on
it to wait for that record, or ``flush()`` for all of them. When
``buffer_bytes`` of records wait for acknowledgement, ``produce`` blocks
until there is room, for up to ``max_block_ms`` (Kafka's ``max.block.ms``),
then raises ``BufferFull``. A client still open when the interpreter exits
is closed then: what it holds is flushed (within the delivery timeout), and
an error is logged with the count of records that could not be delivered.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import weakref
from collections import deque
from typing import Any, Coroutine, Iterable, Iterator, TypeVar

from ring.client.aio import AsyncClient, DeliveryCallback, delivery_reporter
from ring.client.batcher import BufferFull
from ring.client.consumer import AsyncGroupConsumer
from ring.client.positions import TP
from ring.client.producer import NO_JSON
from ring.client.transport import ClientClosed
from ring.catalog import validate_topic_name
from ring.client.records import ConsumerRecord, FetchResult, Headers, RecordMetadata
from ring.log.batch import RecordIn

T = TypeVar("T")
# Records moved from the caller's thread onto the loop per loop turn: a few
# milliseconds of work, then sockets and timers get their turn.
_PUMP_RECORDS_MAX = 2_000
log = logging.getLogger("ring.client")
_OPEN: weakref.WeakSet[Client] = weakref.WeakSet()  # clients to close at interpreter exit


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
        _OPEN.add(self)

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise ClientClosed("the client is closed")
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
        try:
            self._call(self._close(flush))
        finally:
            self._closed = True
            _OPEN.discard(self)
            self._stop_loop()

    async def _close(self, flush: bool) -> None:
        if flush:
            self._pump(limit=len(self._handoff))
        await self._client.close(flush=flush)

    def _close_at_exit(self) -> None:
        """The interpreter is exiting with this client open: deliver what it holds, or say what is lost."""
        timeout_s = self._client.delivery_timeout_s + self._client.timeout_s
        try:
            self._call(self._close_within(timeout_s))
        except Exception as exc:  # at exit, nothing can be raised to anyone: say it
            log.error("closing the client at interpreter exit failed: %r", exc)
        finally:
            self._closed = True
            self._stop_loop()

    async def _close_within(self, timeout_s: float) -> None:
        self._pump(limit=len(self._handoff))
        try:
            async with asyncio.timeout(timeout_s):
                await self._client.flush()
        except TimeoutError:
            pass
        self._client.report_loss("the interpreter exited")
        await self._client.close(flush=False)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- producing ------------------------------------------------------------------

    def produce(self, topic: str, value: bytes | str | None = None, *, key: bytes | str | None = None,
                headers: Headers | None = None, partition: int | None = None,
                timestamp: int | None = None, json: Any = NO_JSON,
                on_delivery: DeliveryCallback | None = None) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; ``.result()`` on the answer gives its ``RecordMetadata``.

        The record is checked and encoded here, in the caller's thread: bad
        input raises at once, and the loop thread only queues it. A full buffer
        blocks the call up to ``max_block_ms``, then raises ``BufferFull``.
        ``on_delivery(error, metadata)`` is called on the client's thread when
        the record is acknowledged or has failed.
        """
        if self._closed:
            raise ClientClosed("the client is closed")
        validate_topic_name(topic)
        record, size, is_json = self._client._record(value, key, headers, timestamp, json)
        limit = self._client.buffer_bytes
        out: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()
        if on_delivery is not None:
            out.add_done_callback(delivery_reporter(on_delivery))
        with self._room:
            deadline = self._client.clock.monotonic() + self._client.max_block_ms / 1000
            while self._reserved > 0 and self._reserved + size > limit:
                remaining = deadline - self._client.clock.monotonic()
                if remaining <= 0:
                    raise BufferFull(f"{self._reserved} bytes of records wait for acknowledgement "
                                     f"(buffer_bytes={limit}) and no room came within max_block_ms="
                                     f"{self._client.max_block_ms:g}")
                self._room.wait(remaining)
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

    def unclean_election(self, topic: str, partition: int) -> dict[str, Any]:
        return self._call(self._client.unclean_election(topic, partition))

    def topics(self) -> list[dict[str, Any]]:
        return self._call(self._client.topics())

    def describe(self, topic: str) -> dict[str, Any]:
        return self._call(self._client.describe(topic))

    def cluster(self) -> dict[str, Any]:
        return self._call(self._client.cluster())

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._client.stats)


class GroupConsumer:
    """The blocking face of ``AsyncGroupConsumer``: the same arguments, run on a loop in a daemon thread."""

    def __init__(self, brokers: str | Iterable[str], group: str, topics: str | Iterable[str] | None = None,
                 **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ring-consumer", daemon=True)
        self._thread.start()
        self._consumer = AsyncGroupConsumer(brokers, group, topics, **options)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def consumer(self) -> AsyncGroupConsumer:
        return self._consumer

    def start(self) -> GroupConsumer:
        self._call(self._consumer.start())
        return self

    def __enter__(self) -> GroupConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close(commit=exc[0] is None)

    def close(self, commit: bool = True) -> None:
        try:
            self._call(self._consumer.close(commit))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    def poll(self, max_records: int | None = None, wait_ms: int | None = None) -> list[ConsumerRecord]:
        return self._call(self._consumer.poll(max_records, wait_ms))

    def commit(self, offsets: dict[TP, int] | None = None) -> None:
        self._call(self._consumer.commit(offsets))

    def mark(self, record: ConsumerRecord) -> None:
        self._consumer.mark(record)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        # The consumer's own buffer, read from this thread while no call runs on the loop (the
        # consumer has no background task: nothing else touches it meanwhile).
        c = self._consumer
        while not c._pos.buffer:
            if c._closed:
                raise StopIteration
            records = self._call(c._poll())
            c._pos.buffer.extend(records)  # only now: a rejoin during the poll replaces the buffer
        record = c._pos.buffer.popleft()
        c.mark(record)
        return record

    def seek(self, topic: str, partition: int, offset: int) -> None:
        self._consumer.seek(topic, partition, offset)

    def seek_to_beginning(self, *partitions: TP) -> None:
        self._call(self._consumer.seek_to_beginning(*partitions))

    def seek_to_end(self, *partitions: TP) -> None:
        self._call(self._consumer.seek_to_end(*partitions))

    def position(self, topic: str, partition: int) -> int:
        return self._call(self._consumer.position(topic, partition))

    def committed(self, topic: str, partition: int) -> int | None:
        return self._call(self._consumer.committed(topic, partition))

    def pause(self, *partitions: TP) -> None:
        self._consumer.pause(*partitions)

    def resume(self, *partitions: TP) -> None:
        self._consumer.resume(*partitions)

    def paused(self) -> set[TP]:
        return self._consumer.paused()

    def lag(self) -> dict[TP, int]:
        return self._call(self._consumer.lag())

    @property
    def stats(self) -> dict[str, int]:
        return dict(self._consumer.stats)

    @property
    def generation(self) -> int | None:
        return self._consumer.generation

    @property
    def assignment(self) -> list[TP]:
        return self._consumer.assignment


@atexit.register
def _close_open_clients() -> None:
    """Registered after ``ring.client.aio``'s exit check, so it runs first (atexit is LIFO)."""
    for client in list(_OPEN):
        if not client._closed:
            client._close_at_exit()
