"""The admin page in a real headless Chromium against real brokers.

One broker: the page shows it, creates, describes and deletes topics, shows
the API's error when a call fails, sends the client token it keeps, redraws
by itself, and computes partition tokens exactly as the brokers do. Three
brokers: every page shows all three, a topic created on one broker's page
appears on another's, and a killed broker turns to down; a broker whose
clock is out of bounds (run under libfaketime) is named as such.

Needs Debian's ``chromium`` (``make test`` installs it; without it the tests
skip, and fail under CI=true) and the ``playwright`` Python package of the
dev extra, never its browser download. With
``RING_ADMIN_SCREENSHOT_DIR`` set, the cluster test saves screenshots there
(docs/admin-page.png comes from ``RING_ADMIN_SCREENSHOT_DIR=docs``).
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from playwright import sync_api  # the dev extra; the browser is Debian's chromium, not playwright's download

from ring import limits
from ring.hashing import partition_token
from ring.localcluster import LocalCluster
from tests.brokers import Http, TestBroker, TestCluster
from tests.support import require, wait_for

expect = sync_api.expect

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("RING_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT_DIR = os.environ.get("RING_ADMIN_SCREENSHOT_DIR")
WAIT_MS = 15_000
# A broker samples the charts' numbers every TRENDS_INTERVAL_MS and the page redraws every 2 s.
CHART_WAIT_MS = 3 * limits.TRENDS_INTERVAL_MS + 5_000
DOWN_WAIT_MS = 30_000  # phi crosses the threshold ~6 s after the last heartbeat; a busy machine is slower


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(None if Path(CHROMIUM).exists() else f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Page:
    """A browser tab on one broker's admin page, recording page errors and API answers."""

    def __init__(self, browser: Any, url: str, token: str | None = None) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        if token is not None:  # kept as the page keeps the one typed in, before its first call
            self.context.add_init_script(f"localStorage.setItem('ring.admin.token', {token!r})")
        self.page = self.context.new_page()
        self.page.set_default_timeout(WAIT_MS)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.response = self.page.goto(url)
        self.page.wait_for_selector("body[data-refreshes]")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.page, name)

    def confirm(self) -> None:
        self.page.locator("#confirm-ok").click()

    def broker_row(self, name: str) -> Any:
        return self.page.locator(f'#brokers tr[data-broker="{name}"]')

    def topic_row(self, name: str) -> Any:
        return self.page.locator(f'#topics tr.topic-row[data-topic="{name}"]')

    def create_topic(self, name: str, partitions: int, replication: int = 3) -> None:
        form = self.page.locator("#create-topic")
        form.locator('input[name="name"]').fill(name)
        form.locator('input[name="partitions"]').fill(str(partitions))
        form.locator('input[name="replication_factor"]').fill(str(replication))
        form.locator('button[type="submit"]').click()
        expect(self.page.locator("#confirm")).to_be_visible()
        self.confirm()

    def message(self, kind: str) -> Any:
        return self.page.locator(f"#messages .message.{kind}")

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    b = TestBroker(tmp_path_factory.mktemp("admin-one"), args=["--fsync", "interval:100"])
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def page(browser: Any, one: TestBroker) -> Iterator[Page]:
    p = Page(browser, one.url + "/")
    yield p
    p.close()
    assert not p.errors, p.errors


def _name() -> str:
    return "adm-" + uuid.uuid4().hex[:10]


# --- one broker ------------------------------------------------------------------------------


def test_the_page_shows_this_broker_and_no_groups(page: Page, one: TestBroker) -> None:
    assert page.response.status == 200
    csp = page.response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp
    row = page.broker_row("ring-0")
    expect(row).to_have_count(1)
    expect(row.locator(".broker-status")).to_have_text("up")
    expect(page.locator('#ring g.broker[data-broker="ring-0"]')).to_have_attribute("data-status", "up")
    expect(page.locator("#self-name")).to_contain_text("ring-0")
    expect(page.locator("#groups")).to_have_text("no consumer groups")


