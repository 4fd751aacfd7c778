"""Client quotas, as Kafka's: produce and fetch bytes per second and requests per second, per token name.

A ``Quota`` is what a tokens file gives a token (``ring.auth``: fields such
as ``produce_bytes_per_s=1048576`` after its topics). ``Throttle`` holds one
token bucket per (name, kind) and decides: ``admit(now, name, quota, kind)``
returns 0 when a request may go, else the seconds to wait; ``charge(now,
name, quota, kind, nbytes)`` takes a request's bytes once they are known
(a produce's body, a fetch's answer).

Bytes are charged after the fact, as Kafka does: a request is let in while
its name's bucket is not in debt, its bytes may take the bucket below zero,
and the next request waits until the rate has paid that debt back (the
wait is ``-level / rate``). So one request of any size goes through, and
over any span longer than the burst a name gets its rate, no more.
Requests per second are taken when a request is let in (one each).

Everything here is pure: time is the ``now`` given (seconds, any monotonic
origin), no I/O, no clock, no randomness; the front calls it with the loop
time it already read for the request.
"""

from __future__ import annotations

from dataclasses import dataclass

from ring import limits

PRODUCE = "produce"
FETCH = "fetch"
REQUESTS = "requests"
KINDS = (PRODUCE, FETCH, REQUESTS)
# The tokens-file field of each kind's rate.
FIELDS = {"produce_bytes_per_s": PRODUCE, "fetch_bytes_per_s": FETCH, "requests_per_s": REQUESTS}


@dataclass(frozen=True)
class Quota:
    """Rates of one token (None: no bound on that one)."""

    produce_bytes_per_s: float | None = None
    fetch_bytes_per_s: float | None = None
    requests_per_s: float | None = None

    def rate(self, kind: str) -> float | None:
        return {PRODUCE: self.produce_bytes_per_s, FETCH: self.fetch_bytes_per_s,
                REQUESTS: self.requests_per_s}[kind]

    @classmethod
    def parse(cls, fields: list[str]) -> Quota:
        """``name=rate`` fields of a tokens-file line; ValueError for anything else."""
        rates: dict[str, float] = {}
        for f in fields:
            key, eq, value = f.partition("=")
            if not eq or key not in FIELDS:
                raise ValueError(f"{f[:60]!r} is not a quota: use {', '.join(f'{k}=N' for k in FIELDS)}")
            if key in rates:
                raise ValueError(f"{key} is given twice")
            try:
                rate = float(value)
            except ValueError:
                rate = -1.0
            if not 0 < rate < limits.QUOTA_RATE_MAX:
                raise ValueError(f"{key} must be a number above 0 and below {limits.QUOTA_RATE_MAX}")
            rates[key] = rate
        return cls(**rates)

    def fields(self) -> list[str]:
        """The tokens-file fields of this quota (the inverse of ``parse``)."""
        return [f"{key}={self.rate(kind):.15g}" for key, kind in FIELDS.items() if self.rate(kind) is not None]


class Bucket:
    """One token bucket: ``level`` units, filling at ``rate`` a second up to ``rate * QUOTA_BURST_S``."""

    __slots__ = ("level", "at")

    def __init__(self, rate: float, now: float) -> None:
        self.level = rate * limits.QUOTA_BURST_S  # a name starts with a full burst
        self.at = now

    def fill(self, rate: float, now: float) -> float:
        if now > self.at:
            self.level = min(rate * limits.QUOTA_BURST_S, self.level + (now - self.at) * rate)
            self.at = now
        return self.level


class Throttle:
    """The buckets of every name with a quota, and how often each was throttled (for metrics)."""

    def __init__(self) -> None:
        self.buckets: dict[tuple[str, str], Bucket] = {}
        self.throttled: dict[tuple[str, str], int] = {}  # (name, kind) -> requests refused

    def _bucket(self, name: str, kind: str, rate: float, now: float) -> Bucket:
        bucket = self.buckets.get((name, kind))
        if bucket is None:
            bucket = self.buckets[(name, kind)] = Bucket(rate, now)
        bucket.fill(rate, now)
        return bucket

    def admit(self, now: float, name: str, quota: Quota, kind: str) -> float:
        """0 when a ``kind`` request (produce or fetch) of ``name`` may go now (its request is
        taken from the requests bucket), else the seconds to wait (nothing is taken)."""
        byte_wait = request_wait = 0.0
        rate = quota.rate(kind)
        if rate is not None:
            level = self._bucket(name, kind, rate, now).level
            byte_wait = -level / rate if level < 0 else 0.0
        requests = None
        if quota.requests_per_s is not None:
            requests = self._bucket(name, REQUESTS, quota.requests_per_s, now)
            if requests.level < 1:
                request_wait = (1 - requests.level) / quota.requests_per_s
        if byte_wait or request_wait:
            key = (name, kind if byte_wait >= request_wait else REQUESTS)
            self.throttled[key] = self.throttled.get(key, 0) + 1
            return min(max(byte_wait, request_wait), limits.QUOTA_WAIT_S_MAX)
        if requests is not None:
            requests.level -= 1
        return 0.0

    def charge(self, now: float, name: str, quota: Quota, kind: str, nbytes: int) -> None:
        """``nbytes`` of a ``kind`` request of ``name`` (its body, or its answer) are known."""
        rate = quota.rate(kind)
        if rate is not None and nbytes:
            self._bucket(name, kind, rate, now).level -= nbytes

    def keep(self, names: set[str]) -> None:
        """Forget the buckets of names no longer in the tokens file (after a reload)."""
        for table in (self.buckets, self.throttled):
            for key in [k for k in table if k[0] not in names]:
                del table[key]
