"""The virtual-time event loop of the simulation (``tests.sim.vloop``): time jumps to the next timer,
executor work runs inline, a killed host's code never runs again."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.sim.vloop import HOST, VirtualLoop, run


def test_sleeps_take_virtual_time_only() -> None:
    async def main(loop: VirtualLoop) -> list[float]:
        seen = []
        for delay in (5.0, 60.0, 0.25):
            await asyncio.sleep(delay)
            seen.append(loop.time())
        return seen

    started = time.monotonic()
    assert run(1, main) == [5.0, 65.0, 65.25]
    assert time.monotonic() - started < 30.0  # it did not wait the 65 s it slept: time jumped


def test_timers_fire_in_order_and_timeouts_expire_on_virtual_time() -> None:
    async def main(loop: VirtualLoop) -> list[tuple[str, float]]:
        fired: list[tuple[str, float]] = []
        loop.call_later(3.0, lambda: fired.append(("b", loop.time())))
        loop.call_later(1.0, lambda: fired.append(("a", loop.time())))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10.0):
                await asyncio.Event().wait()
        fired.append(("timeout", loop.time()))
        return fired

    assert run(2, main) == [("a", 1.0), ("b", 3.0), ("timeout", 10.0)]


def test_run_in_executor_runs_inline_and_carries_exceptions() -> None:
    calls: list[str] = []

    async def main(loop: VirtualLoop) -> None:
        fut = loop.run_in_executor(None, lambda x: calls.append(x) or x * 2, "ab")
        assert fut.done() and calls == ["ab"]  # before any await: ran on the spot
        assert await fut == "abab"
        assert await asyncio.to_thread(sum, [1, 2, 3]) == 6
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(None, lambda: 1 / 0)
        assert loop.time() == 0.0

    run(3, main)


def test_waiting_on_nothing_is_reported_not_hung() -> None:
    async def main(loop: VirtualLoop) -> None:
        await loop.create_future()  # nobody will ever complete it, and no timer is left

    with pytest.raises(RuntimeError, match="block forever"):
        run(4, main)


def test_a_killed_host_runs_nothing_more() -> None:
    async def ticker(loop: VirtualLoop, ticks: list[tuple[str, float]]) -> None:
        try:
            while True:
                await asyncio.sleep(1.0)
                ticks.append((HOST.get(), loop.time()))
        finally:
            ticks.append(("finally", loop.time()))  # a crash runs no cleanup

    async def main(loop: VirtualLoop) -> list[tuple[str, float]]:
        ticks: list[tuple[str, float]] = []
        loop.spawn("a", ticker(loop, ticks))
        loop.spawn("b", ticker(loop, ticks))
        loop.call_in("a", 2.5, loop.kill, "a")
        await asyncio.sleep(3.5)
        return list(ticks)  # (a copy: closing the frozen coroutines when the loop goes runs their finally)

    ticks = run(5, main)
    assert [t for h, t in ticks if h == "a"] == [1.0, 2.0]
    assert [t for h, t in ticks if h == "b"] == [1.0, 2.0, 3.0]
    assert not any(h == "finally" for h, _ in ticks)


def test_the_seed_sets_the_random_source() -> None:
    async def main(loop: VirtualLoop) -> list[float]:
        return [loop.rng.random() for _ in range(3)]

    assert run(7, main) == run(7, main) != run(8, main)


def test_a_killed_host_revived_runs_as_a_new_incarnation_and_the_old_stays_frozen() -> None:
    async def ticker(loop: VirtualLoop, name: str, ticks: list[tuple[str, float]]) -> None:
        while True:
            await asyncio.sleep(1.0)
            ticks.append((name, loop.time()))

    async def main(loop: VirtualLoop) -> list[tuple[str, float]]:
        ticks: list[tuple[str, float]] = []
        loop.spawn("a", ticker(loop, "first", ticks))
        await asyncio.sleep(2.5)
        loop.kill("a")
        await asyncio.sleep(1.0)
        assert loop.revive("a") == 1
        loop.spawn("a", ticker(loop, "second", ticks))
        await asyncio.sleep(2.2)
        return list(ticks)

    ticks = run(9, main)
    assert [t for h, t in ticks if h == "first"] == [1.0, 2.0]
    assert [t for h, t in ticks if h == "second"] == [4.5, 5.5]


def test_a_paused_host_runs_nothing_until_resumed_then_everything_in_order() -> None:
    async def ticker(loop: VirtualLoop, ticks: list[tuple[str | None, float]]) -> None:
        while True:
            await asyncio.sleep(1.0)
            ticks.append((HOST.get(), loop.time()))

    async def main(loop: VirtualLoop) -> list[tuple[str | None, float]]:
        ticks: list[tuple[str | None, float]] = []
        loop.spawn("a", ticker(loop, ticks))
        loop.spawn("b", ticker(loop, ticks))
        await asyncio.sleep(1.5)
        loop.pause("a")
        loop.call_in("a", 0.5, ticks.append, ("a-late", loop.time()))  # scheduled while paused: held too
        await asyncio.sleep(3.0)
        loop.resume("a")
        await asyncio.sleep(1.2)
        return list(ticks)

    ticks = run(10, main)
    assert [t for h, t in ticks if h == "b"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [t for h, t in ticks if h == "a"] == [1.0, 4.5, 5.5]  # its 2.0 tick runs at the resume
    assert ("a-late", 1.5) in ticks


def test_a_timer_never_runs_before_its_time_on_the_virtual_clock() -> None:
    """A timer due less than a machine clock's resolution from now runs when the clock reads its time, not
    at once while other callbacks keep the loop busy: code waiting out ``deadline - now`` while it is above
    0 would otherwise spin at one instant."""
    async def main(loop: VirtualLoop) -> tuple[float, list[float]]:
        await asyncio.sleep(1.0)
        t0 = loop.time()
        fired: list[float] = []
        loop.call_later(4e-10, lambda: fired.append(loop.time()))
        for _ in range(3):
            await asyncio.sleep(0)  # (the loop is busy: its ready queue is not empty)
        await asyncio.sleep(1e-9)
        return t0, fired

    t0, fired = run(11, main)
    assert len(fired) == 1 and fired[0] >= t0 + 4e-10, (t0, fired)


def test_executor_work_that_stalls_is_done_that_many_virtual_seconds_later() -> None:
    async def main(loop: VirtualLoop) -> list[tuple[str, float]]:
        def slow(x: int) -> int:
            loop.stall(2.5)
            return x + 1

        def slow_failing() -> None:
            loop.stall(1.0)
            raise OSError("no")

        fut = loop.run_in_executor(None, slow, 1)
        assert not fut.done()  # ran, but its thread is held up
        seen = [("slow", await fut, loop.time())]
        with pytest.raises(OSError):
            await loop.run_in_executor(None, slow_failing)
        seen.append(("failing", 0, loop.time()))
        seen.append(("quick", await loop.run_in_executor(None, lambda: 7), loop.time()))  # a stall is per call
        return seen

    assert run(4, main) == [("slow", 2, 2.5), ("failing", 0, 3.5), ("quick", 7, 3.5)]