def test_topic_created_described_and_deleted_through_the_page(page: Page, one: TestBroker) -> None:
    name = _name()
    page.create_topic(name, partitions=4, replication=1)
    expect(page.topic_row(name)).to_have_count(1)
    doc = one.http.get(f"/v1/topics/{name}").json()
    assert len(doc["partitions"]) == 4 and doc["replication_factor"] == 1

    one.http.produce(name, b'[{"value": 1}, {"value": 2}, {"value": 3}]', partition=2)
    page.topic_row(name).locator("button.link").click()
    parts = page.locator(f'tr[data-partitions-of="{name}"] table.partitions tbody tr')
    expect(parts).to_have_count(4)
    expect(parts.nth(2).locator("td").nth(6)).to_have_text("3")  # high watermark, without a reload
    expect(page.topic_row(name).locator("td").nth(6)).to_have_text("3")  # records
    # The ring draws the opened topic's partitions, coloured by their leader.
    expect(page.locator("#ring circle.partition")).to_have_count(4)
    expect(page.locator('#ring circle.partition[data-leader="ring-0"]')).to_have_count(4)

    # The same name again: the API's 409 and its message, shown as they are.
    page.create_topic(name, partitions=4, replication=1)
    expect(page.message("error")).to_contain_text("409")
    answer = one.http.create_topic(name, partitions=4, replication_factor=1).json()
    expect(page.message("error")).to_contain_text(answer["message"])

    # Cancel keeps it (no DELETE is sent); confirm deletes it everywhere.
    deletes: list[Any] = []
    page.on("request", lambda r: deletes.append(r) if r.method == "DELETE" else None)
    page.topic_row(name).locator("button.danger").click()
    page.locator("#confirm-cancel").click()
    expect(page.locator("#confirm")).not_to_be_visible()
    assert deletes == [] and one.http.get(f"/v1/topics/{name}").status == 200
    page.topic_row(name).locator("button.danger").click()
    page.confirm()
    expect(page.topic_row(name)).to_have_count(0)
    assert one.http.get(f"/v1/topics/{name}").status == 404


def test_changing_settings_through_the_page(page: Page, one: TestBroker) -> None:
    name = _name()
    assert one.http.create_topic(name, partitions=2, replication_factor=1).status == 201
    expect(page.topic_row(name)).to_have_count(1)
    page.topic_row(name).get_by_role("button", name="settings").click()
    page.locator('#settings-form input[name="retention_ms"]').fill("3600000")
    page.locator('#settings-form input[name="partitions"]').fill("3")
    page.locator("#settings-ok").click()
    expect(page.locator("#confirm-detail")).to_contain_text("retention_ms")
    expect(page.locator("#confirm-detail")).to_contain_text("partitions 2 → 3")
    page.confirm()
    expect(page.message("ok")).to_contain_text(f"settings of {name} changed")
    doc = one.http.get(f"/v1/topics/{name}").json()
    assert (doc["retention_ms"], doc["partition_count"], doc["base_partitions"]) == (3_600_000, 3, 2)
    # A change the API refuses (fewer partitions) shows the API's own error.
    refused = one.http.request("PATCH", f"/v1/topics/{name}", json_body={"partitions": 1})
    assert refused.status == 400
    page.topic_row(name).get_by_role("button", name="settings").click()
    page.locator('#settings-form input[name="partitions"]').fill("1")
    page.locator("#settings-ok").click()
    page.confirm()
    body = refused.json()
    expect(page.message("error")).to_contain_text(f"400 {body['error']}: {body['message']}")
    assert one.http.get(f"/v1/topics/{name}").json()["partition_count"] == 3


def test_decommission_asks_then_shows_the_answer(browser: Any, make_broker: Any) -> None:
    b = make_broker()
    page = Page(browser, b.url + "/")
    try:
        answers: list[Any] = []
        page.on("response", lambda r: answers.append(r) if r.request.method == "POST" else None)
        page.broker_row("ring-0").locator("button.danger").click()
        expect(page.locator("#confirm-title")).to_contain_text("Decommission ring-0")
        page.confirm()
        expect(page.locator("#messages .message")).to_have_count(1)
        [answer] = answers
        assert answer.url.endswith("/v1/cluster/brokers/ring-0/decommission")
        if answer.status >= 400:
            expect(page.message("error")).to_contain_text(f"{answer.status} {answer.json()['error']}")
        assert not page.errors, page.errors
    finally:
        page.close()


