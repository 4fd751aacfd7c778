// Messages in the corner (errors stay until dismissed) and the confirmation
// every action asks for.

import { $, el } from "./dom.js";

const SUCCESS_SHOWN_MS = 6000;

export function showMessage(kind, text, key) {
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

export function clearMessage(key) {
  const old = $("#messages").querySelector(`[data-key="${CSS.escape(key)}"]`);
  if (old) old.remove();
}

export function confirmAction(title, detail, okLabel = "confirm") {
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
