// The load panel: how the broker serving the page admits work, from its GET /v1/status
// ("admission"): how late its event loop runs, what runs, what it refused and whom it throttled.

import { $, el, fmtNum } from "./dom.js";

export function renderLoad(status) {
  const box = $("#load");
  const a = status && status.admission;
  if (!a) {
    box.replaceChildren(el("p", { class: "muted" }, "this broker reports no admission figures"));
    return;
  }
  const refused = Object.entries(a.refused || {}).map(([reason, n]) => `${reason.replace("_", " ")} ${fmtNum(n)}`);
  const figures = el("p", { class: "load-figures" },
    el("span", { class: "load-lag" }, `loop lag ${fmtNum(a.loop_lag_ms)} ms (refusing past ${fmtNum(a.loop_lag_ms_max)} ms)`),
    " · ",
    el("span", { class: "load-running" },
      `${fmtNum(a.requests_running)} running, ${fmtNum(a.long_polls_parked)} of them long-polls waiting `
      + `(refusing at ${fmtNum(a.requests_running_max)} working)`),
    " · ",
    el("span", { class: "load-refused" }, `refused: ${refused.join(", ") || "none"}`));
  const rows = Object.entries(a.throttled || {}).flatMap(([name, kinds]) =>
    Object.entries(kinds).map(([quota, n]) => el("tr", { dataset: { principal: name, quota } },
      el("td", {}, name), el("td", {}, quota), el("td", { class: "num" }, fmtNum(n)))));
  const throttled = rows.length
    ? el("table", { class: "load-throttled" },
      el("thead", {}, el("tr", {}, el("th", {}, "token"), el("th", {}, "quota"), el("th", { class: "num" }, "throttled"))),
      el("tbody", {}, ...rows))
    : el("p", { class: "muted load-throttled" }, "no token throttled");
  box.replaceChildren(figures, throttled);
}
