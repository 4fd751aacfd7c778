"""``ring.offsets``: the time an offset lookup asks for is parsed once, by the front, into ``OffsetsAt.at``."""

from __future__ import annotations

import pytest

from ring.errors import BadRequest
from ring.offsets import EARLIEST, LATEST, parse_at


@pytest.mark.parametrize("text, at", [("earliest", EARLIEST), ("latest", LATEST), ("0", 0),
                                      ("1700000000000", 1700000000000), ("-5", -5), ("007", 7)])
def test_a_timestamp_parameter_is_a_decimal_integer_or_earliest_or_latest(text: str, at: object) -> None:
    assert parse_at(text) == at


@pytest.mark.parametrize("text", [None, "", "-", "abc", "Latest", "1e3", "+5", " 5", "5 ", "1_000", "١٢", "0x10"])
def test_anything_else_is_a_400_naming_what_is_taken(text: str | None) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_at(text)
    assert caught.value.status == 400 and "earliest or latest" in caught.value.message
