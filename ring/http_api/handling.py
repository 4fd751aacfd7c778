"""A request's way through its route on the client port: what is checked before its body is read,
and the answer its handler's outcome makes.

``admit`` runs when a request's head is complete: it finds the route, checks
access (``access.Guard``) and admission (``admission.Admission``: load and
quotas), runs the route's ``prepare`` (its query and headers) and bounds the
body (declared size, the body budget), so a request refused there costs no
body bytes. A handler answers with a ``Response``, a
``Later`` (its future's outcome made into one: ``later_answer``) or a
coroutine (``awaited_answer``); ``run`` calls the handler and hands whatever
comes out, when it comes, to the connection's ``answer`` (``front.Connection``
writes it). A ``RingError`` becomes its JSON answer, and anything else a
logged 500.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Callable

from ring import auth
from ring.errors import PayloadTooLarge, RingError
from ring.http_api import web
from ring.http_api.exchange import Exchange, HttpError
from ring.http_api.incoming import Incoming
from ring.http_api.web import Later, Request, Response

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
    app.admission.check(req, ex.started)  # 429 for new data-plane work while behind, or over a quota
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


def run(ex: Exchange, answer: Callable[[Exchange, Response], None], front: Any) -> None:
    """Call ``ex``'s handler, acting for its client; ``answer(ex, response)`` once there is one
    (now, from a future's callback, or from a task of ``front``'s, the one case that costs one)."""
    req = ex.req
    reset = None
    if req.principal is not None:
        ex.cell = [req.principal]
        reset = auth.CURRENT.set(ex.cell)  # tasks this request starts act for its client
    front.app.admission.ran(req)
    try:
        result = req.route.handler(req)  # type: ignore[union-attr]
        if type(result) is Response:
            answer(ex, result)
        elif type(result) is Later:
            fut = result.future
            if fut.done():
                answer(ex, later_answer(req, result.make, fut))
            else:
                fut.add_done_callback(partial(_later, ex, answer, result.make))
        else:
            task = front.loop.create_task(_awaited(ex, answer, result))
            front.tasks.add(task)
            task.add_done_callback(front.tasks.discard)
    except RingError as exc:
        answer(ex, error_answer(req, exc))
    except Exception:
        log.exception("unexpected error in %s %s", req.method, req.path)
        answer(ex, web.http_error(500, "internal error; the broker log has the details"))
    finally:
        if reset is not None:
            auth.CURRENT.reset(reset)


def _later(ex: Exchange, answer: Callable[[Exchange, Response], None], make: Any, fut: asyncio.Future) -> None:
    answer(ex, later_answer(ex.req, make, fut))


async def _awaited(ex: Exchange, answer: Callable[[Exchange, Response], None], pending: Any) -> None:
    answer(ex, await awaited_answer(ex, pending))


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
