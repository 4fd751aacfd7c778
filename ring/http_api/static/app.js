// The ring admin page. It polls this broker's public client API every
// REFRESH_MS, draws the token ring as SVG and fills the tables; every action
// is one API call behind a confirmation, and a failed call shows the API's own
// {"error", "message"}. No framework and no build step: this file is served
// as it is. Data is put into the page with textContent and attributes only,
// never as HTML, so a topic or broker name cannot become markup.

import { api, TOKEN_KEY } from "./api.js";
import { clearMessage, confirmAction, showMessage } from "./dialogs.js";
import { $, el, fmtBytes, fmtMs, fmtNum, fmtOffset, fmtPhi } from "./dom.js";
import { memberRows, offsetRows } from "./groups.js";
import { renderLoad } from "./load.js";
import { drawRing } from "./ring.js";
import { partitionToken, toBig } from "./tokens.js";
import { loadTrends, merge, renderActivity } from "./trends.js";

const REFRESH_MS = 2000;
// Topics described per refresh (one GET each); a bigger catalogue shows settings only.
const DESCRIBE_TOPICS_MAX = 64;
const STATUS_COLORS = {
  up: "#2f9e5b", suspect: "#e0a100", down: "#d64545",
  joining: "#3b7dd8", leaving: "#8e5bd6", removed: "#9aa0a6",
};
// Identity colours of brokers (partition marks take their leader's).
const PALETTE = ["#1f77b4", "#ff7f0e", "#17becf", "#bcbd22", "#e377c2", "#8c564b",
                 "#7f7f7f", "#9467bd", "#2ca02c", "#d62728", "#393b79", "#637939"];
const LIVE = new Set(["up", "suspect", "joining", "leaving"]);

const state = {
  self: null,          // this broker's name
  status: null,        // GET /v1/status
  clusterMissing: false,
  brokers: [],         // GET /v1/cluster brokers, by token
  topics: [],          // GET /v1/topics
  details: new Map(),  // topic -> GET /v1/topics/{t}
  leaderViews: new Map(), // topic -> Map(partition -> that partition's doc as its leader gives it)
  ranges: new Map(),   // topic -> Map(partition -> GET .../ranges), for opened topics with local tails
  groups: [],
  groupsMissing: false,
  expanded: new Set(),
  ringTopic: null,     // null: follow the first topic that is not internal
  trends: merge([]),   // the charts' series (trends.js)
  refreshes: 0,
  updatedAt: null,
};

const enc = encodeURIComponent;

// --- DOM helpers ---------------------------------------------------------------------------

function statusChip(status) {
  return el("span", { class: `status status-${status || "unknown"}` }, status || "unknown");
}

function brokerColor(name) {
  const i = state.brokers.findIndex((b) => b.name === name);
  return i < 0 ? "#b0b4ba" : PALETTE[i % PALETTE.length];
}

function brokerStatus(name) {
  const b = state.brokers.find((x) => x.name === name);
  return b ? b.status : "unknown";
}

function brokerChip(name) {
  if (!name) return el("span", { class: "muted" }, "—");
  return el("span", { class: "broker-chip", dataset: { broker: name } },
    el("i", { class: "swatch", style: { background: brokerColor(name) } }), name);
}

// --- actions -------------------------------------------------------------------------------

async function act(title, detail, okLabel, call, success) {
  if (!(await confirmAction(title, detail, okLabel))) return false;
  try {
    await call();
    showMessage("ok", success);
    refreshNow();
    return true;
  } catch (exc) {
    showMessage("error", `${title.replace(/\?$/, "")} failed: ${exc.message}`);
    return false;
  }
}

// --- loading -------------------------------------------------------------------------------

