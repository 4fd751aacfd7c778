"""``ring.group_requests``: a group poll and a commit are checked once, by the front that parsed them,
into a ``GroupPoll`` or a ``CommitOffsets``; bad input is the client port's 400 (or 404 for what the
coordinator does not have), and changes no group."""

from __future__ import annotations

from typing import Any

import pytest

from ring.errors import BadRequest, InvalidTopicName
from ring.group_requests import CommitOffsets, GroupPoll, checked_offsets, validate_name
from tests.support import Http

# --- the checks, as every front runs them -------------------------------------------------------


@pytest.mark.parametrize("name", ["g", "group-1", "a.b_c:d@e", "x" * 249, "..."])
def test_a_group_or_member_name_is_1_to_249_of_the_pattern(name: str) -> None:
    assert validate_name(name, "group") == name


@pytest.mark.parametrize("name", ["", "x" * 250, ".", "..", "a b", "a/b", "café", None, 7, ["g"]])
def test_any_other_name_is_a_400_naming_the_field(name: Any) -> None:
    with pytest.raises(BadRequest) as caught:
        validate_name(name, "consumer")
    assert caught.value.status == 400 and caught.value.extra["field"] == "consumer"
    assert "invalid consumer" in caught.value.message and "A-Z a-z 0-9" in caught.value.message


def test_offsets_are_kept_as_given_in_a_tuple() -> None:
    given = [("t", 0, 5), ("u.v", 3, 0)]
    assert checked_offsets(given, "offsets") == (("t", 0, 5), ("u.v", 3, 0))


def test_no_offsets_is_a_400_naming_what_was_empty() -> None:
    with pytest.raises(BadRequest) as caught:
        checked_offsets([], "positions")
    assert caught.value.status == 400 and "positions must list at least one" in caught.value.message


def test_an_offset_of_an_invalid_topic_name_is_a_400() -> None:
    with pytest.raises(InvalidTopicName):
        checked_offsets([("t", 0, 1), ("a b", 0, 1)], "offsets")


def test_the_values_are_tuples_with_the_defaults_a_plain_request_means() -> None:
    poll = GroupPoll("g", "c", None, 10)
    assert (poll.wait_ms, poll.auto_commit, poll.token, poll.leader, poll.batches) == (0, True, None, None, False)
    assert poll == ("g", "c", None, 10, 0, True, None, None, False)
    commit = CommitOffsets("g", "c", 2, None)
    assert commit.token is None and commit.offsets is None
    with pytest.raises(AttributeError):
        commit.group = "h"  # type: ignore[misc]


# --- the client port's fronts -------------------------------------------------------------------


def _error(r: Any, status: int, code: str, words: str) -> None:
    assert r.status == status, (r.status, r.body[:300])
    doc = r.json()
    assert doc["error"] == code and words in doc["message"], doc


def _groups(http: Http) -> list[str]:
    return sorted(g["group"] for g in http.get("/v1/groups").json()["groups"])


@pytest.mark.integration
@pytest.mark.parametrize("body, code, words", [
    ([1], "bad_request", '"consumer", "offsets"'),
    ({"consumer": "a b", "offsets": []}, "bad_request", "invalid consumer"),
    ({"consumer": "c", "generation": -1, "offsets": []}, "bad_request", "generation must be a non-negative"),
    ({"generation": 1}, "bad_request", "invalid consumer"),
    ({"consumer": "c", "offsets": {"topic": "t"}}, "bad_request", "offsets must be a list"),
    ({"consumer": "c", "offsets": [{"topic": "t", "partition": 0, "offset": -1}]}, "bad_request", "non-negative"),
    ({"consumer": "c", "offsets": [{"topic": "t", "partition": "0", "offset": 1}]}, "bad_request", "non-negative"),
    ({"consumer": "c", "offsets": []}, "bad_request", "offsets must list at least one"),
    ({"consumer": "c", "offsets": [{"topic": "a b", "partition": 0, "offset": 1}]}, "invalid_topic_name", "a b"),
    ({"offsets": [{"topic": "no-such-topic-here", "partition": 0, "offset": 1}]}, "unknown_topic",
     "no-such-topic-here"),
])
def test_a_bad_commit_is_a_4xx_and_changes_no_group(http: Http, body: Any, code: str, words: str) -> None:
    before = _groups(http)
    status = 404 if code == "unknown_topic" else 400
    _error(http.post("/v1/groups/bad-commits/offsets", json_body=body), status, code, words)
    assert _groups(http) == before


@pytest.mark.integration
def test_a_commit_of_a_partition_the_topic_lacks_is_a_404(http: Http, topic: str) -> None:
    assert http.create_topic(topic, partitions=2).status == 201
    r = http.post("/v1/groups/bad-partitions/offsets",
                  json_body={"offsets": [{"topic": topic, "partition": 2, "offset": 1}]})
    _error(r, 404, "unknown_partition", "partitions 0..1")


@pytest.mark.integration
@pytest.mark.parametrize("query, words", [
    ({"max_records": 0}, "max_records must be in"),
    ({"wait_ms": 10**9}, "wait_ms must be in"),
    ({"generation": -1}, "generation must be"),
    ({"auto_commit": "perhaps"}, "auto_commit must be true or false"),
    ({"leader": "a b"}, "invalid leader"),
])
def test_a_bad_poll_is_a_400_and_changes_no_group(http: Http, query: dict[str, Any], words: str) -> None:
    before = _groups(http)
    _error(http.post("/v1/groups/bad-polls/members/c/poll", query=query), 400, "bad_request", words)
    _error(http.post("/v1/groups/a%20b/members/c/poll"), 400, "bad_request", "invalid group")
    assert _groups(http) == before


@pytest.mark.integration
def test_a_seek_to_no_positions_a_bad_topic_or_a_negative_offset_is_a_400(http: Http) -> None:
    path = "/v1/groups/bad-seeks/members/c/positions"
    _error(http.request("PUT", path, json_body={"positions": []}), 400, "bad_request",
           "positions must list at least one")
    _error(http.request("PUT", path, json_body={"positions": [{"topic": "a b", "partition": 0, "offset": 0}]}),
           400, "invalid_topic_name", "a b")
    _error(http.request("PUT", path, json_body={"positions": [{"topic": "t", "partition": 0, "offset": -1}]}),
           400, "bad_request", "non-negative")
