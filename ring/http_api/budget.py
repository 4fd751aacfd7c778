"""How many request-body bytes one broker holds at once, counted as they arrive.

Each route bounds its own body (``codec.read_body``), but many uploads at once
would still add up: ``CLIENT_CONNECTIONS_OPEN_MAX`` connections each sending a
maximal produce body is tens of GiB. ``BodyBudget`` (one per broker,
``body_budget_of``) bounds the sum at ``REQUEST_BODY_BYTES_IN_FLIGHT_MAX``.

A request's ``BodyHold`` is charged for each piece of its body when the broker
takes it (``charge``) and gives everything back when the request ends
(``release``). So a client holds only what it has actually sent: connections
that declare 16 MiB bodies and trickle a byte now and then hold those bytes,
not 16 MiB each, and cannot starve other producers (holding the whole budget
takes sending it, again within every ``BODY_READ_TIMEOUT_S``). A piece that
does not fit is answered 429 with ``Retry-After``, and so, before a byte of it
is read, is a body whose declared ``Content-Length`` does not fit now: nothing
is reserved for it either way.

The policy is all here and knows no transport: a server calls ``hold()`` when
a request's head is in, ``charge(n)`` for every piece of body it keeps (after
Content-Encoding is undone: those are the bytes held) and ``release()`` when
the request ends. The client port's front does so for every request with a
body (``front.Connection._admit``, ``incoming.Incoming``); ``codec.read_body``
charges the hold of an aiohttp request that has one (``HOLD``).
"""

from __future__ import annotations

import weakref
from typing import Any

from aiohttp import web

from ring import limits
from ring.errors import Overloaded

# request[HOLD]: the BodyHold of an aiohttp request with a body, for codec.read_body.
HOLD: Any = web.RequestKey("body hold", object) if hasattr(web, "RequestKey") else "ring.body_hold"


class BodyBudget:
    def __init__(self, bytes_max: int | None = None) -> None:
        self._bytes_max = bytes_max
        self.used = 0
        self.refused = 0  # for tests and metrics: requests answered 429 here

    @property
    def bytes_max(self) -> int:
        # Read at each use, so the bound follows limits (tests lower it on a running app).
        return limits.REQUEST_BODY_BYTES_IN_FLIGHT_MAX if self._bytes_max is None else self._bytes_max

    def _refuse(self, what: str) -> Overloaded:
        self.refused += 1
        return Overloaded(f"{what} does not fit: this broker holds {self.used} bytes of request bodies "
                          f"(bound {self.bytes_max}); retry later", limit_bytes=self.bytes_max)

    def hold(self, declared: int | None = None) -> BodyHold:
        """A new request's hold; 429 now when its declared size cannot fit (nothing is reserved)."""
        if declared is not None and declared <= limits.REQUEST_BYTES_MAX and self.used + declared > self.bytes_max:
            raise self._refuse(f"a body of {declared} bytes")
        return BodyHold(self)


class BodyHold:
    """The body bytes one request holds; ``release`` is idempotent."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held = 0

    def charge(self, nbytes: int) -> None:
        budget = self.budget
        if budget.used + nbytes > budget.bytes_max:
            raise budget._refuse(f"{nbytes} more bytes of a body")
        budget.used += nbytes
        self.held += nbytes

    def release(self) -> None:
        self.budget.used -= self.held
        self.held = 0


_budgets: "weakref.WeakKeyDictionary[Any, BodyBudget]" = weakref.WeakKeyDictionary()


def body_budget_of(broker: Any) -> BodyBudget:
    """The one body budget of ``broker``, whichever server takes its requests."""
    budget = _budgets.get(broker)
    if budget is None:
        budget = _budgets[broker] = BodyBudget()
    return budget


def charge(request: Any, nbytes: int) -> None:
    """Charge ``nbytes`` of body to the request's hold, when it has one (routes outside the
    budget's middleware have none)."""
    hold = request.get(HOLD)
    if hold is not None:
        hold.charge(nbytes)
