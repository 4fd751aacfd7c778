// The ring admin page. It polls this broker's public client API every
// REFRESH_MS, draws the token ring as SVG and fills the tables; every action
// is one API call behind a confirmation, and a failed call shows the API's own
// {"error", "message"}. No framework and no build step: this file is served
// as it is. Data is put into the page with textContent and attributes only,
// never as HTML, so a topic or broker name cannot become markup.

const REFRESH_MS = 2000;
const TOKEN_KEY = "ring.admin.token";
// Topics described per refresh (one GET each); a bigger catalogue shows settings only.
const DESCRIBE_TOPICS_MAX = 64;
const SUCCESS_SHOWN_MS = 6000;
const SVG_NS = "http://www.w3.org/2000/svg";
const STATUS_COLORS = {
  up: "#2f9e5b", suspect: "#e0a100", down: "#d64545",
  joining: "#3b7dd8", leaving: "#8e5bd6", removed: "#9aa0a6",
};
// Identity colours of brokers (partition marks take their leader's).
const PALETTE = ["#1f77b4", "#ff7f0e", "#17becf", "#bcbd22", "#e377c2", "#8c564b",
                 "#7f7f7f", "#9467bd", "#2ca02c", "#d62728", "#393b79", "#637939"];
const TWO_63 = 2n ** 63n;
const TWO_64 = 2n ** 64n;
const MASK_64 = TWO_64 - 1n;
const LIVE = new Set(["up", "suspect", "joining", "leaving"]);

const state = {
  self: null,          // this broker's name
  status: null,        // GET /v1/status
  clusterMissing: false,
  brokers: [],         // GET /v1/cluster brokers, by token
  topics: [],          // GET /v1/topics
  details: new Map(),  // topic -> GET /v1/topics/{t}
  leaderViews: new Map(), // topic -> Map(partition -> that partition's doc as its leader gives it)
  groups: [],
  groupsMissing: false,
  expanded: new Set(),
  ringTopic: null,     // null: follow the first topic
  refreshes: 0,
  updatedAt: null,
};

const $ = (sel, root = document) => root.querySelector(sel);

// --- API ------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body, text) {
    const code = body && body.error ? body.error : `http_${status}`;
    const message = body && body.message ? body.message : (text || "").slice(0, 200) || "no details";
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.body = body;
  }
}

// Tokens are 64-bit: read them exactly where the browser allows it (JSON.parse source access).
function reviver(key, value, context) {
  if (key === "token" && typeof value === "number" && context && typeof context.source === "string") {
    return BigInt(context.source);
  }
  return value;
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (exc) {
    throw new ApiError(0, { error: "unreachable", message: `the broker did not answer (${exc.message})` });
  }
  const text = await resp.text();
  let doc = null;
  try { doc = text ? JSON.parse(text, reviver) : null; } catch { doc = null; }
  if (!resp.ok) throw new ApiError(resp.status, doc, text);
  return doc;
}

const enc = encodeURIComponent;

// --- tokens and angles -----------------------------------------------------------------

const rotl = (x, r) => ((x << r) | (x >> (64n - r))) & MASK_64;

function fmix64(k) {
  k ^= k >> 33n; k = (k * 0xff51afd7ed558ccdn) & MASK_64;
  k ^= k >> 33n; k = (k * 0xc4ceb9fe1a85ec53n) & MASK_64;
  return k ^ (k >> 33n);
}

