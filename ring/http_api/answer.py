"""Fetch answers leave the broker with bounded memory: bodies that are dropped once sent, and holds given back.

An answer must not outlive its sending (an idle keep-alive connection must
not pin its last fetch answer, megabytes, until its next request), and the
answers being sent at once must be counted: a client that asks for
``FETCH_BYTES_MAX`` and reads slowly, or never, holds its answer until
``RESPONSE_SEND_TIMEOUT_S``, and ``CLIENT_CONNECTIONS_OPEN_MAX`` such clients
would hold tens of GiB.

``ring.answer_budget.AnswerBudget`` (one per broker, ``budget_of``) counts the bytes of answers
the broker holds, from the read (its disk, or a replica it proxies) until the
last byte is handed to the socket, up to ``FETCH_ANSWER_BYTES_IN_FLIGHT_MAX``.
A fetch asks the log for no more than what is left (``grant``), holds what it
read (``hold``) and is answered 429 with ``Retry-After`` when nothing is left
or its answer no longer fits. ``response`` makes the answer (``web.Response``)
that the front writes in ``ANSWER_WRITE_CHUNK_BYTES`` pieces (copies: the
transport never queues, nor pins through a slice, a whole answer); its bytes
are dropped and its hold given back as soon as the last piece is handed to
the socket, or when the connection is lost first.
"""

from __future__ import annotations

from ring.answer_budget import Hold
from ring.http_api.web import Response


def response(body: bytes, content_type: str, headers: dict[str, str], hold: Hold | None = None,
             status: int = 200) -> Response:
    """An answer whose body is not kept once sent (nor, with ``hold``, counted any longer)."""
    return Response(body, status, content_type, headers or None, hold)


def body_bytes(resp: Response) -> bytes:
    """The body of an answer not sent yet."""
    return bytes(resp.body)
