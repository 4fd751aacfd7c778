"""The byte budget of the fetch answers a broker holds, from the read until the last byte is sent.

An answer must not outlive its sending (an idle keep-alive connection must
not pin its last fetch answer, megabytes, until its next request), and the
answers being sent at once must be counted: a client that asks for
``FETCH_BYTES_MAX`` and reads slowly, or never, holds its answer until
``RESPONSE_SEND_TIMEOUT_S``, and ``CLIENT_CONNECTIONS_OPEN_MAX`` such clients
would hold tens of GiB.

``AnswerBudget`` (one per broker, ``budget_of``) counts the bytes of answers
the broker holds, from the read (its disk, or a replica it proxies) until the
last byte is handed to the socket, up to ``FETCH_ANSWER_BYTES_IN_FLIGHT_MAX``.
A fetch asks the log for no more than what is left (``grant``), holds what it
read (``hold``) and is answered 429 with ``Retry-After`` when nothing is left
or its answer no longer fits. It is a plain value below every layer that
reads for an answer (the fronts, the reads proxied to other brokers, group
polls); the fronts' ``ring.http_api.answer`` makes the answer that gives
its hold back once sent.
"""

from __future__ import annotations

import weakref
from typing import Any

from ring import limits
from ring.errors import Overloaded


class AnswerBudget:
    def __init__(self, bytes_max: int = limits.FETCH_ANSWER_BYTES_IN_FLIGHT_MAX) -> None:
        self.bytes_max = bytes_max
        self.used = 0
        self.refused = 0  # answers refused with 429 here (tests, metrics)

    def _refuse(self, why: str) -> Overloaded:
        self.refused += 1
        return Overloaded(f"{why}: this broker holds {self.used} bytes of fetch answers not yet sent "
                          f"(bound {self.bytes_max}); retry later", limit_bytes=self.bytes_max)

    def grant(self, max_bytes: int) -> int:
        """How much a read may ask for now: ``max_bytes``, or less when other answers hold the room."""
        room = self.bytes_max - self.used
        if room <= 0:
            raise self._refuse("no room for another answer")
        return min(max_bytes, room)

    def hold(self, size: int) -> Hold:
        """Count ``size`` bytes until the returned hold is released; 429 when they do not fit."""
        if self.used + size > self.bytes_max:
            raise self._refuse(f"an answer of {size} bytes does not fit")
        self.used += size
        return Hold(self, size)


class Hold:
    """Bytes counted in a budget; ``release`` is idempotent."""

    __slots__ = ("budget", "size", "__weakref__")

    def __init__(self, budget: AnswerBudget, size: int) -> None:
        self.budget = budget
        self.size = size

    def resize(self, size: int) -> None:
        """The held answer became ``size`` bytes (encoded); 429 and released when that does not fit."""
        budget = self.budget
        if budget.used - self.size + size > budget.bytes_max:
            self.release()
            raise budget._refuse(f"an answer of {size} bytes does not fit")
        budget.used += size - self.size
        self.size = size

    def release(self) -> None:
        self.budget.used -= self.size
        self.size = 0

    def __del__(self) -> None:
        # Backstop for an answer never sent (its request or connection dropped before the front
        # wrote it): the hold goes when the answer goes.
        if self.size:
            self.release()

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_budgets: weakref.WeakKeyDictionary[Any, AnswerBudget] = weakref.WeakKeyDictionary()


def budget_of(broker: Any) -> AnswerBudget:
    """The one budget of ``broker`` (its client API and its proxied reads share it)."""
    budget = _budgets.get(broker)
    if budget is None:
        budget = _budgets[broker] = AnswerBudget()
    return budget