// First 64 bits of Murmur3 x64-128, seed 0, unsigned: ring.hashing.token's bits.
function murmur3First64(bytes) {
  const c1 = 0x87c37b91114253d5n, c2 = 0x4cf5ad432745937fn;
  const n = bytes.length, blocks = Math.floor(n / 16);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let h1 = 0n, h2 = 0n;
  for (let i = 0; i < blocks; i++) {
    let k1 = view.getBigUint64(i * 16, true), k2 = view.getBigUint64(i * 16 + 8, true);
    k1 = (rotl((k1 * c1) & MASK_64, 31n) * c2) & MASK_64; h1 ^= k1;
    h1 = (((rotl(h1, 27n) + h2) & MASK_64) * 5n + 0x52dce729n) & MASK_64;
    k2 = (rotl((k2 * c2) & MASK_64, 33n) * c1) & MASK_64; h2 ^= k2;
    h2 = (((rotl(h2, 31n) + h1) & MASK_64) * 5n + 0x38495ab5n) & MASK_64;
  }
  const tail = blocks * 16, rem = n & 15;
  let k1 = 0n, k2 = 0n;
  for (let i = rem - 1; i >= 8; i--) k2 ^= BigInt(bytes[tail + i]) << BigInt((i - 8) * 8);
  if (rem > 8) { k2 = (rotl((k2 * c2) & MASK_64, 33n) * c1) & MASK_64; h2 ^= k2; }
  for (let i = Math.min(rem, 8) - 1; i >= 0; i--) k1 ^= BigInt(bytes[tail + i]) << BigInt(i * 8);
  if (rem > 0) { k1 = (rotl((k1 * c1) & MASK_64, 31n) * c2) & MASK_64; h1 ^= k1; }
  h1 ^= BigInt(n); h2 ^= BigInt(n);
  h1 = (h1 + h2) & MASK_64; h2 = (h2 + h1) & MASK_64;
  h1 = fmix64(h1); h2 = fmix64(h2);
  return (h1 + h2) & MASK_64;
}

const toSigned = (u) => (u >= TWO_63 ? u - TWO_64 : u);

// ring.hashing.partition_token: murmur3(topic) + p * 2^64 / P, as a signed token.
function partitionToken(topic, partition, partitions) {
  const base = murmur3First64(new TextEncoder().encode(topic));
  const offset = (BigInt(partition) * TWO_64) / BigInt(partitions);
  return toSigned((base + offset) & MASK_64);
}

function toBig(token) {
  if (typeof token === "bigint") return token;
  if (typeof token === "number" && Number.isFinite(token)) return BigInt(Math.round(token));
  if (typeof token === "string" && /^-?\d+$/.test(token)) return BigInt(token);
  return null;
}

// Token -> angle in radians, clockwise from the top, where the smallest token sits.
function angleOf(token) {
  const t = toBig(token);
  if (t === null) return 0;
  return (Number(t + TWO_63) / Number(TWO_64)) * 2 * Math.PI;
}

// --- formatting --------------------------------------------------------------------------

function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 0) return "forever";
  const units = [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]];
  for (const [u, size] of units) if (ms >= size && ms % size === 0) return `${ms / size} ${u}`;
  return `${ms} ms`;
}

const fmtNum = (n) => (n === null || n === undefined ? "—" : String(n));
const fmtPhi = (phi) => (typeof phi === "number" ? phi.toFixed(2) : "—");

// --- DOM helpers ---------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k === "style") Object.assign(node.style, v);  // CSSOM: the page's CSP forbids style attributes
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

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

// --- messages ------------------------------------------------------------------------------

function showMessage(kind, text, key) {
  const box = $("#messages");
  if (key) {
    const old = box.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (old) old.remove();
  }
  const close = el("button", { class: "close", title: "dismiss", onclick: () => msg.remove() }, "×");
  const msg = el("div", { class: `message ${kind}`, dataset: key ? { key } : {}, role: kind === "error" ? "alert" : "status" },
    el("span", { class: "text" }, text), close);
  box.append(msg);
  if (kind !== "error") setTimeout(() => msg.remove(), SUCCESS_SHOWN_MS);
  return msg;
}

function clearMessage(key) {
  const old = $("#messages").querySelector(`[data-key="${CSS.escape(key)}"]`);
  if (old) old.remove();
}

// --- confirmation -------------------------------------------------------------------------

function confirmAction(title, detail, okLabel = "confirm") {
  const dialog = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-detail").textContent = detail || "";
  $("#confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

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

  const topics = await api("GET", "/v1/topics");
  state.topics = (topics.topics || []).slice().sort((a, b) => (a.name < b.name ? -1 : 1));
  const described = state.topics.slice(0, DESCRIBE_TOPICS_MAX);
  const docs = await Promise.allSettled(described.map((t) => api("GET", `/v1/topics/${enc(t.name)}`)));
  const details = new Map();
  described.forEach((t, i) => { if (docs[i].status === "fulfilled") details.set(t.name, docs[i].value); });
  state.details = details;
  await loadLeaderViews();

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
  renderSummary();
  renderRingTopicChoice();
  renderRing();
  renderBrokers();
  renderTopics();
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
      if (h === "leaderless") leaderless++;
    }
  }
  const chips = [
    el("span", {}, `${state.brokers.length} broker${state.brokers.length === 1 ? "" : "s"}`),
    ...Object.entries(counts).map(([s, n]) => el("span", { class: `status status-${s}` }, `${n} ${s}`)),
    el("span", {}, `${state.topics.length} topic${state.topics.length === 1 ? "" : "s"}`),
  ];
  if (under) chips.push(el("span", { class: "warn" }, `${under} under-replicated`));
  if (leaderless) chips.push(el("span", { class: "bad" }, `${leaderless} leaderless`));
  $("#summary").replaceChildren(...chips);
  $("#updated").textContent = state.updatedAt ? `updated ${state.updatedAt.toLocaleTimeString()}` : "";
}

