"""A request's way through its route on the client port: what is checked before its body is read,
and the answer its handler's outcome makes.

``admit`` runs when a request's head is complete: it finds the route, checks
access (``access.Guard``), runs the route's ``prepare`` (its query and
headers) and bounds the body (declared size, the body budget), so a request
refused there costs no body bytes. A handler answers with a ``Response``, a
``Later`` (its future's outcome made into one: ``later_answer``) or a
coroutine (``awaited_answer``); a ``RingError`` becomes its JSON answer, and
anything else a logged 500. The connection (``front.Connection``) writes
whatever comes out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ring.errors import PayloadTooLarge, RingError
from ring.http_api import web
from ring.http_api.exchange import Exchange, HttpError
from ring.http_api.incoming import Incoming
from ring.http_api.web import Request, Response

log = logging.getLogger("ring.http")


def admit(app: Any, ex: Exchange, has_body: bool) -> None:
    """Route, access, the route's own checks and the body's bounds: before any of the body is read."""
    req = ex.req
    route, params, allowed = app.router.resolve(req.method, req.path)
    if route is None:
        if allowed:
            raise HttpError(405, "Method Not Allowed", {"Allow": ", ".join(allowed)})
        raise HttpError(404, "Not Found")
    req.route = route
    req.match_info = params
    if app.guard is not None:
        app.guard.check(req)
    if route.prepare is not None:
        route.prepare(req)
    if not has_body:
        return
    limit = route.body_max
    declared = req.content_length if limit is not None else None
    if limit is not None and declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes is over the limit of {limit}", limit_bytes=limit)
    if limit is None:
        return  # the route reads no body: it is dropped as it comes
    hold = app.body_budget.hold(declared)  # 429 now when the declared size cannot fit
    # A route's prepare may name a line bound for its body (NDJSON produce): refused as the bytes come.
    line_max = getattr(req.state, "line_bytes_max", None)
    ex.incoming = Incoming(limit, hold, req.headers.get("content-encoding"), line_max)


def error_answer(req: Request, exc: RingError) -> Response:
    if exc.status >= 500:
        log.warning("%s %s: %s", req.method, req.path, exc.message)
    return req.app.answer_error(exc)


def later_answer(req: Request, make: Any, fut: asyncio.Future) -> Response:
    """The answer a ``Later`` makes of its future once it is done."""
    try:
        return make(fut)
    except RingError as exc:
        return error_answer(req, exc)
    except asyncio.CancelledError:
        return web.http_error(503, "the request was cancelled (the broker is stopping)")
    except Exception:
        log.exception("unexpected error in %s %s", req.method, req.path)
        return web.http_error(500, "internal error; the broker log has the details")


async def awaited_answer(ex: Exchange, pending: Any) -> Response:
    """The answer a handler's coroutine gives; its cancellation (the broker stopping) is passed on."""
    try:
        return await pending
    except RingError as exc:
        return error_answer(ex.req, exc)
    except asyncio.CancelledError:
        if ex.cell is not None:
            ex.cell[0] = None
        raise
    except Exception:
        log.exception("unexpected error in %s %s", ex.req.method, ex.req.path)
        return web.http_error(500, "internal error; the broker log has the details")