def test_the_token_is_kept_and_sent_as_a_bearer(page: Page, one: TestBroker) -> None:
    page.locator("#token").fill("tok-123")
    with page.expect_request(lambda r: r.url.endswith("/v1/status")) as req:
        page.locator("#token-form button").click()
    assert req.value.headers.get("authorization") == "Bearer tok-123"
    with page.expect_request(lambda r: r.url.endswith("/v1/topics")) as req:
        page.reload()
    assert req.value.headers.get("authorization") == "Bearer tok-123"
    expect(page.locator("#token")).to_have_value("tok-123")
    page.locator("#token").fill("")
    with page.expect_request(lambda r: r.url.endswith("/v1/status")) as req:
        page.locator("#token-form button").click()
    assert "authorization" not in req.value.headers


def test_partition_tokens_are_the_brokers(page: Page) -> None:
    names = ["a", "clicks", "0123456789abcde", "0123456789abcdef", "0123456789abcdef0", "x" * 33, "é-ü", "t" * 249]
    for name in names:
        for partitions, partition, base in ((1, 0, 1), (8, 3, 8), (7, 6, 7), (1024, 1023, 1024),
                                            (5, 4, 3), (8, 7, 1), (1024, 1000, 7), (13, 12, 3)):
            got = page.evaluate("([t, p, n, b]) => window.ringAdmin.partitionToken(t, p, n, b).toString()",
                                [name, partition, partitions, base])
            want = partition_token(name, partition, partitions, base)
            assert int(got) == want, (name, partition, partitions, base)


def test_the_page_opens_on_the_users_topics_and_charts_their_traffic_and_lag(browser: Any, one: TestBroker) -> None:
    """After a topic is created, produced to and read by a group, the page lists the user's topics first and the
    internal __offsets last, marked; the ring shows a user's topic; and the charts show the records that went in
    and out of the topic and the group's lag, from the broker's samples (a new one every TRENDS_INTERVAL_MS)."""
    name, group = _name(), "g-" + uuid.uuid4().hex[:8]
    http = one.http
    assert http.create_topic(name, partitions=1, replication_factor=1).status == 201
    values = [{"n": n} for n in range(50)]
    assert http.produce(name, values).status == 200
    joined = http.post(f"/v1/groups/{group}/members", json_body={"consumer": "c1", "topics": [name]})
    assert joined.status == 200, joined.body
    first = http.post(f"/v1/groups/{group}/members/c1/poll", query={"max_records": 20})
    second = http.post(f"/v1/groups/{group}/members/c1/poll", query={"max_records": 10, "token": first.json()["token"]})
    polled = [first, second]
    assert [len(r.json()["records"]) for r in polled] == [20, 10]  # the second poll committed the first's 20

    page = Page(browser, one.url + "/")
    try:
        rows = page.locator("#topics tr.topic-row")
        expect(rows.last).to_have_attribute("data-topic", "__offsets")
        expect(rows.last.locator(".internal-tag")).to_have_text("internal")
        topics = [rows.nth(i).get_attribute("data-topic") for i in range(rows.count())]
        assert topics.index("__offsets") == len(topics) - 1 and name in topics
        assert page.locator("#ring-topic").input_value() not in ("", "__offsets")
        expect(page.topic_row("__offsets").get_by_role("button", name="delete")).to_be_disabled()

        chart = page.locator(f'.topic-chart[data-topic="{name}"]')
        expect(chart).to_have_attribute("data-in-records", "50", timeout=CHART_WAIT_MS)
        expect(chart).to_have_attribute("data-out-records", "30", timeout=CHART_WAIT_MS)
        expect(chart.locator(".series-in")).not_to_have_count(0)  # a line, or a dot for a first sample
        expect(chart.locator(".series-out")).not_to_have_count(0)
        assert "peak" in chart.locator(".chart-foot").inner_text()
        expect(page.locator('.topic-chart[data-topic="__offsets"]')).to_have_count(0)
        lag = page.locator(f'.group-chart[data-group="{group}"]')
        expect(lag).to_have_attribute("data-lag", "30", timeout=CHART_WAIT_MS)  # 50 in, 20 committed
        expect(lag.locator(".series-lag")).not_to_have_count(0)
        trends = http.get("/admin/trends").json()
        assert sum(s["topics"].get(name, [0, 0])[0] for s in trends["samples"]) == 50
        assert not page.errors, page.errors
    finally:
        page.close()


