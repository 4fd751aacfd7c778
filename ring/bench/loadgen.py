"""One load-generator process: ``python -m ring.bench.loadgen`` reads a run's
spec as JSON on stdin, runs it against one system, and prints the result as
one JSON line on stdout.

Every system (ring, NATS JetStream, RabbitMQ streams, Apache Kafka) gets the same approach:
a separate Python process on uvloop, the same 1 KiB clickstream records, and
the same request shapes, all bounded in count and in time:

- ``produce``: ``window`` requests in flight (``window`` 1: latency with one in
  flight), or paced open-loop at ``rate`` requests/s (latency at a chosen load);
- ``consume``: fill the topic with batched produce (not measured), then read
  it all from offset 0 (``consume_group``: as one member of a consumer group);
- ``e2e``: a paced producer and a consumer in the same process; latency from
  the send to the delivery of each record.

The system-specific part (``gen_ring``, ``gen_nats``, ``gen_rabbitmq``, ``gen_kafka``) is a
driver with ``open``, ``sender``, ``consume``, ``e2e_start`` and ``close``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from typing import Any, Awaitable, Callable

import orjson

from ring.bench import stats
from ring.bench.records import make_records, seq_of

ERRORS_MAX = 200  # failed requests after which a run stops: a broken system, not a slow one


class Run:
    """Counters and latencies of one measured run."""

    def __init__(self) -> None:
        self.requests = 0
        self.records = 0
        self.errors = 0
        self.last_error = ""
        self.latencies_ms: list[float] = []

    def failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]

    def result(self, seconds: float) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "records": self.records,
            "seconds": seconds,
            "rec_s": self.records / seconds if seconds > 0 else None,
            "errors": self.errors,
            "last_error": self.last_error,
            "lat_ms": stats.latency_summary(self.latencies_ms),
        }


Sender = Callable[[int], Awaitable[int]]  # request number -> records acknowledged


async def windowed(send: Sender, window: int, requests_max: int, seconds_max: float) -> dict[str, Any]:
    """Closed loop: ``window`` requests in flight until ``requests_max`` are done
    or ``seconds_max`` has passed."""
    run = Run()
    next_i = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds_max

    async def worker() -> None:
        nonlocal next_i
        while next_i < requests_max and run.errors < ERRORS_MAX:
            start = time.perf_counter()
            if start > deadline:
                return
            i = next_i
            next_i += 1
            try:
                n = await send(i)
            except Exception as exc:  # counted and shown: a bench reports failures, it does not stop at one
                run.failed(exc)
                continue
            run.latencies_ms.append((time.perf_counter() - start) * 1000)
            run.requests += 1
            run.records += n

    await asyncio.gather(*(worker() for _ in range(window)))
    return run.result(time.perf_counter() - t0)


async def paced(send: Sender, rate: float, requests_max: int, seconds_max: float,
                in_flight_max: int = 1024) -> dict[str, Any]:
    """Open loop: request i starts at t0 + i/rate whatever the earlier ones do;
    latency counts from that scheduled start, so a stall is not hidden
    (no coordinated omission)."""
    assert rate > 0
    run = Run()
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(in_flight_max)
    tasks: set[asyncio.Task] = set()
    t0 = time.perf_counter()
    late = 0

    async def one(i: int, scheduled: float) -> None:
        try:
            n = await send(i)
        except Exception as exc:
            run.failed(exc)
            return
        finally:
            gate.release()
        run.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
        run.requests += 1
        run.records += n

    for i in range(requests_max):
        scheduled = t0 + i / rate
        if scheduled - t0 > seconds_max or run.errors >= ERRORS_MAX:
            break
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.01:
            late += 1
        await gate.acquire()
        task = loop.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    res = run.result(time.perf_counter() - t0)
    res["late_starts"] = late
    res["rate_target"] = rate
    return res


async def fixed_requests(spec: dict[str, Any]) -> dict[str, Any]:
    """The same pre-built request (``method``, ``path``, ``body``) to ``url`` with ``window`` in flight,
    on the lean client (``ring.bench.http1``): what the CPU-per-request cases drive beside wrk."""
    from ring.bench import http1

    pool = http1.Pool(spec["url"])
    body = spec.get("body", "").encode()
    if spec["method"] == "POST":
        data = pool.post_head(spec["path"], spec.get("ctype", "application/json"), len(body)) + body
    else:
        data = pool.get_head(spec["path"])

    async def send(i: int) -> int:
        status, answer = await pool.request(data)
        if status != 200:
            raise RuntimeError(f"{spec['method']} {status}: {answer[:200]!r}")
        return 1

    try:
        return await windowed(send, spec["window"], spec["requests_max"], spec["seconds_max"])
    finally:
        pool.close()


async def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    system = spec["system"]
    if spec["op"] == "fixed":
        return await fixed_requests(spec)
    if system == "ring":
        from ring.bench.gen_ring import RingDriver as Driver
    elif system == "nats":
        from ring.bench.gen_nats import NatsDriver as Driver
    elif system == "rabbitmq":
        from ring.bench.gen_rabbitmq import RabbitDriver as Driver
    elif system == "kafka":
        from ring.bench.gen_kafka import KafkaDriver as Driver
    else:
        raise ValueError(f"unknown system {system!r}")
    records = make_records(seed=spec.get("seed", 1))
    driver = Driver(spec, records)
    await driver.open()
    try:
        op = spec["op"]
        if op == "produce":
            send = driver.sender(spec["records_per_request"], spec.get("keyed", False))
            if spec.get("rate"):
                res = await paced(send, spec["rate"], spec["requests_max"], spec["seconds_max"])
            else:
                res = await windowed(send, spec["window"], spec["requests_max"], spec["seconds_max"])
            if hasattr(driver, "produce_stats"):  # what the client library says it sent
                res["client"] = driver.produce_stats()
            return res
        if op in ("consume", "consume_group"):
            send = driver.sender(100, False)
            fill = await windowed(send, spec["window"], spec["fill_records"] // 100, spec["seconds_max"])
            if fill["errors"]:
                raise RuntimeError(f"filling the topic failed: {fill['last_error']}")
            t0 = time.perf_counter()
            got = await getattr(driver, op)(fill["records"], spec["seconds_max"])
            seconds = time.perf_counter() - t0
            return {"records": got, "seconds": seconds, "rec_s": got / seconds if seconds > 0 else None,
                    "expected": fill["records"], "errors": 0, "lat_ms": stats.latency_summary([])}
        if op == "e2e":
            return await e2e(driver, spec)
        raise ValueError(f"unknown op {op!r}")
    finally:
        await driver.close()


async def e2e(driver: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Paced single-record produce; each delivery's latency from its send."""
    sent: dict[int, float] = {}
    latencies: list[float] = []

    def delivered(value: bytes) -> None:
        t = sent.pop(seq_of(value), None)
        if t is not None:
            latencies.append((time.perf_counter() - t) * 1000)

    await driver.e2e_start(delivered)
    await asyncio.sleep(0.3)  # the consumer is subscribed before the first record
    base = driver.sender(1, False, seq_stamp=True)

    async def send(i: int) -> int:
        sent[i] = time.perf_counter()
        return await base(i)

    res = await paced(send, spec["rate"], spec["requests_max"], spec["seconds_max"])
    deadline = time.perf_counter() + 3.0
    while sent and time.perf_counter() < deadline:
        await asyncio.sleep(0.02)
    await driver.e2e_stop()
    res["lat_ms"] = stats.latency_summary(latencies)
    res["undelivered"] = len(sent)
    return res


def main() -> int:
    spec = orjson.loads(sys.stdin.buffer.read())
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    cpu0 = time.process_time()
    try:
        with runner:
            result = runner.run(asyncio.wait_for(run_spec(spec), spec.get("seconds_max", 10) * 3 + 60))
        result["ok"] = True
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    result["loadgen_cpu_s"] = time.process_time() - cpu0
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
