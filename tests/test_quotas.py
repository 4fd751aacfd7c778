"""Per-token quotas and admission, as pure logic: ``ring.quotas.Throttle`` (token buckets that take
``now``), their tokens-file fields (``ring.auth``), and ``admission.Admission`` deciding on real
request values of a real client app (no broker: the time is the number given)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import auth, limits
from ring.errors import Overloaded, QuotaExceeded
from ring.http_api import web
from ring.http_api.admission import Admission
from ring.quotas import FETCH, PRODUCE, REQUESTS, Quota, Throttle


def test_a_quota_is_let_in_while_not_in_debt_and_told_how_long_the_debt_takes_to_pay() -> None:
    q = Quota(produce_bytes_per_s=1000)
    t = Throttle()
    assert t.admit(0.0, "alice", q, PRODUCE) == 0
    t.charge(0.0, "alice", q, PRODUCE, 3000)  # a full burst (1000) and 2000 of debt
    assert t.admit(0.5, "alice", q, PRODUCE) == pytest.approx(1.5)  # 500 paid back of 2000
    assert t.throttled == {("alice", PRODUCE): 1}
    assert t.admit(2.0, "alice", q, PRODUCE) == 0
    assert t.admit(2.0, "bob", q, PRODUCE) == 0  # names do not share buckets
    assert t.admit(2.0, "alice", q, FETCH) == 0  # nor kinds: no fetch quota here


def test_requests_per_second_are_taken_as_requests_are_let_in() -> None:
    q = Quota(requests_per_s=2)
    t = Throttle()
    assert [t.admit(0.0, "a", q, FETCH) for _ in range(2)] == [0, 0]  # the burst: one second's worth
    assert t.admit(0.0, "a", q, FETCH) == pytest.approx(0.5)
    assert t.throttled == {("a", REQUESTS): 1}
    assert t.admit(0.5, "a", q, FETCH) == 0


def test_a_wait_is_capped_and_the_rest_is_told_on_the_next_try() -> None:
    q = Quota(fetch_bytes_per_s=10)
    t = Throttle()
    t.charge(0.0, "a", q, FETCH, 10_000)
    assert t.admit(0.0, "a", q, FETCH) == limits.QUOTA_WAIT_S_MAX
    assert t.admit(limits.QUOTA_WAIT_S_MAX, "a", q, FETCH) == limits.QUOTA_WAIT_S_MAX  # still 969 s of debt
    assert t.admit(990.0, "a", q, FETCH) == pytest.approx(9.0)  # the burst (10) less 10,000, paid at 10 a second


@settings(max_examples=200, deadline=None)
@given(rate=st.integers(1, 10_000), sizes=st.lists(st.tuples(st.integers(0, 50_000), st.floats(0, 2)),
                                                   min_size=1, max_size=60))
def test_over_any_span_a_name_gets_its_rate_plus_a_burst_and_one_request(rate: int, sizes) -> None:
    """Bytes let in by time T never pass rate*T + the burst + the last request's (it went in on credit)."""
    q = Quota(produce_bytes_per_s=rate)
    t = Throttle()
    now, taken, biggest = 0.0, 0, 0
    for size, gap in sizes:
        now += gap
        if t.admit(now, "a", q, PRODUCE) == 0:
            t.charge(now, "a", q, PRODUCE, size)
            taken += size
            biggest = max(biggest, size)
            assert taken <= rate * (now + limits.QUOTA_BURST_S) + biggest
        else:
            assert t.admit(now, "a", q, PRODUCE) > 0  # refusing takes nothing: still refused


