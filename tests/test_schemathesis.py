"""The broker's own OpenAPI document, checked against a real broker process by schemathesis.

Schemathesis reads ``GET /v1/openapi.json`` from a running ``ring serve`` and
generates requests for every operation, both ones the document allows
(positive) and ones it forbids (negative). Each answer must not be a 5xx and
must match the document: a documented status code, a documented content type,
a JSON body that validates against the response schema, documented headers.

Half the requests name a topic (group, consumer, broker) that exists, the
topic holding records, so the success paths are exercised and not only 404s.
Generation is derandomized (the same cases every run), each operation gets a
fixed number of examples, and a time budget is shared out over the
operations: each gets a slice (what earlier ones left unused flows on) and at
least one request. Generated values that would
only make the run slow, not more thorough, are clamped: long-poll waits,
partitions of new topics.

Failures are collected over all operations and reported together, one per
(operation, check), with the request that caused them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.brokers import TestBroker

EXAMPLES_PER_OPERATION_AND_MODE = 12
BUDGET_S = 30.0
REQUEST_TIMEOUT_S = 10.0
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
TOPIC = "schemathesis-t"
# The one topic the run must not delete: its records give fetches something to return.
KEEP = {TOPIC}
# Path parameters that name things that exist, used for half the requests.
EXISTING = {"topic": TOPIC, "partition": 0, "group": "schemathesis-g", "consumer": "c-1", "broker": "ring-0"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    """A private broker (the run creates topics the session broker's users should not see)."""
    b = TestBroker(tmp_path_factory.mktemp("schemathesis"), args=["--fsync", "never"]).start()
    try:
        http = b.http
        assert http.create_topic(TOPIC, partitions=2, replication_factor=1).status == 201
        for part in (0, 1):
            r = http.produce(TOPIC, b'[{"a": 1}, {"b": [2]}, "three"]', partition=part)
            assert r.status == 200, r.body
            r = http.produce(TOPIC, b"\xff\xfe raw bytes", "text/plain", partition=part, key="k\u00e9")
            assert r.status == 200, r.body
        yield b
    finally:
        b.stop()


def _clamp(case: Any) -> Any:
    """Keep generated values from making the run slow: no long-polls, no thousand-partition topics,
    and never delete the topic the other operations read."""
    q = case.query
    if isinstance(q, dict) and isinstance(q.get("wait_ms"), int) and q["wait_ms"] > 20:
        q["wait_ms"] = 20
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("partitions"), int) and body["partitions"] > 4:
        body["partitions"] = 4
    if case.method.upper() == "DELETE" and isinstance(case.path_parameters, dict):
        if case.path_parameters.get("topic") in KEEP:
            case.path_parameters["topic"] = "no-such-topic"
    return case


def _strategy(operation: Any, mode: GenerationMode) -> st.SearchStrategy[Any]:
    fixed = {name: value for name, value in EXISTING.items() if "{" + name + "}" in operation.path}
    plain = operation.as_strategy(generation_mode=mode)
    if not fixed:
        return plain.map(_clamp)
    known = operation.as_strategy(generation_mode=mode, path_parameters=fixed)
    return st.one_of(plain, known).map(_clamp)


class _OutOfTime(BaseException):
    """Ends a run early; not an Exception, so hypothesis passes it on instead of shrinking it."""


def _run_operation(operation: Any, mode: GenerationMode, base_url: str, deadline: float,
                   record: Callable[[str, str], None]) -> int:
    """Send up to the fixed number of examples (at least one, none after ``deadline``); how many were sent."""
    sent = 0

    @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large])
    @given(_strategy(operation, mode))
    def run(case: Any) -> None:
        nonlocal sent
        if sent and time.monotonic() > deadline:
            raise _OutOfTime  # stops generating too, which costs more than sending
        sent += 1
        try:
            case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)
        except FailureGroup as group:
            for failure in group.exceptions:
                record(f"{operation.label} ({mode.value}): {failure.title}", f"{failure}\n{case.as_curl_command()}")

    try:
        run()
    except _OutOfTime:
        pass
    except Unsatisfiable:
        if mode == GenerationMode.POSITIVE:
            raise
        return -1  # nothing of this operation can be made invalid (no parameters, no body)
    return sent


def _operations(api: TestBroker) -> list[Any]:
    schema = schemathesis.openapi.from_url(api.url + "/v1/openapi.json", timeout=REQUEST_TIMEOUT_S)
    operations = [r.ok() for r in schema.get_all_operations()]
    # DELETE last: the other operations read the topic it might remove.
    return sorted(operations, key=lambda op: op.method.upper() == "DELETE")


def _check(api: TestBroker, operations: list[Any], budget_s: float) -> dict[str, str]:
    """Failures by (operation, mode, check); every operation gets its share of the budget."""
    failures: dict[str, str] = {}
    runs = [(op, mode) for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    end = time.monotonic() + budget_s
    for i, (op, mode) in enumerate(runs):
        now = time.monotonic()
        deadline = now + max(0.0, end - now) / (len(runs) - i)
        _run_operation(op, mode, api.url, deadline, failures.setdefault)
    assert "Traceback" not in api.log_text(), api.log_text()[-3000:]
    return failures


def _report(failures: dict[str, str]) -> str:
    return "\n\n".join(f"{k}\n{v}" for k, v in sorted(failures.items()))


def test_the_broker_answers_as_its_openapi_document_says(api: TestBroker) -> None:
    operations = _operations(api)
    labels = {op.label for op in operations}
    assert len(labels) >= 10, labels
    failures = _check(api, operations, BUDGET_S)
    assert not failures, _report(failures)
