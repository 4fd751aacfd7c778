"""The injected clock (ring/clock.py): ManualClock's sleeps and bounded waits end only when ``advance``
passes their deadline, in deadline order; SystemClock's are asyncio's."""

from __future__ import annotations

import asyncio

import pytest

from ring.clock import ManualClock, SystemClock


async def turns(n: int = 5) -> None:
    """Let every ready task run (a few loop turns)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_sleep_ends_only_once_advance_passes_its_deadline() -> None:
    clock = ManualClock()
    sleeper = asyncio.create_task(clock.sleep(2.0))
    await turns()
    assert not sleeper.done() and clock.next_deadline() == 2.0
    clock.advance(1.999)
    await turns()
    assert not sleeper.done()
    clock.advance(0.001)
    await turns()
    assert sleeper.done() and clock.next_deadline() is None


async def test_sleepers_wake_in_deadline_order_and_zero_only_yields() -> None:
    clock, woke = ManualClock(), []

    async def sleep(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append(name)

    tasks = [asyncio.create_task(sleep(n, s)) for n, s in [("late", 3.0), ("early", 1.0), ("also early", 1.0)]]
    await clock.sleep(0)  # returns without time moving
    await turns()
    assert woke == [] and clock.monotonic() == 0.0
    clock.advance(5.0)
    await asyncio.gather(*tasks)
    assert woke == ["early", "also early", "late"]


async def test_a_cancelled_sleep_leaves_no_deadline_behind() -> None:
    clock = ManualClock()
    sleeper = asyncio.create_task(clock.sleep(1.0))
    await turns()
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    assert clock.next_deadline() is None


async def test_a_bounded_wait_returns_the_result_when_it_comes_first() -> None:
    clock, fut = ManualClock(), asyncio.get_running_loop().create_future()
    waiter = asyncio.create_task(clock.wait_for(fut, 1.0))
    await turns()
    fut.set_result("answer")
    assert await waiter == "answer"
    assert clock.next_deadline() is None  # its deadline went with it


async def test_a_bounded_wait_times_out_at_its_deadline_and_cancels_what_it_waited_for() -> None:
    clock, event = ManualClock(), asyncio.Event()
    waited = asyncio.create_task(event.wait())
    waiter = asyncio.create_task(clock.wait_for(waited, 1.0))
    await turns()
    clock.advance(0.5)
    await turns()
    assert not waiter.done()
    clock.advance(0.5)
    with pytest.raises(asyncio.TimeoutError):
        await waiter
    assert waited.cancelled()


async def test_a_bounded_wait_passes_the_awaited_exception_on_and_none_waits_unbounded() -> None:
    clock = ManualClock()

    async def fails() -> None:
        raise ValueError("theirs")

    with pytest.raises(ValueError, match="theirs"):
        await clock.wait_for(fails(), 1.0)
    fut = asyncio.get_running_loop().create_future()
    waiter = asyncio.create_task(clock.wait_for(fut, None))
    await turns()
    assert clock.next_deadline() is None
    fut.set_result(7)
    assert await waiter == 7


async def test_a_bounded_wait_of_zero_times_out_unless_already_done() -> None:
    clock = ManualClock()
    done = asyncio.get_running_loop().create_future()
    done.set_result(1)
    assert await clock.wait_for(done, 0) == 1
    with pytest.raises(asyncio.TimeoutError):
        await clock.wait_for(asyncio.Event().wait(), 0)


async def test_cancelling_a_bounded_wait_cancels_what_it_waited_for() -> None:
    clock, event = ManualClock(), asyncio.Event()
    waited = asyncio.create_task(event.wait())
    waiter = asyncio.create_task(clock.wait_for(waited, 10.0))
    await turns()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await turns()
    assert waited.cancelled() and clock.next_deadline() is None


async def test_the_system_clock_sleeps_and_bounds_waits_in_real_time() -> None:
    clock = SystemClock()
    before = clock.monotonic()
    await clock.sleep(0.02)
    assert clock.monotonic() - before >= 0.02
    with pytest.raises(asyncio.TimeoutError):
        await clock.wait_for(asyncio.Event().wait(), 0.01)
    assert await clock.wait_for(asyncio.sleep(0, "ok"), 1.0) == "ok"