def test_admin_files_and_nothing_else(one: TestBroker) -> None:
    from ring.http_api import admin

    files = {"/": "text/html", **{f"/admin/{name}": ctype.split(";")[0] for name, ctype in admin.FILES.items()}}
    for path, ctype in files.items():
        r = one.http.get(path)
        assert r.status == 200 and r.content_type == ctype, path
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    for module in (admin.STATIC_DIR).glob("*.js"):  # every module the page imports is served
        assert module.name in admin.FILES
    for path in ("/admin/..%2Fadmin.py", "/admin/index.htm", "/admin/static", "/admin/%2e%2e"):
        r = one.http.get(path)
        assert r.status == 404 and r.json()["error"] == "not_found", path


# --- three brokers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = TestCluster(tmp_path_factory.mktemp("admin-three"), 3, args=["--fsync", "interval:100"])
    cluster.start()  # returns once every broker sees every other one up
    try:
        yield cluster.local
    finally:
        cluster.kill()


def _screenshot(page: Page, name: str) -> None:
    if SCREENSHOT_DIR:
        Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(600)
        page.screenshot(path=str(Path(SCREENSHOT_DIR) / name), full_page=True)


def test_three_brokers_a_topic_made_on_one_page_shows_on_another_and_a_killed_broker_turns_down(
        browser: Any, three: LocalCluster) -> None:
    b0, b1, b2 = three.brokers
    first = Page(browser, b0.url + "/")
    second = Page(browser, b1.url + "/")
    try:
        for p in (first, second):
            for i in range(3):
                expect(p.broker_row(f"ring-{i}").locator(".broker-status")).to_have_text("up")
            expect(p.locator("#ring g.broker")).to_have_count(3)

        name = "clicks-" + uuid.uuid4().hex[:6]
        first.create_topic(name, partitions=12, replication=3)
        expect(first.topic_row(name)).to_have_count(1)
        expect(second.topic_row(name)).to_have_count(1, timeout=WAIT_MS)  # gossip carried it to ring-1

        http = Http(b2.host, b2.port)
        for k in range(60):
            assert http.produce(name, b'{"value": {"page": "/home"}}', key=f"user-{k}").status == 200
        second.topic_row(name).locator("button.link").click()
        rows = second.locator(f'tr[data-partitions-of="{name}"] table.partitions tbody tr')
        expect(rows).to_have_count(12)
        expect(second.topic_row(name).locator("td").nth(6)).to_have_text("60")
        # Leaders elsewhere are asked for their replicas' lag: every lag is known once caught up.
        expect(second.locator(f'tr[data-partitions-of="{name}"] .lag', has_text="?")).to_have_count(0)
        leaders = {second.locator("#ring circle.partition").nth(i).get_attribute("data-leader") for i in range(12)}
        assert leaders == {"ring-0", "ring-1", "ring-2"}
        for i in range(3):  # gossiped load: each broker leads a third and follows the rest
            cells = second.broker_row(f"ring-{i}").locator("td")
            expect(cells.nth(9)).to_have_text("4")
            expect(cells.nth(10)).to_have_text("8")
            expect(second.broker_row(f"ring-{i}").locator(".broker-clock")).to_have_text("ok")
            # Its failure domain: the host it gossips (the machine's name here), no zone.
            expect(second.broker_row(f"ring-{i}").locator(".broker-host")).to_have_text(socket.gethostname())
        # The charts add up every broker's samples: the 60 records went in through ring-2, not this page's broker.
        expect(second.locator(f'.topic-chart[data-topic="{name}"]')).to_have_attribute(
            "data-in-records", "60", timeout=CHART_WAIT_MS)
        _screenshot(second, "admin-page.png")

        b2.kill()
        for p in (first, second):
            expect(p.broker_row("ring-2").locator(".broker-status")).to_have_text("down", timeout=DOWN_WAIT_MS)
            expect(p.locator('#ring g.broker[data-broker="ring-2"]')).to_have_attribute("data-status", "down")
            expect(p.broker_row("ring-0").locator(".broker-status")).to_have_text("up")
        # Failover: ring-2's partitions get new leaders; all 12 keep running on two of three replicas.
        expect(second.topic_row(name).locator("td").nth(7)).to_have_text("12 under-replicated", timeout=WAIT_MS)
        _screenshot(second, "admin-page-broker-down.png")
        assert not first.errors and not second.errors, first.errors + second.errors
    finally:
        first.close()
        second.close()


