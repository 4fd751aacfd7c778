"""How a refusal or a data loss reaches a Spark user: as one line.

Spark runs a Python data source's methods in its own worker processes and
wraps whatever they raise in its own exception, with the Python traceback
as text. For ring's own errors (a bad option, data gone, no broker) the
frames inside sparkio say nothing to the user and bury the line that does,
so every method Spark calls goes through ``plain_errors`` (and every
iterator it reads through ``plain_iter``), which re-raises a ``RingError``
without its traceback and without a chained cause: what Spark shows is its
own header and ``ring.errors.BadRequest: option startingOffsets: ...``.
Anything else (a bug) keeps its full traceback.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, TypeVar

from ring.errors import RingError

F = TypeVar("F", bound=Callable[..., Any])


def plain_errors(fn: F) -> F:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RingError as exc:
            raise exc.with_traceback(None) from None

    return call  # type: ignore[return-value]


def plain_iter(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, with a ``RingError`` raised while iterating shown as one line."""
    try:
        yield from items
    except RingError as exc:
        raise exc.with_traceback(None) from None
