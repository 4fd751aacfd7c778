// The page's charts over the last minutes, loaded and drawn: records per second into and out of
// each topic, and each consumer group's lag. Every broker samples what it saw
// (GET /admin/trends, relayed for the others): the records of the requests it
// answered and the lag of the groups it coordinates. The cluster's figure is
// the sum over brokers for traffic and the largest report for a group's lag
// (one coordinator reports it; two, briefly, while it moves), per time slot.

import { api } from "./api.js";
import { fmtRate, sparkline } from "./charts.js";
import { $, el, fmtNum } from "./dom.js";

const enc = encodeURIComponent;

// Every live broker's samples; a broker that does not answer is left out of this refresh.
export async function loadTrends(brokers, self, isLive) {
  const names = brokers.filter((b) => isLive(b.name)).map((b) => b.name);
  if (!names.includes(self)) names.push(self);
  const docs = await Promise.allSettled(names.map((name) =>
    api("GET", name === self ? "/admin/trends" : `/admin/brokers/${enc(name)}/trends`)));
  return merge(docs.filter((d) => d.status === "fulfilled" && d.value).map((d) => d.value));
}

// {slots: the window's slot numbers, oldest first, intervalMs, topics: Map(topic -> {in, out, inRecords,
//  outRecords}): records/s per slot (null before any broker's first sample) and records over the window,
//  groups: Map(group -> lag per slot, null where no broker reported it)}
export function merge(docs) {
  const intervalMs = Math.max(1, ...docs.map((d) => d.interval_ms || 0));
  const window = Math.max(0, ...docs.map((d) => d.samples_max || (d.samples || []).length));
  let last = null;
  for (const d of docs) for (const s of d.samples || []) last = Math.max(last ?? s.t, s.t);
  if (last === null || window === 0) return { slots: [], intervalMs, topics: new Map(), groups: new Map() };
  const lastSlot = Math.floor(last / intervalMs);
  const slots = Array.from({ length: window }, (_, i) => lastSlot - window + 1 + i);
  const at = (t) => Math.floor(t / intervalMs) - slots[0];
  const sampled = new Set();
  for (const d of docs) for (const s of d.samples || []) sampled.add(at(s.t));
  const quiet = () => slots.map((_, i) => (sampled.has(i) ? 0 : null));
  const topics = new Map(), groups = new Map();
  for (const d of docs) {
    for (const s of d.samples || []) {
      const i = at(s.t);
      if (i < 0 || i >= slots.length) continue;
      const seconds = Math.max(s.ms, 1) / 1000;
      for (const [topic, [got, gave]] of Object.entries(s.topics || {})) {
        if (!topics.has(topic)) topics.set(topic, { in: quiet(), out: quiet(), inRecords: 0, outRecords: 0 });
        const row = topics.get(topic);
        row.in[i] += got / seconds;
        row.out[i] += gave / seconds;
        row.inRecords += got;
        row.outRecords += gave;
      }
      for (const [group, lag] of Object.entries(s.groups || {})) {
        if (!groups.has(group)) groups.set(group, slots.map(() => null));
        const row = groups.get(group);
        row[i] = Math.max(row[i] ?? 0, lag);
      }
    }
  }
  return { slots, intervalMs, topics, groups, quiet: quiet() };
}

// The last value of a series that has one (null: none).
export function latest(series) {
  for (let i = series.length - 1; i >= 0; i--) if (series[i] !== null && series[i] !== undefined) return series[i];
  return null;
}

// --- drawing ------------------------------------------------------------------------------------

// One chart per topic that is not internal (described ones, and any with traffic), then one per group.
export function renderActivity(trends, topics) {
  const minutes = trends.slots.length ? Math.round((trends.slots.length * trends.intervalMs) / 60000) : null;
  $("#activity-minutes").textContent = minutes ? `${minutes} minute${minutes === 1 ? "" : "s"}` : "minutes";
  const internal = new Set(topics.filter((t) => t.internal).map((t) => t.name));
  const names = [...new Set([...topics.map((t) => t.name), ...trends.topics.keys()])].filter((n) => !internal.has(n));
  const quiet = trends.quiet || [];
  $("#topic-charts").replaceChildren(...names.map((name) => {
    const row = trends.topics.get(name) || { in: quiet, out: quiet, inRecords: 0, outRecords: 0 };
    return el("div", { class: "chart topic-chart",
                       dataset: { topic: name, inRecords: row.inRecords, outRecords: row.outRecords } },
      el("div", { class: "chart-title" }, name,
        el("span", { class: "muted rates" }, `in ${fmtRate(latest(row.in))}/s · out ${fmtRate(latest(row.out))}/s`)),
      sparkline([{ values: row.in, cls: "series-in" }, { values: row.out, cls: "series-out" }],
                `records per second in and out of ${name}`),
      el("div", { class: "chart-foot muted" },
        `${fmtNum(row.inRecords)} in · ${fmtNum(row.outRecords)} out · `
        + `peak ${fmtRate(Math.max(0, ...row.in, ...row.out))}/s`));
  }));
  $("#group-charts").replaceChildren(...[...trends.groups.entries()].map(([group, lags]) => {
    const now = latest(lags);
    return el("div", { class: "chart group-chart", dataset: { group, lag: now ?? "" } },
      el("div", { class: "chart-title" }, `group ${group}`, el("span", { class: "muted" }, `lag ${fmtNum(now)}`)),
      sparkline([{ values: lags, cls: "series-lag" }], `records ${group} is behind`),
      el("div", { class: "chart-foot muted" }, `most behind ${fmtNum(Math.max(0, ...lags.filter((v) => v !== null)))}`));
  }));
}