function ringTopicName() {
  if (state.ringTopic !== null && state.details.has(state.ringTopic)) return state.ringTopic;
  const first = state.topics.find((t) => state.details.has(t.name));
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

function polar(angle, r, cx = 220, cy = 220) {
  return [cx + r * Math.sin(angle), cy - r * Math.cos(angle)];
}

function arcPath(a0, a1, r) {
  let sweep = a1 - a0;
  while (sweep <= 0) sweep += 2 * Math.PI;
  if (sweep >= 2 * Math.PI - 1e-6) {
    const [x0, y0] = polar(0, r), [x1, y1] = polar(Math.PI, r);
    return `M ${x0} ${y0} A ${r} ${r} 0 1 1 ${x1} ${y1} A ${r} ${r} 0 1 1 ${x0} ${y0}`;
  }
  const [x0, y0] = polar(a0, r), [x1, y1] = polar(a0 + sweep, r);
  return `M ${x0} ${y0} A ${r} ${r} 0 ${sweep > Math.PI ? 1 : 0} 1 ${x1} ${y1}`;
}

// Labels outside the ring grow away from it: rightwards on the right side, leftwards on the left.
function anchorAt(angle) {
  return Math.sin(angle) > 0.3 ? "start" : Math.sin(angle) < -0.3 ? "end" : "middle";
}

function renderRing() {
  const R = 150;
  const root = $("#ring");
  const parts = [];
  parts.push(svg("circle", { cx: 220, cy: 220, r: R, class: "track" }));
  // Each broker owns (previous token, its token]: its arc ends at its dot.
  const placed = state.brokers.filter((b) => toBig(b.token) !== null && b.status !== "removed");
  placed.forEach((b, i) => {
    const prev = placed[(i - 1 + placed.length) % placed.length];
    const a1 = angleOf(b.token), a0 = placed.length === 1 ? a1 : angleOf(prev.token);
    parts.push(svg("path", { d: arcPath(a0, a1, R), class: "range", stroke: brokerColor(b.name) },
      svg("title", {}, `${b.name} owns tokens (${prev.token}, ${b.token}]`)));
  });
  // Quarter marks of the token space; a label gives way to a broker drawn near it.
  const brokerAngles = placed.map((b) => angleOf(b.token));
  for (const [angle, label] of [[0, "−2⁶³"], [Math.PI / 2, "−2⁶²"], [Math.PI, "0"], [1.5 * Math.PI, "2⁶²"]]) {
    const [x0, y0] = polar(angle, R - 8), [x1, y1] = polar(angle, R + 8), [tx, ty] = polar(angle, R + 14);
    parts.push(svg("line", { x1: x0, y1: y0, x2: x1, y2: y1, class: "tick" }));
    const crowded = brokerAngles.some((a) => Math.abs(Math.atan2(Math.sin(a - angle), Math.cos(a - angle))) < 0.35);
    if (!crowded) {
      parts.push(svg("text", { x: tx, y: ty + (Math.cos(angle) < -0.5 ? 10 : Math.cos(angle) > 0.5 ? -4 : 4),
                               class: "tick-label", "text-anchor": anchorAt(angle) }, `token ${label}`));
    }
  }

  const topic = ringTopicName();
  const doc = topic ? state.details.get(topic) : null;
  const led = new Map();
  if (doc) {
    const n = doc.partitions.length;
    for (const p0 of doc.partitions) {
      const p = partitionView(topic, p0);
      const angle = angleOf(partitionToken(topic, p.partition, n));
      const [x, y] = polar(angle, R - 34);
      const down = !p.leader || !LIVE.has(brokerStatus(p.leader));
      led.set(p.leader, (led.get(p.leader) || 0) + 1);
      parts.push(svg("circle", { cx: x, cy: y, r: 7, class: `partition${down ? " leaderless" : ""}`,
                                 fill: p.leader ? brokerColor(p.leader) : "#b0b4ba", "data-partition": p.partition,
                                 "data-leader": p.leader || "" },
        svg("title", {}, `${topic}/${p.partition}: leader ${p.leader || "none"}, replicas ${(p.replicas || []).join(", ")}`)));
      if (n <= 32) {
        const [lx, ly] = polar(angle, R - 52);
        parts.push(svg("text", { x: lx, y: ly + 4, class: "partition-label", "text-anchor": "middle" }, p.partition));
      }
    }
  }

  for (const b of state.brokers) {
    if (b.status === "removed") continue;
    const angle = angleOf(b.token);
    const [x, y] = polar(angle, R);
    const [lx, ly] = polar(angle, R + 30);
    const dy = Math.cos(angle) > 0.5 ? -14 : Math.cos(angle) < -0.5 ? 8 : 0;
    const anchor = anchorAt(angle);
    parts.push(svg("g", { class: "broker", "data-broker": b.name, "data-status": b.status },
      svg("circle", { cx: x, cy: y, r: 14, fill: STATUS_COLORS[b.status] || "#b0b4ba", stroke: brokerColor(b.name),
                      "stroke-width": 5 }),
      svg("title", {}, `${b.name}: ${b.status}, token ${b.token}`),
      svg("text", { x: lx, y: ly + dy, class: "broker-label", "text-anchor": anchor }, b.name),
      svg("text", { x: lx, y: ly + dy + 14, class: "broker-sub", "text-anchor": anchor },
        doc ? `${b.status} · leads ${led.get(b.name) || 0}` : b.status)));
  }
  parts.push(svg("text", { x: 220, y: 214, class: "center-title", "text-anchor": "middle" },
    `${state.brokers.length} broker${state.brokers.length === 1 ? "" : "s"}`));
  parts.push(svg("text", { x: 220, y: 234, class: "center-sub", "text-anchor": "middle" },
    doc ? `${topic}: ${doc.partitions.length} partitions` : "no topic"));
  root.replaceChildren(...parts);

  const legend = $("#ring-legend");
  legend.replaceChildren(
    el("div", {}, ...Object.entries(STATUS_COLORS).map(([s, c]) =>
      el("span", { class: "legend-item" }, el("i", { class: "dot", style: { background: c } }), s))),
    el("div", { class: "muted" }, "ring colour: broker; partition dots: coloured by their leader"),
  );
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
      el("td", { class: "broker-status" }, statusChip(b.status)),
      el("td", { class: "num" }, fmtPhi(b.phi)),
      el("td", { class: "num" }, fmtBytes(load.disk_bytes)),
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
    const health = { ok: 0, "under-replicated": 0, leaderless: 0 };
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
      : health.leaderless ? el("span", { class: "bad" }, `${health.leaderless} leaderless`)
      : health["under-replicated"] ? el("span", { class: "warn" }, `${health["under-replicated"]} under-replicated`)
      : el("span", { class: "good" }, "ok");
    const toggle = el("button", { class: "link", "aria-expanded": open ? "true" : "false",
      onclick: () => { open ? state.expanded.delete(t.name) : state.expanded.add(t.name); state.ringTopic = t.name; refreshNow(); render(); } },
      `${open ? "▾" : "▸"} ${t.name}`);
    rows.push(el("tr", { class: "topic-row", dataset: { topic: t.name } },
      el("td", {}, toggle),
      el("td", { class: "num" }, t.partitions),
      el("td", { class: "num" }, t.replication_factor),
      el("td", {}, fmtMs(t.retention_ms), t.retention_bytes >= 0 ? ` / ${fmtBytes(t.retention_bytes)}` : ""),
      el("td", {}, t.compression || "none"),
      el("td", {}, t.consistency || "quorum"),
      el("td", { class: "num" }, fmtNum(records)),
      el("td", {}, healthCell),
      el("td", { class: "actions" },
        el("button", { class: "small", onclick: () => openSettings(t) }, "settings"),
        el("button", { class: "small danger", onclick: () => act(`Delete topic ${t.name}?`,
          `Every record of ${t.name} on every broker is deleted. This cannot be undone.`, "delete",
          () => api("DELETE", `/v1/topics/${enc(t.name)}`), `topic ${t.name} deleted`) }, "delete"))));
    if (open) rows.push(el("tr", { class: "partitions-row", dataset: { partitionsOf: t.name } },
      el("td", { colspan: 9 }, doc ? partitionsTable(t.name, doc) : el("span", { class: "muted" }, "not described"))));
  }
  body.replaceChildren(...rows);
}