async function load() {
  let status;
  try {
    status = await api("GET", "/v1/status");
  } catch (exc) {
    if (exc.status === 503 && exc.body && exc.body.name) status = exc.body; // joining: still a status
    else throw exc;
  }
  state.status = status;
  state.self = status.name;

  try {
    const cluster = await api("GET", "/v1/cluster");
    state.clusterMissing = false;
    if (cluster.self) state.self = cluster.self;
    state.brokers = (cluster.brokers || []).slice();
  } catch (exc) {
    if (exc.status !== 404) throw exc;
    // A broker alone, before clustering: just itself.
    state.clusterMissing = true;
    state.brokers = [{ name: status.name, token: status.token ?? null, status: status.status === "ok" ? "up" : status.status,
                       phi: 0, client_url: location.origin, load: { partitions_led: status.partitions } }];
  }
  state.brokers.sort((a, b) => {
    const ta = toBig(a.token), tb = toBig(b.token);
    if (ta === null || tb === null) return a.name < b.name ? -1 : 1;
    return ta < tb ? -1 : ta > tb ? 1 : 0;
  });
  // A replication factor over the brokers in the ring is refused (400): offer no more.
  const rf = document.querySelector('#create-topic input[name="replication_factor"]');
  if (rf) {
    rf.max = String(Math.max(1, Math.min(7, state.brokers.length)));
    if (Number(rf.value) > Number(rf.max)) rf.value = rf.max;
  }

  const topics = await api("GET", "/v1/topics");
  // The user's topics first, by name; internal ones (__offsets) after them.
  state.topics = (topics.topics || []).slice().sort((a, b) =>
    (Boolean(a.internal) - Boolean(b.internal)) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const described = state.topics.slice(0, DESCRIBE_TOPICS_MAX);
  const docs = await Promise.allSettled(described.map((t) => api("GET", `/v1/topics/${enc(t.name)}`)));
  const details = new Map();
  described.forEach((t, i) => { if (docs[i].status === "fulfilled") details.set(t.name, docs[i].value); });
  state.details = details;
  await loadLeaderViews();
  await loadRanges();
  state.trends = await loadTrends(state.brokers, state.self, (name) => LIVE.has(brokerStatus(name)));

  try {
    const groups = await api("GET", "/v1/groups");
    state.groups = Array.isArray(groups) ? groups : (groups && groups.groups) || [];
    state.groupsMissing = false;
  } catch (exc) {
    if (exc.status !== 404) throw exc;
    state.groups = [];
    state.groupsMissing = true;
  }
}

// A replica's lag is known to its partition's leader. For the topics opened in
// the table, partitions led elsewhere are read from their leader, through this
// broker (a page may only call its own origin).
async function loadLeaderViews() {
  const views = new Map();
  const calls = [];
  for (const topic of state.expanded) {
    const doc = state.details.get(topic);
    if (!doc) continue;
    const byLeader = new Map();
    for (const p of doc.partitions || []) {
      if (!p.leader || p.leader === state.self || hasLag(p)) continue;
      if (!LIVE.has(brokerStatus(p.leader))) continue;
      if (!byLeader.has(p.leader)) byLeader.set(p.leader, []);
      byLeader.get(p.leader).push(p.partition);
    }
    const view = new Map();
    views.set(topic, view);
    for (const [leader, parts] of byLeader) {
      calls.push(api("GET", `/admin/brokers/${enc(leader)}/topics/${enc(topic)}`).then((remote) => {
        for (const rp of remote.partitions || []) {
          if (parts.includes(rp.partition) && rp.leader === leader) view.set(rp.partition, rp);
        }
      }).catch(() => {}));
    }
  }
  await Promise.all(calls);
  state.leaderViews = views;
}

// Where the ranges of an opened topic's partitions live (topics whose replicas keep a local tail).
async function loadRanges() {
  const out = new Map();
  const calls = [];
  for (const topic of state.expanded) {
    const t = state.topics.find((x) => x.name === topic);
    const doc = state.details.get(topic);
    if (!t || !doc || !(t.local_retention_bytes >= 0)) continue;
    const view = new Map();
    out.set(topic, view);
    for (const p of doc.partitions || []) {
      calls.push(api("GET", `/v1/topics/${enc(topic)}/partitions/${p.partition}/ranges`)
        .then((r) => view.set(p.partition, r)).catch(() => {}));
    }
  }
  await Promise.all(calls);
  state.ranges = out;
}

// A partition's ranges: how many, their bytes, and how many each broker holds.
function rangesCell(doc) {
  if (!doc) return el("span", { class: "muted" }, "—");
  const ranges = doc.ranges || [];
  if (!ranges.length) return el("span", { class: "muted" }, "none yet");
  const per = new Map();
  let bytes = 0;
  for (const r of ranges) {
    bytes += r.bytes || 0;
    for (const h of r.holders || []) per.set(h, (per.get(h) || 0) + 1);
  }
  const unsafe = ranges.filter((r) => (r.holders || []).length < (r.copies || 0)).length;
  return el("div", { class: "ranges", title: `local log from offset ${doc.local_start_offset}` },
    el("span", {}, `${ranges.length} (${fmtBytes(bytes)})`),
    ...[...per.entries()].sort().map(([h, n]) => el("span", { class: "replica", dataset: { holder: h } }, brokerChip(h),
      el("span", { class: "lag" }, `×${n}`))),
    unsafe ? el("span", { class: "warn" }, `${unsafe} copying`) : null);
}

function hasLag(p) {
  const ends = p.replica_end_offsets;
  return !!ends && (p.replicas || []).every((r) => typeof ends[r] === "number");
}

// The best view of a partition: its leader's when we have it.
function partitionView(topic, p) {
  const view = state.leaderViews.get(topic);
  return (view && view.get(p.partition)) || p;
}

function partitionHealth(p) {
  const replicas = p.replicas || [];
  // No replica holding what was acknowledged can be elected: the others lost their disks (lost_state).
  if (p.no_eligible_leader) return "no eligible leader";
  if (!p.leader || !LIVE.has(brokerStatus(p.leader))) return "leaderless";
  const ends = p.replica_end_offsets || {};
  const behind = replicas.some((r) => !LIVE.has(brokerStatus(r)) ||
    (hasLag(p) && typeof p.high_watermark === "number" && ends[r] < p.high_watermark));
  return behind ? "under-replicated" : "ok";
}

// --- refresh loop ---------------------------------------------------------------------------

let timer = null;
let running = false;
let again = false;

async function tick() {
  if (running) { again = true; return; }
  if (document.hidden) { clearTimeout(timer); return; }  // a background tab polls nothing; visible again: at once
  running = true;
  clearTimeout(timer);
  try {
    await load();
    clearMessage("refresh");
    state.refreshes += 1;
    state.updatedAt = new Date();
    document.body.classList.remove("stale");
    render();
    document.body.dataset.refreshes = String(state.refreshes);
  } catch (exc) {
    document.body.classList.add("stale");
    const hint = exc.status === 401 || exc.status === 403 ? " (set the client token above)" : "";
    showMessage("error", `refresh failed: ${exc.message}${hint}`, "refresh");
  } finally {
    running = false;
    if (again) { again = false; tick(); } else schedule();
  }
}

function schedule() {
  clearTimeout(timer);
  if ($("#auto-refresh").checked) timer = setTimeout(tick, REFRESH_MS);
}

function refreshNow() { tick(); }

// --- rendering ------------------------------------------------------------------------------

function render() {
  renderActivity(state.trends, state.topics);
  renderSummary();
  renderRingTopicChoice();
  renderRing();
  renderBrokers();
  renderTopics();
  renderLoad(state.status);
  renderGroups();
}

function renderSummary() {
  $("#self-name").textContent = state.self ? `· ${state.self}` : "";
  const counts = {};
  for (const b of state.brokers) counts[b.status] = (counts[b.status] || 0) + 1;
  let under = 0, leaderless = 0;
  for (const doc of state.details.values()) {
    for (const p of doc.partitions || []) {
      const h = partitionHealth(partitionView(doc.name, p));
      if (h === "under-replicated") under++;
      if (h === "leaderless" || h === "no eligible leader") leaderless++;
    }
  }
  const chips = [
    el("span", {}, `${state.brokers.length} broker${state.brokers.length === 1 ? "" : "s"}`),
    ...Object.entries(counts).map(([s, n]) => el("span", { class: `status status-${s}` }, `${n} ${s}`)),
    el("span", {}, `${state.topics.length} topic${state.topics.length === 1 ? "" : "s"}`),
  ];
  if (under) chips.push(el("span", { class: "warn" }, `${under} under-replicated`));
  if (leaderless) chips.push(el("span", { class: "bad" }, `${leaderless} leaderless`));
  for (const b of state.brokers) {
    const c = b.clock || {};
    if (c.state === "out_of_bounds" || c.state === "warning") {
      chips.push(el("span", { class: c.state === "warning" ? "warn clock-alert" : "bad clock-alert" },
        `${b.name} clock ${c.state === "warning" ? "warning" : "out of bounds"} ${fmtOffset(c.offset_ms)}`));
    }
  }
  $("#summary").replaceChildren(...chips);
  $("#updated").textContent = state.updatedAt ? `updated ${state.updatedAt.toLocaleTimeString()}` : "";
}

function ringTopicName() {
  if (state.ringTopic !== null && state.details.has(state.ringTopic)) return state.ringTopic;
  const first = state.topics.find((t) => !t.internal && state.details.has(t.name));
  return first ? first.name : "";
}

function renderRingTopicChoice() {
  const select = $("#ring-topic");
  const current = ringTopicName();
  const names = state.topics.filter((t) => state.details.has(t.name)).map((t) => t.name);
  const have = [...select.options].map((o) => o.value).slice(1);
  if (have.join("\n") !== names.join("\n")) {
    select.replaceChildren(el("option", { value: "" }, "(no topic)"), ...names.map((n) => el("option", { value: n }, n)));
  }
  select.value = current;
}

function renderRing() {
  const topic = ringTopicName();
  const doc = topic ? state.details.get(topic) : null;
  drawRing($("#ring"), {
    brokers: state.brokers, topic: doc ? topic : "",
    partitions: doc ? doc.partitions.map((p) => partitionView(topic, p)) : [],
    base: doc ? doc.base_partitions : undefined,
    color: brokerColor, isLive: (name) => LIVE.has(brokerStatus(name)), statusColors: STATUS_COLORS,
  });
  $("#ring-legend").replaceChildren(
    el("div", {}, ...Object.entries(STATUS_COLORS).map(([s, c]) =>
      el("span", { class: "legend-item" }, el("i", { class: "dot", style: { background: c } }), s))),
    el("div", { class: "muted" }, "ring colour: broker; partition dots: coloured by their leader"),
  );
}

// A broker's clock as it judges it against its peers' (GET /v1/cluster): an element, and how bad.
function clockCell(clock) {
  const state = clock && clock.state;
  if (!state) return el("span", { class: "muted" }, "—");
  if (state === "out_of_bounds") {
    return el("span", { class: "bad", title: "beyond --max-clock-offset: leads no partition, stamps no record" },
      `out of bounds ${fmtOffset(clock.offset_ms)}`);
  }
  if (state === "warning") return el("span", { class: "warn" }, `warning ${fmtOffset(clock.offset_ms)}`);
  return el("span", { class: state === "ok" ? "good" : "muted" }, state);
}

function renderBrokers() {
  const body = $("#brokers tbody");
  const rows = state.brokers.map((b) => {
    const load = b.load || {};
    const led = load.partitions_led;
    const replicas = load.replicas;
    const followed = typeof replicas === "number" && typeof led === "number" ? replicas - led : null;
    const decommission = el("button", {
      class: "small danger", disabled: state.clusterMissing || b.status === "removed" || b.status === "leaving",
      title: state.clusterMissing ? "a broker alone cannot be decommissioned" : "move its partitions away and remove it",
      onclick: () => act(`Decommission ${b.name}?`,
        `${b.name} hands its partitions to the next brokers on the ring and then leaves the cluster.`, "decommission",
        () => api("POST", `/v1/cluster/brokers/${enc(b.name)}/decommission`), `${b.name} is being decommissioned`),
    }, "decommission");
    return el("tr", { dataset: { broker: b.name, status: b.status } },
      el("td", {}, brokerChip(b.name), b.name === state.self ? el("span", { class: "muted" }, " (this page)") : null),
      el("td", { class: "addr" }, b.client_url || "—"),
      el("td", { class: "broker-host" }, b.host ? (b.zone ? `${b.host} · ${b.zone}` : b.host) : "—"),
      el("td", { class: "broker-status" }, statusChip(b.status)),
      el("td", { class: "num" }, fmtPhi(b.phi)),
      el("td", { class: "broker-clock" }, clockCell(b.clock)),
      el("td", { class: "num" }, fmtBytes(load.disk_bytes)),
      el("td", { class: "num" }, fmtBytes(load.range_bytes)),
      el("td", { class: "num" }, load.ranges_full ? el("span", { class: "bad", title: "below its floor "
        + "(--disk-free-min-bytes): takes no new range" }, `${fmtBytes(load.disk_free_bytes)} full`)
        : fmtBytes(load.disk_free_bytes)),
      el("td", { class: "num" }, fmtNum(led)),
      el("td", { class: "num" }, fmtNum(followed)),
      el("td", {}, decommission));
  });
  body.replaceChildren(...rows);
}

function renderTopics() {
  const body = $("#topics tbody");
  const rows = [];
  if (!state.topics.length) {
    rows.push(el("tr", {}, el("td", { colspan: 9, class: "muted empty" }, "no topics yet")));
  }
  for (const t of state.topics) {
    const doc = state.details.get(t.name);
    const open = state.expanded.has(t.name);
    let records = null;
    const health = { ok: 0, "under-replicated": 0, leaderless: 0, "no eligible leader": 0 };
    if (doc) {
      records = 0;
      for (const p0 of doc.partitions || []) {
        const p = partitionView(t.name, p0);
        if (typeof p.high_watermark === "number" && typeof p.earliest_offset === "number") {
          records += p.high_watermark - p.earliest_offset;
        }
        health[partitionHealth(p)]++;
      }
    }
    const healthCell = !doc ? el("span", { class: "muted" }, "—")
      : health["no eligible leader"] ? el("span", { class: "bad" }, `${health["no eligible leader"]} with no eligible leader`)
      : health.leaderless ? el("span", { class: "bad" }, `${health.leaderless} leaderless`)
      : health["under-replicated"] ? el("span", { class: "warn" }, `${health["under-replicated"]} under-replicated`)
      : el("span", { class: "good" }, "ok");
    const toggle = el("button", { class: "link", "aria-expanded": open ? "true" : "false",
      title: `topic id ${t.id} (new when the topic is created again)`,
      onclick: () => { open ? state.expanded.delete(t.name) : state.expanded.add(t.name); state.ringTopic = t.name; refreshNow(); render(); } },
      `${open ? "▾" : "▸"} ${t.name}`);
    rows.push(el("tr", { class: `topic-row${t.internal ? " internal" : ""}`, dataset: { topic: t.name } },
      el("td", {}, toggle, t.internal ? el("span", { class: "internal-tag", title: "kept by the cluster for "
        + "itself (consumer groups' committed offsets): readable, not changeable" }, "internal") : null),
      el("td", { class: "num" }, t.partitions),
      el("td", { class: "num" }, t.replication_factor),
      el("td", {}, fmtMs(t.retention_ms), t.retention_bytes >= 0 ? ` / ${fmtBytes(t.retention_bytes)}` : ""),
      el("td", {}, t.compression || "none"),
      el("td", {}, t.consistency || "quorum"),
      el("td", { class: "num" }, fmtNum(records)),
      el("td", {}, healthCell),
      el("td", { class: "actions" },
        el("button", { class: "small", disabled: Boolean(t.internal), onclick: () => openSettings(t) }, "settings"),
        el("button", { class: "small danger", disabled: Boolean(t.internal), onclick: () => act(`Delete topic ${t.name}?`,
          `Every record of ${t.name} on every broker is deleted. This cannot be undone.`, "delete",
          () => api("DELETE", `/v1/topics/${enc(t.name)}`), `topic ${t.name} deleted`) }, "delete"))));
    if (open) rows.push(el("tr", { class: "partitions-row", dataset: { partitionsOf: t.name } },
      el("td", { colspan: 9 }, doc ? partitionsTable(t.name, doc) : el("span", { class: "muted" }, "not described"))));
  }
  body.replaceChildren(...rows);
}

function partitionsTable(topic, doc) {
  const ranged = state.ranges.has(topic);
  const head = el("thead", {}, el("tr", {},
    ...["partition", "leader", "replicas (lag in records)", "epoch", "earliest", "end", "high watermark", "health",
      ...(ranged ? ["local from", "ranges (holders ×count)"] : [])]
      .map((h, i) => el("th", { class: (i >= 3 && i <= 6) || i === 8 ? "num" : null }, h))));
  const rows = (doc.partitions || []).map((p0) => {
    const p = partitionView(topic, p0);
    const ends = p.replica_end_offsets || {};
    const replicas = (p.replicas || []).map((r) => {
      const end = ends[r];
      // Nothing to lag behind in an empty log, whether or not the replica has reported.
      const lag = p.end_offset === 0 ? 0
        : typeof end === "number" && typeof p.end_offset === "number" ? Math.max(0, p.end_offset - end) : null;
      return el("span", { class: `replica${LIVE.has(brokerStatus(r)) ? "" : " replica-down"}`, dataset: { replica: r } },
        brokerChip(r), el("span", { class: "lag" }, lag === null ? "lag ?" : `lag ${lag}`));
    });
    const health = partitionHealth(p);
    return el("tr", { dataset: { partition: p.partition } },
      el("td", { class: "num" }, p.partition),
      el("td", {}, brokerChip(p.leader)),
      el("td", {}, el("div", { class: "replicas" }, replicas)),
      el("td", { class: "num" }, fmtNum(p.epoch)),
      el("td", { class: "num" }, fmtNum(p.earliest_offset)),
      el("td", { class: "num" }, fmtNum(p.end_offset)),
      el("td", { class: "num" }, fmtNum(p.high_watermark)),
      el("td", {}, el("span", { class: health === "ok" ? "good" : health === "under-replicated" ? "warn" : "bad" },
        health === "no eligible leader" ? `${health} (lost their state: ${(p.lost_state || []).join(", ")})` : health)),
      ...(ranged ? [el("td", { class: "num" }, fmtNum(p.local_start_offset)),
        el("td", {}, rangesCell(state.ranges.get(topic).get(p.partition)))] : []));
  });
  return el("table", { class: "partitions" }, head, el("tbody", {}, rows));
}

// --- consumer groups ------------------------------------------------------------------------

function renderGroups() {
  const box = $("#groups");
  if (state.groupsMissing || !state.groups.length) {
    if (!box.querySelector(".empty-groups")) box.replaceChildren(el("p", { class: "muted empty-groups" }, "no consumer groups"));
    return;
  }
  // Keep a reset form the user is typing in: only rebuild a group's tables.
  const seen = new Set();
  for (const g of state.groups) {
    const name = g.group ?? g.name ?? g.id;
    seen.add(name);
    let card = [...box.querySelectorAll(".group")].find((c) => c.dataset.group === name);
    if (!card) {
      card = el("div", { class: "group", dataset: { group: name } },
        el("h3", {}, name, " ", el("span", { class: "muted group-state" })),
        el("div", { class: "group-tables" }),
        resetForm(name));
      box.querySelector(".empty-groups")?.remove();
      box.append(card);
    }
    const members = Array.isArray(g.members) ? g.members.length : g.members ?? 0;
    card.querySelector(".group-state").textContent =
      [g.state, g.generation !== undefined ? `generation ${g.generation}` : null, `${members} member${members === 1 ? "" : "s"}`]
        .filter(Boolean).join(" · ");
    card.querySelector(".group-tables").replaceChildren(
      el("table", { class: "members" }, el("thead", {}, el("tr", {}, el("th", {}, "member"), el("th", {}, "client"),
        el("th", {}, "assignment"))), el("tbody", {}, memberRows(g))),
      el("table", { class: "offsets" }, el("thead", {}, el("tr", {}, el("th", {}, "topic"), el("th", { class: "num" }, "partition"),
        el("th", { class: "num" }, "committed"), el("th", { class: "num" }, "high watermark"), el("th", { class: "num" }, "lag"))),
        el("tbody", {}, offsetRows(g))));
  }
  for (const card of box.querySelectorAll(".group")) if (!seen.has(card.dataset.group)) card.remove();
}

function resetForm(group) {
  const form = $("#reset-form").content.firstElementChild.cloneNode(true);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const topic = data.get("topic").trim();
    const body = { to: data.get("to") };
    if (data.get("value") !== "") body.value = Number(data.get("value"));
    if (data.get("partition") !== "") body.partition = Number(data.get("partition"));
    if ((body.to === "offset" || body.to === "timestamp") && body.value === undefined) {
      showMessage("error", `reset to ${body.to} needs a value`);
      return;
    }
    const where = body.partition === undefined ? "every partition" : `partition ${body.partition}`;
    await act(`Reset offsets of ${group} on ${topic}?`,
      `${group} will read ${topic} (${where}) from ${body.to}${body.value !== undefined ? ` ${body.value}` : ""}.`,
      "reset", () => api("PUT", `/v1/groups/${enc(group)}/offsets/${enc(topic)}`, body),
      `offsets of ${group} on ${topic} reset`);
  });
  return form;
}

