"""Fetch answers leave the broker with bounded memory: bodies that are dropped once sent, and holds given back.

Why answers are counted, and how (``grant``, ``hold``, a 429 with
``Retry-After`` when nothing is left), is ``ring.answer_budget``'s to say: its
``AnswerBudget`` is one per broker (``budget_of``). Here ``response`` makes the answer (``web.Response``)
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
