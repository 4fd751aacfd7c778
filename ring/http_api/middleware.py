"""Errors as HTTP answers on the peer port (aiohttp), in the shape the client port uses.

The client port answers errors in its front (``web.ring_error``,
``web.http_error``); the peer API runs on aiohttp, where this middleware
gives the same JSON answers: every ``ring.errors.RingError`` raised below a
handler becomes ``{"error": CODE, "message": TEXT, ...extra}`` with the
error's status and, for 429/503, a ``Retry-After`` header; aiohttp's own
HTTP errors (no such route, wrong method) get the same shape, and so do the
errors aiohttp answers before any handler runs (``http_error_response``, used
by the connection handler in ``server.py``). Anything else is a bug: it is
logged with its traceback and answered 500 with no detail.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from ring.errors import RingError
from ring.http_api import web as native

log = logging.getLogger("ring.http")


def _aiohttp(answer: native.Response) -> web.Response:
    return web.Response(status=answer.status, body=answer.body, content_type="application/json",
                        headers=answer.headers)


def ring_error_response(exc: RingError) -> web.Response:
    return _aiohttp(native.ring_error(exc))


def http_error_response(status: int, message: str | None = None,
                        headers: dict[str, str] | None = None) -> web.Response:
    return _aiohttp(native.http_error(status, message, headers))


_KEPT_HEADERS = ("Allow",)


@web.middleware
async def errors_middleware(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except RingError as exc:
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc.message)
        return ring_error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        kept = {h: exc.headers[h] for h in _KEPT_HEADERS if h in exc.headers}
        message = exc.text if exc.text and exc.status == 413 else exc.reason
        return http_error_response(exc.status, message, headers=kept)
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return http_error_response(500, "internal error; the broker log has the details")
