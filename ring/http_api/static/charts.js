// Small line charts (sparklines) as SVG: one or more series over the same
// slots, scaled to the largest value shown; a missing value (null) breaks its
// line. Drawn with SVG elements and attributes only, like the rest of the page.

import { svg } from "./dom.js";

const WIDTH = 240;
const HEIGHT = 44;
const PAD = 2;

// series: [{values, cls}]; returns an <svg class="spark">.
export function sparkline(series, label) {
  const top = Math.max(1, ...series.flatMap((s) => s.values.filter((v) => v !== null)));
  const n = Math.max(2, ...series.map((s) => s.values.length));
  const x = (i) => PAD + (i * (WIDTH - 2 * PAD)) / (n - 1);
  const y = (v) => HEIGHT - PAD - (v / top) * (HEIGHT - 2 * PAD);
  const lines = [];
  for (const s of series) {
    let run = [];
    const flush = () => {  // a lone point (a first sample) is a dot: a line needs two
      if (run.length === 1) lines.push(svg("circle", { class: `dot ${s.cls}`, cx: run[0][0], cy: run[0][1], r: 1.8 }));
      if (run.length > 1) lines.push(svg("polyline", { class: `series ${s.cls}`, points: run.join(" ") }));
      run = [];
    };
    s.values.forEach((v, i) => (v === null || v === undefined ? flush()
      : run.push([x(i).toFixed(1), y(v).toFixed(1)])));
    flush();
  }
  return svg("svg", { class: "spark", viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img", "aria-label": label },
    svg("line", { class: "baseline", x1: PAD, x2: WIDTH - PAD, y1: HEIGHT - PAD, y2: HEIGHT - PAD }),
    ...lines);
}

// 1234.5 -> "1,235", 2.25 -> "2.3", 0 -> "0"
export function fmtRate(v) {
  if (v === null || v === undefined) return "—";
  return v >= 100 ? Math.round(v).toLocaleString("en-US") : v >= 10 ? v.toFixed(0) : v === 0 ? "0" : v.toFixed(1);
}
