"""How many request-body bytes one broker receives at once, as a middleware.

Each route bounds its own body (``codec.read_body``), but many slow uploads
at once would still add up: ``CLIENT_CONNECTIONS_OPEN_MAX`` connections each
sending a maximal produce body is tens of GiB. A request with a body reserves
its declared ``Content-Length`` (a chunked body, whose size is unknown,
reserves ``REQUEST_BYTES_MAX``; a declared size over that is refused by the
route anyway, so it reserves no more) before its handler runs, and gives it
back when the handler ends. When the reservation does not fit under
``REQUEST_BODY_BYTES_IN_FLIGHT_MAX``, the answer is 429 with ``Retry-After``
and the body is never read: the client retries later, the broker's memory
stays bounded.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

from ring import limits
from ring.errors import Overloaded


class BodyBudget:
    def __init__(self, bytes_max: int | None = None) -> None:
        self.bytes_max = limits.REQUEST_BODY_BYTES_IN_FLIGHT_MAX if bytes_max is None else bytes_max
        self.used = 0
        self.refused = 0  # for tests and metrics: requests answered 429 here

    @staticmethod
    def reservation(request: web.BaseRequest) -> int:
        if not request.body_exists:
            return 0
        declared = request.content_length
        if declared is None:
            return limits.REQUEST_BYTES_MAX
        return min(declared, limits.REQUEST_BYTES_MAX)

    def middleware(self) -> Callable:
        @web.middleware
        async def body_budget_middleware(request: web.Request,
                                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                                         ) -> web.StreamResponse:
            size = self.reservation(request)
            if size == 0:
                return await handler(request)
            if self.used + size > self.bytes_max:
                self.refused += 1
                raise Overloaded(f"this broker is receiving {self.used} bytes of request bodies already "
                                 f"(bound {self.bytes_max}); retry later", limit_bytes=self.bytes_max)
            self.used += size
            try:
                return await handler(request)
            finally:
                self.used -= size

        return body_budget_middleware
