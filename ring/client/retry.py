"""How long a client call that is not a produce keeps trying: a group consumer's request, a fetch,
an administrative call.

A failed attempt (no answer, or a "not now" answer: 503, 429, a leader or
coordinator moving) is followed by a pause that doubles from the client's
``retry_backoff_ms`` up to ``CLIENT_RETRY_BACKOFF_MS_MAX`` (or, when a
refusal said how long to wait, its ``Retry-After``, if that is longer), then
another attempt, until ``retry_timeout_s`` has passed since the call began
(Kafka's ``default.api.timeout.ms``; ``CLIENT_RETRY_TIMEOUT_S_DEFAULT``, long enough to
span a failover) or, when the client was given a ``retries`` count, that many
retries were made. The last attempt starts at the deadline at the latest,
so a call ends at most one request timeout after it; the caller then raises one
``BrokersUnavailable`` saying how long it tried. The clock (time and pauses) is passed in.
"""

from __future__ import annotations

from ring import limits
from ring.clock import Clock


def backoff_ms(attempt: int, base_ms: float) -> float:
    """Pause before retry number ``attempt`` (1-based): doubling, capped."""
    return min(base_ms * 2 ** max(attempt - 1, 0), limits.CLIENT_RETRY_BACKOFF_MS_MAX)


class Retry:
    def __init__(self, clock: Clock, timeout_s: float, retries: int | None, backoff_ms: float) -> None:
        self.clock = clock
        self.started_s = clock.monotonic()
        self.deadline_s = self.started_s + timeout_s
        self.retries = retries
        self.base_ms = backoff_ms
        self.attempts = 1  # the first one is under way when the caller asks for a pause

    def spent(self) -> str:
        """How long and how many attempts: for the error the caller raises."""
        return f"{self.attempts} attempts in {self.clock.monotonic() - self.started_s:.1f} s"

    async def pause(self, at_least_s: float = 0.0) -> bool:
        """Wait before the next attempt and count it; False (at once) when none is left. ``at_least_s``:
        the wait a refusal asked for (``transport.retry_after_s``), cut at the deadline."""
        if self.retries is not None and self.attempts > self.retries:
            return False
        left_s = self.deadline_s - self.clock.monotonic()
        if left_s <= 0:
            return False
        await self.clock.sleep(min(max(backoff_ms(self.attempts, self.base_ms) / 1000, at_least_s), left_s))
        self.attempts += 1
        return True
