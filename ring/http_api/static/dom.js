// Building the page's DOM from data: elements with text and attributes only,
// never HTML, so no name can become markup; and the number formats the tables use.

const SVG_NS = "http://www.w3.org/2000/svg";

export const $ = (sel, root = document) => root.querySelector(sel);

export function el(tag, attrs = {}, ...children) {
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

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) node.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 0) return "forever";
  const units = [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]];
  for (const [u, size] of units) if (ms >= size && ms % size === 0) return `${ms / size} ${u}`;
  return `${ms} ms`;
}

// A clock offset for people: "8.0 d ahead", "61.2 s behind", "340 ms ahead".
export function fmtOffset(ms) {
  if (typeof ms !== "number") return "";
  const size = Math.abs(ms), way = ms >= 0 ? "ahead" : "behind";
  if (size >= 86400000) return `${(size / 86400000).toFixed(1)} d ${way}`;
  if (size >= 1000) return `${(size / 1000).toFixed(1)} s ${way}`;
  return `${Math.round(size)} ms ${way}`;
}

export const fmtNum = (n) => (n === null || n === undefined ? "—" : String(n));
export const fmtPhi = (phi) => (typeof phi === "number" ? phi.toFixed(2) : "—");
