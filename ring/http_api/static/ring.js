// The ring as SVG: brokers at their tokens (fill: status, outline: identity
// colour), the token range each owns, and one topic's partitions at their
// partition tokens, coloured by their leader. Angles grow clockwise from the
// top, where the smallest token (-2^63) sits.

import { svg } from "./dom.js";
import { angleOf, partitionToken, toBig } from "./tokens.js";

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

// view: {brokers, topic, partitions (each as its leader tells it), base (the topic's
// base_partitions: placement keeps the count it was created with), color(name),
// isLive(name), statusColors}; returns how many partitions each broker leads.
export function drawRing(root, view) {
  const { brokers, topic, partitions, base, color, isLive, statusColors } = view;
  const R = 150;
  const parts = [];
  parts.push(svg("circle", { cx: 220, cy: 220, r: R, class: "track" }));
  // Each broker owns (previous token, its token]: its arc ends at its dot.
  const placed = brokers.filter((b) => toBig(b.token) !== null && b.status !== "removed");
  placed.forEach((b, i) => {
    const prev = placed[(i - 1 + placed.length) % placed.length];
    const a1 = angleOf(b.token), a0 = placed.length === 1 ? a1 : angleOf(prev.token);
    parts.push(svg("path", { d: arcPath(a0, a1, R), class: "range", stroke: color(b.name) },
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

  const led = new Map();
  const n = partitions.length;
  for (const p of partitions) {
    const angle = angleOf(partitionToken(topic, p.partition, n, base || n));
    const [x, y] = polar(angle, R - 34);
    const down = !p.leader || !isLive(p.leader);
    led.set(p.leader, (led.get(p.leader) || 0) + 1);
    parts.push(svg("circle", { cx: x, cy: y, r: 7, class: `partition${down ? " leaderless" : ""}`,
                               fill: p.leader ? color(p.leader) : "#b0b4ba", "data-partition": p.partition,
                               "data-leader": p.leader || "" },
      svg("title", {}, `${topic}/${p.partition}: leader ${p.leader || "none"}, replicas ${(p.replicas || []).join(", ")}`)));
    if (n <= 32) {
      const [lx, ly] = polar(angle, R - 52);
      parts.push(svg("text", { x: lx, y: ly + 4, class: "partition-label", "text-anchor": "middle" }, p.partition));
    }
  }

  for (const b of brokers) {
    if (b.status === "removed") continue;
    const angle = angleOf(b.token);
    const [x, y] = polar(angle, R);
    const [lx, ly] = polar(angle, R + 30);
    const dy = Math.cos(angle) > 0.5 ? -14 : Math.cos(angle) < -0.5 ? 8 : 0;
    const anchor = anchorAt(angle);
    parts.push(svg("g", { class: "broker", "data-broker": b.name, "data-status": b.status },
      svg("circle", { cx: x, cy: y, r: 14, fill: statusColors[b.status] || "#b0b4ba", stroke: color(b.name),
                      "stroke-width": 5 }),
      svg("title", {}, `${b.name}: ${b.status}, token ${b.token}`),
      svg("text", { x: lx, y: ly + dy, class: "broker-label", "text-anchor": anchor }, b.name),
      svg("text", { x: lx, y: ly + dy + 14, class: "broker-sub", "text-anchor": anchor },
        topic ? `${b.status} · leads ${led.get(b.name) || 0}` : b.status)));
  }
  parts.push(svg("text", { x: 220, y: 214, class: "center-title", "text-anchor": "middle" },
    `${brokers.length} broker${brokers.length === 1 ? "" : "s"}`));
  parts.push(svg("text", { x: 220, y: 234, class: "center-sub", "text-anchor": "middle" },
    topic ? `${topic}: ${n} partitions` : "no topic"));
  root.replaceChildren(...parts);
  return led;
}
