// A consumer group's tables, read tolerantly: members as strings or objects,
// assignments as [{topic, partition}] or {topic: [partitions]}, offsets as
// [{topic, partition, committed, high_watermark?, lag?}] or {topic: {partition: offset}}.

import { el, fmtNum } from "./dom.js";

export function memberRows(group) {
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

export function offsetRows(group) {
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