function partitionsTable(topic, doc) {
  const head = el("thead", {}, el("tr", {},
    ...["partition", "leader", "replicas (lag in records)", "epoch", "earliest", "end", "high watermark", "health"]
      .map((h, i) => el("th", { class: i >= 3 && i <= 6 ? "num" : null }, h))));
  const rows = (doc.partitions || []).map((p0) => {
    const p = partitionView(topic, p0);
    const ends = p.replica_end_offsets || {};
    const replicas = (p.replicas || []).map((r) => {
      const end = ends[r];
      const lag = typeof end === "number" && typeof p.end_offset === "number" ? Math.max(0, p.end_offset - end) : null;
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
      el("td", {}, el("span", { class: health === "ok" ? "good" : health === "leaderless" ? "bad" : "warn" }, health)));
  });
  return el("table", { class: "partitions" }, head, el("tbody", {}, rows));
}

// --- consumer groups ------------------------------------------------------------------------

function memberRows(group) {
  const members = Array.isArray(group.members) ? group.members : [];
  return members.map((m) => {
    const id = typeof m === "string" ? m : m.member ?? m.member_id ?? m.id ?? "?";
    let assignment = typeof m === "object" ? m.assignment ?? m.partitions ?? [] : [];
    if (Array.isArray(assignment)) {
      assignment = assignment.map((a) => (typeof a === "object" ? `${a.topic}/${a.partition}` : String(a))).join(", ");
    } else if (assignment && typeof assignment === "object") {
      assignment = Object.entries(assignment).map(([t, ps]) => `${t}: ${[].concat(ps).join(", ")}`).join("; ");
    }
    return el("tr", {}, el("td", {}, id), el("td", {}, (typeof m === "object" && (m.client ?? m.client_id)) || "—"),
      el("td", {}, assignment || "—"));
  });
}

function offsetRows(group) {
  let offsets = group.offsets ?? group.committed ?? [];
  if (!Array.isArray(offsets)) {  // {topic: {partition: offset}}
    offsets = Object.entries(offsets).flatMap(([topic, ps]) =>
      Object.entries(ps || {}).map(([partition, committed]) => ({ topic, partition, committed })));
  }
  return offsets.map((o) => {
    const hw = o.high_watermark ?? o.end_offset ?? null;
    const committed = typeof o.committed === "object" && o.committed !== null ? o.committed.offset : o.committed ?? o.offset;
    const lag = o.lag ?? (typeof hw === "number" && typeof committed === "number" ? hw - committed : null);
    return el("tr", {}, el("td", {}, o.topic), el("td", { class: "num" }, o.partition),
      el("td", { class: "num" }, fmtNum(committed)), el("td", { class: "num" }, fmtNum(hw)),
      el("td", { class: "num" }, fmtNum(lag)));
  });
}

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
  form.elements.consistency.value = t.consistency || "quorum";
  $("#settings").returnValue = "";
  $("#settings").showModal();
}

function settingsDialog() {
  const dialog = $("#settings");
  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "ok" || !settingsTopic) return;
    const t = settingsTopic, form = $("#settings-form");
    const changes = {};
    for (const field of ["partitions", "retention_ms", "retention_bytes"]) {
      const v = form.elements[field].value;
      if (v !== "" && Number(v) !== t[field]) changes[field] = Number(v);
    }
    if (form.elements.consistency.value !== (t.consistency || "quorum")) changes.consistency = form.elements.consistency.value;
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
  $("#ring-topic").addEventListener("change", (ev) => { state.ringTopic = ev.target.value; renderRing(); });
  createTopicForm();
  settingsDialog();
  window.ringAdmin = { state, partitionToken, refreshNow };
  tick();
}

start();
