"""The one place where errors become HTTP answers.

Every ``ring.errors.RingError`` raised below a handler becomes
``{"error": CODE, "message": TEXT, ...extra}`` with the error's status and,
for 429/503, a ``Retry-After`` header. aiohttp's own HTTP errors (no such
route, wrong method, body over ``client_max_size``) get the same JSON shape,
and so do the errors aiohttp answers before any handler runs (a malformed
request line, an over-long header): ``error_response`` is used for those by
the connection handler in ``server.py``. Anything else is a bug: it is logged
with its traceback and answered 500 with no detail. Bad input never gets here
as a bare exception: the codecs raise ``RingError``s for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from http import HTTPStatus
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from ring.errors import RingError

log = logging.getLogger("ring.http")

# Codes for statuses aiohttp raises itself, in the vocabulary of ring.errors.
_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    431: "request_header_fields_too_large",
    500: "internal",
}


def error_response(status: int, body: dict[str, Any], retry_after_s: float | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    resp = web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                        headers=headers)
    if retry_after_s is not None:
        resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return resp


def ring_error_response(exc: RingError) -> web.Response:
    # An error class may name headers of its own (a 401's WWW-Authenticate).
    return error_response(exc.status, exc.to_json(), exc.retry_after_s, getattr(exc, "headers", None))


def http_error_response(status: int, message: str | None = None,
                        headers: dict[str, str] | None = None) -> web.Response:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "error"
    code = _HTTP_CODES.get(status, phrase.lower().replace(" ", "_").replace("-", "_"))
    return error_response(status, {"error": code, "message": message or phrase}, headers=headers)


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