def test_a_broker_whose_clock_is_out_of_bounds_is_named_on_the_page(browser: Any, make_cluster: Any) -> None:
    from tests.brokers import faketime, libfaketime

    require(None if libfaketime() else "the faketime package is not installed (apt-get install faketime)")
    c = make_cluster(3, "--fsync", "interval:100", prefixes={2: faketime("+1d")})
    p = Page(browser, c[0].url + "/")
    try:
        expect(p.broker_row("ring-2").locator(".broker-clock")).to_have_text("out of bounds 1.0 d ahead")
        for i in (0, 1):
            expect(p.broker_row(f"ring-{i}").locator(".broker-clock")).to_have_text("ok")
        expect(p.locator("#summary .clock-alert")).to_have_text("ring-2 clock out of bounds 1.0 d ahead")
        assert not p.errors, p.errors
    finally:
        p.close()


def test_where_a_partitions_ranges_live_and_each_brokers_disk(browser: Any, make_cluster: Any) -> None:
    c = make_cluster(4, "--fsync", "interval:100", "--range-interval-s", "0.2")
    name = "ranged-" + uuid.uuid4().hex[:6]
    assert c[0].http.create_topic(name, partitions=1, replication_factor=3, segment_bytes=4096,
                                  local_retention_bytes=0).status == 201
    for _ in range(20):  # about 60 KiB: fifteen segments
        assert c[0].http.produce(name, b"[" + b",".join([b'"' + b"y" * 300 + b'"'] * 10) + b"]",
                                 partition=0).status == 200
    # Done: every closed segment is a range on three holders, the replicas keep only the active one
    # (13 records of 300 bytes fill a segment: it starts past 180).
    doc = wait_for("ranges on three holders each, the replicas trimmed", lambda: (lambda d: d if d["ranges"] and
                   d["ranges"][-1]["end_offset"] == d["local_start_offset"] > 180 and
                   all(len(x["holders"]) == 3 for x in d["ranges"]) else None)(
        c[0].http.get(f"/v1/topics/{name}/partitions/0/ranges").json()), timeout_s=60)
    counts: dict[str, int] = {}
    for x in doc["ranges"]:
        for h in x["holders"]:
            counts[h] = counts.get(h, 0) + 1
    p = Page(browser, c[1].url + "/")
    try:
        p.topic_row(name).locator("button.link").click()
        row = p.locator(f'tr[data-partitions-of="{name}"] table.partitions tbody tr')
        expect(row).to_have_count(1)
        cell = row.locator("td").nth(9)
        expect(cell).to_contain_text(f"{len(doc['ranges'])} (")
        for h, n in counts.items():
            expect(cell.locator(f'[data-holder="{h}"]')).to_contain_text(f"×{n}")
        for m in c:  # every broker holds ranges, shown beside its own logs and its free disk
            expect(p.broker_row(m.name).locator("td").nth(7)).not_to_have_text("0 B", timeout=WAIT_MS)
        assert not p.errors, p.errors
    finally:
        p.close()


def test_the_load_panel_shows_the_loop_lag_refusals_and_the_tokens_throttled(browser: Any, make_broker: Any,
                                                                              tmp_path: Path) -> None:
    from ring.auth import file_line

    tokens = tmp_path / "tokens"
    tokens.write_text(file_line("t-admin", "ops", "admin", "*") + "\n"
                      + file_line("t-slow", "slow", "produce", "*", "produce_bytes_per_s=10") + "\n")
    b = make_broker("--auth-tokens", str(tokens))
    name = _name()
    assert b.http.with_token("t-admin").create_topic(name, partitions=1).status == 201
    slow = b.http.with_token("t-slow")
    assert slow.produce(name, b'{"value": "' + b"x" * 500 + b'"}').status == 200
    assert slow.produce(name, [1]).status == 429  # ~50 s of debt at 10 bytes a second
    page = Page(browser, b.url + "/", token="t-admin")
    try:
        expect(page.locator("#load .load-lag")).to_contain_text("loop lag")
        expect(page.locator("#load .load-running")).to_contain_text("0 running")
        expect(page.locator("#load .load-refused")).to_have_text("refused: loop lag 0, requests running 0")
        row = page.locator('#load tr[data-principal="slow"][data-quota="produce"]')
        expect(row).to_have_text("slowproduce1")
        assert not page.errors, page.errors
    finally:
        page.close()
