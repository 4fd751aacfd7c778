"""Admission on the client port: refuse new data-plane work fast when the broker is behind, and
hold each token to its quota.

A produce, a fetch or a group poll/commit (``access.plane_of``: the route's
``plane``) is checked by ``Admission.check`` when its head is complete,
before a byte of its body is taken or its handler runs
(``handling.admit``). It is refused with 429 and ``Retry-After`` at once,
instead of joining a queue, when

* the event loop ran each of its last ``LOOP_LAG_PROBES_LATE`` probes more
  than ``LOOP_LAG_MS_MAX`` late: each listening socket's front runs a timer
  every ``LOOP_LAG_PROBE_INTERVAL_S`` and reports how late it ran
  (``lagged``, from ``server.Front.sweep``), and other data-plane work is
  running: one heavy request makes one probe late, an overloaded loop makes
  them all late, and a loop late with nothing running was busy with work
  already answered;
* ``REQUESTS_RUNNING_MAX`` data-plane requests are running (admitted, body
  in, not answered: ``ran`` / ``answered``), long-polls parked waiting for
  data not counted (they hold a waiter, not work);
* or its token is over one of its quotas (``ring.quotas``): then the
  Retry-After is the time its bucket needs.

Everything else (status, metrics, topics, the admin page) is never refused
here, so an operator can see an overload while it lasts. One ``Admission``
per broker (``admission_of``), shared by all its listening sockets; its
counts are read at scrape time (``AdmissionCollector``) and by
``GET /v1/status`` (``snapshot``). Time is the loop time the front already
read for the request or the probe: nothing here reads a clock.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ring import limits, quotas
from ring.errors import Overloaded, QuotaExceeded

LOOP_LAG = "loop_lag"
REQUESTS_RUNNING = "requests_running"
# Seconds: a healthy loop is late by well under 5 ms; the bound is LOOP_LAG_MS_MAX.
LAG_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Admission:
    def __init__(self, parked: Callable[[], int] = lambda: 0) -> None:
        self.lag_ms_max = limits.LOOP_LAG_MS_MAX
        self.running_max = limits.REQUESTS_RUNNING_MAX
        self.parked = parked  # long-polls waiting for data now
        self.lag_s = 0.0  # how late the loop ran the last probe
        self.recent_s = [0.0] * limits.LOOP_LAG_PROBES_LATE  # the last probes' lateness, a ring
        self.probes = 0
        self.lag_counts = [0] * (len(LAG_BUCKETS_S) + 1)
        self.lag_total_s = 0.0
        self.running = 0
        self.refused = {LOOP_LAG: 0, REQUESTS_RUNNING: 0}
        self.throttle = quotas.Throttle()

    # --- what the front reports ---------------------------------------------------------------

    def lagged(self, lag_s: float) -> None:
        """A probe ran ``lag_s`` after it was due."""
        self.lag_s = lag_s
        self.recent_s[self.probes % len(self.recent_s)] = lag_s
        self.probes += 1
        self.lag_counts[bisect_left(LAG_BUCKETS_S, lag_s)] += 1
        self.lag_total_s += lag_s

    def check(self, req: Any, now: float) -> None:
        """429 now for a data-plane request the broker should not take (``now``: its arrival)."""
        kind = req.route.plane
        if not kind:
            return
        refusal = self.overloaded()
        if refusal is not None:
            raise refusal
        principal = req.principal
        quota = principal.quota if principal is not None else None
        if quota is not None:
            wait_s = self.throttle.admit(now, principal.name, quota, kind)
            if wait_s:
                raise QuotaExceeded(f"{principal.name} is over its {kind} quota ({', '.join(quota.fields())}); "
                                    f"retry in {wait_s:.3f} s", wait_s, quota=kind)

    def overloaded(self, count: bool = True) -> Overloaded | None:
        """Why new data-plane work must not be taken now (counted as a refusal unless not ``count``), or
        None: the load bounds of ``check``, asked by the Kafka listener too (which holds the frame rather
        than answer)."""
        working = self.running - self.parked()
        late_s = min(self.recent_s)
        # A late loop with nothing else running was busy with requests already answered (one client's
        # heavy bodies one after another): no queue for this one to join.
        if working > 0 and late_s * 1000 > self.lag_ms_max:
            return self._refuse(LOOP_LAG, f"the event loop ran its last {len(self.recent_s)} probes "
                                f"{late_s * 1000:.0f} ms late or more (bound {self.lag_ms_max} ms)", count)
        if working >= self.running_max:
            return self._refuse(REQUESTS_RUNNING, f"{working} requests are running (bound {self.running_max})",
                                count)
        return None

    def _refuse(self, reason: str, why: str, count: bool = True) -> Overloaded:
        if count:
            self.refused[reason] += 1
        return Overloaded(f"this broker is overloaded: {why}; retry later", reason=reason)

    def ran(self, req: Any) -> None:
        """``req``'s handler is called."""
        if req.route.plane:
            self.running += 1

    def started(self) -> None:
        """A data-plane request of another front (a Produce of the Kafka listener) is running."""
        self.running += 1

    def finished(self) -> None:
        """One that ``started`` has its answer, or its connection closed."""
        self.running -= 1

    def answered(self, req: Any, resp: Any, now: float, running: bool) -> None:
        """``req`` has its answer (``running``: its handler had been called); its bytes go to its quota."""
        route = req.route
        if route is None or not route.plane:
            return
        if running:
            self.running -= 1
        principal = req.principal
        if principal is not None and principal.quota is not None and 200 <= resp.status < 300:
            kind = route.plane
            nbytes = req.body_size if kind == quotas.PRODUCE else len(resp.body)
            self.throttle.charge(now, principal.name, principal.quota, kind, nbytes)

    def reloaded(self, names: set[str]) -> None:
        """The tokens file was read again: forget the buckets of names gone from it."""
        self.throttle.keep(names)

    # --- what operators see ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        throttled: dict[str, dict[str, int]] = {}
        for (name, kind), n in sorted(self.throttle.throttled.items()):
            throttled.setdefault(name, {})[kind] = n
        return {"loop_lag_ms": round(self.lag_s * 1000, 3), "loop_lag_ms_max": self.lag_ms_max,
                "requests_running": self.running, "long_polls_parked": self.parked(),
                "requests_running_max": self.running_max, "refused": dict(self.refused), "throttled": throttled}


