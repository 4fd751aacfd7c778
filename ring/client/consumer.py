"""Group consumers: ``AsyncGroupConsumer`` (an async iterator) and ``GroupConsumer`` (a blocking one,
in ``ring.client.sync``).

    async with AsyncGroupConsumer("http://127.0.0.1:9250", "billing", ["orders"]) as consumer:
        async for record in consumer:          # at-least-once: auto commit
            handle(record.json())

    with GroupConsumer("http://127.0.0.1:9250", "billing", ["orders"], auto_commit=False) as consumer:
        for record in consumer:
            consumer.commit()                  # at-most-once: commit before processing
            handle(record.json())

The consumer joins the group on the broker side (any broker; requests are
forwarded to the group's coordinator), which assigns it partitions and keeps
its read positions: each poll names the token of the last answer this
consumer received, which moves the positions past that answer's records
(an answer lost on the way is never acknowledged, so its records come
again), and returns records from there. With ``auto_commit`` (the default)
every poll first commits what it acknowledged, and the iterator polls again
only once every record of the previous poll was handed out, so a record is
committed only after the application asked for the next one: at-least-once.
``close`` commits exactly what was handed out (not the rest of a poll the
application stopped reading) and leaves. Without ``auto_commit`` nothing is
committed unless ``commit`` is called: before processing a record for
at-most-once, after it for at-least-once.

The consumer also keeps its own position per partition (``ring.client.positions``):
when the coordinator changes (a failover) or a request fails, it puts its
positions back on the coordinator before the next poll, and drops records it
received already, so a failover does not deliver the last poll again.
``seek``/``seek_to_beginning``/``seek_to_end``, ``pause``/``resume``,
``position`` and ``committed`` work on it as on Kafka's consumer.

A rebalance (another member joined or left) makes the coordinator answer 409;
the consumer joins again and goes on with its new partitions, telling the
``listener`` (``on_partitions_revoked``/``on_partitions_assigned``, plain or
async) what changed. A topic deleted and created again (409 ``topic_recreated``)
is a new topic: the consumer forgets what it knew of the old one (its
partitions are revoked) and joins again, reading the new one by its reset
policy. Subscribing by ``pattern`` follows the topics whose name
matches it, checked every ``metadata_max_age_ms``. A request that finds no
broker answering, a 503 (a coordinator failing over) or a 504 (its change not
on a quorum in time: any group request may be sent again), is tried again on the
next broker after a doubling backoff, until ``retry_timeout_s`` (default 60 s,
``ring.client.retry``) has passed: a coordinator's failover takes 5-13 s. The
brokers tried are the given ones and those the cluster names (learned at
start and every ``metadata_max_age_ms``), so the consumer reaches the new
coordinator through any live broker even when the one it was given is down.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import socket
import uuid
from collections import Counter
from typing import Any, AsyncIterator, Iterable

import msgpack
import orjson

from ring import errors, limits
from ring.client.metadata import quote
from ring.client.positions import TP, Positions
from ring.client.records import ConsumerRecord
from ring.client.retry import Retry
from ring.client.topology import parse_brokers, parse_cluster
from ring.client.transport import CT_JSON, RETRY, UNKNOWN, BrokerUnreachable, ClientClosed, Reply, \
    Transport, classify, error_from, make_session, gave_up, retry_after_s
from ring.clock import Clock, SystemClock
from ring.log.batch import records_between

# A poll answer of the stored batches that hold its records (``ring.http_api.groups_api``)
CT_POLL_BATCHES = "application/vnd.ring.poll-batches"
log = logging.getLogger("ring.client")


class AsyncGroupConsumer:
    def __init__(self, brokers: str | Iterable[str], group: str, topics: str | Iterable[str] | None = None, *,
                 pattern: str | re.Pattern[str] | None = None, listener: Any = None,
                 consumer_id: str | None = None, auto_commit: bool = True, reset: str = "earliest",
                 session_timeout_ms: int = limits.GROUP_SESSION_TIMEOUT_MS_DEFAULT,
                 max_records: int = limits.FETCH_RECORDS_DEFAULT, wait_ms: int = 5_000,
                 timeout_s: float = limits.CLIENT_REQUEST_TIMEOUT_S_DEFAULT,
                 retry_timeout_s: float = limits.CLIENT_RETRY_TIMEOUT_S_DEFAULT,
                 retries: int | None = None,
                 retry_backoff_ms: float = limits.CLIENT_RETRY_BACKOFF_MS,
                 metadata_max_age_ms: int = limits.CLIENT_METADATA_MAX_AGE_MS, clock: Clock | None = None) -> None:
        """``topics``: one name or several, or ``pattern`` (a regular expression the whole topic
        name must match; internal topics, named ``__...``, never do); ``listener``: an object with
        ``on_partitions_revoked(partitions)`` and/or ``on_partitions_assigned(partitions)`` (sets of
        (topic, partition), plain or async), called after each rebalance with what this consumer
        lost and gained; ``consumer_id``: this member's id (default: host, pid and a random suffix);
        ``reset``: where partitions without a committed offset start (earliest|latest);
        ``wait_ms``: how long each poll long-polls when there is nothing; a request that fails is
        tried again (other brokers, doubling pauses) until ``retry_timeout_s`` has passed, and no
        more than ``retries`` times when given, then raises ``BrokersUnavailable`` (``Overloaded`` or
        ``QuotaExceeded`` when the last attempt was refused for load or quota); ``clock``: where it
        reads the time and sleeps (default: the system's)."""
        if (topics is None) == (pattern is None):
            raise errors.BadRequest("give topics or a pattern")
        self.urls = parse_brokers(brokers)
        self.group = group
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.topics = [] if topics is None else [topics] if isinstance(topics, str) else list(topics)
        self.listener = listener
        self.consumer_id = consumer_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.auto_commit = auto_commit
        self.reset = reset
        self.session_timeout_ms = session_timeout_ms
        self.max_records = max_records
        self.wait_ms = wait_ms
        self.timeout_s = timeout_s
        self.retry_timeout_s = retry_timeout_s
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.clock = clock or SystemClock()
        self.generation: int | None = None
        self.rejoins = 0
        self._topic_ids: dict[str, str] = {}  # topic -> its id as the last join gave it
        # polls, records, commits, rejoins, redelivered_dropped, lag_records (at the last lag refresh)
        self.stats: Counter[str] = Counter()
        self._url = self.urls[0]
        self._brokers_at = float("-inf")  # when the cluster's brokers were last learned
        self._transport: Transport | None = None
        self._pos = Positions()
        self._unsteady = False  # a request failed: the coordinator may have changed
        self._pattern_at = float("-inf")
        self._lag_at = float("-inf")
        self._token: str | None = None  # of the last poll answer received: the next poll acknowledges it
        self._started = False
        self._closed = False

    @property
    def assignment(self) -> list[TP]:
        return self._pos.assignment

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> AsyncGroupConsumer:
        """Join the group (a failed start is tried again by the next call)."""
        if self._closed:
            raise ClientClosed("the consumer is closed")
        if self._transport is None:
            self._transport = Transport(make_session(), self.timeout_s)
        if not self._started:
            await self._learn_brokers()
            if self.pattern is not None:
                await self._follow_pattern(force=True)
            else:
                await self._join()
            self._started = True
        return self

    async def __aenter__(self) -> AsyncGroupConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close(commit=exc[0] is None)

    async def close(self, commit: bool = True) -> None:
        """With ``auto_commit``, commit what was handed out (``commit``); leave the group, whose partitions
        go to the others. Without ``auto_commit`` only ``commit()`` commits: the application may have
        been handed a record it did not process."""
        if self._closed or self._transport is None:
            return
        self._closed = True
        try:
            if commit and self.auto_commit:
                await self._commit_handed()
            if self.generation is not None:
                await self._call("DELETE", f"/v1/groups/{quote(self.group)}/members/{quote(self.consumer_id)}",
                                 params={"commit": "false"}, ok_conflict=True)
                await self._tell("on_partitions_revoked", self._pos.assign([])[0])
        finally:
            await self._transport.session.close()

    # --- requests -----------------------------------------------------------------------

    async def _call(self, method: str, path: str, doc: Any = None, *, params: dict[str, Any] | None = None,
                    accept: str = CT_JSON, wait_ms: int = 0, ok_conflict: bool = False) -> Reply:
        """One group request, on the next broker after a failure; a 409 raises ``Conflict`` (rejoin)."""
        assert self._transport is not None, "start() the consumer first"
        body = None if doc is None else orjson.dumps(doc)
        headers = {"Accept": accept, **({"Content-Type": CT_JSON} if body is not None else {})}
        retry = Retry(self.clock, self.retry_timeout_s, self.retries, self.retry_backoff_ms)
        while True:
            try:
                reply = await self._transport.request(method, self._url, path, params=params, body=body,
                                                      headers=headers, timeout_s=self.timeout_s + wait_ms / 1000)
            except BrokerUnreachable as exc:
                last: errors.RingError = exc
                wait_s = 0.0
            else:
                if reply.status < 300 or (ok_conflict and reply.status in (404, 409)):
                    return reply
                last = error_from(reply, f"{method} {path}")
                # 504: the coordinator could not get the change onto a quorum in time. Every group
                # request may be sent again, as after a connection lost mid-request: a join, a commit,
                # a leave or positions put twice change nothing more, and a poll's lost answer is
                # read again from the member's positions.
                if classify(reply.status, str(reply.error_doc().get("error", ""))) not in (RETRY, UNKNOWN):
                    raise last
                wait_s = retry_after_s(reply)
            self._unsteady = True  # the coordinator may be another one by the next attempt
            self._url = self.urls[(self.urls.index(self._url) + 1) % len(self.urls)]
            if not await retry.pause(wait_s):
                raise gave_up(f"{method} {path}: no broker did it ({retry.spent()}, retry_timeout_s="
                              f"{self.retry_timeout_s:g}); last: {last.message}", last, group=self.group)

    async def _learn_brokers(self) -> None:
        """Add the brokers the cluster names to the URLs requests go to (one attempt; a failure leaves
        it to the next poll): any live broker relays a group request to the coordinator."""
        assert self._transport is not None
        try:
            reply = await self._transport.json("GET", self._url, "/v1/cluster")
        except BrokerUnreachable:
            return
        if reply.status in (200, 404):  # 404: a standalone broker, the only one there is
            self._brokers_at = self.clock.monotonic()
        if reply.status == 200:
            try:
                learned = [b.client_url for b in parse_cluster(reply.json()).values()]
            except (errors.BadRequest, ValueError) as exc:
                log.debug("the cluster document of %s: %s", self._url, exc)
                return
            self.urls = list(dict.fromkeys([*self.urls, *learned]))

    def _member_path(self, what: str = "") -> str:
        return f"/v1/groups/{quote(self.group)}/members/{quote(self.consumer_id)}{what}"

    async def _join(self) -> None:
        reply = await self._call("POST", f"/v1/groups/{quote(self.group)}/members", {
            "consumer": self.consumer_id, "topics": self.topics, "reset": self.reset,
            "session_timeout_ms": self.session_timeout_ms, "client": socket.gethostname()})
        doc = reply.json()
        self.generation = doc["generation"]
        # A topic whose id changed was deleted and created again: nothing known of the old one (records
        # received, positions, commits) applies to the new one, so its partitions are revoked first.
        ids = doc.get("topic_ids") or {}
        recreated = {t for t, i in ids.items() if self._topic_ids.get(t, i) != i}
        self._topic_ids = dict(ids)
        if recreated:
            revoked, _ = self._pos.assign(tp for tp in self._pos.assignment if tp[0] not in recreated)
            await self._tell("on_partitions_revoked", revoked)
        revoked, added = self._pos.assign((a["topic"], a["partition"]) for a in doc["assignment"])
        await self._tell("on_partitions_revoked", revoked)
        await self._tell("on_partitions_assigned", added)

    async def _tell(self, what: str, partitions: list[TP]) -> None:
        """Call the listener's ``what`` (if it has one) with ``partitions`` (if any)."""
        hook = getattr(self.listener, what, None)
        if hook is None or not partitions:
            return
        result = hook(set(partitions))
        if inspect.isawaitable(result):
            await result

    async def _rejoin(self, exc: errors.Conflict) -> None:
        if not exc.extra.get("rejoin"):
            raise exc
        self.rejoins += 1
        self.stats["rejoins"] += 1
        if isinstance(exc, errors.TopicRecreated):  # the join forgets the old topic (``_join``)
            log.warning("group %s: topic %s was deleted and created again (id %s, was %s); reading it anew",
                        self.group, exc.extra.get("topic"), exc.extra.get("topic_id"), exc.extra.get("stale_topic_id"))
        await self._join()  # a rebalance: new generation, maybe other partitions

    async def _follow_pattern(self, force: bool = False) -> None:
        """With a pattern: the matching topics, checked every ``metadata_max_age_ms``; a change rejoins."""
        now = self.clock.monotonic()
        if self.pattern is None or (not force and now - self._pattern_at < self.metadata_max_age_ms / 1000):
            return
        self._pattern_at = now
        names = [t.get("name") for t in (await self._call("GET", "/v1/topics")).json().get("topics", [])]
        matched = sorted(n for n in names if isinstance(n, str) and not n.startswith("__") and self.pattern.fullmatch(n))
        if matched == self.topics and self.generation is not None:
            return
        self.topics = matched
        if matched:
            await self._join()
        elif self.generation is not None:  # every matching topic is gone: leave until one comes
            await self._call("DELETE", self._member_path(), params={"commit": "true"}, ok_conflict=True)
            self.generation = None
            await self._tell("on_partitions_revoked", self._pos.assign([])[0])

    # --- reading ------------------------------------------------------------------------

    async def poll(self, max_records: int | None = None, wait_ms: int | None = None) -> list[ConsumerRecord]:
        """The next records of this consumer's partitions (long-polling up to ``wait_ms``), all counted
        as handed out; with ``auto_commit``, the broker first commits the previous answer (named by its token)."""
        records = await self._poll(max_records, wait_ms)
        for r in records:
            self.mark(r)
        return records

    async def _poll(self, max_records: int | None = None, wait_ms: int | None = None) -> list[ConsumerRecord]:
        await self.start()
        if self.clock.monotonic() - self._brokers_at >= self.metadata_max_age_ms / 1000:
            await self._learn_brokers()
        await self._follow_pattern()
        wait = self.wait_ms if wait_ms is None else wait_ms
        if self.generation is None or (self.assignment and set(self.assignment) <= self._pos.paused):
            if self.generation is not None:
                await self._join()  # everything paused: a heartbeat, no records
            await self.clock.sleep(wait / 1000)
            return []
        path = self._member_path("/poll")
        for _ in range(limits.CLIENT_POLL_REJOINS_MAX + 1):
            try:
                await self._put_positions()
                params = {"max_records": max_records or self.max_records, "wait_ms": wait,
                          "generation": self.generation, "auto_commit": "true" if self.auto_commit else "false"}
                if self._token is not None:
                    params["token"] = self._token
                reply = await self._call("POST", path, params=params, accept=CT_POLL_BATCHES, wait_ms=wait)
            except errors.Conflict as exc:
                await self._rejoin(exc)
                continue
            doc = msgpack.unpackb(reply.body, raw=False)
            self.generation = doc["generation"]
            self._token = doc.get("token")
            got = [ConsumerRecord(t, p, r.offset, r.timestamp, r.key, r.value, r.headers, is_json)
                   for t, p, start, end, data in doc["batches"]
                   # CRC-checked here too, as a fetch is: end-to-end integrity
                   for r, is_json in records_between(data, start, end, end - start, verify=True)]
            out = self._pos.accept(got)
            self.stats["polls"] += 1
            self.stats["records"] += len(out)
            self.stats["redelivered_dropped"] = self._pos.dropped
            await self._refresh_lag()
            return out
        raise errors.Conflict(f"group {self.group!r} kept rebalancing; gave up after "
                              f"{limits.CLIENT_POLL_REJOINS_MAX} rejoins", group=self.group)

    async def _put_positions(self) -> None:
        """Before a poll: put this consumer's positions on the coordinator where it may not know them
        (a failed request, records received again, a seek or a pause)."""
        if self._unsteady:
            self._unsteady = False
            self._pos.resync()
        seeks = self._pos.take_seeks()
        if not seeks:
            return
        try:
            await self._call("PUT", self._member_path("/positions"), {"generation": self.generation, "positions": [
                {"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(seeks.items())]})
        except errors.Conflict:
            self._pos.seeks.update(seeks)  # kept for the partitions still held after the rejoin
            raise

    def mark(self, record: ConsumerRecord) -> None:
        """``record`` was handed to the application: ``commit()`` and ``close()`` count it as read."""
        self._pos.mark(record)

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self

    async def __anext__(self) -> ConsumerRecord:
        while not self._pos.buffer:
            if self._closed:
                raise StopAsyncIteration
            records = await self._poll()
            # Only now: a rejoin during the poll replaces the buffer, and records added to the old one
            # would never be handed out (while the next poll's token commits them).
            self._pos.buffer.extend(records)
        record = self._pos.buffer.popleft()
        self.mark(record)
        return record

    # --- committing ---------------------------------------------------------------------

    async def commit(self, offsets: dict[TP, int] | None = None) -> None:
        """Commit ``offsets`` ((topic, partition) -> next offset to read), by default everything handed out.
        Partitions this consumer has held all along are committed even if the group rebalanced
        meanwhile; raises ``Conflict`` when one moved to another member (its records will be read again)."""
        todo = dict(self._pos.handed if offsets is None else offsets)
        todo = {tp: o for tp, o in todo.items() if self._pos.committed.get(tp) != o}
        if not todo:
            return
        try:
            await self._commit(todo)
        except errors.Conflict as exc:
            await self._rejoin(exc)
            held = set(self.assignment)
            moved = sorted(tp for tp in todo if tp not in held)
            if len(moved) < len(todo):
                await self._commit({tp: o for tp, o in todo.items() if tp in held})
            if moved:
                raise errors.Conflict(f"{', '.join(f'{t}/{p}' for t, p in moved[:5])} moved to another member of "
                                      f"group {self.group!r} before the commit: their records will be read again",
                                      group=self.group, reason="not_assigned") from None

    async def _commit(self, todo: dict[TP, int]) -> None:
        await self._call("POST", f"/v1/groups/{quote(self.group)}/offsets", {
            "consumer": self.consumer_id, "generation": self.generation,
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(todo.items())]})
        self._pos.committed.update(todo)
        self.stats["commits"] += 1

    async def _commit_handed(self) -> None:
        try:
            await self.commit()
        except errors.Conflict:
            pass  # those partitions moved on: their new owner reads the rest again (at-least-once)

    # --- positions (Kafka's seek, position, committed, pause) -----------------------------

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Read ``topic``/``partition`` (assigned to this consumer) from ``offset`` next; takes effect at the
        next poll. Committed offsets do not change (``commit()`` afterwards commits from there)."""
        self._pos.seek((topic, partition), offset)

    async def seek_to_beginning(self, *partitions: TP) -> None:
        """Seek ``partitions`` (default: all assigned) to their earliest offset."""
        await self._seek_to("earliest", partitions)

    async def seek_to_end(self, *partitions: TP) -> None:
        """Seek ``partitions`` (default: all assigned) past their last record: only new records come."""
        await self._seek_to("latest", partitions)

    async def _seek_to(self, where: str, partitions: tuple[TP, ...]) -> None:
        for t, p in partitions or list(self.assignment):
            doc = (await self._call("GET", f"/v1/topics/{quote(t)}/partitions/{p}/offsets",
                                    params={"timestamp": where})).json()
            self.seek(t, p, int(doc["offset"]))

    async def position(self, topic: str, partition: int) -> int:
        """The offset of the next record of ``topic``/``partition`` (assigned) the application gets."""
        known = self._pos.position((topic, partition))
        if known is not None:
            return known
        self._pos._held([(topic, partition)])
        doc = (await self._call("GET", self._member_path("/positions"))).json()
        for row in doc["positions"]:
            if (row["topic"], row["partition"]) == (topic, partition) and row["position"] is not None:
                return int(row["position"])
        offsets = (await self._call("GET", f"/v1/topics/{quote(topic)}/partitions/{partition}/offsets",
                                    params={"timestamp": self.reset})).json()
        return int(offsets["offset"])  # the reset policy's, as the next poll will pin it

    async def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of ``topic``/``partition`` (None: nothing committed)."""
        reply = await self._call("GET", f"/v1/groups/{quote(self.group)}", ok_conflict=True)
        if reply.status == 404:
            return None
        for row in reply.json()["offsets"]:
            if (row["topic"], row["partition"]) == (topic, partition):
                return row["committed"]
        return None

    def pause(self, *partitions: TP) -> None:
        """Hand out no more records of ``partitions`` (assigned) until ``resume``; buffered ones come again."""
        self._pos.pause(partitions)

    def resume(self, *partitions: TP) -> None:
        self._pos.resume(partitions)

    def paused(self) -> set[TP]:
        return set(self._pos.paused)

    # --- lag --------------------------------------------------------------------------

    async def lag(self, retry: bool = True) -> dict[TP, int]:
        """Records after this consumer's position per assigned partition (high watermark minus position);
        partitions whose position or high watermark is not known yet are left out. Also in ``stats``."""
        assert self._transport is not None, "start() the consumer first"
        hws: dict[TP, int] = {}
        for topic in sorted({t for t, _ in self.assignment}):
            path = f"/v1/topics/{quote(topic)}"
            if retry:
                reply = await self._call("GET", path)
            else:  # one attempt: a poll refreshing the figure must not wait out retries
                reply = await self._transport.json("GET", self._url, path)
                if reply.status != 200:
                    raise error_from(reply, f"GET {path}")
            doc = reply.json()
            hws.update(((topic, p["partition"]), p["high_watermark"]) for p in doc["partitions"]
                       if isinstance(p.get("high_watermark"), int))
        out = {}
        for tp in self.assignment:
            pos = self._pos.position(tp)
            if pos is not None and tp in hws:
                out[tp] = max(0, hws[tp] - pos)
        self.stats["lag_records"] = sum(out.values())
        self._lag_at = self.clock.monotonic()
        return out

    async def _refresh_lag(self) -> None:
        if self.clock.monotonic() - self._lag_at < limits.CLIENT_CONSUMER_LAG_REFRESH_MS / 1000:
            return
        try:
            await self.lag(retry=False)
        except errors.RingError as exc:  # a figure for operators: it must not stop the consumer
            log.debug("refreshing the consumer's lag: %s", exc)
            self._lag_at = self.clock.monotonic()
