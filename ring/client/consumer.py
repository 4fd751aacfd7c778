"""Group consumers: ``AsyncGroupConsumer`` (an async iterator) and ``GroupConsumer`` (a blocking one).

    async with AsyncGroupConsumer("http://127.0.0.1:9250", "billing", ["orders"]) as consumer:
        async for record in consumer:          # at-least-once: auto commit
            handle(record.json())

    with GroupConsumer("http://127.0.0.1:9250", "billing", ["orders"], auto_commit=False) as consumer:
        for record in consumer:
            consumer.commit()                  # at-most-once: commit before processing
            handle(record.json())

The consumer joins the group on the broker side (any broker; requests are
forwarded to the group's coordinator), which assigns it partitions and keeps
its read positions: each poll returns records of its partitions from where
the previous one ended. With ``auto_commit`` (the default) every poll first
commits where the previous poll ended, and the iterator polls again only
once every record of the previous poll was handed out, so a record is
committed only after the application asked for the next one: at-least-once.
``close`` commits exactly what was handed out (not the rest of a poll the
application stopped reading) and leaves. Without ``auto_commit`` nothing is
committed unless ``commit`` is called: before processing a record for
at-most-once, after it for at-least-once.

A rebalance (another member joined or left) makes the coordinator answer 409;
the consumer joins again and goes on with its new partitions. Brokers that do
not answer, and 503s (a coordinator moving), are retried on the next broker
after a doubling backoff, up to ``retries`` times.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import uuid
from collections import deque
from typing import Any, AsyncIterator, Coroutine, Iterable, Iterator, TypeVar

import msgpack
import orjson

from ring import errors, limits
from ring.client.metadata import backoff_ms, quote
from ring.client.records import ConsumerRecord
from ring.client.topology import parse_brokers
from ring.client.transport import CT_JSON, RETRY, BrokersUnavailable, BrokerUnreachable, Reply, Transport, \
    classify, error_from, make_session

CT_MSGPACK = "application/msgpack"
T = TypeVar("T")


class AsyncGroupConsumer:
    def __init__(self, brokers: str | Iterable[str], group: str, topics: str | Iterable[str], *,
                 consumer_id: str | None = None, auto_commit: bool = True, reset: str = "earliest",
                 session_timeout_ms: int = limits.GROUP_SESSION_TIMEOUT_MS_DEFAULT,
                 max_records: int = limits.FETCH_RECORDS_DEFAULT, wait_ms: int = 5_000,
                 timeout_s: float = limits.CLIENT_REQUEST_TIMEOUT_S_DEFAULT,
                 retries: int = limits.CLIENT_RETRIES_MAX_DEFAULT,
                 retry_backoff_ms: float = limits.CLIENT_RETRY_BACKOFF_MS) -> None:
        """``topics``: one name or several; ``consumer_id``: this member's id (default: host, pid and a
        random suffix); ``reset``: where partitions without a committed offset start (earliest|latest);
        ``wait_ms``: how long each poll long-polls when there is nothing."""
        self.urls = parse_brokers(brokers)
        self.group = group
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.consumer_id = consumer_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.auto_commit = auto_commit
        self.reset = reset
        self.session_timeout_ms = session_timeout_ms
        self.max_records = max_records
        self.wait_ms = wait_ms
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.generation: int | None = None
        self.assignment: list[tuple[str, int]] = []
        self.rejoins = 0
        self._next_url = itertools.cycle(range(len(self.urls)))
        self._url = self.urls[0]
        self._transport: Transport | None = None
        self._buffer: deque[ConsumerRecord] = deque()
        self._handed: dict[tuple[str, int], int] = {}  # next offset after the last record handed out
        self._committed: dict[tuple[str, int], int] = {}  # what this consumer last committed itself
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> AsyncGroupConsumer:
        if self._transport is None:
            self._transport = Transport(make_session(), self.timeout_s)
            await self._join()
        return self

    async def __aenter__(self) -> AsyncGroupConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close(commit=exc[0] is None)

    async def close(self, commit: bool = True) -> None:
        """Commit what was handed out (``commit``) and leave the group; the partitions go to the others."""
        if self._closed or self._transport is None:
            return
        self._closed = True
        try:
            if commit:
                await self._commit_handed()
            await self._call("DELETE", f"/v1/groups/{quote(self.group)}/members/{quote(self.consumer_id)}",
                             params={"commit": "false"}, ok_conflict=True)
        finally:
            await self._transport.session.close()

    # --- requests -----------------------------------------------------------------------

    async def _call(self, method: str, path: str, doc: Any = None, *, params: dict[str, Any] | None = None,
                    accept: str = CT_JSON, wait_ms: int = 0, ok_conflict: bool = False) -> Reply:
        """One group request, on the next broker after a failure; a 409 raises ``Conflict`` (rejoin)."""
        assert self._transport is not None, "start() the consumer first"
        body = None if doc is None else orjson.dumps(doc)
        headers = {"Accept": accept, **({"Content-Type": CT_JSON} if body is not None else {})}
        last: errors.RingError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(backoff_ms(attempt, self.retry_backoff_ms) / 1000)
            try:
                reply = await self._transport.request(method, self._url, path, params=params, body=body,
                                                      headers=headers, timeout_s=self.timeout_s + wait_ms / 1000)
            except BrokerUnreachable as exc:
                last = exc
                self._url = self.urls[next(self._next_url)]
                continue
            if reply.status < 300 or (ok_conflict and reply.status in (404, 409)):
                return reply
            err = error_from(reply, f"{method} {path}")
            if classify(reply.status, str(reply.error_doc().get("error", ""))) != RETRY:
                raise err
            last = err
            self._url = self.urls[next(self._next_url)]
        raise BrokersUnavailable(f"{method} {path}: no broker did it; last: {last.message if last else 'none'}",
                                 group=self.group)

    async def _join(self) -> None:
        reply = await self._call("POST", f"/v1/groups/{quote(self.group)}/members", {
            "consumer": self.consumer_id, "topics": self.topics, "reset": self.reset,
            "session_timeout_ms": self.session_timeout_ms, "client": socket.gethostname()})
        doc = reply.json()
        self.generation = doc["generation"]
        self.assignment = [(a["topic"], a["partition"]) for a in doc["assignment"]]
        held = set(self.assignment)
        self._handed = {tp: o for tp, o in self._handed.items() if tp in held}

    # --- reading ------------------------------------------------------------------------

    async def poll(self, max_records: int | None = None, wait_ms: int | None = None) -> list[ConsumerRecord]:
        """The next records of this consumer's partitions (long-polling up to ``wait_ms``), all counted
        as handed out; with ``auto_commit``, the broker first commits where the previous poll ended."""
        records = await self._poll(max_records, wait_ms)
        for r in records:
            self.mark(r)
        return records

    async def _poll(self, max_records: int | None = None, wait_ms: int | None = None) -> list[ConsumerRecord]:
        await self.start()
        wait = self.wait_ms if wait_ms is None else wait_ms
        path = f"/v1/groups/{quote(self.group)}/members/{quote(self.consumer_id)}/poll"
        for _ in range(self.retries + 1):
            params = {"max_records": max_records or self.max_records, "wait_ms": wait,
                      "generation": self.generation, "auto_commit": "true" if self.auto_commit else "false"}
            try:
                reply = await self._call("POST", path, params=params, accept=CT_MSGPACK, wait_ms=wait)
            except errors.Conflict as exc:
                if not exc.extra.get("rejoin"):
                    raise
                self.rejoins += 1
                await self._join()  # a rebalance: new generation, maybe other partitions
                continue
            doc = msgpack.unpackb(reply.body, raw=False)
            self.generation = doc["generation"]
            return [ConsumerRecord(r["topic"], r["partition"], r["offset"], r["timestamp"], r["key"], r["value"],
                                   r["headers"] or None, bool(r["json"])) for r in doc["records"]]
        raise errors.Conflict(f"group {self.group!r} kept rebalancing; gave up after {self.retries} rejoins",
                              group=self.group)

    def mark(self, record: ConsumerRecord) -> None:
        """``record`` was handed to the application: ``commit()`` and ``close()`` count it as read."""
        self._handed[(record.topic, record.partition)] = record.offset + 1

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._buffer.extend(await self._poll())
        record = self._buffer.popleft()
        self.mark(record)
        return record

    # --- committing ---------------------------------------------------------------------

    async def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` ((topic, partition) -> next offset to read), by default everything handed out.
        Raises ``Conflict`` when a partition moved to another member meanwhile (its records will be read again)."""
        todo = dict(self._handed if offsets is None else offsets)
        todo = {tp: o for tp, o in todo.items() if self._committed.get(tp) != o}
        if not todo:
            return
        await self._call("POST", f"/v1/groups/{quote(self.group)}/offsets", {
            "consumer": self.consumer_id, "generation": self.generation,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(todo.items())]})
        self._committed.update(todo)

    async def _commit_handed(self) -> None:
        try:
            await self.commit()
        except errors.Conflict:
            pass  # those partitions moved on: their new owner reads the rest again (at-least-once)


class GroupConsumer:
    """The blocking face of ``AsyncGroupConsumer``: the same arguments, run on a loop in a daemon thread."""

    def __init__(self, brokers: str | Iterable[str], group: str, topics: str | Iterable[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ring-consumer", daemon=True)
        self._thread.start()
        self._consumer = AsyncGroupConsumer(brokers, group, topics, **options)
        self._buffer: deque[ConsumerRecord] = deque()

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

    def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        self._call(self._consumer.commit(offsets))

    def mark(self, record: ConsumerRecord) -> None:
        self._consumer.mark(record)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self

    def __next__(self) -> ConsumerRecord:
        while not self._buffer:
            if self._consumer._closed:
                raise StopIteration
            self._buffer.extend(self._call(self._consumer._poll()))
        record = self._buffer.popleft()
        self._consumer.mark(record)
        return record

    @property
    def generation(self) -> int | None:
        return self._consumer.generation

    @property
    def assignment(self) -> list[tuple[str, int]]:
        return self._consumer.assignment