class AdmissionCollector:
    """The admission's numbers as metric families, read when Prometheus scrapes."""

    def __init__(self, admission: Admission) -> None:
        self.a = admission

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        a = self.a
        yield GaugeMetricFamily("ring_loop_lag_seconds", "How late the event loop ran its last probe",
                                value=a.lag_s)
        lag = HistogramMetricFamily("ring_loop_lag_probe_seconds", "How late the event loop ran each probe")
        cumulative, buckets = 0, []
        for le, n in zip((*map(str, LAG_BUCKETS_S), "+Inf"), a.lag_counts):
            cumulative += n
            buckets.append((le, cumulative))
        lag.add_metric([], buckets, a.lag_total_s)
        yield lag
        yield GaugeMetricFamily("ring_requests_running", "Produces, fetches and group polls/commits running now "
                                "(long-polls parked included)", value=a.running)
        refused = CounterMetricFamily("ring_admission_refused", "Data-plane requests answered 429 on admission, "
                                      "by reason", labels=["reason"])
        for reason, n in sorted(a.refused.items()):
            refused.add_metric([reason], n)
        yield refused
        throttled = CounterMetricFamily("ring_quota_throttled", "Requests answered 429 for a token over its quota, "
                                        "by token name and quota", labels=["principal", "quota"])
        for (name, kind), n in sorted(a.throttle.throttled.items()):
            throttled.add_metric([name, kind], n)
        yield throttled


_admissions: "weakref.WeakKeyDictionary[Any, Admission]" = weakref.WeakKeyDictionary()


def admission_of(broker: Any) -> Admission:
    """The one admission of ``broker``, whichever of its listening sockets takes a request."""
    admission = _admissions.get(broker)
    if admission is None:
        polls = getattr(broker, "long_polls", None)
        admission = _admissions[broker] = Admission((lambda: polls.open) if polls is not None else (lambda: 0))
    return admission