// --- topic forms -----------------------------------------------------------------------------

function createTopicForm() {
  const form = $("#create-topic");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const name = data.get("name").trim();
    const body = { name, partitions: Number(data.get("partitions")),
                   replication_factor: Number(data.get("replication_factor")), compression: data.get("compression") };
    const hours = Number(data.get("retention_h"));
    body.retention_ms = hours < 0 ? -1 : Math.round(hours * 3600000);
    const done = await act(`Create topic ${name}?`,
      `${body.partitions} partitions, replication ${body.replication_factor}, retention ${fmtMs(body.retention_ms)}, ` +
      `compression ${body.compression}.`, "create", () => api("POST", "/v1/topics", body), `topic ${name} created`);
    if (done) form.elements.name.value = "";
  });
}

let settingsTopic = null;

function openSettings(t) {
  settingsTopic = t;
  const form = $("#settings-form");
  $("#settings-topic").textContent = t.name;
  form.elements.partitions.value = t.partitions;
  form.elements.retention_ms.value = t.retention_ms;
  form.elements.retention_bytes.value = t.retention_bytes;
  form.elements.local_retention_bytes.value = t.local_retention_bytes ?? -1;
  form.elements.consistency.value = t.consistency || "quorum";
  form.elements.auto_partitions.checked = Boolean(t.auto_partitions);
  $("#settings").returnValue = "";
  $("#settings").showModal();
}

