"""An asyncio event loop on virtual time, for running ring's shipped asyncio code in the simulation.

``VirtualLoop`` is a ``SelectorEventLoop`` that never waits: when nothing is
ready, its loop turn moves the virtual clock forward to the next timer (its
selector, which asyncio's own turn uses in debug mode, does the same and
reports no events), so a broker's 30 s of timeouts, gossip rounds and
elections run in however long their callbacks take. ``time()`` is the virtual
clock. ``run_in_executor`` runs the function inline and hands back a completed
future: the threads ring uses for fsyncs and file work would otherwise finish
in real time and in any order. A function that calls ``stall(seconds)`` (a
slow disk's fsync) gets its future done that many virtual seconds later. Signal handlers are recorded, never installed
(several brokers share one process and one loop).

Every callback and task runs in the ``contextvars`` context of the host whose
code scheduled it (``HOST``) and of that host's incarnation (``INCARNATION``):
``kill`` freezes a host the way a crash does. Its scheduled callbacks are
dropped, nothing it schedules later runs, its tasks never resume (no
``finally`` of theirs runs), and the network (``tests.sim.vnet``) closes its
connections. ``revive`` makes the host live again as a new incarnation: what
the old one left frozen stays frozen, and what is spawned as the host from
then on runs. ``pause`` holds a host's callbacks (a stopped process, a long
garbage-collection pause): nothing of its code runs, what arrives for it waits,
and ``resume`` lets it all run, in the order it was scheduled.

``rng`` is the world's one seeded random source; the network's delays and
anything else the simulated world draws come from it. ``sched_log``, when set
to a list, records every callback scheduled (virtual time, when, its name):
diffing two runs' logs finds where they part.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
import random
import selectors
from typing import Any, Callable

WALL_START_S = 1_700_000_000.0  # the wall clock's reading at virtual time 0
# asyncio's own bounds for its loop turn (asyncio.base_events), which VirtualLoop._run_once follows
_MIN_SCHEDULED_TIMER_HANDLES = asyncio.base_events._MIN_SCHEDULED_TIMER_HANDLES  # type: ignore[attr-defined]
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = asyncio.base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION  # type: ignore
_MAXIMUM_SELECT_TIMEOUT = asyncio.base_events.MAXIMUM_SELECT_TIMEOUT  # type: ignore[attr-defined]

HOST: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_host", default=None)
INCARNATION: contextvars.ContextVar[int] = contextvars.ContextVar("sim_incarnation", default=0)


class _Stuck(RuntimeError):
    """Nothing is ready and no timer is due: the simulated world would wait forever."""


class VirtualSelector(selectors.BaseSelector):
    """Keeps registrations (the loop's self-pipe), never reports an event; waiting moves virtual time."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list:
        assert self.loop is not None
        if timeout is None:
            raise _Stuck("the virtual loop has nothing ready and no timer: it would block forever")
        if timeout > 0:
            self.loop.advance(timeout)
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose clock is virtual and jumps to the next timer when idle."""

    def __init__(self, seed: int, start: float = 0.0) -> None:
        selector = VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = start
        self.seed = seed
        self.rng = random.Random(seed)
        self.signal_handlers: dict[int, tuple[Callable[..., Any], tuple]] = {}
        self._stall_s = 0.0  # what the function run_in_executor runs has stalled (stall), virtual s
        self.in_executor = False  # run_in_executor's function is running (what a thread of the pool would run)
        self.dead: set[str] = set()
        self.incarnations: dict[str, int] = {}  # hosts revived, and how many times
        self.paused: dict[str, list[asyncio.Handle]] = {}  # a paused host's callbacks, held in order
        self._host_tasks: dict[str | None, set[asyncio.Task]] = {}
        self.set_task_factory(self._make_task)
        self.network: Any = None  # tests.sim.vnet.Network, once one is attached
        self.sched_log: list[tuple[float, Any, str]] | None = None  # every callback scheduled, when a list

    # --- time ------------------------------------------------------------------------

    @property
    def _clock_resolution(self) -> float:
        """How far past now asyncio runs timers: no further than now itself on the virtual clock (one unit
        in the last place). A timer due within a machine clock's resolution (1 ns) of now would otherwise run
        before its time without the clock moving, and code that waits out the rest of a deadline (wait for
        ``deadline - now``, again while it is above 0) would spin at one instant while other hosts keep the
        loop busy."""
        return math.ulp(self._now)

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:
        pass  # (asyncio sets the machine clock's)

    def time(self) -> float:
        return self._now

    def wall(self) -> float:
        """Seconds since the Unix epoch, as the simulated world's wall clock reads them."""
        return WALL_START_S + self._now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "virtual time only moves forward"
        self._now += seconds

    def _run_once(self) -> None:
        """One turn of the loop as asyncio's ``BaseEventLoop._run_once`` takes it, step for step (the same
        cancelled timers dropped, the same timers due, the same callbacks run), with the selector's wait
        done here: time moves to the next timer when nothing is ready."""
        if self._debug:  # type: ignore[attr-defined]
            return super()._run_once()  # type: ignore[misc]
        scheduled = self._scheduled  # type: ignore[attr-defined]
        count = len(scheduled)
        if count > _MIN_SCHEDULED_TIMER_HANDLES and \
                self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION:  # type: ignore
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        ready = self._ready  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not scheduled:
                raise _Stuck("the virtual loop has nothing ready and no timer: it would block forever")
            timeout = min(max(0, scheduled[0]._when - self._now), _MAXIMUM_SELECT_TIMEOUT)
            if timeout > 0:
                self._now += timeout
        end = self._now + math.ulp(self._now)
        while scheduled and scheduled[0]._when < end:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()
        handle = None  # (as asyncio does: no cycle through an exception kept)

    # --- what would touch threads or the process --------------------------------------

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Runs ``func`` now, on the loop: a future already done with its result or its exception, or, when
        ``func`` called ``stall`` (a slow disk's fsync), one done that many virtual seconds later."""
        fut = self.create_future()
        self._stall_s = 0.0
        self.in_executor = True
        try:
            outcome: tuple[Callable[..., Any], Any] = (fut.set_result, func(*args))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            outcome = (fut.set_exception, exc)
        finally:
            self.in_executor = False
        stall, self._stall_s = self._stall_s, 0.0
        if stall <= 0:
            outcome[0](outcome[1])
        else:
            self.call_later(stall, lambda: fut.done() or outcome[0](outcome[1]))
        return fut

    def stall(self, seconds: float) -> None:
        """The work ``run_in_executor`` is running takes ``seconds`` more virtual seconds: its future is done
        that much later (the thread was held up, as in an fsync on a slow disk)."""
        self._stall_s += seconds

    def hold(self, seconds: float) -> None:
        """The callback running now is held up ``seconds`` virtual seconds on its host's event loop (an fsync
        on a slow disk made on the loop's own thread): none of the host's other callbacks runs until then
        (``pause``, then ``resume``). A host paused already is left as it is."""
        host = HOST.get()
        if host is None or host in self.paused or host in self.dead:
            return
        self.pause(host)
        self.call_in(None, seconds, self.resume, host)

    def add_signal_handler(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
        self.signal_handlers[sig] = (callback, args)

    def remove_signal_handler(self, sig: int) -> bool:
        return self.signal_handlers.pop(sig, None) is not None

    # --- the network: tests.sim.vnet's, never the machine's ----------------------------

    async def create_server(self, protocol_factory: Callable[[], Any], host: Any = None, port: int | None = None,
                            **kwargs: Any) -> Any:
        assert self.network is not None, "no simulated network attached to the virtual loop"
        assert not kwargs.get("ssl"), "the simulated network carries no TLS"
        return self.network.listen(protocol_factory, host, port or 0)

    async def create_connection(self, protocol_factory: Callable[[], Any], host: str | None = None,
                                port: int | None = None, *, sock: Any = None, **kwargs: Any) -> Any:
        assert self.network is not None, "no simulated network attached to the virtual loop"
        assert not kwargs.get("ssl"), "the simulated network carries no TLS"
        if sock is not None:
            host, port = sock.getpeername()
        assert host is not None and port is not None
        return await self.network.connect(protocol_factory, (host, port))

    async def getaddrinfo(self, host: Any, port: Any, **kwargs: Any) -> Any:
        raise OSError("the simulated network has no DNS: use IP literals")

    # --- hosts: who scheduled what -----------------------------------------------------

    def _make_task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        ctx = kwargs.get("context")
        host = ctx.get(HOST) if ctx is not None else HOST.get()
        tasks = self._host_tasks.setdefault(host, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    def _host_dead(self, context: contextvars.Context | None) -> bool:
        if not self.dead and not self.incarnations:
            return False
        if context is None:
            host, incarnation = HOST.get(), INCARNATION.get()
        else:
            host, incarnation = context.get(HOST), context.get(INCARNATION, 0)
        return host in self.dead or (host in self.incarnations and incarnation != self.incarnations[host])

    def _held(self, handle: asyncio.Handle, context: contextvars.Context | None) -> bool:
        """Whether ``handle`` (just scheduled) belongs to a paused host: then it waits in its list."""
        if not self.paused:
            return False
        host = context.get(HOST) if context is not None else HOST.get()
        if host not in self.paused:
            return False
        self.paused[host].append(handle)
        return True

    # call_soon and call_at build their handles themselves, as asyncio's do, without its debug-mode checks
    # (a virtual loop runs no thread but its own): a seed schedules some tens of thousands of callbacks.

    def call_soon(self, callback: Callable[..., Any], *args: Any, context: contextvars.Context | None = None
                  ) -> asyncio.Handle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle = asyncio.Handle(callback, args, self, context)
        if self.sched_log is not None:
            self.sched_log.append((self._now, "soon", getattr(callback, "__qualname__", type(callback).__name__)))
        if self._host_dead(context):
            self._ready.append(handle)  # type: ignore[attr-defined]
            handle.cancel()
        elif not self._held(handle, context):
            self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        if self.sched_log is not None:
            self.sched_log.append((self._now, when, getattr(callback, "__qualname__", type(callback).__name__)))
        heapq.heappush(self._scheduled, handle)  # type: ignore[attr-defined]
        handle._scheduled = True  # type: ignore[attr-defined]
        if self._host_dead(context):
            handle.cancel()
        elif self._held(handle, context):
            self._scheduled = [h for h in self._scheduled if h is not handle]  # (TimerHandles compare by value)
            heapq.heapify(self._scheduled)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any,
                   context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def _context_of(self, host: str | None) -> contextvars.Context:
        ctx = contextvars.copy_context()
        ctx.run(HOST.set, host)
        ctx.run(INCARNATION.set, self.incarnations.get(host, 0) if host is not None else 0)
        return ctx

    def call_in(self, host: str | None, delay: float, callback: Callable[..., Any], *args: Any) -> asyncio.Handle:
        """``callback`` after ``delay`` virtual seconds, run as ``host``'s code (its tasks, its timers)."""
        ctx = self._context_of(host)
        if delay <= 0:
            return self.call_soon(callback, *args, context=ctx)
        return self.call_later(delay, callback, *args, context=ctx)

    def spawn(self, host: str | None, coro: Any) -> asyncio.Task:
        """A task running ``coro`` as ``host``'s code (its live incarnation): everything it schedules is
        that host's."""
        return self.create_task(coro, context=self._context_of(host))

    def tasks_of(self, host: str | None) -> set[asyncio.Task]:
        return {t for t in self._host_tasks.get(host, ()) if not t.done()}

    def kill(self, host: str) -> None:
        """``host`` crashes: none of its callbacks runs from now on, its tasks stay where they are
        forever, and the network drops its connections and refuses new ones to it, until ``revive``."""
        self.dead.add(host)
        self.paused.pop(host, None)  # (what a paused host held dies with it)
        for handle in [*self._ready, *self._scheduled]:  # type: ignore[attr-defined]
            ctx = getattr(handle, "_context", None)
            if ctx is not None and ctx.get(HOST) == host:
                handle.cancel()
        if self.network is not None:
            self.network.host_down(host)

    def revive(self, host: str) -> int:
        """A killed ``host`` is alive again as a new incarnation (its number): the old one's code stays
        frozen, and code spawned as ``host`` from now on runs (a process started again on that machine)."""
        assert host in self.dead, f"{host} is not dead"
        self.dead.discard(host)
        self.incarnations[host] = self.incarnations.get(host, 0) + 1
        return self.incarnations[host]

    def pause(self, host: str) -> None:
        """None of ``host``'s callbacks runs until ``resume``: those due and those scheduled meanwhile wait."""
        if host in self.paused or host in self.dead:
            return
        held: list[asyncio.Handle] = []
        for queue in (self._ready, self._scheduled):  # type: ignore[attr-defined]
            for handle in list(queue):
                ctx = getattr(handle, "_context", None)
                if ctx is not None and ctx.get(HOST) == host:
                    held.append(handle)
        ids = {id(h) for h in held}
        self._ready = type(self._ready)(h for h in self._ready if id(h) not in ids)  # type: ignore[attr-defined]
        self._scheduled = [h for h in self._scheduled if id(h) not in ids]  # type: ignore[attr-defined]
        heapq.heapify(self._scheduled)
        self.paused[host] = held

    def resume(self, host: str) -> None:
        """``host`` runs again: what it held runs, timers at their time (those past due at once)."""
        for handle in self.paused.pop(host, []):
            if handle.cancelled():
                continue
            if isinstance(handle, asyncio.TimerHandle):
                heapq.heappush(self._scheduled, handle)  # type: ignore[attr-defined]
            else:
                self._ready.append(handle)  # type: ignore[attr-defined]

    def forget(self, host: str) -> None:
        """Drop the frozen tasks of a dead host without running them (called at the end of a run)."""
        for task in self._host_tasks.pop(host, set()):
            try:
                task._log_destroy_pending = False  # type: ignore[attr-defined]
            except AttributeError:
                pass


class VirtualClock:
    """ring's ``Clock`` (``ring.clock``) on the loop's virtual time."""

    def __init__(self, loop: VirtualLoop) -> None:
        self.loop = loop
        self.offset_s = 0.0  # how far this host's wall clock is off (a jump moves it; monotonic time never jumps)

    def wall_ms(self) -> int:
        return int((self.loop.wall() + self.offset_s) * 1000)

    def monotonic(self) -> float:
        return self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # the loop's timers run on its virtual time

    async def wait_for(self, aw: Any, seconds: float | None) -> Any:
        return await asyncio.wait_for(aw, seconds)


def running() -> VirtualLoop | None:
    """The virtual loop running now, if one is."""
    loop = asyncio._get_running_loop()
    return loop if isinstance(loop, VirtualLoop) else None


def run(seed: int, main: Callable[[VirtualLoop], Any], start: float = 0.0) -> Any:
    """Run ``main(loop)`` (a coroutine) to its end on a fresh ``VirtualLoop``; the loop is closed after."""
    loop = VirtualLoop(seed, start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main(loop))
    finally:
        for host in list(loop.dead):
            loop.forget(host)
        asyncio.set_event_loop(None)
        loop.close()