def test_quotas_in_a_tokens_file_line_and_what_is_refused() -> None:
    line = auth.file_line("t", "bulk", "produce", "logs-*", "produce_bytes_per_s=1048576", "requests_per_s=50")
    table = auth.TokenTable.parse(line + "\n" + auth.file_line("u", "ops", "admin", "*"))
    assert table.authenticate("t").quota == Quota(produce_bytes_per_s=1048576, requests_per_s=50)
    assert table.authenticate("u").quota is None
    assert auth.TokenTable.parse(line).authenticate("t").quota.fields() == ["produce_bytes_per_s=1048576",
                                                                          "requests_per_s=50"]
    digest_and_grant = line.split("produce_bytes_per_s")[0]
    for bad in ("produce_bytes_per_s=0", "produce_bytes_per_s=x", "speed=5", "requests_per_s=1 requests_per_s=2",
                f"fetch_bytes_per_s={limits.QUOTA_RATE_MAX}"):
        with pytest.raises(ValueError, match="tokens file:1"):
            auth.TokenTable.parse(digest_and_grant + bad)
    # A name's quotas are given once; its other lines may leave them out.
    two = line + "\n" + auth.file_line("t2", "bulk", "consume", "logs-*")
    assert auth.TokenTable.parse(two).authenticate("t2").quota == Quota(produce_bytes_per_s=1048576, requests_per_s=50)
    with pytest.raises(ValueError, match="other quotas"):
        auth.TokenTable.parse(two + " fetch_bytes_per_s=5")
    # A quota is never carried to another broker with a forwarded request.
    principal = table.authenticate("t")
    assert auth.Principal.from_header(principal.to_header()).quota is None


def _request(app: web.App, method: str, path: str, principal: auth.Principal | None = None) -> web.Request:
    req = web.Request(method, path, "", web.Headers(), app)
    req.route, req.match_info, _ = app.router.resolve(method, path)
    req.principal = principal
    return req


def _app() -> web.App:
    from ring.http_api.app import ROUTES

    app = web.App()
    for method, path, handler in ROUTES:
        app.router.add(method, path, handler)
    return app


def test_admission_refuses_data_plane_work_past_its_bounds_and_never_the_control_plane() -> None:
    app = _app()
    a = Admission()
    a.running_max = 2
    produce, fetch = ("POST", "/v1/topics/t/messages"), ("GET", "/v1/topics/t/partitions/0/messages")
    status = ("GET", "/v1/status")
    for _ in range(2):
        req = _request(app, *produce)
        a.check(req, 0.0)
        a.ran(req)
    with pytest.raises(Overloaded) as refused:
        a.check(_request(app, *fetch), 0.0)
    assert refused.value.status == 429 and refused.value.extra["reason"] == "requests_running"
    a.check(_request(app, *status), 0.0)  # operators still see the broker
    a.answered(req, web.Response(b"{}"), 0.0, running=True)
    a.check(_request(app, *fetch), 0.0)
    late_s = limits.LOOP_LAG_MS_MAX / 1000 * 2
    for _ in range(limits.LOOP_LAG_PROBES_LATE - 1):
        a.lagged(late_s)
        a.check(_request(app, *produce), 0.0)  # one heavy request's lateness is not overload
    a.lagged(late_s)
    with pytest.raises(Overloaded, match="probes .* late"):
        a.check(_request(app, *produce), 0.0)
    idle = Admission()  # the same lateness with nothing running: work already answered, no queue
    for _ in range(limits.LOOP_LAG_PROBES_LATE):
        idle.lagged(late_s)
    idle.check(_request(app, *produce), 0.0)
    a.check(_request(app, *status), 0.0)
    a.lagged(0.001)  # one probe on time ends it
    a.check(_request(app, *produce), 0.0)
    assert a.refused == {"loop_lag": 1, "requests_running": 1}
    assert a.snapshot()["requests_running"] == 1


def test_admission_holds_a_token_to_its_quota_and_not_another() -> None:
    app = _app()
    a = Admission()
    slow = auth.Principal("slow", quota=Quota(produce_bytes_per_s=100))
    other = auth.Principal("other")
    req = _request(app, "POST", "/v1/topics/t/messages", slow)
    a.check(req, 0.0)
    a.ran(req)
    req.body_size = 1000
    a.answered(req, web.Response(b"{}"), 0.0, running=True)
    with pytest.raises(QuotaExceeded) as refused:
        a.check(_request(app, "POST", "/v1/topics/t/messages", slow), 1.0)
    assert refused.value.retry_after_s == pytest.approx(8.0) and refused.value.extra["retry_after_ms"] == 8000
    assert web.ring_error(refused.value).headers["Retry-After"] == "8"
    a.check(_request(app, "POST", "/v1/topics/t/messages", other), 1.0)
    a.check(_request(app, "GET", "/v1/topics/t/partitions/0/messages", slow), 1.0)  # no fetch quota
    assert a.snapshot()["throttled"] == {"slow": {"produce": 1}}
    a.reloaded({"other"})
    a.check(_request(app, "POST", "/v1/topics/t/messages", slow), 1.0)  # a new bucket, if it came back