function settingsDialog() {
  const dialog = $("#settings");
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "ok" || !settingsTopic) return;
    const t = settingsTopic, form = $("#settings-form");
    const changes = {};
    for (const field of ["partitions", "retention_ms", "retention_bytes", "local_retention_bytes"]) {
      const v = form.elements[field].value;
      if (v !== "" && Number(v) !== t[field]) changes[field] = Number(v);
    }
    if (form.elements.consistency.value !== (t.consistency || "quorum")) changes.consistency = form.elements.consistency.value;
    if (form.elements.auto_partitions.checked !== Boolean(t.auto_partitions)) {
      changes.auto_partitions = form.elements.auto_partitions.checked;
    }
    if (!Object.keys(changes).length) { showMessage("ok", `nothing changed for ${t.name}`); return; }
    const what = Object.entries(changes).map(([k, v]) => `${k} ${t[k]} → ${v}`).join(", ");
    await act(`Change settings of ${t.name}?`, what, "apply",
      () => api("PATCH", `/v1/topics/${enc(t.name)}`, changes), `settings of ${t.name} changed`);
  });
}

// --- start -------------------------------------------------------------------------------------

function start() {
  const tokenInput = $("#token");
  tokenInput.value = localStorage.getItem(TOKEN_KEY) || "";
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = tokenInput.value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value); else localStorage.removeItem(TOKEN_KEY);
    showMessage("ok", value ? "token saved in this browser" : "token cleared");
    refreshNow();
  });
  $("#auto-refresh").addEventListener("change", () => (($("#auto-refresh").checked) ? refreshNow() : clearTimeout(timer)));
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshNow(); });
  $("#ring-topic").addEventListener("change", (ev) => { state.ringTopic = ev.target.value; renderRing(); });
  createTopicForm();
  settingsDialog();
  window.ringAdmin = { state, partitionToken, refreshNow };
  tick();
}

start();
